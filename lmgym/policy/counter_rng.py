"""Counter-based uniforms: each draw a function of (seed, episode, position) alone.

A batched sampler that draws every row's uniform from one generator gives a row
the draw of its turn in the batch: the tokens of an episode then depend on which
step it reached each position at. Under continuous batching with parked rows
(``responder_park_after``) that step depends on how long the responder's calls
took, so a shared generator would make the batch depend on wall-clock time.
Keyed by the episode's prompt-stream slot and the token's column instead, every
draw is the same whichever row runs the episode and whenever it gets there.

The hash is SplitMix64's finaliser (Steele, Lea and Flood, 2014), in int64 tensor
arithmetic (wrapping multiplication; logical right shifts by masking), over the
three keys folded in one after another; the top 53 bits make a float64 in
``[0, 1)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 ``x`` (torch's ``>>`` copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: Tensor) -> Tensor:
    """SplitMix64's step and finaliser on each element of an int64 tensor."""
    z = x + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def counter_uniforms(seed: int, episode: Tensor, position: Tensor) -> Tensor:
    """One uniform in ``[0, 1)`` per row, a function of its three keys alone.

    Args:
        seed: The run's sampler seed (any int; reduced to 64 bits).
        episode: ``[N] int64`` each row's episode key (the env's ``info["episode"]``).
        position: ``[N] int64`` the column of the token being drawn
            (``info["length"]`` before the step).

    Returns:
        ``[N] float64`` on ``episode``'s device.
    """
    key = torch.full_like(episode, _signed(seed & ((1 << 64) - 1)))
    h = mix64(mix64(mix64(key) ^ episode) ^ position.to(episode.device))
    return _shift_right(h, 11).to(torch.float64) * (1.0 / (1 << 53))


__all__ = ["counter_uniforms", "mix64"]
