"""REINFORCE++ (Hu et al. 2025): REINFORCE with PPO's tricks and no critic.

    r_t <- r_t - beta * (lp_old_t - lp_ref_t)                   (k1 KL in the reward)
    G_t = sum_{t' >= t} gamma^(t'-t) r_t'                          (returns-to-go)
    A_t = (G_t - mean_batch G) / (std_batch G + 1e-8)              (global batch z-score)
    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high)),   token-mean

The paper (arXiv 2501.03262, v1 "REINFORCE++: A Simple and Efficient Approach for
Aligning Large Language Models") writes the advantage of a bandit reward as
``A_t = r(x, y) - beta * sum_{i >= t} KL(i)``, ``KL(i) = log(pi_old / pi_SFT)`` of the
sampled token: the returns-to-go above with gamma = 1, its default here. The z-score
runs over every completion token of the whole rollout batch (the learn loop's
``whiten_advantages``, once before the minibatches, so it is global, not per
minibatch; masked rows keep their tokens in the statistics, as in every lmgym
whitening). No groups are needed: ``group_size=1`` is the paper's setting.

Departures, all configurable: ``beta`` defaults to 0 (no reference model is loaded;
the paper's runs use a small positive beta with a reference); the paper's mini-batch
updates are the default, PPO's 4 epochs x 2 minibatches at 3e-4 (``MultiStepConfig``,
docs/algorithms.md#update-schedule); the paper's optional reward
normalisation and clipping are left out. The later "REINFORCE++-baseline" variant
(group-mean baseline, k2 KL in the loss) is not this agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmgym.agents.advantages import discounted_returns
from lmgym.agents.base import Agent
from lmgym.agents.config import KLPlacement, MultiStepConfig
from lmgym.agents.token_clip import TokenClip, TokenClipConfig
from lmgym.types import RolloutBatch


@dataclass
class REINFORCEPPConfig(TokenClipConfig, MultiStepConfig):
    kl_placement: KLPlacement = "reward"
    """Where the KL term goes: the per-token reward (REINFORCE++'s k1 penalty) or the loss."""
    whiten_advantages: bool = True
    """REINFORCE++'s global normalisation: z-score the returns over the whole batch's tokens."""
    whiten_min_std: float = 0.1
    """Rescale only advantages whose std reaches this (reward units); below it they are centred only. At several steps per batch a near-solved batch's few differences, rescaled to unit variance, moved LengthControl off its solution on 2 of 5 seeds (docs/algorithms.md#update-schedule)."""


class REINFORCEPP(TokenClip, Agent[REINFORCEPPConfig]):
    """REINFORCE++: returns-to-go normalised over the global batch, PPO's token clip."""

    config_class = REINFORCEPPConfig
    name = "reinforce_pp"

    def check_config(self) -> None:
        self.check_clip_range()

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, None]:
        return discounted_returns(rewards, mask, self.config.gamma, batch.dones), None
