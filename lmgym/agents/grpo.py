"""GRPO and Dr. GRPO: group-normalised advantages, PPO's token clip.

See docs/algorithms.md#grpo-and-dr-grpo and #kl-in-the-loss.

    A_i = (R_i - mean_{g(i)} R) / (std_{g(i)} R + 1e-4)       (Dr. GRPO: no division)
    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_i rho_t, -A_i clip(rho_t, 1 - clip_low, 1 + clip_high)) + beta * k3_t

Departures from the paper, all configurable: ``beta`` defaults to 0 (no reference
model is loaded; the paper used 0.04 with k3 in the loss). The update takes PPO's
schedule, 4 epochs x 2 minibatches at 3e-4 (``MultiStepConfig``), so the clip binds;
GRPO's ``clip_high`` is DAPO's clip-higher, 0.28, Dr. GRPO keeps 0.2
(docs/algorithms.md#update-schedule: why, measured). DAPO's other knobs:
``dynamic_sampling=True``, ``overlong_cache``, ``loss_aggregation="token-mean"``.

Process supervision (``advantage="process"``, per-token env mode): every token's
reward is a step reward, normalised across the group's steps; token t gets the sum
of the normalised rewards at or after t.

Multi-turn episodes: ``R_i`` is the episode return (the sum of its turn rewards);
``turn_credit="turn"`` gives turn ``k``'s tokens the discounted turn return ``G_k``,
normalised against turn ``k`` of the group's other episodes (docs/algorithms.md#turn-credit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from lmgym.agents.advantages import broadcast_to_tokens, grpo_advantages, process_grpo_advantages
from lmgym.agents.aggregation import Aggregation
from lmgym.agents.base import Agent
from lmgym.agents.config import MultiStepConfig, check_group_size
from lmgym.agents.metrics import masked_sum
from lmgym.agents.token_clip import TokenClip, TokenClipConfig
from lmgym.agents.turn_credit import TurnCreditConfig, check_turn_credit, turn_group_advantages
from lmgym.types import RolloutBatch


@dataclass
class GRPOConfig(TurnCreditConfig, TokenClipConfig, MultiStepConfig):
    loss_aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become a scalar (GRPO's paper: per-sequence mean)."""
    scale: Literal["group", "batch", "none"] = "group"
    """Advantage scale: group std (GRPO), batch std, or none (Dr. GRPO)."""
    advantage: Literal["outcome", "process"] = "outcome"
    """Outcome supervision (one reward per completion) or process supervision (step rewards)."""
    clip_high: float = 0.28
    """Upper clip half-width epsilon_high: DAPO's clip-higher, so an unlikely token with a positive advantage can grow further (docs/algorithms.md#update-schedule)."""


class GRPO(TokenClip, Agent[GRPOConfig]):
    """Group relative policy optimization."""

    config_class = GRPOConfig
    name = "grpo"

    def check_config(self) -> None:
        self.check_clip_range()
        if self.config.scale not in ("group", "batch", "none"):
            raise ValueError(
                f"scale={self.config.scale!r} is not one of ['group', 'batch', 'none']"
            )
        if self.config.advantage not in ("outcome", "process"):
            raise ValueError(
                f"advantage={self.config.advantage!r} is not one of ['outcome', 'process']"
            )
        if self.config.advantage == "process" and self.env.reward_mode != "per_token":
            raise ValueError(
                "advantage='process' needs step rewards: build the env with reward_mode='per_token'"
            )
        check_turn_credit(self.config)
        if self.config.advantage == "process" and self.config.turn_credit == "turn":
            raise ValueError(
                "turn_credit='turn' is outcome supervision by turns; advantage='process' "
                "already credits each step: use one of them (turn_credit='episode')"
            )
        check_group_size(
            self.env.group_size, f"{self.name} compares completions of the same prompt"
        )

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, None]:
        if self.config.advantage == "process":
            return process_grpo_advantages(rewards, mask, batch.group_ids, mask), None
        if self.config.turn_credit == "turn":
            scale = self.config.scale
            advantages = turn_group_advantages(
                rewards,
                mask,
                batch.group_ids,
                self.config.turn_gamma,
                lambda scores, cells: grpo_advantages(scores, cells, scale),
            )
            return advantages, None
        scores = masked_sum(rewards, mask, dim=1)  # where, not * mask: NaN * 0 is NaN
        advantages = grpo_advantages(scores, batch.group_ids, self.config.scale)
        return broadcast_to_tokens(advantages, mask), None


@dataclass
class DrGRPOConfig(GRPOConfig):
    scale: Literal["group", "batch", "none"] = "none"
    """Advantage scale: none (Dr. GRPO removes the std division)."""
    loss_aggregation: Aggregation = "seq-mean-token-sum-norm"
    """Fixed-length normalisation sum(l) / (B * L_max) (Dr. GRPO)."""
    clip_high: float = 0.2
    """Upper clip half-width epsilon_high (the paper's symmetric 0.2; GRPO's default is DAPO's 0.28)."""


class DrGRPO(GRPO):
    """Dr. GRPO: GRPO without the std division and with a constant normaliser.

    Its advantage is RLOO's times (G - 1)/G (docs/algorithms.md#grpo-and-dr-grpo).
    """

    config_class = DrGRPOConfig
    name = "drgrpo"
