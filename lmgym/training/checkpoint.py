"""Checkpoints of a training run: atomic, verified, pruned.

One checkpoint is a directory ``checkpoints/iter_000050/``::

    agent/               Agent.save: policy/ (safetensors via save_pretrained, tokenizer),
                         agent_state.pt (optimizer, sampler/shuffle RNG, env prompt stream,
                         counters), agent_config.json, manifest.json
    trainer_state.pt     torch/numpy/python global RNG, callback state (early-stop window, ...)
    manifest.json        size + SHA-256 of trainer_state.pt and agent/manifest.json

It is written under ``.iter_000050.tmp-<pid>`` and renamed into place after its
manifest, so a crash mid-write never leaves a directory under a final name; the
chained manifests (this one covers ``agent/manifest.json``, which covers every
agent file) let ``load`` detect a file truncated or changed afterwards and fail
with ``CheckpointError`` naming it. ``checkpoints/latest`` holds the newest
checkpoint's name (replaced atomically); older ones beyond ``keep`` are deleted.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmgym.agents.base import Agent
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.training.manifest import CheckpointError, verify_manifest, write_manifest

AGENT_DIR = "agent"
TRAINER_STATE = "trainer_state.pt"
LATEST = "latest"
_NAME = re.compile(r"iter_(\d+)")


def global_rng_state() -> dict[str, Any]:
    """The process-wide RNG states (torch CPU, numpy, python ``random``)."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``global_rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` looks like a checkpoint directory (has ``agent/`` or a manifest)."""
    path = Path(path)
    return (path / AGENT_DIR).is_dir() or (path / TRAINER_STATE).exists()


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
        """Checkpoint directories, oldest first (temporary ones excluded)."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if p.is_dir() and _NAME.fullmatch(p.name)]
        return sorted(found, key=lambda p: int(_NAME.fullmatch(p.name).group(1)))  # type: ignore[union-attr]

    def latest(self) -> Path | None:
        """The newest checkpoint: the one ``latest`` names, else the highest iteration."""
        pointer = self.directory / LATEST
        if pointer.is_file():
            named = self.directory / pointer.read_text().strip()
            if named.is_dir():
                return named
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, agent: Agent, trainer_state: dict[str, Any] | None = None) -> Path:
        """Write ``iter_<agent.iteration>`` atomically, point ``latest`` at it, prune.

        Args:
            agent: the agent to save (``Agent.save`` into ``agent/``).
            trainer_state: anything else the run needs to continue exactly
                (``torch.save``-able); the global RNG states are added.

        Returns:
            The checkpoint directory.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"iter_{agent.iteration:06d}"
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        agent.save(tmp / AGENT_DIR)
        state = {
            "iteration": agent.iteration,
            "rng": global_rng_state(),
            **(trainer_state or {}),
        }
        torch.save(state, tmp / TRAINER_STATE)
        write_manifest(tmp, [TRAINER_STATE, f"{AGENT_DIR}/manifest.json"])
        if final.exists():  # the same iteration saved again (e.g. at the end): replace it
            old = self.directory / f".{name}.old-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        pointer_tmp = self.directory / f".{LATEST}.tmp-{os.getpid()}"
        pointer_tmp.write_text(name + "\n")
        pointer_tmp.replace(self.directory / LATEST)
        self._prune(final)
        return final

    def _prune(self, newest: Path) -> None:
        if self.keep == 0:
            return
        found = [p for p in self.checkpoints() if p != newest]
        for old in found[: max(0, len(found) - (self.keep - 1))]:
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
    def load(
        path: str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        device: torch.device | str = "cpu",
    ) -> tuple[Agent, dict[str, Any]]:
        """Verify and load a checkpoint written by ``save``.

        Args:
            path: the checkpoint directory (``.../checkpoints/iter_000050``).
            env: the run's training env (its prompt stream is restored).
            ref_policy: the frozen reference, when the agent's ``beta > 0``.
            device: where to load the policy.

        Returns:
            ``(agent, trainer_state)``; the global RNG states are restored already.

        Raises:
            CheckpointError: a file is missing, truncated or altered.
        """
        from lmgym.agents import ALGORITHMS

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        verify_manifest(path)
        name = CheckpointManager.algorithm(path)
        if name not in ALGORITHMS:
            raise CheckpointError(f"checkpoint {path} holds an unknown algorithm {name!r}")
        agent = ALGORITHMS[name].load(path / AGENT_DIR, env, ref_policy, device=device)
        state = torch.load(path / TRAINER_STATE, weights_only=False)
        set_global_rng_state(state["rng"])
        return agent, state
