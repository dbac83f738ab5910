"""The update's trainable modules under ``DistributedDataParallel``, gradients summed.

One micro-batch's loss (``Agent.micro_batch_loss``: the teacher-forced pass, the
policy loss, a critic's value loss) is the forward of one ``nn.Module`` whose
children are the modules the update trains: the policy's model and, with a critic,
its value head and its separate trunk. DDP wraps that module, so every parameter
the loss reaches is reduced by DDP's bucketed, backward-overlapped all-reduce:

- every micro-batch but the last of a minibatch runs under ``no_sync()``; the last
  one's backward all-reduces the accumulated gradient;
- the communication hook *sums* (``sum_hook``): every loss is normalised by global
  counts before the backward pass (docs/algorithms.md), so a rank's gradient is
  already its share of the global one; DDP's default hook would divide by the
  world size once more;
- DDP covers the parameters that require grad *now*; when that set changes (VAPO's
  value pretraining freezes the policy, then unfreezes it) the wrapper is rebuilt,
  on every rank at the same update. Frozen parameters (a PEFT base, the frozen
  reference, which is not a child at all) are never reduced.

The rollout (KV-cache decode), ``prepare``'s no-grad passes and evaluation call the
unwrapped modules. One process: no wrapper, the loss function is called directly.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from lmgym.distributed import DataParallelGroup
from lmgym.parallel.sharded_state import MARKER, shard_refused

if TYPE_CHECKING:
    from lmgym.agents.records import Counts, LossModules, MicroBatchLoss, PreparedBatch
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import Critic

LossFn = Callable[["PreparedBatch", "Counts", "LossModules"], "MicroBatchLoss"]


def sum_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP communication hook: all-reduce a gradient bucket with ``SUM``, no division.

    Args:
        group: the process group (``None``: the default group), DDP's hook state.
        bucket: DDP's flat gradient bucket; reduced in place.
    """
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def trainable_modules(policy: "CausalLMPolicy", critic: "Critic | None") -> dict[str, nn.Module]:
    """The modules an update trains: the policy's model, a critic's head and separate trunk.

    A shared critic's trunk is the policy's model (listed once); the frozen
    reference is not listed.
    """
    modules: dict[str, nn.Module] = {"policy": policy.model}
    if critic is not None:
        modules["critic_head"] = critic.head
        if not critic.shared:
            modules["critic_trunk"] = critic.trunk_policy.model
    return modules


class _UpdateModule(nn.Module):
    """The trainable modules as children; forward is one micro-batch's loss."""

    def __init__(self, modules: "LossModules", loss_fn: LossFn) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(trainable_modules(modules.policy, modules.critic))
        self.loss_modules = modules
        self.loss_fn = loss_fn

    def forward(self, data: "PreparedBatch", counts: "Counts") -> "MicroBatchLoss":
        return self.loss_fn(data, counts, self.loss_modules)


class DataParallelUpdate:
    """One micro-batch's loss, through DDP when the group has more than one rank.

    Args:
        modules: the agent's policy and critic; the loss runs them.
        loss_fn: ``(micro-batch, minibatch counts, modules) -> MicroBatchLoss``; called
            on every micro-batch (look the agent's method up at call time, so that an
            instance-level override is seen).
        group: the learners' ``DataParallelGroup``; inactive: no wrapper at all.

    Attributes:
        modules: what the loss runs and the optimizer updates: ``modules`` as given.
        bucket_cap_mb: DDP's gradient bucket size (its default, 25 MiB); read when
            the wrapper is (re)built.
    """

    def __init__(self, modules: "LossModules", loss_fn: LossFn, group: DataParallelGroup) -> None:
        self.group = group
        self.modules = modules
        self.loss_fn = loss_fn
        self.bucket_cap_mb = 25.0
        self.ddp: DistributedDataParallel | None = None
        self._module = _UpdateModule(modules, loss_fn) if group.active else None
        self._wrapped: tuple[int, ...] = ()

    def _trainable_now(self) -> tuple[int, ...]:
        assert self._module is not None
        return tuple(id(p) for p in self._module.parameters() if p.requires_grad)

    def _wrap(self) -> DistributedDataParallel | None:
        """DDP over the parameters that require grad now (rebuilt when that set changed)."""
        trainable = self._trainable_now()
        if trainable != self._wrapped:
            self.ddp = None  # the old reducer removes its hooks when it goes
            self._wrapped = ()
            if trainable:
                ddp = DistributedDataParallel(
                    self._module,
                    process_group=self.group.group,
                    forward_sync_buffers=False,  # eval mode, equal buffers: nothing to sync
                    bucket_cap_mb=self.bucket_cap_mb,
                )
                ddp.register_comm_hook(self.group.group, sum_hook)
                self.ddp, self._wrapped = ddp, trainable
        return self.ddp

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward *and* backward: gradients are summed over
        ranks in the backward of the ``last`` one, accumulated locally before."""
        ddp = self._wrap() if self._module is not None else None
        with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
            yield
        if ddp is not None and last:
            self._check_reached()

    def _check_reached(self) -> None:
        """Refuse trainable parameters the loss never reached: DDP would leave their bucket
        unreduced (a silently per-rank gradient) and fail on the next update."""
        assert self._module is not None
        unreached = [
            name.removeprefix("parts.")
            for name, p in self._module.named_parameters()
            if p.requires_grad and p.grad is None
        ]
        if unreached:
            shown = ", ".join(unreached[:5]) + (", ..." if len(unreached) > 5 else "")
            raise ValueError(
                f"data parallel: {len(unreached)} trainable parameter(s) get no gradient from "
                f"the loss ({shown}); DDP would not sum the gradients over ranks. Freeze them "
                "(requires_grad_(False)) before building the agent"
            )

    def micro_batch_count(self, count: int) -> int:
        """Micro-batches this rank runs: its own ``count`` (``no_sync`` ones communicate
        nothing, so ranks may differ)."""
        return count

    def after_step(self) -> None:
        """Nothing: DDP's replicas are the modules themselves, equal on every rank."""

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """What a checkpoint saves of ``optimizer``: its whole state, the same on every rank."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load a whole state saved by ``optimizer_state_dict``; an fsdp checkpoint's
        optimizer state (one rank's shard, marked ``MARKER``) is refused (``ValueError``)."""
        if MARKER in state:
            raise ValueError(shard_refused(state[MARKER]))
        optimizer.load_state_dict(state)

    def __call__(self, data: "PreparedBatch", counts: "Counts") -> "MicroBatchLoss":
        """The micro-batch's loss (through DDP's forward when wrapped)."""
        if self.ddp is None:
            return self.loss_fn(data, counts, self.modules)
        return self.ddp(data, counts)
