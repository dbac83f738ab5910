"""Environments: the token-level vector env, its single-env facade, rewards, tasks."""

from lmgym.envs.registration import TASKS, register_all
from lmgym.envs.rewards import (
    FunctionReward,
    RewardError,
    SequenceClassifierReward,
    TokenModuleReward,
)
from lmgym.envs.single import TokenEnv
from lmgym.envs.token_env import TokenVectorEnv

register_all()

__all__ = [
    "TASKS",
    "FunctionReward",
    "RewardError",
    "SequenceClassifierReward",
    "TokenEnv",
    "TokenModuleReward",
    "TokenVectorEnv",
]
