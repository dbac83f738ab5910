"""Per-token KL estimators between the policy and a reference (docs/algorithms.md).

With tokens sampled from π and d = lp − lp_ref:

- k1 = d: unbiased for KL(π ‖ π_ref), high variance, can be negative per token.
- k2 = ½·d²: biased, low variance, ≥ 0.
- k3 = exp(−d) + d − 1: unbiased and ≥ 0 (canonical GRPO's choice for the loss).

A logged "KL" means nothing without its estimator, so each has its own name. The
KL can enter the loss (`ℓ ← ℓ + β·k`, canonical GRPO) or the reward
(`kl_in_reward`, classic RLHF / RLOO / PPO, docs/algorithms.md#kl-in-the-reward).
"""

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
"""A ``kl_estimator`` name (the config field's type)."""


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = lp − lp_ref per token.

    Args:
        logprobs: `[B, T]` float, policy log-probs of the sampled tokens.
        ref_logprobs: `[B, T]` float, reference log-probs of the same tokens.

    Returns:
        `[B, T]` float.
    """
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ½·(lp − lp_ref)² per token.

    Args:
        logprobs: `[B, T]` float.
        ref_logprobs: `[B, T]` float.

    Returns:
        `[B, T]` float, ≥ 0.
    """
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """k3 = exp(lp_ref − lp) − (lp_ref − lp) − 1 per token.

    Args:
        logprobs: `[B, T]` float.
        ref_logprobs: `[B, T]` float.
        clamp: numerical guard: `lp_ref − lp` is clamped to ±clamp before `exp`
            (the same guard as `ratios.log_ratio`; it changes nothing in normal use).

    Returns:
        `[B, T]` float, ≥ 0 (x ↦ eˣ − x − 1 is non-negative).
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-clamp, clamp)
    return log_ratio.exp() - log_ratio - 1.0


_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimator(name: KLEstimator) -> Callable[[Tensor, Tensor], Tensor]:
    """Look an estimator up by name.

    Args:
        name: "k1", "k2" or "k3".

    Returns:
        A function `(logprobs [B, T], ref_logprobs [B, T]) -> [B, T]`.

    Raises:
        ValueError: `name` is not one of the estimators.
    """
    if name not in _ESTIMATORS:
        valid = ", ".join(repr(key) for key in _ESTIMATORS)
        raise ValueError(f"unknown KL estimator {name!r}; valid names are {valid}")
    return _ESTIMATORS[name]


def kl_in_reward(
    rewards: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, beta: float
) -> Tensor:
    """Subtract the per-token KL penalty from the reward: `r − β·k1`, k1 = lp_old − lp_ref.

    Applied before advantages are computed (docs/algorithms.md#kl-in-the-reward); the
    result is a constant for the policy loss, so it is detached.

    Args:
        rewards: `[B, T]` float, per-token rewards (bandit reward at the last token).
        old_logprobs: `[B, T]` float, log-probs of the policy that sampled the batch.
        ref_logprobs: `[B, T]` float, reference log-probs.
        mask: `[B, T]` bool or float; padding keeps its reward unchanged.
        beta: KL coefficient β.

    Returns:
        `[B, T]` float, a new tensor.
    """
    penalty = beta * kl_k1(old_logprobs, ref_logprobs)
    return torch.where(mask.bool(), rewards - penalty, rewards).detach()
