"""Pieces the LM benchmarks share: a GPT-2 built from config with the character
tokenizer, prompts of an exact length, a reward that costs nothing, and an output
bias that makes one token unsampleable (equal work: every row then runs to the
token budget on both sides)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from lmgym import RewardInput, make_char_tokenizer, make_tiny_model
from lmgym.policy.tiny import DEFAULT_CHARS


def char_gpt2(
    n_layer: int, n_embd: int, n_head: int, n_positions: int, chars: str = DEFAULT_CHARS
) -> tuple[nn.Module, object]:
    """``(model, tokenizer)``: a GPT-2 from config over a character tokenizer of
    ``chars``, with the tokenizer's EOS and pad ids in the model config."""
    tok = make_char_tokenizer(chars)
    model = make_tiny_model(
        len(tok),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return model, tok


class ZeroReward:
    """A trivial reward model: 0 for every row, ``[N] float32`` on the completions' device."""

    name = "zero"

    def __call__(self, batch: RewardInput) -> Tensor:
        return torch.zeros(batch.completion_ids.shape[0], device=batch.completion_ids.device)


def forbid_token(model: nn.Module, token_id: int) -> None:
    """Give the output layer a bias of ``-1e9`` on ``token_id`` (probability exactly 0).

    The new ``[V, H]`` head shares the old (tied) weight, so every other logit is
    unchanged; the bias takes the weight's dtype and device.
    """
    old = model.get_output_embeddings()
    w = old.weight
    head = nn.Linear(old.in_features, old.out_features, bias=True, device=w.device, dtype=w.dtype)
    head.weight = w
    with torch.no_grad():
        head.bias.zero_()
        head.bias[token_id] = -1e9
    model.set_output_embeddings(head)


def make_prompts(tokenizer, n: int, length: int, seed: int = 0) -> list[str]:
    """``n`` random strings over the tokenizer's characters, each exactly ``length`` tokens."""
    rng = np.random.default_rng(seed)
    prompts = ["".join(rng.choice(list(DEFAULT_CHARS), size=length)) for _ in range(n)]
    for p in prompts:
        assert len(tokenizer(p, add_special_tokens=False)["input_ids"]) == length
    return prompts
