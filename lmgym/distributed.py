"""Data parallelism on ``torch.distributed`` (launched by ``torchrun``).

Each rank collects its own share of the prompt stream (whole groups) with its own
env and sampler; the update then equals the single-process update on the union
batch (docs/distributed.md):

- advantage inputs (rewards, masks, group ids, values, ...) are all-gathered, so
  every global statistic (REINFORCE's batch mean, whitening, batch-scale std) is
  computed on the union batch, and each rank keeps its own rows;
- every aggregation normaliser (``B``, token counts) is all-reduced before the
  backward pass, so a rank's loss is its share of the global loss;
- gradients are summed across ranks by ``DistributedDataParallel`` with a summing
  hook (``lmgym.parallel``), so every rank takes the same optimizer step;
- metrics are computed on gathered tensors and are global.

Outside a process group every function here is the identity: one process is
world size 1.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import fields
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lmgym.profiling import COMM, phase
from lmgym.types import RolloutBatch

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout: a rank that died or diverged ends the run with an error, never a hang."""


def is_distributed() -> bool:
    """True inside an initialised process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init_from_env(device: str | torch.device = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Join the process group ``torchrun`` describes in the environment, if any.

    Backend: NCCL on CUDA, gloo otherwise. Does nothing when ``WORLD_SIZE`` is unset
    or 1, or when a group is already initialised.

    Returns:
        True if this process is part of a group of more than one rank.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return is_distributed()
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return is_distributed()


def shutdown() -> None:
    """Leave the process group, if one is initialised (the end of a distributed run).

    Unreachable objects are freed first: an agent and its DDP reducer sit in a
    reference cycle (the update wrapper calls back into the agent), and left to
    interpreter shutdown, a gloo thread torn down after the group aborts a finished
    rank now and then ('terminate called without an active exception').
    """
    # Only a group of more than one rank is lmgym's (``init_from_env`` joins no other):
    # a one-process group is vLLM's own (``--rollout-engine vllm``), which its engine
    # tears down itself.
    if is_distributed():
        gc.collect()
        dist.destroy_process_group()


class DataParallelGroup:
    """The collectives of a data-parallel learner over one process group.

    Args:
        group: the learners' process group; ``None`` is the default (world) group.
            Outside an initialised group of more than one rank every method is the
            identity: one process is a group of size 1.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.active = is_distributed() and dist.get_world_size(group) > 1
        self.rank = dist.get_rank(group) if self.active else 0
        self.size = dist.get_world_size(group) if self.active else 1

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over ranks, in place; returns it."""
        if self.active:
            with phase(COMM):
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_reduce_min(self, tensor: Tensor) -> Tensor:
        """Minimum of ``tensor`` over ranks, in place; returns it."""
        if self.active:
            with phase(COMM):
                dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return tensor

    def gather_rows(self, tensor: Tensor, left_pad: Any = None) -> Tensor:
        """Concatenate every rank's ``tensor`` along dim 0, rank order.

        Ranks may hold different numbers of rows. With ``left_pad`` set, dim 1 may
        differ too (left-padded prompts): narrower tensors are padded on the left with
        that value to the widest.

        Args:
            tensor: ``[b_r, ...]`` on this rank.
            left_pad: fill value for dim-1 padding, or ``None`` when dim 1 is equal.

        Returns:
            ``[sum_r b_r, ...]``.
        """
        if not self.active:
            return tensor
        shapes = [None] * self.size
        dist.all_gather_object(shapes, tuple(tensor.shape), group=self.group)
        rows = max(s[0] for s in shapes)  # type: ignore[index]
        if left_pad is not None:
            width = max(s[1] for s in shapes)  # type: ignore[index]
            if tensor.shape[1] < width:
                pad = tensor.new_full(
                    (tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]), left_pad
                )
                tensor = torch.cat([pad, tensor], dim=1)
        padded = tensor.new_zeros((rows, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        with phase(COMM):
            dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat([part[: s[0]] for part, s in zip(parts, shapes, strict=True)])  # type: ignore[index]

    def gather_batch(self, batch: RolloutBatch, pad_id: int) -> tuple[RolloutBatch, Tensor]:
        """The union of every rank's rollout batch, and this rank's rows in it.

        Returns:
            ``(union batch, [b] int64 indices of this rank's rows in the union)``.
        """
        if not self.active:
            return batch, torch.arange(batch.batch_size, device=batch.rewards.device)
        pads = {"prompt_ids": pad_id, "prompt_mask": False}
        union = RolloutBatch(
            **{
                f.name: self.gather_rows(getattr(batch, f.name), pads.get(f.name))
                for f in fields(batch)
            }
        )
        counts = [None] * self.size
        dist.all_gather_object(counts, batch.batch_size, group=self.group)
        start = sum(counts[: self.rank])  # type: ignore[arg-type]
        return union, torch.arange(start, start + batch.batch_size, device=batch.rewards.device)

    def check_same_on_every_rank(self, what: str, value: dict[str, Any]) -> None:
        """Raise ``ValueError`` on every rank if ``value`` differs between ranks.

        Args:
            what: the name of the thing compared, e.g. ``"agent config"``.
            value: a JSON-serialisable dict; the error names the keys that differ.
        """
        if not self.active:
            return
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, json.loads(json.dumps(value, default=str)), group=self.group)
        differ = sorted(
            {k for v in values for k in set(v) | set(values[0]) if v.get(k) != values[0].get(k)}
        )
        if differ:
            shown = {k: [v.get(k) for v in values] for k in differ}
            raise ValueError(
                f"{what} differs between ranks in {differ} (per rank: {shown}); launch every rank "
                "with the same settings"
            )
