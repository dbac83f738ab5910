"""A run on a pretrained model (--model) takes PRETRAINED_DEFAULTS for what the user did
not set, says so in one line, and docs/cli.md's table states the same values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmgym.agents import GRPOConfig
from lmgym.cli import main
from lmgym.training.pretrained import PRETRAINED_DEFAULTS, apply_pretrained_defaults, as_table

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "1", "--eval-samples", "2"]
QUIET += ["--samples", "0", "--sample-every", "0", "--num-prompts", "1", "--iterations", "1"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lmgym.policy import save_tiny

    return save_tiny(tmp_path_factory.mktemp("model") / "tiny")


def saved(run: Path) -> tuple[dict, dict]:
    config = json.loads((run / "config.json").read_text())
    return config["run"], config["agent"]


def test_a_pretrained_full_fine_tune_gets_its_defaults_and_says_so(tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    assert main(["train", *QUIET, "--model", str(tiny_model), "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "pretrained model defaults (full fine-tune): learning_rate 1e-05, temperature 1, "
        "group_size 8, beta 0, update_epochs 1, num_minibatches 1 (set the flags to change "
        "them; docs/cli.md, Pretrained models)"
    )
    run_values, agent = saved(run)
    assert agent["learning_rate"] == PRETRAINED_DEFAULTS.learning_rate_full
    assert run_values["group_size"] == PRETRAINED_DEFAULTS.group_size
    assert (run_values["temperature"], agent["beta"]) == (1.0, 0.0)


def test_what_the_user_sets_wins_on_the_command_line_and_in_a_config(tmp_path, tiny_model, capsys):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"group_size": 4}))
    run = tmp_path / "run"
    args = ["train", *QUIET, "--model", str(tiny_model), "--config", str(config)]
    assert main([*args, "--learning-rate", "1e-3", "--run-dir", str(run)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(
        "pretrained model defaults (full fine-tune): temperature 1, beta 0, update_epochs 1, "
        "num_minibatches 1 ("
    )
    run_values, agent = saved(run)
    assert (agent["learning_rate"], run_values["group_size"]) == (1e-3, 4)


def test_the_tiny_demo_keeps_its_own_defaults(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *QUIET, "--run-dir", str(run)]) == 0
    assert "pretrained model defaults" not in capsys.readouterr().out
    run_values, agent = saved(run)
    assert (agent["learning_rate"], run_values["group_size"]) == (GRPOConfig().learning_rate, 16)


def test_lora_takes_the_lora_learning_rate():
    run = {"model": "m", "lora_r": 8, "temperature": 0.7, "group_size": 16}
    agent = {"learning_rate": 1e-3, "beta": 0.04}
    line = apply_pretrained_defaults(run, agent, given={"temperature"})
    assert agent == {"learning_rate": PRETRAINED_DEFAULTS.learning_rate_lora, "beta": 0.0}
    assert run["temperature"] == 0.7 and run["group_size"] == 8
    assert line is not None and line.startswith("pretrained model defaults (LoRA): learning_rate")


def test_the_docs_table_states_the_record():
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `--([a-z-]+)`[^|]*\| ([0-9.e-]+) \|$", text, re.M))
    lora = re.search(r"^\| `--learning-rate` with LoRA[^|]*\| ([0-9.e-]+) \|$", text, re.M)
    full = re.search(r"^\| `--learning-rate`, full fine-tune \| ([0-9.e-]+) \|$", text, re.M)
    table = as_table()
    assert lora and float(lora.group(1)) == table["learning_rate_lora"]
    assert full and float(full.group(1)) == table["learning_rate_full"]
    assert float(rows["temperature"]) == table["temperature"]
    assert int(rows["group-size"]) == table["group_size"]
    assert float(rows["beta"]) == table["beta"]
    assert int(rows["update-epochs"]) == table["update_epochs"]
    assert int(rows["num-minibatches"]) == table["num_minibatches"]
