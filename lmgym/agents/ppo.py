"""PPO with GAE and a learned critic (docs/algorithms.md#token-clip, #gae, #value-loss).

    r_t <- r_t - beta * (lp_old_t - lp_ref_t)                       (KL in the reward)
    delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t
    A_t = delta_t + gamma lambda (1 - done_t) A_{t+1},   R_t = A_t + V_t
    rho_t = exp(lp_t - lp_old_t)
    l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high))
          + vf_coef * 1/2 max((V - R)^2, (V_old + clip(V - V_old, +-value_clip) - R)^2)

The critic is a linear value head on the policy's trunk (``value_model="shared"``,
one forward pass serves both losses) or on a separate copy of the initial model
(``"separate"``). ``value_init="zeros"`` starts from V = 0. Advantages are
whitened by default, as in most RLHF PPO implementations, but only centred when their
std is below ``whiten_min_std`` (a batch without reward spread holds critic noise,
which whitening would blow up to a full-sized update; docs/algorithms.md#broadcast-and-whitening).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from lmgym.agents.advantages import gae
from lmgym.agents.aggregation import aggregate
from lmgym.agents.base import Agent
from lmgym.agents.config import KLPlacement, MultiStepConfig
from lmgym.agents.records import Counts, PolicyOutput, PreparedBatch
from lmgym.agents.token_clip import TokenClip, TokenClipConfig
from lmgym.agents.value import clipped_value_loss
from lmgym.policy.value import Critic, ValueInit
from lmgym.types import RolloutBatch


@dataclass
class PPOConfig(TokenClipConfig, MultiStepConfig):
    whiten_advantages: bool = True
    """Normalise advantages to zero mean, unit std over real tokens."""
    whiten_min_std: float = 0.1
    """Whitening rescales only when the advantages' std reaches this (in reward units); below it they are centred only: on a batch without reward spread the advantages are the critic's errors, and whitened they made a full-sized update (docs/algorithms.md#broadcast-and-whitening)."""
    kl_placement: KLPlacement = "reward"
    """Where the KL term goes: the per-token reward (classic RLHF PPO) or the loss."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo returns."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    value_clip: float | None = 0.2
    """Value clipping range epsilon_v around the rollout-time values; None disables it."""
    value_model: Literal["shared", "separate"] = "shared"
    """Critic on the policy's trunk (shared) or on a separate copy of the model."""
    value_init: ValueInit = "zeros"
    """Initialisation of the value head: zeros (V = 0) or normal."""


class PPO(TokenClip, Agent[PPOConfig]):
    """Proximal policy optimization with generalized advantage estimation."""

    config_class = PPOConfig
    name = "ppo"
    uses_critic = True

    def check_config(self) -> None:
        cfg = self.config
        self.check_clip_range()
        if cfg.value_model not in ("shared", "separate"):
            raise ValueError(
                f"value_model={cfg.value_model!r}: PPO needs a critic, 'shared' (value head on "
                "the policy trunk) or 'separate'; for a critic-free method use GRPO or RLOO"
            )
        if not 0.0 <= cfg.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda={cfg.gae_lambda}: must be in [0, 1]")
        if cfg.vf_coef <= 0:
            raise ValueError(f"vf_coef={cfg.vf_coef}: must be > 0, or the critic never learns")
        if cfg.value_clip is not None and cfg.value_clip <= 0:
            raise ValueError(f"value_clip={cfg.value_clip}: must be > 0 or None")

    def make_critic(self) -> Critic:
        return Critic(
            self.policy, shared=self.config.value_model == "shared", init=self.config.value_init
        )

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        assert values is not None
        return gae(rewards, values, batch.dones, mask, self.config.gamma, self.config.gae_lambda)

    def extra_losses(
        self, data: PreparedBatch, out: PolicyOutput, counts: Counts
    ) -> dict[str, tuple[float, Tensor]]:
        """The critic's clipped value loss, token-mean over the minibatch, times ``vf_coef``."""
        assert out.values is not None and data.values is not None and data.returns is not None
        value_tokens = clipped_value_loss(
            out.values, data.values, data.returns, self.config.value_clip
        )
        value_loss = aggregate(
            value_tokens,
            data.mask,
            "token-mean",
            num_sequences=counts.sequences,
            num_tokens=counts.tokens,
            max_len=counts.max_len,
        )
        return {"value_loss": (self.config.vf_coef, value_loss)}
