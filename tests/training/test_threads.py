"""--threads: 1 by default (fastest for the tiny model, and safe on a busy small machine);
--threads 0 chooses from the cores and the load, once, and the run records its choice."""

from __future__ import annotations

import json

import pytest

from lmgym.cli import main
from lmgym.training.run import TrainConfig
from lmgym.training.threads import MAX_AUTO_THREADS, auto_threads

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "1", "--eval-samples", "2"]
QUIET += ["--samples", "0", "--sample-every", "0", "--num-prompts", "1", "--iterations", "1"]


@pytest.mark.parametrize(
    ("cores", "load", "processes", "threads"),
    [
        (2, 0.0, 1, 1),  # a 2-core machine: one thread even when idle
        (1, 0.0, 1, 1),
        (8, 7.5, 1, 1),  # the cores are busy
        (8, 2.0, 1, 6),  # six idle cores
        (64, 0.0, 1, MAX_AUTO_THREADS),
        (4, 0.0, 2, 1),  # two processes share four cores: two each, so one
        (32, 31.0, 4, MAX_AUTO_THREADS),  # data parallel: cores / processes, load ignored
    ],
)
def test_auto_threads(cores, load, processes, threads):
    assert auto_threads(cores, load, processes)[0] == threads


def test_the_default_is_one_thread():
    assert TrainConfig().threads == 1


def test_threads_zero_chooses_once_and_records_the_choice(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *QUIET, "--threads", "0", "--run-dir", str(run)]) == 0
    chosen = json.loads((run / "config.json").read_text())["run"]["threads"]
    assert chosen >= 1  # (the load average may move between two reads: not compared)
    assert f"threads: {chosen} (" in capsys.readouterr().out


def test_negative_threads_are_refused(tmp_path, capsys):
    assert main(["train", *QUIET, "--threads", "-1", "--run-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        "lmgym train: error: threads=-1: must be >= 1, or 0 to choose from the machine\n"
    )
