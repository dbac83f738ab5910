"""Asynchronous actor-learner training on ``torch.distributed`` (docs/async.md).

Actors generate with continuous batching and stream finished groups; learners
update data-parallel and publish new weights every update; ``max_staleness``
bounds how many versions old a trained token may be, and ``max_staleness=0`` is the
synchronous algorithm. ``run_async(agent_factory, iterations, AsyncConfig(...))`` in
every process of ``torchrun --nproc-per-node actors+learners``.
"""

from lmgym.asynchronous.channels import PeerLostError
from lmgym.asynchronous.config import AsyncConfig
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.roles import Role
from lmgym.asynchronous.run import AsyncRun, run_async

__all__ = ["AsyncConfig", "AsyncHooks", "AsyncRun", "PeerLostError", "Role", "run_async"]
