"""Three single-player TextArena games as registered lmgym tasks
(``pip install 'lmgym[textarena]'``; the bridge: ``textarena_bridge``).

- ``lmgym/TextArena-GuessTheNumber-v0`` (number game, TextArena
  ``GuessTheNumber-v0``): guess a number in 1..20 in 10 turns, a move ``[12]``,
  told higher/lower. Reward 1 for a hit, else ``1 - |last guess - target| / 19``.
  The seed draws the number.
- ``lmgym/TextArena-Crosswords-v0`` (word game, ``Crosswords-v0`` with
  ``num_words=1``, ``max_turns=12``): fill one word of a crossword from its clue,
  a letter a move ``[row col letter]``. Reward 1 for the filled word, else the
  share of its cells filled right when the turns run out. The seed draws the word,
  its clue and its direction. The board is shown with runs of spaces squeezed to
  one (``render_compact``: a third of TextArena's width, the same cells).
- ``lmgym/TextArena-TowerOfHanoi-v0`` (puzzle, ``TowerOfHanoi-v0``): move 3 disks
  from tower A to C in 14 moves, a move ``[A C]``. Reward 1 when solved, else the
  share of disks on C. One puzzle for every seed (the optimum is 7 moves).

Each task takes ``num_games`` (seeds ``0 .. num_games - 1``, one prompt each,
column ``seed``), ``split``/``eval_fraction``/``data_seed``, ``chat`` and every
env option; ``max_turns`` and ``max_new_tokens`` default per game (``OPTIONS``;
with the character tokenizer every observation is spelled a character a token, and
Crosswords' board takes ~500 of them: its default 576 keeps the buffer small
enough for SB3's one-hot policies, raise it to fill a long word). A bad move is the game's business (a first one is answered with the
reason, a second in a row ends the game with the game's reward).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import VectorFactory, named_task_factory, params_with_defaults
from lmgym.envs.tasks.multi_turn.textarena_bridge import (
    TextArenaGame,
    TextArenaParams,
    build_textarena_env,
    render_messages,
)
from lmgym.envs.token_env import TokenVectorEnv


def render_compact(messages: Sequence[tuple[int, str, Any]]) -> str:
    """``render_messages`` with every run of spaces squeezed to one."""
    return re.sub(r" {2,}", " ", render_messages(messages))


#: Per task name: the TextArena game.
GAMES: dict[str, TextArenaGame] = {
    "GuessTheNumber": TextArenaGame("GuessTheNumber-v0"),
    "Crosswords": TextArenaGame(
        "Crosswords-v0", {"num_words": 1, "max_turns": 12}, render=render_compact
    ),
    "TowerOfHanoi": TextArenaGame("TowerOfHanoi-v0"),
}

#: Per task name: its env option defaults (the game's own turn limit; a budget for
#: the turns and the observations together, in character tokens).
OPTIONS: dict[str, dict[str, Any]] = {
    "GuessTheNumber": {"max_turns": 10, "max_new_tokens": 640},
    "Crosswords": {"max_turns": 12, "max_new_tokens": 576},
    "TowerOfHanoi": {"max_turns": 14, "max_new_tokens": 1536},
}


def _game_factory(name: str, factory_name: str, num_games: int) -> VectorFactory:
    """The vector factory of TextArena game ``name`` (``lmgym/TextArena-<name>-v0``)."""

    budget = OPTIONS[name]["max_new_tokens"]

    params = params_with_defaults(TextArenaParams, f"{name}Params", num_games=num_games)

    def body(options: EnvOptions, params: TextArenaParams) -> TokenVectorEnv:
        return build_textarena_env(options, GAMES[name], params, max_new_tokens=budget)

    return named_task_factory(
        body,
        params,
        factory_name,
        f"``lmgym/TextArena-{name}-v0`` as a native vector env (the parameters:\n"
        "``TextArenaParams``).",
        **OPTIONS[name],
    )


make_guess_the_number_vector = _game_factory(
    "GuessTheNumber", "make_guess_the_number_vector", num_games=16
)
make_crosswords_vector = _game_factory("Crosswords", "make_crosswords_vector", num_games=16)
make_tower_of_hanoi_vector = _game_factory(
    "TowerOfHanoi", "make_tower_of_hanoi_vector", num_games=4
)

make_guess_the_number = single_env_factory(make_guess_the_number_vector)
make_crosswords = single_env_factory(make_crosswords_vector)
make_tower_of_hanoi = single_env_factory(make_tower_of_hanoi_vector)


def register_textarena_tasks(register_task: Callable[..., str]) -> None:
    """Register the three games (``lmgym/TextArena-<Game>-v0``) with ``register_task``
    (``lmgym.envs.registration``'s, passed in: this module does not import it);
    importing textarena waits until one is made, and ``lmgym tasks`` lists them only
    where it is installed."""
    for name, factory, solved, what in (
        ("GuessTheNumber", "guess_the_number", 0.9,
         "number game: guess 1..20 as [n], told higher/lower; 1 for a hit, else closeness"),
        ("Crosswords", "crosswords", 0.9,
         "word game: fill a clued word a letter a move, [row col letter]; 1 when filled, "
         "else the share filled"),
        ("TowerOfHanoi", "tower_of_hanoi", 0.9,
         "puzzle: 3 disks from A to C, a move [A C]; 1 when solved, else the share on C"),
    ):  # fmt: skip
        register_task(
            f"TextArena-{name}",
            __name__,
            f"make_{factory}",
            f"make_{factory}_vector",
            solved_threshold=solved,
            random_baseline=0.0,  # random_policy_return, 64 rows x 2 batches: 0.0 each
            modes=("bandit",),
            requires="textarena",
            requires_module="textarena",
            description=f"multi-turn TextArena {what}",
        )


__all__ = [
    "GAMES",
    "OPTIONS",
    "make_crosswords_vector",
    "make_guess_the_number_vector",
    "make_tower_of_hanoi_vector",
    "register_textarena_tasks",
]
