"""The control record learner 0 broadcasts to every learner before each update.

It says whether to stop, the shape of the packed batch that follows (so the other
learners allocate it) and the counters learner 0 alone knows (drops, tokens
received, idle times), which every learner adds to its metrics. On the wire it is
one ``int64`` tensor, the fields in declaration order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lmgym.asynchronous.roles import Topology


@dataclass(frozen=True)
class Control:
    """One update's control values (all integers; times in microseconds)."""

    stop: int = 0
    """1: no more updates (the other learners leave their loop)."""
    update: int = 0
    """The update's index."""
    rows: int = 0
    """Rows of the packed batch (every learner's share together)."""
    int_cols: int = 0
    """Columns of the packed ``int64`` tensor."""
    float_cols: int = 0
    """Columns of the packed float tensor."""
    prompt_width: int = 0
    """Padded prompt length of the batch."""
    rows_dropped: int = 0
    """Rows dropped for the staleness bound while the batch was assembled."""
    tokens_received: int = 0
    """Completion tokens the hub has received so far."""
    learner_idle_us: int = 0
    """How long the hub waited for this update's rollouts."""
    actor_idle_ppm: int = 0
    """The actors' idle share of their time so far, in parts per million."""
    actor_idle_us: int = 0
    """The actors' total idle time so far."""


FIELDS = [f.name for f in dataclasses.fields(Control)]


def broadcast_control(control: Control | None, topology: Topology) -> Control:
    """Learner 0's ``control`` on every learner (the others pass ``None``)."""
    values = (
        [getattr(control, name) for name in FIELDS] if control is not None else [0] * len(FIELDS)
    )
    tensor = torch.tensor(values, dtype=torch.int64, device=topology.weights_device)
    if topology.config.learners > 1:
        dist.broadcast(tensor, src=0, group=topology.learners_group)
    return Control(**dict(zip(FIELDS, (int(v) for v in tensor.tolist()), strict=True)))
