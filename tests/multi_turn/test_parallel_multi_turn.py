"""Multi-turn episodes through data parallel and the asynchronous actor-learner.

- Data parallel (2 gloo processes, torchrun): a GRPO/RLOO/PPO update on a multi-turn
  batch split between the ranks gives the gradient and metrics of one process on the
  whole batch (the oracle). The ranks hold different numbers of policy and
  observation tokens, so a per-rank normaliser, or one that counted observation
  tokens, would show.
- Asynchronous (1 actor + 1 learner): at ``max_staleness=0`` the run's weights and
  metrics equal ``Agent.learn`` in one process, bit for bit.
- ``lmgym train`` runs a multi-turn task end to end on two processes in the launches
  it shares with the other two-process CLI tests: ``--actors 1``
  (tests/asynchronous/test_cli_async.py) and data parallel
  (tests/parallel/test_cli_data_parallel.py).

This file is also the torchrun worker: ``python -m torch.distributed.run
--standalone --nproc-per-node 2 tests/multi_turn/test_parallel_multi_turn.py OUT``
runs both scenarios (data parallel, then asynchronous) in one launch and writes what
the tests compare.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from lmgym.agents import ALGORITHMS, Agent
from lmgym.envs.tasks.multi_turn.guess_number import make_guess_number_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

pytestmark = pytest.mark.heavy  # multi-process runs: make test-fast skips them

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


# ------------------------------------------------------------------ the worker
def dp_worker(out: Path) -> None:
    """Each rank: its share of every case's batch, one update, its gradient and metrics."""
    from lmgym.distributed import DataParallelGroup

    rank = DataParallelGroup().rank
    results = {}
    for name, (algorithm, overrides) in DP_CASES.items():
        agent = make_agent(algorithm, overrides)
        results[name] = gradient_of(agent, rank_share(full_batch(agent), rank))
    torch.save(results, out / f"rank{rank}.pt")


def async_worker(out: Path) -> None:
    """One actor and one learner at ``max_staleness=0``; the learner saves its history
    and final weights."""
    from lmgym.asynchronous import AsyncConfig, run_async

    for name, (algorithm, overrides) in ASYNC_CASES.items():

        def factory(role, algorithm=algorithm, overrides=overrides):
            return make_agent(algorithm, overrides, role.process_group)

        result = run_async(factory, ASYNC_ITERATIONS, AsyncConfig(max_staleness=0))
        if result.role.is_learner:
            params = [p.detach().clone() for p in result.agent.policy.model.parameters()]
            torch.save({"history": result.history, "params": params}, out / f"{name}.pt")


def torchrun(out: Path, nproc: int = 2, timeout: float = 300) -> None:
    from testkit import child_env, torchrun_command  # here: as a script, testkit is not importable

    command = torchrun_command(nproc, __file__, str(out))
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# ------------------------------------------------------------------ the tests
# Both scenarios share one launch (two start-ups of torch and lmgym); the tests that
# read it stay on one xdist worker, so it runs once.
LAUNCHED = pytest.mark.xdist_group("parallel-multi-turn")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """The directory the two-process launch wrote its results to."""
    out = tmp_path_factory.mktemp("launched")
    torchrun(out)
    return out


@pytest.fixture(scope="module")
def dp_results(launched: Path) -> list[dict[str, Any]]:
    return [torch.load(launched / f"rank{r}.pt") for r in range(2)]


def test_the_batch_is_multi_turn_on_both_ranks():
    """The premise: both ranks' rows hold observations, in different amounts."""
    batch = full_batch(make_agent("grpo", {}))
    observed = []
    for rank in range(2):
        share = rank_share(batch, rank)
        assert (share.lengths > share.policy_lengths).any(), rank
        observed.append(int((share.lengths - share.policy_lengths).sum()))
    assert observed[0] != observed[1]
    assert int(turn_ends(batch.policy_mask).sum(dim=1).max()) >= 3  # several turns


@LAUNCHED
@pytest.mark.parametrize("name", sorted(DP_CASES))
def test_two_ranks_give_the_update_of_one_process_on_a_multi_turn_batch(name, dp_results):
    algorithm, overrides = DP_CASES[name]
    agent = make_agent(algorithm, overrides)
    single = gradient_of(agent, full_batch(agent))
    assert single["grad"].abs().max() > 1e-4
    for rank, results in enumerate(dp_results):
        got = results[name]
        torch.testing.assert_close(got["grad"], single["grad"], rtol=1e-5, atol=1e-7)
        assert got["metrics"].keys() == single["metrics"].keys()
        for key, value in single["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (rank, key)


@LAUNCHED
def test_the_comparison_would_see_observation_tokens_in_the_update(dp_results):
    """The check checks: the same batch with its observations counted as the policy's
    tokens gives another gradient than the two ranks did."""
    agent = make_agent("grpo", DP_CASES["grpo-token-mean"][1])
    batch = full_batch(agent)
    leaky = dataclasses.replace(batch, policy_mask=batch.completion_mask)
    wrong = gradient_of(agent, leaky)["grad"]
    assert not torch.allclose(wrong, dp_results[0]["grpo-token-mean"]["grad"], rtol=1e-3)


@pytest.fixture(scope="module")
def async_results(launched: Path) -> dict[str, Any]:
    return {name: torch.load(launched / f"{name}.pt") for name in ASYNC_CASES}


@LAUNCHED
@pytest.mark.parametrize("name", sorted(ASYNC_CASES))
def test_an_async_run_at_staleness_0_is_the_synchronous_run(name, async_results):
    algorithm, overrides = ASYNC_CASES[name]
    agent = make_agent(algorithm, overrides)
    history = agent.learn(ASYNC_ITERATIONS)
    got = async_results[name]
    assert len(got["history"]) == ASYNC_ITERATIONS
    for mine, theirs in zip(agent.policy.model.parameters(), got["params"], strict=True):
        assert torch.equal(mine, theirs)
    for expected, metrics in zip(history, got["history"], strict=True):
        assert {k: metrics[k] for k in expected} == expected
        assert metrics["staleness_max"] == 0.0


if __name__ == "__main__":
    from lmgym.distributed import init_from_env, shutdown

    torch.set_num_threads(1)
    where = Path(sys.argv[1])
    init_from_env(timeout_s=60)
    dp_worker(where)
    async_worker(where)  # in the process group the data-parallel scenario joined
    shutdown()
