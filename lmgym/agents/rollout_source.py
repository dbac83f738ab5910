"""Where an agent's rollout batches come from (``Agent.collect``).

One batch is ``env.num_envs`` completions, collected episode by episode
(``lmgym.rollout.collect``) or, on an autoreset env, by the agent's
``ContinuousCollector``. The env is seeded with ``config.seed`` on the first draw
only (or never, after ``load`` restored its prompt stream). With DAPO's dynamic
sampling, groups whose rewards are all equal are replaced by fresh draws, and
data-parallel ranks agree on how many groups each keeps. ``seeded_generators``
seeds the agent's sampler and minibatch shuffle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmgym.agents.dapo import draw_with_signal
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.rollout import ContinuousCollector, collect
from lmgym.types import RolloutBatch

if TYPE_CHECKING:
    from lmgym.agents.base import Agent


def seeded_generators(
    seed: int, device: torch.device, rank: int
) -> tuple[torch.Generator, torch.Generator]:
    """``(sampler, shuffle)``: the agent's sampling generator on ``device``, seeded
    ``seed + 7919 * rank`` (rank 0 samples exactly as a single process, other ranks
    draw other completions), and the CPU generator of the update's minibatch order,
    seeded ``seed + 1``. ``lmgym.persistence.agent`` saves and restores both."""
    sampler = torch.Generator(device=device)
    sampler.manual_seed(seed + 7919 * rank)
    shuffle = torch.Generator()
    shuffle.manual_seed(seed + 1)
    return sampler, shuffle


def collect_batch(agent: Agent) -> tuple[RolloutBatch, int]:
    """One batch for ``agent``'s update; with ``dynamic_sampling``, groups whose rewards
    are all equal are dropped and replaced by fresh draws.

    Returns:
        ``(batch, groups_dropped)``, ``groups_dropped`` summed over data-parallel ranks.
    """
    if not agent.config.dynamic_sampling:
        return draw(agent), 0
    batch, dropped = draw_with_signal(
        lambda: draw(agent), agent.env.num_prompts, agent.config.max_resample
    )
    # Data parallel: every rank keeps as many groups as the rank that found fewest,
    # so minibatches hold equal shares of rows.
    groups = batch.group_ids.unique()
    fewest = int(agent.group.all_reduce_min(torch.tensor([groups.numel()])))
    if fewest < groups.numel():
        batch = batch.select(torch.isin(batch.group_ids, groups[:fewest]))
    return batch, int(agent.group.all_reduce_sum(torch.tensor([dropped])))


def draw(agent: Agent) -> RolloutBatch:
    """``env.num_envs`` fresh completions from ``agent``'s env and policy, counted in
    ``agent.tokens_generated``.

    Raises:
        NonFiniteUpdateError: the policy's sampling probabilities are NaN/inf (its
            weights diverged), naming the iteration and the fix.
    """
    seed = None if agent._env_seeded else agent.config.seed
    agent._env_seeded = True
    try:
        if agent.env.autoreset:
            if agent._collector is None:
                agent._collector = ContinuousCollector(agent.env, agent.policy, seed=seed)
                agent._collector.generator = agent.generator
            batch = agent._collector.collect(agent.env.num_prompts)
        else:
            batch = collect(agent.env, agent.policy, seed=seed, generator=agent.generator)
    except RuntimeError as error:
        if "probability tensor contains" not in str(error):
            raise
        raise NonFiniteUpdateError(
            f"the policy's next-token probabilities are NaN/inf in the rollout of iteration "
            f"{agent.iteration + 1}: the weights diverged (learning_rate="
            f"{agent.config.learning_rate}). Resume from the last checkpoint with a lower "
            "learning_rate"
        ) from error
    agent.tokens_generated += int(batch.lengths.sum())
    return batch
