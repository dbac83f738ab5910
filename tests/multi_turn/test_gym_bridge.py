"""The Gymnasium bridge: moves parsed, the game stepped by replay (functional state,
nothing shared between rows), invalid turns penalised and answered with the error;
and the four bridged games played through the env by a scripted policy."""

from __future__ import annotations

import copy
import pickle
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import numpy as np
import pytest
import torch
from testkit import step_scripted_turns

from lmgym.envs.tasks.multi_turn.games import (
    GAMES,
    make_blackjack_vector,
    make_cliff_walking_vector,
    make_frozen_lake_vector,
    make_taxi_vector,
    render_blackjack,
    render_taxi,
)
from lmgym.envs.tasks.multi_turn.gym_bridge import (
    GameState,
    GymResponder,
    TextGame,
    game_records,
)
from lmgym.envs.turns import EpisodeStart, Responder, TurnInput

LAKE = GAMES["FrozenLake"]


def turn_input(texts, states, prompts=None) -> TurnInput:
    k = len(texts)
    return TurnInput(
        rows=torch.arange(k),
        prompts=prompts or ["play:"] * k,
        prompt_index=torch.zeros(k, dtype=torch.long),
        columns={"seed": [s.seed for s in states]},
        turn_texts=list(texts),
        turn_ids=[torch.tensor([1])] * k,
        turn_index=torch.ones(k, dtype=torch.long),
        states=list(states),
    )


# ------------------------------------------------------------------ moves
@pytest.mark.parametrize(
    ("text", "action"),
    [("left", 0), ("Left.", 0), ("  DOWN  ", 1), ("2", 2), ("up!", 3), ("'right'", 2)],
)
def test_a_move_is_a_name_or_a_number(text, action):
    assert LAKE.parse(text) == action


def test_aliases_name_the_same_action():
    taxi, blackjack = GAMES["Taxi"], GAMES["Blackjack"]
    assert taxi.parse("south") == taxi.parse("down") == 0
    assert taxi.parse("dropoff") == 5
    assert blackjack.parse("stand") == blackjack.parse("stick") == 0


@pytest.mark.parametrize("text", ["jump", "left right", "4", "", "go left"])
def test_anything_else_is_refused_naming_the_moves(text):
    with pytest.raises(ValueError, match="write one of left, down, right, up, or 0-3$"):
        LAKE.parse(text)


def test_names_of_your_own_game_match_in_any_case():
    game = TextGame("CartPole-v1", (("Push-Left",), ("Push-Right",)), "cart", render_taxi)
    assert game.parse("push-right") == game.parse("PUSH-RIGHT.") == 1
    assert game.move_list() == "Push-Left, Push-Right, or 0-1"


def test_generic_game_uses_numbers_and_refuses_a_continuous_env():
    game = TextGame.generic("CartPole-v1")
    assert game.actions == (("0",), ("1",))
    assert game.move_list() == "0, 1"
    with pytest.raises(ValueError, match="needs a Discrete action space"):
        TextGame.generic("MountainCarContinuous-v0")


# ------------------------------------------------------------------ protocol
def test_it_is_a_responder_speaking_as_the_user():
    assert isinstance(GymResponder(LAKE), Responder)
    assert GymResponder(LAKE).role == "user"


def test_start_makes_fresh_states_from_the_seed_column():
    responder = GymResponder(GAMES["Blackjack"])
    episodes = EpisodeStart(["p", "p"], torch.zeros(2, dtype=torch.long), {"seed": [4, 9]})
    assert responder.start(episodes) == [GameState(4), GameState(9)]
    with pytest.raises(KeyError, match="no column 'seed'"):
        responder.start(EpisodeStart(["p"], torch.zeros(1, dtype=torch.long), {}))
    bad = EpisodeStart(["p"], torch.zeros(1, dtype=torch.long), {"seed": [1.5]})
    with pytest.raises(ValueError, match="row 0: seed 1.5 is not an integer"):
        responder.start(bad)


def test_a_move_steps_the_game_and_shows_the_map():
    out = GymResponder(LAKE).respond(turn_input(["right", "down"], [GameState(0)] * 2))
    assert list(out.observations) == ["sxff\nfhfh\nfffh\nhffg\n", "sfff\nxhfh\nfffh\nhffg\n"]
    assert list(out.rewards) == [0.0, 0.0]
    assert list(out.done) == [False, False]
    assert list(out.states) == [GameState(0, (2,)), GameState(0, (1,))]


def test_an_invalid_turn_costs_the_penalty_and_leaves_the_game_where_it_was():
    responder = GymResponder(LAKE, invalid_penalty=-0.25)
    state = GameState(0, (2,))
    out = responder.respond(turn_input(["fly"], [state]))
    assert list(out.observations) == [
        "unknown move: fly. write one of left, down, right, up, or 0-3\n"
    ]
    assert list(out.rewards) == [-0.25]
    assert list(out.done) == [False]
    assert out.states[0] == state


def test_the_goal_ends_the_episode_with_the_envs_reward_and_a_hole_with_none():
    responder = GymResponder(LAKE)
    near_goal = GameState(0, (2, 2, 1, 1, 1))  # right right down down down: next to g
    near_hole = GameState(0, (2,))  # (0, 1): the hole is below
    out = responder.respond(turn_input(["right", "down"], [near_goal, near_hole]))
    assert list(out.done) == [True, True]
    assert list(out.rewards) == [1.0, 0.0]
    assert list(out.observations) == [None, None]


def test_a_chat_prompt_gets_the_observation_unframed():
    chat = [{"role": "user", "content": "play"}]
    out = GymResponder(LAKE).respond(turn_input(["right"], [GameState(0)], prompts=[chat]))
    assert out.observations[0] == "sxff\nfhfh\nfffh\nhffg"


def direct(env_id: str, seed: int, actions, **kwargs):
    """Observations and rewards of the game played on its own fresh env."""
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=seed)
    seen = [(obs, 0.0, False)]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        seen.append((obs, float(reward), terminated or truncated))
    return env.unwrapped, seen


def test_interleaved_rows_replay_exactly_what_separate_envs_would_do():
    """Rows of different seeds, answered in one batch and in mixed order, each see
    their own game: the cached env carries nothing from one row to the next."""
    responder = GymResponder(GAMES["Taxi"])
    scripts = {3: [1, 1, 3, 0], 11: [0, 2, 2], 42: [3, 3, 1, 4]}
    states = {seed: GameState(seed) for seed in scripts}
    for turn in range(3):
        order = sorted(scripts, reverse=turn % 2 == 1)
        moves = [str(scripts[seed][turn]) for seed in order]
        out = responder.respond(turn_input(moves, [states[s] for s in order]))
        for seed, observation, reward, state in zip(
            order, out.observations, out.rewards, out.states, strict=True
        ):
            unwrapped, seen = direct("Taxi-v4", seed, scripts[seed][: turn + 1])
            obs, expected_reward, _ = seen[-1]
            assert observation == render_taxi(unwrapped, obs) + "\n"
            assert reward == expected_reward
            states[seed] = state
    assert states[3] == GameState(3, (1, 1, 3))


def test_states_are_values_a_failed_step_can_retry():
    """Answering the same input twice gives the same answer (the env may retry)."""
    responder = GymResponder(GAMES["Blackjack"])
    turns = turn_input(["hit", "stick", "hit"], [GameState(5), GameState(6, (1,)), GameState(7)])
    first, second = responder.respond(turns), responder.respond(turns)
    assert first == second
    assert turns.states == [GameState(5), GameState(6, (1,)), GameState(7)]


def test_a_copy_or_another_thread_plays_the_same_games():
    """Pickled, deep-copied or called from several threads at once, the responder
    answers exactly as it does alone (each thread replays on its own Gymnasium env)."""
    responder = GymResponder(GAMES["Taxi"])
    states = [GameState(seed, (1, 3, 0)[: seed % 4]) for seed in range(24)]
    turns = turn_input(["east"] * 24, states)
    alone = responder.respond(turns)
    assert pickle.loads(pickle.dumps(responder)).respond(turns) == alone
    assert copy.deepcopy(responder).respond(turns) == alone
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: responder.respond(turns), range(16)))
    assert all(answer == alone for answer in answers)


def test_numpy_integer_seeds_are_seeds():
    responder = GymResponder(LAKE)
    episodes = EpisodeStart(["p"], torch.zeros(1, dtype=torch.long), {"seed": [np.int64(3)]})
    assert responder.start(episodes) == [GameState(3)]
    assert type(responder.start(episodes)[0].seed) is int


def test_blackjack_text_matches_the_envs_draws():
    responder = GymResponder(GAMES["Blackjack"])
    unwrapped, seen = direct("Blackjack-v1", 8, [], sab=True, natural=False)
    assert responder.first_observation(8) == render_blackjack(unwrapped, seen[0][0])
    assert render_blackjack(None, (14, 1, 1)) == "your sum 14, dealer shows ace, usable ace: yes."


def test_records_hold_the_intro_and_first_observation_per_seed():
    records = game_records(GymResponder(GAMES["Taxi"]), 4)
    assert [r["seed"] for r in records] == [0, 1, 2, 3]
    for record in records:
        assert record["prompt"].startswith(GAMES["Taxi"].intro + "\n")
        first = GymResponder(GAMES["Taxi"]).first_observation(record["seed"])
        assert record["prompt"] == f"{GAMES['Taxi'].intro}\n{first}\n"
    with pytest.raises(ValueError, match="num_games=1: must be an integer >= 2"):
        game_records(GymResponder(LAKE), 1)


# ------------------------------------------------------------------ the env
def play(env, scripts, seed=0):
    """Reset ``env`` and step each row through its scripted turns until every row's
    episode is over or its script is spent; ``(returns, terminated, truncated, obs)``."""
    obs, _ = env.reset(seed=seed)
    return step_scripted_turns(env, scripts, obs)


def test_frozen_lake_through_the_env():
    env = make_frozen_lake_vector(num_envs=3, group_size=1, autoreset=False, split="all")
    path = ["right", "right", "down", "down", "down", "right"]
    returns, terminated, truncated, obs = play(
        env,
        [path, ["jump", *path], ["right", "down"]],  # the last falls into a hole
    )
    assert terminated.all() and not truncated.any()
    assert returns.tolist() == pytest.approx([1.0, 0.9, 0.0])
    text = env.tokenizer.decode(obs["input_ids"][1][obs["attention_mask"][1].bool()])
    # the character tokenizer reads "\n" as <unk>
    assert "jump<eos>unknown move: jump. write one of left, down, right, up, or 0-3<unk>" in text
    assert "right<eos>sxff<unk>fhfh<unk>fffh<unk>hffg<unk>right<eos>" in text


def test_cliff_walking_the_short_way_returns_minus_13():
    env = make_cliff_walking_vector(num_envs=2, group_size=1, autoreset=False, split="all")
    path = ["up"] + ["right"] * 11 + ["down"]
    returns, terminated, _, _ = play(env, [path, ["right", *path]])  # into the cliff first
    assert terminated.all()
    assert returns.tolist() == [-13.0, -113.0]


def test_taxi_and_blackjack_end_when_the_game_does():
    env = make_blackjack_vector(num_envs=4, group_size=1, autoreset=False, split="all")
    returns, terminated, truncated, _ = play(env, [["stick"]] * 4)
    assert terminated.all() and not truncated.any()
    assert set(returns.tolist()) <= {-1.0, 0.0, 1.0}
    env = make_taxi_vector(num_envs=2, group_size=1, autoreset=False, split="all", max_turns=3)
    returns, terminated, truncated, _ = play(env, [["dropoff"] * 3, ["nonsense"] * 3])
    assert truncated.all() and not terminated.any()
    assert returns.tolist() == [-20.0, -20.0]  # a cut-off episode returns unfinished_penalty


def test_a_frozen_lake_or_blackjack_episode_cut_off_returns_minus_one():
    """Without the cut-off penalty, a policy that never ends a turn scored 0 at the
    budget, above any unparseable move (-0.1): a tiny model learned exactly that."""
    babble = ["l" * 400]  # one turn longer than the whole budget
    lake = make_frozen_lake_vector(num_envs=3, group_size=1, autoreset=False, split="all")
    returns, terminated, truncated, _ = play(
        lake,
        [babble, ["jump"] * 10, ["right", "left"] * 5],  # budget, max_turns twice
    )
    assert truncated.all() and not terminated.any()
    assert returns.tolist() == [-1.0, -1.0, -1.0]
    blackjack = make_blackjack_vector(num_envs=2, group_size=1, autoreset=False, split="all")
    returns, _, truncated, _ = play(blackjack, [babble, ["jump"] * 5])
    assert truncated.all() and returns.tolist() == [-1.0, -1.0]
