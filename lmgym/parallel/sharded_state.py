"""The optimizer state of a ``data_parallel="fsdp"`` checkpoint: one rank's shard, never loaded.

Rank 0 alone writes checkpoints; under FSDP the optimizer state it holds is its own
shard. ``ShardedUpdate`` stores it marked ``"fsdp_shard"``; every optimizer refuses a
marked state (a shard loaded as the whole state would train with the wrong moments).
"""

from __future__ import annotations

from typing import Any

import torch

MARKER = "fsdp_shard"

RESUME_REFUSED = (
    "resume: this checkpoint comes from a data_parallel='fsdp' run, whose optimizer state "
    "is sharded over the ranks and was saved from rank 0's shard only; resuming it is not "
    "supported yet. Its weights are complete: start a new run from them "
    "(CausalLMPolicy.from_pretrained on the checkpoint's policy directory), or train with "
    "data_parallel='ddp' to get resumable checkpoints"
)


def refuse_sharded_state(optimizer: torch.optim.Optimizer, refuse_all: bool = False) -> None:
    """Make ``optimizer.load_state_dict`` raise ``ValueError(RESUME_REFUSED)`` on a state
    marked as an FSDP shard (``refuse_all``: on any state, for a sharded optimizer)."""
    load = optimizer.load_state_dict

    def checked_load(state: dict[str, Any]) -> None:
        if refuse_all or MARKER in state:
            raise ValueError(RESUME_REFUSED)
        load(state)

    optimizer.load_state_dict = checked_load  # type: ignore[method-assign]
