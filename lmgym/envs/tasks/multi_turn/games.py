"""The bridged Gymnasium games (``gym_bridge``), each a registered multi-turn task.

Ids as gymnasium 1.4 registers them. Every observation is text a character
tokenizer can spell (lowercase, digits, ``.,:-``; newlines and ``|`` are unknown to
it and read as ``<unk>``, consistently). Moves are case-insensitive; a number is
always accepted for the action it numbers. An invalid turn costs
``invalid_penalty`` and is answered with the parse error (``gym_bridge``).

- ``lmgym/FrozenLake-v0`` (``FrozenLake-v1``, 4x4, ``is_slippery=False``): the
  lake, ``x`` where you are (``s`` start, ``f`` frozen, ``h`` hole, ``g`` goal), one
  row per line. Moves ``left down right up`` (0-3). Reward 1 on reaching the goal,
  else 0; falling into a hole ends the episode. ``invalid_penalty`` -0.1. The map
  does not depend on the seed, so every game is the same one: the optimal return
  is 1 (six moves). An episode cut at ``max_turns`` or the budget returns -1.
  Range ``[-0.1 * max_turns, 1]``. Solved: ``R >= 0.9``.
- ``lmgym/CliffWalking-v0`` (``CliffWalking-v1``): the 4x12 map in the prompt;
  each observation is your position, ``"row 2 col 5"``. Moves ``up right down
  left`` (0-3). Reward -1 per move, -100 for stepping onto the cliff (back to the
  start). ``invalid_penalty`` -1, the cost of a move, so that writing nonsense never
  beats walking; an episode cut at ``max_turns`` or the budget returns -100.
  One game for every seed; the optimal return is -13. Solved: ``R >= -13``.
- ``lmgym/Taxi-v0`` (``Taxi-v4``): the map and the stops in the prompt; each
  observation ``"taxi row 2 col 1, passenger at y, destination g."`` (``in the
  taxi`` once picked up). Moves ``south north east west pickup dropoff`` (0-5;
  ``down up right left`` too). Reward -1 per move, +20 for the delivery, -10 for a
  wrong pickup or dropoff; ``invalid_penalty`` -1; an episode cut at ``max_turns``
  or the budget returns -20. The seed draws the start.
  Solved: ``R >= 8`` (Gymnasium's threshold for Taxi).
- ``lmgym/Blackjack-v0`` (``Blackjack-v1``, Sutton & Barto rules): ``"your sum 14,
  dealer shows 10, usable ace: no."``. Moves ``stick hit`` (0-1; ``stand`` too).
  Reward +1 win, -1 loss, 0 draw, when the hand ends. ``invalid_penalty`` -0.1; an
  episode cut at ``max_turns`` or the budget returns -1, a lost hand.
  The seed draws the cards. Even perfect play loses on average: basic strategy
  returns -0.045 (measured directly on ``Blackjack-v1``, seeds 0-39999, standard
  error 0.005), always sticking -0.18. Solved: ``R >= -0.07``, near basic strategy.

Each task takes ``num_games`` (game seeds ``0 .. num_games - 1``, one prompt each,
column ``seed``), ``invalid_penalty``, ``split``/``eval_fraction``/``data_seed`` (a
train/eval split of the seeds), ``chat`` and every env option; ``max_turns`` and
``max_new_tokens`` default per game (``OPTIONS``; ``lmgym tasks`` lists the reward
ranges at these defaults, ``lmgym.envs.registration.register_multi_turn_tasks``).
"""

from __future__ import annotations

from typing import Any

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import VectorFactory, named_task_factory, params_with_defaults
from lmgym.envs.tasks.multi_turn.gym_bridge import GameParams, TextGame, build_game_env
from lmgym.envs.token_env import TokenVectorEnv


# ------------------------------------------------------------------ renderers
def render_frozen_lake(env: Any, obs: int) -> str:
    """The lake, lowercase, ``x`` where you are, one row per line."""
    rows = [[cell.decode().lower() for cell in line] for line in env.desc]
    row, col = divmod(int(obs), env.ncol)
    rows[row][col] = "x"
    return "\n".join("".join(line) for line in rows)


def cliff_map(nrow: int = 4, ncol: int = 12) -> list[str]:
    """CliffWalking's map: ``.`` free, ``s`` start, ``c`` cliff, ``g`` goal."""
    return ["." * ncol] * (nrow - 1) + ["s" + "c" * (ncol - 2) + "g"]


def render_cliff_walking(env: Any, obs: int) -> str:
    """Your position, ``"row 3 col 0"``."""
    row, col = divmod(int(obs), env.shape[1])
    return f"row {row} col {col}"


TAXI_STOPS = "rgyb"
TAXI_STOP_CELLS = ((0, 0), (0, 4), (4, 0), (4, 3))


def taxi_map() -> str:
    """Taxi's map, lowercase (``r g y b`` the stops, ``|`` walls)."""
    from gymnasium.envs.toy_text.taxi import MAP

    return "\n".join(line.lower() for line in MAP)


def render_taxi(env: Any, obs: int) -> str:
    """Where the taxi is, where the passenger waits (or ``in the taxi``), where to."""
    taxi_row, taxi_col, passenger, destination = env.decode(int(obs))
    where = "in the taxi" if passenger == 4 else f"at {TAXI_STOPS[passenger]}"
    return (
        f"taxi row {taxi_row} col {taxi_col}, passenger {where}, "
        f"destination {TAXI_STOPS[destination]}."
    )


def render_blackjack(env: Any, obs: tuple[int, int, int]) -> str:
    """Your sum, the dealer's card and whether you hold a usable ace."""
    total, dealer, ace = obs
    shown = "ace" if dealer == 1 else str(dealer)
    return f"your sum {total}, dealer shows {shown}, usable ace: {'yes' if ace else 'no'}."


_TAXI_STOPS_TEXT = ", ".join(
    f"{name} row {row} col {col}"
    for name, (row, col) in zip(TAXI_STOPS, TAXI_STOP_CELLS, strict=True)
)

GAMES: dict[str, TextGame] = {
    "FrozenLake": TextGame(
        "FrozenLake-v1",
        (("left",), ("down",), ("right",), ("up",)),
        "frozen lake: walk from s to the goal g without falling into a hole h. x marks "
        "you. one move per turn: left, down, right or up, or 0-3.",
        render_frozen_lake,
        {"map_name": "4x4", "is_slippery": False},
    ),
    "CliffWalking": TextGame(
        "CliffWalking-v1",
        (("up",), ("right",), ("down",), ("left",)),
        "cliff walking: walk from s to the goal g, row 0 at the top, col 0 at the left, "
        "c is the cliff:\n"
        + "\n".join(cliff_map())
        + "\none move per turn: up, right, down or left, or 0-3. each move costs 1, "
        "stepping on the cliff costs 100 and sends you back to s.",
        render_cliff_walking,
    ),
    "Taxi": TextGame(
        "Taxi-v4",
        (
            ("south", "down"),
            ("north", "up"),
            ("east", "right"),
            ("west", "left"),
            ("pickup",),
            ("dropoff",),
        ),
        "taxi: drive to the passenger, pick them up, drive to the destination and drop "
        f"them off. the map, | is a wall, row 0 at the top:\n{taxi_map()}\nstops: "
        f"{_TAXI_STOPS_TEXT}. one move per turn: south, north, east, west, pickup or "
        "dropoff, or 0-5. each move costs 1, the delivery earns 20, a wrong pickup or "
        "dropoff costs 10.",
        render_taxi,
    ),
    "Blackjack": TextGame(
        "Blackjack-v1",
        (("stick", "stand"), ("hit",)),
        "blackjack: get closer to 21 than the dealer without going over. one move per "
        "turn: hit takes a card, stick ends your turn, or 0 stick, 1 hit. win 1, "
        "lose -1, draw 0.",
        render_blackjack,
    ),
}

#: Per game: its env option defaults. A truncated episode (cut at ``max_turns`` or
#: the budget) returns exactly ``unfinished_penalty`` (the env's
#: ``unfinished="penalty"``), no better than the worst played episode: without it a
#: policy that babbles until the budget runs out, ending no turn, pays less than one
#: that plays (CliffWalking and Taxi count costs; FrozenLake and Blackjack penalise
#: unparseable moves, and a tiny model trained without the penalty learned exactly
#: that, benchmarks/results/multi_turn). FrozenLake's -1 is ten invalid moves,
#: Blackjack's -1 a lost hand.
OPTIONS: dict[str, dict[str, Any]] = {
    "FrozenLake": {
        "max_turns": 10,
        "max_new_tokens": 320,
        "unfinished": "penalty",
        "unfinished_penalty": -1.0,
    },
    "CliffWalking": {
        "max_turns": 20,
        "max_new_tokens": 448,
        "unfinished": "penalty",
        "unfinished_penalty": -100.0,
    },
    "Taxi": {
        "max_turns": 20,
        "max_new_tokens": 1280,
        "unfinished": "penalty",
        "unfinished_penalty": -20.0,
    },
    "Blackjack": {
        "max_turns": 5,
        "max_new_tokens": 320,
        "unfinished": "penalty",
        "unfinished_penalty": -1.0,
    },
}

#: Per game: the reward of a turn that names no valid move (a move's cost where
#: moves cost, so that nonsense never beats walking).
INVALID_PENALTY: dict[str, float] = {
    "FrozenLake": -0.1,
    "CliffWalking": -1.0,
    "Taxi": -1.0,
    "Blackjack": -0.1,
}


def _game_factory(name: str, bridged: str, factory_name: str, num_games: int) -> VectorFactory:
    """The vector factory of bridged game ``name`` (``lmgym/<name>-v0``)."""

    params = params_with_defaults(
        GameParams, f"{name}Params", num_games=num_games, invalid_penalty=INVALID_PENALTY[name]
    )

    def body(options: EnvOptions, params: GameParams) -> TokenVectorEnv:
        return build_game_env(
            options, GAMES[name], params, max_new_tokens=OPTIONS[name]["max_new_tokens"]
        )

    return named_task_factory(
        body,
        params,
        factory_name,
        f"``lmgym/{name}-v0``, ``{bridged}`` bridged, as a native vector env (the\n"
        f"parameters: ``GameParams``; the defaults: ``OPTIONS['{name}']``).",
        **OPTIONS[name],
    )


make_frozen_lake_vector = _game_factory(
    "FrozenLake", "FrozenLake-v1", "make_frozen_lake_vector", num_games=16
)
make_cliff_walking_vector = _game_factory(
    "CliffWalking", "CliffWalking-v1", "make_cliff_walking_vector", num_games=16
)
make_taxi_vector = _game_factory("Taxi", "Taxi-v4", "make_taxi_vector", num_games=256)
make_blackjack_vector = _game_factory(
    "Blackjack", "Blackjack-v1", "make_blackjack_vector", num_games=256
)

make_frozen_lake = single_env_factory(make_frozen_lake_vector)
make_cliff_walking = single_env_factory(make_cliff_walking_vector)
make_taxi = single_env_factory(make_taxi_vector)
make_blackjack = single_env_factory(make_blackjack_vector)
