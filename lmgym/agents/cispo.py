"""CISPO (docs/algorithms.md#cispo): clip the importance weight, not the objective; every token keeps its gradient.

    rho_t = exp(lp_t - lp_old_t)
    w_t = sg( clip(rho_t, 1 - weight_low, 1 + weight_high) )
    l_t = -w_t * A_i * lp_t

Unlike PPO's clip, a token outside the band still gets the gradient ``-w_t A_i``.
The bounds have their own names (``weight_low``/``weight_high``), distinct from
PPO's epsilon. Defaults: ``weight_low=1.0`` (lower bound 0: no lower bound, as in
MiniMax-M1) and ``weight_high=1.0`` (weights capped at 2). Mapping to other forms:
a library that caps only above at an absolute value ``eps_max`` is
``weight_low=1, weight_high=eps_max - 1``; one that drops the stop-gradient
zeroes clipped tokens' gradients and is not CISPO (see ``ratios.cispo_loss``).
Advantages are GRPO's; aggregation is per token, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmgym.agents.aggregation import Aggregation
from lmgym.agents.grpo import GRPO, GRPOConfig
from lmgym.agents.ratios import cispo_loss


@dataclass
class CISPOConfig(GRPOConfig):
    learning_rate: float = 5e-4
    """AdamW learning rate (two steps per batch, between GRPO's 8 at 3e-4 and one step at 1e-3)."""
    update_epochs: int = 2
    """Passes over each rollout batch: two, not GRPO's 4 (docs/algorithms.md#update-schedule: at 8 steps per batch CISPO fell into TargetString's trap on seed 0, at one step it kept LengthControl on 2 of 5 seeds)."""
    num_minibatches: int = 1
    """Optimizer steps per epoch."""
    loss_aggregation: Aggregation = "token-mean"
    """Per-token mean, as in MiniMax-M1."""
    weight_low: float = 1.0
    """The IS weight is clipped below at 1 - weight_low (1.0: no lower bound)."""
    weight_high: float = 1.0
    """The IS weight is clipped above at 1 + weight_high."""


class CISPO(GRPO):
    """Clipped importance sampling policy optimization."""

    config_class = CISPOConfig
    name = "cispo"
    clip_zeroes_gradient = False
    clip_rule = staticmethod(cispo_loss)
    clip_fields = ("weight_low", "weight_high")
