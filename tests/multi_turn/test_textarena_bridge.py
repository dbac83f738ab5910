"""The TextArena bridge: three single-player games played through the env against the
live TextArena game (a scripted policy, whole episodes), each game's randomness its
own under its seed, copies replayed, both env checkers passing, and a clear error
where textarena is missing."""

from __future__ import annotations

import copy
import random
import re
import sys
import warnings

import gymnasium as gym
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from testkit import encode_turn, skip_module_unless_found, step_scripted_turns

from lmgym.envs import TASKS
from lmgym.envs.prompts import source_columns
from lmgym.envs.tasks import random_policy_return
from lmgym.envs.tasks.multi_turn.textarena_bridge import (
    TextArenaGame,
    TextArenaResponder,
    TextArenaState,
)
from lmgym.envs.tasks.multi_turn.textarena_games import (
    make_crosswords_vector,
    make_guess_the_number_vector,
    make_tower_of_hanoi_vector,
)
from lmgym.extras import require

# The bridge imports textarena when a game is made.
skip_module_unless_found("textarena")

IDS = ["lmgym/TextArena-GuessTheNumber-v0", "lmgym/TextArena-Crosswords-v0",
       "lmgym/TextArena-TowerOfHanoi-v0"]  # fmt: skip
HANOI = ["a c", "a b", "c b", "a c", "b a", "b c", "a c"]  # the 7-move solution


def play(env, scripts, seed: int = 0):
    """Reset ``env``, then ``drive`` it through ``scripts``."""
    env.reset(seed=seed)
    return drive(env, scripts)


def drive(env, scripts):
    """Step each row through its scripted turns until every episode is over (or its
    script is spent); ``(returns, terminated, truncated, obs)``."""
    return step_scripted_turns(env, scripts, sticky_done=True)


def test_the_three_games_are_registered_as_multi_turn_tasks():
    for env_id in IDS:
        assert env_id in TASKS and TASKS[env_id].requires == "textarena"
        assert TASKS[env_id].available()
        assert TASKS[env_id].description.startswith("multi-turn")


@pytest.mark.parametrize("env_id", IDS)
def test_random_policy_matches_the_listed_baseline(env_id):
    info = TASKS[env_id]
    env = gym.make_vec(env_id, num_envs=16, num_games=4)
    random_return = random_policy_return(env, num_batches=1)
    assert random_return < info.solved_threshold
    assert random_return == pytest.approx(info.random_baseline, abs=0.06)


def test_tower_of_hanoi_solved_through_the_env_against_the_live_game():
    env = make_tower_of_hanoi_vector(num_envs=3, group_size=1, autoreset=False, split="all")
    returns, terminated, truncated, obs = play(
        env,
        [HANOI, ["b c", *HANOI], ["a b", "a b", "a b"]],  # a bad move; 2 in a row
    )
    assert terminated.all() and not truncated.any()
    assert returns.tolist() == [1.0, 1.0, 0.0]


def test_the_responder_answers_with_the_games_own_words():
    responder = TextArenaResponder(TextArenaGame("TowerOfHanoi-v0"))
    reply = responder.reply("a c", TextArenaState(0))
    assert (
        reply.observation
        == "You moved disk 1 from A to C.\nCurrent Board: \nA: [3, 2]\nB: []\nC: [1]\n."
    )
    bad = responder.reply("b c", reply.state)
    assert bad.observation.startswith("You attempted an invalid move.")
    assert (bad.reward, bad.done) == (0.0, False)


def test_guess_the_number_by_bisection_hits_the_seeded_number():
    env = make_guess_the_number_vector(num_envs=4, group_size=1, autoreset=False, split="all")
    tok = env.tokenizer
    obs, _ = env.reset(seed=0)
    low, high = [1] * 4, [20] * 4  # guesses written with 2 digits: every turn 3 tokens
    guesses = [(lo + hi) // 2 for lo, hi in zip(low, high, strict=True)]
    returns = torch.zeros(4)
    done = torch.zeros(4, dtype=torch.bool)
    for _ in range(8):  # bisection of 1..20 takes at most 5 guesses
        streams = [encode_turn(tok, f"{g:02d}") for g in guesses]
        for position in range(3):
            actions = [s[position] for s in streams]
            obs, reward, terminated, truncated, _ = env.step(torch.tensor(actions))
            returns += reward
            done |= terminated | truncated
        if bool(done.all()):
            break
        for j in range(4):
            if done[j]:
                continue
            text = tok.decode(obs["input_ids"][j][obs["attention_mask"][j].bool()])
            hint = text.rsplit("he target number is ", 1)[-1]  # "T" reads as <unk>
            if hint.startswith("higher"):
                low[j] = guesses[j] + 1
            else:
                high[j] = guesses[j] - 1
            guesses[j] = (low[j] + high[j]) // 2
    assert done.all() and returns.tolist() == [1.0] * 4


def test_a_game_is_deterministic_under_its_seed_whatever_else_draws_from_random():
    responder = TextArenaResponder(TextArenaGame("GuessTheNumber-v0"))
    first = responder.reply("10", TextArenaState(3))
    random.seed(12345)  # other code drawing from the global RNG between moves
    random.random()
    second = responder.reply("5", first.state)
    again = responder.reply("5", responder.reply("10", TextArenaState(3)).state)
    assert (second.observation, second.reward) == (again.observation, again.reward)
    outer = random.getstate()
    responder.reply("7", TextArenaState(4))
    assert random.getstate() == outer  # the game's draws leave the caller's stream alone


def test_a_copied_state_is_replayed_from_its_seed_and_plays_on_the_same():
    responder = TextArenaResponder(TextArenaGame("GuessTheNumber-v0"))
    state = responder.reply("[10]", TextArenaState(7)).state
    copied = copy.deepcopy(state)  # no live game travels with a copy
    assert copied == state and copied.live is not None and copied.live.take() is None
    live, replayed = responder.reply("12", state), responder.reply("12", copied)
    assert (live.observation, live.reward, live.done) == (
        replayed.observation,
        replayed.reward,
        replayed.done,
    )


def test_crosswords_fills_its_word_from_the_solution():
    env = make_crosswords_vector(
        num_envs=1, group_size=1, autoreset=False, split="all", max_new_tokens=8192
    )  # a board a move: the default budget holds a few letters with the char tokenizer
    _, info = env.reset(seed=0)
    seed = source_columns(env.prompt_source)["seed"][int(info["prompt_index"][0])]
    game = env.responder.game.make()
    game.reset(seed)
    placed = game.env.state.game_state["placed_words"]
    ((word, (row, col, direction)),) = placed.items()
    moves = [
        f"{row + i * (direction == 'down')} {col + i * (direction == 'across')} {letter}"
        for i, letter in enumerate(word.lower())
    ]
    returns, terminated, _, _ = drive(env, [moves])
    assert terminated.all() and returns.tolist() == [1.0]


def test_a_prompt_is_the_games_first_observation():
    env = make_tower_of_hanoi_vector(num_envs=1, group_size=1, split="all")
    assert "tower of hanoi" in env.prompt_source[0].lower()
    assert re.search(r"A: \[3, 2, 1\]", env.prompt_source[0])


@pytest.mark.parametrize("env_id", IDS)
def test_both_checkers_pass(env_id):
    env = gym.make(env_id, num_games=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(env.unwrapped, skip_render_check=True)
        sb3_check_env(env.unwrapped, warn=True)
    assert [str(w.message) for w in caught] == []


def test_a_missing_extra_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # import fails as if missing
    with pytest.raises(ImportError, match=re.escape("pip install 'lmgym[textarena]'")):
        TextArenaGame("GuessTheNumber-v0").make()
    with pytest.raises(ImportError, match=re.escape("pip install 'lmgym[openenv]'")):
        require("textarena", "openenv", "the OpenEnv bridge")
