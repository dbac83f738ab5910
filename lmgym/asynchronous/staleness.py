"""The learner's side of the staleness bound: which groups an update trains on.

Versions: the learner's weights are version ``u`` after ``u`` updates, and update
``u`` trains version ``u`` into ``u + 1``. A token sampled by version ``v`` and
trained by update ``u`` has lag ``u - v``; ``max_staleness = k`` means every trained
token has lag <= k, i.e. a row's *oldest* token is at most ``k`` versions old.

- ``"wait"``: actor ``a`` contributes ``P_a`` groups (its env's ``num_prompts``) to
  every update, in its stream's order: update ``u`` trains its local groups
  ``[u P_a, (u + 1) P_a)``. The actor starts a row of update ``u`` only once it
  holds version ``u - k`` or newer, so the bound holds by construction (checked
  here again) and nothing is dropped; the batch of every update is fixed in
  advance, whatever the timing.
- ``"drop"``: actors never wait. Update ``u`` trains the first ``N = sum_a P_a``
  groups to arrive whose oldest token is at least version ``u - k``; older ones are
  dropped and counted (they can only get older).

Either way each group is trained at most once: a group id that arrives twice or is
taken twice is an error. Group ids are made global as ``local * A + a`` (``A``
actors), so one actor keeps its env's ids.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import torch

from lmgym.asynchronous.transport import VersionedRollout, concat_rollouts


@dataclass(frozen=True)
class UpdateBatch:
    """The groups one update trains on.

    Attributes:
        rollout: their rows, ordered by global group id, a group's rows by slot.
        update: the update's index ``u`` (the learner's weights are version ``u``).
        rows_dropped: rows dropped for staleness while this batch was assembled.
        tokens_received: completion tokens of every group received so far,
            dropped ones included.
    """

    rollout: VersionedRollout
    update: int
    rows_dropped: int
    tokens_received: int


class StalenessLedger:
    """Groups received from the actors, assembled into update batches under the bound.

    Args:
        groups_per_actor: ``P_a``, the groups actor ``a`` contributes per update.
        group_size: ``G``.
        max_staleness: ``k``.
        stale_policy: ``"wait"`` or ``"drop"`` (module docstring).
    """

    def __init__(
        self, groups_per_actor: list[int], group_size: int, max_staleness: int, stale_policy: str
    ) -> None:
        self.groups_per_actor = groups_per_actor
        self.num_actors = len(groups_per_actor)
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.groups_per_update = sum(groups_per_actor)
        self._waiting: OrderedDict[int, VersionedRollout] = OrderedDict()  # arrival order
        self._seen: set[int] = set()
        self._trained: set[int] = set()
        self._rows_dropped = 0
        self.tokens_received = 0

    def global_ids(self, local_ids: torch.Tensor, actor: int) -> torch.Tensor:
        return local_ids * self.num_actors + actor

    def add(self, actor: int, rollout: VersionedRollout) -> None:
        """File an actor's message of whole groups (local group ids).

        Raises:
            RuntimeError: a group arrived twice, or incomplete.
        """
        ids = self.global_ids(rollout.batch.group_ids, actor)
        batch = rollout.batch
        rollout = VersionedRollout(replace(batch, group_ids=ids), rollout.versions, rollout.slots)
        self.tokens_received += int(batch.policy_lengths.sum())
        groups, counts = torch.unique(ids, return_counts=True)
        if bool((counts != self.group_size).any()):
            raise RuntimeError(
                f"actor {actor} sent an incomplete group (row counts {counts.tolist()}, "
                f"group_size {self.group_size})"
            )
        for group in groups.tolist():
            if group in self._seen:
                raise RuntimeError(
                    f"group {group} (actor {actor}) arrived twice: a rollout would be trained twice"
                )
            self._seen.add(group)
            self._waiting[group] = rollout.select(ids == group)

    def take(self, update: int) -> UpdateBatch | None:
        """The batch of update ``update`` if its groups are all here, else ``None``.

        In ``"drop"`` mode, groups past the bound are dropped first (and counted).
        """
        if self.stale_policy == "drop":
            self._drop_expired(update)
            if len(self._waiting) < self.groups_per_update:
                return None
            chosen = list(self._waiting)[: self.groups_per_update]
        else:
            chosen = [
                local * self.num_actors + actor
                for actor, count in enumerate(self.groups_per_actor)
                for local in range(update * count, (update + 1) * count)
            ]
            if any(group not in self._waiting for group in chosen):
                return None
        parts = [self._waiting.pop(group) for group in sorted(chosen)]
        rollout = concat_rollouts(parts)
        lag = update - rollout.oldest_versions()
        if bool((lag > self.max_staleness).any()):  # "wait" keeps the bound by construction
            raise RuntimeError(
                f"update {update}: a row's oldest token is {int(lag.max())} versions old, over "
                f"max_staleness={self.max_staleness}; this is a bug of lmgym.asynchronous"
            )
        again = self._trained.intersection(chosen)
        if again:
            raise RuntimeError(f"groups {sorted(again)} would be trained twice")
        self._trained.update(chosen)
        dropped, self._rows_dropped = self._rows_dropped, 0
        return UpdateBatch(rollout, update, dropped, self.tokens_received)

    def _drop_expired(self, update: int) -> None:
        for group in list(self._waiting):
            oldest = int(self._waiting[group].oldest_versions().min())
            if update - oldest > self.max_staleness:
                self._rows_dropped += self._waiting.pop(group).batch.batch_size


def staleness_stats(rollout: VersionedRollout, update: int) -> dict[str, float]:
    """Version lag of the sampled (policy) tokens trained by update ``update``.

    Returns:
        ``staleness_mean`` and ``staleness_max`` (0 for an on-policy batch), and
        ``mixed_version_fraction``: the share of rows whose tokens were sampled by
        more than one version (weights changed mid-row: in-flight updates).
    """
    mask = rollout.batch.policy_mask
    lag = (update - rollout.versions)[mask].double()
    if lag.numel() == 0:
        return {"staleness_mean": 0.0, "staleness_max": 0.0, "mixed_version_fraction": 0.0}
    newest = rollout.versions.masked_fill(~mask, -1).max(dim=1).values
    mixed = (newest != rollout.oldest_versions()).double().mean()
    return {
        "staleness_mean": lag.mean().item(),
        "staleness_max": lag.max().item(),
        "mixed_version_fraction": mixed.item(),
    }
