"""DAPO's batch-side pieces: overlong reward shaping and dynamic sampling.

See docs/algorithms.md#overlong-shaping and #dynamic-sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmgym.agents.metrics import flat_groups
from lmgym.rollout import concat_batches
from lmgym.types import RolloutBatch


def overlong_penalty(lengths: Tensor, max_len: int, cache: int) -> Tensor:
    """Soft overlong punishment ``R_len`` (docs/algorithms.md#overlong-shaping).

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


def draw_with_signal(
    draw: Callable[[], RolloutBatch], num_groups: int, max_resample: int
) -> tuple[RolloutBatch, int]:
    """Dynamic sampling: draw batches, keep groups with reward spread, until full.

    Draws at most ``1 + max_resample`` batches and keeps the first ``num_groups``
    groups whose rewards are not all equal. If every group of every draw is flat
    (the usual start of a sparse task), returns the last draw unfiltered: trained on
    as plain GRPO would (all its advantages are 0), never an empty batch.

    Args:
        draw: collects one rollout batch.
        num_groups: groups wanted (the env's ``num_prompts``).
        max_resample: extra draws allowed.

    Returns:
        ``(batch, groups dropped)``.
    """
    kept: list[RolloutBatch] = []
    have, dropped = 0, 0
    for _ in range(1 + max_resample):
        drawn = draw()
        batch, flat = drop_flat_groups(drawn)
        dropped += flat
        if batch.batch_size:
            kept.append(batch)
            have += batch.group_ids.unique().numel()
        if have >= num_groups:
            break
    if not kept:
        return drawn, dropped
    batch = concat_batches(kept)
    groups = batch.group_ids.unique()[:num_groups]
    return batch.select(torch.isin(batch.group_ids, groups)), dropped
