"""GSPO-token (Zheng et al. 2025, "Group Sequence Policy Optimization"): GSPO's sequence
ratio with a gradient per token, so advantages may differ between tokens.

    s_i = exp( (1/T_i) sum_t mask * (lp - lp_old) )
    s_{i,t} = sg(s_i) * exp(lp_{i,t} - sg(lp_{i,t}))           (= s_i in value)
    l_{i,t} = max(-A_{i,t} s_{i,t}, -A_{i,t} clip(s_{i,t}, 1 - clip_low, 1 + clip_high))
    loss = (1/B) sum_i (1/T_i) sum_t l_{i,t}                    (seq-mean-token-mean)

``grad s_{i,t} = s_i grad lp_{i,t}``, so with ``A_{i,t} = A_i`` (outcome supervision,
the default) the gradient is exactly GSPO's; the clip decision is per sequence either
way, because every token of row i carries the same ratio value. Per-token advantages
come from GRPO's process supervision (``advantage="process"``, a per-token env),
which GSPO refuses. Clip ranges default to GSPO's (3e-4 / 4e-4).

Unlike GSPO, any aggregation is accepted (the loss is per token); the paper's is the
default. Where the numerical guard clamps a row's mean log-ratio (|.| > 20), GSPO
gives the row no gradient and GSPO-token keeps one (``ratios.gspo_token_ratio``);
normal training never gets there.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmgym.agents.aggregation import Aggregation
from lmgym.agents.grpo import GRPO
from lmgym.agents.gspo import GSPOConfig
from lmgym.agents.ratios import clip_objective, gspo_token_ratio


@dataclass
class GSPOTokenConfig(GSPOConfig):
    loss_aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become a scalar (GSPO's paper: per-sequence mean; any mode works)."""


class GSPOToken(GRPO):
    """GSPO-token: the sequence ratio, token-level gradients and advantages."""

    config_class = GSPOTokenConfig
    name = "gspo_token"

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        ratio = gspo_token_ratio(logprobs, old_logprobs, mask)
        loss = clip_objective(ratio, advantages, self.config.clip_low, self.config.clip_high)
        return loss, ratio.detach()
