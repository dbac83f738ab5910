"""Prompt tables: a prompt source tokenised once into a padded tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.types import PromptSource


@dataclass(frozen=True)
class PromptTable:
    """Every prompt of a source, tokenised once and left-padded to ``width``.

    Attributes:
        texts: the prompt strings, in source order.
        ids: ``[num_prompts, width] int64`` left-padded token ids.
        mask: ``[num_prompts, width] bool`` True on real tokens.
        lengths: ``[num_prompts] int64`` tokens per prompt.
    """

    texts: list[str]
    ids: Tensor
    mask: Tensor
    lengths: Tensor

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def __len__(self) -> int:
        return len(self.texts)


def build_prompt_table(
    prompts: PromptSource,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    device: torch.device,
) -> PromptTable:
    """Tokenise ``prompts`` without special tokens and left-pad them.

    Args:
        max_prompt_length: Width of the prompt region; ``None`` uses the longest
            prompt. A longer prompt is an error, never silently cut.

    Raises:
        ValueError: empty source, a non-string prompt, a prompt that tokenises to
            nothing, or one longer than ``max_prompt_length``.
    """
    if len(prompts) == 0:
        raise ValueError("prompts: the prompt source is empty; pass at least one prompt")
    texts = [prompts[i] for i in range(len(prompts))]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"prompts[{i}]: expected a string, got {type(text).__name__}")
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(
                f"prompts[{i}] ({texts[i]!r}) tokenises to zero tokens; the policy needs at "
                "least one token to condition on: give every prompt some text"
            )
    width = max(lengths) if max_prompt_length is None else max_prompt_length
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[longest] > width:
        raise ValueError(
            f"prompts[{longest}] is {lengths[longest]} tokens, longer than "
            f"max_prompt_length={width}; raise max_prompt_length or shorten the prompt "
            "(prompts are never truncated silently)"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.bool)
    for i, row in enumerate(encoded):  # once per prompt at construction, not a hot path
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = True
    return PromptTable(
        texts=texts,
        ids=ids.to(device),
        mask=mask.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device),
    )
