"""Checkpoint manifests: every file's size and SHA-256, written last, verified first.

A checkpoint directory is written under a temporary name and renamed into place
only after ``manifest.json`` is on disk (``atomic_directory``), so a crash
mid-write never leaves a directory under the final name. The manifest also
catches what renaming cannot: a file truncated or altered afterwards (a full
disk, a partial copy, a bad sync). ``verify_manifest`` checks sizes first (cheap)
and then hashes, and raises ``CheckpointError`` naming every bad file, so such a
checkpoint fails to load with a clear message instead of loading garbage.

The manifest is an integrity check, not a signature: anyone who can write the
directory can recompute it. What keeps a hostile checkpoint from running code
is that nothing in it is unpickled (``lmgym.persistence.state``). What keeps it
from reaching outside its directory is checked here: an entry must be a plain
relative path inside the directory (no absolute path, no ``..``, no symbolic
link), and a file the manifest does not list is refused, so everything a load
reads has been verified first.

This module is a leaf (standard library only).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "lmgym-checkpoint-manifest/1"
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint on disk is incomplete, corrupted, unsafe, or not a checkpoint at all."""


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file (or directory) to stable storage; a no-op where the OS refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_safe_relative(name: str) -> bool:
    """Whether ``name`` is a non-empty ``/``-separated path that stays inside its directory
    (not absolute, no ``..``, no ``.``, no backslash, no drive)."""
    if not isinstance(name, str) or not name or "\\" in name or ":" in name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def write_manifest(directory: str | Path, files: Iterable[str] | None = None) -> Path:
    """Hash ``files`` (default: every file under ``directory``) into ``manifest.json``.

    Each file is fsync'ed before it is hashed, and the manifest after it is
    written, so that once the caller renames ``directory`` into place the
    checkpoint is on disk in full.

    Args:
        directory: the checkpoint directory (still under its temporary name).
        files: paths relative to ``directory``, ``/``-separated; default every
            regular file below it except the manifest itself.

    Returns:
        The manifest's path.

    Raises:
        ValueError: a name in ``files`` is not a plain relative path inside ``directory``.
    """
    directory = Path(directory)
    if files is None:
        files = sorted(
            p.relative_to(directory).as_posix()
            for p in directory.rglob("*")
            if p.is_file() and p.relative_to(directory).as_posix() != MANIFEST_FILE
        )
    entries = {}
    for name in files:
        if not is_safe_relative(name):
            raise ValueError(f"write_manifest: {name!r} is not a relative path inside {directory}")
        path = directory / name
        fsync_path(path)
        entries[name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = directory / MANIFEST_FILE
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": entries}, indent=2))
    fsync_path(manifest)
    for sub in {(directory / name).parent for name in entries} | {directory}:
        fsync_path(sub)
    return manifest


def _read_entries(directory: Path) -> dict[str, dict[str, int | str]]:
    manifest = directory / MANIFEST_FILE
    if manifest.is_symlink() or not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: {MANIFEST_FILE} is missing "
            "(a checkpoint is renamed into place only after its manifest is written)"
        )
    try:
        data = json.loads(manifest.read_text())
        entries = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(entries, dict):
            raise KeyError("format")
        for entry in entries.values():
            if not isinstance(entry["size"], int) or not isinstance(entry["sha256"], str):
                raise TypeError("an entry's size or sha256 has the wrong type")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: {MANIFEST_FILE} is not a "
            f"readable {MANIFEST_FORMAT} manifest ({type(exc).__name__}: {exc})"
        ) from None
    escaping = [name for name in entries if not is_safe_relative(name)]
    if escaping:
        raise CheckpointError(
            f"checkpoint {directory} is refused: {MANIFEST_FILE} lists "
            f"{', '.join(map(repr, escaping))}, outside the checkpoint (entries must be "
            "relative paths without '..')"
        )
    return entries


def _unlisted(directory: Path, entries: dict[str, dict[str, int | str]]) -> list[str]:
    """Files under ``directory`` that no manifest covers; a subdirectory whose own
    ``manifest.json`` is listed is covered by that manifest (checked on its own)."""
    nested = {
        PurePosixPath(name).parent.as_posix()
        for name in entries
        if PurePosixPath(name).name == MANIFEST_FILE and "/" in name
    }
    out = []
    for path in sorted(directory.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        name = path.relative_to(directory).as_posix()
        if name == MANIFEST_FILE or name in entries:
            continue
        if any(name.startswith(prefix + "/") for prefix in nested):
            continue
        out.append(name)
    return out


def verify_manifest(directory: str | Path) -> dict[str, dict[str, int | str]]:
    """Check every file ``manifest.json`` lists: present, a regular file inside the
    directory, right size, right SHA-256; and that no file is left unlisted.

    Args:
        directory: a checkpoint directory holding ``manifest.json``.

    Returns:
        The manifest's ``files`` entries (``{relative path: {"size", "sha256"}}``).

    Raises:
        CheckpointError: the manifest is missing or unreadable, an entry points
            outside the directory, some file is missing, a symbolic link, unlisted,
            or has the wrong size or hash; the message lists them all, e.g.
            ``checkpoint runs/x/checkpoints/iter_000004 is incomplete or corrupted:
            file agent/policy/model.safetensors has 100 bytes, expected 425184``.
    """
    directory = Path(directory)
    entries = _read_entries(directory)
    problems = []
    for name, entry in entries.items():
        path = directory / name
        if path.is_symlink() or any(p.is_symlink() for p in path.parents if directory in p.parents):
            problems.append(f"file {name} is a symbolic link (refused)")
            continue
        if not path.is_file():
            problems.append(f"file {name} is missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"file {name} has {size} bytes, expected {entry['size']}")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"file {name} has the right size but the wrong SHA-256")
    problems += [f"file {name} is not in {MANIFEST_FILE}" for name in _unlisted(directory, entries)]
    if problems:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: "
            + "; ".join(problems)
            + ". Resume from an earlier checkpoint or retrain"
        )
    return entries
