"""``lmgym train --actors 1 --learners 1``: torch's launcher starts 2 processes; learner 0 writes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--no-progress", "--eval-prompts", "2", "--eval-samples", "2", "--log-interval", "0"]


def lmgym(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "lmgym", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


def test_one_actor_one_learner_runs_and_writes_one_run_directory(tmp_path):
    run = tmp_path / "run"
    done = lmgym(
        "--actors", "1", "--learners", "1", "--max-staleness", "1", "--tis-cap", "2",
        "--iterations", "3", "--run-dir", str(run), *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("reward before:") == 1
    with open(run / "progress.csv") as file:
        table = list(csv.DictReader(file))
    assert [float(r["iteration"]) for r in table] == [1, 2, 3]
    assert all(float(r["staleness_max"]) <= 1 for r in table)
    saved = json.loads((run / "config.json").read_text())
    assert saved["launch"]["async"]["actors"] == 1
    assert saved["launch"]["async"]["max_staleness"] == 1
    assert (run / "checkpoints" / "iter_000003").is_dir()

    refused = lmgym("--resume", str(run), "--iterations", "4", *FAST)
    assert refused.returncode == 2
    assert "async runs cannot be resumed" in refused.stderr


def test_resume_with_actors_is_refused(tmp_path):
    done = lmgym("--actors", "1", "--resume", str(tmp_path), *FAST)
    assert done.returncode == 2
    assert "asynchronous runs cannot be resumed" in done.stderr
