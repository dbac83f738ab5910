"""A KV cache layer over preallocated buffers, written in place.

transformers' ``DynamicLayer`` grows by ``torch.cat`` on every decode step, which
copies the whole cache each time. ``SlotLayer`` allocates ``[N, heads, capacity,
dim]`` once, writes each step's keys/values in place and hands the attention a view
of the columns in use, ``[0, filled)``; nothing else is read.

Two ways to write a step:

- *shared column* (``cols is None``, episode-synchronous rollouts): every row's new
  columns go to ``[filled, filled + S)``, as in a growing cache.
- *per-row columns* (continuous batching, after a row restarted, or once a
  multi-turn row took in an observation): one new column per row, row ``i``'s at
  ``cols[i]``; a restarted row's new text sits in its own first columns, so every
  row's columns run from 0 and ``filled`` is about the longest in-flight row. No
  column is ever moved or compacted. The caller sets ``cols`` and ``filled`` before
  the forward (``set_step``); the attention mask hides the columns of other rows'
  lengths and of stopped rows. A restarted row's text, or a multi-turn row's action
  and observation, comes in the same forward as extra one-token inputs that write
  their own row's columns (``set_step(..., rows=...)``).

The compiled decode step (``compiled_decode``) writes per-row columns too, and
takes the whole buffers (``set_step(..., read_all=True)``): its attention reads as
many columns as its mask is wide, so that the graph's inputs keep their shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer's keys/values in ``[N, heads, capacity, dim]`` buffers.

    ``keys`` / ``values`` are views of the first ``filled`` columns; ``update``
    returns them. ``get_seq_length`` is the query offset transformers' causal mask
    uses: with per-row columns it is ``filled - 1``, so the causal part of the mask
    allows every column in use and only the caller's attention mask selects.
    """

    def __init__(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        super().__init__()
        n, heads, width, dim = keys.shape
        self.key_slots = keys.new_zeros(n, heads, capacity, dim)
        self.value_slots = values.new_zeros(n, heads, capacity, dim)
        self.key_slots[:, :, :width] = keys
        self.value_slots[:, :, :width] = values
        self.filled = width
        self.cols: Tensor | None = None
        self.read_all = False
        self._rows = torch.arange(n, device=keys.device)
        self.write_rows = self._rows
        self.device = keys.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys = self.key_slots[:, :, : self.filled]
        self.values = self.value_slots[:, :, : self.filled]

    @property
    def capacity(self) -> int:
        return self.key_slots.shape[2]

    def grow(self, capacity: int) -> None:
        """Widen the buffers to ``capacity`` columns (one copy; callers size them so
        this is rare)."""
        extra = capacity - self.capacity
        if extra > 0:
            n, heads, _, dim = self.key_slots.shape
            pad = self.key_slots.new_zeros(n, heads, extra, dim)
            self.key_slots = torch.cat([self.key_slots, pad], dim=2)
            self.value_slots = torch.cat([self.value_slots, pad], dim=2)
            self._expose()

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        if self.cols is None:
            start, end = self.filled, self.filled + key_states.shape[2]
            if end > self.capacity:
                raise RuntimeError(f"KV slots full ({self.capacity} columns); reserve() first")
            self.key_slots[:, :, start:end] = key_states
            self.value_slots[:, :, start:end] = value_states
            self.filled = end
            self._expose()
        else:
            # Token-row t's [heads, dim] goes to column cols[t] of row write_rows[t] (set_step
            # exposed the views).
            self.key_slots[self.write_rows, :, self.cols] = key_states[:, :, 0]
            self.value_slots[self.write_rows, :, self.cols] = value_states[:, :, 0]
            if self.read_all:
                return self.key_slots, self.value_slots
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled if self.cols is None else self.filled - 1

    def _unsupported(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "SlotLayer is lmgym's rollout cache: it is not cropped, reordered, repeated, "
            "reset or offloaded (its views would go stale); use a DynamicCache for that"
        )

    crop = batch_repeat_interleave = batch_select_indices = reorder_cache = _unsupported
    reset = offload = prefetch = _unsupported


def is_slot_cache(cache: DynamicCache) -> bool:
    """Whether ``to_slots`` converted this cache (it converts every layer at once)."""
    return type(cache.layers[0]) is SlotLayer


def slots_filled(cache: DynamicCache) -> int:
    """Columns in use: the attention reads ``[0, filled)``."""
    return cache.layers[0].filled


def slots_capacity(cache: DynamicCache) -> int:
    return cache.layers[0].capacity


def reserve(cache: DynamicCache, columns: int) -> int:
    """Make room for ``columns`` columns (growing by at least a quarter, so that a
    caller whose rows outgrow the first estimate copies rarely). Returns the capacity."""
    capacity = slots_capacity(cache)
    if columns > capacity:
        capacity = max(columns, capacity + capacity // 4)
        for layer in cache.layers:
            layer.grow(capacity)
    return capacity


def set_step(
    cache: DynamicCache,
    cols: Tensor,
    filled: int,
    read_all: bool = False,
    rows: Tensor | None = None,
) -> None:
    """Plan a one-token step with per-row columns: row ``i`` writes column ``cols[i]``
    and attention reads ``[0, filled)`` (``cols.max() < filled <= capacity``); with
    ``read_all`` ``update`` returns the whole buffers (the compiled step, whose
    attention reads its mask's width).

    ``rows``: ``[B] int64``, the row each of the step's ``B`` one-token inputs writes
    (``cols`` is then ``[B]`` too); default one input per row, in order. A packed
    step (``kv_engine``) adds appended text (restarts, observations) as extra
    one-token inputs."""
    for layer in cache.layers:
        layer.cols = cols
        layer.read_all = read_all
        layer.write_rows = layer._rows if rows is None else rows
        if layer.filled != filled:
            layer.filled = filled
            layer._expose()


def to_slots(cache: DynamicCache, capacity: int) -> None:
    """Move a plain cache's layers (``DynamicLayer``, ``C <= capacity`` columns) into
    ``capacity``-column slots, in place, with a shared write column."""
    cache.layers = [SlotLayer(layer.keys, layer.values, capacity) for layer in cache.layers]
