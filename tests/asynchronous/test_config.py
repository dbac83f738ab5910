"""Settings and start-up checks: every bad combination is an error naming the fix."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from lmgym.asynchronous import AsyncConfig, Role, run_async
from lmgym.asynchronous.actor import admission_budget
from lmgym.asynchronous.roles import check_handshake, describe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_cases import make_agent  # noqa: E402


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"actors": 0}, ValueError, "actors=0: must be >= 1"),
        ({"learners": 0}, ValueError, "learners=0: must be >= 1"),
        ({"max_staleness": -1}, ValueError, "max_staleness=-1: must be >= 0"),
        ({"max_staleness": 1.5}, TypeError, "max_staleness=1.5: expected an integer"),
        (
            {"stale_policy": "skip"},
            ValueError,
            r"stale_policy='skip' is not one of \['wait', 'drop'\]",
        ),
        ({"weight_sync": "never"}, ValueError, "weight_sync='never' is not one of"),
        ({"keep_kv_cache": "yes"}, TypeError, "keep_kv_cache='yes': expected True or False"),
        ({"timeout_s": 0.0}, ValueError, "timeout_s=0.0: must be > 0"),
    ],
)
def test_bad_settings_are_refused(overrides, error, match):
    with pytest.raises(error, match=match):
        AsyncConfig(**overrides).check()


def test_run_async_outside_torchrun_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node 3"):
        run_async(lambda role: None, 1, AsyncConfig(actors=2))


def test_admission_budget_under_wait_and_drop():
    wait = AsyncConfig(max_staleness=2)
    # Holding version 3, slots of updates up to 5 may start: (3 + 2 + 1) * 8 = 48 slots.
    assert admission_budget(wait, version=3, rows_per_update=8, next_slot=40) == 8
    assert admission_budget(wait, version=3, rows_per_update=8, next_slot=48) == 0
    assert admission_budget(AsyncConfig(max_staleness=0), 0, 8, 0) == 8
    assert admission_budget(AsyncConfig(stale_policy="drop"), 0, 8, 10_000) is None


def role(kind: str, index: int = 0) -> Role:
    return Role(kind, index, 1, 0, None, torch.device("cpu"))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def infos():
    learner = describe(make_agent("grpo", {}), role("learner"))
    actor = describe(make_agent("grpo", {}), role("actor"))
    return [learner, actor, copy.deepcopy(actor) | {"index": 1}]


def test_compatible_agents_pass(infos):
    check_handshake(infos, AsyncConfig(actors=2))


def two_learners(infos: list[dict]) -> list[dict]:
    learners = [copy.deepcopy(infos[0]) | {"index": i, "data_parallel_size": 2} for i in range(2)]
    return learners + copy.deepcopy(infos[1:])


@pytest.mark.parametrize(
    ("change", "learners", "match"),
    [
        (
            lambda i: i[0].update(data_parallel_size=2),
            1,
            r"spans 2 processes, expected 1; .*process_group=role\.process_group",
        ),
        (
            lambda i: i[2]["config"].update(learning_rate=0.5),
            1,
            r"agent config differs between ranks in \['learning_rate'\]",
        ),
        (lambda i: i[1].update(max_new_tokens=3), 1, "max_new_tokens differs between ranks"),
        (
            lambda i: i[1].update(parameter_shapes=[[1]]),
            1,
            "every process must build the same model",
        ),
        (lambda i: i[2].update(autoreset=True), 1, "actor 1: its env has autoreset=True"),
        (
            lambda i: [x["config"].update(dynamic_sampling=True) for x in i],
            1,
            "dynamic_sampling=True is not supported",
        ),
        (
            lambda i: i[3].update(num_prompts=1),
            2,
            "sum to 3 groups per update, not divisible by learners=2",
        ),
        (
            lambda i: [x["config"].update(num_minibatches=3) for x in i],
            1,
            "num_minibatches=3 does not divide a learner's 16 rows",
        ),
    ],
)
def test_incompatible_agents_are_refused(infos, change, learners, match):
    broken = two_learners(infos) if learners == 2 else copy.deepcopy(infos)
    change(broken)
    with pytest.raises(ValueError, match=match):
        check_handshake(broken, AsyncConfig(actors=2, learners=learners))
