"""The learn loop shared by every agent: collect, prepare, update (docs/algorithms.md).

A subclass composes an algorithm from the hooks below, choosing an advantage
estimator and a ratio rule (pure functions in their own modules, docs/algorithms.md)
in one short file; this class adds, from the config, the KL term, TIS, the
aggregation, minibatching, non-finite guards, clipping and the metrics of
docs/metrics.md. One iteration (``step``)::

    batch  = collect()                      # env x policy -> RolloutBatch (rollout_source)
    data   = prepare(batch)                 # lp_old, lp_ref, V_old, rewards -> advantages (prepare)
    for epoch, minibatch of whole rows:     # train_on_batch
        counts = Counts.of(data.mask[minibatch])
        for micro-batch in minibatch:       # _minibatch_step
            loss = agg(tis * (l_policy + beta*k) - c_H*H) + sum_k c_k * extra_k
            loss.backward()                 # micro_batch_loss: each part normalised by counts
        sum over ranks, check, clip, optimizer.step()   # optim.sync_check_step
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from lmgym.agents.aggregation import aggregate
from lmgym.agents.callbacks import Callback, LearnCallbacks
from lmgym.agents.config import AgentConfig, build_config, check_complete, resolve_models
from lmgym.agents.kl import kl_estimator
from lmgym.agents.metrics import rule_clip_fractions
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.optim import optim_and_schedule, sync_check_step, trainable_parameters
from lmgym.agents.prepare import prepare_batch
from lmgym.agents.ratios import tis_weights
from lmgym.agents.records import (
    Counts,
    LossModules,
    MicroBatchLoss,
    PolicyOutput,
    PreparedBatch,
    UpdateLog,
)
from lmgym.agents.report import update_metrics
from lmgym.agents.rollout_source import RolloutSource, collect_batch, seeded_generators
from lmgym.distributed import DataParallelGroup
from lmgym.envs.rewards import reward_component_means
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.parallel import build_update
from lmgym.persistence.agent import load_agent, save_agent
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.value import Critic
from lmgym.profiling import BACKWARD, LOSS, METRICS, OPTIMIZER, PREPARE, phase
from lmgym.rollout import score_policy
from lmgym.types import RolloutBatch

ConfigT = TypeVar("ConfigT", bound=AgentConfig)


class Agent(Generic[ConfigT]):
    """Base of all lmgym agents (``Agent(policy, env, **config).learn(...)``).

    Args:
        policy: the policy to train, updated in place; or a hub name / local directory
            to load one from (``lmgym.agents.config.resolve_models``).
        env: an lmgym ``TokenVectorEnv`` (episode-synchronous or autoreset).
        ref_policy: frozen reference for the KL term; required when ``beta > 0``,
            optional otherwise (then only used to log KL to the reference).
        config: the algorithm's config dataclass (default: its documented defaults).
        process_group: the learners' ``torch.distributed`` group (docs/distributed.md).
        **overrides: config fields to change, e.g. ``learning_rate=3e-4``.
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
        self.policy, self.env, self.ref_policy = resolve_models(
            self.config, policy, env, ref_policy
        )
        self.check_config()
        check_complete(self.config, self.env.num_envs)

        self.critic: Critic | None = self.make_critic() if self.uses_critic else None
        self.group = DataParallelGroup(process_group)
        self.group.check_same_on_every_rank(f"{self.name} config", dataclasses.asdict(self.config))
        # The update's trainable modules under DDP (gradients summed over ranks) or as
        # FSDP2-sharded replicas; one process calls the loss directly. The loss runs
        # ``parallel.modules`` and the optimizer updates theirs (FSDP: the replicas'
        # shards). Looked up per call: a probe may shadow it.
        self.parallel = build_update(
            self.config.data_parallel,
            LossModules(self.policy, self.critic),
            lambda data, counts, modules: self.micro_batch_loss(data, counts, modules),
            self.group,
        )
        modules = self.parallel.modules
        self.optimizer, self.lr_schedule = optim_and_schedule(
            trainable_parameters(modules.policy, modules.critic), self.config
        )
        self.generator, self._shuffle = seeded_generators(
            self.config.seed, self.policy.device, self.group.rank
        )
        self.rollouts = RolloutSource(self.env, self.policy, self.generator, self.config.seed)
        self.iteration = self.tokens_generated = 0

    # ------------------------------------------------------------ algorithm
    def check_config(self) -> None:
        """Algorithm-specific validation; raise ``ValueError`` naming the field."""

    def make_critic(self) -> Critic:
        raise NotImplementedError

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """``(advantages [B, L], value targets [B, L] or None)``, detached; ``mask``
        (``[B, L] bool``) marks every real completion token, masked rows included: statistics
        use every row's real score (docs/algorithms.md#conventions)."""
        raise NotImplementedError

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(per-token loss [b, L], ratio [b, L] or None)`` for one micro-batch; a
        sequence-level rule broadcasts its per-sequence loss to the row's tokens."""
        raise NotImplementedError

    def extra_losses(
        self, data: PreparedBatch, out: PolicyOutput, counts: Counts
    ) -> dict[str, tuple[float, Tensor]]:
        """Further loss terms of one micro-batch, none by default: name -> ``(coefficient,
        term)``, each term 0-dim and normalised by the minibatch's ``counts`` (summed over
        micro-batches, the minibatch's value); ``coefficient * term`` joins the loss and the
        unweighted term is logged under its name."""
        return {}

    def clip_range(self) -> tuple[float, float] | None:
        """``(low, high)`` half-widths of the ratio interval this rule clips, if any."""
        return None

    def clip_metrics(self, ratio: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
        """How often the rule's clip bound, on the update's ``[b, L]`` tokens."""
        return rule_clip_fractions(
            ratio, advantages, mask, self.clip_range(), self.clip_zeroes_gradient
        )

    # ------------------------------------------------------------------ learn
    def learn(
        self,
        iterations: int,
        callback: Callback | Sequence[Callback] | None = None,
        progress_bar: bool = False,
    ) -> list[dict[str, float]]:
        """Run ``iterations`` of collect + update; return each one's metrics (docs/metrics.md).

        Args:
            iterations: rollout batches to collect and train on.
            callback: one or a list, called in order after each iteration; ``False`` stops
                learning (the protocol: ``lmgym.agents.callbacks.Callback``).
            progress_bar: show a tqdm bar with live reward/KL/length.
        """
        if iterations < 0:
            raise ValueError(f"iterations={iterations}: must be >= 0")
        self.lr_schedule.cover(self.iteration + iterations)  # unsized: spans this call
        with LearnCallbacks(self, callback, iterations, progress_bar) as callbacks:
            for _ in range(iterations):
                if not callbacks.after(self.step()):
                    break
        return callbacks.history

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

    def count_update(self, tokens_generated: int) -> None:
        """Count an update trained outside ``step`` (an asynchronous learner's), with the
        run's completion tokens so far (sampled by the actors)."""
        self.iteration += 1
        self.tokens_generated = tokens_generated

    def counters(self) -> dict[str, float]:
        """``iteration``, ``tokens_generated`` and the ``learning_rate`` after the update."""
        return {
            "iteration": float(self.iteration),
            "tokens_generated": float(self.tokens_generated),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
        }

    def collect(self) -> tuple[RolloutBatch, int]:
        """``(batch of env.num_envs completions, groups_dropped)`` (``rollout_source``);
        the completion tokens sampled are counted in ``tokens_generated``."""
        batch, dropped, tokens = collect_batch(
            self.rollouts, self.config, self.group, self.iteration
        )
        self.tokens_generated += tokens
        return batch, dropped

    # ---------------------------------------------------------------- update
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """One update on a rollout batch; returns its metrics."""
        cfg = self.config
        batch = batch.to(self.policy.device)
        with phase(PREPARE):
            data = self.prepare(batch)
        log = UpdateLog()
        for epoch in range(cfg.update_epochs):
            order = torch.randperm(batch.batch_size, generator=self._shuffle).to(data.mask.device)
            for index, minibatch in enumerate(order.chunk(cfg.num_minibatches)):
                counts = Counts.of(data.mask[minibatch], self.group)
                if counts.tokens == 0:
                    continue  # every row masked out: nothing to learn from
                where = f"iteration {self.iteration + 1}, epoch {epoch + 1}, minibatch {index + 1}"
                try:
                    log.add(*self._minibatch_step(data, minibatch, counts, where))
                except NonFiniteUpdateError:
                    self.optimizer.zero_grad(set_to_none=True)
                    if not cfg.skip_nonfinite:
                        raise
                    log.skipped += 1
        with phase(METRICS):
            metrics = update_metrics(batch, data, log, self.clip_metrics, self.group)
        if cfg.skip_nonfinite:
            metrics["nonfinite_steps_skipped"] = float(log.skipped)
        return metrics

    def prepare(self, batch: RolloutBatch) -> PreparedBatch:
        """What the update reads and never changes (``lmgym.agents.prepare``)."""
        return prepare_batch(self, batch)

    def micro_batch_loss(
        self, data: PreparedBatch, counts: Counts, modules: LossModules
    ) -> MicroBatchLoss:
        """The loss of one micro-batch (rows of ``data``), normalised by the minibatch's
        ``counts``: ``agg(tis * (l_policy + beta*k) - c_H*H) + sum_k c_k * extra_k``,
        computed by ``modules`` (``parallel.modules``: the agent's own policy and
        critic, or FSDP's views of them on the sharded replicas)."""
        cfg = self.config
        out = forward_pass(modules, data)
        logprobs, entropy = out.logprobs, out.entropy
        old = data.old_logprobs if data.old_logprobs is not None else logprobs.detach()
        loss_tokens, ratio = self.policy_loss(logprobs, old, data.advantages, data.mask)
        tis = None
        if cfg.tis_cap is not None:
            tis = tis_weights(old, data.sampler_logprobs, cfg.tis_cap)
            loss_tokens = tis * loss_tokens
        if cfg.beta > 0 and cfg.kl_placement == "loss":
            assert data.ref_logprobs is not None  # beta > 0 has a reference policy
            kl = kl_estimator(cfg.kl_estimator)(logprobs, data.ref_logprobs)
            loss_tokens = loss_tokens + cfg.beta * kl
        if cfg.entropy_coef:
            loss_tokens = loss_tokens - cfg.entropy_coef * entropy
        policy_loss = aggregate(
            loss_tokens, data.mask, cfg.loss_aggregation, **counts.normalisers()
        )
        total, terms = policy_loss, {"policy_loss": policy_loss.detach()}
        for name, (coefficient, term) in self.extra_losses(data, out, counts).items():
            total = total + coefficient * term
            terms[name] = term.detach()
        return MicroBatchLoss(total, terms, old, ratio, tis, logprobs.detach(), entropy.detach())

    def _minibatch_step(
        self, data: PreparedBatch, minibatch: Tensor, counts: Counts, where: str
    ) -> tuple[list[tuple[Tensor, MicroBatchLoss]], dict[str, float], float]:
        """Accumulate the minibatch's gradient over micro-batches, then sum it over
        ranks, check it, clip and step (``lmgym.agents.optim.sync_check_step``).

        Returns:
            ``(each micro-batch's rows and loss, each loss term's minibatch value,
            gradient norm before clipping)``.
        """
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[Tensor, MicroBatchLoss]] = []
        if self.config.bucket_by_length:  # micro-batches of similar lengths, no padding computed
            minibatch = minibatch[data.lengths[minibatch].argsort(descending=True, stable=True)]
        chunks = minibatch.split(self.config.micro_batch_size or minibatch.numel())
        # FSDP: every forward is a collective, so a rank with fewer micro-batches than
        # another repeats its last one with the loss times zero (nothing added).
        steps = self.parallel.micro_batch_count(len(chunks))
        for index in range(steps):
            rows = chunks[min(index, len(chunks) - 1)]
            micro = data.rows(rows)
            # Data parallel: the last micro-batch's backward sums the gradients over ranks.
            with self.parallel.micro_batch(last=index == steps - 1):
                with phase(LOSS):
                    loss = self.parallel(
                        micro.trimmed() if self.config.bucket_by_length else micro, counts
                    )
                with phase(BACKWARD):
                    (loss.total if index < len(chunks) else 0.0 * loss.total).backward()
            if index < len(chunks):
                parts.append((rows, loss))
        with phase(OPTIMIZER):
            terms, norm = sync_check_step(
                parts, self.optimizer, self.lr_schedule, self.group, self.config, where
            )
            self.parallel.after_step()  # FSDP: the full updated weights on every rank
        return parts, terms, norm

    def evaluate(
        self, env: TokenVectorEnv, num_batches: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """``lmgym.rollout.score_policy`` on an env other than the training env; no
        training RNG moves (``lmgym.training.evaluate_policy`` adds pass@k, samples)."""
        return score_policy(env, self.policy, num_batches, seed, training_env=self.env)

    # -------------------------------------------------------------- save/load
    def state_dict(self) -> dict[str, Any]:
        """Everything besides the weights and the config needed to continue exactly:
        tensors and plain data (``lmgym.persistence.agent`` writes it as ``agent_state.pt``).

        Keys: ``algorithm``, ``iteration``, ``tokens_generated``, ``optimizer``,
        ``lr_scheduler``, ``generator`` and ``shuffle`` (RNG states), ``critic`` (its
        head, and trunk when separate), ``env`` (the prompt stream, once started),
        ``helpers`` (every dataclass attribute but the config, e.g. REINFORCE's EMA
        baseline) and ``sampling`` (the policy's ``from_pretrained`` settings).
        """
        helpers = {
            name: dataclasses.asdict(value)
            for name, value in vars(self).items()
            if dataclasses.is_dataclass(value)
            and not isinstance(value, type)
            and value is not self.config
        }
        return {
            "algorithm": self.name,
            "iteration": self.iteration,
            "tokens_generated": self.tokens_generated,
            "optimizer": self.parallel.optimizer_state_dict(self.optimizer),
            "lr_scheduler": self.lr_schedule.state_dict(),
            "generator": self.generator.get_state(),
            "shuffle": self._shuffle.get_state(),
            "critic": self.critic.state_dict_for_save() if self.critic is not None else None,
            "env": self.rollouts.state(),
            "helpers": helpers,
            "sampling": self.policy.settings(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what ``state_dict`` returned (on an agent built with the same
        config and weights); ``sampling`` is read by the loader, not here."""
        self.lr_schedule.restore_length(state.get("lr_scheduler"))
        self.parallel.load_optimizer_state_dict(self.optimizer, state["optimizer"])
        self.lr_schedule.load_state_dict(state.get("lr_scheduler"))
        self.generator.set_state(state["generator"].cpu())
        self._shuffle.set_state(state["shuffle"].cpu())
        if self.critic is not None and state["critic"] is not None:
            self.critic.load_from_save(state["critic"])
        for name, values in state.get("helpers", {}).items():
            helper = getattr(self, name, None)
            if helper is not None:
                for key, value in values.items():
                    setattr(helper, key, value)
        self.iteration = state["iteration"]
        self.tokens_generated = state["tokens_generated"]
        self.rollouts.restore(state.get("env"))

    def save(self, path: str | Path) -> Path:
        """Write the agent to the directory ``path`` atomically (``lmgym.persistence.agent``)."""
        return save_agent(self, path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        device: torch.device | str = "cpu",
    ) -> Agent:
        """Rebuild an agent saved with ``save`` (``lmgym.persistence.agent.load_agent``)."""
        return load_agent(cls, path, env, ref_policy, device)


def forward_pass(modules: LossModules, data: PreparedBatch) -> PolicyOutput:
    """One micro-batch's forward pass through ``modules``: the policy's teacher-forced
    log-probs and entropies of ``data``'s completions and, with a critic, its values
    (from the policy's hidden states when the trunk is shared)."""
    policy, critic = modules.policy, modules.critic
    hidden = policy.sequence_hidden(data.ids, data.attn, data.max_new_tokens, data.group_ids)
    logprobs, entropy = policy.logprobs_from_hidden(hidden, data.ids)
    values = None
    if critic is not None:
        values = critic.values(
            data.ids, data.attn, data.max_new_tokens, hidden=hidden, group_ids=data.group_ids
        )
    return PolicyOutput(logprobs, entropy, hidden, values)
