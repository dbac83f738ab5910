"""The learn loop shared by every agent: collect, score, estimate advantages, update.

An algorithm is a composition (DESIGN.md, principle 3). A subclass chooses:

- ``advantages(batch, rewards, mask, values)``: the advantage estimator;
- ``policy_loss(logprobs, old_logprobs, advantages, mask)``: the ratio rule,
  returning a per-token loss ``[B, L]`` (a sequence-level rule broadcasts its
  per-sequence loss to the row's tokens, which ``seq-mean-token-mean`` turns back
  into a mean over sequences);

and this base class adds, from the config: the KL term (in the reward or in the
loss), the TIS correction, the aggregation, the value loss (when the agent has a
critic), minibatching with whole-batch normalisers, gradient clipping and the
metrics of ALGORITHMS.md.

One update, top to bottom (``train_on_batch``):

1. ``lp_old`` (recomputed on the learner, or the sampler's), ``lp_ref``, ``V_old``;
2. rewards: + overlong shaping, - beta*k1 when the KL sits in the reward;
3. advantages (detached), optional whitening;
4. for each epoch, each minibatch of whole rows, each micro-batch:
   ``loss = agg(tis * (l_policy + beta*k)) - c_H*H + vf_coef*agg(l_value)``,
   normalised by the minibatch's counts, so micro-batching cannot change it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from lmgym.agents.advantages import whiten
from lmgym.agents.aggregation import aggregate
from lmgym.agents.config import AgentConfig, build_config, check_common, check_types
from lmgym.agents.dapo import drop_flat_groups, overlong_penalty
from lmgym.agents.kl import kl_estimator, kl_in_reward, kl_k1, kl_k3
from lmgym.agents.metrics import (
    approx_kl,
    clip_fractions,
    effective_sample_size,
    entropy_mean,
    frac_reward_zero_std,
    masked_mean,
    masked_std,
    ratio_stats,
)
from lmgym.agents.numerics import (
    NonFiniteUpdateError,
    check_finite,
    check_parameters,
    clip_grads,
    total_grad_norm,
)
from lmgym.agents.ratios import tis_weights
from lmgym.agents.value import clipped_value_loss, explained_variance
from lmgym.envs.rewards import reward_component_means
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.value import Critic
from lmgym.rollout import ContinuousCollector, collect, concat_batches
from lmgym.types import RolloutBatch

ConfigT = TypeVar("ConfigT", bound=AgentConfig)
Callback = Callable[["Agent", dict[str, float]], bool | None]
"""Called after every iteration with the agent and its metrics; returning False stops learning.

A callback object may also define ``on_learn_start(agent)`` and
``on_learn_end(agent, history)``; ``learn`` calls them, when present, before the
first and after the last iteration (``lmgym.training.callbacks`` has ready ones:
early stop at a threshold, periodic evaluation, sample printing, logging,
checkpoints)."""

STATE_FILE = "agent_state.pt"
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "agent_config.json"
POLICY_DIR = "policy"


class Agent(Generic[ConfigT]):
    """Base of all lmgym agents (``Agent(policy, env, **config).learn(...)``).

    Args:
        policy: the policy to train; its model is updated in place.
        env: an lmgym ``TokenVectorEnv`` (episode-synchronous or autoreset).
        ref_policy: frozen reference for the KL term; required when ``beta > 0``,
            optional otherwise (then only used to log KL to the reference).
        config: the algorithm's config dataclass (default: its documented defaults).
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
        policy: CausalLMPolicy,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        config: ConfigT | None = None,
        **overrides: Any,
    ) -> None:
        self.config: ConfigT = build_config(self.config_class, config, overrides)  # type: ignore[assignment]
        check_common(self.config)
        if not isinstance(env, TokenVectorEnv):
            raise TypeError(
                f"env: expected an lmgym TokenVectorEnv (e.g. gymnasium.make_vec('lmgym/...')), "
                f"got {type(env).__name__}"
            )
        policy.check_env(env)
        if self.config.beta > 0 and ref_policy is None:
            raise ValueError(
                f"ref_policy: beta={self.config.beta} needs a frozen reference policy; pass "
                "ref_policy=lmgym.policy.value.frozen_copy(policy) or set beta=0"
            )
        if ref_policy is not None:
            ref_policy.check_env(env)
        self.policy, self.env, self.ref_policy = policy, env, ref_policy
        self.check_config()
        check_types(self.config)  # any choice field the algorithm's own checks missed
        self._check_batch_split()

        self.critic: Critic | None = self.make_critic() if self.uses_critic else None
        params = [p for p in policy.model.parameters() if p.requires_grad]
        if self.critic is not None:
            params += self.critic.own_parameters()
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.config.learning_rate,
            betas=self.config.adam_betas,
            weight_decay=self.config.weight_decay,
        )
        self.generator = torch.Generator(device=policy.device)
        self.generator.manual_seed(self.config.seed)
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
        """``(advantages [B, L], value targets [B, L] or None)``, detached."""
        raise NotImplementedError

    def policy_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(per-token loss [b, L], ratio [b, L] or None)`` for one micro-batch."""
        raise NotImplementedError

    def clip_range(self) -> tuple[float, float] | None:
        """``(low, high)`` half-widths of the ratio interval this rule clips, if any."""
        return None

    # ---------------------------------------------------------------- checks
    def _check_batch_split(self) -> None:
        rows = self.env.num_envs
        if rows % self.config.num_minibatches != 0:
            raise ValueError(
                f"num_minibatches={self.config.num_minibatches} does not divide the batch of "
                f"{rows} rows (num_prompts * group_size); pick a divisor of {rows}"
            )

    # ---------------------------------------------------------------- rollout
    def collect(self) -> tuple[RolloutBatch, int]:
        """One batch of ``env.num_envs`` completions; with dynamic sampling, groups
        whose rewards are all equal are dropped and replaced by fresh draws.

        Returns:
            ``(batch, groups_dropped)``.
        """
        if not self.config.dynamic_sampling:
            return self._draw(), 0
        kept: list[RolloutBatch] = []
        have, dropped = 0, 0
        want = self.env.num_prompts
        for _ in range(1 + self.config.max_resample):
            drawn = self._draw()
            batch, flat = drop_flat_groups(drawn)
            dropped += flat
            if batch.batch_size:
                kept.append(batch)
                have += batch.group_ids.unique().numel()
            if have >= want:
                break
        if not kept:
            # Every group of every draw was flat (the usual start of a sparse task):
            # train on the last draw as plain GRPO would; its advantages are all 0.
            return drawn, dropped
        batch = concat_batches(kept)
        groups = batch.group_ids.unique()[:want]
        return batch.select(torch.isin(batch.group_ids, groups)), dropped

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
    def _forward(self, ids: Tensor, attn: Tensor, length: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(logprobs, entropy, hidden)`` of the policy on ``[b, S]`` inputs."""
        hidden = self.policy.sequence_hidden(ids, attn, length)
        logprobs, entropy = self.policy.logprobs_from_hidden(hidden, ids)
        return logprobs, entropy, hidden

    @torch.no_grad()
    def _prepare(self, batch: RolloutBatch) -> dict[str, Tensor | None]:
        """Everything the update needs that does not change during it."""
        cfg = self.config
        ids, attn = batch.input_ids()
        length = batch.max_new_tokens
        # Masked rows (``valid`` False, e.g. unfinished="mask") keep their real score in
        # every statistic (group baselines, batch means, whitening) and are dropped
        # from the loss only, as TRL's mask_truncated_completions does
        # (docs/algorithms.md#conventions).
        completion = batch.completion_mask.float()
        mask = completion * batch.valid[:, None]
        single_pass = cfg.update_epochs == 1 and cfg.num_minibatches == 1
        old_logprobs: Tensor | None = batch.sampler_logprobs
        if cfg.recompute_old_logprobs:
            # With one pass over one minibatch, lp_old = sg(lp) of the update's own
            # forward pass: same value, one forward pass fewer.
            old_logprobs = None if single_pass else self._logprobs_no_grad(ids, attn, length)
        ref_logprobs = None
        if self.ref_policy is not None:
            ref_logprobs = self.ref_policy.logprobs(ids, attn, length, with_entropy=False)[0]
        values = self.critic.values(ids, attn, length) if self.critic is not None else None

        rewards = batch.rewards
        if cfg.overlong_cache is not None:
            shaping = overlong_penalty(batch.lengths, length, cfg.overlong_cache)
            rewards = rewards + shaping[:, None] * batch.dones
        if cfg.beta > 0 and cfg.kl_placement == "reward":
            lp_old = (
                old_logprobs
                if old_logprobs is not None
                else self._logprobs_no_grad(ids, attn, length)
            )
            rewards = kl_in_reward(rewards, lp_old, ref_logprobs, completion, cfg.beta)
        advantages, returns = self.advantages(batch, rewards, completion, values)
        if cfg.whiten_advantages:
            advantages = whiten(advantages, completion)
        where = f"iteration {self.iteration + 1}"
        check_finite("advantages", advantages * mask, where)
        if returns is not None:
            check_finite("returns", returns * mask, where)
        return {
            "ids": ids,
            "attn": attn,
            "mask": mask,
            "old_logprobs": old_logprobs,
            "sampler_logprobs": batch.sampler_logprobs,
            "ref_logprobs": ref_logprobs,
            "advantages": advantages,
            "returns": returns,
            "values": values,
        }

    def _logprobs_no_grad(self, ids: Tensor, attn: Tensor, length: int) -> Tensor:
        with torch.no_grad():
            return self.policy.logprobs(ids, attn, length, with_entropy=False)[0]

    def micro_batch_loss(
        self, data: dict[str, Tensor | None], rows: Tensor, counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Any]]:
        """Loss of ``rows`` normalised by the minibatch ``counts``, and its raw stats."""
        cfg = self.config
        take = {k: (v[rows] if v is not None else None) for k, v in data.items()}
        ids, attn, mask = take["ids"], take["attn"], take["mask"]
        length = mask.shape[1]
        logprobs, entropy, hidden = self._forward(ids, attn, length)
        old = take["old_logprobs"] if take["old_logprobs"] is not None else logprobs.detach()
        loss_tokens, ratio = self.policy_loss(logprobs, old, take["advantages"], mask)
        tis = None
        if cfg.tis_cap is not None:
            tis = tis_weights(old, take["sampler_logprobs"], cfg.tis_cap)
            loss_tokens = tis * loss_tokens
        if cfg.beta > 0 and cfg.kl_placement == "loss":
            loss_tokens = loss_tokens + cfg.beta * kl_estimator(cfg.kl_estimator)(
                logprobs, take["ref_logprobs"]
            )
        if cfg.entropy_coef:
            loss_tokens = loss_tokens - cfg.entropy_coef * entropy
        agg = dict(num_sequences=counts["sequences"], num_tokens=counts["tokens"], max_len=length)
        loss = aggregate(loss_tokens, mask, cfg.loss_aggregation, **agg)
        stats: dict[str, Any] = {
            "logprobs": logprobs.detach(),
            "old_logprobs": old,
            "entropy": entropy.detach(),
            "ratio": ratio,
            "tis": tis,
            "mask": mask,
            "advantages": take["advantages"],
            "ref_logprobs": take["ref_logprobs"],
            "policy_loss": loss.detach(),
        }
        if self.critic is not None:
            values = self.critic.values(ids, attn, length, hidden=hidden)
            value_tokens = clipped_value_loss(
                values, take["values"], take["returns"], cfg.value_clip
            )  # type: ignore[attr-defined]
            value_loss = aggregate(value_tokens, mask, "token-mean", **agg)
            loss = loss + cfg.vf_coef * value_loss  # type: ignore[attr-defined]
            stats["value_loss"] = value_loss.detach()
        return loss, stats

    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """One update on a rollout batch; returns its metrics."""
        cfg = self.config
        batch = batch.to(self.policy.device)
        data = self._prepare(batch)
        mask = data["mask"]
        n = batch.batch_size
        stats: list[dict[str, Any]] = []
        step_losses: list[dict[str, float]] = []
        grad_norms: list[float] = []
        skipped = 0
        for epoch in range(cfg.update_epochs):
            order = torch.randperm(n, generator=self._shuffle).to(mask.device)
            for index, minibatch in enumerate(order.chunk(cfg.num_minibatches)):
                # B counts every row of the minibatch, masked ones included, so Dr. GRPO's
                # B * L_max is constant (docs/algorithms.md#conventions).
                counts = {
                    "sequences": float(minibatch.numel()),
                    "tokens": float(mask[minibatch].sum()),
                }
                if counts["tokens"] == 0:
                    continue  # every row masked out: nothing to learn from
                where = f"iteration {self.iteration + 1}, epoch {epoch + 1}, minibatch {index + 1}"
                try:
                    step_stats, losses, norm = self._minibatch_step(data, minibatch, counts, where)
                except NonFiniteUpdateError:
                    self.optimizer.zero_grad(set_to_none=True)
                    if not cfg.skip_nonfinite:
                        raise
                    skipped += 1
                    continue
                stats += step_stats
                step_losses.append(losses)
                grad_norms.append(norm)
        metrics = self._metrics(batch, data, stats, step_losses, grad_norms)
        if cfg.skip_nonfinite:
            metrics["nonfinite_steps_skipped"] = float(skipped)
        return metrics

    def _minibatch_step(
        self,
        data: dict[str, Tensor | None],
        minibatch: Tensor,
        counts: dict[str, float],
        where: str,
    ) -> tuple[list[dict[str, Any]], dict[str, float], float]:
        """Accumulate the minibatch's gradient over micro-batches, check it, step.

        Returns:
            ``(per-micro-batch stats, the minibatch's loss terms, gradient norm)``; each
            loss term is the sum of its micro-batch parts, i.e. the minibatch's value.
        """
        self.optimizer.zero_grad(set_to_none=True)
        stats: list[dict[str, Any]] = []
        losses: dict[str, float] = {}
        for rows in minibatch.split(self.config.micro_batch_size or minibatch.numel()):
            loss, micro_stats = self.micro_batch_loss(data, rows, counts)
            for name in ("policy_loss", "value_loss"):
                if name in micro_stats:
                    check_finite(name, micro_stats[name], where)
                    losses[name] = losses.get(name, 0.0) + float(micro_stats[name])
            check_finite("loss", loss, where)
            loss.backward()
            stats.append(micro_stats)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = total_grad_norm(params)
        check_finite("grad_norm", norm, where)
        clip_grads(params, self.config.max_grad_norm, norm)
        self.optimizer.step()
        check_parameters(params, where, self.config.learning_rate)
        return stats, losses, float(norm)

    # --------------------------------------------------------------- metrics
    @torch.no_grad()
    def _metrics(
        self,
        batch: RolloutBatch,
        data: dict[str, Tensor | None],
        stats: list[dict[str, Any]],
        step_losses: list[dict[str, float]],
        grad_norms: list[float],
    ) -> dict[str, float]:
        """Metrics of one update; loss terms are means over optimizer steps of each
        minibatch's value, so no metric depends on the micro-batch size."""
        scores = batch.scores
        metrics: dict[str, float] = {
            "reward_mean": scores.mean().item(),
            "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
            "completion_length": batch.lengths.float().mean().item(),
            "truncated_fraction": batch.truncated.float().mean().item(),
            "frac_reward_zero_std": frac_reward_zero_std(scores, batch.group_ids),
            "advantage_mean": masked_mean(data["advantages"], data["mask"]).item(),
            "advantage_std": masked_std(data["advantages"], data["mask"]).item(),
            "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
        }
        if not stats:
            return metrics

        def cat(key: str) -> Tensor:
            return torch.cat([s[key].reshape(s["mask"].shape[0], -1) for s in stats])

        mask = cat("mask")
        logprobs, old = cat("logprobs"), cat("old_logprobs")
        metrics["policy_loss"] = sum(s["policy_loss"] for s in step_losses) / len(step_losses)
        metrics["entropy"] = entropy_mean(cat("entropy"), mask)
        metrics["approx_kl"] = approx_kl(logprobs, old, mask)
        if stats[0]["ratio"] is not None:
            ratio = cat("ratio")
            metrics.update(ratio_stats(ratio, mask))
            bounds = self.clip_range()
            if bounds is not None:
                metrics.update(clip_fractions(ratio, cat("advantages"), mask, *bounds))
                if not self.clip_zeroes_gradient:
                    metrics["clip_zeroed_fraction"] = 0.0
        if stats[0]["tis"] is not None:
            weights = cat("tis")
            metrics["tis_weight_mean"] = masked_mean(weights, mask).item()
            metrics["tis_ess"] = effective_sample_size(weights, mask)
        if stats[0]["ref_logprobs"] is not None:
            ref = cat("ref_logprobs")
            metrics["kl_ref_k1"] = masked_mean(kl_k1(logprobs, ref), mask).item()
            metrics["kl_ref_k3"] = masked_mean(kl_k3(logprobs, ref), mask).item()
        if "value_loss" in stats[0]:
            metrics["value_loss"] = sum(s["value_loss"] for s in step_losses) / len(step_losses)
            metrics["explained_variance"] = explained_variance(
                data["values"], data["returns"], data["mask"]
            )
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
        if callback is None:
            callbacks: list[Callback] = []
        elif callable(callback):
            callbacks = [callback]
        else:
            callbacks = list(callback)
        history: list[dict[str, float]] = []
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=iterations, desc=self.name, unit="it")
        for cb in callbacks:
            start = getattr(cb, "on_learn_start", None)
            if start is not None:
                start(self)
        try:
            for _ in range(iterations):
                metrics = self.step()
                history.append(metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        reward=f"{metrics['reward_mean']:.3f}",
                        kl=f"{metrics.get('kl_ref_k3', metrics.get('approx_kl', 0.0)):.4f}",
                        len=f"{metrics['completion_length']:.1f}",
                    )
                answers = [cb(self, metrics) for cb in callbacks]
                if any(answer is False for answer in answers):
                    break
        finally:
            if bar is not None:
                bar.close()
        for cb in callbacks:
            end_hook = getattr(cb, "on_learn_end", None)
            if end_hook is not None:
                end_hook(self, history)
        return history

    def step(self) -> dict[str, float]:
        """One iteration: collect a batch, update on it, return the metrics."""
        batch, dropped = self.collect()
        metrics = self.train_on_batch(batch)
        self.iteration += 1
        metrics["iteration"] = float(self.iteration)
        metrics["tokens_generated"] = float(self.tokens_generated)
        if self.config.dynamic_sampling:
            metrics["groups_dropped"] = float(dropped)
        metrics.update(reward_component_means(self.env))  # CombinedReward's parts, if any
        return metrics

    @torch.no_grad()
    def evaluate(
        self, env: TokenVectorEnv, num_batches: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """Score the current policy on ``env``, without updating or moving any training state.

        Evaluation never draws from the training env: that would advance its prompt
        stream, consume an autoreset env's in-flight episodes and count generated
        tokens. The sampler uses its own generator seeded with ``seed``, so the same
        call gives the same result. (``lmgym.training.evaluate_policy`` adds pass@k
        and samples.)

        Args:
            env: an episode-synchronous env other than the training env.
            num_batches: rollout batches to draw (``env.num_envs`` completions each).
            seed: seeds ``env``'s prompt stream (reset) and the sampler.

        Returns:
            ``reward_mean``, ``reward_std`` and ``completion_length`` over the batches.
        """
        if env is self.env:
            raise ValueError(
                "env: evaluate needs an env of its own; the training env's prompt stream and "
                "in-flight episodes would move. Build a second env, e.g. "
                "gymnasium.make_vec(task_id, num_envs=..., tokenizer=policy.tokenizer)"
            )
        if env.autoreset:
            raise ValueError("env: evaluate needs an episode-synchronous env (autoreset=False)")
        generator = torch.Generator(device=self.policy.device)
        generator.manual_seed(seed)
        batches = [
            collect(env, self.policy, seed=seed if i == 0 else None, generator=generator)
            for i in range(num_batches)
        ]
        scores = torch.cat([b.scores for b in batches])
        lengths = torch.cat([b.lengths for b in batches]).float()
        return {
            "reward_mean": scores.mean().item(),
            "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
            "completion_length": lengths.mean().item(),
        }

    # -------------------------------------------------------------- save/load
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint to the directory ``path``, atomically.

        Contents: the policy (``save_pretrained``: safetensors weights, tokenizer),
        ``agent_state.pt`` (optimizer, sampler and shuffle RNG, the env's prompt
        stream, iteration and token counters, critic head, stateful helpers such as
        REINFORCE's EMA baseline, sampling settings), ``agent_config.json``, and last
        ``manifest.json`` (size and SHA-256 of every file). Everything is written
        under a temporary name and renamed into place at the end, so a crash
        mid-write leaves any previous checkpoint at ``path`` intact and never a
        partial one under that name; ``load`` verifies the manifest, so a file
        damaged later fails with a clear error.
        """
        from lmgym.training.manifest import write_manifest

        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        self.policy.save_pretrained(tmp / POLICY_DIR)
        helpers = {
            name: dataclasses.asdict(value)
            for name, value in vars(self).items()
            if dataclasses.is_dataclass(value)
            and not isinstance(value, type)
            and value is not self.config
        }
        state = {
            "algorithm": self.name,
            "iteration": self.iteration,
            "tokens_generated": self.tokens_generated,
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "shuffle": self._shuffle.get_state(),
            "critic": self.critic.state_dict_for_save() if self.critic is not None else None,
            "env": self.env.get_state() if self._env_seeded else None,
            "helpers": helpers,
            "sampling": {
                "temperature": self.policy.temperature,
                "top_k": self.policy.top_k,
                "top_p": self.policy.top_p,
            },
        }
        torch.save(state, tmp / STATE_FILE)
        (tmp / CONFIG_FILE).write_text(
            json.dumps({"algorithm": self.name, **asdict(self.config)}, indent=2)
        )
        write_manifest(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
        return path

    @classmethod
    def load(
        cls,
        path: str | Path,
        env: TokenVectorEnv,
        ref_policy: CausalLMPolicy | None = None,
        device: torch.device | str = "cpu",
    ) -> Agent:
        """Rebuild an agent saved with ``save``: same weights, optimizer, RNG, config,
        and the env's prompt stream (so the next batches are the ones the saved
        agent would have drawn).

        Raises:
            FileNotFoundError: ``path`` is not a checkpoint.
            lmgym.training.manifest.CheckpointError: a file is missing, truncated or
                altered (checked against ``manifest.json`` before anything is read).
            ValueError: the checkpoint holds another algorithm.
        """
        from lmgym.training.manifest import verify_manifest

        path = Path(path)
        for needed in (CONFIG_FILE, STATE_FILE, POLICY_DIR, MANIFEST_FILE):
            if not (path / needed).exists():
                raise FileNotFoundError(
                    f"{path} is not an lmgym checkpoint: {needed} is missing "
                    "(was it written by Agent.save?)"
                )
        verify_manifest(path)
        saved = json.loads((path / CONFIG_FILE).read_text())
        algorithm = saved.pop("algorithm")
        if algorithm != cls.name:
            raise ValueError(f"{path} holds a {algorithm!r} agent; load it with that class")
        if "adam_betas" in saved:
            saved["adam_betas"] = tuple(saved["adam_betas"])
        state = torch.load(path / STATE_FILE, map_location=device, weights_only=False)
        policy = CausalLMPolicy.from_pretrained(
            path / POLICY_DIR, device=device, **state["sampling"]
        )
        agent = cls(policy, env, ref_policy, config=cls.config_class(**saved))
        agent.optimizer.load_state_dict(state["optimizer"])
        agent.generator.set_state(state["generator"].cpu())
        agent._shuffle.set_state(state["shuffle"].cpu())
        if agent.critic is not None and state["critic"] is not None:
            agent.critic.load_from_save(state["critic"])
        for name, values in state.get("helpers", {}).items():
            helper = getattr(agent, name, None)
            if helper is not None:
                for key, value in values.items():
                    setattr(helper, key, value)
        agent.iteration = state["iteration"]
        agent.tokens_generated = state["tokens_generated"]
        if state.get("env") is not None:
            env.set_state(state["env"])
            agent._env_seeded = True
        return agent
