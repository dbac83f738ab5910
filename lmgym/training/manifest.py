"""Checkpoint manifests: every file's size and SHA-256, written last, verified first.

A checkpoint directory is written under a temporary name and renamed into place
only after ``manifest.json`` is on disk, so a crash mid-write never leaves a
directory under the final name. The manifest also catches what renaming cannot:
a file truncated or altered afterwards (a full disk, a partial copy, a bad
sync). ``verify_manifest`` checks sizes first (cheap) and then hashes, and raises
``CheckpointError`` naming every bad file, so such a checkpoint fails to load with
a clear message instead of loading garbage.

This module is a leaf (standard library only): ``lmgym.agents.base`` uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "lmgym-checkpoint-manifest/1"
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint on disk is incomplete or corrupted (or not a checkpoint at all)."""


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
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
        path = directory / name
        _fsync(path)
        entries[name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = directory / MANIFEST_FILE
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": entries}, indent=2))
    _fsync(manifest)
    for sub in {(directory / name).parent for name in entries} | {directory}:
        _fsync(sub)
    return manifest


def verify_manifest(directory: str | Path) -> dict[str, dict[str, int | str]]:
    """Check every file ``manifest.json`` lists: present, right size, right SHA-256.

    Args:
        directory: a checkpoint directory holding ``manifest.json``.

    Returns:
        The manifest's ``files`` entries (``{relative path: {"size", "sha256"}}``).

    Raises:
        CheckpointError: the manifest is missing or unreadable, or some file is
            missing, has the wrong size or the wrong hash; the message lists them
            all, e.g. ``checkpoint runs/x/checkpoints/iter_000004 is incomplete or
            corrupted: file agent/policy/model.safetensors has 100 bytes, expected
            425184``.
    """
    directory = Path(directory)
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: {MANIFEST_FILE} is missing "
            "(a checkpoint is renamed into place only after its manifest is written)"
        )
    try:
        data = json.loads(manifest.read_text())
        entries = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(entries, dict):
            raise KeyError("format")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: {MANIFEST_FILE} is not a "
            f"readable {MANIFEST_FORMAT} manifest ({type(exc).__name__}: {exc})"
        ) from None
    problems = []
    for name, entry in entries.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"file {name} is missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"file {name} has {size} bytes, expected {entry['size']}")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"file {name} has the right size but the wrong SHA-256")
    if problems:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete or corrupted: "
            + "; ".join(problems)
            + ". Resume from an earlier checkpoint or retrain"
        )
    return entries
