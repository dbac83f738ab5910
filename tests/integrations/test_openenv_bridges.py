"""The OpenEnv bridges, against live local servers (openenv-core's ``create_app``
served by uvicorn on 127.0.0.1): an OpenEnv environment played as an lmgym
multi-turn task, rows concurrently; an lmgym task served as an OpenEnv environment
and played by an OpenEnv client; and the two chained."""

from __future__ import annotations

import asyncio
import functools
import importlib
import random
import re
import sys
import time

import gymnasium as gym
import pytest
import torch
from testkit import ROOT, import_script, skip_module_unless_found

from lmgym.envs import TASKS, register_responder_env
from lmgym.envs.prompts import source_columns
from lmgym.envs.turns import TurnInput, TurnOutput
from lmgym.integrations.openenv_local import LocalServer  # no openenv import of its own

# openenv.core pulls in gradio and MCP (seconds of every collection, on every xdist
# worker): it and the lmgym.integrations.openenv_* modules built on it are imported in
# the fixtures and tests that use them.
skip_module_unless_found("openenv.core")

LAKE_PATH = ["right", "right", "down", "down", "down", "right"]


# ------------------------------------------------------------ a server of our own
@functools.cache
def example():
    """The example's server: guess a digit 1-9 drawn from the seed, told higher/lower,
    each step taking STEP_SECONDS (a slow server); imported once."""
    return import_script(ROOT / "examples" / "openenv_client.py", "openenv_client_example_server")


def secret(seed: int) -> int:
    return random.Random(seed).randint(1, 9)


@pytest.fixture(scope="module")
def guess_server():
    from openenv.core.env_server.http_server import create_app

    server = example()
    app = create_app(
        server.GuessDigit, server.GuessAction, server.GuessObservation, max_concurrent_envs=32
    )
    with LocalServer(app) as url:
        yield url


@pytest.fixture(scope="module")
def lake_server():
    from lmgym.integrations.openenv_server import create_lmgym_app

    with LocalServer(create_lmgym_app("lmgym/FrozenLake-v0", split="all")) as url:
        yield url


def encode_turn(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


# ------------------------------------------------------ (b) OpenEnv -> lmgym task
def test_an_openenv_server_plays_as_a_multi_turn_task_rows_concurrently(guess_server):
    from lmgym.integrations.openenv_client import openenv_env

    DELAY = example().STEP_SECONDS  # seconds each server step takes
    env = openenv_env(
        guess_server, seeds=[0, 1, 2, 3], num_envs=4, group_size=1, autoreset=False,
        max_new_tokens=200, max_turns=9,
    )  # fmt: skip
    tok = env.tokenizer
    _, info = env.reset(seed=0)
    seeds = [source_columns(env.prompt_source)["seed"][i] for i in info["prompt_index"].tolist()]
    assert [env.prompt_source[i] for i in info["prompt_index"].tolist()] == [
        f"game {s}: guess my digit, 1-9.\n" for s in seeds
    ]
    returns = torch.zeros(4)
    done = torch.zeros(4, dtype=torch.bool)
    turn_seconds = []
    for digit in range(1, 10):  # every row guesses 1, 2, 3, ... until right
        for token in encode_turn(tok, str(digit)):
            began = time.monotonic()
            obs, reward, terminated, truncated, _ = env.step(torch.tensor([token] * 4))
            if token == tok.eos_token_id and not bool(done.all()):
                turn_seconds.append(time.monotonic() - began)
            returns += reward
            done |= terminated | truncated
        if bool(done.all()):
            break
    assert done.all() and not truncated.any()
    expected = [1.0 - 0.1 * (secret(s) - 1) for s in seeds]
    assert returns.tolist() == pytest.approx(expected)
    # the first turn's four server steps run at once: about one DELAY, not four
    assert turn_seconds[0] < 2.5 * DELAY, turn_seconds
    row = max(range(4), key=lambda j: secret(seeds[j]))
    if secret(seeds[row]) > 1:
        text = tok.decode(obs["input_ids"][row][obs["attention_mask"][row].bool()])
        assert "1<eos>higher." in text


def test_a_copied_state_replays_its_session_from_the_seed(guess_server):
    from lmgym.integrations.openenv_client import OpenEnvState, openenv_env

    env = openenv_env(guess_server, seeds=[5, 6], num_envs=2, group_size=1, max_new_tokens=64)
    responder = env.responder

    async def play() -> tuple[float, bool]:
        def turn(state, text):
            return TurnInput(
                rows=torch.tensor([0]), prompts=["p"], prompt_index=torch.tensor([0]),
                columns={"seed": [state.seed]}, turn_texts=[text],
                turn_ids=[torch.tensor([1])], turn_index=torch.tensor([1]), states=[state],
            )  # fmt: skip

        answer = await responder.respond(turn(OpenEnvState(5), "9"))  # replayed: no session
        (state,) = answer.states
        answer = await responder.respond(turn(OpenEnvState(5, state.actions), str(secret(5))))
        return answer.rewards[0], answer.done[0]

    assert asyncio.run(play()) == (1.0, True)


def unseeded_environment() -> type:
    """The example's server, but its first observation ignores the seed: a new one every
    reset."""
    GuessObservation = example().GuessObservation

    class Unseeded(example().GuessDigit):
        resets = 0

        def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
            super().reset(seed, episode_id)
            Unseeded.resets += 1
            return GuessObservation(text=f"game number {Unseeded.resets}.", reward=0.0)

    return Unseeded


def test_a_server_not_deterministic_under_its_seed_is_refused_naming_the_seed():
    from openenv.core.env_server.http_server import create_app

    from lmgym.integrations.openenv_client import openenv_env

    server = example()
    app = create_app(
        unseeded_environment(), server.GuessAction, server.GuessObservation, max_concurrent_envs=8
    )
    with LocalServer(app) as url:
        env = openenv_env(url, seeds=[4, 5], num_envs=2, group_size=1, max_new_tokens=32)
        with pytest.raises(ValueError, match=r"reset\(seed=\d\) shows another first observation"):
            env.reset(seed=0)


# ---------------------------------------------------- (c) lmgym task -> OpenEnv
def test_an_openenv_client_plays_an_lmgym_task_to_the_goal(lake_server):
    from lmgym.integrations.openenv_models import LmgymAction, LmgymEnvClient

    async def play():
        async with LmgymEnvClient(base_url=lake_server) as env:
            first = await env.reset(seed=0)
            bad = await env.step(LmgymAction(message="jump"))
            results = [await env.step(LmgymAction(message=m)) for m in LAKE_PATH]
            state = await env.state()
        return first, bad, results, state

    first, bad, results, state = asyncio.run(play())
    assert first.observation.text.startswith("frozen lake:") and not first.done
    assert bad.reward == pytest.approx(-0.1) and "unknown move: jump" in bad.observation.text
    assert [r.reward for r in results] == [0.0] * 5 + [1.0]
    assert [r.done for r in results] == [False] * 5 + [True]
    assert state.step_count == 7 and state.task == "lmgym/FrozenLake-v0"


def test_the_served_task_cuts_an_episode_at_its_max_turns(lake_server):
    from lmgym.integrations.openenv_models import LmgymAction, LmgymEnvClient

    async def play():
        async with LmgymEnvClient(base_url=lake_server) as env:
            await env.reset(seed=1)
            return [await env.step(LmgymAction(message="left")) for _ in range(10)]

    results = asyncio.run(play())
    assert [r.done for r in results] == [False] * 9 + [True]  # FrozenLake: max_turns 10
    assert results[-1].observation.truncated


def test_an_lmgym_task_through_openenv_and_back_is_the_same_game(lake_server):
    """The FrozenLake served over OpenEnv, played as an lmgym task over the client."""
    from lmgym.integrations.openenv_client import openenv_env

    env = openenv_env(
        lake_server, seeds=[0, 1], num_envs=2, group_size=1, autoreset=False,
        max_new_tokens=320, max_turns=10,
    )  # fmt: skip
    tok = env.tokenizer
    env.reset(seed=0)
    assert env.prompt_source[0].startswith("frozen lake:")
    streams = [[i for m in path for i in encode_turn(tok, m)] for path in (LAKE_PATH, ["up"] * 2)]
    returns = torch.zeros(2)
    for position in range(max(map(len, streams))):
        actions = [s[position] if position < len(s) else tok.eos_token_id for s in streams]
        _, reward, terminated, truncated, _ = env.step(torch.tensor(actions))
        returns += reward
        if bool((terminated | truncated)[0]):
            break
    assert returns[0].item() == 1.0 and bool(terminated[0])


class AsyncCount:
    """An async responder: says the turn count back, ends after three turns; each
    call checks it runs on the loop its episode started on."""

    role = "user"

    async def start(self, episodes):
        loop = asyncio.get_running_loop()
        return [(0, loop)] * len(episodes.prompts)

    async def respond(self, turns):
        (n, loop), text = turns.states[0], turns.turn_texts[0]
        assert asyncio.get_running_loop() is loop, "the session changed event loops"
        return TurnOutput([f"{n + 1}: {text}"], [float(n + 1)], [n + 1 >= 3], [(n + 1, loop)])


def test_an_async_responder_task_is_served_on_one_loop_per_session():
    from lmgym.integrations.openenv_models import LmgymAction, LmgymEnvClient
    from lmgym.integrations.openenv_server import create_lmgym_app

    env_id = register_responder_env("OpenEnvAsyncCount", AsyncCount(), ["count:"])
    try:
        app = create_lmgym_app(env_id)
        with LocalServer(app) as url:

            async def play():
                async with LmgymEnvClient(base_url=url) as env:
                    await env.reset(seed=0)
                    return [await env.step(LmgymAction(message=m)) for m in "abc"]

            results = asyncio.run(play())
    finally:
        gym.registry.pop(env_id, None)
        TASKS.pop(env_id, None)
    assert [r.observation.text for r in results] == ["1: a", "2: b", ""]
    assert [r.reward for r in results] == [1.0, 2.0, 3.0] and results[-1].done


# ------------------------------------------------------------- missing extra
def test_a_missing_openenv_names_the_pip_install(monkeypatch):
    for name in ("openenv", "openenv.core"):
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith("lmgym.integrations.openenv_")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=re.escape("pip install 'lmgym[openenv]'")):
        importlib.import_module("lmgym.integrations.openenv_client")
