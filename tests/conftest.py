"""Shared fixtures: a character tokenizer, tiny models, and an env factory with an injectable reward."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy, make_tiny_model


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # Tiny models: one thread is several times faster than two (OpenMP overhead
    # dominates [32, 64] matmuls, and a busy second core makes it far worse).
    torch.set_num_threads(1)


@pytest.fixture
def tokenizer():
    return make_char_tokenizer()


@pytest.fixture
def policy(tokenizer) -> CausalLMPolicy:
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)


def count_a(prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
    """Number of 'a' characters in each completion."""
    return [float(c.count("a")) for c in completions]


@pytest.fixture
def make_env(tokenizer) -> Callable[..., TokenVectorEnv]:
    """Build a TokenVectorEnv with sane defaults; any keyword overrides."""

    def factory(prompts: Sequence[str] = ("ab", "xyz"), reward=None, **kwargs) -> TokenVectorEnv:
        kwargs.setdefault("max_new_tokens", 4)
        return TokenVectorEnv(
            kwargs.pop("tokenizer", tokenizer),
            list(prompts),
            reward if reward is not None else FunctionReward(count_a),
            **kwargs,
        )

    return factory


@pytest.fixture
def ids(tokenizer) -> Callable[[str], list[int]]:
    """Token ids of a string under the character tokenizer."""
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def eos_biased_policy(
    tokenizer, eos_bias: float = 3.0, seed: int = 0, compile_decode: bool = False
) -> CausalLMPolicy:
    """A tiny policy whose LM head favours EOS, so episodes end at varied lengths."""
    model = make_tiny_model(len(tokenizer), seed=seed)
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    head.weight = old.weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = eos_bias
    model.set_output_embeddings(head)
    return CausalLMPolicy(model, tokenizer, compile_decode=compile_decode)


@pytest.fixture
def eos_policy(tokenizer) -> CausalLMPolicy:
    return eos_biased_policy(tokenizer)


@pytest.fixture
def make_eos_policy() -> Callable[..., CausalLMPolicy]:
    return eos_biased_policy
