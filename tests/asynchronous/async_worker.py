"""Worker launched by torchrun: runs ``run_async`` scenarios and writes what the tests compare.

    python -m torch.distributed.run --standalone --nproc-per-node N async_worker.py SCENARIOS OUT

``SCENARIOS`` is a comma-separated list run in order in the same processes (one
launch, one start-up): a scenario whose run fails on purpose (``kill``, ``stuck``)
comes last. Rank 0 writes ``OUT/<scenario>-start.txt`` (the wall-clock time the
scenario began); learners write ``OUT/<run>-learner<i>.pt`` (history, final
parameters, trained group ids); the tests read them. tests/testkit/async_launch.py
launches this file: the session's one two-rank launch runs test_async.py's two-rank
scenarios and ``multi-turn``, the scenarios of tests/multi_turn/test_parallel_multi_turn.py
(data parallel in the default process group, then ``run_async``; its agents and workers
are in tests/multi_turn/parallel_multi_turn_cases.py), which writes
``OUT/multi-turn-rank<r>.pt`` and ``OUT/multi-turn-<case>.pt``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The multi-turn cases (imported by the ``multi-turn`` scenario only).
sys.path.append(str(Path(__file__).resolve().parents[1] / "multi_turn"))

from async_cases import (  # noqa: E402
    BOUND_ITERATIONS,
    EQUAL_CASES,
    EQUAL_ITERATIONS,
    LEARN_BUDGET,
    LEARN_OVERRIDES,
    LEARN_TARGET,
    SINGLE_PASS,
    TWO_LEARNERS,
    make_agent,
)

from lmgym.asynchronous import AsyncConfig, AsyncHooks, run_async  # noqa: E402
from lmgym.distributed import init_from_env, shutdown  # noqa: E402


def run(out: Path, name: str, config: AsyncConfig, iterations: int, factory, hooks=None) -> None:
    """``run_async``; learners save their history, final parameters and trained group ids."""
    trained: list = []
    hooks = hooks or AsyncHooks()
    also = hooks.learner_update

    def record(update, ids):
        trained.append(ids.tolist())
        if also is not None:
            also(update, ids)

    hooks.learner_update = record
    result = run_async(factory, iterations, config, hooks=hooks)
    if result.role.is_learner:
        params = [p.detach().clone() for p in result.agent.policy.model.parameters()]
        torch.save(
            {"history": result.history, "params": params, "trained": trained},
            out / f"{name}-learner{result.role.index}.pt",
        )


def factory(algorithm: str, overrides: dict, role, **kwargs):
    return make_agent(algorithm, overrides, role, **kwargs)


def pause(seconds: float, only: int | None = None):
    """A hook that sleeps (in actor ``only``'s loop, or everywhere)."""

    def hook(index, *_):
        if only is None or index == only:
            time.sleep(seconds)

    return hook


def at_the_bound(marker: Path, poll_s: float = 0.002, limit_s: float = 120.0) -> AsyncHooks:
    """Hooks that hold back each update's new weights until the actor waits for them.

    The actor writes the weights version it holds to ``marker`` whenever it has nothing
    admissible left; learner 0 returns from update ``u``'s hook (and so publishes
    version ``u + 1``) only once the actor waits holding version ``u``. Every row is
    then sampled wholly by the oldest weights the bound allows, and no new weights
    ever arrive mid-row, however the two processes are scheduled.
    """

    def actor_wait(actor: int, version: int) -> None:
        partial_file = marker.with_suffix(".partial")
        partial_file.write_text(str(version))
        os.replace(partial_file, marker)  # the learner never reads half a number

    def learner_update(update: int, ids) -> None:
        deadline = time.monotonic() + limit_s
        while not (marker.exists() and int(marker.read_text()) >= update):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the actor did not wait at the bound of update {update}")
            time.sleep(poll_s)

    return AsyncHooks(actor_wait=actor_wait, learner_update=learner_update)


def equal(out: Path) -> None:
    """One learner, one actor, max_staleness=0: the synchronous run's updates."""
    for name, (algorithm, overrides) in EQUAL_CASES.items():
        make = partial(factory, algorithm, overrides)
        run(out, name, AsyncConfig(max_staleness=0), EQUAL_ITERATIONS, make)


def bound(out: Path) -> None:
    """One learner, two actors, under a slow learner and a slow actor."""
    # One step per update: the slow actor must stay slower than the learner.
    make = partial(factory, "grpo", {"tis_cap": 2.0, **SINGLE_PASS})
    runs = [
        ("wait-slow-learner", AsyncConfig(actors=2), AsyncHooks(learner_update=pause(0.3))),
        ("wait-slow-actor", AsyncConfig(actors=2), AsyncHooks(actor_step=pause(0.02, only=1))),
        (
            "row-boundary-slow-actor",
            AsyncConfig(actors=2, weight_sync="row_boundary"),
            AsyncHooks(actor_step=pause(0.02, only=1)),
        ),
        (
            "drop-slow-learner",
            AsyncConfig(actors=2, max_staleness=0, stale_policy="drop"),
            AsyncHooks(learner_update=pause(0.3)),
        ),
    ]
    for name, config, hooks in runs:
        run(out, name, config, BOUND_ITERATIONS, make, hooks)
    # Two learners, one actor: the data-parallel update on each update's groups.
    two = AsyncConfig(learners=2, max_staleness=0)
    run(out, "two-learners", two, 2, partial(factory, *TWO_LEARNERS))


def kill(out: Path) -> None:
    """Actor 1 kills itself (SIGKILL) after queueing its second message; the learner
    appends each update's trained group ids to ``OUT/trained.txt`` as it goes."""

    def die(actor, sent):
        if actor == 1 and sent == 2:
            time.sleep(0.2)  # let the messages leave
            os.kill(os.getpid(), signal.SIGKILL)

    def record(update, ids):
        with (out / "trained.txt").open("a") as f:
            f.write(" ".join(map(str, ids.tolist())) + "\n")

    hooks = AsyncHooks(actor_sent=die, learner_update=record)
    # One step per update: the slow actor must stay slower than the learner.
    make = partial(factory, "grpo", {"tis_cap": 2.0, **SINGLE_PASS})
    run_async(make, 50, AsyncConfig(actors=2, timeout_s=60), hooks=hooks)


def stuck(out: Path) -> None:
    """The only actor stops answering (alive, asleep) after two decode steps."""
    hooks = AsyncHooks(actor_step=lambda actor, step: time.sleep(600) if step == 2 else None)
    make = partial(factory, "grpo", {})
    run_async(make, 5, AsyncConfig(timeout_s=3), hooks=hooks)


def learn(out: Path) -> None:
    """TargetString "world" with max_staleness=2, until solved."""
    recent: list[float] = []

    def solved(agent, metrics):
        recent.append(metrics["reward_mean"])
        return not (len(recent) >= 5 and sum(recent[-5:]) / 5 >= 0.95)

    make = partial(
        factory,
        "grpo",
        LEARN_OVERRIDES,
        num_prompts=4,
        group_size=16,
        max_new_tokens=None,
        target=LEARN_TARGET,
    )
    # The learner publishes each new version only once the actor waits at the bound:
    # every rollout is exactly as stale as max_staleness allows whatever the machine's
    # load, so the run is the same every time.
    hooks = at_the_bound(out / "learn-actor-waits.txt")
    config = AsyncConfig(max_staleness=2)
    result = run_async(make, LEARN_BUDGET, config, hooks=hooks, callback=solved)
    if result.role.is_learner:
        torch.save({"history": result.history}, out / "learn-learner0.pt")


def multi_turn(out: Path) -> None:
    """Two ranks: a multi-turn batch's data-parallel update in the default (world) group,
    then one actor and one learner at max_staleness=0 on multi-turn episodes."""
    import parallel_multi_turn_cases as cases  # here: the other scenarios do without its imports

    # A no-op when an earlier scenario's run_async joined the group already.
    init_from_env(timeout_s=60)
    cases.dp_worker(out)
    cases.async_worker(out)


SCENARIOS = {
    "equal": equal,
    "bound": bound,
    "kill": kill,
    "stuck": stuck,
    "learn": learn,
    "multi-turn": multi_turn,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    names, out = sys.argv[1].split(","), Path(sys.argv[2])
    for name in names:
        if os.environ["RANK"] == "0":
            (out / f"{name}-start.txt").write_text(repr(time.time()))
        SCENARIOS[name](out)
    shutdown()
