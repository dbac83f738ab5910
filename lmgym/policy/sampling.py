"""Sampling one token per row from next-token logits (temperature, top-k, top-p)."""

from __future__ import annotations

import torch
from torch import Tensor


def filter_logits(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> Tensor:
    """Temperature-scale and filter logits; filtered ids get ``-inf``.

    Args:
        logits: ``[N, V] float32``.
        temperature: > 0.
        top_k: keep the ``k`` largest logits per row (``None`` or 0: all).
        top_p: keep the smallest set of ids whose probability reaches ``top_p``
            (``None`` or 1.0: all); the most likely id is always kept.

    Returns:
        ``[N, V] float32`` new tensor.
    """
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop an id when the mass strictly before it already reaches top_p.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one id per row, independently.

    Args:
        logits: ``[N, V]`` raw next-token logits.

    Returns:
        ``(actions [N] int64, logprobs [N] float32)``; ``logprobs`` is the log-prob of
        the drawn id under the distribution actually sampled from (tempered and
        filtered): the sampler log-prob ``lp_s`` of docs/algorithms.md#notation.
    """
    probs = filter_logits(logits.float(), temperature, top_k, top_p).softmax(dim=-1)
    actions = torch.multinomial(probs, 1, generator=generator)
    # log of the drawn id's probability only: one [N] log instead of a [N, V] log_softmax.
    # A drawn id has probability well above float32's underflow, so this matches
    # log_softmax to rounding.
    return actions.squeeze(1), probs.gather(1, actions).squeeze(1).log()
