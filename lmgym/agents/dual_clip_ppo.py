"""Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
Reinforcement Learning"): PPO whose loss is bounded for negative advantages.

    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high))     A_t >= 0
    l_t = min( max(-A_t rho_t, -A_t clip(rho_t, ...)), -c A_t )               A_t < 0

Everything else is PPO's (GAE, critic, KL in the reward, whitening, 4 epochs x 2
minibatches). With ``A < 0`` PPO's loss ``-A rho`` grows without bound in ``rho``:
one token whose ratio exploded (stale or off-policy data) can dominate the update.
The dual clip caps it at ``-c A``; it binds where ``rho > c`` and gives those tokens
no gradient. ``c > 1`` (default 3, the paper's) keeps it from ever binding at
``rho = 1``. The paper states the bound as ``max(min(rho A, clip(rho) A), c A)`` on
the objective; this is the same bound on the loss, its negation.

Metrics: PPO's ``clip_fraction``; ``dual_clip_fraction``, the share of tokens the
dual clip bound (``A < 0``, ``rho > c``); ``clip_zeroed_fraction`` counts every
token whose gradient either clip zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmgym.agents.metrics import masked_mean
from lmgym.agents.ppo import PPO, PPOConfig
from lmgym.agents.ratios import clipped_surrogate_loss


@dataclass
class DualClipPPOConfig(PPOConfig):
    dual_clip_c: float = 3.0
    """The dual clip c > 1: for A < 0 the per-token loss is capped at -c * A."""


class DualClipPPO(PPO):
    """PPO with the dual clip on negative advantages."""

    config_class = DualClipPPOConfig
    name = "dual_clip_ppo"

    def check_config(self) -> None:
        super().check_config()
        if self.config.dual_clip_c <= 1.0:
            raise ValueError(
                f"dual_clip_c={self.config.dual_clip_c}: must be > 1, or the bound -c*A binds "
                "at ratio 1 and on-policy tokens with A < 0 lose their gradient (paper: 3)"
            )

    def clip_metrics(self, ratio: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
        metrics = super().clip_metrics(ratio, advantages, mask)
        dual = (advantages < 0) & (ratio > self.config.dual_clip_c)
        metrics["dual_clip_fraction"] = masked_mean(dual.float(), mask).item()
        # Disjoint from the tokens PPO's clip zeroed (those have rho < 1 - eps when A < 0).
        metrics["clip_zeroed_fraction"] += metrics["dual_clip_fraction"]
        return metrics

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        return clipped_surrogate_loss(
            logprobs,
            old_logprobs,
            advantages,
            *self.clip_range(),
            dual_clip=self.config.dual_clip_c,
        )
