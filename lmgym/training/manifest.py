"""Moved to ``lmgym.persistence.manifest``; this name keeps old imports working."""

from __future__ import annotations

from lmgym.persistence.manifest import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    CheckpointError,
    file_sha256,
    verify_manifest,
    write_manifest,
)

__all__ = [
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "CheckpointError",
    "file_sha256",
    "verify_manifest",
    "write_manifest",
]
