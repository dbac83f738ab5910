"""Data parallel (2 processes, gloo): a failure on one rank stops every rank with a clear
error, no hang, nothing half-written (docs/distributed.md, Errors)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmgym.training import CheckpointManager

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]
FAST = [*QUIET, "--samples", "1", "--num-prompts", "2", "--group-size", "4"]


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", *args]
    return subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout)


def test_rank_0_failing_a_checkpoint_write_stops_every_rank_and_keeps_the_last_good_one(
    tmp_path,
):
    run = tmp_path / "run"
    flags = ["--iterations", "3", "--save-every", "1", "--keep-checkpoints", "0"]
    done = torchrun(
        str(HERE / "rank_fault.py"), str(tmp_path), "manifest iter_000002",
        *FAST, *flags, "--run-dir", str(run),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # both ranks returned (no hang, no crash)
    assert [(tmp_path / f"rc{r}").read_text() for r in range(2)] == ["2", "2"]
    last_good = run / "checkpoints" / "iter_000001"
    assert (tmp_path / "err0").read_text() == (
        "lmgym train: error: [Errno 28] No space left on device; its last complete checkpoint "
        f"is {last_good} (continue: lmgym train --resume {run})\n"
    )
    assert (tmp_path / "err1").read_text() == (
        "lmgym train: error: rank 0 failed, so this rank stops too: OSError: [Errno 28] No "
        "space left on device\n"
    )
    # Nothing half-written: the failed checkpoint is gone, latest names a complete one.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001", "latest"]
    manager = CheckpointManager(run / "checkpoints")
    assert manager.latest() == last_good
    CheckpointManager.verify(last_good)
    # And the run continues from it on both ranks.
    resumed = torchrun("-m", "lmgym", "train", "--resume", str(run), *flags[:2], *QUIET)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert CheckpointManager(run / "checkpoints").latest().name == "iter_000003"
