"""Environments: the token-level vector env, its single-env facade, rewards, prompt
sources, tasks and registration."""

from lmgym.envs.action_space import TokenActionSpace, TokenActionsSpace
from lmgym.envs.prompts import (
    DatasetColumn,
    JsonlPrompts,
    PromptSubset,
    shuffle_prompts,
    split_prompts,
)
from lmgym.envs.registration import (
    TASKS,
    TaskInfo,
    available_tasks,
    format_task_table,
    make_reward_env_vector,
    register_all,
    register_reward_env,
)
from lmgym.envs.rewards import (
    CombinedReward,
    FunctionReward,
    RewardError,
    SequenceClassifierReward,
    TokenModuleReward,
    TokenScoreReward,
    reward_component_means,
)
from lmgym.envs.single import TokenEnv
from lmgym.envs.token_env import TokenVectorEnv

register_all()

__all__ = [
    "TASKS",
    "CombinedReward",
    "DatasetColumn",
    "FunctionReward",
    "JsonlPrompts",
    "PromptSubset",
    "RewardError",
    "SequenceClassifierReward",
    "TaskInfo",
    "TokenActionSpace",
    "TokenActionsSpace",
    "TokenEnv",
    "TokenModuleReward",
    "TokenScoreReward",
    "TokenVectorEnv",
    "available_tasks",
    "format_task_table",
    "make_reward_env_vector",
    "register_reward_env",
    "reward_component_means",
    "shuffle_prompts",
    "split_prompts",
]
