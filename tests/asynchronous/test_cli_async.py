"""``lmgym train --actors 1 --learners 1``: torch's launcher starts 2 processes; learner 0 writes."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest
from testkit import refused_line, run_lmgym_train

from lmgym.cli import main

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

FAST = ["--no-progress", "--eval-prompts", "2", "--eval-samples", "2", "--log-interval", "0"]


def lmgym(*args: str) -> subprocess.CompletedProcess:
    return run_lmgym_train(*args, timeout=240)


def train(*args: str) -> int:
    """``lmgym train`` in this process."""
    return main(["train", *args])


def test_one_actor_one_learner_runs_and_writes_one_run_directory(tmp_path, capsys):
    """Learner 0 writes what rank 0 of a synchronous run writes: checkpoints every
    --save-every, periodic evaluations and samples; the run resumes synchronously (in
    this process: the resumed run is a one-process run). The task is multi-turn
    (GuessNumber: the env answers each guess), so the launch also shows that the actor
    plays whole multi-turn episodes for the learner."""
    run = tmp_path / "run"
    done = lmgym(
        "--actors", "1", "--learners", "1", "--max-staleness", "1", "--tis-cap", "2",
        "--task", "lmgym/GuessNumber-v0", "--num-prompts", "2", "--group-size", "4",
        "--iterations", "3", "--save-every", "2", "--keep-checkpoints", "0",
        "--eval-every", "2", "--sample-every", "2", "--samples", "1",
        "--run-dir", str(run), *FAST,
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
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000002",
        "iter_000003",
        "latest",
    ]
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [(e["iteration"], e.get("at")) for e in evals] == [(0, "start"), (2, None), (3, "end")]
    assert "[samples @ 2]" in done.stdout

    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "4", *FAST) == 0  # one process
    assert "it resumes on the synchronous path" in capsys.readouterr().out
    with open(run / "progress.csv") as file:
        assert [float(r["iteration"]) for r in csv.DictReader(file)] == [1, 2, 3, 4]


def test_resume_with_actors_is_refused(tmp_path, capsys):
    """Refused while reading the command line, before any launch: in this process."""
    line = refused_line(train, capsys, "--actors", "1", "--resume", str(tmp_path), *FAST)
    assert "--resume cannot be combined with --actors/--learners" in line
