"""How the learner's trainable modules take part in a data-parallel update
(docs/distributed.md): ``DataParallelUpdate`` wraps them in
``DistributedDataParallel`` with a summing communication hook."""

from lmgym.parallel.ddp import DataParallelUpdate, sum_hook, trainable_modules

__all__ = ["DataParallelUpdate", "sum_hook", "trainable_modules"]
