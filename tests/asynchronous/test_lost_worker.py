"""An asynchronous run whose actor dies: learner 0 ends with one line naming the last
checkpoint, which --save-every wrote as on the synchronous path, and the run resumes from it
(issue 27 §6)."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest
from testkit import child_env, torchrun_command

from lmgym.cli import main

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

HERE = Path(__file__).resolve().parent
FAST = ["--no-progress", "--eval-prompts", "2", "--eval-samples", "2", "--log-interval", "0"]


def test_a_killed_actor_ends_the_run_in_one_line_and_what_was_saved_resumes(tmp_path):
    run = tmp_path / "run"
    command = torchrun_command(2, str(HERE / "cli_lost_actor.py"), str(tmp_path), str(run))
    command += ["--iterations", "40", "--save-every", "2", "--sample-every", "0", *FAST]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0  # the launcher reports the killed actor
    errors = [line for line in done.stderr.splitlines() if line.startswith("lmgym train: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "actor 0 (rank 1) stopped (its connection closed" in errors[0] or (
        "stopped by SIGTERM" in errors[0]
    )
    assert f"(continue: lmgym train --resume {run})" in errors[0]
    assert "[rank0]:" not in done.stderr  # learner 0 printed no traceback
    assert (run / "checkpoints" / "iter_000002").is_dir()

    # The resumed run is a one-process run: in this process.
    assert main(["train", "--resume", str(run), "--iterations", "3", *FAST]) == 0
    with open(run / "progress.csv") as file:
        assert [float(r["iteration"]) for r in csv.DictReader(file)][-1] == 3
