"""Policies: a transformers causal LM with a KV-cached sampler and a teacher-forced pass."""

from lmgym.policy.causal_lm import CausalLMPolicy, PolicyState
from lmgym.policy.tiny import make_char_tokenizer, make_tiny_lm, make_tiny_model, save_tiny

__all__ = [
    "CausalLMPolicy",
    "PolicyState",
    "make_char_tokenizer",
    "make_tiny_lm",
    "make_tiny_model",
    "save_tiny",
]
