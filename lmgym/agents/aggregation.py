"""Reduce a per-token loss `[B, T]` to the scalar that is minimised (docs/algorithms.md#aggregation).

With ℓ the per-token loss, T_i the real tokens of row i, B the batch's rows:

- `seq-mean-token-mean` (per-sequence): `(1/B)·Σ_i (1/T_i)·Σ_t ℓ_{i,t}`. Every
  completion weighs the same, so a token of a short completion weighs more.
- `token-mean` (per-token, DAPO): `Σ_{i,t} ℓ / Σ_{i,t} mask`. Every token weighs
  the same, so long completions weigh more.
- `seq-mean-token-sum-norm` (fixed length, Dr. GRPO): `Σ_{i,t} ℓ / (B·L_max)`.
  Every token weighs the same, with a constant normaliser.

Other libraries' names for the same modes (lmgym keeps verl's `loss_agg_mode` names):

- per-sequence: `seq-mean-token-mean` = TRL `loss_type="grpo"` = verl `seq-mean-token-mean`
- per-token: `token-mean` = TRL `loss_type="dapo"` = verl `token-mean`
- fixed length: `seq-mean-token-sum-norm` = TRL `loss_type="dr_grpo"` =
  verl `seq-mean-token-sum-norm`

Minibatches and gradient accumulation: the normalisers `num_sequences` (B) and
`num_tokens` (Σ mask) are the *whole batch's* counts, passed in by the caller, so
summing the results over any split of the rows gives the full-batch value and a
distributed learner can all-reduce the counts: minibatches are sets of whole rows,
and no split of them can change the loss (docs/algorithms.md#conventions).
"""

import typing
from typing import Literal

from torch import Tensor

from lmgym.agents.metrics import masked_mean, masked_sum

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
"""A ``loss_aggregation`` (the config field's type)."""
AGGREGATION_MODES: tuple[str, ...] = typing.get_args(Aggregation)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: Aggregation,
    *,
    num_sequences: int | float,
    num_tokens: int | float,
    max_len: int,
) -> Tensor:
    """Aggregate a per-token loss with one of the three modes above.

    A row with no real tokens contributes 0 (it still counts in `num_sequences` if
    the caller counted it).

    Args:
        loss: `[b, T]` float per-token loss for the b rows of this (mini)batch.
        mask: `[b, T]` bool or float; 1 for real completion tokens.
        mode: "seq-mean-token-mean", "token-mean" or "seq-mean-token-sum-norm".
        num_sequences: B, rows in the whole batch (used by the sequence modes).
        num_tokens: Σ mask over the whole batch (used by "token-mean").
        max_len: L_max, the run's maximum number of new tokens.

    Returns:
        0-dim float tensor; sums to the full-batch value over any row split.

    Raises:
        ValueError: unknown `mode`, or a non-positive normaliser.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes are {AGGREGATION_MODES}")
    if num_sequences <= 0 or num_tokens <= 0 or max_len <= 0:
        raise ValueError(
            "num_sequences, num_tokens and max_len must be positive whole-batch counts; "
            f"got {num_sequences}, {num_tokens}, {max_len}"
        )
    if mode == "seq-mean-token-mean":
        return masked_mean(loss, mask, dim=-1).sum() / num_sequences
    if mode == "token-mean":
        return masked_sum(loss, mask) / num_tokens
    return masked_sum(loss, mask) / (num_sequences * max_len)


def aggregate_sequences(loss_seq: Tensor, num_sequences: int | float) -> Tensor:
    """Average a per-sequence loss (GSPO) over the whole batch: `Σ_i ℓ_i / B`.

    Args:
        loss_seq: `[b]` float per-sequence loss for the b rows of this (mini)batch.
        num_sequences: B, rows in the whole batch.

    Returns:
        0-dim float tensor; sums to the full-batch value over any row split.

    Raises:
        ValueError: `num_sequences` is not positive.
    """
    if num_sequences <= 0:
        raise ValueError(f"num_sequences must be a positive whole-batch count; got {num_sequences}")
    return loss_seq.sum() / num_sequences
