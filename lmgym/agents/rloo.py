"""RLOO (docs/algorithms.md#rloo): REINFORCE with a leave-one-out baseline over each group.

    R_i = sum_t r_{i,t}   (KL already subtracted from r when beta > 0)
    A_i = R_i - mean_{j in g(i), j != i} R_j = G/(G-1) * (R_i - mean_{g(i)} R)
    l_{i,t} = -A_i * lp_{i,t}

The advantage is sequence-level: every token of a completion gets the same A_i.
Like classic RLHF, the KL penalty sits in the reward (``kl_placement="reward"``).
Needs ``group_size >= 2``.

Multi-turn episodes: ``R_i`` is the episode return; ``turn_credit="turn"`` gives turn
``k``'s tokens the discounted turn return ``G_k`` minus the mean ``G_k`` of the other
episodes of the group that reached turn ``k`` (0 if none did;
docs/algorithms.md#turn-credit).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmgym.agents.advantages import broadcast_to_tokens, rloo_advantages
from lmgym.agents.base import Agent
from lmgym.agents.config import AgentConfig, KLPlacement, check_group_size
from lmgym.agents.ratios import policy_gradient_loss
from lmgym.agents.turn_credit import TurnCreditConfig, check_turn_credit, turn_group_advantages
from lmgym.types import RolloutBatch


@dataclass
class RLOOConfig(TurnCreditConfig, AgentConfig):
    kl_placement: KLPlacement = "reward"
    """Where the KL term goes: subtracted from the rewards (RLOO's default) or added to the loss."""


class RLOO(Agent[RLOOConfig]):
    """REINFORCE leave-one-out."""

    config_class = RLOOConfig
    name = "rloo"

    def check_config(self) -> None:
        why = "RLOO needs at least 2 completions per prompt for its leave-one-out baseline"
        check_group_size(self.env.group_size, why)
        check_turn_credit(self.config)

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, None]:
        if self.config.turn_credit == "turn":
            advantages = turn_group_advantages(
                rewards,
                mask,
                batch.group_ids,
                self.config.turn_gamma,
                lambda scores, cells: rloo_advantages(scores, cells, single_is_zero=True),
            )
            return advantages, None
        scores = (rewards * mask).sum(dim=1)
        return broadcast_to_tokens(rloo_advantages(scores, batch.group_ids), mask), None

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, None]:
        return policy_gradient_loss(logprobs, advantages), None
