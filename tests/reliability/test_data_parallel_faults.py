"""Data parallel (2 processes, gloo): a failure on one rank stops every rank with a clear
error, no hang, nothing half-written (docs/distributed.md, Errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.train_ranks import GROUP, Scenario

from lmgym.training import CheckpointManager

# Multi-process runs (make test-fast skips them), in the suite's shared two-rank launch
# (tests/conftest.py: two_rank_train), whose tests run on one worker.
pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group(GROUP)]

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]
FAST = [*QUIET, "--samples", "1", "--num-prompts", "2", "--group-size", "4"]


FLAGS = ["--iterations", "3", "--save-every", "1", "--keep-checkpoints", "0"]


def two_rank_scenarios(root: Path, selected: set[str]) -> list[Scenario]:
    """Rank 0's disk is full at iteration 2's checkpoint manifest; then rank 0 copies
    what the failure left (``full-disk-after``: checked below) and both ranks resume
    the run."""
    run, after = root / "full-disk", root / "full-disk-after"
    return [
        Scenario(
            "full-disk",
            [*FAST, *FLAGS, "--run-dir", str(run)],
            full_disk_at="manifest iter_000002",
        ),
        Scenario(
            "full-disk-resume",
            ["--resume", str(run), *FLAGS[:2], *QUIET],
            copy=(str(run), str(after)),
        ),
    ]


def test_rank_0_failing_a_checkpoint_write_stops_every_rank_and_keeps_the_last_good_one(
    two_rank_train,
):
    """Both ranks returned from each run (no hang, no crash): the failure is one line on
    each, nothing is half-written, and the run resumes from its last good checkpoint."""
    root, _, outcomes = two_rank_train
    run, after = root / "full-disk", root / "full-disk-after"
    failed = outcomes["full-disk"]
    assert failed.codes == [2, 2]
    last_good = run / "checkpoints" / "iter_000001"
    assert failed.err[0] == (
        "lmgym train: error: [Errno 28] No space left on device; its last complete checkpoint "
        f"is {last_good} (continue: lmgym train --resume {run})\n"
    )
    assert failed.err[1] == (
        "lmgym train: error: rank 0 failed, so this rank stops too: OSError: [Errno 28] No "
        "space left on device\n"
    )
    # Nothing half-written: the failed checkpoint is gone, latest names a complete one.
    checkpoints = after / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter_000001", "latest"]
    assert CheckpointManager(checkpoints).latest() == checkpoints / "iter_000001"
    CheckpointManager.verify(checkpoints / "iter_000001")
    # And the run continues from it on both ranks.
    resumed = outcomes["full-disk-resume"]
    assert resumed.codes == [0, 0], resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert CheckpointManager(run / "checkpoints").latest().name == "iter_000003"
