"""A LoRA run's checkpoints hold the adapter and a checked reference to the base model,
not a copy of its weights (unless --save-base-weights); resume and eval --run restore
them exactly, and a base that moved is one error line saying what to pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmgym.cli import main
from lmgym.training.logger import read_progress

peft = pytest.importorskip("peft")

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]
QUIET += ["--samples", "0", "--sample-every", "0", "--num-prompts", "2", "--group-size", "4"]
LORA = ["--lora-r", "4", "--lora-target-modules", "q_proj", "v_proj", "--learning-rate", "2e-3"]


def rows(run: Path) -> list[dict[str, float]]:
    return [
        {k: v for k, v in row.items() if not k.startswith("time/")}
        for row in read_progress(run / "progress.csv")
    ]


def train(*args: str) -> int:
    return main(["train", *QUIET, *LORA, *args])


def test_checkpoints_reference_the_base_and_resume_exactly(tmp_path, capsys, tiny_llama):
    base = tiny_llama
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["--model", str(base), "--save-every", "1", "--keep-checkpoints", "0"]
    assert train(*common, "--iterations", "3", "--run-dir", str(whole)) == 0
    assert train(*common, "--iterations", "2", "--run-dir", str(split)) == 0
    assert train("--resume", str(split), "--iterations", "3") == 0
    assert rows(split) == rows(whole)

    policy = split / "checkpoints" / "iter_000003" / "agent" / "policy"
    assert not (policy / "base").exists()
    reference = json.loads((policy / "base_model.json").read_text())
    assert reference["name_or_path"] == str(base.resolve())
    base_bytes = (base / "model.safetensors").stat().st_size
    written = sum(p.stat().st_size for p in policy.rglob("*") if p.is_file())
    assert written < base_bytes / 2
    capsys.readouterr()
    assert main(["eval", "--run", str(split), "--num-prompts", "2", "-k", "2"]) == 0


def test_save_base_weights_keeps_the_full_base(tmp_path, tiny_llama):
    base = tiny_llama
    run = tmp_path / "run"
    assert (
        train(
            "--model", str(base), "--iterations", "1", "--run-dir", str(run), "--save-base-weights"
        )
        == 0
    )
    policy = run / "checkpoints" / "iter_000001" / "agent" / "policy"
    assert (policy / "base" / "model.safetensors").is_file()
    assert not (policy / "base_model.json").exists()
    shutil.rmtree(base)  # the checkpoint alone resumes
    assert train("--resume", str(run), "--iterations", "2") == 0


def test_the_tiny_demo_base_is_written_whole(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *QUIET, "--lora-r", "2", "--iterations", "1", "--run-dir", str(run)]) == 0
    policy = run / "checkpoints" / "iter_000001" / "agent" / "policy"
    assert (policy / "base" / "model.safetensors").is_file()  # its temporary directory is gone


def test_a_moved_base_is_one_line_naming_what_to_pass(tmp_path, capsys, monkeypatch, tiny_llama):
    base = tiny_llama
    run = tmp_path / "run"
    assert train("--model", str(base), "--iterations", "1", "--run-dir", str(run)) == 0
    moved = tmp_path / "moved"
    base.rename(moved)
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"its base model {base.resolve()} is gone" in err
    assert "set LMGYM_LORA_BASE=DIR to a copy of it" in err
    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "2"]) == 2
    assert "LMGYM_LORA_BASE=DIR" in capsys.readouterr().err
    monkeypatch.setenv("LMGYM_LORA_BASE", str(moved))
    assert train("--resume", str(run), "--iterations", "2") == 0
