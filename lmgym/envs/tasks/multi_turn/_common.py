"""Pieces the multi-turn tasks share: a responder's answer assembled row by row (and
framed for plain-text prompts), the per-row column a responder reads, and a task's
records split into train/eval."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmgym.envs.prompts import RecordPrompts, is_chat
from lmgym.envs.tasks._common import DataSplit
from lmgym.envs.turns import TurnInput, TurnOutput
from lmgym.types import Prompt, PromptSource


@dataclass(frozen=True)
class Reply:
    """A responder's answer to one row (see ``TurnOutput``)."""

    observation: str | None
    reward: float
    done: bool
    state: Any
    truncated: bool = False


def frame(text: str | None, prompt: Prompt) -> str | None:
    """An observation as the env should append it: as is for a chat prompt (the chat
    template frames it), followed by a newline for a plain-text prompt (the env adds
    no separator there, and the prompts of these tasks end with one too)."""
    if text is None or is_chat(prompt):
        return text
    return f"{text}\n"


def turn_output(replies: Sequence[Reply], prompts: Sequence[Prompt]) -> TurnOutput:
    """The ``TurnOutput`` of per-row replies (in row order), their observations
    ``frame``-d for each row's prompt (``truncated`` is ``None`` when no reply is)."""
    return TurnOutput(
        observations=[frame(r.observation, p) for r, p in zip(replies, prompts, strict=True)],
        rewards=[float(r.reward) for r in replies],
        done=[bool(r.done) for r in replies],
        states=[r.state for r in replies],
        truncated=[bool(r.truncated) for r in replies]
        if any(r.truncated for r in replies)
        else None,
    )


def reply_each(reply: Callable[[str, Any], Reply], turns: TurnInput) -> TurnOutput:
    """The ``turn_output`` of ``reply(turn text, state)`` for each row of ``turns``."""
    return turn_output(
        [reply(text, state) for text, state in zip(turns.turn_texts, turns.states, strict=True)],
        turns.prompts,
    )


def check_num_games(num_games: int) -> None:
    """Raise ``ValueError`` unless ``num_games`` is an integer ``>= 2`` (a train/eval
    split needs two games)."""
    if not isinstance(num_games, int) or num_games < 2:
        raise ValueError(f"num_games={num_games!r}: must be an integer >= 2")


def column(columns: Mapping[str, Sequence[Any]], name: str, who: str) -> Sequence[Any]:
    """The per-row values of column ``name``.

    Raises:
        KeyError: the prompt source has no such column (the message names the
            responder ``who`` and the columns there are).
    """
    if name not in columns:
        raise KeyError(
            f"{who}: the prompt source has no column {name!r} (columns: {sorted(columns)}); "
            f"give each prompt a {name!r} field, e.g. RecordPrompts([{{'prompt': ..., "
            f"'{name}': ...}}])"
        )
    return columns[name]


def split_records(records: Sequence[dict[str, Any]], data: DataSplit) -> PromptSource:
    """The ``data`` part of ``records`` as a prompt source whose columns are the
    records' other fields (``DataSplit.part``; ``"all"``: every one).

    Raises:
        ValueError: an unknown ``split`` (or an ``eval_fraction`` ``split_prompts``
            refuses).
    """
    return data.part(RecordPrompts(records))
