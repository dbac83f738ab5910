"""A solved policy stays solved (issue 26): every agent, started from a policy that
solves TargetString, must neither be moved by a batch without signal nor lose the
solution when it trains on.

The solved policy is trained once per session with REINFORCE (per-token rewards,
64 completions per iteration) and stopped as soon as the rolling mean of 5 iterations
reaches 0.95: solved, but not saturated (its mean token entropy is about 0.2), which
is where the collapses of issue 26 happened. Every agent then runs at the issue's
settings, 4 prompts x 8 completions (half ``lmgym bench``'s batch: the harder case, the
noisier batch), bandit reward, at its documented defaults.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
import torch
from torch import Tensor

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.agents import ALGORITHMS, REINFORCE
from lmgym.agents.base import Agent
from lmgym.agents.metrics import masked_mean
from lmgym.agents.prepare import teacher_forced
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.types import RolloutBatch

pytestmark = pytest.mark.learning

TASK = "lmgym/TargetString-v0"
SOLVED = 0.9  # TargetString's solved threshold
KEEP = 0.95 * SOLVED  # what "stays solved" must hold
ITERATIONS = 15
"""Further iterations of the keep test: the suite's budget, not the issue's 100 (the
seed-robustness table, benchmarks/results/stability.md, covers the long runs)."""
SHORT_WARMUP = {"value_warmup_iterations": 2}
"""VAPO's value pretraining freezes the policy; from a solved policy its 50 iterations
would test nothing but cost a minute, so VAPO runs 2 here."""


@pytest.fixture(scope="session")
def solved_state() -> dict[str, Tensor]:
    """The weights of a tiny GPT-2 that solves TargetString (rolling mean >= 0.95)."""
    torch.manual_seed(0)
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = gym.make_vec(
        TASK, num_envs=64, group_size=16, tokenizer=tokenizer, reward_mode="per_token"
    )
    agent = ALGORITHMS["reinforce"](policy, env, seed=0, learning_rate=2e-3)
    recent: list[float] = []

    def until_solved(agent: Agent, metrics: dict[str, float]) -> bool:
        recent.append(metrics["reward_mean"])
        return not (len(recent) >= 5 and sum(recent[-5:]) / 5 >= 0.95)

    agent.learn(150, callback=until_solved)
    assert sum(recent[-5:]) / 5 >= 0.95, "the fixture policy did not solve TargetString"
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def agent_on(
    state: dict[str, Tensor], name: str, seed: int, agent_class: type[Agent] | None = None, **extra
) -> Agent:
    """``name``'s agent at the bench settings over a copy of the solved policy."""
    torch.manual_seed(seed)
    tokenizer = make_char_tokenizer()
    model = make_tiny_model(len(tokenizer), seed=0)
    model.load_state_dict(state)
    env = gym.make_vec(TASK, num_envs=32, group_size=8, tokenizer=tokenizer)
    overrides = {**(SHORT_WARMUP if name == "vapo" else {}), **extra}
    agent_class = agent_class or ALGORITHMS[name]
    return agent_class(CausalLMPolicy(model, tokenizer), env, seed=seed, **overrides)


CRITIC_AGENTS = sorted(name for name, cls in ALGORITHMS.items() if cls.uses_critic)
# ReMax runs with the bench's entropy bonus, a gradient on every batch.
CRITIC_FREE = sorted(name for name in ALGORITHMS if name not in (*CRITIC_AGENTS, "remax"))


def flat(agent: Agent, batch: RolloutBatch) -> RolloutBatch:
    """``batch`` with every completion scoring its baseline's value, so the rewards hold
    nothing to learn: 1 (solved), or for ReMax its greedy completion's score."""
    score = agent.greedy_baseline(batch) if agent.name == "remax" else torch.ones(batch.batch_size)
    return dataclasses.replace(batch, rewards=batch.dones.to(score.dtype) * score[:, None])


def mid_run(state: dict[str, Tensor], name: str, **extra) -> tuple[Agent, RolloutBatch]:
    """An agent 3 iterations into training from the solved policy (optimizer momentum, a
    partly fitted critic) and a flat batch of its own completions."""
    agent = agent_on(state, name, seed=0, **extra)
    agent.learn(3)
    return agent, flat(agent, agent.collect()[0])


def policy_shift(agent: Agent, batch: RolloutBatch) -> float:
    """KL(before || after) of ``agent.policy`` across one update on ``batch``: the k3
    estimate ``mean((ρ − 1) − log ρ)`` over its sampled tokens (docs/algorithms.md#metrics)."""
    ids, attn = batch.input_ids()

    def logprobs() -> Tensor:
        return teacher_forced(agent.policy, ids, attn, batch.max_new_tokens, batch.group_ids)

    before = logprobs()
    agent.train_on_batch(batch)
    log_ratio = logprobs() - before
    return float(masked_mean(log_ratio.exp() - 1 - log_ratio, batch.completion_mask))


@pytest.mark.parametrize("name", CRITIC_FREE)
def test_a_batch_without_reward_spread_leaves_the_weights_alone(solved_state, name):
    # Every advantage is 0, so the gradient is; an optimizer step would still move the
    # weights by AdamW's momentum (docs/algorithms.md#conventions).
    agent, batch = mid_run(solved_state, name)
    before = [p.detach().clone() for p in agent.policy.model.parameters()]
    agent.train_on_batch(batch)
    after = agent.policy.model.parameters()
    moved = sum(not torch.equal(a, p) for a, p in zip(before, after, strict=True))
    assert moved == 0, f"{name}: a batch without reward spread moved {moved} weight tensors"


@pytest.mark.parametrize("name", CRITIC_AGENTS)
def test_whitening_does_not_amplify_critic_noise(solved_state, name):
    # On a flat batch a critic's advantages are its own errors; whitened to unit
    # variance they made a full-sized update (issue 26). From the same state, the update
    # may be at most twice as large as without whitening (15x with whiten_min_std=0).
    agent, batch = mid_run(solved_state, name)
    plain, same_batch = mid_run(solved_state, name)  # the same run, deterministic on CPU
    assert torch.equal(batch.rewards, same_batch.rewards)
    plain.config = dataclasses.replace(plain.config, whiten_advantages=False)
    whitened, unwhitened = policy_shift(agent, batch), policy_shift(plain, batch)
    assert whitened <= 2 * unwhitened, (
        f"{name}: whitening made a flat batch's update KL {whitened:.4f}, "
        f"against {unwhitened:.4f} without it"
    )


def rolling(rewards: list[float], window: int = 5) -> list[float]:
    return [sum(rewards[i - window : i]) / window for i in range(window, len(rewards) + 1)]


def check_kept(name: str, history: list[dict[str, float]]) -> None:
    """The run kept the solution: every rolling mean of 5 iterations >= ``KEEP``."""
    rewards = [m["reward_mean"] for m in history]
    lowest = min(rolling(rewards))
    assert lowest >= KEEP, f"{name} lost the solution: rolling mean fell to {lowest:.3f}"


FRESH_CRITIC = ("dual_clip_ppo", "ppo")
"""Agents that start with an untrained critic on the solved policy: until it fits
(about 10 iterations) its errors, std 0.15-0.2, are advantages above whiten_min_std,
whitened, and on some seeds they knock the reward below ``KEEP`` before it recovers
(seed 1: 0.85; 0.66 on seed 0 under the previous sampler's random stream). VAPO's value
pretraining avoids this."""
KEEP_SEEDS = range(5)


@pytest.mark.parametrize("name", sorted(set(ALGORITHMS) - set(FRESH_CRITIC)))
def test_a_solved_policy_stays_solved(solved_state, name):
    agent = agent_on(solved_state, name, seed=0)
    warmup = getattr(agent.config, "value_warmup_iterations", 0)
    history = agent.learn(ITERATIONS + warmup)[warmup:]
    check_kept(name, history)


@pytest.mark.parametrize("name", FRESH_CRITIC)
def test_a_fresh_critic_keeps_a_solved_policy_on_four_seeds_of_five(solved_state, name):
    """Issue 26's target, ">= 4 of 5 seeds kept", on seeds 0-4."""
    lowest = []
    for seed in KEEP_SEEDS:
        history = agent_on(solved_state, name, seed=seed).learn(ITERATIONS)
        lowest.append(min(rolling([m["reward_mean"] for m in history])))
    kept = sum(value >= KEEP for value in lowest)
    assert kept >= 4, f"{name} kept the solution on {kept} of 5 seeds: lowest {lowest}"


class NoiseREINFORCE(REINFORCE):
    """The planted collapse: advantages that are pure noise of unit variance, what
    whitening made of a critic's errors on a flat batch (issue 26)."""

    def advantages(self, batch, rewards, mask, values):
        noise = torch.randn(rewards.shape, generator=self.generator, device=rewards.device)
        return torch.where(mask, noise, 0.0), None


def test_the_keep_check_fails_on_a_planted_collapse(solved_state):
    agent = agent_on(solved_state, "reinforce", seed=0, agent_class=NoiseREINFORCE)
    history = agent.learn(ITERATIONS)
    with pytest.raises(AssertionError, match="lost the solution"):
        check_kept("planted", history)
