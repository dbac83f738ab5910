"""Gymnasium registration: each task gets a single-env ``entry_point`` and a native
``vector_entry_point``, so ``gymnasium.make`` and ``gymnasium.make_vec`` give the two
faces of one task."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym


@dataclass(frozen=True)
class TaskInfo:
    """What ``lmgym tasks`` lists: id, solved threshold, one-line description."""

    id: str
    solved_threshold: float
    description: str


TASKS: dict[str, TaskInfo] = {}


def register_task(
    name: str, module: str, single: str, vector: str, solved_threshold: float, description: str
) -> None:
    env_id = f"lmgym/{name}-v0"
    if env_id not in gym.registry:
        gym.register(
            id=env_id,
            entry_point=f"{module}:{single}",
            vector_entry_point=f"{module}:{vector}",
        )
    TASKS[env_id] = TaskInfo(env_id, solved_threshold, description)


def register_all() -> None:
    register_task(
        "TargetString",
        "lmgym.envs.tasks.target_string",
        "make_target_string",
        "make_target_string_vector",
        0.9,
        "reproduce a fixed target string; reward = fraction of target tokens in place",
    )
