"""What the update needs that does not change during it (``Agent.prepare``).

From a ``RolloutBatch``: the teacher-forced ``lp_old`` (recomputed, or left to the
update's own first forward pass), ``lp_ref`` and ``V_old``; the rewards with DAPO's
overlong shaping and, when the KL sits in the reward, ``- beta * k1``; then the
algorithm's advantages (whitened if asked). Advantages are computed on the union
batch of every data-parallel rank, so batch-wide statistics are global; each rank
keeps its own rows. Masked rows keep their real score in every statistic and leave
the loss only (docs/algorithms.md#conventions).

Multi-turn batches: the teacher-forced passes run over the whole interleaved
sequence once (the attention mask of every real token), but the loss mask, the KL
in the reward, the advantages and the whitening see the policy's tokens only
(``RolloutBatch.policy_mask``); an observation token is state, never an action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lmgym.agents.advantages import whiten
from lmgym.agents.config import AgentConfig
from lmgym.agents.dapo import overlong_penalty
from lmgym.agents.kl import kl_in_reward
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.records import PreparedBatch
from lmgym.distributed import DataParallelGroup
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.value import Critic
from lmgym.types import RolloutBatch


class Learner(Protocol):
    """What ``prepare_batch`` reads of an agent (``lmgym.agents.Agent`` has all of it)."""

    @property
    def config(self) -> AgentConfig: ...  # read-only: an agent's is a subclass

    policy: CausalLMPolicy
    ref_policy: CausalLMPolicy | None
    critic: Critic | None
    group: DataParallelGroup
    iteration: int

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor | None]: ...


def shaped_rewards(
    batch: RolloutBatch,
    config: AgentConfig,
    old_logprobs: Tensor | None,
    ref_logprobs: Tensor | None,
) -> Tensor:
    """The rewards the advantages see: the env's, plus overlong shaping on the final
    token, minus ``beta * k1`` per token when ``kl_placement="reward"``.

    Args:
        batch: ``B`` rows (the union over data-parallel ranks).
        config: the agent's config (``overlong_cache``, ``beta``, ``kl_placement``).
        old_logprobs: ``[B, L] float32`` ``lp_old``; needed only for the KL in the reward.
        ref_logprobs: ``[B, L] float32`` ``lp_ref``; needed only for the KL in the reward.

    Returns:
        ``[B, L] float32`` rewards; ``batch.rewards`` itself when nothing is shaped.
    """
    rewards = batch.rewards
    if config.overlong_cache is not None:
        shaping = overlong_penalty(batch.lengths, batch.max_new_tokens, config.overlong_cache)
        rewards = rewards + shaping[:, None] * batch.dones
    if config.beta > 0 and config.kl_placement == "reward":
        assert old_logprobs is not None and ref_logprobs is not None  # see prepare_batch
        rewards = kl_in_reward(rewards, old_logprobs, ref_logprobs, batch.policy_mask, config.beta)
    return rewards


@torch.no_grad()
def teacher_forced(
    policy: CausalLMPolicy, ids: Tensor, attn: Tensor, length: int, group_ids: Tensor
) -> Tensor:
    """``[B, L] float32`` ``policy``'s log-probs of the completion, the last ``length``
    columns of ``ids`` (``[B, S] int64``, attention mask ``attn``), without gradient;
    each group's prompt (``group_ids`` ``[B]``) runs through the model once."""
    return policy.logprobs(ids, attn, length, group_ids=group_ids, with_entropy=False)[0]


@torch.no_grad()
def prepare_batch(agent: Learner, batch: RolloutBatch) -> PreparedBatch:
    """``agent``'s ``PreparedBatch`` of ``batch`` (on the policy's device), its
    advantages from ``agent.advantages`` over every rank's rows.

    Raises:
        NonFiniteUpdateError: the batch holds a NaN/inf reward or sampler log-prob
            (``check_batch_values``), or an advantage or return of a loss token is
            NaN/inf (``loss_values``).
    """
    cfg, group = agent.config, agent.group
    ids, attn = batch.input_ids()
    groups = batch.group_ids  # a group's prompt runs once in each teacher-forced pass
    length = batch.max_new_tokens
    mask = batch.policy_mask & batch.valid[:, None]
    where = f"iteration {agent.iteration + 1}"
    union, mine = group.gather_batch(batch, pad_id=0)
    check_batch_values(union, where, gathered=group.active)  # every rank sees the same union
    old_logprobs: Tensor | None = batch.sampler_logprobs
    if cfg.recompute_old_logprobs:
        # One pass over one minibatch: lp_old = sg(lp) of the update's own forward.
        single_pass = cfg.update_epochs == 1 and cfg.num_minibatches == 1
        old_logprobs = (
            None if single_pass else teacher_forced(agent.policy, ids, attn, length, groups)
        )
    ref_logprobs = None
    if agent.ref_policy is not None:
        ref_logprobs = teacher_forced(agent.ref_policy, ids, attn, length, groups)
    values = None
    if agent.critic is not None:
        values = agent.critic.values(ids, attn, length, group_ids=groups)

    kl_inputs: tuple[Tensor | None, Tensor | None] = (None, None)
    if cfg.beta > 0 and cfg.kl_placement == "reward":
        old = (
            old_logprobs
            if old_logprobs is not None
            else teacher_forced(agent.policy, ids, attn, length, groups)
        )
        assert ref_logprobs is not None  # beta > 0 has a reference policy (resolve_models)
        kl_inputs = group.gather_rows(old), group.gather_rows(ref_logprobs)
    rewards = shaped_rewards(union, cfg, *kl_inputs)
    union_values = group.gather_rows(values) if values is not None else None
    advantages, returns = agent.advantages(union, rewards, union.policy_mask, union_values)
    if cfg.whiten_advantages:
        advantages = whiten(advantages, union.policy_mask, min_std=cfg.whiten_min_std)
    inputs = DerivedFrom(rewards, union.policy_mask, values, mask, cfg)
    advantages = loss_values("advantages", advantages[mine], mask, where, inputs)
    if returns is not None:
        returns = loss_values("returns", returns[mine], mask, where, inputs)
    return PreparedBatch(
        ids=ids,
        attn=attn,
        mask=mask,
        group_ids=batch.group_ids,
        sampler_logprobs=batch.sampler_logprobs,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        advantages=advantages,
        returns=returns,
        values=values,
        lengths=batch.completion_mask.sum(1),
    )


BATCH_VALUES = ("rewards", "sampler_logprobs")
"""The ``[B, L]`` float fields of a ``RolloutBatch`` the update computes with."""


def check_batch_values(batch: RolloutBatch, where: str, gathered: bool = False) -> None:
    """Refuse a rollout batch holding NaN/inf in ``BATCH_VALUES``, anywhere.

    An env's batch never holds one (every reward is checked finite where it is
    computed, and NaN sampling probabilities stop the rollout), so one came with a
    batch built or changed outside the env (``Agent.train_on_batch``'s caller); it is
    named here, never blamed on the learning rate. Rows and tokens the loss drops
    count too: a dropped row's score still enters its group's statistics, and a
    product with a 0 mask keeps a NaN (it zeroed a group's advantages without a
    word, or made the gradient NaN).

    Args:
        batch: the batch (the union of every rank's, so that every rank raises).
        where: the position in the run, e.g. ``"iteration 3"``.
        gathered: the batch is every rank's rows together (named so in the message).

    Raises:
        NonFiniteUpdateError: naming the field, row, token, what the loss does with
            that position, and the fix.
    """
    for name in BATCH_VALUES:
        values = getattr(batch, name)
        bad = ~torch.isfinite(values)
        if not bool(bad.any()):
            continue
        row, token = (int(i) for i in bad.nonzero()[0])
        rows = "row" if not gathered else "row (of every rank's rows together)"
        raise NonFiniteUpdateError(
            f"rollout batch: {name} is {values[row, token].item()} at {rows} {row}, token "
            f"{token} ({_position_kind(batch, row, token)}) at {where}: an env never puts "
            "one there, so the batch was built or changed outside it; the learning rate is "
            "not the cause. Give every entry a finite value, 0 where the loss does not use "
            "it (a dropped row's score still enters its group's baseline, and NaN * 0 is NaN)"
        )


def _position_kind(batch: RolloutBatch, row: int, token: int) -> str:
    """What the update does with ``batch``'s ``(row, token)``, in words."""
    if not bool(batch.valid[row]):
        return "a row the loss drops, valid=False"
    if not bool(batch.policy_mask[row, token]):
        return "a position the loss does not use: padding or an observation token"
    return "a token the loss uses"


@dataclass(frozen=True)
class DerivedFrom:
    """What the advantages and returns were computed from, to name why they are not
    finite when the batch was (``check_batch_values``).

    Attributes:
        rewards: ``[B_union, L]`` the shaped rewards (``shaped_rewards``).
        reward_mask: ``[B_union, L] bool`` their policy tokens.
        values: ``[B, L]`` this rank's critic values, or ``None`` without a critic.
        mask: ``[B, L] bool`` this rank's loss tokens.
        config: the agent's config (``beta``, ``kl_placement``).
    """

    rewards: Tensor
    reward_mask: Tensor
    values: Tensor | None
    mask: Tensor
    config: AgentConfig

    def cause(self) -> str:
        """Why an advantage or return is non-finite, with the fix."""
        if self.values is not None:
            bad = ~torch.isfinite(torch.where(self.mask, self.values, 0.0))
            if bool(bad.any()):
                return (
                    "the critic's value estimates are non-finite (first at row "
                    f"{int(bad.nonzero()[0, 0])}); the critic diverged (its learning rate too "
                    "high) or was loaded damaged. Resume from the last checkpoint with a lower "
                    "learning_rate"
                )
        shaped = torch.where(self.reward_mask, self.rewards, 0.0)
        if not bool(torch.isfinite(shaped).all()):
            return (
                f"the KL penalty in the reward (beta={self.config.beta}) is non-finite: the "
                "policy's or the reference model's log-probs of these tokens are -inf or NaN "
                "(check the reference model's weights)"
                if self.config.beta > 0 and self.config.kl_placement == "reward"
                else "the rewards with their shaping overflow float32: scale them down"
            )
        return (
            "the rewards are too extreme for the advantage estimator's float32 arithmetic: "
            "scale them down"
        )


def loss_values(name: str, value: Tensor, mask: Tensor, where: str, inputs: DerivedFrom) -> Tensor:
    """``value`` (``[B, L]`` advantages or returns) with every position outside ``mask``
    set to 0, after checking it finite on ``mask``.

    The loss selects its tokens with ``torch.where``, but a NaN it does not select
    would still make the gradient NaN (the product of a 0 gradient and NaN), hence 0.

    Raises:
        NonFiniteUpdateError: naming the first non-finite position, and the cause
            (``DerivedFrom.cause``): the learning rate is named only where it can be
            one (a critic's values).
    """
    kept = torch.where(mask, value, 0.0)
    bad = ~torch.isfinite(kept)
    if bool(bad.any()):
        row, token = (int(i) for i in bad.nonzero()[0])
        raise NonFiniteUpdateError(
            f"{name} is {kept[row, token].item()} at row {row}, token {token} at {where}, "
            f"computed from a finite batch: {inputs.cause()}; the update was not applied"
        )
    return kept
