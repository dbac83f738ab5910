"""An agent's clipped ratio rule, its interval read from two config fields.

    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high))     (the default)

PPO, GRPO (and Dr. GRPO), REINFORCE++, RLOO and ReMax differ in their advantages,
not in this rule; CISPO clips its importance weight over an interval of the same form under
its own names (``weight_low``, ``weight_high``). A mixin gives them one copy of the
``policy_loss`` / ``clip_range`` pair and ``check_clip_range``, ``check_clip`` on that
interval, which each of them runs on its config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from lmgym.agents.ratios import clipped_surrogate_loss


@dataclass
class TokenClipConfig:
    """The clip interval's fields, mixed into the configs of the agents that use the
    token clip (PPO's family, GRPO's, REINFORCE++, RLOO, ReMax); an agent overrides a
    default in its own config (GRPO's and ReMax's clip-higher)."""

    clip_low: float = 0.2
    """Lower clip half-width epsilon_low: the ratio is clipped at 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip half-width epsilon_high: the ratio is clipped at 1 + clip_high."""


def check_clip(
    low: float, high: float, low_name: str = "clip_low", high_name: str = "clip_high"
) -> None:
    """Clip half-widths must be >= 0, and the lower bound ``1 - low`` must stay >= 0."""
    if low < 0 or high < 0:
        raise ValueError(f"{low_name}={low}, {high_name}={high}: clip ranges must be >= 0")
    if low > 1:
        raise ValueError(f"{low_name}={low}: must be <= 1 (the lower bound is 1 - {low_name})")


class TokenClip:
    """Mixin for an ``Agent``: ``policy_loss`` is ``clip_rule`` over the interval of the
    config fields ``clip_fields``, and ``clip_range`` reports that interval.

    The default is PPO's token clip over ``clip_low`` / ``clip_high``; a rule of the
    same form sets both class attributes (CISPO: ``ratios.cispo_loss`` over
    ``weight_low`` / ``weight_high``). List it before ``Agent``:
    ``class GRPO(TokenClip, Agent[GRPOConfig])``.
    """

    config: Any
    clip_fields: ClassVar[tuple[str, str]] = ("clip_low", "clip_high")
    """The config fields of the interval's lower and upper half-widths."""
    clip_rule: ClassVar[Callable[..., tuple[Tensor, Tensor]]] = staticmethod(clipped_surrogate_loss)
    """``(logprobs, old_logprobs, advantages, low, high) -> (loss [b, L], ratio [b, L])``."""

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.clip_rule(logprobs, old_logprobs, advantages, *self.clip_range())

    def clip_range(self) -> tuple[float, float]:
        low, high = self.clip_fields
        return getattr(self.config, low), getattr(self.config, high)

    def check_clip_range(self) -> None:
        """``check_clip`` on this agent's interval, errors naming its own config fields."""
        check_clip(*self.clip_range(), *self.clip_fields)
