"""RLOO (docs/algorithms.md#rloo): REINFORCE with a leave-one-out baseline over each group.

    R_i = sum_t r_{i,t}   (KL already subtracted from r when beta > 0)
    A_i = R_i - mean_{j in g(i), j != i} R_j = G/(G-1) * (R_i - mean_{g(i)} R)
    rho_{i,t} = exp(lp_{i,t} - lp_old_{i,t})
    l_{i,t} = max(-A_i rho_{i,t}, -A_i clip(rho_{i,t}, 1 - clip_low, 1 + clip_high))

The advantage is sequence-level: every token of a completion gets the same A_i.
Like classic RLHF, the KL penalty sits in the reward (``kl_placement="reward"``).
Needs ``group_size >= 2``.

The update takes PPO's schedule (``MultiStepConfig``, 4 epochs x 2 minibatches at
3e-4) under PPO's token clip, as TRL's and verl's RLOO do: at one step per batch
the LengthControl task stayed unsolved on 5 of 5 seeds, at the schedule without a
clip it was lost again on some, with both it is kept on 5 of 5
(docs/algorithms.md#update-schedule). With ``update_epochs=1, num_minibatches=1``
the ratio is 1, the clip never binds, and the loss has the paper's gradient
``-A_i * grad lp_{i,t}``.

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
from lmgym.agents.config import KLPlacement, MultiStepConfig, check_group_size
from lmgym.agents.metrics import masked_sum
from lmgym.agents.token_clip import TokenClip, TokenClipConfig
from lmgym.agents.turn_credit import TurnCreditConfig, check_turn_credit, turn_group_advantages
from lmgym.types import RolloutBatch


@dataclass
class RLOOConfig(TurnCreditConfig, TokenClipConfig, MultiStepConfig):
    kl_placement: KLPlacement = "reward"
    """Where the KL term goes: subtracted from the rewards (RLOO's default) or added to the loss."""


class RLOO(TokenClip, Agent[RLOOConfig]):
    """REINFORCE leave-one-out, under PPO's token clip."""

    config_class = RLOOConfig
    name = "rloo"

    def check_config(self) -> None:
        why = "RLOO needs at least 2 completions per prompt for its leave-one-out baseline"
        check_group_size(self.env.group_size, why)
        check_turn_credit(self.config)
        self.check_clip_range()

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
        scores = masked_sum(rewards, mask, dim=1)  # where, not * mask: NaN * 0 is NaN
        return broadcast_to_tokens(rloo_advantages(scores, batch.group_ids), mask), None
