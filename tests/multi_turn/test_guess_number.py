"""GuessNumber: the responder's answers and reward on hand-made turns, and whole
episodes through the env with a scripted policy (fixed token ids, no model)."""

from __future__ import annotations

import pytest
import torch
from testkit import step_scripted_turns

from lmgym.envs.tasks.multi_turn.guess_number import (
    GuessNumber,
    chat_game_prompt,
    first_integer,
    guess_number_records,
    make_guess_number_vector,
)
from lmgym.envs.turns import EpisodeStart, Responder, TurnInput


def turn_input(texts, states, turn_index=None, prompts=None, columns=None) -> TurnInput:
    k = len(texts)
    return TurnInput(
        rows=torch.arange(k),
        prompts=prompts or ["guess:"] * k,
        prompt_index=torch.zeros(k, dtype=torch.long),
        columns=columns or {},
        turn_texts=list(texts),
        turn_ids=[torch.tensor([1])] * k,
        turn_index=torch.tensor(turn_index or [1] * k),
        states=list(states),
    )


def start(responder, secrets):
    k = len(secrets)
    return responder.start(
        EpisodeStart(["guess:"] * k, torch.zeros(k, dtype=torch.long), {"secret": list(secrets)})
    )


# ------------------------------------------------------------------ protocol
def test_it_is_a_responder_speaking_as_the_user():
    assert isinstance(GuessNumber(), Responder)
    assert GuessNumber().role == "user"


def test_start_reads_each_episodes_secret_from_the_column():
    assert start(GuessNumber(1, 8), [3, 8, 1]) == [3, 8, 1]


def test_start_names_a_missing_column_and_a_bad_secret():
    responder = GuessNumber(1, 8)
    empty = EpisodeStart(["guess:"], torch.zeros(1, dtype=torch.long), {"answer": [3]})
    with pytest.raises(KeyError, match="no column 'secret' \\(columns: \\['answer'\\]\\)"):
        responder.start(empty)
    with pytest.raises(ValueError, match="row 1: secret 9 is outside \\[1, 8\\]"):
        start(responder, [3, 9])
    with pytest.raises(ValueError, match="row 0: secret '3' is not an integer"):
        start(responder, ["3"])


def test_higher_lower_and_a_right_guess_that_ends_the_episode():
    responder = GuessNumber(1, 8, max_turns=6)
    out = responder.respond(
        turn_input(["2", "i guess 7.", "5", "banana"], [5, 5, 5, 5], turn_index=[1, 2, 3, 2])
    )
    assert list(out.observations) == ["higher\n", "lower\n", None, "say a number\n"]
    assert list(out.done) == [False, False, True, False]
    assert list(out.rewards) == pytest.approx([0.0, 0.0, 1 - 2 / 6, 0.0])
    assert list(out.states) == [5, 5, 5, 5]


def test_reward_formula_counts_turns_against_max_turns():
    responder = GuessNumber(1, 8, max_turns=4)
    rewards = [responder.score(k) for k in (1, 2, 3, 4)]
    assert rewards == pytest.approx([1.0, 0.75, 0.5, 0.25])
    out = responder.respond(turn_input(["3"] * 4, [3] * 4, turn_index=[1, 2, 3, 4]))
    assert list(out.rewards) == pytest.approx(rewards)


def test_chat_prompts_get_the_observation_unframed():
    chat = [{"role": "user", "content": "guess"}]
    out = GuessNumber().respond(turn_input(["1", "1"], [4, 4], prompts=[chat, "guess:"]))
    assert list(out.observations) == ["higher", "higher\n"]


def test_given_states_are_not_mutated():
    states = (4, 6)
    out = GuessNumber().respond(turn_input(["1", "6"], states))
    assert states == (4, 6)
    assert out.states is not states


def test_first_integer():
    assert first_integer("is it 42 or 7?") == 42
    assert first_integer("-3") == -3
    assert first_integer("no idea") is None


@pytest.mark.parametrize(
    ("low", "high", "max_turns"), [(5, 4, 3), (1, 8, 0), (1, 8, 1.5), ("1", 8, 3)]
)
def test_bad_settings_are_refused(low, high, max_turns):
    with pytest.raises(ValueError, match="low|max_turns"):
        GuessNumber(low, high, max_turns=max_turns)


def test_records_are_seeded_and_in_range():
    a = guess_number_records(1, 8, num_games=50, data_seed=3)
    assert a == guess_number_records(1, 8, num_games=50, data_seed=3)
    assert a != guess_number_records(1, 8, num_games=50, data_seed=4)
    assert {r["secret"] for r in a} <= set(range(1, 9))
    assert len({r["prompt"] for r in a}) == 1  # the prompt never gives the secret away
    with pytest.raises(ValueError, match="num_games=1: must be an integer >= 2"):
        guess_number_records(num_games=1)


# ------------------------------------------------------------------ the env
def play(env, script, seed=0):
    """Reset ``env`` and step each row through the turns ``script(secrets)`` gives it
    until every row's episode is over or its script is spent; returns
    ``(returns, terminated, truncated, obs, scripts, secrets)``."""
    obs, info = env.reset(seed=seed)
    secrets = [env.prompt_table.columns["secret"][int(i)] for i in info["prompt_index"]]
    scripts = script(secrets)
    returns, terminated, truncated, obs = step_scripted_turns(env, scripts, obs)
    return returns, terminated, truncated, obs, scripts, secrets


def bisection(secret, low=1, high=8):
    guesses = []
    while True:
        guess = (low + high) // 2
        guesses.append(str(guess))
        if guess == secret:
            return guesses
        low, high = (guess + 1, high) if secret > guess else (low, guess - 1)


def test_bisection_solves_every_game_and_is_paid_by_its_turns():
    env = make_guess_number_vector(num_envs=8, group_size=1, autoreset=False, split="all")
    returns, terminated, truncated, obs, scripts, secrets = play(
        env, lambda secrets: [bisection(s) for s in secrets]
    )
    assert len(set(secrets)) > 3
    assert terminated.all() and not truncated.any()
    expected = [1 - (len(script) - 1) / 6 for script in scripts]
    assert returns.tolist() == pytest.approx(expected)
    for row, secret in enumerate(secrets):
        text = env.tokenizer.decode(obs["input_ids"][row][obs["attention_mask"][row].bool()])
        answers = ["higher" if secret > int(g) else "lower" for g in scripts[row][:-1]]
        completion = "".join(
            f"{g}<eos>{a}<unk>" for g, a in zip(scripts[row][:-1], answers, strict=True)
        )
        assert text.endswith(completion + f"{secret}<eos>"), text  # "\n" is <unk> here
        policy = obs["input_ids"][row][obs["policy_mask"][row].bool()]
        assert env.tokenizer.decode(policy) == "<eos>".join(scripts[row]) + "<eos>"


def test_a_policy_that_never_finds_it_is_truncated_at_max_turns_with_nothing():
    env = make_guess_number_vector(
        num_envs=4, group_size=1, autoreset=False, split="all", max_turns=3
    )
    returns, terminated, truncated, *_ = play(
        env,
        lambda secrets: [[str(9 - s)] * 5 for s in secrets],  # never the secret
    )
    assert truncated.all() and not terminated.any()
    assert returns.tolist() == [0.0] * 4


@pytest.mark.parametrize(("low", "high"), [(1, 8), (1, 2), (5, 5), (-3, 4), (1, 100)])
def test_the_chat_prompts_demonstrated_game_is_one_the_responder_would_play(low, high):
    messages = chat_game_prompt(low, high)
    guesses = [int(m["content"]) for m in messages[1::2]]
    said = [m["content"] for m in messages[2:-1:2]]  # the replies between the guesses
    secret = guesses[-1]
    assert low <= secret <= high and len(set(guesses)) == len(guesses)
    responder = GuessNumber(low, high)
    replies = [responder.reply(str(g), k + 1, secret) for k, g in enumerate(guesses)]
    assert [r.observation for r in replies[:-1]] == said and replies[-1].done
    assert messages[-1]["content"].startswith("Correct. New game.")
    assert [m["role"] for m in messages] == ["user", "assistant"] * len(guesses) + ["user"]
