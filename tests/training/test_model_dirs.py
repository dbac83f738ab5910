"""Model directories as users have them: weights only as ``pytorch_model.bin`` (older
transformers), or no weights at all (issue 27 §6: the first gave a traceback)."""

from __future__ import annotations

from pathlib import Path

import torch

from lmgym.cli import main
from lmgym.policy import make_char_tokenizer, make_tiny_model

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]


def bin_only_model(path: Path) -> Path:
    """A tiny GPT-2 whose weights are a ``pytorch_model.bin`` state dict, no safetensors."""
    tokenizer = make_char_tokenizer()
    model = make_tiny_model(len(tokenizer), seed=0)
    model.config.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    assert not list(path.glob("*.safetensors"))
    return path


def test_a_model_directory_with_only_a_bin_file_trains_and_evaluates(tmp_path, capsys):
    model = bin_only_model(tmp_path / "model")
    run = tmp_path / "run"
    args = ["--model", str(model), "--iterations", "2", "--run-dir", str(run)]
    assert main(["train", *QUIET, *args]) == 0
    assert (run / "checkpoints" / "iter_000002").is_dir()
    assert main(["eval", "--model", str(model), "--task", "lmgym/TargetString-v0"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_model_directory_without_weights_is_one_line_naming_it(tmp_path, capsys):
    model = bin_only_model(tmp_path / "model")
    (model / "pytorch_model.bin").unlink()
    run = tmp_path / "run"
    assert main(["train", *QUIET, "--model", str(model), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(model) in err[0], err
    assert not run.exists()  # a failed start leaves no run directory
