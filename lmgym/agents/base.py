"""The learn loop shared by every agent: collect, prepare, update (docs/algorithms.md).

An algorithm is a composition (DESIGN.md, principle 3). A subclass chooses:

- ``advantages(batch, rewards, mask, values)``: the advantage estimator;
- ``policy_loss(logprobs, old_logprobs, advantages, mask)``: the ratio rule,
  returning a per-token loss ``[b, L]`` (a sequence-level rule broadcasts its
  per-sequence loss to the row's tokens, which ``seq-mean-token-mean`` turns back
  into a mean over sequences);
- optionally ``extra_losses(data, out, counts)``: further weighted terms (a
  critic's value loss, an auxiliary LM loss), and ``make_critic``.

This class adds, from the config: the KL term (in the reward or in the loss), TIS,
the aggregation, minibatching with whole-minibatch normalisers, non-finite guards,
gradient clipping and the metrics of docs/metrics.md. One iteration::

    batch  = collect()                      # env x policy -> RolloutBatch
    data   = prepare(batch)                 # lp_old, lp_ref, V_old, rewards -> advantages
    for epoch, minibatch of whole rows:
        counts = Counts.of(data.mask[minibatch])
        for micro-batch in minibatch:
            loss = agg(tis * (l_policy + beta*k) - c_H*H) + sum_k c_k * extra_k
            loss.backward()                 # each part normalised by the minibatch's counts
        clip, check, optimizer.step()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from lmgym.agents.advantages import whiten
from lmgym.agents.aggregation import aggregate
from lmgym.agents.callbacks import ProgressBar, check_callback
from lmgym.agents.config import (
    AgentConfig,
    build_config,
    check_batch_split,
    check_common,
    check_types,
    resolve_models,
)
from lmgym.agents.dapo import draw_with_signal, overlong_penalty
from lmgym.agents.kl import kl_estimator, kl_in_reward
from lmgym.agents.metrics import clip_fractions
from lmgym.agents.numerics import (
    NonFiniteUpdateError,
    check_finite,
    check_parameters,
    clip_grads,
    total_grad_norm,
)
from lmgym.agents.optim import LearningRateSchedule, make_optimizer
from lmgym.agents.ratios import tis_weights
from lmgym.agents.records import Counts, MicroBatchLoss, PolicyOutput, PreparedBatch
from lmgym.agents.report import update_metrics
from lmgym.distributed import DataParallelGroup
from lmgym.envs.rewards import reward_component_means
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.parallel import DataParallelUpdate, trainable_modules
from lmgym.persistence.agent import load_agent, save_agent
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.value import Critic
from lmgym.profiling import BACKWARD, LOSS, METRICS, OPTIMIZER, PREPARE, phase
from lmgym.rollout import ContinuousCollector, collect, score_policy
from lmgym.types import RolloutBatch

ConfigT = TypeVar("ConfigT", bound=AgentConfig)
Callback = Callable[["Agent", dict[str, float]], bool | None]
"""Called after every iteration with the agent and its metrics; returning False stops learning.

A callback object may also define ``on_learn_start(agent)`` and
``on_learn_end(agent, history)``; ``learn`` calls them, when present, before the
first and after the last iteration (``lmgym.training.callbacks`` has ready ones:
early stop at a threshold, periodic evaluation, sample printing, logging,
checkpoints)."""


class Agent(Generic[ConfigT]):
    """Base of all lmgym agents (``Agent(policy, env, **config).learn(...)``).

    Args:
        policy: the policy to train; its model is updated in place. A hub name or a
            local directory loads one (``CausalLMPolicy.from_pretrained`` with its
            defaults, on ``env.device``, tokenizer from the same place), as
            Stable-Baselines3 takes a policy name; then with ``beta > 0`` and no
            ``ref_policy`` the reference is ``frozen_copy`` of it.
        env: an lmgym ``TokenVectorEnv`` (episode-synchronous or autoreset).
        ref_policy: frozen reference for the KL term; required when ``beta > 0``,
            optional otherwise (then only used to log KL to the reference).
        config: the algorithm's config dataclass (default: its documented defaults).
        process_group: the data-parallel learners' ``torch.distributed`` group
            (``None``: the default group when one is initialised, else one process;
            docs/distributed.md).
        **overrides: config fields to change, e.g. ``learning_rate=3e-4``; an
            unknown name is an error listing the valid ones.
    """

    config_class: ClassVar[type[AgentConfig]] = AgentConfig
    name: ClassVar[str] = "agent"
    uses_critic: ClassVar[bool] = False
    clip_zeroes_gradient: ClassVar[bool] = True
    """False for rules (CISPO) whose clip bounds a weight but never zeroes a gradient."""

    def __init__(
        self,
        policy: CausalLMPolicy | str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        config: ConfigT | None = None,
        process_group: Any = None,
        **overrides: Any,
    ) -> None:
        self.config: ConfigT = build_config(self.config_class, config, overrides)  # type: ignore[assignment]
        check_common(self.config)
        self.policy, self.env, self.ref_policy = resolve_models(
            self.config, policy, env, ref_policy
        )
        self.check_config()
        check_types(self.config)  # any choice field the algorithm's own checks missed
        check_batch_split(self.config, self.env.num_envs)

        self.critic: Critic | None = self.make_critic() if self.uses_critic else None
        # Trainable parameters only: under a PEFT adapter, the adapter's.
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        if self.critic is not None:
            params += self.critic.own_parameters()
        self.optimizer = make_optimizer(params, self.config)
        self.lr_schedule = LearningRateSchedule(self.optimizer, self.config)
        self.group = DataParallelGroup(process_group)
        self.group.check_same_on_every_rank(f"{self.name} config", dataclasses.asdict(self.config))
        # The update's trainable modules under DDP (gradients summed over ranks); one
        # process calls the loss directly. Looked up per call: a probe may shadow it.
        self.parallel = DataParallelUpdate(
            trainable_modules(self.policy, self.critic),
            lambda data, counts: self.micro_batch_loss(data, counts),
            self.group,
        )
        self.generator = torch.Generator(device=self.policy.device)
        # Rank 0 samples exactly as a single process; other ranks draw other completions.
        self.generator.manual_seed(self.config.seed + 7919 * self.group.rank)
        self._shuffle = torch.Generator()
        self._shuffle.manual_seed(self.config.seed + 1)
        self._collector: ContinuousCollector | None = None
        self._env_seeded = False
        self.iteration = 0
        self.tokens_generated = 0

    # ------------------------------------------------------------ algorithm
    def check_config(self) -> None:
        """Algorithm-specific validation; raise ``ValueError`` naming the field."""

    def make_critic(self) -> Critic:
        raise NotImplementedError

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """``(advantages [B, L], value targets [B, L] or None)``, detached.

        ``mask`` is ``[B, L] bool`` over every real completion token, masked rows
        included: statistics use every row's real score (docs/algorithms.md#conventions).
        """
        raise NotImplementedError

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(per-token loss [b, L], ratio [b, L] or None)`` for one micro-batch."""
        raise NotImplementedError

    def extra_losses(
        self, data: PreparedBatch, out: PolicyOutput, counts: Counts
    ) -> dict[str, tuple[float, Tensor]]:
        """Further loss terms of one micro-batch: name -> ``(coefficient, term)``.

        Each term is 0-dim and normalised by the minibatch's ``counts`` (so its sum
        over micro-batches is the minibatch's value); ``coefficient * term`` is added
        to the loss and the unweighted term is logged under its name. Default: none.
        """
        return {}

    def clip_range(self) -> tuple[float, float] | None:
        """``(low, high)`` half-widths of the ratio interval this rule clips, if any."""
        return None

    def clip_metrics(self, ratio: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
        """How often the rule's clip bound (``[b, L]`` ratio, advantages and loss mask of
        the update's tokens): ``clip_fractions`` over ``clip_range``; none without one."""
        bounds = self.clip_range()
        if bounds is None:
            return {}
        metrics = clip_fractions(ratio, advantages, mask, *bounds)
        if not self.clip_zeroes_gradient:
            metrics["clip_zeroed_fraction"] = 0.0
        return metrics

    # ------------------------------------------------------------------ learn
    def learn(
        self,
        iterations: int,
        callback: Callback | Sequence[Callback] | None = None,
        progress_bar: bool = False,
    ) -> list[dict[str, float]]:
        """Run ``iterations`` of collect + update.

        Args:
            iterations: rollout batches to collect and train on.
            callback: ``callback(agent, metrics)`` after each iteration, or a list of
                them, called in order; if any returns ``False`` learning stops after
                every callback has seen the iteration. Objects with
                ``on_learn_start(agent)`` / ``on_learn_end(agent, history)`` get
                those calls too (``on_learn_end`` only when learning ends normally,
                early stops included, not after an exception).
            progress_bar: show a tqdm bar with live reward/KL/length.

        Returns:
            One metrics dict per iteration (see docs/metrics.md for every name).
        """
        if iterations < 0:
            raise ValueError(f"iterations={iterations}: must be >= 0")
        self.lr_schedule.cover(self.iteration + iterations)  # unsized: spans this call
        is_one = callback is None or callable(callback) or not isinstance(callback, Sequence)
        callbacks = [] if callback is None else [callback] if is_one else list(callback)
        for cb in callbacks:
            check_callback(cb, "callback")
        bar = ProgressBar(iterations, self.name) if progress_bar else None
        callbacks = [bar, *callbacks] if bar is not None else callbacks
        history: list[dict[str, float]] = []
        for cb in callbacks:
            if hasattr(cb, "on_learn_start"):
                cb.on_learn_start(self)
        try:
            for _ in range(iterations):
                metrics = self.step()
                history.append(metrics)
                if any([cb(self, metrics) is False for cb in callbacks]):
                    break
        finally:
            if bar is not None:
                bar.close()
        for cb in callbacks:
            if hasattr(cb, "on_learn_end"):
                cb.on_learn_end(self, history)
        return history

    def step(self) -> dict[str, float]:
        """One iteration: collect a batch, update on it, return the metrics."""
        batch, dropped = self.collect()
        metrics = self.train_on_batch(batch)
        self.iteration += 1
        metrics.update(self.counters())
        if self.config.dynamic_sampling:
            metrics["groups_dropped"] = float(dropped)
        metrics.update(reward_component_means(self.env))  # CombinedReward's parts, if any
        return metrics

    def counters(self) -> dict[str, float]:
        """``iteration``, ``tokens_generated`` and the ``learning_rate`` after the update."""
        return {
            "iteration": float(self.iteration),
            "tokens_generated": float(self.tokens_generated),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
        }

    # ---------------------------------------------------------------- rollout
    def collect(self) -> tuple[RolloutBatch, int]:
        """One batch of ``env.num_envs`` completions; with dynamic sampling, groups
        whose rewards are all equal are dropped and replaced by fresh draws.

        Returns:
            ``(batch, groups_dropped)``.
        """
        if not self.config.dynamic_sampling:
            return self._draw(), 0
        batch, dropped = draw_with_signal(
            self._draw, self.env.num_prompts, self.config.max_resample
        )
        # Data parallel: every rank keeps as many groups as the rank that found fewest,
        # so minibatches hold equal shares of rows.
        groups = batch.group_ids.unique()
        fewest = int(self.group.all_reduce_min(torch.tensor([groups.numel()])))
        if fewest < groups.numel():
            batch = batch.select(torch.isin(batch.group_ids, groups[:fewest]))
        return batch, int(self.group.all_reduce_sum(torch.tensor([dropped])))

    def _draw(self) -> RolloutBatch:
        seed = None if self._env_seeded else self.config.seed
        self._env_seeded = True
        try:
            if self.env.autoreset:
                if self._collector is None:
                    self._collector = ContinuousCollector(self.env, self.policy, seed=seed)
                    self._collector.generator = self.generator
                batch = self._collector.collect(self.env.num_prompts)
            else:
                batch = collect(self.env, self.policy, seed=seed, generator=self.generator)
        except RuntimeError as error:
            if "probability tensor contains" not in str(error):
                raise
            raise NonFiniteUpdateError(
                f"the policy's next-token probabilities are NaN/inf in the rollout of iteration "
                f"{self.iteration + 1}: the weights diverged (learning_rate="
                f"{self.config.learning_rate}). Resume from the last checkpoint with a lower "
                "learning_rate"
            ) from error
        self.tokens_generated += int(batch.lengths.sum())
        return batch

    # ---------------------------------------------------------------- update
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """One update on a rollout batch; returns its metrics."""
        cfg = self.config
        batch = batch.to(self.policy.device)
        with phase(PREPARE):
            data = self.prepare(batch)
        micro_batches: list[tuple[Tensor, MicroBatchLoss]] = []
        step_terms: list[dict[str, float]] = []
        grad_norms: list[float] = []
        skipped = 0
        for epoch in range(cfg.update_epochs):
            order = torch.randperm(batch.batch_size, generator=self._shuffle).to(data.mask.device)
            for index, minibatch in enumerate(order.chunk(cfg.num_minibatches)):
                counts = Counts.of(data.mask[minibatch], self.group)
                if counts.tokens == 0:
                    continue  # every row masked out: nothing to learn from
                where = f"iteration {self.iteration + 1}, epoch {epoch + 1}, minibatch {index + 1}"
                try:
                    parts, terms, norm = self._minibatch_step(data, minibatch, counts, where)
                except NonFiniteUpdateError:
                    self.optimizer.zero_grad(set_to_none=True)
                    if not cfg.skip_nonfinite:
                        raise
                    skipped += 1
                    continue
                micro_batches += parts
                step_terms.append(terms)
                grad_norms.append(norm)
        with phase(METRICS):
            metrics = update_metrics(
                batch,
                data,
                micro_batches,
                step_terms,
                grad_norms,
                self.clip_metrics,
                self.group,
            )
        if cfg.skip_nonfinite:
            metrics["nonfinite_steps_skipped"] = float(skipped)
        return metrics

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch) -> PreparedBatch:
        """Everything the update needs that does not change during it.

        ``lp_old`` (recomputed, or the sampler's), ``lp_ref``, ``V_old``; rewards with
        overlong shaping and, when the KL sits in the reward, ``- beta * k1``; then
        advantages (whitened if asked). Masked rows keep their real score in every
        statistic and leave the loss only (docs/algorithms.md#conventions).
        """
        cfg = self.config
        ids, attn = batch.input_ids()
        groups = batch.group_ids  # a group's prompt runs once in each teacher-forced pass
        length = batch.max_new_tokens
        completion = batch.completion_mask
        mask = completion & batch.valid[:, None]
        old_logprobs: Tensor | None = batch.sampler_logprobs
        if cfg.recompute_old_logprobs:
            # One pass over one minibatch: lp_old = sg(lp) of the update's own forward.
            single_pass = cfg.update_epochs == 1 and cfg.num_minibatches == 1
            old_logprobs = None if single_pass else self._logprobs(ids, attn, length, groups)
        ref_logprobs = None
        if self.ref_policy is not None:
            ref_logprobs = self.ref_policy.logprobs(
                ids, attn, length, group_ids=groups, with_entropy=False
            )[0]
        values = None
        if self.critic is not None:
            values = self.critic.values(ids, attn, length, group_ids=groups)

        # Advantages of the union batch over data-parallel ranks (one rank: the batch),
        # so batch-wide statistics are global; this rank keeps its own rows.
        union, mine = self.group.gather_batch(batch, pad_id=0)
        rewards = union.rewards
        if cfg.overlong_cache is not None:
            shaping = overlong_penalty(union.lengths, length, cfg.overlong_cache)
            rewards = rewards + shaping[:, None] * union.dones
        if cfg.beta > 0 and cfg.kl_placement == "reward":
            lp_old = old_logprobs
            if lp_old is None:
                lp_old = self._logprobs(ids, attn, length, groups)
            kl_inputs = self.group.gather_rows(lp_old), self.group.gather_rows(ref_logprobs)
            rewards = kl_in_reward(rewards, *kl_inputs, union.completion_mask, cfg.beta)
        union_values = self.group.gather_rows(values) if values is not None else None
        advantages, returns = self.advantages(union, rewards, union.completion_mask, union_values)
        if cfg.whiten_advantages:
            advantages = whiten(advantages, union.completion_mask)
        advantages = advantages[mine]
        returns = returns[mine] if returns is not None else None
        where = f"iteration {self.iteration + 1}"
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

    def _logprobs(self, ids: Tensor, attn: Tensor, length: int, groups: Tensor) -> Tensor:
        with torch.no_grad():
            return self.policy.logprobs(ids, attn, length, group_ids=groups, with_entropy=False)[0]

    def micro_batch_loss(self, data: PreparedBatch, counts: Counts) -> MicroBatchLoss:
        """The loss of one micro-batch (rows of ``data``), normalised by the minibatch's
        ``counts``: ``agg(tis * (l_policy + beta*k) - c_H*H) + sum_k c_k * extra_k``."""
        cfg = self.config
        hidden = self.policy.sequence_hidden(
            data.ids, data.attn, data.max_new_tokens, data.group_ids
        )
        logprobs, entropy = self.policy.logprobs_from_hidden(hidden, data.ids)
        out = PolicyOutput(logprobs, entropy, hidden)
        old = data.old_logprobs if data.old_logprobs is not None else logprobs.detach()
        loss_tokens, ratio = self.policy_loss(logprobs, old, data.advantages, data.mask)
        tis = None
        if cfg.tis_cap is not None:
            tis = tis_weights(old, data.sampler_logprobs, cfg.tis_cap)
            loss_tokens = tis * loss_tokens
        if cfg.beta > 0 and cfg.kl_placement == "loss":
            kl = kl_estimator(cfg.kl_estimator)(logprobs, data.ref_logprobs)
            loss_tokens = loss_tokens + cfg.beta * kl
        if cfg.entropy_coef:
            loss_tokens = loss_tokens - cfg.entropy_coef * entropy
        policy_loss = aggregate(
            loss_tokens,
            data.mask,
            cfg.loss_aggregation,
            num_sequences=counts.sequences,
            num_tokens=counts.tokens,
            max_len=counts.max_len,
        )
        total, terms = policy_loss, {"policy_loss": policy_loss.detach()}
        for name, (coefficient, term) in self.extra_losses(data, out, counts).items():
            total = total + coefficient * term
            terms[name] = term.detach()
        return MicroBatchLoss(total, terms, old, ratio, tis, logprobs.detach(), entropy.detach())

    def _minibatch_step(
        self, data: PreparedBatch, minibatch: Tensor, counts: Counts, where: str
    ) -> tuple[list[tuple[Tensor, MicroBatchLoss]], dict[str, float], float]:
        """Accumulate the minibatch's gradient over micro-batches, check it, step.

        Returns:
            ``(each micro-batch's rows and loss, each loss term's minibatch value,
            gradient norm before clipping)``.
        """
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[Tensor, MicroBatchLoss]] = []
        if self.config.bucket_by_length:  # micro-batches of similar lengths, no padding computed
            minibatch = minibatch[data.lengths[minibatch].argsort(descending=True, stable=True)]
        chunks = minibatch.split(self.config.micro_batch_size or minibatch.numel())
        for index, rows in enumerate(chunks):
            micro = data.rows(rows)
            # Data parallel: the last micro-batch's backward sums the gradients over ranks.
            with self.parallel.micro_batch(last=index == len(chunks) - 1):
                with phase(LOSS):
                    loss = self.parallel(
                        micro.trimmed() if self.config.bucket_by_length else micro, counts
                    )
                with phase(BACKWARD):
                    loss.total.backward()
            parts.append((rows, loss))
        with phase(OPTIMIZER):
            return parts, *self._sync_check_step(parts, where)

    def _sync_check_step(
        self, parts: list[tuple[Tensor, MicroBatchLoss]], where: str
    ) -> tuple[dict[str, float], float]:
        """Sum terms over ranks, check them and the gradients (summed over ranks by the
        last micro-batch's backward), clip, step, check the weights."""
        # Each rank's terms are its share of the minibatch's: sum them.
        names = sorted(parts[0][1].terms)
        summed = torch.stack([sum(loss.terms[n] for _, loss in parts) for n in names])
        terms = dict(zip(names, self.group.all_reduce_sum(summed.double()).tolist(), strict=True))
        for name, value in terms.items():
            check_finite(name, torch.tensor(value), where)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = total_grad_norm(params)
        check_finite("grad_norm", norm, where)
        clip_grads(params, self.config.max_grad_norm, norm)
        self.optimizer.step()
        self.lr_schedule.step()
        check_parameters(params, where, self.config.learning_rate)
        return terms, float(norm)

    def evaluate(
        self, env: TokenVectorEnv, num_batches: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """``lmgym.rollout.score_policy`` on an env of its own: never the training env,
        whose prompt stream and in-flight episodes would move; no training RNG moves
        (``lmgym.training.evaluate_policy`` adds pass@k and samples)."""
        if env is self.env:
            raise ValueError(
                "env: evaluate needs an env of its own; the training env's prompt stream and "
                "in-flight episodes would move. Build a second env, e.g. "
                "gymnasium.make_vec(task_id, num_envs=..., tokenizer=policy.tokenizer)"
            )
        return score_policy(env, self.policy, num_batches, seed)

    # -------------------------------------------------------------- save/load
    def save(self, path: str | Path) -> Path:
        """Write the agent to the directory ``path`` atomically: policy, optimizer,
        schedule, RNGs, prompt stream, counters and config, with a SHA-256 manifest
        (the layout and guarantees: ``lmgym.persistence.agent``, docs/reliability.md)."""
        return save_agent(self, path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        device: torch.device | str = "cpu",
    ) -> Agent:
        """Rebuild an agent saved with ``save`` (same weights, optimizer, RNGs, config
        and prompt stream; nothing unpickled, the manifest verified first). Raises
        as ``lmgym.persistence.agent.load_agent`` documents."""
        return load_agent(cls, path, env, ref_policy, device)
