"""Pieces the LM benchmarks share: prompts of an exact length, a reward that costs nothing, and an output
bias that makes one token unsampleable (equal work: every row then runs to the
token budget on both sides)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from lmgym import RewardInput, TokenVectorEnv
from lmgym.char_tokenizer import DEFAULT_CHARS


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


def fixed_length_env(
    tokenizer, n: int, prompt_tokens: int, new_tokens: int, device: str | torch.device = "cpu"
) -> TokenVectorEnv:
    """``n`` rows, one exact-length prompt each (``make_prompts``, served in order),
    EOS the only stop id, a zero reward: the env side of rollout-vs-generate."""
    env = TokenVectorEnv(
        tokenizer,
        make_prompts(tokenizer, n, prompt_tokens),
        ZeroReward(),
        num_prompts=n,
        group_size=1,
        max_new_tokens=new_tokens,
        stop_token_ids=[tokenizer.eos_token_id],
        prompt_order="sequential",
        device=device,
    )
    assert env.prompt_width == prompt_tokens
    return env


def generate_exact(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, new_tokens: int, tokenizer
) -> Tensor:
    """transformers' sampling with the rollout's settings (temperature 1, no top-k /
    top-p): ``[B, Lp + new_tokens]`` ids. Pair with ``check_exact``."""
    with torch.no_grad():
        return model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            max_new_tokens=new_tokens,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )


def check_exact(out: Tensor, prompt_tokens: int, new_tokens: int, tokenizer) -> None:
    """Every row of ``generate_exact``'s output made exactly ``new_tokens`` (equal work)."""
    completion = out[:, prompt_tokens:]
    assert completion.shape[1] == new_tokens, f"generate: shape {tuple(out.shape)}"
    assert not bool((completion == tokenizer.eos_token_id).any()), "generate: a row stopped early"
