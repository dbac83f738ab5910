"""DAPO's batch-side pieces (§6.5): overlong reward shaping and dynamic sampling."""

from __future__ import annotations

import torch
from torch import Tensor

from lmgym.agents.metrics import flat_groups
from lmgym.types import RolloutBatch


def overlong_penalty(lengths: Tensor, max_len: int, cache: int) -> Tensor:
    """Soft overlong punishment ``R_len`` (ALGORITHMS.md, "Overlong shaping").

    ``0`` if ``T <= L_max - L_cache``; ``(L_max - L_cache - T) / L_cache`` inside the
    window; ``-1`` beyond ``L_max`` (which a budget of ``L_max`` never reaches).

    Args:
        lengths: ``[B] int64`` completion lengths ``T``.
        max_len: ``L_max``.
        cache: ``L_cache`` (> 0, <= ``L_max``).

    Returns:
        ``[B] float32``, added to each completion's reward.
    """
    if not 0 < cache <= max_len:
        raise ValueError(f"overlong_cache={cache}: must be in [1, max_new_tokens={max_len}]")
    start = max_len - cache
    inside = (start - lengths.float()) / cache
    return torch.where(lengths <= start, 0.0, torch.where(lengths <= max_len, inside, -1.0))


def drop_flat_groups(batch: RolloutBatch) -> tuple[RolloutBatch, int]:
    """Remove the groups whose rewards are all equal (no group-relative signal).

    Returns:
        ``(batch without those groups, number of groups dropped)``.
    """
    flat, inverse = flat_groups(batch.scores, batch.group_ids)
    return batch.select(~flat[inverse]), int(flat.sum())
