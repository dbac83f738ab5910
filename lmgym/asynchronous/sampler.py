"""The actor's sampler: continuous batching whose refills the caller admits.

``ContinuousCollector`` lets an autoreset env refill a finished row at once. An
actor must decide *when* a row may start, because the staleness bound is a
promise about the row's first token: so the actor drives an episode-synchronous
env (``autoreset=False``), whose finished rows wait, and restarts them with
``reset(options={"reset_mask": rows})`` when ``admit`` allows. Rows are refilled
with the env's next prompt slots in order (``G`` per prompt), so slot ``s`` is
completion ``s mod G`` of group ``s // G`` of this actor's stream.

Every sampled token is stamped with the policy version the caller passes to
``step``; weights may change between any two steps (in-flight updates), and
``drop_cache`` makes the next step rebuild the KV cache from the text.

When every row starts at once (the first batch, or all rows finished and all
admitted) the collector resets the whole env and the KV cache, exactly as
``lmgym.rollout.collect`` starts a batch; with one version per batch the rows
are then those ``collect`` returns, token for token, for the same generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmgym.asynchronous.transport import VersionedRollout, concat_rollouts
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy, PolicyState
from lmgym.profiling import COLLECT, labelled
from lmgym.rollout import EpisodeRecorder


class AdmissionCollector:
    """Continuous batching over an episode-synchronous env, refills admitted by the caller.

    Args:
        env: a ``TokenVectorEnv`` with ``autoreset=False`` (this actor's share).
        policy: the sampling policy (its weights may change between steps).
        generator: sampler RNG on the policy's device.
        seed: seeds the env's prompt stream at the first ``admit``.
    """

    def __init__(
        self,
        env: TokenVectorEnv,
        policy: CausalLMPolicy,
        generator: torch.Generator | None,
        seed: int | None,
    ) -> None:
        if env.autoreset:
            raise ValueError(
                "env: an actor drives an episode-synchronous env (autoreset=False) and refills "
                "finished rows itself, so that a row starts only when the staleness bound "
                "allows; build the actors' env with autoreset=False (it still batches "
                "continuously)"
            )
        policy.check_env(env)
        self.env, self.policy, self.generator, self.seed = env, policy, generator, seed
        n, length = env.num_envs, env.max_new_tokens
        device = env.device
        self.live = torch.zeros(n, dtype=torch.bool, device=device)
        self.slots = torch.zeros(n, dtype=torch.long, device=device)
        self.next_slot = 0
        self.tokens_generated = 0
        self._recorder = EpisodeRecorder(env)
        self._versions = torch.full((n, length), -1, dtype=torch.long, device=device)
        self._obs: dict[str, Tensor] | None = None
        self._info: dict[str, Tensor] | None = None
        self._state: PolicyState | None = None
        self._starts: Tensor | None = None
        # Every row shows only its prompt (after a full reset, before its first step):
        # a group's rows may then share one prefill.
        self._fresh = False
        self._pool: list[VersionedRollout] = []

    @property
    def num_live(self) -> int:
        """Rows mid-episode."""
        return int(self.live.sum())

    def admit(self, max_rows: int | None) -> int:
        """Start new episodes on at most ``max_rows`` idle rows (``None``: every idle row).

        Returns:
            The number of rows started; they hold slots ``[next_slot - n, next_slot)``.
        """
        n = self.env.num_envs
        idle = ~self.live
        count = int(idle.sum()) if max_rows is None else min(int(idle.sum()), max(max_rows, 0))
        if count == 0:
            return 0
        if self._obs is None and count < n:
            raise ValueError(
                f"admit({max_rows}): the first admission starts every row (the env's first "
                f"reset fills all {n}); allow at least num_envs={n} rows"
            )
        if self._obs is None or count == n:
            # Every row starts: a fresh batch and a fresh cache, as collect() starts one.
            seed = self.seed if self._obs is None else None
            self._obs, self._info = self.env.reset(seed=seed)
            rows = torch.arange(n, device=self.live.device)
            mask = torch.ones_like(idle)
            self._state, self._starts, self._fresh = None, None, True
        else:
            rows = idle.nonzero().squeeze(1)[:count]
            mask = torch.zeros_like(idle)
            mask[rows] = True
            self._obs, self._info = self.env.reset(options={"reset_mask": mask})
            self._starts = mask if self._starts is None else self._starts | mask
        # The env hands out slots in row order (reset_mask's rows ascending).
        self.slots[rows] = self.next_slot + torch.arange(count, device=rows.device)
        self.next_slot += count
        self.live[rows] = True
        self._recorder.clear(mask)
        self._versions[rows] = -1
        return count

    def drop_cache(self) -> None:
        """Rebuild the KV cache from the text at the next step (after new weights)."""
        self._state, self._starts = None, None

    @labelled(COLLECT)
    def step(self, version: int) -> None:
        """One decode step of every row; live rows' tokens are stamped ``version``.

        Rows that finish go to the pool ``take_groups`` reads.
        """
        if self._obs is None or self._info is None:
            raise RuntimeError("step() before admit(): no row has started")
        env = self.env
        # A cache rebuilt mid-episode (drop_cache) sees each row's own completion: a
        # group's rows share a prefill only when they start together.
        shareable = self._state is not None or self._fresh
        actions, logprobs, self._state = self.policy.act(
            self._obs,
            self._state,
            episode_starts=self._starts,
            generator=self.generator,
            group_ids=self._info["group_id"] if shareable else None,
            idle=~self.live,
        )
        self._starts, self._fresh = None, False
        obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
        write = self._recorder.record(
            self._info, self.live, logprobs, reward, self._state.special_mass
        )
        self._versions = torch.where(write, version, self._versions)
        self.tokens_generated += self.num_live
        # The env's flags are sticky until a row restarts: new ends are the live ones.
        finished = (terminated | truncated) & self.live
        if bool(finished.any()):
            rows = finished.nonzero().squeeze(1)
            batch = self._recorder.finished(obs, info, rows, terminated, truncated)
            versions = self._versions[rows].masked_fill(~batch.policy_mask, -1)
            self._pool.append(VersionedRollout(batch, versions, self.slots[rows]))
            self.live = self.live & ~finished
        self._obs, self._info = obs, info

    def take_groups(self) -> VersionedRollout | None:
        """The groups whose ``G`` completions have all finished, removed from the pool.

        Returns:
            Their rows ordered by slot (group by group, a group's rows in slot
            order), or ``None`` when no group is complete.
        """
        if not self._pool:
            return None
        pooled = concat_rollouts(self._pool)
        groups, counts = torch.unique(pooled.batch.group_ids, return_counts=True)
        complete = groups[counts == self.env.group_size]
        if complete.numel() == 0:
            self._pool = [pooled]
            return None
        take = torch.isin(pooled.batch.group_ids, complete)
        rest = pooled.select(~take)
        self._pool = [rest] if rest.batch.batch_size else []
        done = pooled.select(take)
        return done.select(torch.argsort(done.slots, stable=True))
