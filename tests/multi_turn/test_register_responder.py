"""register_responder_env: your own responder as a registered multi-turn env in about
ten lines, both Gymnasium faces, listed by ``lmgym tasks``, and trained by
``lmgym train --task your_module:Id``; the built-in multi-turn tasks are listed."""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass

import gymnasium as gym
import pytest
import torch

import lmgym  # noqa: F401  (registers the built-in tasks)
from lmgym.envs import FunctionReward
from lmgym.envs.registration import (
    TASKS,
    format_task_table,
    register_responder_env,
    responder_env_factory,
    vector_entry_point,
)
from lmgym.envs.turns import TurnOutput

MULTI_TURN = [
    "lmgym/GuessNumber-v0",
    "lmgym/Calculator-v0",
    "lmgym/FrozenLake-v0",
    "lmgym/CliffWalking-v0",
    "lmgym/Taxi-v0",
    "lmgym/Blackjack-v0",
    "lmgym/EchoTurn-v0",
]


@dataclass(frozen=True)
class Count:
    """Answers each turn with how many a's it had; reward 1 for a turn with one; the
    episode ends after ``turns`` turns. State: turns so far."""

    turns: int = 2
    role: str = "user"

    def start(self, episodes):
        return [0] * len(episodes.prompts)

    def respond(self, turns):
        texts = turns.turn_texts
        return TurnOutput(
            observations=[f"{t.count('a')} a\n" for t in texts],
            rewards=[float(t.count("a") == 1) for t in texts],
            done=[n + 1 >= self.turns for n in turns.states],
            states=[n + 1 for n in turns.states],
        )


@pytest.fixture
def forget():
    """Unregister the custom ids a test registers."""
    ids: list[str] = []
    yield ids
    for env_id in ids:
        gym.registry.pop(env_id, None)
        TASKS.pop(env_id, None)


def encode_turn(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def play(env, turns, seed=0):
    """Every row writes the same scripted turns; ``(returns, terminated, truncated, obs)``."""
    tok = env.tokenizer
    obs, _ = env.reset(seed=seed)
    returns = torch.zeros(env.num_envs)
    terminated = truncated = torch.zeros(env.num_envs, dtype=torch.bool)
    for token in [i for text in turns for i in encode_turn(tok, text)]:
        obs, reward, terminated, truncated, _ = env.step(torch.full((env.num_envs,), token))
        returns += reward
        if bool((terminated | truncated).all()):
            break
    return returns, terminated, truncated, obs


def test_your_responder_in_ten_lines_both_faces(forget):
    env_id = register_responder_env(
        "CountA", Count(), ["say a:", "say aa:"], max_new_tokens=32, solved_threshold=1.5
    )
    forget.append(env_id)
    assert env_id == "lmgym/CountA-v0"
    env = gym.make_vec(env_id, num_envs=4, group_size=2)
    returns, terminated, truncated, obs = play(env, ["a", "ba"])
    assert terminated.all() and not truncated.any()
    assert returns.tolist() == [2.0] * 4
    text = env.tokenizer.decode(obs["input_ids"][0][obs["attention_mask"][0].bool()])
    assert text.endswith("say a:a<eos>1 a<unk>ba<eos>")  # "\n" is <unk> to this tokenizer
    single = gym.make(env_id)
    single.reset(seed=0)
    info = TASKS[env_id]
    assert (info.solved_threshold, info.modes) == (1.5, ("bandit",))
    assert "lmgym/CountA-v0" in format_task_table()


def test_max_turns_is_a_default_a_make_call_overrides(forget):
    env_id = register_responder_env("CountB", Count(turns=5), ["say a:"], max_turns=2)
    forget.append(env_id)
    env = gym.make_vec(env_id, num_envs=1, group_size=1)
    assert env.max_turns == 2
    returns, terminated, truncated, _ = play(env, ["a", "a", "a"])
    assert truncated.all() and returns.tolist() == [2.0]
    assert gym.make_vec(env_id, num_envs=1, group_size=1, max_turns=4).max_turns == 4


def test_an_episode_reward_adds_to_the_turn_rewards(forget):
    def ends_with_b(prompts, completions):
        return [float(c.endswith("b")) for c in completions]

    env_id = register_responder_env(
        "CountC", Count(), ["say a:"], reward=FunctionReward(ends_with_b), max_new_tokens=32
    )
    forget.append(env_id)
    env = gym.make_vec(env_id, num_envs=2, group_size=2)
    returns, terminated, _, _ = play(env, ["a", "ab"])
    assert terminated.all()
    assert returns.tolist() == [3.0, 3.0]


def test_registering_again_replaces_and_a_full_id_is_kept(forget):
    first = register_responder_env("myns/Count-v3", Count(turns=1), ["a:"])
    forget.append(first)
    assert first == "myns/Count-v3"
    register_responder_env("myns/Count-v3", Count(turns=1), ["a:"], description="again")
    assert TASKS[first].description == "again"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: register_responder_env("GuessNumber", Count(), ["a:"]),
            ValueError,
            "name='GuessNumber': lmgym/GuessNumber-v0 is a built-in task; pick another name",
        ),
        (
            lambda: register_responder_env("X", lambda turns: None, ["a:"]),
            TypeError,
            "responder: expected a Responder (a role, start(EpisodeStart) and "
            "respond(TurnInput); lmgym.envs.turns), got function",
        ),
        (
            lambda: register_responder_env("X", Count(), "a:"),
            TypeError,
            "prompts: got a single string; pass a list of prompts, e.g. [prompt]",
        ),
        (
            lambda: register_responder_env("X", Count(), ["a:"], max_turn=3),
            TypeError,
            "register_responder_env: unknown env option(s) ['max_turn']",
        ),
        (
            lambda: register_responder_env("X", Count(), ["a:"], reward=lambda p, c: 1.0),
            TypeError,
            "looks like a plain function of text; wrap it",
        ),
    ],
)
def test_mistakes_are_named_at_registration(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert message in str(caught.value)
    assert "lmgym/X-v0" not in gym.registry


def test_the_factory_takes_every_env_option():
    factory = responder_env_factory(Count(), ["a:"], max_turns=3)
    env = factory(num_envs=2, group_size=1, max_new_tokens=12, autoreset=True)
    assert (env.max_turns, env.max_new_tokens, env.autoreset) == (3, 12, True)


@pytest.mark.parametrize("env_id", MULTI_TURN)
def test_builtin_multi_turn_tasks_are_listed_and_make(env_id):
    info = TASKS[env_id]
    assert info.modes == ("bandit",)
    assert info.solved_threshold is not None and info.random_baseline is not None
    assert info.description.startswith("multi-turn")
    assert info.reward_range[0] < info.reward_range[1]
    env = gym.make_vec(env_id, num_envs=2, group_size=2)
    obs, info_ = env.reset(seed=0)
    assert "policy_mask" in obs and env.max_turns is not None
    gym.make(env_id).reset(seed=0)


@pytest.mark.parametrize("env_id", MULTI_TURN)
def test_random_policy_is_below_the_solved_threshold_and_matches_the_table(env_id):
    """As tests/envs/test_tasks.py checks the single-turn tasks' baselines."""
    from lmgym.envs.tasks import random_policy_return

    info = TASKS[env_id]
    random_return = random_policy_return(gym.make_vec(env_id, num_envs=64), num_batches=2)
    assert random_return < info.solved_threshold
    scale = max(1.0, abs(info.random_baseline))
    assert random_return == pytest.approx(info.random_baseline, abs=0.06 * scale)


# ------------------------------------------------------------ lmgym train
USER_MODULE = """
from lmgym.envs.prompts import RecordPrompts
from lmgym.envs.registration import register_responder_env
from lmgym.envs.tasks.multi_turn.guess_number import GuessNumber, guess_number_records

games = RecordPrompts(guess_number_records(1, 4, num_games=8))
register_responder_env(
    "MyGuess", GuessNumber(1, 4, max_turns=3), games,
    max_turns=3, max_new_tokens=24, solved_threshold=0.7,
)
"""


@pytest.mark.heavy
def test_lmgym_train_runs_a_responder_task_from_your_module(tmp_path, monkeypatch):
    from lmgym.cli import main
    from lmgym.policy import save_tiny

    (tmp_path / "my_guess.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = save_tiny(tmp_path / "tiny")
    run = tmp_path / "run"
    try:
        args = ["train", "--task", "my_guess:MyGuess-v0", "--model", str(model)]
        args += ["--iterations", "2", "--num-prompts", "2", "--group-size", "4"]
        args += ["--no-progress", "--log-interval", "0", "--sample-every", "0"]
        args += ["--eval-prompts", "2", "--eval-samples", "2", "--run-dir", str(run)]
        assert main(args) == 0
        saved = json.loads((run / "config.json").read_text())
        assert saved["imports"]["modules"] == {"my_guess": "task"}
        assert vector_entry_point("lmgym/MyGuess-v0").__name__ == "make_responder_env_vector"
    finally:
        sys.modules.pop("my_guess", None)
        gym.registry.pop("lmgym/MyGuess-v0", None)
        TASKS.pop("lmgym/MyGuess-v0", None)
