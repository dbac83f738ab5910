"""The learner's ledger: which groups each update trains, the bound, drops, no group twice."""

from __future__ import annotations

import pytest
import torch

from lmgym.asynchronous.staleness import StalenessLedger, staleness_stats
from lmgym.asynchronous.transport import VersionedRollout
from lmgym.types import RolloutBatch

G, L = 2, 3


def groups(local_ids: list[int], versions: list[list[int]], lengths: list[int] | None = None):
    """Rows of whole groups (G rows each): row r's token versions ``versions[r]``."""
    n = len(local_ids) * G
    lengths_t = torch.tensor(lengths if lengths is not None else [L] * n)
    mask = torch.arange(L)[None, :] < lengths_t[:, None]
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        completion_ids=torch.ones(n, L, dtype=torch.long),
        completion_mask=mask,
        sampler_logprobs=torch.zeros(n, L),
        rewards=torch.zeros(n, L),
        dones=torch.zeros(n, L, dtype=torch.bool),
        group_ids=torch.tensor(local_ids).repeat_interleave(G),
        prompt_index=torch.zeros(n, dtype=torch.long),
        lengths=lengths_t,
        terminated=torch.ones(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        valid=torch.ones(n, dtype=torch.bool),
        special_mass=torch.zeros(n),
    )
    v = torch.tensor(versions).masked_fill(~mask, -1)
    slots = torch.tensor(local_ids).repeat_interleave(G) * G + torch.arange(n) % G
    return VersionedRollout(batch, v, slots)


def flat(version: int, count: int) -> list[list[int]]:
    return [[version] * L for _ in range(count)]


def test_wait_trains_each_actors_fixed_share_whatever_the_arrival_order():
    # Two actors, one group each per update: update u trains local group u of both,
    # i.e. global ids 2u (actor 0) and 2u + 1 (actor 1).
    ledger = StalenessLedger([1, 1], G, max_staleness=1, stale_policy="wait")
    ledger.add(1, groups([1], flat(0, 2)))  # actor 1's group for update 1 comes first
    ledger.add(0, groups([0], flat(0, 2)))
    assert ledger.take(0) is None  # actor 1's group 0 is missing
    ledger.add(1, groups([0], flat(0, 2)))
    first = ledger.take(0)
    assert first.rollout.batch.group_ids.tolist() == [0, 0, 1, 1]
    ledger.add(0, groups([1], flat(1, 2)))
    second = ledger.take(1)
    assert second.rollout.batch.group_ids.tolist() == [2, 2, 3, 3]
    assert second.rows_dropped == 0


def test_wait_raises_if_a_row_is_past_the_bound():
    ledger = StalenessLedger([1], G, max_staleness=1, stale_policy="wait")
    ledger.add(0, groups([0], flat(0, 2)))
    ledger.take(0)
    ledger.add(0, groups([1], flat(0, 2)))
    ledger.take(1)
    ledger.add(0, groups([2], [[0, 2, 2], [2, 2, 2]]))  # one token 2 versions before update 2
    with pytest.raises(RuntimeError, match="2 versions old, over max_staleness=1"):
        ledger.take(2)


def test_drop_drops_and_counts_groups_past_the_bound_and_keeps_arrival_order():
    ledger = StalenessLedger([2], G, max_staleness=1, stale_policy="drop")
    ledger.add(0, groups([0, 1], [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 1]]))
    ledger.add(0, groups([2], [[1, 1, 1], [1, 2, 2]]))
    ledger.add(0, groups([3], flat(2, 2)))
    # Update 2: groups whose oldest token is version 0 are 2 versions old: dropped.
    batch = ledger.take(2)
    assert batch.rows_dropped == 4
    assert batch.rollout.batch.group_ids.tolist() == [2, 2, 3, 3]
    assert batch.tokens_received == 4 * 2 * L
    assert ledger.take(3) is None


def test_a_group_that_arrives_twice_is_an_error():
    ledger = StalenessLedger([1], G, max_staleness=0, stale_policy="drop")
    ledger.add(0, groups([0], flat(0, 2)))
    with pytest.raises(RuntimeError, match="group 0 .actor 0. arrived twice"):
        ledger.add(0, groups([0], flat(0, 2)))


def test_an_incomplete_group_is_an_error():
    ledger = StalenessLedger([1], G, max_staleness=0, stale_policy="wait")
    rows = groups([0], flat(0, 2)).select(torch.tensor([0]))
    with pytest.raises(RuntimeError, match="incomplete group"):
        ledger.add(0, rows)


def test_group_ids_are_made_global_per_actor():
    ledger = StalenessLedger([1, 1, 1], G, max_staleness=0, stale_policy="wait")
    assert ledger.global_ids(torch.tensor([0, 1, 5]), actor=2).tolist() == [2, 5, 17]


def test_staleness_stats_over_real_tokens_only():
    rollout = groups([0], [[3, 4, 5], [5, 5, 9]], lengths=[3, 2])
    # update 5: lags 2, 1, 0 and 0, 0; the padded token (version 9) does not count
    # row 0 was sampled by versions 3..5 (mixed), row 1 by version 5 alone
    assert staleness_stats(rollout, update=5) == {
        "staleness_mean": 0.6,
        "staleness_max": 2.0,
        "mixed_version_fraction": 0.5,
    }
    assert rollout.oldest_versions().tolist() == [3, 5]
