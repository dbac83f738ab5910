"""Pieces the chat tasks share: chat prompts (system message, few-shot turns, the
question) and their plain-text form, and drawing a seeded set of distinct items.

A chat task's prompt is a list of messages, rendered by the env with the policy
tokenizer's chat template (``lmgym.envs.prompts``); a model such as
SmolLM2-135M-Instruct then ends its reply with its end-of-turn token
(``<|im_end|>``: pass ``stop_token_ids=policy.stop_token_ids``). With
``chat=False`` the same content is one plain-text prompt, for a base model or a
tokenizer without a chat template (the character tokenizer of the fast tests);
the tasks' default ``chat=None`` picks chat prompts exactly when the tokenizer has
a chat template (``wants_chat``), so every task also runs on the character tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from lmgym.envs.tasks._common import DataSplit
from lmgym.types import Prompt

Item = TypeVar("Item", bound=Hashable)


def wants_chat(chat: bool | None, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether to make chat prompts: ``chat`` if given, else whether ``tokenizer`` has a
    chat template. (``chat=True`` with a tokenizer without one fails when the env
    renders the prompts, with an error that says so.)"""
    if chat is None:
        return getattr(tokenizer, "chat_template", None) is not None
    return bool(chat)


@dataclass(frozen=True, kw_only=True)
class ChatSplit(DataSplit):
    """The parameters every chat task takes: ``DataSplit``'s and ``chat``.

    Attributes:
        chat: chat prompts (the tokenizer needs a chat template); ``False``: plain
            text; ``None``: chat iff the tokenizer has a chat template (``wants_chat``).
    """

    chat: bool | None = None

    def wants_chat(self, tokenizer: PreTrainedTokenizerBase) -> bool:
        """``wants_chat(self.chat, tokenizer)``."""
        return wants_chat(self.chat, tokenizer)


def chat_prompt(
    question: str,
    system: str | None = None,
    shots: Sequence[tuple[str, str]] = (),
    *,
    chat: bool = True,
) -> Prompt:
    """One prompt: an optional system message, few-shot ``(question, answer)`` turns,
    then ``question`` as the last user message.

    With ``chat=False`` the same content as plain text: the system message, each shot
    as ``"{question}\\n{answer}"``, then the question, separated by blank lines and
    ending with a newline (where the reply starts).
    """
    if not chat:
        parts = ([system] if system else []) + [f"{q}\n{a}" for q, a in shots] + [question]
        return "\n\n".join(parts) + "\n"
    messages = [{"role": "system", "content": system}] if system else []
    for q, a in shots:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return [*messages, {"role": "user", "content": question}]


def distinct_draws(
    draw: Callable[[random.Random], Item], size: int, distinct: int, data_seed: int, field: str
) -> list[Item]:
    """``size`` distinct items from ``draw(rng)``, in draw order, under ``data_seed``.

    Args:
        draw: draws one item with the given RNG.
        size: how many distinct items to return.
        distinct: how many distinct items ``draw`` can make; ``size`` may be at most
            half of it, so that drawing stays fast.
        data_seed: seeds the RNG.
        field: the option that sets ``size``, named in the error.

    Raises:
        ValueError: ``size`` outside ``[1, distinct // 2]``.
    """
    if not isinstance(size, int) or not 1 <= size <= distinct // 2:
        raise ValueError(
            f"{field}={size!r}: must be in [1, {distinct // 2}] (half the {distinct} "
            "distinct items these settings can make); lower it or widen the settings"
        )
    rng = random.Random(data_seed)
    seen: dict[Item, None] = {}
    while len(seen) < size:
        seen.setdefault(draw(rng), None)
    return list(seen)
