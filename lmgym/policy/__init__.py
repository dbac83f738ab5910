"""Policies: a transformers causal LM with a KV-cached sampler and a teacher-forced pass."""

# make_char_tokenizer lives in lmgym.char_tokenizer; lmgym.bench.run imports it from here.
from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.policy.causal_lm import CausalLMPolicy, PolicyState
from lmgym.policy.engines import ROLLOUT_ENGINES, set_rollout_engine
from lmgym.policy.kv_engine import RolloutEngine
from lmgym.policy.sampling import SamplingSettings
from lmgym.policy.tiny import make_tiny_llama, make_tiny_lm, make_tiny_model, save_tiny

__all__ = [
    "CausalLMPolicy",
    "PolicyState",
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "SamplingSettings",
    "make_char_tokenizer",
    "make_tiny_lm",
    "make_tiny_llama",
    "make_tiny_model",
    "save_tiny",
    "set_rollout_engine",
]
