"""The one place the env/policy loop lives: drive ``reset``/``step`` and build a ``RolloutBatch``.

- ``collect(env, policy)``: episode-synchronous (``autoreset=False``) batches: reset
  every row, step all rows at once until every row is done, return the batch.
- ``ContinuousCollector``: next-step autoreset (continuous batching): the env keeps
  running across calls, finished rows are refilled at once, and ``collect`` returns
  the first ``num_groups`` groups whose ``group_size`` completions have all ended.
  Episodes of groups still in flight carry over to the next call; their sampler
  log-probs record the policy that actually sampled them, so the ratio/TIS
  corrections see the staleness. The policy's KV cache also carries over while
  its weights are unchanged; after an update it is rebuilt once from the text.
- ``EpisodeRecorder``: the per-step records (sampler log-probs, rewards, special
  mass) both collectors and the async sampler keep, and the ``RolloutBatch`` of the
  episodes that end. ``collect``, whose rows all write step ``t`` at column ``t``,
  keeps its steps in lists and writes them once at the end (``record_steps``).

Both pass the env's group ids to ``act``, so a group's rows share one prefill of
their prompt; a cache rebuilt mid-episode gets none (its rows hold their own
completions).

Parked rows (an env built with ``responder_park_after``, ``lmgym.envs.turn_park``).
``ContinuousCollector`` passes the rows waiting for their environment to ``act`` as
idle (their actions are ignored; they are not policy tokens) and books a parked
row's late reward on its stop id's column. Its batch must not depend on how long
the calls took, so it then (1) draws each token from a counter-based uniform of
(seed, episode, column) (``lmgym.policy.counter_rng``) instead of one generator
shared by the rows, and (2) returns groups in group-id order, each group's rows in
episode order, instead of the first groups to end.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy, PolicyState
from lmgym.policy.counter_rng import counter_uniforms
from lmgym.policy.engines import engine_name
from lmgym.policy.weight_sync import weights_key
from lmgym.profiling import COLLECT, labelled
from lmgym.types import RolloutBatch


def _make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


class EpisodeRecorder:
    """Per-step records of the episodes in flight on an env's ``N`` rows, and the
    ``RolloutBatch`` of those that finish.

    The env's final observation holds each episode's text; what only the step knew
    (the sampler's log-prob, the reward, the special-token mass) is kept here in
    ``[N, L] float32`` buffers, row ``i``'s step ``t`` at column ``t``.

    Args:
        env: the env whose rows are recorded.
    """

    def __init__(self, env: TokenVectorEnv) -> None:
        self.env = env
        n, length = env.num_envs, env.max_new_tokens
        self.logprobs = torch.zeros(n, length, device=env.device)
        self.rewards = torch.zeros(n, length, device=env.device)
        self.special_mass = torch.zeros(n, length, device=env.device)
        self._columns = torch.arange(length, device=env.device)

    def record(
        self,
        info: dict[str, Tensor],
        live: Tensor,
        logprobs: Tensor,
        rewards: Tensor,
        special_mass: Tensor | None,
        answered: Tensor | None = None,
    ) -> Tensor:
        """Write one step of the ``live`` rows at their current column.

        Args:
            info: the env's info from before the step (``info["length"]``: each row's
                tokens so far, the step's column).
            live: ``[N] bool`` rows whose action the step took (not finished, not
                being reset).
            logprobs: ``[N] float32`` the sampler's log-probs of the actions.
            rewards: ``[N] float32`` the step's rewards.
            special_mass: ``[N] float32`` the probability the special-token mask
                removed (``PolicyState.special_mass``), or ``None``.
            answered: ``[N] bool`` rows parked before the step (``info["waiting"]``):
                their reward (0 until their responder answers) belongs to their last
                policy token, the stop id at the column before theirs; ``None``: none.

        Returns:
            ``[N, L] bool``, where the step was written.
        """
        device = self.env.device
        column = info["length"].clamp(max=self.env.max_new_tokens - 1)
        write = (self._columns == column[:, None]) & live[:, None]
        self.logprobs = torch.where(write, logprobs.to(device)[:, None], self.logprobs)
        self.rewards = torch.where(write, rewards[:, None], self.rewards)
        if answered is not None:
            stop = (self._columns == (info["length"] - 1)[:, None]) & answered[:, None]
            self.rewards = torch.where(stop, rewards[:, None], self.rewards)
        if special_mass is not None:
            mass = special_mass.to(device)[:, None]
            self.special_mass = torch.where(write, mass, self.special_mass)
        return write

    def finished(
        self,
        obs: dict[str, Tensor],
        info: dict[str, Tensor],
        rows: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> RolloutBatch:
        """A ``RolloutBatch`` of the finished episodes in ``rows`` (``[k] int64``),
        read from the step's final ``obs``/``info`` and flags and these records
        (a record past an episode's end is ignored: it reads as 0). A multi-turn
        env's observation says which tokens are the policy's (``policy_mask``); the
        others were never sampled: their log-prob and reward are 0."""
        env = self.env
        lp = env.prompt_width
        ids, mask = obs["input_ids"][rows], obs["attention_mask"][rows]
        completion_mask = mask[:, lp:]
        policy_mask = completion_mask
        if "policy_mask" in obs:
            policy_mask = obs["policy_mask"][rows, lp:] & completion_mask
        lengths = completion_mask.sum(dim=1)
        policy_lengths = policy_mask.sum(dim=1)
        special_mass = torch.where(policy_mask, self.special_mass[rows], 0.0).sum(dim=1)
        return RolloutBatch(
            prompt_ids=ids[:, :lp],
            prompt_mask=mask[:, :lp],
            completion_ids=ids[:, lp:],
            completion_mask=completion_mask,
            sampler_logprobs=torch.where(policy_mask, self.logprobs[rows], 0.0),
            rewards=torch.where(policy_mask, self.rewards[rows], 0.0),
            dones=self._columns[None, :] == (lengths - 1)[:, None],
            group_ids=info["group_id"][rows],
            prompt_index=info["prompt_index"][rows],
            lengths=lengths,
            terminated=terminated[rows],
            truncated=truncated[rows],
            valid=info["valid"][rows],
            special_mass=special_mass / policy_lengths.clamp(min=1),
            policy_mask=policy_mask,
        )

    def record_steps(
        self,
        columns: list[Tensor],
        live: list[Tensor],
        logprobs: list[Tensor],
        rewards: list[Tensor],
        special_mass: list[Tensor] | None,
    ) -> None:
        """Write the steps of episodes that all started together at once, each list
        holding one ``[N]`` tensor per step: step ``s`` of row ``i`` at column
        ``columns[s][i]`` (``info["length"]`` before the step: ``s`` in a single-turn
        episode, later once observations have been appended) where ``live[s][i]``.
        Steps past a row's end are dropped."""
        device = self.env.device
        length = self.env.max_new_tokens
        # Steps past a row's end write a spare column, cut off below: every real
        # column is written at most once.
        cols = torch.where(torch.stack(live, dim=1), torch.stack(columns, dim=1), length)
        records = [("logprobs", logprobs), ("rewards", rewards)]
        if special_mass is not None:
            records.append(("special_mass", special_mass))
        for name, steps in records:
            values = torch.stack(steps, dim=1).to(device=device, dtype=torch.float32)
            wide = torch.zeros(values.shape[0], length + 1, device=device)
            setattr(self, name, wide.scatter(1, cols, values)[:, :length])

    def clear(self, rows: Tensor) -> None:
        """Zero the records of ``rows`` (``[N] bool``), which start new episodes."""
        keep = ~rows[:, None]
        self.logprobs = self.logprobs * keep
        self.rewards = self.rewards * keep
        self.special_mass = self.special_mass * keep


@labelled(COLLECT)
def collect(
    env: TokenVectorEnv,
    policy: CausalLMPolicy,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> RolloutBatch:
    """Roll out one episode-synchronous batch of ``env.num_envs`` completions.

    Args:
        env: a ``TokenVectorEnv`` with ``autoreset=False``.
        policy: samples all rows at once, keeping a KV cache across steps.
        seed: seeds both the env's prompt stream and (if ``generator`` is None) the
            sampler, so the same seed gives an identical batch.
        generator: sampler RNG, on the policy's device.

    Returns:
        ``RolloutBatch`` with ``B = env.num_envs`` rows and ``L = env.max_new_tokens``.
    """
    if env.autoreset:
        raise ValueError(
            "env: collect() needs an episode-synchronous env (autoreset=False); "
            "use ContinuousCollector for autoreset envs"
        )
    policy.check_env(env)
    if generator is None:
        generator = _make_generator(seed, policy.device)
    obs, info = env.reset(seed=seed)
    groups = info["group_id"]
    state: PolicyState | None = None
    # The records are kept per step with the column each step writes and written once at
    # the end (EpisodeRecorder.record_steps), not merged into [N, L] each step.
    columns: list[Tensor] = []
    live: list[Tensor] = []
    logprobs: list[Tensor] = []
    rewards: list[Tensor] = []
    masses: list[Tensor] | None = []
    running = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    # Every step takes at least one column of each running row's budget (a turn's end
    # also its observation's), so max_new_tokens steps end every episode.
    for _ in range(env.max_new_tokens):
        # Every row starts at its group's prompt: a group's rows share one prefill.
        actions, step_logprobs, state = policy.act(
            obs, state, generator=generator, group_ids=groups, idle=~running
        )
        columns.append(info["length"])
        live.append(running)
        obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
        logprobs.append(step_logprobs)
        rewards.append(reward)
        if state.special_mass is None:
            masses = None
        elif masses is not None:
            masses.append(state.special_mass)
        # The env's flags are cumulative here (autoreset=False): all set, all done.
        running = ~(terminated | truncated)
        if not bool(running.any()):
            break
    recorder = EpisodeRecorder(env)
    recorder.record_steps(columns, live, logprobs, rewards, masses)
    rows = torch.arange(env.num_envs, device=env.device)
    return recorder.finished(obs, info, rows, terminated, truncated)


def concat_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """Stack batches row-wise (same ``Lp`` and ``L``)."""
    fields = RolloutBatch.__dataclass_fields__
    return RolloutBatch(**{f: torch.cat([getattr(b, f) for b in batches]) for f in fields})


class ContinuousCollector:
    """Continuous batching over a next-step-autoreset ``TokenVectorEnv``.

    With an env that parks rows (``responder_park_after``) the batch under a seed does
    not depend on the responder's timing (the module docstring): each token is drawn
    from a counter-based uniform (the lmgym engine; the vLLM engine draws its own, so
    it warns that the batch may then vary), and groups come out in group-id order.

    Args:
        env: a ``TokenVectorEnv`` with ``autoreset=True``.
        policy: the sampling policy.
        seed: seeds the env's prompt stream (first reset) and the sampler.
    """

    def __init__(self, env: TokenVectorEnv, policy: CausalLMPolicy, seed: int | None = None):
        if not env.autoreset:
            raise ValueError("env: ContinuousCollector needs an env built with autoreset=True")
        policy.check_env(env)
        self.env, self.policy = env, policy
        self.generator = _make_generator(seed, policy.device)
        self.parking = env.responder_park_after is not None
        # The seed of the counter-based draws (parking, lmgym engine), else None.
        self.counter_seed: int | None = None
        if self.parking and engine_name(policy) == "vllm":
            warnings.warn(
                "ContinuousCollector: the env parks rows (responder_park_after) and the "
                "vLLM engine draws its own samples per request, so the batch under a seed "
                "may depend on the responder's timing; lmgym's engine keeps it fixed",
                stacklevel=2,
            )
        elif self.parking:
            self.counter_seed = seed if seed is not None else int(torch.randint(0, 2**62, (1,)))
        self._obs, self._info = env.reset(seed=seed)
        self._recorder = EpisodeRecorder(env)
        self._restarting = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        # The KV cache carries over between calls while the weights stay the same.
        self._state: PolicyState | None = None
        self._starts = torch.zeros_like(self._restarting)
        # Until the first step every row shows only its prompt (group rows: one text).
        self._fresh = True
        self._weights: tuple[tuple[int, int], ...] | None = None
        self._pool: list[RolloutBatch] = []
        self._episodes: list[Tensor] = []  # the pooled rows' episode keys (parking only)
        self.tokens_generated = 0

    def _pooled(self) -> RolloutBatch | None:
        if not self._pool:
            return None
        pooled = concat_batches(self._pool)
        self._pool = [pooled]
        if self.parking:
            self._episodes = [torch.cat(self._episodes)]
        return pooled

    def _complete_groups(self, num_groups: int) -> Tensor:
        """Group ids (sorted) whose every completion has ended; when parking, the
        ``num_groups`` lowest group ids not yet returned once all have ended (else
        none), so which groups a batch holds does not depend on the calls' timing."""
        pooled = self._pooled()
        none = torch.empty(0, dtype=torch.long, device=self.env.device)
        if pooled is None:
            return none
        groups, counts = torch.unique(pooled.group_ids, return_counts=True)
        complete = groups[counts == self.env.group_size]
        if not self.parking:
            return complete
        # Groups get their slots in id order, so every group below one in flight has
        # been seen: the lowest ids in the pool and in flight are the next ones.
        flying = self._info["group_id"][~self._restarting]
        first = torch.unique(torch.cat([groups, flying]))[:num_groups]
        if first.numel() < num_groups or not bool(torch.isin(first, complete).all()):
            return none
        return first

    @labelled(COLLECT)
    def collect(self, num_groups: int) -> RolloutBatch:
        """Step the env until ``num_groups`` whole groups have ended; return them.

        Returns:
            ``RolloutBatch`` of ``num_groups * group_size`` rows, ordered by group id
            (when parking, each group's rows in episode order too).
        """
        env = self.env
        weights = weights_key(self.policy)
        if weights == self._weights:
            state, starts = self._state, self._starts
        else:  # the weights changed since the cache was built: rebuild it once
            state, starts = None, torch.zeros_like(self._restarting)
        complete = self._complete_groups(num_groups)
        while complete.numel() < num_groups:
            # A group's rows share a prefill at the start; a cache rebuilt mid-episode
            # (new weights) sees each row's own completion, so no sharing then.
            groups = self._info["group_id"] if state is not None or self._fresh else None
            waiting = self._info.get("waiting")  # parked rows: their actions are ignored
            idle = self._restarting if waiting is None else self._restarting | waiting
            draws = {}
            if self.counter_seed is not None:
                draws["uniforms"] = counter_uniforms(
                    self.counter_seed, self._info["episode"], self._info["length"]
                )
            actions, logprobs, state = self.policy.act(
                self._obs,
                state,
                episode_starts=starts,
                generator=self.generator,
                group_ids=groups,
                idle=idle,
                **draws,
            )
            self._fresh = False
            live = ~idle
            obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
            self._recorder.record(self._info, live, logprobs, reward, state.special_mass, waiting)
            self.tokens_generated += int(live.sum())
            finished = terminated | truncated
            rows = finished.nonzero().squeeze(1)
            if rows.numel() > 0:
                self._pool.append(self._recorder.finished(obs, info, rows, terminated, truncated))
                if self.parking:
                    self._episodes.append(info["episode"][rows])
                # Finished rows restart next step: clear their per-episode records now.
                self._recorder.clear(finished)
            # Rows reset by this step (their action was ignored) show a new prompt now.
            starts = self._restarting
            self._restarting = finished
            self._obs, self._info = obs, info
            if rows.numel() > 0:
                complete = self._complete_groups(num_groups)  # only changes when episodes end
        self._state, self._starts, self._weights = state, starts, weights
        pooled = self._pooled()
        assert pooled is not None  # the loop above ended with num_groups complete groups
        chosen = complete[:num_groups]
        take = torch.isin(pooled.group_ids, chosen)
        self._pool = [pooled.select(~take)]
        batch = pooled.select(take)
        if not self.parking:
            return batch.select(torch.argsort(batch.group_ids, stable=True))
        episodes = self._episodes[0]
        self._episodes = [episodes[~take]]
        return batch.select(torch.argsort(episodes[take]))


@torch.no_grad()
def score_policy(
    env: TokenVectorEnv,
    policy: CausalLMPolicy,
    num_batches: int = 1,
    seed: int = 0,
    *,
    training_env: TokenVectorEnv | None = None,
) -> dict[str, float]:
    """Mean and std of the episode return and the mean completion length of ``policy``
    on ``env`` over ``num_batches`` fresh batches, with a sampler generator of its own
    seeded with ``seed`` (the same call gives the same result; no other RNG moves).

    Args:
        env: an episode-synchronous env (reset with ``seed``).
        policy: the policy to sample from (not updated).
        num_batches: rollout batches to draw (``env.num_envs`` completions each).
        seed: seeds ``env``'s prompt stream and the sampler.
        training_env: the env ``policy`` trains on (``Agent.evaluate``): ``env`` must
            not be it, whose prompt stream and in-flight episodes would move.

    Returns:
        ``reward_mean``, ``reward_std``, ``completion_length`` (the policy's tokens:
        a multi-turn episode's observations are not counted).
    """
    if training_env is not None and env is training_env:
        raise ValueError(
            "env: evaluate needs an env of its own; the training env's prompt stream and "
            "in-flight episodes would move. Build a second env, e.g. "
            "gymnasium.make_vec(task_id, num_envs=..., tokenizer=policy.tokenizer)"
        )
    if env.autoreset:
        raise ValueError("env: scoring needs an episode-synchronous env (autoreset=False)")
    generator = _make_generator(seed, policy.device)
    batches = [
        collect(env, policy, seed=seed if i == 0 else None, generator=generator)
        for i in range(num_batches)
    ]
    scores = torch.cat([b.scores for b in batches])
    lengths = torch.cat([b.policy_lengths for b in batches]).float()
    return {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
        "completion_length": lengths.mean().item(),
    }
