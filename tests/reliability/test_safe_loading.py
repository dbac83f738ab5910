"""A checkpoint cannot run code, reach outside its directory, or be read before it is verified.

The manifest is an integrity check anyone can recompute, so each hostile
checkpoint here comes with a recomputed, matching manifest: what stops it is
that nothing is unpickled, that paths must stay inside, and that every file a
load touches is listed and checked first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from testkit import reseal

from lmgym.agents import GRPO
from lmgym.cli import main
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.persistence import CheckpointError, verify_manifest, write_manifest
from lmgym.persistence import manifest as manifest_module
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.training import CheckpointManager


class Payload:
    """Unpickling this creates the file ``marker`` (``open(marker, "w")``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def fresh_env():
    """The env of a default CLI run (4 prompts x 8)."""
    return make_target_string_vector(num_envs=32, group_size=8, tokenizer=make_char_tokenizer())


def trained_run(tmp_path: Path, train) -> tuple[Path, Path]:
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run)) == 0
    return run, run / "checkpoints" / "iter_000002"


def plant(state_file: Path, marker: Path) -> None:
    """Add a live payload to a state file (checked to be live: loading with pickle runs it)."""
    state = torch.load(state_file, weights_only=True)
    state["iteration"] = Payload(marker)
    torch.save(state, state_file)
    torch.load(state_file, weights_only=False)
    assert marker.exists(), "the payload must run when unpickled, or the test proves nothing"
    marker.unlink()


@pytest.mark.parametrize("state_file", ["agent/agent_state.pt", "trainer_state.pt"])
def test_a_planted_pickle_is_refused_and_never_runs(tmp_path, train, capsys, state_file):
    run, checkpoint = trained_run(tmp_path, train)
    marker = tmp_path / "pwned"
    plant(checkpoint / state_file, marker)
    reseal(checkpoint)
    progress = (run / "progress.csv").read_bytes()
    capsys.readouterr()

    assert train("--resume", str(run), "--iterations", "3") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"lmgym train: error: checkpoint file {checkpoint / state_file} is refused: it holds "
        "objects other than tensors and plain data, and loading them could run code ("
    )
    assert err.count("\n") == 1
    with pytest.raises(CheckpointError, match="is refused: it holds objects other than tensors"):
        CheckpointManager.load(checkpoint, fresh_env())
    if state_file.startswith("agent/"):
        with pytest.raises(CheckpointError, match="is refused"):
            GRPO.load(checkpoint / "agent", fresh_env())
    assert not marker.exists()
    assert (run / "progress.csv").read_bytes() == progress  # refused before anything changed


@pytest.mark.parametrize("entry", ["../../outside.txt", "/etc/hostname", "policy/../../x"])
def test_a_manifest_entry_outside_the_checkpoint_is_refused_before_hashing(
    tmp_path, monkeypatch, entry
):
    directory = tmp_path / "a" / "b"
    directory.mkdir(parents=True)
    (directory / "inside.txt").write_text("inside")
    write_manifest(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][entry] = {"size": 1, "sha256": "0" * 64}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    hashed = []
    monkeypatch.setattr(manifest_module, "file_sha256", lambda path: hashed.append(path) or "")
    with pytest.raises(CheckpointError) as info:
        verify_manifest(directory)
    assert str(info.value) == (
        f"checkpoint {directory} is refused: manifest.json lists {entry!r}, outside the "
        "checkpoint (entries must be relative paths without '..')"
    )
    assert hashed == []


def test_latest_cannot_point_at_another_run(tmp_path, train, capsys):
    run, _ = trained_run(tmp_path, train)
    other = tmp_path / "other"
    assert train("--iterations", "2", "--run-dir", str(other)) == 0
    before = sorted(str(p) for p in other.rglob("*"))
    (run / "checkpoints" / "latest").write_text("../../other/checkpoints/iter_000002\n")
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "3") == 2
    assert capsys.readouterr().err == (
        f"lmgym train: error: {run / 'checkpoints' / 'latest'} holds "
        "'../../other/checkpoints/iter_000002', not a checkpoint name of this run "
        "(iter_NNNNNN); refusing to follow it. Pass a checkpoint to --resume, or delete the "
        "file to use the newest checkpoint\n"
    )
    assert sorted(str(p) for p in other.rglob("*")) == before


@pytest.mark.parametrize("damage", ["delete", "alter"])
def test_a_damaged_tokenizer_is_named_before_it_is_read(tmp_path, train, capsys, damage):
    run, checkpoint = trained_run(tmp_path, train)
    tokenizer = checkpoint / "agent" / "policy" / "tokenizer.json"
    if damage == "delete":
        tokenizer.unlink()
        problem = "file policy/tokenizer.json is missing"
    else:
        data = bytearray(tokenizer.read_bytes())
        data[10] ^= 0xFF  # invalid UTF-8 in the middle of the JSON
        tokenizer.write_bytes(bytes(data))
        problem = "file policy/tokenizer.json has the right size but the wrong SHA-256"
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "3") == 2
    expected = f"checkpoint {checkpoint / 'agent'} is incomplete or corrupted: {problem}"
    err = capsys.readouterr().err
    assert err.startswith(f"lmgym train: error: {expected}. Resume from an earlier checkpoint")
    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"lmgym eval: error: {expected}.")


def test_a_symlinked_file_in_a_checkpoint_is_refused(tmp_path, train, capsys):
    _, checkpoint = trained_run(tmp_path, train)
    tokenizer = checkpoint / "agent" / "policy" / "tokenizer.json"
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(tokenizer.read_bytes())  # same bytes: size and hash match
    tokenizer.unlink()
    tokenizer.symlink_to(copy)
    with pytest.raises(CheckpointError, match="file policy/tokenizer.json is a symbolic link"):
        CheckpointManager.load(checkpoint, fresh_env())


def test_an_unlisted_or_pickle_based_weight_file_is_refused(tmp_path, train):
    _, checkpoint = trained_run(tmp_path, train)
    planted = checkpoint / "agent" / "policy" / "pytorch_model.bin"
    torch.save({"weight": torch.zeros(1)}, planted)
    with pytest.raises(CheckpointError, match="file policy/pytorch_model.bin is not in manifest"):
        CheckpointManager.load(checkpoint, fresh_env())
    reseal(checkpoint)  # listed now: still refused, as a pickle-based format
    with pytest.raises(
        CheckpointError, match="policy/pytorch_model.bin is a pickle-based weight file"
    ):
        CheckpointManager.load(checkpoint, fresh_env())
    (checkpoint / "notes.txt").write_text("added later")
    with pytest.raises(CheckpointError, match="file notes.txt is not in manifest.json"):
        verify_manifest(checkpoint)


def test_state_that_could_not_load_safely_fails_at_save_time_naming_it(tmp_path):
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    agent = GRPO(policy, fresh_env())
    manager = CheckpointManager(tmp_path)
    with pytest.raises(
        TypeError, match=r"trainer state.callbacks.mine.window is a numpy.ndarray; a checkpoint"
    ):
        manager.save(agent, {"callbacks": {"mine": {"window": np.zeros(3)}}})
    assert os.listdir(tmp_path) == []  # nothing half-written


def test_global_rng_states_round_trip_through_a_safe_file(tmp_path):
    import random

    from lmgym.persistence import global_rng_state, load_state, save_state, set_global_rng_state

    np.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    np.random.normal()  # leaves a cached gaussian in numpy's legacy state
    save_state({"rng": global_rng_state()}, tmp_path / "s.pt")
    expected = (np.random.normal(), random.random(), torch.rand(1))
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    set_global_rng_state(load_state(tmp_path / "s.pt")["rng"])
    assert (np.random.normal(), random.random(), torch.rand(1)) == expected


def test_a_resume_says_which_callback_modules_it_imports(tmp_path, train, capsys, monkeypatch):
    (tmp_path / "resume_import_probe.py").write_text("def record(agent, metrics):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "resume_import_probe", raising=False)
    run = tmp_path / "run"
    spec = "resume_import_probe:record"
    assert train("--iterations", "1", "--run-dir", str(run), "--callback", spec) == 0
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 0
    assert f"importing the code named in {run}/config.json: callback {spec}" in (
        capsys.readouterr().out
    )
    sys.modules.pop("resume_import_probe", None)
