"""Turn credit in multi-turn episodes (docs/algorithms.md#turn-credit).

A multi-turn row's completion region interleaves the policy's turns with the
environment's observations (``RolloutBatch.policy_mask`` marks the policy's tokens);
the reward of turn ``k``, ``r_k``, sits at the turn's last token. Two ways to credit
a policy token of turn ``k``:

- ``"episode"`` (the default of every outcome method): the episode return
  ``R = Σ_j r_j``, the batch's ``scores``, as in a single-turn episode;
- ``"turn"``: the discounted return from its own turn on,
  ``G_k = Σ_{j ≥ k} γ_turn^(j − k)·r_j``. A turn is not credited with the rewards of
  the turns before it, which it cannot have caused. A group method compares ``G_k``
  with the same turn of its group's other episodes: its statistics (mean, std,
  leave-one-out) are taken per ``(group, k)`` over the rows that reached turn ``k``,
  so a turn only one episode of its group reached has nothing to be compared with
  and gets advantage 0.

A turn is a maximal run of policy tokens: it starts at a policy token whose
predecessor is not one (an observation token, or the prompt). An observation of no
tokens therefore joins the turns around it into one (their rewards summed). Turns are counted and
their returns computed with batched scatter, gather and a ``[K, K]`` matrix of
discounts (``K`` the batch's most turns), never a loop over rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

TurnCredit = Literal["episode", "turn"]
"""A ``turn_credit`` (the config field's type)."""
TURN_CREDITS: tuple[str, ...] = ("episode", "turn")

#: A group estimator on flat per-episode values: ``(scores [N], group_ids [N]) -> [N]``.
GroupEstimator = Callable[[Tensor, Tensor], Tensor]


@dataclass
class TurnCreditConfig:
    """The turn-credit fields of the outcome agents' configs (mixed into them)."""

    turn_credit: TurnCredit = "episode"
    """Multi-turn episodes: credit each policy token with the episode return (episode) or with its turn's discounted return to go, sum_{j>=k} turn_gamma^(j-k) r_j, compared with the same turn of the group's other episodes (turn). No effect on single-turn episodes."""
    turn_gamma: float = 1.0
    """Discount per turn of turn_credit='turn', in [0, 1]."""


def check_turn_credit(config: TurnCreditConfig) -> None:
    """Raise ``ValueError`` naming the field when ``turn_credit``/``turn_gamma`` are invalid."""
    if config.turn_credit not in TURN_CREDITS:
        raise ValueError(f"turn_credit={config.turn_credit!r} is not one of {list(TURN_CREDITS)}")
    if not 0.0 <= config.turn_gamma <= 1.0:
        raise ValueError(f"turn_gamma={config.turn_gamma}: must be in [0, 1]")


def turn_index(policy_mask: Tensor) -> Tensor:
    """The turn of each policy token.

    Args:
        policy_mask: ``[B, L] bool`` True on the policy's tokens.

    Returns:
        ``[B, L] int64``: 1 on the first turn's tokens, 2 on the second's, ...; 0 on
        observation tokens and padding.
    """
    previous = F.pad(policy_mask[:, :-1], (1, 0), value=False)
    starts = policy_mask & ~previous
    return torch.where(policy_mask, starts.long().cumsum(dim=1), 0)


def turn_rewards(rewards: Tensor, policy_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Each turn's reward: the sum of the rewards at its tokens.

    Args:
        rewards: ``[B, L] float`` per-token rewards (a turn's at its last token).
        policy_mask: ``[B, L] bool``.

    Returns:
        ``(turn_rewards [B, K] float, present [B, K] bool)``, ``K`` the most turns of
        any row (at least 1); ``present[i, k - 1]`` iff row ``i`` has a turn ``k``.
    """
    turns = turn_index(policy_mask)
    count = turns.max(dim=1).values
    k = max(int(count.max()), 1) if count.numel() else 1
    values = torch.where(policy_mask, rewards, 0.0)
    summed = rewards.new_zeros(rewards.shape[0], k + 1).scatter_add(1, turns, values)
    present = torch.arange(1, k + 1, device=rewards.device)[None, :] <= count[:, None]
    return summed[:, 1:], present


def discounted_turn_returns(turn_rewards: Tensor, gamma: float) -> Tensor:
    """``G_k = Σ_{j ≥ k} γ^(j − k)·r_j`` for every turn.

    Args:
        turn_rewards: ``[B, K] float`` (0 for turns a row does not have).
        gamma: the discount per turn.

    Returns:
        ``[B, K] float``.
    """
    k = turn_rewards.shape[1]
    turns = torch.arange(k, device=turn_rewards.device)
    ahead = turns[None, :] - turns[:, None]  # [k, j]: j - k
    powers = turn_rewards.new_full((k, k), gamma).pow(ahead.clamp(min=0))
    discount = torch.where(ahead >= 0, powers, 0.0)  # [k, j]: γ^(j - k) for j >= k
    return turn_rewards @ discount.T


def to_tokens(per_turn: Tensor, policy_mask: Tensor) -> Tensor:
    """Copy each turn's value to its policy tokens.

    Args:
        per_turn: ``[B, K] float``.
        policy_mask: ``[B, L] bool``.

    Returns:
        ``[B, L] float``, 0 off the policy's tokens.
    """
    turns = turn_index(policy_mask)
    padded = F.pad(per_turn, (1, 0))  # turn 0: observation tokens and padding
    return torch.where(policy_mask, padded.gather(1, turns), 0.0)


def turn_returns(rewards: Tensor, policy_mask: Tensor, gamma: float) -> Tensor:
    """``[B, L] float``: each policy token's discounted turn return ``G_k`` (0 elsewhere).

    Args:
        rewards: ``[B, L] float``.
        policy_mask: ``[B, L] bool``.
        gamma: the discount per turn.
    """
    per_turn, _ = turn_rewards(rewards, policy_mask)
    return to_tokens(discounted_turn_returns(per_turn, gamma), policy_mask)


def turn_group_advantages(
    rewards: Tensor,
    policy_mask: Tensor,
    group_ids: Tensor,
    gamma: float,
    estimator: GroupEstimator,
) -> Tensor:
    """A group estimator applied per turn: turn ``k`` of row ``i`` is compared with
    turn ``k`` of the other rows of its group that reached it.

    Args:
        rewards: ``[B, L] float`` per-token rewards.
        policy_mask: ``[B, L] bool`` the policy's tokens (the loss's).
        group_ids: ``[B] int64`` the rows' groups.
        gamma: the discount per turn.
        estimator: ``(scores [N], group_ids [N]) -> advantages [N]``, e.g.
            ``grpo_advantages``; it must give a group of one row advantage 0.

    Returns:
        ``[B, L] float`` detached advantages, 0 off the policy's tokens.
    """
    per_turn, present = turn_rewards(rewards.detach(), policy_mask)
    returns = discounted_turn_returns(per_turn, gamma)
    _, group = torch.unique(group_ids, return_inverse=True)
    k = per_turn.shape[1]
    cell = group[:, None] * k + torch.arange(k, device=group.device)[None, :]
    advantages = estimator(returns[present], cell[present])
    table = torch.zeros_like(returns).masked_scatter(present, advantages.to(returns.dtype))
    return to_tokens(table, policy_mask)
