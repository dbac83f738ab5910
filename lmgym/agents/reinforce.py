"""REINFORCE (docs/algorithms.md#reinforce): per-token returns minus a baseline, one policy-gradient step.

    G_t = sum_{t' >= t} gamma^(t'-t) r_t'        A_t = G_t - b        l_t = -A_t * lp_t

Baselines: none, the batch mean of returns, or an exponential moving average of
returns across batches. There is no policy ratio: with ``tis_cap`` set, TIS is
the only off-policy correction (docs/algorithms.md#tis).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from lmgym.agents.advantages import (
    EMABaseline,
    batch_mean_baseline,
    discounted_returns,
    reinforce_advantages,
)
from lmgym.agents.base import Agent
from lmgym.agents.config import AgentConfig
from lmgym.agents.ratios import policy_gradient_loss
from lmgym.types import RolloutBatch


@dataclass
class REINFORCEConfig(AgentConfig):
    baseline: Literal["none", "batch_mean", "ema"] = "batch_mean"
    """Baseline b subtracted from the returns: none, batch_mean or ema."""
    ema_decay: float = 0.9
    """Decay of the EMA baseline (baseline='ema')."""


class REINFORCE(Agent[REINFORCEConfig]):
    """REINFORCE with a baseline; the advantage is per token (reward-to-go)."""

    config_class = REINFORCEConfig
    name = "reinforce"

    def check_config(self) -> None:
        if self.config.baseline not in ("none", "batch_mean", "ema"):
            raise ValueError(
                f"baseline={self.config.baseline!r} is not one of ['none', 'batch_mean', 'ema']"
            )
        self._ema = EMABaseline(decay=self.config.ema_decay)

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, None]:
        returns = discounted_returns(rewards, mask, self.config.gamma, batch.dones)
        if self.config.baseline == "batch_mean":
            baseline: Tensor | float = batch_mean_baseline(returns, mask)
        elif self.config.baseline == "ema":
            baseline = self._ema.value  # the past's average, then fold this batch in
            self._ema.update(batch_mean_baseline(returns, mask))
        else:
            baseline = 0.0
        return reinforce_advantages(returns, mask, baseline), None

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, None]:
        return policy_gradient_loss(logprobs, advantages), None
