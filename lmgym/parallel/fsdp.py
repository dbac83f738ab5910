"""The update's trainable modules under FSDP2 (``fully_shard``): sharded during the update only.

``data_parallel="fsdp"`` (docs/distributed.md): ZeRO-3 inside the update, full weights
outside it, as RL frameworks reshard between rollout and training.

- Each trainable module (the policy's model, a critic's head and separate trunk) gets
  a *replica*, sharded over the ranks: ``fully_shard`` on every transformer block (the
  classes in the model's ``_no_split_modules``), then on one root holding all
  replicas. The optimizer is built over the replicas' sharded parameters, so the
  gradients and the optimizer state live as ``1/N`` shards.
- One micro-batch's loss runs with the agent's policy and critic pointing at the
  replicas (swapped in for its forward and backward), so ``Agent.micro_batch_loss``
  is unchanged: FSDP all-gathers a block's weights for its forward and backward and
  reduce-scatters its gradient, summed (``set_gradient_divide_factor(1.0)`` with
  ``ReduceOp.SUM``: every
  loss is already normalised by global counts, as with DDP's ``sum_hook``).
- After each optimizer step, ``after_step`` all-gathers the updated parameters into
  the original modules: the rollout, ``prepare``'s no-grad passes, rank 0's
  evaluation and checkpoints and the asynchronous weight transport read ordinary
  full tensors, with no collective.

Memory per rank for ``P`` trainable parameter elements: ``P`` full weights plus
``P/N`` each of sharded weights, gradients and two AdamW moments, against DDP's
``4P``; generation still needs the full model on every device.

Checkpoints: the weights saved by rank 0 are complete; the optimizer state is
sharded, so every rank's shard goes into the checkpoint's per-rank state
(``rank_state``) and each rank loads its own on resume (same world size only).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from lmgym.distributed import DataParallelGroup
from lmgym.parallel.ddp import trainable_modules
from lmgym.parallel.sharded_state import MARKER, wrong_shard

if TYPE_CHECKING:
    from lmgym.agents.records import Counts, MicroBatchLoss, PreparedBatch
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import Critic

LossFn = Callable[["PreparedBatch", "Counts"], "MicroBatchLoss"]


def _owners(policy: CausalLMPolicy, critic: Critic | None) -> dict[str, tuple[Any, str]]:
    """Where each trainable module (``trainable_modules``'s names) is held: (object, attribute)."""
    owners: dict[str, tuple[Any, str]] = {"policy": (policy, "model")}
    if critic is not None:
        owners["critic_head"] = (critic, "head")
        if not critic.shared:
            owners["critic_trunk"] = (critic.trunk_policy, "model")
    return owners


def _block_classes(module: nn.Module) -> set[str]:
    """The transformer block classes of a transformers model (or one under PEFT)."""
    get_base = getattr(module, "get_base_model", None)  # PEFT: the model under the adapter
    base: Any = get_base() if get_base is not None else module
    return set(getattr(base, "_no_split_modules", None) or ())


class _ShardedRoot(nn.Module):
    """The replicas as children; forward is one micro-batch's loss.

    It returns ``(total, loss)``: FSDP hooks the root's backward on the tensors it
    finds in the output, which a dataclass would hide.
    """

    def __init__(self, replicas: dict[str, nn.Module], loss_fn: LossFn) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(replicas)
        self.loss_fn = loss_fn

    def forward(self, data: PreparedBatch, counts: Counts) -> tuple[Tensor, MicroBatchLoss]:
        loss = self.loss_fn(data, counts)
        return loss.total, loss


class ShardedUpdate:
    """One micro-batch's loss through FSDP2 replicas of the trainable modules.

    Args:
        policy: the agent's policy; ``policy.model`` keeps full weights.
        critic: the agent's critic, or ``None``.
        loss_fn: ``(micro-batch, minibatch counts) -> MicroBatchLoss``, reading the
            policy and critic (which point at the replicas while it runs).
        group: the learners' ``DataParallelGroup``, active (more than one rank).
    """

    def __init__(
        self,
        policy: CausalLMPolicy,
        critic: Critic | None,
        loss_fn: LossFn,
        group: DataParallelGroup,
    ) -> None:
        if not group.active:
            raise ValueError("ShardedUpdate needs more than one rank (one process: no wrapper)")
        self.group = group
        self.ddp = None  # the DDP attribute of DataParallelUpdate: never set here
        self.originals = trainable_modules(policy, critic)
        self._owners = _owners(policy, critic)
        replicas = {name: copy.deepcopy(module) for name, module in self.originals.items()}
        mesh = DeviceMesh.from_group(
            group.group or dist.group.WORLD,  # type: ignore[arg-type]  # WORLD is set once initialised
            device_type=policy.device.type,
        )
        self._fsdp: list[FSDPModule] = []
        for replica in replicas.values():
            blocks = _block_classes(replica)
            for module in replica.modules():
                if type(module).__name__ in blocks:
                    self._fsdp.append(fully_shard(module, mesh=mesh))  # type: ignore[arg-type]
        # Any: the stubs type fully_shard's result as an FSDPModule, not the module it still is.
        self.root: Any = fully_shard(_ShardedRoot(replicas, loss_fn), mesh=mesh)
        self._fsdp.append(self.root)
        for sharded in self._fsdp:
            # A plain SUM, no division: every loss is normalised by global counts. Forced
            # to ReduceOp.SUM (else a factor of 1 is NCCL's PREMUL_SUM, which gloo lacks).
            sharded.set_gradient_divide_factor(1.0)
            sharded.set_force_sum_reduction_for_comms(True)
        self.replicas = replicas

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates, sharded, in ``trainable_parameters``'s order: the
        policy's trainable parameters, then the critic head's, then its trunk's."""
        params = [p for p in self.replicas["policy"].parameters() if p.requires_grad]
        if "critic_head" in self.replicas:
            params += list(self.replicas["critic_head"].parameters())
        if "critic_trunk" in self.replicas:
            params += [p for p in self.replicas["critic_trunk"].parameters() if p.requires_grad]
        return params

    def _pairs(self) -> Iterator[tuple[nn.Parameter, nn.Parameter]]:
        for name, original in self.originals.items():
            yield from zip(original.parameters(), self.replicas[name].parameters(), strict=True)

    def micro_batch_count(self, count: int) -> int:
        """Micro-batches this rank runs: the most any rank holds (each forward all-gathers,
        so every rank runs as many; the agent repeats its last one with zero weight)."""
        return -int(self.group.all_reduce_min(torch.tensor([-count]))[0])

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward *and* backward: the replicas stand in for the
        trainable modules; gradients are reduce-scattered in the backward of the ``last``
        one, accumulated unsharded before."""
        for original, replica in self._pairs():  # a frozen block (VAPO's warmup) follows
            replica.requires_grad_(original.requires_grad)
        self.root.set_requires_gradient_sync(last)
        for name, (owner, attribute) in self._owners.items():
            setattr(owner, attribute, self.replicas[name])
        try:
            yield
        finally:
            for name, (owner, attribute) in self._owners.items():
                setattr(owner, attribute, self.originals[name])

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

    def adopt(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer`` (over ``parameters()``) checkpoint-safe.

        Its ``state_dict`` holds this rank's shards as plain CPU tensors (a checkpoint
        gathers every rank's, ``rank_state``), marked ``{"rank", "world_size"}``; its
        ``load_state_dict`` takes only a state marked with this rank and world size and
        turns each shard back into a ``DTensor`` laid out as its parameter.
        """
        rank, size = self.group.rank, self.group.size
        state_dict, load = optimizer.state_dict, optimizer.load_state_dict
        # Optimizer.state_dict numbers the parameters in param_groups' order.
        params = [p for group in optimizer.param_groups for p in group["params"]]

        def local_state_dict() -> dict[str, Any]:
            state = state_dict()  # its per-parameter dicts are the optimizer's own: copy
            state["state"] = {
                index: {
                    key: value.to_local().detach().to("cpu", copy=True)
                    if isinstance(value, DTensor)
                    else value
                    for key, value in per_param.items()
                }
                for index, per_param in state["state"].items()
            }
            state[MARKER] = {"rank": rank, "world_size": size}
            return state

        def load_shard(state: dict[str, Any]) -> None:
            marker = state.get(MARKER)
            if marker != {"rank": rank, "world_size": size}:
                raise ValueError(wrong_shard(marker, rank, size))
            state = {key: value for key, value in state.items() if key != MARKER}
            state["state"] = {
                index: {key: _as_shard(value, params[index]) for key, value in per_param.items()}
                for index, per_param in state["state"].items()
            }
            load(state)

        optimizer.state_dict = local_state_dict  # type: ignore[method-assign]
        optimizer.load_state_dict = load_shard  # type: ignore[method-assign,assignment]


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
