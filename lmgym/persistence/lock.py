"""An exclusive lock on a directory for the life of a process's work in it (``filelock``).

``DirectoryLock(run_dir).acquire()`` takes an OS file lock (``flock``) on
``run_dir/.lmgym.lock`` without waiting and writes the holder's PID to
``.lmgym.lock.pid`` beside it (the lock file itself is truncated by every
process that tries it, so the PID cannot live there). A second process, or a
second lock in the same process, gets ``DirectoryLockedError`` naming that PID.
The OS drops the lock when its holder exits, however it exits (``kill -9``
included), so a stale ``.pid`` file never blocks anyone.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

LOCK_FILE = ".lmgym.lock"
PID_FILE = ".lmgym.lock.pid"
LOCK_FILES = (LOCK_FILE, PID_FILE)
"""The names a lock leaves in its directory (a directory holding only these is empty)."""


class DirectoryLockedError(RuntimeError):
    """Another process (or another lock in this one) holds the directory."""


class DirectoryLock:
    """The exclusive lock on ``directory`` (which must exist).

    Args:
        directory: the directory to lock, e.g. a run directory.
        what: what the directory is, for the error message.
    """

    def __init__(self, directory: str | Path, what: str = "directory") -> None:
        self.directory = Path(directory)
        self.what = what
        self._lock = FileLock(str(self.directory / LOCK_FILE), timeout=0)
        self.held = False

    def holder(self) -> str:
        """The PID written by the current holder, or ``"unknown"``."""
        try:
            text = (self.directory / PID_FILE).read_text().strip()
        except OSError:
            return "unknown"
        return text if text.isdigit() else "unknown"

    def acquire(self) -> DirectoryLock:
        """Take the lock now or raise.

        Raises:
            DirectoryLockedError: it is held; the message names the holder's PID.
        """
        try:
            self._lock.acquire()
        except Timeout:
            raise DirectoryLockedError(
                f"{self.what} {self.directory} is in use by another lmgym process (PID "
                f"{self.holder()}); wait for it to finish or stop it, then try again"
            ) from None
        self.held = True
        (self.directory / PID_FILE).write_text(f"{os.getpid()}\n")
        return self

    def release(self) -> None:
        """Give the lock back (a no-op when not held)."""
        if not self.held:
            return
        (self.directory / PID_FILE).unlink(missing_ok=True)
        self._lock.release()
        self.held = False

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
