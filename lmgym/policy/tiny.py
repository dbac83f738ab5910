"""Tiny causal LMs, built locally with no download, sized for the character tokenizer
(``lmgym.char_tokenizer``).

Tests, examples and the default demo use these instead of a hub model. They go
through the real transformers path: ``save_tiny`` writes a directory with
``save_pretrained`` and ``CausalLMPolicy.from_pretrained`` reads it back exactly
as it would read a hub checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from lmgym.char_tokenizer import DEFAULT_CHARS, make_char_tokenizer


def make_tiny_model(
    vocab_size: int,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_positions: int = 256,
    seed: int = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> PreTrainedModel:
    """A small GPT-2 built from a config, float32, in eval mode, deterministic under ``seed``.

    Args:
        vocab_size: Number of token ids; pass ``len(tokenizer)``.
        n_layer, n_embd, n_head, n_positions: GPT-2 shape (``n_positions`` is the
            context length: prompt plus completion must fit in it).
        seed: Seed of the weight initialisation.
    """
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        # No dropout: RL fine-tuning needs the learner's log-probs to match the sampler's.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()


def make_tiny_llama(
    vocab_size: int,
    num_layers: int = 2,
    seed: int = 0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    bos_token_id: int | None = None,
    max_position_embeddings: int = 64,
    hidden_size: int = 32,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> PreTrainedModel:
    """A small Llama (rotary positions, grouped KV heads, untied head) from a config,
    float32, eval mode, deterministic under ``seed`` without moving the global RNG.

    For tests and examples that need a modern architecture (LoRA target modules
    ``q_proj``/``v_proj``, chat models' several stop ids). The head size is
    ``hidden_size // num_attention_heads`` (vLLM's CPU attention wants 64 or more);
    the MLP is twice as wide as ``hidden_size``."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def make_tiny_lm(
    chars: str = DEFAULT_CHARS,
    pad_equals_eos: bool = False,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_positions: int = 256,
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """``(model, tokenizer)``: a character tokenizer over ``chars`` and a tiny GPT-2
    sized for it, the tokenizer's EOS and pad ids in the model config."""
    tokenizer = make_char_tokenizer(chars, pad_equals_eos=pad_equals_eos)
    model = make_tiny_model(
        len(tokenizer),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model, tokenizer


def save_tiny(
    path: str | Path,
    lm: tuple[PreTrainedModel, PreTrainedTokenizerFast] | None = None,
) -> Path:
    """``save_pretrained`` a tiny model and its tokenizer into ``path``.

    Args:
        path: the directory to write.
        lm: ``(model, tokenizer)`` to write, e.g. ``make_tiny_lm(n_layer=1)``;
            ``None``: ``make_tiny_lm()``'s defaults.

    The directory is then loadable with ``CausalLMPolicy.from_pretrained(path)``
    or ``AutoModelForCausalLM.from_pretrained(path)``.
    """
    path = Path(path)
    model, tokenizer = make_tiny_lm() if lm is None else lm
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
