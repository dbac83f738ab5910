"""A bridge that makes a single-player TextArena game a multi-turn lmgym task.

TextArena (``pip install 'lmgym[textarena]'``) games speak text both ways: the game
says its rules and board, the player answers with a move such as ``[12]`` or
``[A C]``. Here the prompt is the game's first observation under the episode's
game seed (TextArena's own player prompt and board), each policy turn is sent to
the game as the move (as written; a turn with no ``[`` is sent in brackets,
``12`` as ``[12]``, so that a tokenizer that cannot spell brackets, such as the
character tokenizer, can still play: ``TextArenaGame(bracket=False)`` sends every
turn as written), and the responder (role ``"user"``) answers with
what the game says next (the game's messages since the move, one per line; the
echo of the move itself is left out, the buffer holds it already). The game parses
the move and handles a bad one itself (TextArena's ``error_allowance``: a first
invalid move is answered with the reason, a second in a row ends the game).

Rewards. A turn's reward is 0 until the game ends; the turn that ends it gets the
game's reward for player 0 (TextArena's single-player outcome: 1 for a win, else
the game's share of completion, e.g. how close the last guess was). The episode
ends (``terminated``) when the game says it is done; the env's ``max_turns`` and
token budget cut it otherwise.

State and determinism. A row's state is ``TextArenaState(seed, moves)`` plus a
*live game*: the TextArena env standing at that state, owned by that state alone,
that the next move steps (no replay). TextArena games draw from Python's global
``random``, seeded by ``reset(seed=...)``; the bridge gives every game its own
stream (the global state is swapped in for each call of that game and back out
after, under one lock), so a game plays the same under its seed whatever the other
rows do and whatever other code draws from ``random`` between its calls. (Code on
another thread that draws from ``random`` *during* a game's call draws from that
game's stream: keep such code off the global RNG, as lmgym's own code is.) A state without a live game
(copied, pickled, or an old state the env retries) is replayed from its seed and
its moves, and a replay that does not read as the episode did is refused
(``ValueError`` naming the game and the seed).
"""

from __future__ import annotations

import numbers
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.task_factory import build_env
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt
from lmgym.envs.tasks.multi_turn._common import (
    Reply,
    check_num_games,
    column,
    reply_each,
    split_records,
)
from lmgym.envs.tasks.multi_turn.gym_bridge import LiveGame, move_digest
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput
from lmgym.extras import require

_RANDOM_LOCK = threading.Lock()  # the global ``random`` is one per process

#: ``render(messages) -> text``: a game's messages ``(from_id, text, type)`` as text.
MessageRenderer = Callable[[Sequence[tuple[int, str, Any]]], str]


def import_textarena() -> Any:
    """The ``textarena`` module.

    Raises:
        ImportError: it is not installed (``pip install 'lmgym[textarena]'``).
    """
    return require("textarena", "textarena", "the TextArena bridge")


def render_messages(messages: Sequence[tuple[int, str, Any]]) -> str:
    """The game's messages, one per line, without the echo of the player's own move."""
    return "\n".join(
        text.strip()
        for _, text, kind in messages
        if getattr(kind, "name", "") != "PLAYER_ACTION" and text.strip()
    )


class SeededGame:
    """One TextArena env with its own stream of Python's ``random``.

    Args:
        env: a TextArena env (``textarena.make(...)``).
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.rng: Any = None  # random.getstate() of this game, after its last call

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        with _RANDOM_LOCK:
            outer = random.getstate()
            if self.rng is not None:
                random.setstate(self.rng)
            try:
                yield
            finally:
                self.rng = random.getstate()
                random.setstate(outer)

    def reset(self, seed: int) -> list[tuple[int, str, Any]]:
        """``reset(num_players=1, seed=seed)``; the messages the player sees first.

        Raises:
            ValueError: the game is not a single-player game.
        """
        with self._own_random():
            try:
                self.env.reset(num_players=1, seed=seed)
            except AssertionError as err:
                raise ValueError(
                    f"{type(self.env).__name__}: reset(num_players=1) failed ({err}); the "
                    "TextArena bridge plays single-player games only"
                ) from err
            return list(self.env.get_observation()[1])

    def step(self, move: str) -> tuple[list[tuple[int, str, Any]], float, bool]:
        """Play ``move``: ``(messages since, reward for player 0, game over)``."""
        with self._own_random():
            done, _ = self.env.step(move)
            messages = list(self.env.get_observation()[1])
            reward = 0.0
            if done:
                rewards, _info = self.env.close()
                reward = float((rewards or {}).get(0, 0.0))
        return messages, reward, bool(done)


def digest_step(digest: str, move: str, text: str, reward: float, done: bool) -> str:
    """The digest after one move (``move_digest``)."""
    return move_digest(digest, move, text, reward, done)


@dataclass(frozen=True)
class TextArenaState:
    """One episode of a bridged TextArena game.

    Attributes:
        seed: the game seed (``reset(seed=seed)``).
        moves: the moves sent so far, as the policy wrote them.
        digest: ``digest_step`` of every move so far (``""`` before the first).
        live: the game standing at this state, if any (not compared).
    """

    seed: int
    moves: tuple[str, ...] = ()
    digest: str = field(default="", compare=False, repr=False)
    live: LiveGame | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TextArenaGame:
    """One TextArena game as an lmgym task.

    Attributes:
        env_id: the TextArena id (``"GuessTheNumber-v0"``); the bridge makes its
            ``-raw`` variant (no TextArena observation wrappers: the bridge shows
            each turn's new messages, the buffer holds the history).
        kwargs: keyword arguments for ``textarena.make`` (override the id's).
        render: the game's messages as text (default ``render_messages``).
        bracket: send a turn with no ``[`` in brackets (``"a c"`` as ``"[a c]"``).
    """

    env_id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    render: MessageRenderer = render_messages
    bracket: bool = True

    def move(self, text: str) -> str:
        """The move a turn sends: the turn, stripped, in brackets if it has none
        (and ``bracket`` is set)."""
        text = text.strip()
        return f"[{text}]" if self.bracket and "[" not in text else text

    def make(self) -> SeededGame:
        """A new game (not reset).

        Raises:
            ImportError: textarena is not installed.
            ValueError: TextArena has no such id.
        """
        ta = import_textarena()
        raw = self.env_id if self.env_id.endswith("-raw") else f"{self.env_id}-raw"
        try:
            return SeededGame(ta.make(raw, **dict(self.kwargs)))
        except ValueError as err:
            raise ValueError(
                f"TextArenaGame(env_id={self.env_id!r}): {err}; use a single-player id "
                "TextArena registers, e.g. 'GuessTheNumber-v0' or 'TowerOfHanoi-v0'"
            ) from err


class TextArenaResponder:
    """The responder of a bridged TextArena game (role ``"user"``).

    Args:
        game: the game.
        column: the prompt-source column holding each episode's game seed.
    """

    role: Literal["user"] = "user"

    def __init__(self, game: TextArenaGame, *, column: str = "seed") -> None:
        self.game = game
        self.column = column

    def __repr__(self) -> str:
        return f"TextArenaResponder({self.game.env_id!r})"

    def first_observation(self, seed: int) -> str:
        """The text the game shows first under ``seed`` (its rules and board)."""
        return self.game.render(self.game.make().reset(seed))

    def _replayed(self, state: TextArenaState) -> SeededGame:
        """A new game replayed to ``state`` from its seed, checked against its digest.

        Raises:
            ValueError: the replay reads otherwise than the episode did.
        """
        game = self.game.make()
        game.reset(state.seed)
        digest = ""
        for move in state.moves:
            messages, reward, done = game.step(self.game.move(move))
            digest = digest_step(digest, move, self.game.render(messages), reward, done)
        if digest != state.digest:
            raise ValueError(
                f"TextArenaResponder({self.game.env_id}): replaying game seed {state.seed} "
                f"({len(state.moves)} moves) shows other messages than the episode saw: the "
                "game is not deterministic given its seed, so a copied or retried state "
                "cannot be replayed"
            )
        return game

    def start(self, episodes: EpisodeStart) -> list[TextArenaState]:
        """A fresh state per episode, from the ``column`` column's seeds (the game
        itself is made on the first move).

        Raises:
            KeyError: the prompt source has no such column.
            ValueError: a seed that is not an integer.
        """
        seeds = column(episodes.columns, self.column, repr(self))
        states = []
        for j, seed in enumerate(seeds):
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ValueError(f"{self!r}: row {j}: seed {seed!r} is not an integer")
            states.append(TextArenaState(int(seed)))
        return states

    def reply(self, move: str, state: TextArenaState) -> Reply:
        """Send ``move`` to the row's live game (replayed first if it has none)."""
        taken = state.live.take() if state.live is not None else None
        game = taken if isinstance(taken, SeededGame) else self._replayed(state)
        messages, reward, done = game.step(self.game.move(move))
        text = self.game.render(messages)
        moved = TextArenaState(
            state.seed,
            (*state.moves, move),
            digest_step(state.digest, move, text, reward, done),
            None if done else LiveGame(game),  # type: ignore[arg-type]
        )
        return Reply(None if done else text, reward, done, moved)

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's move (see the module docstring)."""
        return reply_each(self.reply, turns)


def textarena_records(
    responder: TextArenaResponder, num_games: int, *, chat: bool = False
) -> list[dict[str, Any]]:
    """One record ``{"prompt", "seed"}`` per game seed ``0 .. num_games - 1``: the
    game's first observation under that seed.

    Raises:
        ValueError: ``num_games < 2`` (a train/eval split needs two games).
    """
    check_num_games(num_games)
    return [
        {"prompt": chat_prompt(responder.first_observation(seed), chat=chat), "seed": seed}
        for seed in range(num_games)
    ]


@dataclass(frozen=True, kw_only=True)
class TextArenaParams(ChatSplit):
    """A TextArena game's parameters (and ``ChatSplit``'s).

    Attributes:
        num_games: game seeds ``0 .. num_games - 1``, one prompt each, before the split.
    """

    num_games: int = 16


def build_textarena_env(
    options: EnvOptions, game: TextArenaGame, params: TextArenaParams, *, max_new_tokens: int
) -> TokenVectorEnv:
    """The multi-turn env of a bridged TextArena game (arguments as
    ``lmgym.envs.tasks.multi_turn.gym_bridge.build_game_env``'s).

    Raises:
        ImportError: textarena is not installed (``pip install 'lmgym[textarena]'``).
    """
    responder = TextArenaResponder(game)
    records = textarena_records(
        responder, params.num_games, chat=params.wants_chat(options.tokenizer)
    )
    source = split_records(records, params)
    return build_env(options, source, None, responder=responder, max_new_tokens=max_new_tokens)


__all__ = [
    "SeededGame",
    "TextArenaGame",
    "TextArenaResponder",
    "TextArenaState",
    "build_textarena_env",
    "import_textarena",
    "render_messages",
    "textarena_records",
]
