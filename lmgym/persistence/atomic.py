"""Writes that are all-or-nothing: files and directories renamed into place, appended lines.

Every durable write lmgym makes goes through one of these helpers:

- ``atomic_directory(path)``: build a directory under a temporary name, write its
  ``manifest.json`` last, rename it into place (replacing an older one). Agent
  saves and training checkpoints both use it.
- ``atomic_write_text(path, text)``: a temporary file, fsync'ed, then renamed over
  ``path``; a reader sees the old content or the new, never a mix.
- ``append_line(path, line)``: one line appended and flushed; a crash can leave
  at most a last line without its newline, which readers drop
  (``complete_lines``).

``recover_leftovers`` cleans what a crash between those steps leaves behind
(``.NAME.tmp-PID`` directories and files; a ``.NAME.old-PID`` directory is put
back if its replacement never arrived). Call it only while holding the
directory's lock (``DirectoryLock``); even then it touches only the leftovers of
processes that are no longer running, never another live process's files.

``write_point(label)`` is called between the steps. It does nothing; the tests
in ``tests/reliability`` replace it to kill the process, or raise ``ENOSPC``,
exactly there.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lmgym.persistence.manifest import fsync_path, write_manifest

_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)")


def write_point(label: str) -> None:
    """A named point between two durable writes (a no-op; a seam for fault-injection tests)."""


def _tmp_name(path: Path, kind: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}")


def _running(pid: int) -> bool:
    """Whether another process with this PID is running now (this process counts as not)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    except (OverflowError, OSError):
        return False  # not a PID this system can have
    return True


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Replace ``path``'s content with ``text`` atomically (temporary file, fsync, rename).

    Returns:
        ``path``.
    """
    path = Path(path)
    tmp = _tmp_name(path)
    write_point(f"write {path.name}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        write_point(f"rename {path.name}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    write_point(f"wrote {path.name}")
    return path


def append_line(path: str | Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` and flush it to the OS."""
    path = Path(path)
    write_point(f"append {path.name}")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    write_point(f"appended {path.name}")


def complete_lines(path: str | Path) -> list[str]:
    """The lines of ``path`` that end with a newline (a crash mid-append leaves the last
    one without); ``[]`` when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1]  # the part after the last newline is empty or an unfinished line


def replace_directory(tmp: Path, final: Path) -> None:
    """Rename the finished directory ``tmp`` to ``final``, replacing what is there.

    An existing ``final`` is first renamed to ``.NAME.old-PID`` and deleted after the
    new one is in place; a crash between the two renames leaves the old one under
    that name, and ``recover_leftovers`` puts it back.
    """
    if final.exists():
        old = _tmp_name(final, "old")
        final.rename(old)
        write_point(f"moved aside {final.name}")
        tmp.rename(final)
        write_point(f"renamed {final.name}")
        shutil.rmtree(old)
    else:
        tmp.rename(final)
        write_point(f"renamed {final.name}")
    fsync_path(final.parent)


@contextmanager
def atomic_directory(path: str | Path, manifest: Iterable[str] | None = None) -> Iterator[Path]:
    """Write a directory all-or-nothing: ``with atomic_directory(p) as tmp: <write into tmp>``.

    The body writes into a fresh temporary sibling ``.NAME.tmp-PID``; on a normal
    exit its ``manifest.json`` is written (size and SHA-256 of ``manifest`` or of
    every file, each fsync'ed) and it is renamed to ``path``, replacing an older
    directory there. If the body or the manifest raises, the temporary directory
    is removed and ``path`` is untouched.

    Args:
        path: the final directory.
        manifest: the files the manifest lists (relative, ``/``-separated);
            default every file written.

    Yields:
        The temporary directory to write into.

    Raises:
        FileExistsError: ``path`` is a file or a symbolic link: only a directory
            is replaced (nothing is written).
    """
    final = Path(path)
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        kind = "a symbolic link" if final.is_symlink() else "a file"
        raise FileExistsError(
            f"{final} is {kind}, not a directory; save to a new path or to a directory "
            "written before (only those are replaced)"
        )
    tmp = _tmp_name(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        write_point(f"started {final.name}")
        yield tmp
        write_point(f"manifest {final.name}")
        write_manifest(tmp, manifest)
        write_point(f"complete {final.name}")
        replace_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_leftovers(directory: str | Path) -> list[str]:
    """Clean up after writers that crashed in ``directory`` (not recursive).

    ``.NAME.tmp-PID`` files and directories are deleted (their content never made
    it into place); a ``.NAME.old-PID`` directory is renamed back to ``NAME`` when
    ``NAME`` is missing (the crash came between the two renames of
    ``replace_directory``) and deleted otherwise. A leftover whose PID is a running
    process other than this one is left alone: it may be that process's write.

    Returns:
        What was done, one line per leftover, e.g. ``"removed .iter_000004.tmp-123"``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    done = []
    for entry in sorted(directory.iterdir()):
        match = _LEFTOVER.fullmatch(entry.name)
        if match is None or _running(int(match["pid"])):
            continue
        final = directory / match["name"]
        if match["kind"] == "old" and entry.is_dir() and not final.exists():
            entry.rename(final)
            done.append(f"restored {final.name} from {entry.name}")
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        done.append(f"removed {entry.name}")
    return done
