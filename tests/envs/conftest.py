"""Env tests leave Gymnasium's registry and ``TASKS`` as they found them."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import pytest

from lmgym.envs import TASKS


@pytest.fixture(autouse=True)
def _forget_registered_envs() -> Iterator[None]:
    # A custom env registered by one test would otherwise show up in every later
    # listing of the tasks (e.g. `lmgym bench`'s list of valid names).
    registry, tasks = set(gym.registry), set(TASKS)
    yield
    for env_id in set(gym.registry) - registry:
        del gym.registry[env_id]
    for env_id in set(TASKS) - tasks:
        del TASKS[env_id]
