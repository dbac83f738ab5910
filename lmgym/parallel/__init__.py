"""How the learner's trainable modules take part in a data-parallel update
(docs/distributed.md): ``DataParallelUpdate`` wraps them in ``DistributedDataParallel``
with a summing communication hook (``data_parallel="ddp"``); ``ShardedUpdate`` runs
the update through FSDP2-sharded replicas (``data_parallel="fsdp"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmgym.distributed import DataParallelGroup
from lmgym.parallel.ddp import DataParallelUpdate, LossFn, sum_hook, trainable_modules
from lmgym.parallel.fsdp import ShardedUpdate, full_value

if TYPE_CHECKING:
    from lmgym.agents.records import LossModules


def build_update(
    mode: str, modules: LossModules, loss_fn: LossFn, group: DataParallelGroup
) -> DataParallelUpdate | ShardedUpdate:
    """The update's wrapper for ``data_parallel=mode``, around the loss of the agent's
    ``modules``; one process: none (either mode)."""
    if mode == "fsdp" and group.active:
        return ShardedUpdate(modules, loss_fn, group)
    return DataParallelUpdate(modules, loss_fn, group)


__all__ = [
    "DataParallelUpdate",
    "ShardedUpdate",
    "build_update",
    "full_value",
    "sum_hook",
    "trainable_modules",
]
