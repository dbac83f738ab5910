"""A KV cache layer over a preallocated buffer, for continuous batching.

transformers' ``DynamicLayer`` grows by ``torch.cat`` on every step, which copies
the whole cache. In episode-synchronous rollouts that is the cheaper choice (the
attention only reads the columns written so far). Under continuous batching the
cache stays about as wide as the longest in-flight row all the time, so a buffer
of fixed capacity, written in place and read whole through the attention mask,
saves the per-step copy at no extra attention cost. ``CausalLMPolicy`` switches a
plain cache to slots at its first restarted row.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer's keys/values in ``[N, heads, capacity, dim]`` buffers, filled left to right.

    Columns ``[0, filled)`` hold keys (real or masked out by the caller's attention
    mask); later columns are free. ``update`` writes the new columns in place and
    returns the whole buffers, so the attention mask must cover ``capacity``
    columns (``get_mask_sizes`` says so).
    """

    def __init__(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        super().__init__()
        n, heads, width, dim = keys.shape
        self.keys = keys.new_zeros(n, heads, capacity, dim)
        self.values = values.new_zeros(n, heads, capacity, dim)
        self.keys[:, :, :width] = keys
        self.values[:, :, :width] = values
        self.filled = width
        self.device = keys.device
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        end = self.filled + key_states.shape[2]
        if end > self.keys.shape[2]:
            raise RuntimeError(
                f"KV slots full ({self.keys.shape[2]} columns); compact the cache first"
            )
        self.keys[:, :, self.filled : end] = key_states
        self.values[:, :, self.filled : end] = value_states
        self.filled = end
        return self.keys, self.values

    def write_rows(self, rows: Tensor, keys: Tensor, values: Tensor) -> None:
        """Put a restarted row's new text into its own first columns (its old ones are dead).

        Args:
            rows: ``[k] int64``.
            keys, values: ``[k, heads, W, dim]`` from prefilling those rows alone.
        """
        width = keys.shape[2]
        self.keys[rows, :, :width] = keys
        self.values[rows, :, :width] = values
        self.filled = max(self.filled, width)  # the next free slot lies past the new text

    def get_seq_length(self) -> int:
        return self.filled

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def repack(self, order: Tensor, filled: int) -> None:
        """Reorder every row's columns by ``order`` and keep the first ``filled``.

        Args:
            order: ``[N, capacity] int64``, a permutation of the columns per row
                (the kept ones first). One gather per buffer; the columns past
                ``filled`` hold copies the mask hides until they are overwritten.
            filled: columns kept.
        """
        index = order[:, None, :, None].expand(-1, self.keys.shape[1], -1, self.keys.shape[3])
        self.keys = self.keys.gather(2, index)
        self.values = self.values.gather(2, index)
        self.filled = filled


def is_slot_cache(cache: DynamicCache) -> bool:
    """Whether ``to_slots`` converted this cache (it converts every layer at once)."""
    return type(cache.layers[0]) is SlotLayer


def slots_filled(cache: DynamicCache) -> int:
    """Columns written so far (the next decode step writes this column)."""
    return cache.layers[0].filled


def slots_capacity(cache: DynamicCache) -> int:
    return cache.layers[0].keys.shape[2]


def to_slots(cache: DynamicCache, cache_mask: Tensor, capacity: int) -> Tensor:
    """Move a plain cache's layers into ``capacity``-column slots, in place (``CausalLMPolicy``
    does this at the first restarted row).

    Args:
        cache: every layer a plain ``DynamicLayer`` of ``C <= capacity`` columns.
        cache_mask: ``[N, C] bool``.

    Returns:
        The mask widened to ``[N, capacity]`` (free columns False).
    """
    cache.layers = [SlotLayer(layer.keys, layer.values, capacity) for layer in cache.layers]
    free = cache_mask.new_zeros(cache_mask.shape[0], capacity - cache_mask.shape[1])
    return torch.cat([cache_mask, free], dim=1)
