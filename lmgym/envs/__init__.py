"""Environments: the token-level vector env, its single-env facade, the env options
every task shares, rewards, prompt sources, tasks and registration, and the
multi-turn responder protocol (``Responder`` and its records, ``register_responder_env``)."""

from lmgym.envs.action_space import TokenActionSpace, TokenActionsSpace
from lmgym.envs.options import ENV_OPTION_NAMES, EnvOptions
from lmgym.envs.prompts import (
    DatasetColumn,
    JsonlPrompts,
    PromptSubset,
    RecordPrompts,
    shuffle_prompts,
    split_prompts,
)
from lmgym.envs.registration import (
    TASKS,
    TaskInfo,
    available_tasks,
    env_option_names,
    format_task_table,
    make_reward_env_vector,
    register_all,
    register_responder_env,
    register_reward_env,
    responder_env_factory,
    reward_env_factory,
    vector_entry_point,
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
from lmgym.envs.single import TokenEnv, single_env_factory
from lmgym.envs.task_factory import TaskParams, build_env, factory_arguments, task_factory
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, Responder, ResponderError, TurnInput, TurnOutput
from lmgym.special_tokens import stop_ids_for

register_all()

__all__ = [
    "ENV_OPTION_NAMES",
    "TASKS",
    "CombinedReward",
    "DatasetColumn",
    "EnvOptions",
    "EpisodeStart",
    "FunctionReward",
    "JsonlPrompts",
    "PromptSubset",
    "RecordPrompts",
    "Responder",
    "ResponderError",
    "RewardError",
    "SequenceClassifierReward",
    "TaskInfo",
    "TaskParams",
    "TokenActionSpace",
    "TokenActionsSpace",
    "TokenEnv",
    "TokenModuleReward",
    "TokenScoreReward",
    "TokenVectorEnv",
    "TurnInput",
    "TurnOutput",
    "available_tasks",
    "build_env",
    "env_option_names",
    "factory_arguments",
    "format_task_table",
    "make_reward_env_vector",
    "register_responder_env",
    "register_reward_env",
    "reward_component_means",
    "responder_env_factory",
    "reward_env_factory",
    "shuffle_prompts",
    "single_env_factory",
    "split_prompts",
    "stop_ids_for",
    "task_factory",
    "vector_entry_point",
]
