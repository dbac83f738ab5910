"""VAPO: PPO with a value model, made reliable by value pretraining, decoupled and
length-adaptive GAE, and DAPO's pieces.

    warmup (iterations < value_warmup_iterations): the critic alone learns R_t below
        with lambda_critic = 1 (Monte-Carlo returns); the policy is frozen
    R_t = GAE(lambda_critic)_t + V_t                      value targets (lambda_critic = 1)
    A_t = GAE(lambda_i)_t,  lambda_i = 1 - 1/(alpha T_i)  per row, clamped to [0, 1]
    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high))   (0.2, 0.28)
    L = token-mean(l) + vf_coef * L_V + nll_coef * L_NLL
    L_NLL = -(1 / sum_{i in P} T_i) sum_{i in P} sum_t lp_{i,t}
        P = the positive examples: completions whose score >= positive_threshold

``L_V`` is PPO's clipped value loss; advantages are whitened (PPO's default).

Yue et al., "VAPO: Efficient and Reliable Reinforcement Learning for Advanced
Reasoning Tasks" (ByteDance Seed, 2025). Of its seven modifications to PPO this
agent has value pretraining, decoupled GAE (lambda_critic = 1), length-adaptive
GAE (alpha = 0.05), clip-higher (0.2 / 0.28), the token-level loss and the
positive-example LM loss (mu = 0.1); group sampling (several completions per
prompt) is the env's ``group_size``.

Departures from the paper:

- Value pretraining runs inside ``learn``: the first ``value_warmup_iterations``
  iterations sample from the initial policy and update only the critic (the
  paper pretrains ~50 steps from the SFT policy before RL). The policy's
  parameters have ``requires_grad`` off for those updates, so they get no
  gradient and the optimizer skips them (no step, no weight decay, no Adam
  state); the policy terms are still computed and logged. With a shared critic
  only its head learns then. The metric ``value_warmup`` is 1 in warmup, else 0.
- The critic is a copy of the initial policy with a fresh value head
  (``value_model="separate"``; the paper initialises it from the reward model),
  and shares the policy's learning rate (the paper's critic has its own).
- ``lambda_i`` is clamped to ``[0, 1]``: where ``alpha T_i < 1`` (``T_i < 20`` at
  ``alpha = 0.05``; the paper's completions are thousands of tokens) it would be
  negative, and is 0 (one-step TD). Short tasks want a larger ``alpha``.
- The paper's positive examples are the verifier's correct answers; here a
  completion whose env score reaches ``positive_threshold`` (1.0, a correct answer
  of the built-in [0, 1] tasks), up to float32 rounding.
- ``L_NLL``'s normaliser: every term of the loop is normalised by the minibatch's
  loss tokens (so micro-batching cannot change it), so a positive row's tokens
  weigh ``N / N_P`` (``N``, ``N_P``: the batch's loss tokens and positive tokens).
  With one minibatch that is the paper's mean over positive tokens; with several,
  each minibatch uses the batch's ratio.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lmgym.agents.advantages import gae, length_adaptive_lambda
from lmgym.agents.aggregation import aggregate
from lmgym.agents.ppo import PPO, PPOConfig
from lmgym.agents.records import Counts, PolicyOutput, PreparedBatch
from lmgym.distributed import DataParallelGroup
from lmgym.types import RolloutBatch

SCORE_TOLERANCE = 1e-6
"""Slack on ``positive_threshold``: per-token rewards add up to the score only up to float32 rounding."""


@dataclass
class VAPOConfig(PPOConfig):
    clip_high: float = 0.28
    """Upper clip half-width epsilon_high (clip-higher)."""
    value_model: Literal["shared", "separate"] = "separate"
    """Critic on a separate copy of the initial model (VAPO) or on the policy's trunk (shared)."""
    gae_lambda: float = 0.95
    """The policy's GAE lambda when length_alpha is None."""
    length_alpha: float | None = 0.05
    """Length-adaptive GAE: row i's policy lambda is 1 - 1/(alpha * T_i), T_i its policy tokens, clamped to [0, 1]; None uses gae_lambda."""
    critic_lambda: float = 1.0
    """GAE lambda of the value targets (decoupled GAE; 1 is Monte-Carlo returns)."""
    value_warmup_iterations: int = 50
    """Value pretraining: the first iterations train only the critic, on Monte-Carlo returns."""
    nll_coef: float = 0.1
    """Weight mu of the positive-example LM loss (0 disables it)."""
    positive_threshold: float = 1.0
    """A completion is a positive example for the LM loss when its score is at least this."""


@dataclass(frozen=True)
class VAPOBatch(PreparedBatch):
    """A ``PreparedBatch`` with each row's weight in the positive-example LM loss.

    Attributes:
        nll_weights: ``[B] float32``, ``N / N_P`` for a positive row, else 0.
    """

    nll_weights: Tensor


def positive_weights(
    scores: Tensor, mask: Tensor, threshold: float, group: DataParallelGroup | None = None
) -> Tensor:
    """Each row's weight in the positive-example LM loss: ``N / N_P`` if positive, else 0.

    Args:
        scores: ``[B] float`` episode scores.
        mask: ``[B, L] bool`` loss tokens (``N`` is their count, ``N_P`` that of the
            positive rows).
        threshold: a row is positive when its score is at least this (less
            ``SCORE_TOLERANCE``).
        group: data-parallel learners: ``N`` and ``N_P`` are summed over them.

    Returns:
        ``[B] float32``; all 0 when no row is positive.
    """
    positive = scores >= threshold - SCORE_TOLERANCE
    tokens = mask.sum(dim=1).float()
    counts = torch.stack([tokens.sum(), tokens[positive].sum()])
    if group is not None:
        counts = group.all_reduce_sum(counts)
    return torch.where(positive, counts[0] / counts[1].clamp_min(1.0), 0.0)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Turn ``requires_grad`` off on ``module``'s trainable parameters for the block."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


class VAPO(PPO):
    """Value-model-based augmented PPO."""

    config_class = VAPOConfig  # type: ignore[assignment]
    name = "vapo"
    config: VAPOConfig

    def check_config(self) -> None:
        super().check_config()
        cfg = self.config
        if not 0.0 <= cfg.critic_lambda <= 1.0:
            raise ValueError(f"critic_lambda={cfg.critic_lambda}: must be in [0, 1]")
        if cfg.length_alpha is not None and cfg.length_alpha <= 0:
            raise ValueError(
                f"length_alpha={cfg.length_alpha}: must be > 0, or None for a fixed gae_lambda"
            )
        if cfg.value_warmup_iterations < 0:
            raise ValueError(
                f"value_warmup_iterations={cfg.value_warmup_iterations}: must be >= 0 "
                "(0 skips value pretraining)"
            )
        if cfg.nll_coef < 0:
            raise ValueError(f"nll_coef={cfg.nll_coef}: must be >= 0 (0 disables the LM loss)")
        self._positive_fraction = 0.0

    def warming_up(self) -> bool:
        """Whether the current iteration is a value-pretraining one."""
        return self.iteration < self.config.value_warmup_iterations

    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO's update; in value pretraining, with the policy's parameters frozen."""
        warmup = self.warming_up()
        with frozen(self.policy.model) if warmup else nullcontext():
            metrics = super().train_on_batch(batch)
        metrics["value_warmup"] = float(warmup)
        metrics["positive_fraction"] = self._positive_fraction
        return metrics

    def prepare(self, batch: RolloutBatch) -> VAPOBatch:
        """PPO's prepared batch plus the positive-example weights ``N / N_P``."""
        data = super().prepare(batch)
        weights = positive_weights(
            batch.scores, data.mask, self.config.positive_threshold, self.group
        )
        positive, rows = self.group.all_reduce_sum(
            torch.tensor([float((weights > 0).sum()), float(weights.numel())])
        ).tolist()
        self._positive_fraction = positive / max(rows, 1.0)
        return VAPOBatch(**vars(data), nll_weights=weights)

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Policy advantages with the per-row lambda, value targets with ``critic_lambda``
        (1 in value pretraining)."""
        assert values is not None
        cfg = self.config
        critic_lambda = 1.0 if self.warming_up() else cfg.critic_lambda
        _, returns = gae(rewards, values, batch.dones, mask, cfg.gamma, critic_lambda)
        lam: float | Tensor = cfg.gae_lambda
        if cfg.length_alpha is not None:
            lam = length_adaptive_lambda(mask.sum(dim=1), cfg.length_alpha)  # policy tokens
        advantages, _ = gae(rewards, values, batch.dones, mask, cfg.gamma, lam)
        return advantages, returns

    def extra_losses(
        self, data: PreparedBatch, out: PolicyOutput, counts: Counts
    ) -> dict[str, tuple[float, Tensor]]:
        """PPO's value loss, and after value pretraining the positive-example LM loss."""
        terms = super().extra_losses(data, out, counts)
        if self.config.nll_coef > 0 and not self.warming_up():
            assert isinstance(data, VAPOBatch)
            nll = aggregate(
                -out.logprobs * data.nll_weights[:, None],
                data.mask,
                "token-mean",
                num_sequences=counts.sequences,
                num_tokens=counts.tokens,
                max_len=counts.max_len,
            )
            terms["nll_loss"] = (self.config.nll_coef, nll)
        return terms
