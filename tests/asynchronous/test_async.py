"""Actors and learners as torchrun processes (gloo): exactness at k=0, the bound, failures, learning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from testkit.async_launch import GROUP, Launch, torchrun

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from async_cases import (  # noqa: E402
    BOUND_ITERATIONS,
    EQUAL_CASES,
    EQUAL_ITERATIONS,
    TWO_LEARNERS,
    make_agent,
)

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them
# Each launch costs two or three start-ups of torch and lmgym, so one launch per world
# size runs every scenario of that size: the two-rank one is the session's
# (``async_two_ranks``, testkit/async_launch.py), which also runs the multi-turn
# scenarios of tests/multi_turn/test_parallel_multi_turn.py; the three-rank one is this
# module's. Each launch's tests stay on one xdist worker, so it runs once.
TWO_RANKS = pytest.mark.xdist_group(GROUP)
THREE_RANKS = pytest.mark.xdist_group("async-three-ranks")


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> Launch:
    """One learner and two actors (two learners and one actor for ``two-learners``):
    the bound runs, then a killed actor (the launch's run fails on purpose; torchrun's
    monitor is slowed so that lmgym's own error shows)."""
    out = tmp_path_factory.mktemp("three-ranks")
    return torchrun(["bound", "kill"], out, 3, "--monitor-interval", "3")


@TWO_RANKS
@pytest.mark.parametrize("name", sorted(EQUAL_CASES))
def test_max_staleness_0_is_the_synchronous_run(name, async_two_ranks):
    """One actor + one learner at k=0: the same parameters and metrics, bit for bit,
    as Agent.learn in one process with the same seeds (GRPO single-pass; PPO with
    recomputed lp_old, 2 minibatches x 2 epochs, TIS)."""
    algorithm, overrides = EQUAL_CASES[name]
    agent = make_agent(algorithm, overrides)
    history = agent.learn(EQUAL_ITERATIONS)
    got = async_two_ranks.load(f"{name}-learner0")
    for mine, theirs in zip(agent.policy.model.parameters(), got["params"], strict=True):
        assert torch.equal(mine, theirs)
    assert len(got["history"]) == EQUAL_ITERATIONS
    for expected, metrics in zip(history, got["history"], strict=True):
        assert {k: metrics[k] for k in expected} == expected
        assert metrics["staleness_max"] == 0.0 and metrics["stale_rows_dropped"] == 0.0
    assert got["trained"] == [[2 * u, 2 * u + 1] for u in range(EQUAL_ITERATIONS)]


@pytest.fixture(scope="module")
def bound_runs(three_ranks):
    names = ("wait-slow-learner", "wait-slow-actor", "row-boundary-slow-actor", "drop-slow-learner")
    runs = {name: three_ranks.load(f"{name}-learner0") for name in names}
    runs["two-learners"] = [three_ranks.load(f"two-learners-learner{i}") for i in range(2)]
    return runs


def column(run: dict, key: str) -> list[float]:
    return [m[key] for m in run["history"]]


@THREE_RANKS
def test_wait_keeps_the_bound_under_a_slow_learner(bound_runs):
    """Actors run ahead while the learner sleeps, by exactly max_staleness=1 and no
    further: they wait instead (idle), nothing is dropped, and update u trains the
    groups fixed for it (2 per actor, global ids 4u .. 4u + 3)."""
    run = bound_runs["wait-slow-learner"]
    assert max(column(run, "staleness_max")) == 1.0
    assert sum(column(run, "stale_rows_dropped")) == 0
    assert run["history"][-1]["actor_idle_fraction"] > 0.2
    assert run["trained"] == [list(range(4 * u, 4 * u + 4)) for u in range(BOUND_ITERATIONS)]


@THREE_RANKS
def test_wait_keeps_the_bound_under_a_slow_actor(bound_runs):
    run = bound_runs["wait-slow-actor"]
    assert max(column(run, "staleness_max")) <= 1.0
    assert sum(column(run, "stale_rows_dropped")) == 0
    assert sum(column(run, "learner_idle_s")[1:]) > 0.1  # the learner waits for actor 1
    assert run["trained"] == [list(range(4 * u, 4 * u + 4)) for u in range(BOUND_ITERATIONS)]


@THREE_RANKS
def test_in_flight_weights_reach_rows_mid_generation(bound_runs):
    """Under a slow actor, new weights arrive while its rows are in flight: some
    trained rows were sampled by two versions (and still within the bound)."""
    run = bound_runs["wait-slow-actor"]
    assert max(column(run, "mixed_version_fraction")) > 0


@THREE_RANKS
def test_row_boundary_samples_every_row_with_one_version(bound_runs):
    run = bound_runs["row-boundary-slow-actor"]
    assert column(run, "mixed_version_fraction") == [0.0] * BOUND_ITERATIONS
    assert max(column(run, "staleness_max")) <= 1.0
    assert sum(column(run, "stale_rows_dropped")) == 0


@THREE_RANKS
def test_two_learners_share_each_update(bound_runs):
    """Two data-parallel learners train one group each of every update (global ids
    2u and 2u + 1), end with the same weights, and log the global metrics of the
    one-process update on the same groups."""
    first, second = bound_runs["two-learners"]
    assert first["trained"] == [[0], [2]] and second["trained"] == [[1], [3]]
    for p, q in zip(first["params"], second["params"], strict=True):
        assert torch.equal(p, q)
    for mine, theirs in zip(first["history"], second["history"], strict=True):
        mine, theirs = dict(mine), dict(theirs)
        mine.pop("update_s"), theirs.pop("update_s")  # each learner's own clock
        assert mine == theirs
    assert first["history"][0]["grad_norm"] > 0
    single = make_agent(*TWO_LEARNERS).learn(1)[0]
    for key, value in single.items():
        assert first["history"][0][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@THREE_RANKS
def test_drop_drops_rows_past_the_bound_and_never_trains_them(bound_runs):
    run = bound_runs["drop-slow-learner"]
    assert max(column(run, "staleness_max")) == 0.0
    assert sum(column(run, "stale_rows_dropped")) > 0
    assert run["history"][-1]["actor_idle_fraction"] == 0.0  # actors never wait
    trained = [g for update in run["trained"] for g in update]
    assert len(trained) == len(set(trained)) == 4 * BOUND_ITERATIONS


@THREE_RANKS
def test_a_killed_actor_ends_the_run_with_a_clear_error(three_ranks):
    """SIGKILL on actor 1 after its second message: the learner names it and the run
    ends, no hang, and no group was trained twice before the end."""
    assert three_ranks.seconds_since_start("kill") < 100
    assert three_ranks.done.returncode != 0
    output = three_ranks.output
    assert "PeerLostError: actor 1 (rank 2) stopped" in output, output[-3000:]
    assert "the run ends: a lost process is not replaced" in output
    lines = (three_ranks.out / "trained.txt").read_text().split("\n")
    trained = [int(g) for line in lines for g in line.split()]
    assert trained and len(trained) == len(set(trained))


@TWO_RANKS
def test_a_stuck_actor_ends_the_run_after_the_timeout(async_two_ranks):
    """The actor stays alive but silent: after timeout_s (3 s) the learner gives up
    with an error instead of waiting forever."""
    assert async_two_ranks.seconds_since_start("stuck") < 100
    assert async_two_ranks.done.returncode != 0
    output = async_two_ranks.output
    assert "PeerLostError" in output, output[-3000:]
    assert (
        "no rollout from any actor arrived in 3 s" in output or "actor 0 (rank 1) stopped" in output
    )


@TWO_RANKS
@pytest.mark.learning
def test_max_staleness_2_learns_the_target_string(async_two_ranks):
    history = async_two_ranks.load("learn-learner0")["history"]
    rewards = column({"history": history}, "reward_mean")
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert first < 0.2, f"should start near random level, got {first:.3f}"
    assert last >= 0.9, f"reached only {last:.3f} in {len(history)} updates"
    lags = column({"history": history}, "staleness_max")
    assert max(lags) == 2.0  # never past the bound
    # Really asynchronous: after the first two updates, every one trains on rollouts of
    # the policy two versions back (new weights go out only once the actor waits at the bound).
    assert lags[2:] == [2.0] * (len(lags) - 2)
