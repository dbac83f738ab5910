"""GSPO (docs/algorithms.md#gspo): GRPO's advantage with one length-normalised ratio per sequence.

    s_i = exp( (1/T_i) sum_t mask * (lp - lp_old) )
    l_i = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)),  averaged over sequences

The clip ranges are tiny (paper: about 3e-4 / 4e-4) because ``s_i`` is a geometric
mean of token ratios. The per-sequence loss is copied to the row's tokens, so the
required ``seq-mean-token-mean`` aggregation returns ``(1/B) sum_i l_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmgym.agents.advantages import broadcast_to_tokens
from lmgym.agents.aggregation import Aggregation
from lmgym.agents.grpo import GRPO, GRPOConfig
from lmgym.agents.metrics import masked_mean
from lmgym.agents.ratios import gspo_loss


@dataclass
class GSPOConfig(GRPOConfig):
    clip_low: float = 3e-4
    """Lower clip half-width of the sequence ratio."""
    clip_high: float = 4e-4
    """Upper clip half-width of the sequence ratio."""
    loss_aggregation: Aggregation = "seq-mean-token-mean"
    """Must be seq-mean-token-mean: GSPO's loss is a mean over sequences."""


class GSPO(GRPO):
    """Group sequence policy optimization."""

    config_class = GSPOConfig
    name = "gspo"

    def check_config(self) -> None:
        super().check_config()
        if self.config.loss_aggregation != "seq-mean-token-mean":
            raise ValueError(
                f"loss_aggregation={self.config.loss_aggregation!r}: GSPO's loss is one term per "
                "sequence; use loss_aggregation='seq-mean-token-mean'"
            )
        if self.config.advantage != "outcome":
            raise ValueError("advantage='process' gives per-token advantages; GSPO needs 'outcome'")
        if self.config.turn_credit != "episode":
            raise ValueError(
                "turn_credit='turn' gives each turn its own advantage; GSPO's sequence ratio "
                "takes one per sequence: use turn_credit='episode', or GSPOToken"
            )

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        sequence_advantages = masked_mean(advantages, mask, dim=1)
        loss, seq_ratio = gspo_loss(
            logprobs,
            old_logprobs,
            sequence_advantages,
            mask,
            self.config.clip_low,
            self.config.clip_high,
        )
        return broadcast_to_tokens(loss, mask), broadcast_to_tokens(seq_ratio, mask)
