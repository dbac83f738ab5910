"""Every agent must learn: from random-level reward to >= 0.9 of the maximum on a toy task.

TargetString "hello" (reward = fraction of the 5 characters in place, max 1; a
random policy scores about 1/49). Each agent runs at its documented defaults (the
learning rate included) on seeds 0, 1 and 2, the first three rather than chosen
ones, and must pass on every one (issue 26): a default that learns only on a lucky
seed fails here. CPU, fixed iteration budget, stopped early once solved.
"""

from __future__ import annotations

import pytest
import torch

from lmgym.agents import ALGORITHMS
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

pytestmark = pytest.mark.learning

SEEDS = (0, 1, 2)
# The check: a rolling mean over 5 iterations of at least this. A run stops as soon as
# it holds (training on to a higher mark tested nothing more: that a solved policy
# stays solved is test_saturation.py's check).
SOLVED = 0.9

# algorithm -> (config overrides, env reward mode, iteration budget). Budgets: about
# 1.5x the most iterations any of the seeds needed when measured, to a rolling 0.95
# (benchmarks/results/stability_notes.md): 76-101 for the one-step agents, GSPO,
# GSPO-token and VAPO, 33-49 for the PPO family, 40-58 for GRPO and Dr. GRPO; to a
# rolling 0.9 at lmgym bench's settings, 31-38 for RLOO and 69-87 for ReMax.
CASES = {
    "reinforce": ({}, "per_token", 150),
    "rloo": ({}, "bandit", 100),
    # 150, not 100: on 2026-12-04's packages seed 0 sits at 0.79 (the 'helll' trap)
    # from iteration ~30 and escapes at ~120, at HEAD and at the commit before
    # (ee99ab7) alike; seeds 1 and 2 still solve in under 60 (cause not isolated).
    "grpo": ({}, "bandit", 150),
    "drgrpo": ({}, "bandit", 100),
    "gspo": ({}, "bandit", 150),
    "cispo": ({}, "bandit", 150),
    "ppo": ({}, "bandit", 100),
    "ppo-per-token": ({}, "per_token", 100),
    "reinforce_pp": ({}, "per_token", 150),
    "gspo_token": ({}, "bandit", 150),
    "dual_clip_ppo": ({}, "bandit", 100),
    # At its default entropy bonus (0.01): without it ReMax collapses onto its greedy
    # completion at 0.6-0.8 (remax.py: "When the baseline misleads").
    "remax": ({}, "bandit", 150),
    # The paper's defaults: 50 iterations of value pretraining (the policy frozen) first.
    "vapo": ({}, "bandit", 150),
}


def train(name: str, seed: int) -> list[dict[str, float]]:
    torch.manual_seed(seed)
    overrides, reward_mode, iterations = CASES[name]
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)
    env = make_target_string_vector(
        num_envs=64,
        group_size=16,
        target="hello",
        reward_mode=reward_mode,
        tokenizer=tokenizer,
    )
    agent = ALGORITHMS[name.split("-")[0]](policy, env, seed=seed, **overrides)

    def stop_when_solved(agent, metrics):
        recent.append(metrics["reward_mean"])
        return not (len(recent) >= 5 and sum(recent[-5:]) / 5 >= SOLVED)

    recent: list[float] = []
    return agent.learn(iterations, callback=stop_when_solved)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_agent_learns_the_target_string(name, seed):
    history = train(name, seed)
    first = sum(m["reward_mean"] for m in history[:3]) / 3
    last = sum(m["reward_mean"] for m in history[-5:]) / 5
    assert first < 0.2, f"{name} should start near random level, got {first:.3f}"
    assert last >= SOLVED, (
        f"{name} seed {seed} reached only {last:.3f} in {len(history)} iterations"
    )
