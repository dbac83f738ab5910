"""How a sampled completion is shown: the prompt as a reader needs it, then the completion.

A chat prompt rendered by its template carries the system prompt and the role
markers; printed before every completion it buries the answer. ``prompt_label``
keeps what the user asked (the last user message of a chat prompt; a plain prompt
as it is), and ``sample_line`` shortens it to its last ``PROMPT_CHARS`` characters
(the end of a prompt is what the completion continues).

``episode_texts`` is the completion as a reader needs it: a single-turn row's text
as a string reward sees it, a multi-turn row's whole episode, the policy's turns
(each as its responder saw it) with the environment's observations between them in
``[...]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lmgym.envs.token_env import TokenVectorEnv
    from lmgym.types import RolloutBatch

OBSERVATION_OPEN, OBSERVATION_CLOSE = "[", "]"
"""What a printed multi-turn episode puts around an environment's observation."""

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


def _runs(tokens: list[int], mine: list[bool]) -> list[tuple[bool, list[int]]]:
    """``tokens`` cut into maximal runs of equal ``mine``: ``[(mine, ids), ...]``."""
    runs: list[tuple[bool, list[int]]] = []
    for token, flag in zip(tokens, mine, strict=True):
        if runs and runs[-1][0] == flag:
            runs[-1][1].append(token)
        else:
            runs.append((flag, [token]))
    return runs


def episode_texts(env: TokenVectorEnv, batch: RolloutBatch) -> list[str]:
    """Each row's completion region as text for a reader.

    A single-turn row (every real token the policy's) reads as a string reward sees
    it (``TokenVectorEnv.decode_completions``). A multi-turn row reads as its whole
    episode: each policy turn decoded as the responder saw it (a final special stop
    token left out), each environment observation decoded (special tokens and chat
    markers included) between ``OBSERVATION_OPEN`` and ``OBSERVATION_CLOSE``. All
    the pieces are decoded in one ``decode_completions`` call.

    Args:
        env: the env the batch was collected from (its tokenizer and stop ids).
        batch: ``completion_ids``, ``completion_mask`` and ``policy_mask``, each
            ``[B, L]``.

    Returns:
        ``B`` strings.
    """
    ids, mask, mine = batch.completion_ids, batch.completion_mask, batch.policy_mask
    if bool(torch.equal(mine, mask)):
        return env.decode_completions(ids, mask)
    rows = []
    for row_ids, row_mask, row_mine in zip(ids.tolist(), mask.tolist(), mine.tolist(), strict=True):
        real = [i for i, keep in enumerate(row_mask) if keep]
        rows.append(_runs([row_ids[i] for i in real], [row_mine[i] for i in real]))
    pieces = [run for runs in rows for run in runs]
    width = max((len(run) for _, run in pieces), default=0)
    piece_ids = torch.zeros(len(pieces), width, dtype=torch.long)
    piece_mask = torch.zeros(len(pieces), width, dtype=torch.bool)
    for k, (_, run) in enumerate(pieces):
        piece_ids[k, : len(run)] = torch.tensor(run)
        piece_mask[k, : len(run)] = True
    texts = iter(env.decode_completions(piece_ids, piece_mask))
    out = []
    for runs in rows:
        parts = [
            text if policy else OBSERVATION_OPEN + text + OBSERVATION_CLOSE
            for (policy, _), text in zip(runs, texts, strict=False)
        ]
        out.append("".join(parts))
    return out
