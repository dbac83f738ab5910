"""Rows that share their text, from the env's group ids: a group's prompt runs once.

``TokenVectorEnv`` repeats each drawn prompt ``group_size`` times under one fresh
``group_id`` (``info["group_id"]``, ``RolloutBatch.group_ids``). The policy runs
such a group's shared text through the trunk once and copies the result (KV cache,
hidden states) to the group's rows: the same values as one pass per row up to
float rounding, and the copy's backward sums the rows' gradients.

Groups are the ids set at reset, never rediscovered by comparing text (two draws
of one prompt are two groups, docs/algorithms.md#notation). Sharing is valid only
where a group's rows hold identical text, so ``shared_rows`` checks that with one
batched comparison, cheap next to the trunk pass it saves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import DynamicCache


def shared_rows(
    group_ids: Tensor | None, ids: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor] | None:
    """The first row of each group and, per row, its group, to run each group once.

    Args:
        group_ids: ``[N] int64`` each row's group (any labels, any row order), or
            ``None``: no sharing.
        ids: ``[N, W] int64`` the text that would be shared.
        mask: ``[N, W] bool`` its real columns; padded columns do not count.

    Returns:
        ``(first [U] int64, inverse [N] int64)``: ``first[u]`` is the first row of
        group ``u`` and ``inverse[i]`` the group of row ``i``, so ``ids[first][inverse]``
        equals ``ids`` on the real columns; ``None`` when ``group_ids`` is ``None`` or
        every row is a group of its own (nothing to share).

    Raises:
        ValueError: ``group_ids`` is not ``[N]``, or two rows of one group differ on
            ``ids``/``mask`` (sharing would give one of them the other's text).
    """
    if group_ids is None:
        return None
    n = ids.shape[0]
    if group_ids.shape != (n,):
        raise ValueError(
            f"group_ids: expected shape ({n},), one id per row, got {tuple(group_ids.shape)}"
        )
    labels, inverse = torch.unique(group_ids.to(ids.device), return_inverse=True)
    u = labels.numel()
    if u == n:
        return None
    rows = torch.arange(n, device=ids.device)
    first = torch.full((u,), n, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    key = torch.where(mask, ids, -1)
    differs = (key != key[first[inverse]]).any(dim=1)
    if bool(differs.any()):
        row = int(differs.nonzero()[0, 0])
        leader = int(first[inverse[row]])
        raise ValueError(
            f"group_ids: rows {leader} and {row} share group id {int(labels[inverse[row]])} "
            f"but not their text in the {ids.shape[1]} shared columns; pass the env's "
            "info['group_id'] only where a group's rows show the same prompt (a batch "
            "start), or group_ids=None"
        )
    return first, inverse


def shared_pass(
    hidden_states: Callable[..., Tensor],
    ids: Tensor,
    attention_mask: Tensor | None,
    positions: Tensor,
    cache: DynamicCache,
    shared: tuple[Tensor, Tensor],
) -> Tensor:
    """A trunk pass over ``[N, W]`` rows into the empty ``cache``, each group's rows
    computed once.

    Args:
        hidden_states: the trunk, ``(ids, attention_mask, positions, cache) -> [U, W, H]``.
        ids, positions: ``[N, W] int64``.
        attention_mask: ``[N, W]`` or ``None`` (every column real).
        shared: ``shared_rows``'s ``(first, inverse)``.

    Returns:
        ``hidden [U, W, H]``: row ``i``'s hidden states are ``hidden[inverse[i]]``;
        ``cache`` then holds all ``N`` rows.
    """
    first, inverse = shared
    mask = None if attention_mask is None else attention_mask[first]
    hidden = hidden_states(ids[first], mask, positions[first], cache)
    cache.batch_select_indices(inverse)
    return hidden
