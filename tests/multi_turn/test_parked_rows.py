"""Issue 39, item 1: in continuous mode (``autoreset=True``, ``responder_park_after``)
the rows waiting for their environment are parked while the others go on: ``step``
does not wait for a slow call, a parked row writes nothing and is idle for the
policy, its answer is appended on a later step; timeouts keep their documented
outcomes; and the batch under a seed does not depend on how long the calls took."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from testkit import eos_biased_policy

from lmgym.envs.turns import (
    EpisodeStart,
    ResponderError,
    ResponderTimeout,
    TurnInput,
    TurnOutput,
)
from lmgym.policy import CausalLMPolicy
from lmgym.policy.counter_rng import counter_uniforms, mix64
from lmgym.rollout import ContinuousCollector
from lmgym.types import RolloutBatch

EOS = 1
WAIT = 20.0  # seconds a gate waits before the test reports the others stalled
PROMPTS = ("ab", "xyz", "q", "rr")


def reply(turns: TurnInput) -> TurnOutput:
    """Row-independent answer from the turn alone: ``"+"`` and the turn's length,
    reward ``len(turn) + turn/10``, the episode ends after 2 turns."""
    text, turn = turns.turn_texts[0], int(turns.turn_index[0])
    return TurnOutput([f"+{len(text)}"], [len(text) + turn / 10], [turn >= 2], [turn])


@dataclass
class Gated:
    """A thread-safe responder whose call for a row waits on ``gate(row, turns)``."""

    gate: Any = None
    role: str = "user"
    thread_safe: bool = True
    name: str = "gated"
    ended: list[int] = field(default_factory=list)  # rows whose episode a call ended

    def start(self, episodes: EpisodeStart) -> list[int]:
        return [0] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        if self.gate is not None:
            self.gate(int(turns.rows[0]), turns)
        out = reply(turns)
        if out.done[0]:
            self.ended.append(int(turns.rows[0]))
        return out


@dataclass
class AsyncSlow:
    """The ``async`` responder: row ``slow`` sleeps ``seconds`` per call."""

    slow: int = 2
    seconds: float = 60.0
    role: str = "user"
    name: str = "async-slow"

    def start(self, episodes: EpisodeStart) -> list[int]:
        return [0] * len(episodes.prompts)

    async def respond(self, turns: TurnInput) -> TurnOutput:
        if int(turns.rows[0]) == self.slow:
            await asyncio.sleep(self.seconds)
        return reply(turns)


def parked_env(make_turn_env, responder, **options):
    options.setdefault("responder_park_after", 0.0)
    return make_turn_env(
        PROMPTS,
        num_prompts=4,
        prompt_order="sequential",
        autoreset=True,
        max_new_tokens=24,
        responder=responder,
        **options,
    )


def script(ids, steps: int) -> list[torch.Tensor]:
    """Every row: one letter, then the stop id, over and over."""
    letter = ids("c")[0]
    return [torch.tensor([EOS if t % 2 else letter] * 4) for t in range(steps)]


# ------------------------------------------------------------------ the env
def test_a_slow_call_does_not_stall_the_other_rows(make_turn_env, ids):
    """Row 0's first call answers only once rows 1-3 have ended three episodes each:
    a step that waited for it could never get there."""
    others_done = threading.Event()
    responder = Gated()

    def gate(row: int, turns: TurnInput) -> None:
        if row == 0 and int(turns.turn_index[0]) == 1:
            assert others_done.wait(WAIT), "the other rows stalled while row 0 waited"

    responder.gate = gate
    env = parked_env(make_turn_env, responder)
    env.reset(seed=0)
    waited, lengths = [], []
    for actions in script(ids, 200):
        _, _, terminated, truncated, info = env.step(actions)
        waited.append(bool(info["waiting"][0]))
        lengths.append(int(info["length"][0]))
        if sum(r != 0 for r in responder.ended) >= 9:
            others_done.set()
        if 0 in responder.ended:
            break
    assert 0 in responder.ended, "row 0 never finished its episode"
    assert sum(r != 0 for r in responder.ended) >= 9
    first = waited.index(True)
    run = waited[first:].index(False)  # the steps row 0 waited for its first answer
    assert run >= 10
    # While parked, row 0 wrote nothing (its actions were ignored); then it went on.
    assert set(lengths[first : first + run]) == {2} and lengths[first + run] > 2


def test_a_parked_rows_answer_is_appended_later_with_its_turn_reward(make_turn_env, ids):
    release = threading.Event()
    env = parked_env(
        make_turn_env,
        Gated(gate=lambda row, t: row == 1 and release.wait(WAIT)),
        responder_park_after=0.5,  # ample for the fast calls: they answer in this step
    )
    env.reset(seed=0)
    steps = script(ids, 8)
    env.step(steps[0])
    start = time.monotonic()
    _, rewards, _, _, info = env.step(steps[1])  # every row ends turn 1
    assert time.monotonic() - start < WAIT / 2  # the step went on without row 1
    assert info["waiting"].tolist() == [False, True, False, False]
    assert rewards.tolist() == pytest.approx([1.1, 0.0, 1.1, 1.1])  # "c<eos>": 1 char
    assert info["length"].tolist() == [4, 2, 4, 4]  # c <eos> + 1
    for actions in steps[2:4]:
        _, rewards, _, _, info = env.step(actions)
        assert info["length"][1] == 2 and rewards[1] == 0.0
    release.set()
    time.sleep(0.2)
    _, rewards, _, _, info = env.step(steps[4])
    assert not info["waiting"].any()
    assert rewards[1] == pytest.approx(1.1)  # the turn's reward, on the step it answers
    assert info["length"][1] == 4 and info["turn"][1] == 1
    assert env._rows.policy[1].sum() == 2  # only c and <eos> are the policy's


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_late_parked_call_ends_its_episode_with_the_tasks_penalty(make_turn_env, ids, kind):
    release = threading.Event()
    if kind == "thread":
        responder: Any = Gated(gate=lambda row, t: row == 2 and release.wait(60))
    else:
        responder = AsyncSlow(slow=2)
    env = parked_env(
        make_turn_env,
        responder,
        responder_timeout=0.5,
        unfinished="penalty",
        unfinished_penalty=-2.5,
    )
    env.reset(seed=0)
    ended_at, others = None, 0
    try:
        start = time.monotonic()
        for t, actions in enumerate(script(ids, 400)):
            _, rewards, terminated, truncated, info = env.step(actions)
            others += int((terminated | truncated)[[0, 1, 3]].sum())
            if truncated[2]:
                ended_at = t
                break
            time.sleep(0.005)
    finally:
        release.set()
    assert ended_at is not None and time.monotonic() - start >= 0.5
    assert not terminated[2] and rewards[2] == pytest.approx(-2.5 - 1.1 * 0)  # no turn reward
    assert env._rows.returns[2] == pytest.approx(-2.5)  # the episode's return: the penalty
    assert others >= 3  # the other rows ended episodes meanwhile


def test_a_late_parked_call_under_raise_names_the_row_until_it_is_reset(make_turn_env, ids):
    release = threading.Event()
    env = parked_env(
        make_turn_env,
        Gated(gate=lambda row, t: row == 3 and release.wait(60)),
        responder_timeout=0.3,
        on_responder_timeout="raise",
    )
    env.reset(seed=0)
    steps = iter(script(ids, 1000))
    try:
        with pytest.raises(ResponderTimeout, match=r"env row\(s\) \[3\] within responder_timeout"):
            for actions in steps:
                env.step(actions)
                time.sleep(0.01)
        before = (env._rows, env._stream, env._turn_states, env._calls)
        with pytest.raises(ResponderTimeout, match=r"\[3\]"):  # the env is as it was: again
            env.step(next(steps))
        assert all(
            a is b
            for a, b in zip(
                before, (env._rows, env._stream, env._turn_states, env._calls), strict=True
            )
        )
        env.reset(options={"reset_mask": torch.tensor([False, False, False, True])})
        assert 3 not in env._calls and not env._rows.waiting[3]
    finally:
        release.set()
    env.step(next(steps))  # row 3 starts over; the run goes on


def test_a_parked_call_that_raises_names_its_row(make_turn_env, ids):
    def gate(row: int, turns: TurnInput) -> None:
        if row == 1:
            time.sleep(0.1)
            raise RuntimeError("game server down")

    env = parked_env(make_turn_env, Gated(gate=gate))
    env.reset(seed=0)
    with pytest.raises(ResponderError, match="game server down .*env row 1"):
        for actions in script(ids, 200):
            env.step(actions)
            time.sleep(0.01)


def test_parking_needs_autoreset_and_a_concurrent_responder(make_turn_env, scripted):
    with pytest.raises(ValueError, match="responder_park_after=0.0: an episode-synchronous"):
        make_turn_env(responder=Gated(), responder_park_after=0.0)
    with pytest.raises(ValueError, match="responder 'scripted' is called once per step"):
        make_turn_env(responder=scripted(), autoreset=True, responder_park_after=0.0)
    with pytest.raises(ValueError, match="responder_park_after=-1"):
        make_turn_env(responder=Gated(), autoreset=True, responder_park_after=-1)


def test_when_every_row_would_be_parked_the_step_waits_for_an_answer(make_turn_env, ids):
    env = make_turn_env(
        ["ab"],
        autoreset=True,
        responder=Gated(gate=lambda row, t: time.sleep(0.2)),
        responder_park_after=0.0,
    )
    env.reset(seed=0)
    env.step(torch.tensor(ids("c")))
    start = time.monotonic()
    _, rewards, _, _, info = env.step(torch.tensor([EOS]))
    assert time.monotonic() - start >= 0.2  # no row could act: the step waited
    assert not info["waiting"].any() and rewards.tolist() == pytest.approx([1.1])


def test_sb3_refuses_an_env_that_parks(make_turn_env):
    from lmgym.integrations.sb3 import SB3VecEnv

    env = make_turn_env(responder=Gated(), autoreset=True, responder_park_after=0.0)
    with pytest.raises(ValueError, match="responder_park_after=0.0 parks rows"):
        SB3VecEnv(env)


def test_without_parking_the_env_reports_no_waiting_rows(make_turn_env):
    env = make_turn_env(responder=Gated(), autoreset=True)
    _, info = env.reset(seed=0)
    assert "waiting" not in info and "episode" not in info


# ------------------------------------------------------------ the collector
def eos_policy(tokenizer, seed: int = 3) -> CausalLMPolicy:
    """A tiny GPT-2 whose head favours EOS, so turns end after a few tokens."""
    return eos_biased_policy(tokenizer, 2.0, seed=seed)


def logprob_gap(policy: CausalLMPolicy, batch: RolloutBatch) -> float:
    """Largest |sampler - teacher-forced| log-prob over the batch's policy tokens."""
    ids, attn = batch.input_ids()
    with torch.no_grad():
        teacher, _ = policy.logprobs(ids, attn, batch.max_new_tokens)
    return float((batch.sampler_logprobs - teacher).abs()[batch.policy_mask].max())


@dataclass
class Latency:
    """A thread-safe responder that sleeps ``delay(row, turn)`` seconds, then answers
    from the turn alone (``reply``)."""

    delay: Any
    role: str = "user"
    thread_safe: bool = True

    def start(self, episodes: EpisodeStart) -> list[int]:
        return [0] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        time.sleep(self.delay(int(turns.rows[0]), int(turns.turn_index[0])))
        return reply(turns)


class Watch:
    """Wraps ``policy.act``: every call's idle mask and the env's info before it."""

    def __init__(self, policy: CausalLMPolicy, monkeypatch, env) -> None:
        self.idle: list[torch.Tensor] = []
        self.waiting: list[torch.Tensor] = []
        act = policy.act

        def watched(*args: Any, **kwargs: Any):
            self.idle.append(kwargs["idle"].clone())
            self.waiting.append(env._rows.waiting.clone())
            return act(*args, **kwargs)

        monkeypatch.setattr(policy, "act", watched)

    def parked_steps(self) -> int:
        return int(sum(int(w.sum()) for w in self.waiting))


def parked_rollout(tokenizer, delay, seed: int, calls: int = 2, monkeypatch=None):
    policy = eos_policy(tokenizer)
    env = parked_env_for_model(tokenizer, Latency(delay))
    watch = Watch(policy, monkeypatch, env) if monkeypatch is not None else None
    collector = ContinuousCollector(env, policy, seed=seed)
    batches = [collector.collect(num_groups=2) for _ in range(calls)]
    return policy, batches, watch, collector


def parked_env_for_model(tokenizer, responder):
    from lmgym.envs import TokenVectorEnv

    return TokenVectorEnv(
        tokenizer,
        ["ab", "hello", "xyz", "q"],
        None,
        responder=responder,
        num_prompts=2,
        group_size=2,
        autoreset=True,
        max_new_tokens=24,
        responder_park_after=0.0,
    )


def test_parked_rows_are_idle_and_carry_no_policy_tokens(tokenizer, monkeypatch):
    policy, batches, watch, collector = parked_rollout(
        tokenizer, lambda row, turn: 0.05 if row == 0 else 0.0, 0, monkeypatch=monkeypatch
    )
    assert watch.parked_steps() >= 5  # rows were parked, several steps each
    for idle, waiting in zip(watch.idle, watch.waiting, strict=True):
        assert bool((idle >= waiting).all())  # every parked row was idle for the policy
    live_steps = sum(int((~idle).sum()) for idle in watch.idle)
    assert collector.tokens_generated == live_steps
    for batch in batches:
        # Each policy token was sampled at a live step: the parked steps' draws were
        # dropped, so the policy's tokens are a prefix-free run per turn, and only
        # they carry a log-prob (the loss's mask, RolloutBatch.policy_mask).
        env_tokens = batch.completion_mask & ~batch.policy_mask
        assert env_tokens.any()
        assert not batch.sampler_logprobs[env_tokens].any()
        assert not batch.rewards[env_tokens].any()
        # A turn's reward sits on its stop id even when the answer came later.
        assert torch.equal(batch.rewards != 0, batch.completion_ids.eq(EOS) & batch.policy_mask)


def test_a_parked_rows_logprobs_equal_teacher_forcing(tokenizer, monkeypatch):
    policy, batches, watch, _ = parked_rollout(
        tokenizer, lambda row, turn: 0.03 if row % 2 == 0 else 0.0, 1, 3, monkeypatch
    )
    assert watch.parked_steps() >= 5
    for batch in batches:
        assert logprob_gap(policy, batch) < 1e-4


def test_the_batch_under_a_seed_does_not_depend_on_the_calls_timing(tokenizer, monkeypatch):
    slow_even = parked_rollout(
        tokenizer, lambda row, turn: 0.04 if row % 2 == 0 else 0.0, 5, 3, monkeypatch
    )
    slow_odd = parked_rollout(
        tokenizer, lambda row, turn: 0.02 * turn if row % 2 else 0.0, 5, 3, monkeypatch
    )
    instant = parked_rollout(tokenizer, lambda row, turn: 0.0, 5, 3, monkeypatch)
    traces = [torch.stack(run[2].waiting) for run in (slow_even, slow_odd)]
    assert min(run[2].parked_steps() for run in (slow_even, slow_odd)) >= 5
    assert traces[0].shape != traces[1].shape or not torch.equal(*traces)  # parked unlike
    for a, b, c in zip(slow_even[1], slow_odd[1], instant[1], strict=True):
        for name in (
            "completion_ids",
            "completion_mask",
            "policy_mask",
            "rewards",
            "group_ids",
        ):
            x, y, z = getattr(a, name), getattr(b, name), getattr(c, name)
            assert torch.equal(x, y) and torch.equal(x, z), name
        # Equal to float rounding: a row's logits come from a batched step whose shape
        # (the rows and appended tokens beside it, the attention width) follows the
        # timing, and a CPU matmul's last bit may follow the shape.
        for other in (b, c):
            gap = (a.sampler_logprobs - other.sampler_logprobs).abs().max()
            assert float(gap) < 1e-5, float(gap)


def test_a_seed_still_matters_when_parking(tokenizer):
    (_, first, _, _), (_, second, _, _) = (
        parked_rollout(tokenizer, lambda row, turn: 0.0, seed, 1) for seed in (0, 1)
    )
    assert not torch.equal(first[0].completion_ids, second[0].completion_ids)


def test_counter_uniforms_are_splitmix64_and_uniform():
    mask = (1 << 64) - 1

    def reference(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    values = [0, 1, 12345, -1, -(2**63), 2**62]
    got = mix64(torch.tensor(values, dtype=torch.long)).tolist()
    assert [g & mask for g in got] == [reference(v & mask) for v in values]
    u = counter_uniforms(7, torch.arange(20000) // 20, torch.arange(20000) % 20)
    assert u.dtype == torch.float64 and float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and len(torch.unique(u)) == 20000
    again = counter_uniforms(7, torch.tensor([3]), torch.tensor([5]))
    assert float(again) == float(u[3 * 20 + 5])  # a function of its keys alone
