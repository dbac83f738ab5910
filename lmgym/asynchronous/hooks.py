"""Optional callbacks into the actor and learner loops (tests inject delays and faults)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor


@dataclass
class AsyncHooks:
    """Called at fixed points of the loops; each may be ``None``.

    Attributes:
        actor_step: ``(actor index, decode steps so far)`` after each decode step.
        actor_sent: ``(actor index, messages sent so far)`` after each rollout
            message is queued.
        actor_wait: ``(actor index, weights version held)`` when the actor has nothing
            it may sample (every admissible row finished and sent) and starts waiting
            for newer weights.
        learner_update: ``(update index, [n] int64 global group ids trained)`` on
            every learner after its update.
    """

    actor_step: Callable[[int, int], None] | None = None
    actor_sent: Callable[[int, int], None] | None = None
    actor_wait: Callable[[int, int], None] | None = None
    learner_update: Callable[[int, Tensor], None] | None = None
