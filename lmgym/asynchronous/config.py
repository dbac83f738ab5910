"""The asynchronous run's settings (docs/async.md), validated before any process talks."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from lmgym.agents.config import check_types

StalePolicy = Literal["wait", "drop"]
WeightSync = Literal["in_flight", "row_boundary"]


@dataclass
class AsyncConfig:
    """Actors, learners and the staleness bound of ``run_async``.

    Every field's docstring is its help text (the command line can turn them into
    ``--help``, as it does for the agents' configs).
    """

    actors: int = 1
    """Actor processes: ranks [learners, learners + actors) generate rollouts."""
    learners: int = 1
    """Learner processes: ranks [0, learners) update the policy data-parallel."""
    max_staleness: int = 1
    """k: no trained token was sampled more than k policy versions before the update that trains on it; 0 is the synchronous algorithm."""
    stale_policy: StalePolicy = "wait"
    """How the bound is kept: 'wait' (actors start a row only when it can be trained in time, so nothing is dropped) or 'drop' (actors never wait; the learner drops and counts groups past the bound)."""
    weight_sync: WeightSync = "in_flight"
    """When actors load new weights: 'in_flight' (between decode steps; rows in flight go on with the new weights) or 'row_boundary' (once every row in flight has finished; no new row starts meanwhile)."""
    keep_kv_cache: bool = True
    """In-flight updates: keep the KV cache computed by the old weights (PipelineRL; TIS corrects the mismatch) instead of rebuilding it from the text with the new weights."""
    timeout_s: float = 600.0
    """Seconds any wait (rollouts, weights, collectives) may last before the run ends with an error."""

    def check(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the field and the fix."""
        check_types(self)
        for name in ("actors", "learners"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.max_staleness < 0:
            raise ValueError(
                f"max_staleness={self.max_staleness}: must be >= 0 (0 is the synchronous algorithm)"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s}: must be > 0")

    @property
    def world_size(self) -> int:
        """``actors + learners``: the ``torchrun --nproc-per-node`` of a one-node run."""
        return self.actors + self.learners

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
