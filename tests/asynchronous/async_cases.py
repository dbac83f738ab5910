"""Agents shared by the async worker (in torchrun processes) and its tests (one process)."""

from __future__ import annotations

from typing import Any

import torch

from lmgym.agents import ALGORITHMS
from lmgym.asynchronous import Role
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

# GRPO here takes one step per batch (its default is 4 epochs x 2 minibatches): the
# single-pass path, lp_old from the update's own forward, a two-learner update whose
# one step equals the one-process step on the same groups, and learner/actor timings
# that the bound tests' slow sides are built on.
SINGLE_PASS: dict[str, Any] = {"update_epochs": 1, "num_minibatches": 1}
# name -> (algorithm, config overrides): PPO recomputes lp_old (2 minibatches, 2 epochs)
# and applies TIS; GRPO takes its single-pass lp_old from the update's own forward.
EQUAL_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"learning_rate": 2e-3, **SINGLE_PASS}),
    "ppo-tis": (
        "ppo",
        {"num_minibatches": 2, "update_epochs": 2, "tis_cap": 2.0, "whiten_advantages": True},
    ),
}
EQUAL_ITERATIONS = 4
BOUND_ITERATIONS = 5
# Rewards of random completions are mostly 0 here: the entropy bonus gives the
# two-learner comparison a gradient to compare.
TWO_LEARNERS: tuple[str, dict[str, Any]] = ("grpo", {"entropy_coef": 0.01, **SINGLE_PASS})
LEARN_BUDGET = 200
# The learning run was flaky while the actor ran freely: its staleness pattern followed
# the machine's load, and "hello" has a trap (`helll`, reward 0.8) that some patterns
# fell into (1 in 4 runs alone, more under `pytest -n auto`). Two changes, each for one
# cause. The learner publishes each new version only once the actor waits at the bound
# (async_worker.at_the_bound), so every run is the same run (checked: two runs under
# load and one paced by a fixed 0.2 s pause give identical histories but for the clocks
# and `tokens_generated`, which counts the tokens that had reached learner 0 by each
# update, later updates' rollouts in transit included). With the actor pinned at
# staleness 2, "hello" settled in the trap on seed 0 (the synchronous run solves it in
# 100 updates), so the target is a word without a repeated letter: "world" is solved in
# 103 updates and "house" in 99, at every update's staleness 2.
LEARN_TARGET = "world"
# 2e-3 collapses onto a partial answer at max_staleness=2 for this seed; the entropy
# bonus keeps the last letter sampled until the group sees it.
LEARN_OVERRIDES: dict[str, Any] = {
    "learning_rate": 1e-3,
    "tis_cap": 2.0,
    "entropy_coef": 0.01,
    **SINGLE_PASS,
}


def make_agent(
    algorithm: str,
    overrides: dict[str, Any],
    role: Role | None = None,
    num_prompts: int = 2,
    group_size: int = 4,
    max_new_tokens: int = 6,
    target: str = "hello",
    n_layer: int = 2,
):
    """A tiny TargetString agent, identical in every process (seeded here)."""
    torch.manual_seed(0)
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), n_layer=n_layer, seed=0), tokenizer)
    env = make_target_string_vector(
        num_envs=num_prompts * group_size,
        group_size=group_size,
        target=target,
        max_new_tokens=max_new_tokens,
        tokenizer=tokenizer,
    )
    group = role.process_group if role is not None else None
    return ALGORITHMS[algorithm](policy, env, process_group=group, seed=0, **overrides)
