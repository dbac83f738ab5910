"""torchrun launches of tests/asynchronous/async_worker.py, and the session's two-rank one.

A rank pays seconds of imports (torch, lmgym) before any work, so the suite runs every
two-rank asynchronous scenario in ONE launch: ``launch_two_ranks`` (the session fixture
``async_two_ranks`` of tests/conftest.py). Its tests carry
``xdist_group(GROUP)``, so ``--dist loadgroup`` keeps them on one worker
and the launch runs once. A scenario runs when a selected test reads it (``SCENARIOS``).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from testkit import child_env, torchrun_command
from testkit.train_ranks import check_one_worker

WORKER = Path(__file__).resolve().parents[1] / "asynchronous" / "async_worker.py"
#: The xdist group of every test that reads the two-rank launch.
GROUP = "async-two-ranks"

# The two-rank launch's scenarios, in the order they run, each with the tests that read
# it: (scenario, test module's file name, its test functions; None: every test of the
# module that uses ``async_two_ranks``). ``stuck`` fails the launch on purpose: last.
SCENARIOS: list[tuple[str, str, set[str] | None]] = [
    ("equal", "test_async.py", {"test_max_staleness_0_is_the_synchronous_run"}),
    ("multi-turn", "test_parallel_multi_turn.py", None),
    ("learn", "test_async.py", {"test_max_staleness_2_learns_the_target_string"}),
    ("stuck", "test_async.py", {"test_a_stuck_actor_ends_the_run_after_the_timeout"}),
]


@dataclass
class Launch:
    """One torchrun launch of ``async_worker.py``: its scenarios' files and output."""

    out: Path
    done: subprocess.CompletedProcess
    ended: float  # wall-clock time the launch returned

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    def load(self, name: str) -> dict:
        """``OUT/<name>.pt``, written by a scenario that finished."""
        path = self.out / f"{name}.pt"
        assert path.exists(), self.done.stdout[-3000:] + self.done.stderr[-3000:]
        return torch.load(path)

    def seconds_since_start(self, scenario: str) -> float:
        """From the scenario's start to the launch's end."""
        return self.ended - float((self.out / f"{scenario}-start.txt").read_text())


def torchrun(
    scenarios: list[str], out: Path, nproc: int, *extra: str, timeout: float = 400
) -> Launch:
    """``async_worker.py SCENARIOS OUT`` on ``nproc`` ranks (torchrun flags ``extra``)."""
    worker = [str(WORKER), ",".join(scenarios), str(out)]
    command = torchrun_command(nproc, *extra, *worker)
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout)
    return Launch(out, done, time.time())


def reads_the_launch(item: pytest.Item, module: str, tests: set[str] | None) -> bool:
    """Whether ``item`` is one of ``tests`` (None: any test) of the test file ``module``
    and uses the ``async_two_ranks`` fixture."""
    if item.path.name != module or "async_two_ranks" not in item.fixturenames:
        return False
    return tests is None or getattr(item, "originalname", item.name) in tests


def launch_two_ranks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """One learner and one actor, every scenario a selected test reads, in ``SCENARIOS``'
    order: the k=0 runs, the multi-turn data-parallel and k=0 runs, the learning run,
    then an actor that goes silent (the launch's run fails on purpose)."""
    items = request.session.items
    check_one_worker(items, "async_two_ranks", GROUP)
    scenarios = [
        name
        for name, module, tests in SCENARIOS
        if any(reads_the_launch(item, module, tests) for item in items)
    ]
    if not scenarios:
        raise LookupError(
            "async_two_ranks: no selected test reads a scenario; list the test in "
            "testkit/async_launch.py's SCENARIOS"
        )
    # The scenarios of the former two launches (400 s and 300 s) in one.
    return torchrun(scenarios, tmp_path_factory.mktemp(GROUP), 2, timeout=600)
