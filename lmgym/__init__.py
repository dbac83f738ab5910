"""lmgym: language-model text generation as a Gymnasium environment, with policy-gradient agents.

Importing ``lmgym`` registers its tasks with Gymnasium (``lmgym/<Name>-v0``).
"""

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
