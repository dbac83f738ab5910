"""Per-token policy losses ℓ (to be minimised) and importance weights (docs/algorithms.md).

Every loss treats `old_logprobs` and `advantages` as constants (they are detached
here too, so a caller's graph cannot leak into the policy gradient). Ratios
returned beside a loss are detached: they are for metrics. `clip_objective` and
`gspo_token_ratio` are the exceptions by design: the first takes a ratio with
gradient, the second returns one, for a rule to compose.

Two different things bound a ratio, and they must not be confused:

- the numerical guard (`clamp`): `lp − lp_old` is clamped to ±20 before `exp` so
  nothing overflows; in normal training it never binds;
- the algorithm's bound: PPO's clip interval, GSPO's sequence clip, CISPO's weight
  band, dual-clip PPO's bound `−c·A` on negative advantages, or TIS's one-sided
  cap `C` (docs/algorithms.md#tis).

CISPO bounds and other libraries' forms (docs/algorithms.md#cispo). Here the importance weight is
`sg(clip(ρ, 1 − weight_low, 1 + weight_high))`, with its own names so nobody reads
them as PPO's ε.

(a) A form that caps the weight only above at an absolute value, `w = min(ρ, ε_max)`,
    is `weight_high = ε_max − 1` with `weight_low = 1`: the lower bound 1 − 1 = 0 never
    binds because ρ > 0. The MiniMax-M1 paper likewise sets no lower bound and tunes
    only the upper one.
(b) An implementation that forgets the stop-gradient on the clipped weight (for
    example `−clip(ρ)·A`, or PPO's max-of-two-branches form) gives every token outside
    the band zero gradient, which is exactly what CISPO exists to avoid. That is wrong,
    not a variant; here a clipped token still gets `−clip(ρ)·A` as dℓ/d lp.
"""

import torch
from torch import Tensor

from lmgym.agents.metrics import masked_mean


def log_ratio(logprobs: Tensor, old_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """`lp − lp_old` clamped to ±clamp: the numerical guard before `exp`, not clipping.

    Args:
        logprobs: `[B, T]` float, current policy (may carry gradient).
        old_logprobs: `[B, T]` float, treated as a constant.
        clamp: bound on |lp − lp_old|; exp(20) ≈ 4.9e8 is finite in float32 and bfloat16.

    Returns:
        `[B, T]` float.
    """
    return (logprobs - old_logprobs.detach()).clamp(-clamp, clamp)


def policy_gradient_loss(logprobs: Tensor, advantages: Tensor) -> Tensor:
    """One-step policy gradient, ℓ = −A·lp (docs/algorithms.md#policy-gradient); same gradient as −A·exp(lp − sg(lp)).

    Args:
        logprobs: `[B, T]` float, with gradient.
        advantages: `[B, T]` float (broadcast sequence advantages first).

    Returns:
        `[B, T]` float per-token loss.
    """
    return -advantages.detach() * logprobs


def clip_objective(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """PPO's pessimistic clip of a given ratio ρ.

    ℓ = max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high)), the shared core of the
    token clip (`clipped_surrogate_loss`), GSPO's sequence clip and GSPO-token's
    clip; the caller builds the ratio.

    Args:
        ratio: `[B, T]` (or `[B]`) float ρ, with gradient.
        advantages: ratio's shape, float; treated as a constant.
        clip_low: ε_low, the ratio is clipped below at 1 − clip_low.
        clip_high: ε_high, the ratio is clipped above at 1 + clip_high.

    Returns:
        ratio's shape, float per-token (or per-sequence) loss.
    """
    advantages = advantages.detach()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped)


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clamp: float = 20.0,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO / GRPO token clip: ℓ = max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high)).

    The max is pessimistic: once ρ has moved past the interval in the direction A
    pushes, the clipped branch wins and the token's gradient is zero (docs/algorithms.md#token-clip).

    Dual-clip PPO (Ye et al. 2020) bounds it by −c·A where A < 0: ℓ = min(that, −c·A).
    With A < 0 the token clip's −A·ρ grows without bound in ρ, so one token whose
    ratio exploded (a stale or off-policy sample) can dominate the batch. The second
    clip binds where ρ > c, and there the token's gradient is 0; tokens with A ≥ 0,
    and with A < 0 and ρ ≤ c, get the token clip's loss unchanged.

    Args:
        logprobs: `[B, T]` float, with gradient.
        old_logprobs: `[B, T]` float.
        advantages: `[B, T]` float.
        clip_low: ε_low.
        clip_high: ε_high (DAPO's clip-higher raises it, e.g. 0.28).
        clamp: numerical guard, see `log_ratio`.
        dual_clip: c > 1, the dual clip's multiple of |A|; `None`: no dual clip.

    Returns:
        `(loss, ratio)`: `[B, T]` float per-token loss and `[B, T]` detached ρ.
    """
    ratio = log_ratio(logprobs, old_logprobs, clamp).exp()
    loss = clip_objective(ratio, advantages, clip_low, clip_high)
    if dual_clip is not None:
        advantages = advantages.detach()
        bounded = torch.minimum(loss, -dual_clip * advantages)
        loss = torch.where(advantages < 0, bounded, loss)
    return loss, ratio.detach()


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    clamp: float = 20.0,
) -> tuple[Tensor, Tensor]:
    """GSPO (docs/algorithms.md#gspo): one length-normalised ratio per sequence, clipped like PPO.

    s_i = exp((1/T_i)·Σ_t mask·(lp − lp_old)),
    ℓ_i = max(−A_i·s_i, −A_i·clip(s_i, 1 − clip_low, 1 + clip_high)).
    The 1/T_i makes s_i a per-token geometric mean, so its range does not grow with
    length and the paper's tiny clip ranges apply to every sequence alike.

    Args:
        logprobs: `[B, T]` float, with gradient.
        old_logprobs: `[B, T]` float.
        advantages: `[B]` float, one (GRPO) advantage per sequence.
        mask: `[B, T]` bool or float; T_i is the row's count of real tokens.
        clip_low: ε_low on s_i.
        clip_high: ε_high on s_i.
        clamp: numerical guard, applied to the mean log-ratio.

    Returns:
        `(loss, seq_ratio)`: `[B]` float per-sequence loss (aggregate with
        `aggregation.aggregate_sequences`) and `[B]` detached s_i.
    """
    mean_log_ratio = masked_mean(logprobs - old_logprobs.detach(), mask, dim=-1)
    seq_ratio = mean_log_ratio.clamp(-clamp, clamp).exp()
    return clip_objective(seq_ratio, advantages, clip_low, clip_high), seq_ratio.detach()


def gspo_token_ratio(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clamp: float = 20.0
) -> Tensor:
    """GSPO-token's ratio: s_{i,t} = sg(s_i)·exp(lp_{i,t} − sg(lp_{i,t})), with gradient.

    Its value is the sequence ratio s_i of `gspo_loss` at every token, and its
    gradient is ∇s_{i,t} = s_i·∇lp_{i,t}: each token gets its own gradient, so a
    per-token advantage A_{i,t} can weigh it. Averaged over a row's tokens,
    (1/T_i)·Σ_t ∇s_{i,t} = s_i·(1/T_i)·Σ_t ∇lp_{i,t} = ∇s_i, so with A_{i,t} = A_i the
    seq-mean-token-mean of the clipped loss has GSPO's gradient.

    Args:
        logprobs: `[B, T]` float, with gradient.
        old_logprobs: `[B, T]` float, a constant.
        mask: `[B, T]` bool or float; T_i is the row's count of real tokens.
        clamp: numerical guard on the mean log-ratio (a clamped row's s_i is
            exp(±clamp); unlike in `gspo_loss`, its tokens keep a gradient).

    Returns:
        `[B, T]` float s_{i,t}, with gradient (padding positions hold s_i too).
    """
    mean_log_ratio = masked_mean(logprobs.detach() - old_logprobs.detach(), mask, dim=-1)
    seq_log_ratio = mean_log_ratio.clamp(-clamp, clamp)
    # lp - sg(lp) is exactly 0 in value: s_{i,t} is bit-equal to s_i.
    return (seq_log_ratio[:, None] + (logprobs - logprobs.detach())).exp()


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    weight_low: float,
    weight_high: float,
    clamp: float = 20.0,
) -> tuple[Tensor, Tensor]:
    """CISPO (docs/algorithms.md#cispo): ℓ = −sg(clip(ρ, 1 − weight_low, 1 + weight_high))·A·lp.

    The weight, not the objective, is clipped, and it is detached, so every token
    keeps the gradient `−clip(ρ)·A` w.r.t. its log-prob. See the module docstring
    for how these bounds map to other libraries' forms.

    Args:
        logprobs: `[B, T]` float, with gradient.
        old_logprobs: `[B, T]` float.
        advantages: `[B, T]` float.
        weight_low: the weight's lower bound is 1 − weight_low (1 means no bound).
        weight_high: the weight's upper bound is 1 + weight_high.
        clamp: numerical guard, see `log_ratio`.

    Returns:
        `(loss, ratio)`: `[B, T]` float per-token loss and `[B, T]` detached ρ.
    """
    ratio = log_ratio(logprobs, old_logprobs, clamp).exp().detach()
    weight = ratio.clamp(1.0 - weight_low, 1.0 + weight_high)
    return -weight * advantages.detach() * logprobs, ratio


def tis_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float = 2.0, clamp: float = 20.0
) -> Tensor:
    """Truncated importance sampling weights w = min(exp(lp_old − lp_s), C) (docs/algorithms.md#tis).

    Corrects the learner–sampler mismatch; use as `ℓ ← w·ℓ`. The cap C is one-sided:
    small weights pass through unchanged, unlike a clip around 1.

    Args:
        old_logprobs: `[B, T]` float, learner log-probs before this batch's updates.
        sampler_logprobs: `[B, T]` float, log-probs reported by the sampler.
        cap: C, the upper cap on the weight.
        clamp: numerical guard on the log-ratio before `exp` (not the cap).

    Returns:
        `[B, T]` float, detached, in (0, C].
    """
    weight = log_ratio(old_logprobs.detach(), sampler_logprobs, clamp).exp()
    return weight.clamp(max=cap).detach()
