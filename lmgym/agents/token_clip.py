"""PPO's token clip as an agent's ratio rule, for the agents that use it unchanged.

    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high))

PPO, GRPO (and Dr. GRPO) and REINFORCE++ differ in their advantages, not in this
rule; a mixin gives them one copy of it.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lmgym.agents.ratios import clipped_surrogate_loss


class TokenClip:
    """Mixin for an ``Agent`` whose config has ``clip_low`` and ``clip_high``:
    ``policy_loss`` is PPO's token clip and ``clip_range`` reports its interval.

    List it before ``Agent``: ``class GRPO(TokenClip, Agent[GRPOConfig])``.
    """

    config: Any

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        return clipped_surrogate_loss(
            logprobs, old_logprobs, advantages, self.config.clip_low, self.config.clip_high
        )

    def clip_range(self) -> tuple[float, float]:
        return self.config.clip_low, self.config.clip_high
