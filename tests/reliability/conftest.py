"""Shared pieces of the reliability suite, as fixtures: quiet CLI runs (``train``), history
comparison (``metric_rows``, ``same_history``), fault injection (``write_points``,
``fail_at``, ``killed_at``).

Fault injection replaces ``lmgym.persistence.atomic.write_point``, the no-op every
durable write passes on its way (before and after each write, rename, append,
prune): in this process to raise ``OSError(ENOSPC)``, in a forked child to
``os._exit`` on the spot, which is a kill as far as the files are concerned (no
``finally``, no flush, no clean-up).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit import QUIET_CLI as QUIET  # small evaluations, no periodic printing

from lmgym.cli import main
from lmgym.persistence import atomic
from lmgym.training.logger import read_progress

KILLED = 77
"""Exit status of a child killed at its write point."""


def train(*args: str) -> int:
    """``lmgym train`` in this process, quietly."""
    return main(["train", *QUIET, *args])


def metric_rows(run: Path) -> list[dict[str, float]]:
    """progress.csv without the wall-clock columns."""
    return [
        {k: v for k, v in row.items() if not k.startswith("time/")}
        for row in read_progress(run / "progress.csv")
    ]


def periodic_lines(path: Path) -> list[str]:
    """A history file's lines without the evaluations at a session's start and end
    (``"at"`` records): a run resumed once has two sessions, an uninterrupted one one."""
    return [line for line in path.read_text().splitlines() if '"at": ' not in line]


def same_history(run: Path, reference: Path) -> None:
    """Assert ``run`` holds the metrics, samples and periodic evaluations of ``reference``."""
    assert metric_rows(run) == metric_rows(reference)
    for name in ("samples.jsonl", "eval.jsonl"):
        mine, theirs = run / name, reference / name
        assert mine.exists() == theirs.exists(), name
        if theirs.exists():
            assert periodic_lines(mine) == periodic_lines(theirs), name


def record_write_points(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every write point append its label to the returned list."""
    labels: list[str] = []
    monkeypatch.setattr(atomic, "write_point", labels.append)
    return labels


def fail_at(
    monkeypatch: pytest.MonkeyPatch, k: int, error: BaseException | None = None
) -> list[str]:
    """Raise ``error`` (default ``OSError(ENOSPC)``) at the ``k``-th write point (1-based)."""
    labels: list[str] = []

    def point(label: str) -> None:
        labels.append(label)
        if len(labels) == k:
            raise error or OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "write_point", point)
    return labels


def killed_at(k: int, run: Callable[[], object]) -> tuple[int, str]:
    """Run ``run()`` in a forked child that dies (``os._exit``) at its ``k``-th write point.

    Returns:
        ``(exit status, label of the point it died at, or "" if it finished)``.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            count = 0

            def point(label: str) -> None:
                nonlocal count
                count += 1
                if count == k:
                    os.write(write_end, label.encode())
                    os._exit(KILLED)

            atomic.write_point = point
            run()
            os._exit(0)
        except BaseException:
            os._exit(99)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        label = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), label


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing in this suite may touch the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests kill processes; they do not cut the power. What a killed process
    # wrote is in the OS's page cache either way, so fsync (a quarter of a small
    # run's time here) changes no outcome; skip it.
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(name="train")
def _train() -> Callable[..., int]:
    return train


@pytest.fixture(name="metric_rows")
def _metric_rows() -> Callable[[Path], list[dict[str, float]]]:
    return metric_rows


@pytest.fixture(name="same_history")
def _same_history() -> Callable[[Path, Path], None]:
    return same_history


@pytest.fixture
def write_points(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The labels of the write points passed from now on, in order."""
    return record_write_points(monkeypatch)


@pytest.fixture(name="fail_at")
def _fail_at(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """``fail_at(k, error=None)``: raise at the k-th write point from now on."""
    return lambda k, error=None: fail_at(monkeypatch, k, error)


@pytest.fixture(name="killed_at")
def _killed_at() -> Callable[[int, Callable[[], object]], tuple[int, str]]:
    if not hasattr(os, "fork"):  # pragma: no cover
        pytest.fail("the kill tests need os.fork (Linux or macOS)")
    return killed_at
