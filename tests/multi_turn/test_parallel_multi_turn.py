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

Both two-process scenarios (data parallel, then asynchronous) run as the ``multi-turn``
scenario of the session's two-rank asynchronous launch (the fixture ``async_two_ranks``:
tests/testkit/async_launch.py, tests/asynchronous/async_worker.py); the agents, batches
and workers are in parallel_multi_turn_cases.py.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit.async_launch import GROUP

# Appended, not prepended: only the name ``parallel_multi_turn_cases`` is meant to resolve here.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from parallel_multi_turn_cases import (  # noqa: E402
    ASYNC_CASES,
    ASYNC_ITERATIONS,
    DP_CASES,
    async_file,
    dp_file,
    full_batch,
    gradient_of,
    make_agent,
    rank_share,
    turn_ends,
)

pytestmark = pytest.mark.heavy  # multi-process runs: make test-fast skips them

# The tests that read the launch share its xdist group with tests/asynchronous/test_async.py's
# two-rank tests: --dist loadgroup keeps them all on one worker, so it runs once.
LAUNCHED = pytest.mark.xdist_group(GROUP)


@pytest.fixture(scope="module")
def dp_results(async_two_ranks) -> list[dict[str, Any]]:
    return [async_two_ranks.load(dp_file(r)) for r in range(2)]


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
def async_results(async_two_ranks) -> dict[str, Any]:
    return {name: async_two_ranks.load(async_file(name)) for name in ASYNC_CASES}


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
