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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from lmgym.agents.advantages import whiten
from lmgym.agents.aggregation import aggregate
from lmgym.agents.config import AgentConfig, build_config, check_common
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
from lmgym.agents.ratios import tis_weights
from lmgym.agents.value import clipped_value_loss, explained_variance
from lmgym.envs.rewards import reward_component_means
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.persistence.agent import load_agent, save_agent
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
        kept: list[RolloutBatch] = []
        have, dropped = 0, 0
        want = self.env.num_prompts
        for attempt in range(1 + (self.config.max_resample if self.config.dynamic_sampling else 0)):
            batch = self._draw()
            if self.config.dynamic_sampling:
                batch, flat = drop_flat_groups(batch)
                dropped += flat
            kept.append(batch)
            have += batch.group_ids.unique().numel()
            if have >= want or attempt == self.config.max_resample:
                break
        batch = concat_batches(kept)
        if self.config.dynamic_sampling:
            groups = batch.group_ids.unique()[:want]
            batch = batch.select(torch.isin(batch.group_ids, groups))
        return batch, dropped

    def _draw(self) -> RolloutBatch:
        seed = None if self._env_seeded else self.config.seed
        self._env_seeded = True
        if self.env.autoreset:
            if self._collector is None:
                self._collector = ContinuousCollector(self.env, self.policy, seed=seed)
                self._collector.generator = self.generator
            batch = self._collector.collect(self.env.num_prompts)
        else:
            batch = collect(self.env, self.policy, seed=seed, generator=self.generator)
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
        mask = (batch.completion_mask & batch.valid[:, None]).float()
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
            rewards = kl_in_reward(rewards, lp_old, ref_logprobs, mask, cfg.beta)
        advantages, returns = self.advantages(batch, rewards, mask, values)
        if cfg.whiten_advantages:
            advantages = whiten(advantages, mask)
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
        grad_norms: list[float] = []
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, generator=self._shuffle).to(mask.device)
            for minibatch in order.chunk(cfg.num_minibatches):
                counts = {
                    "sequences": float((mask[minibatch].sum(1) > 0).sum()),
                    "tokens": float(mask[minibatch].sum()),
                }
                if counts["tokens"] == 0:
                    continue  # every row masked out: nothing to learn from
                self.optimizer.zero_grad(set_to_none=True)
                micro = cfg.micro_batch_size or minibatch.numel()
                for rows in minibatch.split(micro):
                    loss, micro_stats = self.micro_batch_loss(data, rows, counts)
                    loss.backward()
                    stats.append(micro_stats)
                grad_norms.append(self._clip_and_step())
        return self._metrics(batch, data, stats, grad_norms)

    def _clip_and_step(self) -> float:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = (
            self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        )
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"gradient norm is {norm.item()} at iteration {self.iteration}; the update was "
                "skipped. Lower learning_rate, or check rewards/advantages for extreme values"
            )
        self.optimizer.step()
        return float(norm)

    # --------------------------------------------------------------- metrics
    @torch.no_grad()
    def _metrics(
        self,
        batch: RolloutBatch,
        data: dict[str, Tensor | None],
        stats: list[dict[str, Any]],
        grad_norms: list[float],
    ) -> dict[str, float]:
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
        metrics["policy_loss"] = sum(float(s["policy_loss"]) for s in stats) / len(stats)
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
            metrics["value_loss"] = sum(float(s["value_loss"]) for s in stats) / len(stats)
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
    def evaluate(self, num_batches: int = 1) -> dict[str, float]:
        """Mean and std of the episode return over fresh batches, without updating."""
        scores = torch.cat([self._draw().scores for _ in range(num_batches)])
        return {"reward_mean": scores.mean().item(), "reward_std": scores.std().item()}

    # -------------------------------------------------------------- save/load
    def save(self, path: str | Path) -> Path:
        """Write the agent to the directory ``path``, atomically (``lmgym.persistence.agent``).

        Contents: the policy (``save_pretrained``: safetensors weights, tokenizer),
        ``agent_state.pt`` (optimizer, sampler and shuffle RNG, the env's prompt
        stream, iteration and token counters, critic head, stateful helpers such as
        REINFORCE's EMA baseline, sampling settings; tensors and plain data only),
        ``agent_config.json``, and last ``manifest.json`` (size and SHA-256 of every
        file). It is written under a temporary name and renamed into place, so a
        crash mid-write leaves any previous save at ``path`` intact and never a
        partial one under that name.
        """
        return save_agent(self, path)

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
        agent would have drawn). Nothing is unpickled, and the manifest is verified
        before any file is read.

        Raises:
            FileNotFoundError: ``path`` is not a saved agent.
            lmgym.persistence.CheckpointError: a file is missing, truncated, altered,
                unlisted, or holds objects other than tensors and plain data.
            ValueError: the directory holds another algorithm.
        """
        return load_agent(cls, path, env, ref_policy, device)
