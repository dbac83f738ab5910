"""How a sampled completion is shown: the prompt as a reader needs it, then the completion.

A chat prompt rendered by its template carries the system prompt and the role
markers; printed before every completion it buries the answer. ``prompt_label``
keeps what the user asked (the last user message of a chat prompt; a plain prompt
as it is), and ``sample_line`` shortens it to its last ``PROMPT_CHARS`` characters
(the end of a prompt is what the completion continues).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROMPT_CHARS = 60
"""A printed prompt longer than this shows as ``...`` and its last characters."""


def prompt_label(prompt: Any, text: str) -> str:
    """What identifies a prompt to a reader.

    Args:
        prompt: the prompt as its source gave it: a string, or a chat conversation
            (a list of ``{"role", "content"}`` messages).
        text: its rendered text (what the model saw), used for a plain prompt.

    Returns:
        A chat prompt's last user message (its last message if none is the user's);
        otherwise ``text``.
    """
    if isinstance(prompt, str) or not isinstance(prompt, Sequence) or not prompt:
        return text
    messages = [m for m in prompt if isinstance(m, Mapping)]
    users = [m for m in messages if m.get("role") == "user"] or messages
    content = users[-1].get("content", "") if users else ""
    return content if isinstance(content, str) else str(content)


def shorten(text: str, limit: int = PROMPT_CHARS) -> str:
    """``text``, or ``...`` and its last ``limit - 3`` characters when it is longer."""
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def sample_line(prompt: str, completion: str, reward: float) -> str:
    """``  reward 0.50: '...prompt' -> 'completion'`` (the prompt shortened)."""
    return f"  reward {reward:.2f}: {shorten(prompt)!r} -> {completion!r}"
