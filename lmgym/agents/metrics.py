"""Masked reductions and the diagnostics every update logs (docs/algorithms.md#metrics).

The masked helpers (`masked_sum`, `masked_mean`, `masked_var`, `masked_std`) are the
one implementation of a reduction over real tokens; advantages, losses and metrics
all reuse them. They select with `torch.where` instead of multiplying by the mask,
so a non-finite value at a padding position cannot turn a sum into NaN.

The diagnostics return Python floats, computed without gradient, ready to log.
"""

import torch
from torch import Tensor

from lmgym.agents.kl import kl_k3


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over entries where `mask` is set.

    Args:
        x: `[B, T]` (or any shape) float tensor.
        mask: bool or float tensor of `x`'s shape; nonzero marks a real entry.
        dim: dimension to reduce; `None` reduces everything.

    Returns:
        0-dim tensor when `dim` is None, else `x`'s shape without `dim`; `x`'s dtype.
    """
    selected = torch.where(mask.bool(), x, 0.0)
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over entries where `mask` is set; 0 where nothing is selected.

    Args:
        x: `[B, T]` (or any shape) float tensor.
        mask: bool or float tensor of `x`'s shape.
        dim: dimension to reduce; `None` reduces everything.

    Returns:
        0-dim tensor when `dim` is None, else `x`'s shape without `dim`; `x`'s dtype.
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1.0)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over entries where `mask` is set.

    Unbiased (divides by n − 1, as `torch.var`) unless `unbiased=False`. With fewer
    than two entries there is no spread to measure and the result is 0, not NaN.

    Args:
        x: `[B, T]` (or any shape) float tensor.
        mask: bool or float tensor of `x`'s shape.
        unbiased: apply Bessel's correction.

    Returns:
        0-dim tensor, `x`'s dtype.
    """
    count = masked_sum(torch.ones_like(x), mask)
    squared_deviation = (x - masked_mean(x, mask)) ** 2
    denominator = count - 1.0 if unbiased else count
    return masked_sum(squared_deviation, mask) / denominator.clamp_min(1.0)


def masked_std(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Standard deviation of `x` over masked entries: `sqrt(masked_var(x, mask))`.

    Returns:
        0-dim tensor, `x`'s dtype.
    """
    return masked_var(x, mask, unbiased).sqrt()


@torch.no_grad()
def clip_fractions(
    ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> dict[str, float]:
    """How often PPO's clip interval `[1 − clip_low, 1 + clip_high]` was hit.

    `clip_fraction` counts tokens whose ratio left the interval; the clip zeroes a
    token's gradient only when the ratio left it in the direction the advantage
    pushes (ρ above with A > 0, ρ below with A < 0). Otherwise the unclipped branch
    is the max and the token keeps its gradient, so the two shares differ (docs/algorithms.md#metrics).

    Args:
        ratio: `[B, T]` float, ρ = exp(lp − lp_old).
        advantages: `[B, T]` float, per token (broadcast sequence advantages first).
        mask: `[B, T]` bool or float.
        clip_low: ε_low.
        clip_high: ε_high.

    Returns:
        `clip_fraction`, `clip_fraction_low`, `clip_fraction_high` and
        `clip_zeroed_fraction`, each a share of the masked tokens in [0, 1].
    """
    below = ratio < 1.0 - clip_low
    above = ratio > 1.0 + clip_high
    zeroed = (above & (advantages > 0)) | (below & (advantages < 0))
    return {
        "clip_fraction": masked_mean((below | above).float(), mask).item(),
        "clip_fraction_low": masked_mean(below.float(), mask).item(),
        "clip_fraction_high": masked_mean(above.float(), mask).item(),
        "clip_zeroed_fraction": masked_mean(zeroed.float(), mask).item(),
    }


def rule_clip_fractions(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    bounds: tuple[float, float] | None,
    zeroes_gradient: bool = True,
) -> dict[str, float]:
    """An agent's clip diagnostics (``Agent.clip_metrics``): `clip_fractions` over its
    rule's clip interval, none when the rule clips nothing.

    Args:
        ratio: `[B, T]` float, ρ = exp(lp − lp_old).
        advantages: `[B, T]` float, per token.
        mask: `[B, T]` bool or float.
        bounds: the rule's `(clip_low, clip_high)` half-widths (`Agent.clip_range`), or
            `None` for a rule without a clip.
        zeroes_gradient: False for a rule whose clip bounds a weight but never zeroes a
            gradient (CISPO): `clip_zeroed_fraction` is then 0.

    Returns:
        `clip_fractions`' four shares, or `{}` when `bounds` is `None`.
    """
    if bounds is None:
        return {}
    metrics = clip_fractions(ratio, advantages, mask, *bounds)
    if not zeroes_gradient:
        metrics["clip_zeroed_fraction"] = 0.0
    return metrics


@torch.no_grad()
def approx_kl(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> float:
    """k3 estimate of KL(π_old ‖ π) over the masked tokens.

    Tokens were sampled from π_old, so with ρ = exp(lp − lp_old) the estimator is
    `mean((ρ − 1) − log ρ)`: k3 with the old policy in the sampling role and the
    current one in the reference role (docs/algorithms.md#metrics). It is ≥ 0.

    Args:
        logprobs: `[B, T]` float, current policy.
        old_logprobs: `[B, T]` float, policy that produced the batch.
        mask: `[B, T]` bool or float.

    Returns:
        The masked mean, a float.
    """
    return masked_mean(kl_k3(old_logprobs, logprobs), mask).item()


@torch.no_grad()
def sampler_gap(learner: Tensor, sampler: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the learner's on the same tokens.

    ``d = lp_old - lp_s`` per token (``lp_old``: the learner's log-prob before the
    update; ``lp_s``: the sampler's, as the rollout engine reported it). With lmgym's
    own engine ``d`` is float noise; another engine's kernels (vLLM) add their own,
    and an asynchronous actor's stale weights add the lag. TIS (``tis_cap``) corrects
    it.

    Returns:
        ``sampler_logprob_gap_mean``, ``sampler_logprob_gap_max`` (``|d|`` over the
        ``mask``'s tokens) and ``sampler_kl``, the k3 estimate of KL(sampler ||
        learner), ``E_s[exp(d) - 1 - d]``.
    """
    d = (learner - sampler).float()
    if not bool(mask.any()):
        return {"sampler_logprob_gap_mean": 0.0, "sampler_logprob_gap_max": 0.0, "sampler_kl": 0.0}
    gap = d.abs()
    return {
        "sampler_logprob_gap_mean": masked_mean(gap, mask).item(),
        "sampler_logprob_gap_max": gap[mask].max().item(),
        "sampler_kl": masked_mean(torch.expm1(d) - d, mask).item(),
    }


def ratio_stats(ratio: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean, min and max of the ratio over masked tokens.

    Args:
        ratio: `[B, T]` float.
        mask: `[B, T]` bool or float with at least one real token.

    Returns:
        `ratio_mean`, `ratio_min`, `ratio_max`.
    """
    real = mask.bool()
    return {
        "ratio_mean": masked_mean(ratio, mask).item(),
        "ratio_min": ratio[real].min().item(),
        "ratio_max": ratio[real].max().item(),
    }


@torch.no_grad()
def effective_sample_size(weights: Tensor, mask: Tensor) -> float:
    """Normalised effective sample size of importance weights, `(Σw)² / (N·Σw²)`.

    1 when all weights are equal; near 1/N when one weight dominates.

    Args:
        weights: `[B, T]` float, non-negative importance weights.
        mask: `[B, T]` bool or float; N is the number of masked tokens.

    Returns:
        A float in (0, 1].
    """
    count = masked_sum(torch.ones_like(weights), mask)
    ess = (masked_sum(weights, mask) ** 2 / (count * masked_sum(weights**2, mask))).item()
    # Cauchy-Schwarz bounds it by 1; float32 sums of near-equal weights can land an ulp above.
    return min(ess, 1.0)


@torch.no_grad()
def entropy_mean(entropy: Tensor, mask: Tensor) -> float:
    """Mean per-token policy entropy over masked tokens.

    Args:
        entropy: `[B, T]` float, entropy of the next-token distribution at each step.
        mask: `[B, T]` bool or float.

    Returns:
        A float.
    """
    return masked_mean(entropy, mask).item()


@torch.no_grad()
def flat_groups(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Which groups have rewards that are all equal.

    Args:
        scores: `[B]` float, one reward per completion.
        group_ids: `[B]` int64 labels (any values, any row order).

    Returns:
        `(flat [G] bool, inverse [B] int64)`: one flag per distinct group and each
        row's group position, so `flat[inverse]` flags rows.
    """
    labels, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = labels.numel()
    highest = scores.new_zeros(num_groups).scatter_reduce(
        0, inverse, scores, "amax", include_self=False
    )
    lowest = scores.new_zeros(num_groups).scatter_reduce(
        0, inverse, scores, "amin", include_self=False
    )
    return highest == lowest, inverse


@torch.no_grad()
def frac_reward_zero_std(scores: Tensor, group_ids: Tensor) -> float:
    """Share of groups whose rewards are all equal (`frac_reward_zero_std`).

    Such a group has GRPO advantage 0 for every row, the usual reason a GRPO loss
    sits at 0; dynamic sampling drops them (docs/algorithms.md#dynamic-sampling).

    Args:
        scores: `[B]` float, one reward per completion.
        group_ids: `[B]` int64 labels (any values, any row order).

    Returns:
        Share of distinct groups with max == min, a float in [0, 1].
    """
    return flat_groups(scores, group_ids)[0].float().mean().item()
