"""Synchronous and asynchronous runs are built by the same code: what one refuses before
training, the other refuses the same way (issue 27 §1)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmgym.asynchronous import AsyncConfig
from lmgym.envs.registration import TASKS
from lmgym.training import TrainConfig, Trainer

TASK = "lmgym/TargetString-v0"


@pytest.fixture
def no_threshold(monkeypatch):
    """TargetString with no solved threshold (no built-in task lacks one)."""
    monkeypatch.setitem(TASKS, TASK, replace(TASKS[TASK], solved_threshold=None))


@pytest.mark.parametrize("async_config", [None, AsyncConfig()], ids=["sync", "async"])
def test_early_stop_without_a_threshold_is_refused_on_both_paths(no_threshold, async_config):
    config = TrainConfig(task=TASK, early_stop=True, iterations=1)
    with pytest.raises(ValueError, match="states no solved threshold; set stop_threshold"):
        Trainer(config, async_config=async_config)


@pytest.mark.parametrize("async_config", [None, AsyncConfig()], ids=["sync", "async"])
def test_a_bad_agent_value_is_refused_before_any_process_starts(async_config):
    from lmgym.agents import GRPOConfig

    with pytest.raises(ValueError, match="learning_rate=-1.0: must be > 0"):
        Trainer(
            TrainConfig(iterations=1), GRPOConfig(learning_rate=-1.0), async_config=async_config
        )
