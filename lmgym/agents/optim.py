"""The agent's optimizer and learning-rate schedule, built from ``AgentConfig``.

- AdamW with weight decay on matrices only: parameters with two or more
  dimensions (linear and embedding weights, LoRA's A and B) decay; biases and
  normalisation weights (one dimension) do not, the usual practice for
  transformers (minGPT, nanoGPT; the Hugging Face Trainer's rule differs only for
  exotic layers).
- The schedule is transformers' ``get_scheduler``, stepped once per optimizer
  step, so ``warmup_steps`` counts optimizer steps as in the Hugging Face Trainer.
  A decaying schedule needs its length in optimizer steps: iterations times
  ``update_epochs * num_minibatches``.
- ``sync_check_step`` is the end of every minibatch: loss terms and gradients
  summed over data-parallel ranks, checked, clipped, one optimizer and schedule
  step, the weights checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.nn.utils import get_total_norm
from torch.optim.lr_scheduler import LRScheduler
from transformers import get_scheduler

from lmgym.agents.config import AgentConfig
from lmgym.agents.numerics import check_finite, check_parameters, clip_grads, total_grad_norm
from lmgym.agents.records import MicroBatchLoss
from lmgym.distributed import DataParallelGroup
from lmgym.parallel.fsdp import full_value

if TYPE_CHECKING:
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import Critic

# Schedules whose multiplier depends on the total number of steps.
NEEDS_LENGTH = ("linear", "cosine", "cosine_with_restarts", "polynomial")


def trainable_parameters(policy: CausalLMPolicy, critic: Critic | None) -> list[nn.Parameter]:
    """What the agent's optimizer updates: the policy's trainable parameters (under a
    PEFT adapter, the adapter's), then the critic's own (``Critic.own_parameters``)."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return params + (critic.own_parameters() if critic is not None else [])


def make_optimizer(params: Sequence[nn.Parameter], config: AgentConfig) -> torch.optim.AdamW:
    """AdamW over ``params``; with ``weight_decay > 0``, two groups: decayed matrices,
    then undecayed vectors (one group when there is no decay)."""
    kwargs: dict[str, Any] = {"lr": config.learning_rate, "betas": config.adam_betas}
    if config.weight_decay == 0:
        return torch.optim.AdamW(params, weight_decay=0.0, **kwargs)
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], **kwargs)


def optim_and_schedule(
    params: Sequence[nn.Parameter], config: AgentConfig
) -> tuple[torch.optim.AdamW, LearningRateSchedule]:
    """The agent's optimizer over ``params`` (``trainable_parameters``, or FSDP's
    sharded replicas) and its learning-rate schedule."""
    optimizer = make_optimizer(params, config)
    return optimizer, LearningRateSchedule(optimizer, config)


def steps_per_iteration(config: AgentConfig) -> int:
    """Optimizer steps of one iteration (an empty or skipped minibatch takes none)."""
    return config.update_epochs * config.num_minibatches


def schedule_needs_length(config: AgentConfig) -> bool:
    """Whether the schedule can only be built once its length is known."""
    return config.lr_scheduler_type in NEEDS_LENGTH or config.warmup_ratio > 0


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: AgentConfig, total_steps: int | None
) -> LRScheduler | None:
    """``get_scheduler(config.lr_scheduler_type, ...)`` over ``total_steps`` optimizer steps;
    ``None`` for ``"constant"`` (the learning rate never moves, so nothing is stepped).

    Args:
        total_steps: the schedule's length; ``None`` only for schedules that do not
            need it (``schedule_needs_length`` is False).
    """
    if total_steps is None and schedule_needs_length(config):
        raise ValueError(
            f"lr_scheduler_type={config.lr_scheduler_type!r} (warmup_ratio="
            f"{config.warmup_ratio}) needs the schedule's length: set schedule_iterations, "
            "or train through learn(iterations), which sets it on its first call"
        )
    if config.lr_scheduler_type == "constant":  # check_common rejects warmup with it
        return None
    warmup = config.warmup_steps
    if config.warmup_ratio > 0:
        warmup = math.ceil(config.warmup_ratio * total_steps)  # type: ignore[operator]
    return get_scheduler(
        config.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total_steps,
    )


class LearningRateSchedule:
    """The agent's schedule, sized when its length is known.

    ``schedule_iterations`` sizes it at construction; otherwise a schedule that
    needs a length is sized by the first ``learn(iterations)`` (``cover``). A
    constant learning rate builds no scheduler at all.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, config: AgentConfig) -> None:
        self.optimizer, self.config = optimizer, config
        self.scheduler: LRScheduler | None = None
        self.total_steps: int | None = None
        if config.schedule_iterations is not None:
            self.start(config.schedule_iterations * steps_per_iteration(config))
        elif not schedule_needs_length(config):
            self.start(None)

    def start(self, total_steps: int | None) -> None:
        """Build the schedule over ``total_steps`` optimizer steps."""
        self.scheduler = make_scheduler(self.optimizer, self.config, total_steps)
        self.total_steps = total_steps

    def cover(self, iterations: int) -> None:
        """Size a schedule not sized yet so that it spans ``iterations`` iterations."""
        if self.scheduler is None and self.config.lr_scheduler_type != "constant":
            self.start(iterations * steps_per_iteration(self.config))

    def step(self) -> None:
        """Advance after one optimizer step."""
        if self.scheduler is None and self.config.lr_scheduler_type != "constant":
            make_scheduler(self.optimizer, self.config, None)  # raises, naming the fix
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any] | None:
        """``{"total_steps", "state"}``, or ``None`` without a scheduler."""
        if self.scheduler is None:
            return None
        return {"total_steps": self.total_steps, "state": self.scheduler.state_dict()}

    def restore_length(self, saved: dict[str, Any] | None) -> None:
        """Rebuild a saved schedule's length; call before the optimizer's state is
        loaded (building a scheduler resets the learning rate)."""
        if saved is not None and self.scheduler is None:
            self.start(saved["total_steps"])

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Restore the position; call after the optimizer's state is loaded."""
        if saved is not None:
            self.scheduler.load_state_dict(saved["state"])  # type: ignore[union-attr]


def sync_check_step(
    parts: Sequence[tuple[Tensor, MicroBatchLoss]],
    optimizer: torch.optim.Optimizer,
    lr_schedule: LearningRateSchedule,
    group: DataParallelGroup,
    config: AgentConfig,
    where: str,
) -> tuple[dict[str, float], float]:
    """Sum terms over ranks, check them and the gradients (already summed over ranks
    by the last micro-batch's backward, ``lmgym.parallel``), clip, step (not when the
    gradient is exactly 0), check the weights.

    Args:
        parts: each micro-batch's rows and loss, their gradients accumulated.
        optimizer: the optimizer over the parameters that hold the gradients.
        lr_schedule: stepped once after the optimizer (also when it was not stepped, so a
            schedule spans iterations, not informative batches).
        group: the data-parallel ranks (one process: sums are the identity).
        config: ``max_grad_norm`` and ``learning_rate`` (named in the errors).
        where: the position in the run, for the errors.

    Returns:
        ``(each loss term's minibatch value, gradient norm before clipping)``.

    Raises:
        NonFiniteUpdateError: a term or the gradient norm is NaN/inf (nothing was
            stepped), or the step left a non-finite weight.
    """
    # Each rank's terms are its share of the minibatch's: sum them.
    names = sorted(parts[0][1].terms)
    summed = torch.stack([sum(loss.terms[n] for _, loss in parts) for n in names])  # type: ignore[misc]
    terms = dict(zip(names, group.all_reduce_sum(summed.double()).tolist(), strict=True))
    for name, value in terms.items():
        check_finite(name, torch.tensor(value), where)
    params = [p for param_group in optimizer.param_groups for p in param_group["params"]]
    norm = total_grad_norm(params)  # FSDP: a DTensor, partial over the ranks' shards
    full_norm = float(full_value(norm))
    check_finite("grad_norm", torch.tensor(full_norm), where)
    clip_grads(params, config.max_grad_norm, norm)
    if full_norm > 0.0:
        # An all-zero gradient (every advantage 0: a batch whose rewards are all equal)
        # carries no signal, yet AdamW would still move the weights by its momentum;
        # measured, those steps knocked solved policies off (docs/algorithms.md#conventions).
        optimizer.step()
    lr_schedule.step()
    if any(isinstance(p, DTensor) for p in params):  # the global norm of the sharded weights
        check_parameters([full_value(get_total_norm(params))], where, config.learning_rate)
    else:
        check_parameters(params, where, config.learning_rate, optimizer)
    return terms, full_norm
