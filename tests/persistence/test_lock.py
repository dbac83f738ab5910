"""``DirectoryLock`` locks the directory itself: its files are only a note of the holder."""

from __future__ import annotations

import os

import pytest

from lmgym.persistence import DirectoryLock, DirectoryLockedError, LockFileError
from lmgym.persistence.lock import LOCK_FILE, PID_FILE


def test_a_second_lock_is_refused_even_after_the_lock_files_are_deleted(tmp_path):
    with DirectoryLock(tmp_path, what="run directory"):
        assert (tmp_path / PID_FILE).read_text() == f"{os.getpid()}\n"
        (tmp_path / PID_FILE).unlink()
        with pytest.raises(
            DirectoryLockedError, match=r"in use by another lmgym process \(PID unknown\)"
        ):
            DirectoryLock(tmp_path).acquire()
    assert not (tmp_path / PID_FILE).exists()
    with DirectoryLock(tmp_path) as again:  # released: free for the next
        assert again.held
    assert not again.held


def test_a_refused_lock_names_the_holder(tmp_path):
    held = DirectoryLock(tmp_path)
    with held, pytest.raises(DirectoryLockedError, match=rf"\(PID {os.getpid()}\)"):
        DirectoryLock(tmp_path, what="run directory").acquire()


@pytest.mark.parametrize("kind", ["directory", "symbolic link"])
def test_a_pid_file_that_is_not_a_file_is_refused_and_the_lock_dropped(tmp_path, kind):
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    locked = tmp_path / "run"
    locked.mkdir()
    if kind == "directory":
        (locked / PID_FILE).mkdir()
    else:
        (locked / PID_FILE).symlink_to(target)
    with pytest.raises(LockFileError) as info:
        DirectoryLock(locked).acquire()
    assert str(info.value) == (
        f"{locked / PID_FILE} is a {kind}, not the lock's PID file; remove it and try again"
    )
    assert target.read_text() == "keep me"
    if kind == "directory":
        (locked / PID_FILE).rmdir()
    else:
        (locked / PID_FILE).unlink()
    DirectoryLock(locked).acquire().release()  # the failed attempt kept no lock


def test_an_old_lock_file_of_any_kind_is_ignored(tmp_path):
    (tmp_path / LOCK_FILE).mkdir()
    with DirectoryLock(tmp_path) as lock:
        assert lock.held
