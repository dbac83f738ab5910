"""The metrics one update logs (docs/metrics.md has every name)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lmgym.agents.kl import kl_k1, kl_k3
from lmgym.agents.metrics import (
    approx_kl,
    effective_sample_size,
    entropy_mean,
    frac_reward_zero_std,
    masked_mean,
    masked_std,
    ratio_stats,
    sampler_gap,
)
from lmgym.agents.records import PreparedBatch, UpdateLog
from lmgym.agents.value import explained_variance
from lmgym.distributed import DataParallelGroup
from lmgym.types import RolloutBatch


@torch.no_grad()
def update_metrics(
    batch: RolloutBatch,
    data: PreparedBatch,
    log: UpdateLog,
    clip_metrics: Callable[[Tensor, Tensor, Tensor], dict[str, float]],
    group: DataParallelGroup,
) -> dict[str, float]:
    """Metrics of one update, global across data-parallel ranks.

    Args:
        batch: the rollout batch trained on (this rank's rows).
        data: its prepared form.
        log: the update's micro-batches, and each optimizer step's loss terms
            (logged as means over steps, so no metric depends on the micro-batch
            size) and gradient norm.
        clip_metrics: the agent's ``clip_metrics(ratio, advantages, mask)``.
        group: the data-parallel learners (metrics are over all their rows).

    Returns:
        name -> float.
    """
    gather_rows = group.gather_rows
    union, _ = group.gather_batch(batch, pad_id=0)
    scores = union.scores
    advantages, mask = gather_rows(data.advantages), gather_rows(data.mask)
    metrics: dict[str, float] = {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
        "completion_length": union.policy_lengths.float().mean().item(),
        "truncated_fraction": union.truncated.float().mean().item(),
        "special_token_mass": union.special_mass.mean().item(),
        "frac_reward_zero_std": frac_reward_zero_std(scores, union.group_ids),
        "advantage_mean": masked_mean(advantages, mask).item(),
        "advantage_std": masked_std(advantages, mask).item(),
        "grad_norm": sum(log.grad_norms) / max(1, len(log.grad_norms)),
    }
    if data.values is not None and data.returns is not None:
        values, returns = gather_rows(data.values), gather_rows(data.returns)
        metrics["explained_variance"] = explained_variance(values, returns, mask)
    if not log.micro_batches:
        return metrics
    for name in log.step_terms[0]:
        metrics[name] = sum(terms[name] for terms in log.step_terms) / len(log.step_terms)

    rows = torch.cat([r for r, _ in log.micro_batches])
    losses = [loss for _, loss in log.micro_batches]

    width = data.mask.shape[1]

    def tokens(values: list[Tensor]) -> Tensor:
        """Per-token values of every micro-batch (trimmed ones padded back to ``L``),
        gathered over ranks."""
        padded = [torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values]
        return gather_rows(torch.cat(padded))

    mask = tokens([data.mask[rows]])
    logprobs = tokens([loss.logprobs for loss in losses])
    metrics["entropy"] = entropy_mean(tokens([loss.entropy for loss in losses]), mask)
    old = tokens([x.old_logprobs for x in losses])
    metrics["approx_kl"] = approx_kl(logprobs, old, mask)
    metrics.update(sampler_gap(old, tokens([data.sampler_logprobs[rows]]), mask))
    if losses[0].ratio is not None:
        ratio = tokens([loss.ratio for loss in losses])  # type: ignore[misc]
        metrics.update(ratio_stats(ratio, mask))
        metrics.update(clip_metrics(ratio, tokens([data.advantages[rows]]), mask))
    if losses[0].tis is not None:
        weights = tokens([loss.tis for loss in losses])  # type: ignore[misc]
        metrics["tis_weight_mean"] = masked_mean(weights, mask).item()
        metrics["tis_ess"] = effective_sample_size(weights, mask)
    if data.ref_logprobs is not None:
        ref = tokens([data.ref_logprobs[rows]])
        metrics["kl_ref_k1"] = masked_mean(kl_k1(logprobs, ref), mask).item()
        metrics["kl_ref_k3"] = masked_mean(kl_k3(logprobs, ref), mask).item()
    return metrics
