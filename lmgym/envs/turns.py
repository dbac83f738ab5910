"""Multi-turn episodes: what a *responder* is, and the records it reads and returns.

In a multi-turn env a row's buffer holds the prompt, the policy's turn 1, the
environment's observation 1, the policy's turn 2, ... A policy turn ends at an
end-of-turn id (the env's stop ids; ``<|im_end|>`` for a chat model). The env then
calls its responder once, batched, on every row that just ended a turn: the
responder answers each with an observation (text, or token ids), a reward for the
turn, and whether the episode is over. The env renders a text observation into ids
once and appends it; the history is never re-tokenized. Observation tokens are
state, not actions: they are never sampled and never trained on.

Responders are functional over an opaque per-episode ``state``: ``start`` gives the
state of new episodes, ``respond`` gets the states of the rows it answers and
returns their next states. The env keeps the states and commits the new ones only
after the whole step has succeeded, so a responder that raises (or answers the
wrong number of rows) leaves the env exactly as it was, the same promise a reward
model gets. A responder must therefore not mutate the states it is given (return
new ones; an immutable tuple or a frozen record is the safe choice).

Concurrent responders. A responder whose ``respond`` is ``async def``, or that
declares ``thread_safe = True``, is called once *per row*: the env runs the calls
for all the rows that ended a turn at the same time (an event loop the env keeps on
a thread of its own for ``async``; a pool of threads otherwise), each with
``TurnInput`` of one row, and assembles the answers in row order, so a slow row
does not hold up the others and the outcome does not depend on which call finished
first (determinism under a seed is kept as long as a call's answer depends on its
row alone: draw any randomness from the row's state, not from a shared RNG). The
env option ``responder_timeout`` (seconds, ``None``: no limit) bounds each call,
and ``on_responder_timeout`` says what a late call means (``lmgym.envs.turn_calls``):
``"penalty"`` (default) ends that row's episode as a cut-off one (``truncated``,
no turn reward, the env's ``unfinished`` policy applies: under ``"penalty"`` its
return is exactly ``unfinished_penalty``, the task's penalty); ``"raise"`` raises
``ResponderTimeout`` naming the rows, with the env left as it was. A responder that
declares neither is called once per step, batched, as before, and takes no timeout.
In an autoreset env, ``responder_park_after`` lets ``step`` return before a slow
call answers: the row is parked until a later step finds its answer
(``lmgym.envs.turn_park``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor

from lmgym.types import Prompt

#: Who speaks an observation: the chat template's role for its turn.
ObservationRole = Literal["user", "tool"]


class ResponderError(ValueError):
    """A responder failed or answered something the env cannot use.

    Raised for a responder whose ``start`` or ``respond`` raises, answers the wrong
    number of rows, gives a reward that is not a finite number, or an observation
    that is neither text nor in-vocabulary token ids. The message names the
    responder and the env row(s). The env is left exactly as it was before the
    call (the same promise as ``RewardError``), so the call can be retried.
    """


class ResponderTimeout(ResponderError):
    """A concurrent responder's call for a row did not answer within
    ``responder_timeout`` and the env was built with ``on_responder_timeout="raise"``.

    The message names the responder, the env row(s) and the timeout; the env is left
    exactly as it was before the step (the late call's answer, if it ever comes, is
    dropped).
    """


def responder_name(responder: object) -> str:
    """A readable name for error messages: its ``name`` attribute, else its class."""
    name = getattr(responder, "name", None)
    return name if isinstance(name, str) else type(responder).__qualname__


@dataclass(frozen=True)
class EpisodeStart:
    """The ``k`` episodes a responder is asked to ``start``.

    Attributes:
        prompts: the prompt of each episode (a string or chat messages), as the
            prompt source holds it.
        prompt_index: ``[k] int64`` index of each prompt in the prompt source.
        columns: per-row values of the prompt source's columns (``columns[name][j]``
            for row ``j``; e.g. a game seed or a secret), ``{}`` if it has none.
    """

    prompts: Sequence[Prompt]
    prompt_index: Tensor
    columns: dict[str, Sequence[Any]]


@dataclass(frozen=True)
class TurnInput:
    """The ``k`` rows that just ended a policy turn, for ``Responder.respond``.

    Attributes:
        rows: ``[k] int64`` the env rows (for error messages only).
        prompts: each row's prompt (string or chat messages).
        prompt_index: ``[k] int64``.
        columns: as in ``EpisodeStart``.
        turn_texts: the policy's turn that just ended, decoded as a reward sees a
            completion (a final special stop token left out).
        turn_ids: ``k`` 1-D ``int64`` tensors, the ids of that turn (stop id included).
        turn_index: ``[k] int64``, 1 for the episode's first policy turn.
        states: each row's responder state (from ``start`` or the last ``respond``).
    """

    rows: Tensor
    prompts: Sequence[Prompt]
    prompt_index: Tensor
    columns: dict[str, Sequence[Any]]
    turn_texts: Sequence[str]
    turn_ids: Sequence[Tensor]
    turn_index: Tensor
    states: Sequence[Any]


@dataclass(frozen=True)
class TurnOutput:
    """A responder's answer to ``k`` rows, row ``j`` answering ``TurnInput`` row ``j``.

    Attributes:
        observations: per row, the text the environment says next (rendered by the
            env: through the chat template as a ``role`` turn plus the next assistant
            header for a chat tokenizer, plain text otherwise), a sequence of token
            ids appended as they are, or ``None`` for a row whose episode is over.
        rewards: ``k`` floats, the reward of the turn that just ended.
        done: ``k`` bools, the episode is over (the env reports ``terminated``).
        states: ``k`` new states (ignored for rows that are done).
        truncated: ``k`` bools or ``None`` (all ``False``): the environment cut the
            episode short (a time limit, as a Gymnasium env's ``truncated``) rather
            than ended it. Such a row's episode is over whatever its ``done`` says,
            and the env reports it ``truncated``, not ``terminated`` (a value-based
            agent bootstraps there).
    """

    observations: Sequence[str | Sequence[int] | None]
    rewards: Sequence[float]
    done: Sequence[bool]
    states: Sequence[Any]
    truncated: Sequence[bool] | None = None


@runtime_checkable
class Responder(Protocol):
    """The environment's side of a multi-turn episode.

    Attributes:
        role: the chat role its text observations are rendered as (``"user"`` for a
            game or feedback, ``"tool"`` for a tool result).

    Optional: ``thread_safe = True`` (or an ``async def respond``) makes the env call
    ``respond`` once per row, concurrently (see the module docstring); ``start`` may
    be ``async def`` too (it is still called once, batched).
    """

    role: ObservationRole

    def start(self, episodes: EpisodeStart) -> list[Any]:
        """The initial state of each of ``k`` new episodes (``k`` values)."""
        ...

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer the ``k`` rows that just ended a policy turn."""
        ...
