"""lmgym: language-model text generation as a Gymnasium environment, with policy-gradient agents.

Importing ``lmgym`` registers its tasks with Gymnasium (``lmgym/<Name>-v0``).

The names below are imported when first used (PEP 562), so ``import lmgym.cli`` or
``lmgym tasks`` does not also import the policy and the rollout (and the model code
they load); ``from lmgym import CausalLMPolicy`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The tasks are registered by lmgym.envs (register_all), on import: `import lmgym` then
# `gymnasium.make("lmgym/<Name>-v0")` needs nothing else.
from lmgym import envs  # noqa: F401

if TYPE_CHECKING:
    from lmgym.char_tokenizer import make_char_tokenizer
    from lmgym.envs import FunctionReward, TokenEnv, TokenVectorEnv
    from lmgym.policy import CausalLMPolicy, make_tiny_lm, make_tiny_model, save_tiny
    from lmgym.rollout import ContinuousCollector, collect
    from lmgym.types import RewardInput, RewardModel, RolloutBatch

__version__ = "0.1.0"

__all__ = [
    "CausalLMPolicy",
    "ContinuousCollector",
    "FunctionReward",
    "RewardInput",
    "RewardModel",
    "RolloutBatch",
    "TokenEnv",
    "TokenVectorEnv",
    "collect",
    "make_char_tokenizer",
    "make_tiny_lm",
    "make_tiny_model",
    "save_tiny",
]

# Each public name -> the module it is imported from on first use.
_EXPORTS = {
    "make_char_tokenizer": "lmgym.char_tokenizer",
    "FunctionReward": "lmgym.envs",
    "TokenEnv": "lmgym.envs",
    "TokenVectorEnv": "lmgym.envs",
    "CausalLMPolicy": "lmgym.policy",
    "make_tiny_lm": "lmgym.policy",
    "make_tiny_model": "lmgym.policy",
    "save_tiny": "lmgym.policy",
    "ContinuousCollector": "lmgym.rollout",
    "collect": "lmgym.rollout",
    "RewardInput": "lmgym.types",
    "RewardModel": "lmgym.types",
    "RolloutBatch": "lmgym.types",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmgym' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
