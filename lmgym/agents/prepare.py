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

from typing import Protocol

import torch
from torch import Tensor

from lmgym.agents.advantages import whiten
from lmgym.agents.config import AgentConfig
from lmgym.agents.dapo import overlong_penalty
from lmgym.agents.kl import kl_in_reward
from lmgym.agents.numerics import check_finite
from lmgym.agents.records import PreparedBatch
from lmgym.distributed import DataParallelGroup
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.value import Critic
from lmgym.types import RolloutBatch


class Learner(Protocol):
    """What ``prepare_batch`` reads of an agent (``lmgym.agents.Agent`` has all of it)."""

    config: AgentConfig
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
        NonFiniteUpdateError: an advantage or return of a loss token is NaN/inf.
    """
    cfg, group = agent.config, agent.group
    ids, attn = batch.input_ids()
    groups = batch.group_ids  # a group's prompt runs once in each teacher-forced pass
    length = batch.max_new_tokens
    mask = batch.policy_mask & batch.valid[:, None]
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

    union, mine = group.gather_batch(batch, pad_id=0)
    kl_inputs: tuple[Tensor | None, Tensor | None] = (None, None)
    if cfg.beta > 0 and cfg.kl_placement == "reward":
        old = (
            old_logprobs
            if old_logprobs is not None
            else teacher_forced(agent.policy, ids, attn, length, groups)
        )
        kl_inputs = group.gather_rows(old), group.gather_rows(ref_logprobs)
    rewards = shaped_rewards(union, cfg, *kl_inputs)
    union_values = group.gather_rows(values) if values is not None else None
    advantages, returns = agent.advantages(union, rewards, union.policy_mask, union_values)
    if cfg.whiten_advantages:
        advantages = whiten(advantages, union.policy_mask, min_std=cfg.whiten_min_std)
    advantages = advantages[mine]
    returns = returns[mine] if returns is not None else None
    where = f"iteration {agent.iteration + 1}"
    check_finite("advantages", advantages * mask, where)
    if returns is not None:
        check_finite("returns", returns * mask, where)
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
