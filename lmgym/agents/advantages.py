"""Returns and advantage estimators (docs/algorithms.md#advantages).

All functions are pure and return detached tensors: advantages and value targets
are constants for the losses. Per-token tensors are `[B, T]`, per-sequence `[B]`;
masked (padding) positions come out as 0.

Groups are identified by `group_ids`, arbitrary int64 labels: rows of one group
need not be adjacent, and the labels need not be contiguous or sorted. Group
statistics use `torch.unique(return_inverse=True)` with `index_add`, never row order.

Reward statistics (group and batch means and stds, whitening) are computed in
float64 and returned in the input's dtype: a group std of rewards near 1e19
overflows float32 (its squares pass 3.4e38) and would silently zero every
advantage.

Padding inside a row is transparent to the backward recursions (`gae`,
`discounted_returns`): it neither receives nor passes on credit, so packed
sequences separated by `dones` and padding never leak into each other, and the end
of a row is always a boundary.
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lmgym.agents.metrics import masked_mean, masked_std


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (docs/algorithms.md#gae), accumulated backward over T.

    δ_t = r_t + γ·V_{t+1}·(1 − done_t) − V_t,  A_t = δ_t + γλ·(1 − done_t)·A_{t+1},
    where t + 1 is the next real token of the row; past the last real token of a
    row, V and A are 0 whether or not `done` is set there.

    Args:
        rewards: `[B, T]` float per-token rewards.
        values: `[B, T]` float value predictions V_t.
        dones: `[B, T]` bool or float; 1 at each sequence's last token (read at real
            tokens only).
        mask: `[B, T]` bool or float; 1 for real completion tokens.
        gamma: discount γ (1 by default in RLHF, docs/algorithms.md#discount).
        lam: GAE λ, one for the batch, or a `[B]` float tensor of one λ per row
            (VAPO's length-adaptive λ, `length_adaptive_lambda`).

    Returns:
        `(advantages, returns)`: both `[B, T]` float, detached, 0 where masked;
        `returns = advantages + values` are the value targets.

    Raises:
        ValueError: a tensor `lam` is not of shape `[B]`.
    """
    if isinstance(lam, Tensor) and lam.shape != rewards.shape[:1]:
        raise ValueError(
            f"lam: expected a float or one λ per row, shape ({rewards.shape[0]},), "
            f"got shape {tuple(lam.shape)}"
        )
    rewards, values = rewards.detach(), values.detach()
    real = mask.bool()
    not_done = 1.0 - dones.to(rewards.dtype)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_advantage = rewards.new_zeros(rewards.shape[0])
    columns = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value * not_done[:, t] - values[:, t]
        advantage = delta + gamma * lam * not_done[:, t] * next_advantage
        # A padding column passes its successor's V and A through unchanged.
        next_value = torch.where(real[:, t], values[:, t], next_value)
        next_advantage = torch.where(real[:, t], advantage, next_advantage)
        columns.append(torch.where(real[:, t], advantage, 0.0))
    advantages = torch.stack(columns[::-1], dim=1)
    returns = torch.where(real, advantages + values, 0.0)
    return advantages, returns


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive GAE λ of each row: λ_i = 1 − 1/(α·T_i), clamped to [0, 1].

    GAE's weights on the TD errors sum to 1/(1 − λ) = α·T_i, so a long completion
    gets a λ near 1 (little bias over its many tokens) and a short one a smaller λ.
    Where α·T_i < 1 (short completions, e.g. T_i < 20 at α = 0.05) the formula
    goes below 0 and λ is clamped to 0, one-step TD.

    Args:
        lengths: `[B]` int64 completion lengths T_i.
        alpha: α > 0.

    Returns:
        `[B]` float32.
    """
    return (1.0 - 1.0 / (alpha * lengths.clamp_min(1).float())).clamp(0.0, 1.0)


def discounted_returns(
    rewards: Tensor, mask: Tensor, gamma: float, dones: Tensor | None = None
) -> Tensor:
    """Reward-to-go G_t = Σ_{t' ≥ t} γ^{t'−t}·r_{t'}, stopping at each `done`.

    This is GAE with V = 0 and λ = 1 (then δ_t = r_t), so it shares `gae`'s
    boundary and padding rules; the discount counts real tokens.

    Args:
        rewards: `[B, T]` float per-token rewards.
        mask: `[B, T]` bool or float.
        gamma: discount γ.
        dones: `[B, T]` bool or float, 1 at each packed sequence's last token;
            `None` means one sequence per row.

    Returns:
        `[B, T]` float, detached, 0 where masked.
    """
    zeros = torch.zeros_like(rewards)
    dones = zeros if dones is None else dones
    advantages, _ = gae(rewards, zeros, dones, mask, gamma, lam=1.0)
    return advantages


def batch_mean_baseline(returns: Tensor, mask: Tensor | None = None) -> Tensor:
    """REINFORCE baseline: the mean return over the batch.

    Args:
        returns: `[B, T]` float per-token returns (with `mask`), or `[B]` per-sequence
            returns (without).
        mask: `[B, T]` bool or float, or `None` to average every entry.

    Returns:
        0-dim float tensor, detached.
    """
    returns = returns.detach()
    return returns.mean() if mask is None else masked_mean(returns, mask)


@dataclass
class EMABaseline:
    """Exponential moving average of returns, a REINFORCE baseline across batches.

    `update(x)` sets `value ← decay·value + (1 − decay)·x` and returns the new value.
    No bias correction: `value` starts at its initial value (0 by default), so use
    the baseline *before* updating it with the current batch's mean return.

    Attributes:
        decay: weight of the past, in [0, 1).
        value: the current baseline.
    """

    decay: float = 0.9
    value: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"EMABaseline decay must be in [0, 1); got {self.decay}")

    def update(self, x: float | Tensor) -> float:
        """Fold in one observation (e.g. `batch_mean_baseline(returns, mask)`).

        Args:
            x: a float or 0-dim tensor.

        Returns:
            The new `value`.
        """
        self.value = self.decay * self.value + (1.0 - self.decay) * float(x)
        return self.value


def reinforce_advantages(returns: Tensor, mask: Tensor, baseline: float | Tensor = 0.0) -> Tensor:
    """REINFORCE advantages A_{i,t} = G_{i,t} − b.

    Args:
        returns: `[B, T]` float, e.g. from `discounted_returns`.
        mask: `[B, T]` bool or float.
        baseline: b: 0 (none), `batch_mean_baseline(...)`, `EMABaseline.value`, or
            any tensor broadcastable to `[B, T]`.

    Returns:
        `[B, T]` float, detached, 0 where masked.
    """
    baseline = baseline.detach() if isinstance(baseline, Tensor) else baseline
    return torch.where(mask.bool(), returns.detach() - baseline, 0.0)


def group_mean_std(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, unbiased std and size, broadcast back to each row.

    Statistics are taken about each group's minimum, so an all-equal group has a
    mean exactly equal to its value and a std of exactly 0 (no rounding residue
    for GRPO to divide by ε). A group of size 1 has std 0, not NaN.

    Args:
        values: `[N]` float.
        group_ids: `[N]` int64 labels; rows with the same label form a group.

    Returns:
        `(mean, std, group_size)`: `[N]` float, `[N]` float, `[N]` int64; row n
        holds its group's statistics.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    lowest = values.new_zeros(num_groups).scatter_reduce(
        0, inverse, values, "amin", include_self=False
    )
    shifted = values - lowest[inverse]
    mean = lowest + values.new_zeros(num_groups).index_add(0, inverse, shifted) / counts
    squared_deviation = (values - mean[inverse]) ** 2
    sum_squares = values.new_zeros(num_groups).index_add(0, inverse, squared_deviation)
    std = (sum_squares / (counts - 1).clamp_min(1)).sqrt()
    return mean[inverse], std[inverse], counts[inverse]


def rloo_advantages(scores: Tensor, group_ids: Tensor, single_is_zero: bool = False) -> Tensor:
    """REINFORCE leave-one-out (docs/algorithms.md#rloo): A_i = R_i − mean_{j ∈ g(i), j ≠ i} R_j.

    Computed as the equal form G/(G − 1)·(R_i − mean_{g(i)} R).

    Args:
        scores: `[B]` float, one reward per completion.
        group_ids: `[B]` int64 group labels.
        single_is_zero: a group of one row has no other row to compare with and gets
            A = 0 (per-turn credit: a turn only one episode of its group reached,
            docs/algorithms.md#turn-credit) instead of an error.

    Returns:
        `[B]` float, detached.

    Raises:
        ValueError: some group has fewer than 2 completions (and not `single_is_zero`).
    """
    dtype = scores.dtype
    scores = scores.detach().double()
    mean, _, group_size = group_mean_std(scores, group_ids)
    if single_is_zero:
        others = (group_size - 1).clamp(min=1).to(scores.dtype)
        return torch.where(group_size > 1, group_size / others * (scores - mean), 0.0).to(dtype)
    if group_size.min().item() < 2:
        raise ValueError(
            "RLOO needs at least 2 completions per prompt for its leave-one-out baseline, "
            f"but a group has group_size={group_size.min().item()}; "
            "sample group_size >= 2 completions per prompt"
        )
    group_size = group_size.to(scores.dtype)
    return (group_size / (group_size - 1.0) * (scores - mean)).to(dtype)


def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4,
) -> Tensor:
    """GRPO advantages A_i = (R_i − mean_{g(i)} R) / (std + ε) (docs/algorithms.md#grpo-and-dr-grpo).

    `scale` picks the std: "group" (GRPO), "batch" (std of all rewards in the
    batch), or "none" (Dr. GRPO: A_i = R_i − mean_{g(i)} R, which is RLOO's
    advantage times (G − 1)/G). A group whose rewards are all equal (a group of one
    included) gets exactly 0.

    Args:
        scores: `[B]` float, one reward per completion.
        group_ids: `[B]` int64 group labels.
        scale: "group", "batch" or "none".
        eps: ε added to the std.

    Returns:
        `[B]` float, detached.

    Raises:
        ValueError: unknown `scale`.
    """
    dtype = scores.dtype
    scores = scores.detach().double()
    mean, group_std, _ = group_mean_std(scores, group_ids)
    centred = scores - mean
    if scale == "none":
        return centred.to(dtype)
    if scale == "group":
        std = group_std
    elif scale == "batch":
        _, std, _ = group_mean_std(scores, torch.zeros_like(group_ids))
    else:
        raise ValueError(f"unknown GRPO scale {scale!r}; valid values are 'group', 'batch', 'none'")
    # A zero std means an all-equal group (centred is exactly 0): keep A = 0 even if eps = 0.
    return torch.where(std > 0, centred / (std + eps), 0.0).to(dtype)


def process_grpo_advantages(
    step_rewards: Tensor,
    step_mask: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    eps: float = 1e-4,
) -> Tensor:
    """GRPO with process supervision (docs/algorithms.md#process-supervision).

    Every step reward is normalised with the mean and std of all step rewards of its
    group (all rows, all steps); token t then gets the sum of the normalised rewards
    of its row's steps that end at or after t.

    Args:
        step_rewards: `[B, T]` float; the reward of a step sits at its last token.
        step_mask: `[B, T]` bool or float; 1 where a step ends (a reward is given).
            Only real tokens (`mask`) count.
        group_ids: `[B]` int64 group labels.
        mask: `[B, T]` bool or float; 1 for real completion tokens.
        eps: ε added to the group std.

    Returns:
        `[B, T]` float, detached, 0 where masked.
    """
    is_step = step_mask.bool() & mask.bool()
    rewards = step_rewards.detach()[is_step].double()
    step_group_ids = group_ids[:, None].expand_as(step_rewards)[is_step]
    mean, std, _ = group_mean_std(rewards, step_group_ids)
    normalised_steps = torch.where(std > 0, (rewards - mean) / (std + eps), 0.0)
    normalised_steps = normalised_steps.to(step_rewards.dtype)
    normalised = torch.zeros_like(step_rewards).masked_scatter(is_step, normalised_steps)
    reward_to_go = normalised.flip(-1).cumsum(-1).flip(-1)
    return torch.where(mask.bool(), reward_to_go, 0.0).detach()


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Copy a per-sequence value to every real token of its row.

    Args:
        seq_values: `[B]` float, e.g. RLOO / GRPO advantages.
        mask: `[B, T]` bool or float.

    Returns:
        `[B, T]` float, 0 where masked.
    """
    return torch.where(mask.bool(), seq_values[:, None], 0.0)


def whiten(
    x: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True, min_std: float = 0.0
) -> Tensor:
    """Standardise over masked entries: (x − mean)/(std + ε), std unbiased.

    Below `min_std` the entries are centred but not rescaled
    (docs/algorithms.md#broadcast-and-whitening): a batch whose advantages barely
    differ (every completion earned the same reward) holds the critic's noise, not
    signal, and dividing by its tiny std would blow that noise up to unit variance.

    Args:
        x: `[B, T]` float, e.g. advantages.
        mask: `[B, T]` bool or float.
        eps: ε added to the std.
        shift_mean: if False, add the mean back, so only the scale changes.
        min_std: the std from which the entries are rescaled (0: always).

    Returns:
        `[B, T]` float, 0 where masked.
    """
    wide = x.double()
    mean = masked_mean(wide, mask)
    std = masked_std(wide, mask)
    scale = torch.where(std >= min_std, std + eps, 1.0)
    whitened = (wide - mean) / scale
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, 0.0).to(x.dtype)
