"""Faults the libraries under lmgym's writes and reads report in their own way: each is
one line and exit 2, and nothing finished is lost (issue 27 §6).

- a full disk inside ``torch.save`` (``RuntimeError: [enforce fail at
  inline_container.cc] ... unexpected pos``) rather than an ``OSError``;
- a ``model.safetensors`` whose header is damaged, with a manifest recomputed over
  it, on ``train --resume`` and ``eval --run``;
- the lock's files deleted, or replaced by a directory or a link, while a run
  holds its directory.
"""

from __future__ import annotations

import os
import signal

import torch

from lmgym.cli import main
from lmgym.persistence import manifest, state
from lmgym.persistence.lock import LOCK_FILE, PID_FILE, DirectoryLock

RUN = ["--task", "lmgym/Reverse-v0", "--save-every", "1", "--keep-checkpoints", "2"]
TORCH_FULL_DISK = (
    "[enforce fail at inline_container.cc:626] . unexpected pos 1216 vs 1114\n"
    "Exception raised from writeRecord at ../caffe2/serialize/inline_container.cc:626"
)


def test_a_full_disk_inside_torch_save_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, train, capsys, monkeypatch
):
    run = tmp_path / "run"
    real_save = torch.save
    saves = []

    def save(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 5:  # iteration 3's agent_state.pt (two files per checkpoint)
            raise RuntimeError(TORCH_FULL_DISK)
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(state.torch, "save", save)
    capsys.readouterr()
    assert train(*RUN, "--iterations", "4", "--run-dir", str(run)) == 2
    err = capsys.readouterr().err
    last = run / "checkpoints" / "iter_000002"
    assert err.count("\n") == 1 and err.startswith("lmgym train: error: writing ")
    assert "agent_state.pt failed (is the disk full?): [enforce fail at inline_container" in err
    assert err.endswith(
        f"its last complete checkpoint is {last} (continue: lmgym train --resume {run})\n"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000001",
        "iter_000002",
        "latest",
    ]
    monkeypatch.undo()
    assert train("--resume", str(run), "--iterations", "3") == 0


def damage_safetensors_header(checkpoint):
    """Overwrite the JSON header of the policy's weights, then recompute both manifests,
    as a careless hand-edit would: the manifest check passes, the file is unreadable."""
    agent = checkpoint / "agent"
    weights = agent / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:24] = b"#" * 16  # inside the header's JSON
    weights.write_bytes(bytes(data))
    manifest.write_manifest(agent, None)
    manifest.write_manifest(checkpoint, ["trainer_state.pt", "agent/manifest.json"])
    return weights


def test_a_damaged_safetensors_header_is_one_line_naming_the_file(tmp_path, train, capsys):
    run = tmp_path / "run"
    assert train(*RUN, "--iterations", "1", "--run-dir", str(run)) == 0
    weights = damage_safetensors_header(run / "checkpoints" / "iter_000001")
    capsys.readouterr()

    assert train("--resume", str(run), "--iterations", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"checkpoint file {weights} is not a readable safetensors file" in err

    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"checkpoint file {weights} is not a readable safetensors file" in err


def hold_run_in_a_child(run) -> tuple[int, int]:
    """Fork a child that holds ``run``'s lock until it reads a byte; returns ``(pid, fd)``."""
    ready_read, ready_write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            lock = DirectoryLock(run, what="run directory").acquire()
            os.write(ready_write, b"1")
            os.read(go_read, 1)
            lock.release()
        finally:
            os._exit(0)
    assert os.read(ready_read, 1) == b"1"
    return pid, go_write


def test_deleting_the_lock_files_does_not_let_a_second_run_in(tmp_path, train, capsys):
    run = tmp_path / "run"
    assert train(*RUN, "--iterations", "1", "--run-dir", str(run)) == 0
    holder, release = hold_run_in_a_child(run)
    try:
        (run / PID_FILE).unlink()
        (run / LOCK_FILE).unlink(missing_ok=True)
        (run / "checkpoints" / f".iter_000002.tmp-{holder}").mkdir()  # its write in progress
        capsys.readouterr()
        assert train("--resume", str(run), "--iterations", "2") == 2
        assert capsys.readouterr().err == (
            f"lmgym train: error: run directory {run} is in use by another lmgym process (PID "
            "unknown); wait for it to finish or stop it, then try again\n"
        )
        assert (run / "checkpoints" / f".iter_000002.tmp-{holder}").is_dir()  # not cleaned
    finally:
        os.write(release, b"1")
        os.waitpid(holder, 0)
    assert train("--resume", str(run), "--iterations", "2") == 0


def test_a_lock_pid_file_that_is_a_directory_or_a_link_is_one_line(tmp_path, train, capsys):
    run = tmp_path / "run"
    assert train(*RUN, "--iterations", "1", "--run-dir", str(run)) == 0
    (run / PID_FILE).mkdir()
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 2
    assert capsys.readouterr().err == (
        f"lmgym train: error: {run / PID_FILE} is a directory, not the lock's PID file; "
        "remove it and try again\n"
    )
    (run / PID_FILE).rmdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (run / PID_FILE).symlink_to(target)
    assert train("--resume", str(run), "--iterations", "2") == 2
    assert "is a symbolic link, not the lock's PID file" in capsys.readouterr().err
    assert target.read_text() == "keep me"
    (run / PID_FILE).unlink()
    (run / LOCK_FILE).unlink(missing_ok=True)
    (run / LOCK_FILE).mkdir()  # the old lock file's name: no longer opened
    assert train("--resume", str(run), "--iterations", "2") == 0


def test_a_killed_holder_leaves_the_directory_free(tmp_path):
    holder, _ = hold_run_in_a_child(tmp_path)
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    with DirectoryLock(tmp_path) as lock:
        assert lock.held
