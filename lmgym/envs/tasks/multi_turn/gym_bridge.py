"""A bridge that makes a discrete Gymnasium env a multi-turn text task.

The prompt describes the game and shows its first observation as text; each
policy turn is one move, parsed into the env's action; the responder (role
``"user"``) steps the Gymnasium env and answers with the next observation as
text; the env's reward is the turn's reward, and the episode ends when the
Gymnasium env terminates or truncates.

Moves. A turn is read as one action: its text, lowercased, with surrounding
whitespace and punctuation (``. , ! ? : ; ' " `` and backticks) stripped, must be
one of the action's names or its number (``"left"``, ``"Left."`` and ``"0"`` are
FrozenLake's action 0). Anything else is an *invalid turn*: the env is not
stepped, the turn's reward is ``invalid_penalty`` (default ``-0.1``) and the
observation is the parse error, naming the valid moves (``"unknown move: jump.
write one of left, down, right, up, or 0-3"``); the episode goes on, and the
env's ``max_turns`` bounds how long.

State. A row's responder state is ``GameState(seed, actions)``: the game seed and
the actions taken so far. ``respond`` replays them on a Gymnasium env the
responder keeps (one per thread), from ``reset(seed=seed)`` (the toy-text envs are
tiny and, given the seed, deterministic, their randomness included), so states are
immutable values and nothing leaks between rows or survives a failed step.

The built-in games (FrozenLake, CliffWalking, Taxi, Blackjack) and how each reads
as text are in ``lmgym.envs.tasks.multi_turn.games``. Any other discrete env: ``TextGame.generic(env_id)`` (numbers as moves,
``str(observation)`` as text), or a ``TextGame`` of your own with names and a
renderer. The prompt source holds one record per game seed (column ``seed``),
split into train/eval like the other tasks.
"""

from __future__ import annotations

import numbers
import string
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from lmgym.envs.options import EnvOptions
from lmgym.envs.task_factory import build_env
from lmgym.envs.tasks._chat import chat_prompt, wants_chat
from lmgym.envs.tasks._common import Split
from lmgym.envs.tasks.multi_turn._common import Reply, column, split_records, turn_output
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

DEFAULT_INVALID_PENALTY = -0.1
_STRIP = string.whitespace + ".,!?:;'\"`"

#: ``render(unwrapped_env, observation) -> text``.
Renderer = Callable[[Any, Any], str]


def render_generic(env: Any, obs: Any) -> str:
    """Any observation as ``"observation: <str(obs)>"``."""
    return f"observation: {obs}"


@dataclass(frozen=True)
class GameState:
    """One episode of a bridged game: its seed and the actions taken so far."""

    seed: int
    actions: tuple[int, ...] = ()


@dataclass(frozen=True)
class TextGame:
    """How one discrete Gymnasium env reads and is played as text.

    Attributes:
        env_id: the Gymnasium id (``gymnasium.make(env_id, **kwargs)``).
        actions: per action index, its names (the first is the one error messages
            show; matched case-insensitively); the action's number is always
            accepted too.
        intro: the prompt's first line(s): the game, the moves, the rewards.
        render: ``(env.unwrapped, observation) -> text``: what the policy reads.
        kwargs: keyword arguments for ``gymnasium.make``.
    """

    env_id: str
    actions: tuple[tuple[str, ...], ...]
    intro: str
    render: Renderer
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def generic(cls, env_id: str, **kwargs: Any) -> TextGame:
        """Any env with a ``Discrete`` action space: moves are the action numbers,
        the observation is shown as ``str(observation)``.

        Raises:
            ValueError: the env's action space is not ``Discrete``.
        """
        env = gym.make(env_id, **kwargs)
        space = env.action_space
        env.close()
        if not isinstance(space, gym.spaces.Discrete) or int(space.start) != 0:
            raise ValueError(
                f"env_id={env_id!r}: the bridge needs a Discrete action space starting at 0, "
                f"got {space}"
            )
        n = int(space.n)
        return cls(
            env_id,
            tuple((str(i),) for i in range(n)),
            f"{env_id.lower()}: one move per turn, a number from 0 to {n - 1}.",
            render_generic,
            dict(kwargs),
        )

    def move_list(self) -> str:
        """The moves as error messages name them: ``"left, down, right, up, or 0-3"``."""
        names = [names[0] for names in self.actions]
        if all(name.isdigit() for name in names):
            return ", ".join(names)
        return f"{', '.join(names)}, or 0-{len(names) - 1}"

    def parse(self, text: str) -> int:
        """The action a turn names.

        Raises:
            ValueError: the turn is not one of the moves (the message lists them).
        """
        word = text.strip(_STRIP).lower()
        for index, names in enumerate(self.actions):
            if word == str(index) or word in (name.lower() for name in names):
                return index
        shown = word if len(word) <= 20 else word[:20] + "..."
        raise ValueError(f"unknown move: {shown or 'nothing'}. write one of {self.move_list()}")


class GymResponder:
    """The responder of a bridged game (role ``"user"``).

    Args:
        game: the game (``GAMES[name]`` or a ``TextGame`` of your own).
        invalid_penalty: reward of a turn that names no valid move.
        column: the prompt-source column holding each episode's game seed.
    """

    role: Literal["user"] = "user"

    def __init__(
        self,
        game: TextGame,
        *,
        invalid_penalty: float = DEFAULT_INVALID_PENALTY,
        column: str = "seed",
    ) -> None:
        self.game = game
        self.invalid_penalty = float(invalid_penalty)
        self.column = column
        self._local = threading.local()  # one Gymnasium env per thread, made on first use

    def __repr__(self) -> str:
        return f"GymResponder({self.game.env_id!r}, invalid_penalty={self.invalid_penalty})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (or deep-copied) without its Gymnasium envs; a copy makes its own."""
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def env(self) -> gym.Env:
        """This thread's Gymnasium env, which every replay resets (made on first use)."""
        env = getattr(self._local, "env", None)
        if env is None:
            env = self._local.env = gym.make(self.game.env_id, **self.game.kwargs)
        return env

    def play(self, state: GameState) -> tuple[str, float, bool]:
        """``(observation text, reward of the last action, episode over)`` after
        ``reset(seed=state.seed)`` and ``state.actions``, replayed on a fresh episode."""
        env = self.env
        obs, _ = env.reset(seed=state.seed)
        reward, over = 0.0, False
        for action in state.actions:
            obs, step_reward, terminated, truncated, _ = env.step(action)
            reward, over = float(step_reward), bool(terminated or truncated)
        return self.game.render(env.unwrapped, obs), reward, over

    def first_observation(self, seed: int) -> str:
        """The text of the game's first observation under ``seed``."""
        return self.play(GameState(seed))[0]

    def start(self, episodes: EpisodeStart) -> list[GameState]:
        """A fresh ``GameState`` per episode, from the ``column`` column's seeds.

        Raises:
            KeyError: the prompt source has no such column.
            ValueError: a seed that is not an integer.
        """
        seeds = column(episodes.columns, self.column, f"GymResponder({self.game.env_id})")
        states = []
        for j, seed in enumerate(seeds):
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ValueError(f"GymResponder: row {j}: seed {seed!r} is not an integer")
            states.append(GameState(int(seed)))
        return states

    def reply(self, text: str, state: GameState) -> Reply:
        """Play one turn: parse the move, step the game (by replaying it)."""
        try:
            action = self.game.parse(text)
        except ValueError as err:
            return Reply(str(err), self.invalid_penalty, False, state)
        moved = GameState(state.seed, (*state.actions, action))
        text, reward, over = self.play(moved)
        return Reply(None if over else text, reward, over, moved)

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's move (see the module docstring)."""
        return turn_output(
            [
                self.reply(text, state)
                for text, state in zip(turns.turn_texts, turns.states, strict=True)
            ],
            turns.prompts,
        )


def game_records(
    responder: GymResponder, num_games: int, *, chat: bool = False
) -> list[dict[str, Any]]:
    """One record ``{"prompt", "seed"}`` per game seed ``0 .. num_games - 1``: the
    game's intro, then its first observation under that seed.

    Raises:
        ValueError: ``num_games < 2`` (a train/eval split needs two games).
    """
    if not isinstance(num_games, int) or num_games < 2:
        raise ValueError(f"num_games={num_games!r}: must be an integer >= 2")
    records = []
    for seed in range(num_games):
        text = f"{responder.game.intro}\n{responder.first_observation(seed)}"
        records.append({"prompt": chat_prompt(text, chat=chat), "seed": seed})
    return records


def build_game_env(
    options: EnvOptions,
    game: TextGame,
    *,
    num_games: int,
    invalid_penalty: float,
    split: Split,
    eval_fraction: float,
    data_seed: int,
    chat: bool | None,
    max_new_tokens: int,
) -> TokenVectorEnv:
    """The multi-turn env of a bridged game: what a game task's body returns.

    Args:
        options: the options the task body was given.
        game: the game.
        num_games: game seeds ``0 .. num_games - 1``, one prompt each, before the split.
        invalid_penalty: reward of a turn that names no valid move.
        split: ``"train"``, ``"eval"`` (held-out seeds) or ``"all"``.
        eval_fraction: share of the seeds held out for ``"eval"``.
        data_seed: seeds the split.
        chat: chat prompts; ``False``: plain text; ``None``: chat iff the tokenizer
            has a chat template.
        max_new_tokens: the task's default budget (the options' value wins if set).
    """
    responder = GymResponder(game, invalid_penalty=invalid_penalty)
    chat = wants_chat(chat, options.tokenizer)
    records = game_records(responder, num_games, chat=chat)
    source = split_records(records, split, eval_fraction, data_seed)
    return build_env(options, source, None, responder=responder, max_new_tokens=max_new_tokens)
