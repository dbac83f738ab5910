"""Resuming a run whose directory changed by hand: each refusal names the change and the way
out (issue 27 §6), and a refused resume leaves the run as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmgym.agents import GRPOConfig
from lmgym.cli import main

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]


def train(*args: str) -> int:
    return main(["train", *QUIET, *args])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A 2-iteration run with checkpoints at 1 and 2."""
    run = tmp_path_factory.mktemp("edits") / "run"
    assert train("--iterations", "2", "--save-every", "1", "--run-dir", str(run)) == 0
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns(".lmgym.lock*"))
    return copy


def edit(run: Path, section: str, field: str, value) -> None:
    config = json.loads((run / "config.json").read_text())
    if section:
        config[section][field] = value
    else:
        config[field] = value
    (run / "config.json").write_text(json.dumps(config))


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_an_edited_agent_value_is_named_not_ignored(run, capsys):
    edit(run, "agent", "learning_rate", 0.5)
    rows = (run / "progress.csv").read_text()
    assert train("--resume", str(run), "--iterations", "3") == 2
    err = one_line(capsys)
    rate = GRPOConfig().learning_rate
    assert (
        "config.json and checkpoint iter_000002 disagree: agent field learning_rate is 0.5 in "
        f"config.json, {rate} in the checkpoint's agent/agent_config.json; one of them was "
        "changed after the checkpoint was written"
    ) in err
    assert f"If you edited config.json, put {rate} back there to resume" in err
    assert "lmgym train --config" in err
    assert (run / "progress.csv").read_text() == rows  # nothing trained or rewound


def test_an_edited_fixed_run_value_is_named(run, capsys):
    edit(run, "run", "temperature", 0.5)
    assert train("--resume", str(run), "--iterations", "3") == 2
    err = one_line(capsys)
    assert (
        "run field temperature is 0.5 in config.json, 1.0 in the checkpoint's trainer_state.pt"
    ) in err


def test_an_edited_algo_is_named_not_reported_as_unknown_fields(run, capsys):
    edit(run, "", "algo", "ppo")
    assert train("--resume", str(run)) == 2
    err = one_line(capsys)
    assert (
        "says algo 'ppo', but checkpoint iter_000002's agent/agent_config.json says 'grpo': "
        "one of the two files was changed after the checkpoint was written (edited by hand, or "
        'damaged). If you edited config.json, set "algo" back to "grpo" there'
    ) in err
    assert "unknown field" not in err


def test_a_missing_config_json_says_what_to_do(run, capsys):
    (run / "config.json").unlink()
    assert train("--resume", str(run)) == 2
    err = one_line(capsys)
    assert "config.json is missing, though" in err and "--model" in err


def test_a_checkpoint_set_aside_in_abandoned_says_how_to_continue_it(run, capsys):
    assert train("--resume", str(run / "checkpoints" / "iter_000001")) == 0
    aside = next((run / "abandoned").glob("*/checkpoints/iter_000002"))
    capsys.readouterr()
    assert train("--resume", str(aside)) == 2
    err = one_line(capsys)
    assert "a resume from an earlier one set aside" in err
    assert f"cp -r {aside} {run / 'checkpoints'}/" in err


def test_an_unchanged_resume_still_continues(run):
    assert train("--resume", str(run), "--iterations", "3") == 0
    assert (run / "checkpoints" / "iter_000003").is_dir()
