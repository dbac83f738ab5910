"""Prompt-stream sharding: ranks draw disjoint, deterministic shares of one global stream.

With the same seed, rank ``r`` of ``W`` (``P`` prompts each) takes groups ``[r*P,
(r+1)*P)`` of every draw a single env with ``P*W`` prompts would make, so the ranks'
rows, put side by side, are exactly the single env's rows."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import lmgym  # noqa: F401

PROMPTS = ["a", "b", "c", "d", "e"]  # 5: passes over the source end mid-draw
P, G = 2, 3


def rows(info) -> list[tuple[int, int]]:
    return list(zip(info["group_id"].tolist(), info["prompt_index"].tolist(), strict=True))


@pytest.mark.parametrize("prompt_order", ["shuffle", "sequential"])
def test_ranks_side_by_side_are_the_single_env_over_several_resets(make_env, prompt_order):
    single = make_env(PROMPTS, num_prompts=2 * P, group_size=G, prompt_order=prompt_order)
    ranks = [
        make_env(PROMPTS, num_prompts=P, group_size=G, prompt_order=prompt_order, shard=(r, 2))
        for r in range(2)
    ]
    seen: list[int] = []
    for k in range(5):
        seed = 7 if k == 0 else None  # the same seed on every rank, then the stream goes on
        expected = rows(single.reset(seed=seed)[1])
        got = [row for env in ranks for row in rows(env.reset(seed=seed)[1])]
        assert got == expected, k
        seen += [g for g, _ in got]
    # Global group ids: every draw's groups are consecutive, none shared between ranks.
    assert sorted(set(seen)) == list(range(5 * 2 * P)) and len(seen) == 5 * 2 * P * G


def test_autoreset_refills_follow_the_same_global_stream(make_env):
    kw = dict(group_size=G, max_new_tokens=2, autoreset=True)
    single = make_env(PROMPTS, num_prompts=2 * P, **kw)
    ranks = [make_env(PROMPTS, num_prompts=P, shard=(r, 2), **kw) for r in range(2)]
    envs = [single, *ranks]
    infos = [env.reset(seed=3)[1] for env in envs]
    drawn = [[rows(info)] for info in infos]
    a = 3  # any id: every episode is cut at the budget, so all rows end together
    for _ in range(3):
        for env, log in zip(envs, drawn, strict=True):
            for _ in range(3):  # two steps to the end, one to refill every row
                info = env.step(torch.full((env.num_envs,), a))[4]
            log.append(rows(info))
    for k in range(4):
        assert drawn[1][k] + drawn[2][k] == drawn[0][k], k


def test_partial_refills_spread_a_rank_share_over_several_refills(make_env):
    kw = dict(group_size=G, max_new_tokens=4, autoreset=True)
    single = make_env(PROMPTS, num_prompts=2 * P, **kw)
    rank0 = make_env(PROMPTS, num_prompts=P, shard=(0, 2), **kw)
    rank1 = make_env(PROMPTS, num_prompts=P, shard=(1, 2), **kw)
    first = rows(single.reset(seed=5)[1])
    assert rows(rank0.reset(seed=5)[1]) + rows(rank1.reset(seed=5)[1]) == first
    second = rows(single.reset(options={"reset_mask": torch.ones(12, dtype=torch.bool)})[1])
    # Rank 0 refills its rows in two parts, rank 1 at once: the same slots come out.
    part = torch.tensor([True, False, True, False, True, False])
    rank0.reset(options={"reset_mask": part})
    got0 = rows(rank0.reset(options={"reset_mask": ~part})[1])
    got1 = rows(rank1.reset(options={"reset_mask": torch.ones(6, dtype=torch.bool)})[1])
    assert sorted(got0 + got1) == sorted(second)
    # Rows 0, 2, 4 took the first three slots of rank 0's share, rows 1, 3, 5 the rest.
    assert [got0[i] for i in (0, 2, 4, 1, 3, 5)] == second[:6]


def test_state_round_trips_per_rank(make_env):
    for rank in range(2):
        env = make_env(PROMPTS, num_prompts=P, group_size=G, shard=(rank, 2))
        env.reset(seed=11)
        env.reset()
        state = env.get_state()
        assert state["shard"] == (rank, 2) and state["num_prompts"] == P
        later = [rows(env.reset()[1]) for _ in range(3)]
        restored = make_env(PROMPTS, num_prompts=P, group_size=G, shard=(rank, 2))
        restored.set_state(state)
        assert [rows(restored.reset()[1]) for _ in range(3)] == later, rank


def test_a_state_restores_only_into_its_own_shard(make_env):
    state = make_env(PROMPTS, num_prompts=P, group_size=G, shard=(0, 2)).get_state()
    other = make_env(PROMPTS, num_prompts=P, group_size=G, shard=(1, 2))
    with pytest.raises(
        ValueError,
        match=r"saved prompt stream is shard \(rank, world_size\)=\(0, 2\), this env is \(1, 2\)",
    ):
        other.set_state(state)
    wider = make_env(PROMPTS, num_prompts=P + 1, group_size=G, shard=(0, 2))
    with pytest.raises(
        ValueError, match=r"sharded prompt stream has num_prompts=2, this env has 3"
    ):
        wider.set_state(state)
    # A state saved before sharding existed (no "shard" key) is a one-process state.
    unsharded = make_env(PROMPTS, num_prompts=P, group_size=G)
    old = {k: v for k, v in unsharded.get_state().items() if k not in ("shard", "num_prompts")}
    unsharded.set_state(old)


@pytest.mark.parametrize("shard", [(2, 2), (0, 0), (-1, 2), (0, 1, 2), "01", (True, 2), (0.0, 1)])
def test_bad_shards_are_refused(make_env, shard):
    with pytest.raises(ValueError, match=r"shard=.*: expected \(rank, world_size\) with 0 <= rank"):
        make_env(PROMPTS, shard=shard)


def test_every_task_factory_takes_shard():
    kw = dict(num_envs=2 * G, group_size=G)
    single = gym.make_vec("lmgym/Reverse-v0", num_envs=4 * G, group_size=G)
    expected = rows(single.reset(seed=1)[1])
    got = []
    for rank in range(2):
        env = gym.make_vec("lmgym/Reverse-v0", shard=(rank, 2), **kw)
        assert env.shard == (rank, 2)
        got += rows(env.reset(seed=1)[1])
    assert got == expected
