"""A model that stops on more than its tokenizer's EOS (a chat model's generation config)
trains and evaluates from the command line: the run's env stops on the policy's ids,
and config.json records them for a resume and eval --run."""

from __future__ import annotations

import json
from pathlib import Path

from lmgym.cli import main

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "1", "--eval-samples", "2"]
QUIET += ["--samples", "0", "--sample-every", "0", "--num-prompts", "1", "--group-size", "2"]


def two_stop_model(path: Path) -> Path:
    """The tiny GPT-2 whose generation config stops on EOS (1) and on id 2 (<unk> here,
    <|endoftext|> in SmolLM2): a special token the env refuses unless told it stops."""
    from lmgym.policy import save_tiny
    from lmgym.policy.tiny import make_tiny_lm

    model, tokenizer = make_tiny_lm()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.unk_token_id]
    return save_tiny(path, (model, tokenizer))


def test_train_resume_and_eval_use_the_policys_stop_ids(tmp_path, capsys):
    model = two_stop_model(tmp_path / "model")
    run = tmp_path / "run"
    args = ["train", *QUIET, "--model", str(model), "--save-every", "1"]
    assert main([*args, "--iterations", "1", "--run-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())["run"]["env_kwargs"]
    assert saved["stop_token_ids"] == [1, 2]
    assert main(["train", *QUIET, "--resume", str(run), "--iterations", "2"]) == 0
    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "2"]) == 0
    args = ["eval", "--model", str(model), "--task", "lmgym/TargetString-v0", "--num-prompts", "1"]
    assert main([*args, "-k", "2"]) == 0, capsys.readouterr().err


def test_stop_ids_the_user_gives_are_kept(tmp_path):
    model = two_stop_model(tmp_path / "model")
    run = tmp_path / "run"
    args = ["train", *QUIET, "--model", str(model), "--env", "stop_token_ids=[1, 2]"]
    assert main([*args, "--iterations", "1", "--run-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())["run"]["env_kwargs"]
    assert saved["stop_token_ids"] == [1, 2]


def test_a_model_stopping_on_eos_alone_changes_nothing(tmp_path):
    from lmgym.policy import save_tiny

    run = tmp_path / "run"
    args = ["train", *QUIET, "--model", str(save_tiny(tmp_path / "m")), "--iterations", "1"]
    assert main([*args, "--run-dir", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["run"]["env_kwargs"] == {}
