"""Where an agent's rollout batches come from (``Agent.collect``).

One batch is ``env.num_envs`` completions, collected episode by episode
(``lmgym.rollout.collect``) or, on an autoreset env, by a ``ContinuousCollector``.
``RolloutSource`` holds that state: the env is seeded with the agent's seed on the
first draw only (or never, after ``restore`` put back a saved prompt stream). With
DAPO's dynamic sampling, groups whose rewards are all equal are replaced by fresh
draws, and data-parallel ranks agree on how many groups each keeps
(``collect_batch``). ``seeded_generators`` seeds the agent's sampler and minibatch
shuffle.
"""

from __future__ import annotations

from typing import Any

import torch

from lmgym.agents.config import AgentConfig
from lmgym.agents.dapo import draw_with_signal
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.distributed import DataParallelGroup
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.rollout import ContinuousCollector, collect
from lmgym.types import RolloutBatch


def seeded_generators(
    seed: int, device: torch.device, rank: int
) -> tuple[torch.Generator, torch.Generator]:
    """``(sampler, shuffle)``: the agent's sampling generator on ``device``, seeded
    ``seed + 7919 * rank`` (rank 0 samples exactly as a single process, other ranks
    draw other completions), and the CPU generator of the update's minibatch order,
    seeded ``seed + 1``. ``Agent.state_dict`` saves both."""
    sampler = torch.Generator(device=device)
    sampler.manual_seed(seed + 7919 * rank)
    shuffle = torch.Generator()
    shuffle.manual_seed(seed + 1)
    return sampler, shuffle


class RolloutSource:
    """An agent's supply of fresh completions: ``env`` x ``policy``, sampled with ``generator``.

    Args:
        env: the training env (episode-synchronous or autoreset).
        policy: the sampling policy.
        generator: the sampler's RNG (the agent's; shared, not copied).
        seed: seeds the env's prompt stream on the first draw.
    """

    def __init__(
        self,
        env: TokenVectorEnv,
        policy: CausalLMPolicy,
        generator: torch.Generator,
        seed: int,
    ) -> None:
        self.env, self.policy, self.generator, self.seed = env, policy, generator, seed
        self.seeded = False  # the env's prompt stream has been started (or restored)
        self._collector: ContinuousCollector | None = None

    def draw(self) -> RolloutBatch:
        """``env.num_envs`` fresh completions (the env is seeded on the first call only)."""
        seed = None if self.seeded else self.seed
        self.seeded = True
        if not self.env.autoreset:
            return collect(self.env, self.policy, seed=seed, generator=self.generator)
        if self._collector is None:
            self._collector = ContinuousCollector(self.env, self.policy, seed=seed)
            self._collector.generator = self.generator
        return self._collector.collect(self.env.num_prompts)

    def state(self) -> dict[str, Any] | None:
        """The env's prompt stream once it started, else ``None`` (it starts from ``seed``)."""
        return self.env.get_state() if self.seeded else None

    def restore(self, state: dict[str, Any] | None) -> None:
        """Put back what ``state`` returned (``None``: leave the env to be seeded)."""
        if state is not None:
            self.env.set_state(state)
            self.seeded = True


def collect_batch(
    source: RolloutSource, config: AgentConfig, group: DataParallelGroup, iteration: int
) -> tuple[RolloutBatch, int, int]:
    """One batch for the update of iteration ``iteration + 1``; with
    ``config.dynamic_sampling``, groups whose rewards are all equal are dropped and
    replaced by fresh draws.

    Returns:
        ``(batch, groups_dropped, tokens)``: ``groups_dropped`` summed over
        data-parallel ranks; ``tokens`` the completion tokens this rank sampled,
        every draw counted.

    Raises:
        NonFiniteUpdateError: the policy's sampling probabilities are NaN/inf (its
            weights diverged; in the first rollout, before any update, the model as
            loaded), naming the iteration and the fix.
    """
    tokens = 0

    def draw() -> RolloutBatch:
        nonlocal tokens
        try:
            batch = source.draw()
        except RuntimeError as error:
            if "probability tensor contains" not in str(error):
                raise
            cause = (
                "no update has run yet, so the model as loaded gives NaN/inf logits (an "
                "extreme or damaged weight, not the learning rate); load an intact model"
                if iteration == 0
                else f"the weights diverged (learning_rate={config.learning_rate}). Resume "
                "from the last checkpoint with a lower learning_rate"
            )
            raise NonFiniteUpdateError(
                f"the policy's next-token probabilities are NaN/inf in the rollout of "
                f"iteration {iteration + 1}: {cause}"
            ) from error
        tokens += int(batch.policy_lengths.sum())
        return batch

    if not config.dynamic_sampling:
        batch = draw()
        return batch, 0, tokens
    batch, dropped = draw_with_signal(draw, source.env.num_prompts, config.max_resample)
    # Data parallel: every rank keeps as many groups as the rank that found fewest,
    # so minibatches hold equal shares of rows.
    groups = batch.group_ids.unique()
    fewest = int(group.all_reduce_min(torch.tensor([groups.numel()])))
    if fewest < groups.numel():
        batch = batch.select(torch.isin(batch.group_ids, groups[:fewest]))
    return batch, int(group.all_reduce_sum(torch.tensor([dropped]))), tokens
