"""Checkpoints of a training run: atomic, verified, pruned.

One checkpoint is a directory ``checkpoints/iter_000050/``::

    agent/               Agent.save's layout (lmgym.persistence.agent): policy/
                         (safetensors via save_pretrained, tokenizer), agent_state.pt
                         (optimizer, sampler/shuffle RNG, env prompt stream, counters),
                         agent_config.json, manifest.json
    trainer_state.pt     torch/numpy/python global RNG, callback state (early-stop window, ...);
                         of an N-process run also ``world_size`` and ``ranks``: every
                         rank's sampler/shuffle/global RNG and prompt stream (rank_state),
                         and with data_parallel="fsdp" its optimizer shard
    manifest.json        size + SHA-256 of trainer_state.pt and agent/manifest.json

It is written with ``atomic_directory`` (under ``.iter_000050.tmp-<pid>``, renamed
into place after its manifest), so a crash mid-write never leaves a directory
under a final name; the chained manifests (this one covers
``agent/manifest.json``, which covers every agent file) let ``load`` detect a
file truncated, changed or added afterwards and fail with ``CheckpointError``
naming it. ``.pt`` files hold tensors and plain data only and are read with
``torch.load(weights_only=True)``. ``checkpoints/latest`` holds the newest
checkpoint's name, ``iter_NNNNNN`` and nothing else (replaced atomically); older
ones beyond ``keep`` are deleted.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from lmgym.agents.base import Agent
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.persistence import atomic
from lmgym.persistence.agent import check_agent_dir, load_agent, write_agent
from lmgym.persistence.atomic import atomic_directory, atomic_write_text
from lmgym.persistence.manifest import CheckpointError, verify_manifest
from lmgym.persistence.state import (
    global_rng_state,
    load_state,
    save_state,
    set_global_rng_state,
)
from lmgym.policy.causal_lm import CausalLMPolicy

AGENT_DIR = "agent"
TRAINER_STATE = "trainer_state.pt"
LATEST = "latest"
_NAME = re.compile(r"iter_(\d+)")

__all__ = [
    "AGENT_DIR",
    "LATEST",
    "TRAINER_STATE",
    "CheckpointManager",
    "checkpoint_iteration",
    "global_rng_state",
    "is_checkpoint",
    "set_global_rng_state",
]


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` looks like a checkpoint directory (has ``agent/`` or a trainer state)."""
    path = Path(path)
    return (path / AGENT_DIR).is_dir() or (path / TRAINER_STATE).exists()


def checkpoint_iteration(name: str) -> int | None:
    """The iteration of a checkpoint named ``iter_NNNNNN``, else ``None``."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


class CheckpointManager:
    """Writes, finds and loads the checkpoints under one directory.

    Args:
        directory: usually ``<run>/checkpoints``; created on the first save.
        keep: how many of the newest checkpoints to keep (0 keeps all).
    """

    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        if keep < 0:
            raise ValueError(f"keep={keep}: must be >= 0 (0 keeps all)")
        self.directory = Path(directory)
        self.keep = keep

    def checkpoints(self) -> list[Path]:
        """Checkpoint directories, oldest first (temporary ones and symbolic links excluded)."""
        if not self.directory.is_dir():
            return []
        found = [
            p
            for p in self.directory.iterdir()
            if p.is_dir() and not p.is_symlink() and checkpoint_iteration(p.name) is not None
        ]
        return sorted(found, key=lambda p: checkpoint_iteration(p.name))  # type: ignore[arg-type,return-value]

    def latest(self) -> Path | None:
        """The newest checkpoint: the one ``latest`` names, else the highest iteration.

        Raises:
            CheckpointError: ``latest`` holds anything but a checkpoint name
                (``iter_NNNNNN``): a path, ``..``, another run.
        """
        pointer = self.directory / LATEST
        if pointer.is_file():
            name = pointer.read_text().strip()
            if checkpoint_iteration(name) is None:
                raise CheckpointError(
                    f"{pointer} holds {name[:100]!r}, not a checkpoint name of this run "
                    "(iter_NNNNNN); refusing to follow it. Pass a checkpoint to --resume, or "
                    "delete the file to use the newest checkpoint"
                )
            named = self.directory / name
            if named.is_dir() and not named.is_symlink():
                return named
        found = self.checkpoints()
        return found[-1] if found else None

    def point_latest_at(self, checkpoint: Path) -> None:
        """Make ``latest`` name ``checkpoint`` (atomically)."""
        atomic_write_text(self.directory / LATEST, checkpoint.name + "\n")

    def save(self, agent: Agent, trainer_state: dict[str, Any] | None = None) -> Path:
        """Write ``iter_<agent.iteration>`` atomically, point ``latest`` at it, prune.

        Args:
            agent: the agent to save (``Agent.save``'s layout, into ``agent/``).
            trainer_state: anything else the run needs to continue exactly
                (tensors and plain data); the global RNG states are added.

        Returns:
            The checkpoint directory.

        Raises:
            TypeError: ``trainer_state`` holds another kind of object (named).
            OSError: the disk is full (or another write error); the checkpoint is
                then not written, and the earlier ones and ``latest`` are untouched.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"iter_{agent.iteration:06d}"
        state = {"iteration": agent.iteration, "rng": global_rng_state(), **(trainer_state or {})}
        with atomic_directory(final, manifest=[TRAINER_STATE, f"{AGENT_DIR}/manifest.json"]) as tmp:
            write_agent(agent, tmp / AGENT_DIR)
            atomic.write_point(f"saved {AGENT_DIR}")
            save_state(state, tmp / TRAINER_STATE, name="trainer state")
        self.point_latest_at(final)
        self._prune(final)
        return final

    def _prune(self, newest: Path) -> None:
        if self.keep == 0:
            return
        found = [p for p in self.checkpoints() if p != newest]
        for old in found[: max(0, len(found) - (self.keep - 1))]:
            atomic.write_point(f"prune {old.name}")
            shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def algorithm(path: str | Path) -> str:
        """The algorithm name a checkpoint holds (read from its agent config)."""
        config = Path(path) / AGENT_DIR / "agent_config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"{path} is not an lmgym training checkpoint: {AGENT_DIR}/agent_config.json "
                "is missing"
            )
        return json.loads(config.read_text())["algorithm"]

    @staticmethod
    def verify(path: str | Path) -> None:
        """Check a checkpoint before anything in it is read: both manifests, no
        unlisted, escaping or pickle-based file.

        Raises:
            FileNotFoundError: ``path`` is not a checkpoint.
            CheckpointError: a file is missing, truncated, altered, added or unsafe.
        """
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        verify_manifest(path)
        check_agent_dir(path / AGENT_DIR)

    @staticmethod
    def world_size(path: str | Path) -> int:
        """The number of data-parallel processes that wrote the checkpoint (1: one process)."""
        return int(load_state(Path(path) / TRAINER_STATE).get("world_size", 1))

    @staticmethod
    def check_world_size(path: str | Path, world_size: int) -> None:
        """Refuse to resume ``path`` with another number of processes than wrote it.

        Raises:
            CheckpointError: one line naming both sizes and how to launch.
        """
        saved = CheckpointManager.world_size(path)
        if saved != world_size:
            raise CheckpointError(
                f"checkpoint {path} was written by a run of {saved} process(es) (world size "
                f"{saved}) and this run has {world_size}; each rank restores its own prompt "
                f"stream and RNG, so resume with the same world size: lmgym train "
                f"--nproc-per-node {saved} --resume ... (or torchrun --nproc-per-node {saved})"
            )

    @staticmethod
    def load(
        path: str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        device: torch.device | str = "cpu",
        *,
        verified: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> tuple[Agent, dict[str, Any]]:
        """Verify and load a checkpoint written by ``save``.

        Args:
            path: the checkpoint directory (``.../checkpoints/iter_000050``).
            env: the run's training env (its prompt stream is restored).
            ref_policy: the frozen reference, when the agent's ``beta > 0``.
            device: where to load the policy.
            verified: ``verify(path)`` was just called (skip hashing again).
            rank, world_size: this process in a data-parallel run: it restores its
                own rank's state (``env`` must be that rank's shard).

        Returns:
            ``(agent, trainer_state)``; the global RNG states are restored already.

        Raises:
            CheckpointError: a file is missing, truncated, altered, added or unsafe.
        """
        from lmgym.agents import ALGORITHMS

        path = Path(path)
        if not verified:
            CheckpointManager.verify(path)
        name = CheckpointManager.algorithm(path)
        if name not in ALGORITHMS:
            raise CheckpointError(f"checkpoint {path} holds an unknown algorithm {name!r}")
        CheckpointManager.check_world_size(path, world_size)
        state = load_state(path / TRAINER_STATE)
        own = state["ranks"][rank] if world_size > 1 else None
        agent = load_agent(
            ALGORITHMS[name],
            path / AGENT_DIR,
            env,
            ref_policy,
            device,
            verified=True,
            rank_state=own,
        )
        set_global_rng_state(own["rng"] if own is not None else state["rng"])
        return agent, state
