"""The update's trainable modules under FSDP2 (``fully_shard``): sharded during the update only.

``data_parallel="fsdp"`` (docs/distributed.md): ZeRO-3 inside the update, full weights
outside it, as RL frameworks reshard between rollout and training.

- Each trainable module (the policy's model, a critic's head and separate trunk) gets
  a *replica*, sharded over the ranks: ``fully_shard`` on every transformer block (the
  classes in the model's ``_no_split_modules``), then on one root holding all
  replicas. The optimizer is built over the replicas' sharded parameters, so the
  gradients and the optimizer state live as ``1/N`` shards.
- One micro-batch's loss is the root's forward: ``Agent.micro_batch_loss`` gets the
  replicas as its ``LossModules`` (views of the agent's policy and critic computing
  with them, ``CausalLMPolicy.on_model``, ``Critic.on_modules``); the agent's own
  objects are never changed. FSDP all-gathers a block's weights for its forward and
  backward and reduce-scatters its gradient, summed (``set_gradient_divide_factor(1.0)``
  with ``ReduceOp.SUM``: every loss is already normalised by global counts, as with
  DDP's ``sum_hook``).
- After each optimizer step, ``after_step`` all-gathers the updated parameters into
  the original modules: the rollout, ``prepare``'s no-grad passes, rank 0's
  evaluation and checkpoints and the asynchronous weight transport read ordinary
  full tensors, with no collective.

Memory per rank for ``P`` trainable parameter elements: ``P`` full weights plus
``P/N`` each of sharded weights, gradients and two AdamW moments, against DDP's
``4P``; generation still needs the full model on every device.

Checkpoints: the weights saved by rank 0 are complete; the optimizer state is
sharded, so every rank's shard (``torch.distributed.checkpoint``'s
``get_optimizer_state_dict``, keyed by parameter name, as plain CPU tensors) goes
into the checkpoint's per-rank state (``rank_state``) and each rank loads its own on
resume (``set_optimizer_state_dict``; same world size only).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from lmgym.distributed import DataParallelGroup
from lmgym.parallel.ddp import LossFn, trainable_modules
from lmgym.parallel.sharded_state import MARKER, wrong_shard

if TYPE_CHECKING:
    from lmgym.agents.records import Counts, LossModules, MicroBatchLoss, PreparedBatch


def _replicas(modules: LossModules) -> LossModules:
    """``modules`` computing with deep copies of their trainable modules: the policy on a
    copy of its model, the critic with a copy of its head on the policy's copy (shared
    trunk) or on a copy of its own trunk."""
    policy, critic = modules.policy, modules.critic
    replica = policy.on_model(copy.deepcopy(policy.model))
    if critic is None:
        return dataclasses.replace(modules, policy=replica)
    trunk = critic.trunk_policy
    trunk = replica if critic.shared else trunk.on_model(copy.deepcopy(trunk.model))
    return dataclasses.replace(
        modules, policy=replica, critic=critic.on_modules(trunk, copy.deepcopy(critic.head))
    )


def _block_classes(module: nn.Module) -> set[str]:
    """The transformer block classes of a transformers model (or one under PEFT)."""
    get_base = getattr(module, "get_base_model", None)  # PEFT: the model under the adapter
    base: Any = get_base() if get_base is not None else module
    return set(getattr(base, "_no_split_modules", None) or ())


class _ShardedRoot(nn.Module):
    """The replicas as children; forward is one micro-batch's loss, run by ``modules``.

    It returns ``(total, loss)``: FSDP hooks the root's backward on the tensors it
    finds in the output, which a dataclass would hide.
    """

    def __init__(self, modules: LossModules, loss_fn: LossFn) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(trainable_modules(modules.policy, modules.critic))
        self.loss_modules = modules
        self.loss_fn = loss_fn

    def forward(self, data: PreparedBatch, counts: Counts) -> tuple[Tensor, MicroBatchLoss]:
        loss = self.loss_fn(data, counts, self.loss_modules)
        return loss.total, loss


class ShardedUpdate:
    """One micro-batch's loss through FSDP2 replicas of the trainable modules.

    Args:
        modules: the agent's policy and critic; their models keep full weights.
        loss_fn: ``(micro-batch, minibatch counts, modules) -> MicroBatchLoss``, given
            the replicas' ``modules``.
        group: the learners' ``DataParallelGroup``, active (more than one rank).

    Attributes:
        modules: what the loss runs and the optimizer updates: views of the policy and
            critic on the sharded replicas.
    """

    def __init__(self, modules: LossModules, loss_fn: LossFn, group: DataParallelGroup) -> None:
        if not group.active:
            raise ValueError("ShardedUpdate needs more than one rank (one process: no wrapper)")
        self.group = group
        self.ddp = None  # the DDP attribute of DataParallelUpdate: never set here
        self.originals = trainable_modules(modules.policy, modules.critic)
        self.modules = _replicas(modules)
        self.replicas = trainable_modules(self.modules.policy, self.modules.critic)
        mesh = DeviceMesh.from_group(
            group.group or dist.group.WORLD,  # type: ignore[arg-type]  # WORLD is set once initialised
            device_type=modules.policy.device.type,
        )
        self._fsdp: list[FSDPModule] = []
        for replica in self.replicas.values():
            blocks = _block_classes(replica)
            for module in replica.modules():
                if type(module).__name__ in blocks:
                    self._fsdp.append(fully_shard(module, mesh=mesh))  # type: ignore[arg-type]
        # Any: the stubs type fully_shard's result as an FSDPModule, not the module it still is.
        self.root: Any = fully_shard(_ShardedRoot(self.modules, loss_fn), mesh=mesh)
        self._fsdp.append(self.root)
        for sharded in self._fsdp:
            # A plain SUM, no division: every loss is normalised by global counts. Forced
            # to ReduceOp.SUM (else a factor of 1 is NCCL's PREMUL_SUM, which gloo lacks).
            sharded.set_gradient_divide_factor(1.0)
            sharded.set_force_sum_reduction_for_comms(True)

    def _pairs(self) -> Iterator[tuple[nn.Parameter, nn.Parameter]]:
        for name, original in self.originals.items():
            yield from zip(original.parameters(), self.replicas[name].parameters(), strict=True)

    def micro_batch_count(self, count: int) -> int:
        """Micro-batches this rank runs: the most any rank holds (each forward all-gathers,
        so every rank runs as many; the agent repeats its last one with zero weight)."""
        return -int(self.group.all_reduce_min(torch.tensor([-count]))[0])

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward *and* backward: gradients are reduce-scattered
        in the backward of the ``last`` one, accumulated unsharded before."""
        for original, replica in self._pairs():  # a frozen block (VAPO's warmup) follows
            replica.requires_grad_(original.requires_grad)
        self.root.set_requires_gradient_sync(last)
        yield

    def __call__(self, data: PreparedBatch, counts: Counts) -> MicroBatchLoss:
        """The micro-batch's loss, through the sharded root's forward."""
        # One trunk pass per block and micro-batch: the shared-prompt pass
        # (``sequence_hidden``'s group_ids) calls each block twice, which FSDP's
        # per-block all-gather/reduce-scatter order does not follow across ranks.
        total, loss = self.root(dataclasses.replace(data, group_ids=None), counts)  # type: ignore[arg-type]
        return dataclasses.replace(loss, total=total)

    @torch.no_grad()
    def after_step(self) -> None:
        """All-gather the updated parameters into the original modules (on every rank)."""
        for original, replica in self._pairs():
            if replica.requires_grad:
                full = replica.full_tensor() if isinstance(replica, DTensor) else replica
                original.copy_(full)

    def _marker(self) -> dict[str, int]:
        return {"rank": self.group.rank, "world_size": self.group.size}

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """What a checkpoint saves of ``optimizer`` (over ``modules``' parameters): this
        rank's shard of its state, keyed by parameter name, as plain CPU tensors (a
        checkpoint gathers every rank's, ``rank_state``), marked ``{"rank", "world_size"}``.
        """
        if not optimizer.state:
            # Before the first step there is nothing to shard, and get_optimizer_state_dict
            # would create the state by a zero step, which counts as one in AdamW's bias
            # correction.
            state = optimizer.state_dict()
        else:
            state = tree_map_only(
                DTensor,
                lambda shard: shard.to_local().detach().to("cpu", copy=True),
                get_optimizer_state_dict(self.root, optimizer),
            )
        return {**state, MARKER: self._marker()}

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load this rank's shard saved by ``optimizer_state_dict``, each tensor back as a
        ``DTensor`` laid out as its parameter. Any other state (another rank's shard, a
        whole optimizer's) is refused (``ValueError``)."""
        marker = state.get(MARKER)
        if marker != self._marker():
            raise ValueError(wrong_shard(marker, self.group.rank, self.group.size))
        params = dict(self.root.named_parameters())
        shards: dict[str, Any] = {
            "state": {
                name: {key: _as_shard(value, params[name]) for key, value in per_param.items()}
                for name, per_param in state["state"].items()
            },
            "param_groups": state["param_groups"],
        }
        # strict=False: a parameter frozen when the state was saved (VAPO's value
        # pretraining) has no state yet, and AdamW starts it afresh, as it would have.
        set_optimizer_state_dict(
            self.root, optimizer, shards, options=StateDictOptions(strict=False)
        )


def _as_shard(value: Any, param: Tensor) -> Any:
    """A saved per-parameter ``value`` as the optimizer holds it: a tensor shaped as
    ``param``'s local shard (an AdamW moment) becomes a ``DTensor`` laid out as ``param``;
    anything else (the step count) is kept."""
    if not isinstance(param, DTensor) or not isinstance(value, Tensor):
        return value
    local = param.to_local()
    if value.shape != local.shape:
        return value
    return DTensor.from_local(
        value.to(local.device),
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


def full_value(value: Tensor) -> Tensor:
    """``value`` as a plain tensor (a ``DTensor``, e.g. a sharded gradient norm, gathered)."""
    return value.full_tensor() if isinstance(value, DTensor) else value
