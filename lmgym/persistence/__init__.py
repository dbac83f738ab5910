"""Everything lmgym writes to disk and reads back: one place, one set of rules.

- ``manifest``: size + SHA-256 of every file, written last, verified first;
  entries stay inside their directory; unlisted files are refused.
- ``atomic``: ``atomic_directory`` (the one writer of agent saves and training
  checkpoints), ``atomic_write_text``, ``append_line``, ``recover_leftovers``.
- ``state``: non-weight state saved as tensors and plain data and loaded with
  ``torch.load(weights_only=True)``: nothing on disk is unpickled.
- ``agent``: the layout ``Agent.save`` writes and ``Agent.load`` reads.
- ``lock``: an exclusive, crash-safe lock on a directory (``flock`` on the
  directory itself, so deleting a file cannot defeat it).
- ``write_errors``: the errors libraries raise on a failed write (a full disk
  inside ``torch.save`` or safetensors) turned into ``OSError`` naming the file.

This package imports nothing from ``lmgym.training``, and from ``lmgym.agents`` only
``lmgym.agents.config.config_from_dict``, inside ``load_agent`` (when an agent is
loaded, so ``lmgym.agents`` is imported by then anyway; ``agents.config`` imports
nothing of this package). So both can use it without an import cycle: an agent
hands it ``state_dict()`` and takes back ``load_state_dict(...)``.
"""

from __future__ import annotations

from lmgym.persistence.agent import check_agent_dir, load_agent, save_agent, write_agent
from lmgym.persistence.atomic import (
    append_line,
    atomic_directory,
    atomic_write_text,
    complete_lines,
    recover_leftovers,
)
from lmgym.persistence.lock import DirectoryLock, DirectoryLockedError, LockFileError
from lmgym.persistence.manifest import CheckpointError, verify_manifest, write_manifest
from lmgym.persistence.state import (
    global_rng_state,
    load_state,
    save_state,
    set_global_rng_state,
)

__all__ = [
    "CheckpointError",
    "DirectoryLock",
    "DirectoryLockedError",
    "LockFileError",
    "append_line",
    "atomic_directory",
    "atomic_write_text",
    "check_agent_dir",
    "complete_lines",
    "global_rng_state",
    "load_agent",
    "load_state",
    "recover_leftovers",
    "save_agent",
    "save_state",
    "set_global_rng_state",
    "verify_manifest",
    "write_agent",
    "write_manifest",
]
