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

Ends. The Gymnasium env's ``terminated`` ends the episode as ``done`` (the env
reports ``terminated``); its ``truncated`` (a ``TimeLimit``) as ``truncated``
(``TurnOutput.truncated``: the env reports ``truncated``, not ``terminated``).

State. A row's responder state is ``GameState(seed, actions)``: the game seed and
the actions taken so far, which is what it compares by. It also carries the *live
game*: the Gymnasium env standing at that state, owned by that state alone, which
the next move steps on (no replay: a game whose randomness is not drawn from
``reset(seed=...)`` plays on as one game), and a digest of every observation,
reward and end seen so far. A state with no live game (one made by hand, a pickled
copy, or an old state the env retries after a failed step: its game moved on with
the answer that was dropped) is replayed from ``reset(seed=seed)`` on a spare env,
and a replay that does not read exactly as the digest says is refused
(``ValueError``, naming the game and the seed: the game is not deterministic given
its seed, so it cannot be retried or copied) instead of silently showing other
observations. States are still immutable values; nothing leaks between rows.

The built-in games (FrozenLake, CliffWalking, Taxi, Blackjack) and how each reads
as text are in ``lmgym.envs.tasks.multi_turn.games``. Any other discrete env: ``TextGame.generic(env_id)`` (numbers as moves,
``str(observation)`` as text), or a ``TextGame`` of your own with names and a
renderer. The prompt source holds one record per game seed (column ``seed``),
split into train/eval like the other tasks.
"""

from __future__ import annotations

import hashlib
import numbers
import string
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

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
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

DEFAULT_INVALID_PENALTY = -0.1
_STRIP = string.whitespace + ".,!?:;'\"`"

#: ``render(unwrapped_env, observation) -> text``.
Renderer = Callable[[Any, Any], str]


def render_generic(env: Any, obs: Any) -> str:
    """Any observation as ``"observation: <str(obs)>"``."""
    return f"observation: {obs}"


class LiveGame:
    """A Gymnasium env standing at one ``GameState``; whoever ``take``s it first owns
    it. Pickled or copied, it is empty (a Gymnasium env does not travel). Dropped
    untaken (its episode cut by the env: ``max_turns``, the budget), it hands its env
    to ``spare`` (a list ``append`` is atomic, so this is safe from any thread or
    the garbage collector), so a new game need not make one."""

    def __init__(self, env: gym.Env | None = None, spare: list[gym.Env] | None = None) -> None:
        self._env = env
        self._spare = spare
        self._lock = threading.Lock()

    def take(self) -> gym.Env | None:
        """The env (``None`` if taken already); afterwards this holds none."""
        with self._lock:
            env, self._env = self._env, None
        return env

    def __del__(self) -> None:
        env, spare = getattr(self, "_env", None), getattr(self, "_spare", None)
        if env is not None and spare is not None:
            spare.append(env)

    def __reduce__(self) -> tuple[type[LiveGame], tuple[()]]:
        return (LiveGame, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> LiveGame:
        return LiveGame()


def move_digest(digest: str, move: object, text: str, reward: float, end: object) -> str:
    """A bridged game's digest after one move: a hash of the one before, the move, the
    observation's text, the reward and how the move ended the game (stable across
    processes)."""
    record = f"{digest}|{move}|{text}|{reward!r}|{end}".encode()
    return hashlib.blake2b(record, digest_size=12).hexdigest()


def step_digest(digest: str, action: int, text: str, reward: float, ends: tuple[bool, bool]) -> str:
    """The digest after one move: of the one before, the action, the observation's
    text, the reward and ``(terminated, truncated)`` (``move_digest``)."""
    return move_digest(digest, action, text, reward, ends)


@dataclass(frozen=True)
class GameState:
    """One episode of a bridged game: its seed and the actions taken so far.

    Attributes:
        seed: the game seed (``reset(seed=seed)``).
        actions: the actions taken so far.
        digest: ``step_digest`` of every move so far (``""`` before the first);
            ``None`` for a state made by hand (its replay is not checked).
        live: the Gymnasium env standing at this state, if any (not compared).
    """

    seed: int
    actions: tuple[int, ...] = ()
    digest: str | None = field(default=None, compare=False, repr=False)
    live: LiveGame | None = field(default=None, compare=False, repr=False)


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
        self._spare: list[gym.Env] = []  # envs of finished games, reused by new ones

    def __repr__(self) -> str:
        return f"GymResponder({self.game.env_id!r}, invalid_penalty={self.invalid_penalty})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (or deep-copied) without its Gymnasium envs; a copy makes its own."""
        return {k: v for k, v in self.__dict__.items() if k != "_spare"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._spare = []

    def _spare_env(self) -> gym.Env:
        """An env no game stands on (a finished game's, else a new one)."""
        try:
            return self._spare.pop()  # atomic: no lock, which LiveGame.__del__ could not take
        except IndexError:
            return gym.make(self.game.env_id, **self.game.kwargs)

    def _release(self, env: gym.Env) -> None:
        self._spare.append(env)

    def _replayed(self, state: GameState) -> tuple[gym.Env, Any]:
        """A spare env replayed to ``state`` from ``reset(seed=state.seed)`` and its
        last observation, after checking the replay against ``state.digest``.

        Raises:
            ValueError: the replay reads otherwise than the episode did.
        """
        env = self._spare_env()
        obs, _ = env.reset(seed=state.seed)
        digest = ""
        for action in state.actions:
            obs, step_reward, terminated, truncated, _ = env.step(action)
            text = self.game.render(env.unwrapped, obs)
            ends = (bool(terminated), bool(truncated))
            digest = step_digest(digest, action, text, float(step_reward), ends)
        if state.digest is not None and digest != state.digest:
            self._release(env)
            raise ValueError(
                f"GymResponder({self.game.env_id}): replaying game seed {state.seed} "
                f"(moves {list(state.actions)}) from reset(seed={state.seed}) shows other "
                "observations than the episode saw: the game is not deterministic given "
                "its seed (it draws from an RNG other than the env's np_random), so its "
                "state cannot be replayed (a retried step, a copied state); seed all its "
                "randomness in reset(seed=...)"
            )
        return env, obs

    def play(self, state: GameState) -> tuple[str, float, bool]:
        """``(observation text, reward of the last action, episode over)`` after
        ``reset(seed=state.seed)`` and ``state.actions``, replayed on a spare env."""
        env = self._spare_env()
        obs, _ = env.reset(seed=state.seed)
        reward, over = 0.0, False
        for action in state.actions:
            obs, step_reward, terminated, truncated, _ = env.step(action)
            reward, over = float(step_reward), bool(terminated or truncated)
        text = self.game.render(env.unwrapped, obs)
        self._release(env)
        return text, reward, over

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
            states.append(GameState(int(seed), digest=""))
        return states

    def reply(self, text: str, state: GameState) -> Reply:
        """Play one turn: parse the move and step the game on the state's live env
        (a state without one is replayed first, see the module docstring).

        Raises:
            ValueError: the state had to be replayed and the game is not deterministic.
        """
        try:
            action = self.game.parse(text)
        except ValueError as err:
            return Reply(str(err), self.invalid_penalty, False, state)
        env = state.live.take() if state.live is not None else None
        if env is None:
            env, _ = self._replayed(state)
        obs, step_reward, terminated, truncated, _ = env.step(action)
        text = self.game.render(env.unwrapped, obs)
        reward, ends = float(step_reward), (bool(terminated), bool(truncated))
        over = ends[0] or ends[1]
        digest = step_digest(state.digest or "", action, text, reward, ends)
        if state.digest is None:  # a state made by hand: its digest starts with the replay
            digest = None
        if over:
            self._release(env)
        moved = GameState(
            state.seed,
            (*state.actions, action),
            digest,
            None if over else LiveGame(env, self._spare),
        )
        return Reply(
            None if over else text, reward, ends[0], moved, truncated=ends[1] and not ends[0]
        )

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's move (see the module docstring)."""
        return reply_each(self.reply, turns)


def game_records(
    responder: GymResponder, num_games: int, *, chat: bool = False
) -> list[dict[str, Any]]:
    """One record ``{"prompt", "seed"}`` per game seed ``0 .. num_games - 1``: the
    game's intro, then its first observation under that seed.

    Raises:
        ValueError: ``num_games < 2`` (a train/eval split needs two games).
    """
    check_num_games(num_games)
    records = []
    for seed in range(num_games):
        text = f"{responder.game.intro}\n{responder.first_observation(seed)}"
        records.append({"prompt": chat_prompt(text, chat=chat), "seed": seed})
    return records


@dataclass(frozen=True, kw_only=True)
class GameParams(ChatSplit):
    """A bridged game's parameters (and ``ChatSplit``'s: which seeds the env serves,
    ``eval`` the held-out ones); each game task gives its own defaults
    (``lmgym.envs.tasks.multi_turn.games``).

    Attributes:
        num_games: game seeds ``0 .. num_games - 1``, one prompt each, before the split.
        invalid_penalty: reward of a turn that names no valid move.
    """

    num_games: int = 16
    invalid_penalty: float = 0.0


def build_game_env(
    options: EnvOptions, game: TextGame, params: GameParams, *, max_new_tokens: int
) -> TokenVectorEnv:
    """The multi-turn env of a bridged game: what a game task's body returns.

    Args:
        options: the options the task body was given.
        game: the game.
        params: the task's parameters.
        max_new_tokens: the task's default budget (the options' value wins if set).
    """
    responder = GymResponder(game, invalid_penalty=params.invalid_penalty)
    records = game_records(responder, params.num_games, chat=params.wants_chat(options.tokenizer))
    source = split_records(records, params)
    return build_env(options, source, None, responder=responder, max_new_tokens=max_new_tokens)
