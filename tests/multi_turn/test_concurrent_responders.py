"""Issue 39, item 1: concurrent responders (``async def respond`` or ``thread_safe =
True``) are called once per row, all rows at once, each call under
``responder_timeout``; a late call has the documented outcome; the step does not
depend on the calls' timing. Concurrency is shown with barriers (a call that waits
for every other row's call to be in flight), not with wall-clock measurements."""

from __future__ import annotations

import asyncio
import copy
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lmgym.envs.turn_calls import ResponderCaller, is_concurrent
from lmgym.envs.turns import (
    EpisodeStart,
    ResponderError,
    ResponderTimeout,
    TurnInput,
    TurnOutput,
)

EOS = 1
PROMPTS = ("ab", "xyz", "q", "rr")
WAIT = 10.0  # seconds a barrier waits before it reports the calls were not concurrent
TIMEOUT = 1.0  # responder_timeout in the timeout tests: ample for a call that answers at once


def answer(turns: TurnInput) -> TurnOutput:
    """Row ``r``'s answer: observation ``"+"``, reward ``r + turn/10``, state + 1."""
    assert len(turns.turn_texts) == 1, "a concurrent responder is called per row"
    row, turn = int(turns.rows[0]), int(turns.turn_index[0])
    return TurnOutput(["+"], [row + turn / 10], [turn >= 3], [turns.states[0] + 1])


@dataclass
class Gated:
    """A thread-safe responder whose calls block on ``gate(row)`` before answering."""

    gate: Any = None
    role: str = "user"
    thread_safe: bool = True
    name: str = "gated"
    calls: list[int] = field(default_factory=list)

    def start(self, episodes: EpisodeStart) -> list[int]:
        return [0] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        row = int(turns.rows[0])
        self.calls.append(row)
        if self.gate is not None:
            self.gate(row)
        return answer(turns)


@dataclass
class AsyncGated:
    """The ``async`` counterpart of ``Gated``; ``start`` is ``async`` too."""

    gate: Any = None
    role: str = "user"
    name: str = "async-gated"

    async def start(self, episodes: EpisodeStart) -> list[int]:
        await asyncio.sleep(0)
        return [0] * len(episodes.prompts)

    async def respond(self, turns: TurnInput) -> TurnOutput:
        if self.gate is not None:
            await self.gate(int(turns.rows[0]))
        return answer(turns)


def env_ending_a_turn_on_every_row(make_turn_env, ids, responder, **options):
    """A 4-row env after one policy token per row; the next step's EOS ends a turn on
    every row at once."""
    env = make_turn_env(
        PROMPTS, num_prompts=4, prompt_order="sequential", responder=responder, **options
    )
    env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]] * 4))
    return env


def test_declaring_concurrency():
    assert is_concurrent(Gated()) and is_concurrent(AsyncGated())
    assert not is_concurrent(Gated(thread_safe=False))


def test_thread_safe_calls_for_all_rows_are_in_flight_at_once(make_turn_env, ids):
    barrier = threading.Barrier(4)  # passes only when all four calls wait together
    env = env_ending_a_turn_on_every_row(
        make_turn_env, ids, Gated(gate=lambda row: barrier.wait(WAIT))
    )
    _, rewards, _, _, info = env.step(torch.tensor([EOS] * 4))
    assert rewards.tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1])  # in row order
    assert info["length"].tolist() == [3] * 4  # c <eos> +


def test_async_calls_for_all_rows_are_in_flight_at_once(make_turn_env, ids):
    arrived: list[int] = []
    everyone: dict[str, asyncio.Event] = {}

    async def gate(row: int) -> None:
        event = everyone.setdefault("event", asyncio.Event())
        arrived.append(row)
        if len(arrived) == 4:
            event.set()
        await asyncio.wait_for(event.wait(), WAIT)

    env = env_ending_a_turn_on_every_row(make_turn_env, ids, AsyncGated(gate=gate))
    _, rewards, _, _, _ = env.step(torch.tensor([EOS] * 4))
    assert sorted(arrived) == [0, 1, 2, 3]
    assert rewards.tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1])


def test_a_slow_row_does_not_stall_the_others(make_turn_env, ids):
    """Row 0 answers only once rows 1-3 have answered: had its call held the others
    up (a batched or sequential call), the step could not finish."""
    others_done = threading.Event()
    answered: list[int] = []

    def gate(row: int) -> None:
        if row == 0:
            assert others_done.wait(WAIT), "rows 1-3 never answered while row 0 waited"
        else:
            answered.append(row)
            if len(answered) == 3:
                others_done.set()

    env = env_ending_a_turn_on_every_row(make_turn_env, ids, Gated(gate=gate))
    _, rewards, terminated, truncated, _ = env.step(torch.tensor([EOS] * 4))
    assert rewards.tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1])
    assert not (terminated | truncated).any()


def blocked_on(release: threading.Event, rows: set[int]):
    """A gate under which ``rows`` wait until ``release`` is set; the others pass."""

    def gate(row: int) -> None:
        if row in rows:
            release.wait(60)

    return gate


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_late_call_ends_its_episode_with_the_tasks_penalty(make_turn_env, ids, kind):
    release = threading.Event()
    if kind == "thread":
        responder: Any = Gated(gate=blocked_on(release, {2}))
    else:

        async def gate(row: int) -> None:
            if row == 2:
                await asyncio.sleep(60)

        responder = AsyncGated(gate=gate)
    env = env_ending_a_turn_on_every_row(
        make_turn_env,
        ids,
        responder,
        responder_timeout=TIMEOUT,
        unfinished="penalty",
        unfinished_penalty=-2.5,
    )
    try:
        _, rewards, terminated, truncated, info = env.step(torch.tensor([EOS] * 4))
    finally:
        release.set()
    # Row 2: cut off (truncated, nothing written), its return exactly the penalty.
    assert truncated.tolist() == [False, False, True, False] and not terminated.any()
    assert rewards.tolist() == pytest.approx([0.1, 1.1, -2.5, 3.1])
    assert info["length"].tolist() == [3, 3, 2, 3]
    assert env._rows.returns.tolist() == pytest.approx([0.1, 1.1, -2.5, 3.1])
    assert env._turn_states == (1, 1, 0, 1)  # the late row keeps its old state


def test_a_late_call_under_raise_names_the_row_and_leaves_the_env_as_it_was(make_turn_env, ids):
    release = threading.Event()
    responder = Gated(gate=blocked_on(release, {1, 3}))
    env = env_ending_a_turn_on_every_row(
        make_turn_env, ids, responder, responder_timeout=TIMEOUT, on_responder_timeout="raise"
    )
    before = (env._rows, env._stream, env._turn_states)
    try:
        with pytest.raises(
            ResponderTimeout, match=r"env row\(s\) \[1, 3\] within responder_timeout=1.0 s"
        ):
            env.step(torch.tensor([EOS] * 4))
    finally:
        release.set()
    assert all(
        a is b for a, b in zip((env._rows, env._stream, env._turn_states), before, strict=True)
    )
    _, rewards, _, truncated, _ = env.step(torch.tensor([EOS] * 4))  # the retry answers
    assert rewards.tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1]) and not truncated.any()


def test_a_call_that_raises_names_its_row_and_leaves_the_env_as_it_was(make_turn_env, ids):
    def gate(row: int) -> None:
        if row == 2:
            raise RuntimeError("game server down")

    env = env_ending_a_turn_on_every_row(make_turn_env, ids, Gated(gate=gate))
    before = (env._rows, env._turn_states)
    with pytest.raises(ResponderError, match="raised RuntimeError: game server down .*env row 2"):
        env.step(torch.tensor([EOS] * 4))
    assert env._rows is before[0] and env._turn_states is before[1]  # nothing committed


def test_a_per_row_answer_of_the_wrong_size_names_the_row(make_turn_env, ids):
    @dataclass
    class TwoForOne(Gated):
        def respond(self, turns: TurnInput) -> TurnOutput:
            out = answer(turns)
            return TurnOutput(["+", "+"], out.rewards, out.done, out.states)

    env = env_ending_a_turn_on_every_row(make_turn_env, ids, TwoForOne())
    with pytest.raises(ResponderError, match="for env row 0 answered 2 observations for 1 rows"):
        env.step(torch.tensor([EOS] * 4))


def test_a_timeout_needs_a_concurrent_responder(make_turn_env, scripted):
    with pytest.raises(ValueError, match="responder_timeout=1.0: responder 'scripted' .*async def"):
        make_turn_env(responder=scripted(), responder_timeout=1.0)


@dataclass
class Jittery:
    """Answers from the row's state alone, after a random delay (unseeded: the calls
    finish in a different order every run)."""

    thread_safe: bool = True
    role: str = "user"

    def start(self, episodes: EpisodeStart) -> list[tuple[int, ...]]:
        return [(int(i),) for i in episodes.prompt_index]

    def respond(self, turns: TurnInput) -> TurnOutput:
        if self.thread_safe:
            time.sleep(random.random() * 0.01)
        observations, rewards, done, states = [], [], [], []
        for text, state, turn in zip(
            turns.turn_texts, turns.states, turns.turn_index.tolist(), strict=True
        ):
            observations.append(f"{len(text)}{state[0]}")
            rewards.append(len(text) * 0.5 + sum(state))
            done.append(turn >= 3 or len(text) > 4)
            states.append((*state, len(text)))
        return TurnOutput(observations, rewards, done, states)


def rollout(env, seed: int, steps: int) -> list[Any]:
    """Sample actions from a seeded generator (EOS often); everything the env says."""
    generator = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    seen = []
    for _ in range(steps):
        tokens = torch.randint(3, 8, (env.num_envs,), generator=generator)
        stop = torch.rand(env.num_envs, generator=generator) < 0.35
        obs, rewards, terminated, truncated, info = env.step(torch.where(stop, EOS, tokens))
        seen.append(
            (obs["input_ids"].clone(), rewards.clone(), terminated.clone(), truncated.clone())
        )
    return seen


def test_determinism_under_a_seed_whatever_order_the_calls_finish_in(make_turn_env):
    def build(thread_safe: bool):
        return make_turn_env(
            PROMPTS,
            num_prompts=4,
            group_size=2,
            autoreset=True,
            max_new_tokens=24,
            responder=Jittery(thread_safe=thread_safe),
        )

    first, second = rollout(build(True), 7, 30), rollout(build(True), 7, 30)
    batched = rollout(build(False), 7, 30)
    for a, b, c in zip(first, second, batched, strict=True):
        for x, y, z in zip(a, b, c, strict=True):
            assert torch.equal(x, y) and torch.equal(x, z)


def test_a_step_works_from_inside_a_running_event_loop(make_turn_env, ids):
    env = env_ending_a_turn_on_every_row(make_turn_env, ids, AsyncGated())

    async def main() -> Any:
        return env.step(torch.tensor([EOS] * 4))

    _, rewards, _, _, _ = asyncio.run(main())
    assert rewards.tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1])


def test_an_env_with_a_running_caller_copies(make_turn_env, ids):
    env = env_ending_a_turn_on_every_row(make_turn_env, ids, AsyncGated())
    env.step(torch.tensor([EOS] * 4))  # the caller's event loop runs now
    twin = copy.deepcopy(env)
    assert isinstance(twin._turns.caller, ResponderCaller) and twin._turns.caller._loop is None
    a, b = env.step(torch.tensor([5] * 4)), twin.step(torch.tensor([5] * 4))
    assert torch.equal(a[0]["input_ids"], b[0]["input_ids"])


def test_the_timeout_options_reach_a_registered_env_through_make_vec():
    import gymnasium as gym

    from lmgym.envs import register_responder_env

    env_id = register_responder_env("Issue39AsyncGated", AsyncGated(), ["a", "b"], max_turns=2)
    env = gym.make_vec(
        env_id, num_envs=2, responder_timeout=5, on_responder_timeout="raise", max_turn_tokens=6
    )
    assert env.options.responder_timeout == 5.0 and env.on_responder_timeout == "raise"
    assert env._turns.caller.timeout == 5.0 and env._turns.max_turn_tokens == 6
    env.reset(seed=0)
    _, rewards, _, _, _ = env.step(torch.tensor([EOS, EOS]))
    assert rewards.tolist() == pytest.approx([0.1, 1.1])
