"""One process per run directory; --overwrite only replaces runs; failed starts leave nothing."""

from __future__ import annotations

import os
import signal

import pytest
from testkit import refused_line

from lmgym.persistence import DirectoryLock, DirectoryLockedError, recover_leftovers
from lmgym.training import TrainConfig, Trainer

QUIET = {"no_progress": True, "log_interval": 0, "sample_every": 0, "eval_prompts": 2}


def hold_lock_in_a_child(directory) -> int:
    """Fork a child that takes the directory's lock and waits; returns its PID once it holds it."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_read)
            lock = DirectoryLock(directory).acquire()  # kept: a collected lock is released
            os.write(ready_write, b"1")
            signal.pause()  # until the test kills it
            del lock
        finally:
            os._exit(0)
    os.close(ready_write)
    assert os.read(ready_read, 1) == b"1"
    os.close(ready_read)
    return pid


def test_a_second_process_cannot_train_in_a_locked_run(tmp_path, train, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run)) == 0
    progress = (run / "progress.csv").read_bytes()
    holder = hold_lock_in_a_child(run)
    try:
        assert refused_line(train, capsys, "--resume", str(run), "--iterations", "3") == (
            f"lmgym train: error: run directory {run} is in use by another lmgym process (PID "
            f"{holder}); wait for it to finish or stop it, then try again"
        )
        assert train("--iterations", "1", "--run-dir", str(run), "--overwrite") == 2
        assert f"(PID {holder})" in capsys.readouterr().err
        assert (run / "progress.csv").read_bytes() == progress
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    # Killed with the lock held: the OS dropped it, and the stale PID file is no obstacle.
    assert (run / ".lmgym.lock.pid").read_text().strip() == str(holder)
    assert train("--resume", str(run), "--iterations", "3") == 0


def test_a_second_trainer_in_the_same_process_is_refused(tmp_path):
    run = tmp_path / "run"
    config = TrainConfig(iterations=1, run_dir=str(run), eval_samples=2, **QUIET)
    Trainer(config, out=lambda line: None).run()
    seen = []

    def try_a_second_resume(agent, metrics):
        with pytest.raises(DirectoryLockedError, match=rf"\(PID {os.getpid()}\)") as info:
            Trainer.resume(run, changes={"iterations": 3}, out=lambda line: None).run()
        seen.append(str(info.value))

    Trainer.resume(
        run, changes={"iterations": 2}, callbacks=[try_a_second_resume], out=lambda line: None
    ).run()
    assert len(seen) == 1
    assert not (run / ".lmgym.lock.pid").exists()  # released at the end of run()


def test_overwrite_never_replaces_a_file(tmp_path, train, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    assert refused_line(train, capsys, "--run-dir", str(notes), "--overwrite") == (
        f"lmgym train: error: run directory {notes} is a file, not a directory; pick another "
        "path (--overwrite only replaces an lmgym run directory)"
    )
    assert notes.read_text() == "keep me"


def test_a_failed_start_leaves_no_run_directory(tmp_path, train, capsys):
    run = tmp_path / "runs" / "new"
    missing = tmp_path / "no-such-model"
    assert refused_line(train, capsys, "--model", str(missing), "--run-dir", str(run)) == (
        f"lmgym train: error: --model {missing}: no such directory (pass a directory written by "
        "save_pretrained, or a hub name such as gpt2)"
    )
    assert not (tmp_path / "runs").exists()
    assert train("--env", "bogus=1", "--run-dir", str(run)) == 2
    assert not (tmp_path / "runs").exists()


def test_a_symlinked_run_directory_is_refused(tmp_path, train, capsys):
    real = tmp_path / "real"
    assert train("--iterations", "1", "--run-dir", str(real)) == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    assert refused_line(train, capsys, "--resume", str(link), "--iterations", "2") == (
        f"lmgym train: error: run directory {link} is a symbolic link (to {real}); lmgym does "
        "not follow links for run directories: pass the real directory"
    )
    assert train("--run-dir", str(link), "--overwrite", "--iterations", "1") == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert len(list((real / "checkpoints").glob("iter_*"))) == 1  # untouched


# Leftovers carry the PID of their writer and are cleaned only once it is gone; 4194305
# is above Linux's largest PID, so no process can have it.
def test_leftovers_of_crashed_writes_are_cleaned_on_the_next_start(tmp_path, train, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "1", "--run-dir", str(run)) == 0
    checkpoints = run / "checkpoints"
    (checkpoints / ".iter_000002.tmp-4194305").mkdir()
    (checkpoints / ".iter_000002.tmp-4194305" / "trainer_state.pt").write_bytes(b"half")
    (checkpoints / ".latest.tmp-4194305").write_text("iter_0")
    (run / ".progress.csv.tmp-4194305").write_text("reward_mean\n")
    (run / "abandoned").mkdir()
    (run / "abandoned" / ".001-after-iter_000001.tmp-4194305").mkdir()
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 0
    out = capsys.readouterr().out
    assert "cleaned up after a crashed writer: removed .iter_000002.tmp-4194305" in out
    assert not list(run.rglob("*.tmp-*"))


def test_recover_leftovers_puts_back_a_directory_moved_aside(tmp_path):
    (tmp_path / ".iter_000003.old-4194305").mkdir()  # crash between the two renames
    (tmp_path / ".iter_000003.old-4194305" / "manifest.json").write_text("{}")
    (tmp_path / "iter_000004").mkdir()
    (tmp_path / ".iter_000004.old-4194305").mkdir()  # crash after both renames
    (tmp_path / ".iter_000005.tmp-4194305").mkdir()
    assert recover_leftovers(tmp_path) == [
        "restored iter_000003 from .iter_000003.old-4194305",
        "removed .iter_000004.old-4194305",
        "removed .iter_000005.tmp-4194305",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000003", "iter_000004"]
    assert (tmp_path / "iter_000003" / "manifest.json").read_text() == "{}"


def test_a_run_killed_before_its_first_checkpoint_says_how_to_restart(
    tmp_path, train, capsys, killed_at, same_history
):
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(whole)) == 0
    status, label = killed_at(1, lambda: train("--iterations", "2", "--run-dir", str(run)))
    assert (status, label) == (77, "write config.json")  # the directory exists, locked, empty
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 2
    assert "is not an lmgym run directory" in capsys.readouterr().err
    assert train("--iterations", "2", "--run-dir", str(run)) == 2  # exists: needs --overwrite

    # Killed while writing its first row (points: config.json x3, progress.csv created x3,
    # the start evaluation appended to eval.jsonl x2).
    status, label = killed_at(
        9, lambda: train("--iterations", "2", "--run-dir", str(run), "--overwrite")
    )
    assert (status, label) == (77, "write progress.csv")
    assert not (run / "checkpoints").exists()
    assert refused_line(train, capsys, "--resume", str(run), "--iterations", "2") == (
        f"lmgym train: error: run directory {run} has no checkpoint to resume from (it stopped "
        f"before its first one); start it again with --run-dir {run} --overwrite"
    )
    assert train("--iterations", "2", "--run-dir", str(run), "--overwrite") == 0
    same_history(run, whole)
