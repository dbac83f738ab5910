"""Multi-turn agents, batches and scenarios shared by tests/multi_turn/test_parallel_multi_turn.py
(one process, the oracles) and tests/asynchronous/async_worker.py (its ``multi-turn``
scenario, in the two torchrun ranks of the session's two-rank asynchronous launch)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lmgym.agents import ALGORITHMS, Agent
from lmgym.envs.tasks.multi_turn.guess_number import make_guess_number_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

ROWS, GROUP = 12, 4
MASKED = [9, 10]  # rows of the last group (rank 1's): fewer valid tokens there
# Each row's reward per turn (multiplied by the turn's number): returns differ within
# every group, and turn credit has several turns to tell apart.
TURN_SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, -1.0, 0.0, 0.7, 0.2, 0.7, 1.5]
COMMON: dict[str, Any] = {
    "max_grad_norm": None,
    "entropy_coef": 0.01,
    "num_minibatches": 1,
    "update_epochs": 1,
    "whiten_advantages": True,
}
DP_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo-token-mean": ("grpo", {"loss_aggregation": "token-mean"}),
    "grpo-seq-mean-token-mean": ("grpo", {"loss_aggregation": "seq-mean-token-mean"}),
    "grpo-seq-mean-token-sum-norm": ("grpo", {"loss_aggregation": "seq-mean-token-sum-norm"}),
    "grpo-turn-credit": ("grpo", {"turn_credit": "turn", "turn_gamma": 0.9}),
    "rloo-turn-credit": ("rloo", {"turn_credit": "turn"}),
    "ppo": ("ppo", {"loss_aggregation": "token-mean"}),
    "grpo-fsdp": ("grpo", {"data_parallel": "fsdp"}),
}
ASYNC_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"learning_rate": 2e-3}),
    "ppo-tis": ("ppo", {"num_minibatches": 2, "update_epochs": 2, "tis_cap": 2.0}),
}
ASYNC_ITERATIONS = 3


def dp_file(rank: int) -> str:
    """The launch's file (``Launch.load`` name) of rank ``rank``'s data-parallel results."""
    return f"multi-turn-rank{rank}"


def async_file(name: str) -> str:
    """The launch's file (``Launch.load`` name) of the asynchronous case ``name``."""
    return f"multi-turn-{name}"


def make_agent(algorithm: str, overrides: dict[str, Any], process_group: Any = None) -> Agent:
    """A tiny GPT-2 on GuessNumber over the digits' character tokenizer (a random turn
    ends after a few tokens, so most episodes have several turns and observations),
    identical in every process."""
    torch.manual_seed(0)
    tokenizer = make_char_tokenizer("12345678")
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_guess_number_vector(
        num_envs=ROWS, group_size=GROUP, tokenizer=tokenizer, max_new_tokens=24, max_turns=4
    )
    config = {**COMMON, **overrides}
    return ALGORITHMS[algorithm](policy, env, process_group=process_group, seed=0, **config)


def turn_ends(policy_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L] bool``: the last token of each policy turn (a maximal run of policy tokens)."""
    after = torch.nn.functional.pad(policy_mask[:, 1:], (0, 1), value=False)
    return policy_mask & ~after


def full_batch(agent: Agent) -> RolloutBatch:
    """The multi-turn batch every process collects alike, with planted per-turn rewards
    (``TURN_SCORES[row]`` times the turn's number) and ``MASKED`` rows invalid."""
    batch = collect(agent.env, agent.policy, seed=3)
    ends = turn_ends(batch.policy_mask)
    turn_number = ends.long().cumsum(dim=1).float()
    rewards = torch.where(ends, torch.tensor(TURN_SCORES)[:, None] * turn_number, 0.0)
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[MASKED] = False
    return dataclasses.replace(batch, rewards=rewards, valid=valid)


def rank_share(batch: RolloutBatch, rank: int) -> RolloutBatch:
    """Rank 0's two groups, or rank 1's last one."""
    groups = batch.group_ids.unique()
    mine = groups[:2] if rank == 0 else groups[2:]
    return batch.select(torch.isin(batch.group_ids, mine))


def gradient_of(agent: Agent, batch: RolloutBatch) -> dict[str, Any]:
    """One update's gradient (gathered when sharded) and metrics, the step disabled."""
    agent.optimizer.step = lambda *a, **k: None
    metrics = agent.train_on_batch(batch)
    params = [p for g in agent.optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    full = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
    return {"grad": torch.cat([g.flatten() for g in full]), "metrics": metrics}


# ------------------------------------------------------------------ in the torchrun ranks
def dp_worker(out: Path) -> None:
    """Each rank, in the default (world) process group: its share of every case's batch,
    one update, its gradient and metrics (``OUT/multi-turn-rank<r>.pt``)."""
    from lmgym.distributed import DataParallelGroup

    rank = DataParallelGroup().rank
    results = {}
    for name, (algorithm, overrides) in DP_CASES.items():
        agent = make_agent(algorithm, overrides)
        results[name] = gradient_of(agent, rank_share(full_batch(agent), rank))
    torch.save(results, out / f"{dp_file(rank)}.pt")


def async_worker(out: Path) -> None:
    """One actor and one learner at ``max_staleness=0``; the learner saves its history
    and final weights (``OUT/multi-turn-<case>.pt``)."""
    from lmgym.asynchronous import AsyncConfig, run_async

    for name, (algorithm, overrides) in ASYNC_CASES.items():

        def factory(role, algorithm=algorithm, overrides=overrides):
            return make_agent(algorithm, overrides, role.process_group)

        result = run_async(factory, ASYNC_ITERATIONS, AsyncConfig(max_staleness=0))
        if result.role.is_learner:
            params = [p.detach().clone() for p in result.agent.policy.model.parameters()]
            torch.save(
                {"history": result.history, "params": params}, out / f"{async_file(name)}.pt"
            )
