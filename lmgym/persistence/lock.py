"""An exclusive lock on a directory for the life of a process's work in it.

``DirectoryLock(run_dir).acquire()`` takes an OS file lock (``flock``) on the
directory itself, through a descriptor opened on it, without waiting, and writes
the holder's PID to ``.lmgym.lock.pid`` inside it. A second process, or a second
lock in the same process, gets ``DirectoryLockedError`` naming that PID.

Locking the directory rather than a file in it is what makes the lock hold: a
lock file can be deleted while its holder runs, and the next process would then
lock a fresh file of the same name and take the directory too. The directory
cannot be replaced under its holder without removing everything in it. The OS
drops the lock when its holder exits, however it exits (``kill -9`` included),
so a stale ``.pid`` file never blocks anyone. POSIX only (``fcntl``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_FILE = ".lmgym.lock"
"""The lock file of earlier versions (they locked it instead of the directory)."""
PID_FILE = ".lmgym.lock.pid"
LOCK_FILES = (LOCK_FILE, PID_FILE)
"""The names a lock leaves in its directory (a directory holding only these is empty)."""


class DirectoryLockedError(RuntimeError):
    """Another process (or another lock in this one) holds the directory."""


class LockFileError(ValueError):
    """The holder's PID file cannot be written: a directory or a link is in its place."""


class DirectoryLock:
    """The exclusive lock on ``directory`` (which must exist).

    Args:
        directory: the directory to lock, e.g. a run directory.
        what: what the directory is, for the error message.
    """

    def __init__(self, directory: str | Path, what: str = "directory") -> None:
        self.directory = Path(directory)
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def holder(self) -> str:
        """The PID written by the current holder, or ``"unknown"``."""
        try:
            fd = os.open(self.directory / PID_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return "unknown"
        with os.fdopen(fd) as handle:
            try:
                text = handle.read(32).strip()
            except (OSError, UnicodeDecodeError):
                return "unknown"
        return text if text.isdigit() else "unknown"

    def acquire(self) -> DirectoryLock:
        """Take the lock now or raise.

        Raises:
            DirectoryLockedError: it is held; the message names the holder's PID.
            LockFileError: ``.lmgym.lock.pid`` is a directory or a symbolic link.
        """
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryLockedError(
                f"{self.what} {self.directory} is in use by another lmgym process (PID "
                f"{self.holder()}); wait for it to finish or stop it, then try again"
            ) from None
        try:
            self._write_pid()
        except BaseException:
            os.close(fd)  # closing the descriptor drops the lock
            raise
        self._fd = fd
        return self

    def _write_pid(self) -> None:
        path = self.directory / PID_FILE
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR):
                raise
            kind = "a symbolic link" if path.is_symlink() else "a directory"
            raise LockFileError(
                f"{path} is {kind}, not the lock's PID file; remove it and try again"
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{os.getpid()}\n")

    def release(self) -> None:
        """Give the lock back (a no-op when not held)."""
        if self._fd is None:
            return
        path = self.directory / PID_FILE
        if not path.is_symlink() and path.is_file():
            path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
