"""learn's callback protocol (agents/callbacks.LearnCallbacks) and Agent.learn through it."""

from __future__ import annotations

import pytest

from lmgym.agents import GRPO
from lmgym.agents.callbacks import LearnCallbacks


class FakeAgent:
    name = "fake"


class Recorder:
    """A callback object that writes every call into a shared log."""

    def __init__(self, log: list, name: str, stop_at: int | None = None) -> None:
        self.log, self.name, self.stop_at = log, name, stop_at

    def on_learn_start(self, agent) -> None:
        self.log.append((self.name, "start"))

    def __call__(self, agent, metrics: dict[str, float]) -> bool | None:
        self.log.append((self.name, metrics["i"]))
        return False if metrics["i"] == self.stop_at else None

    def on_learn_end(self, agent, history: list[dict[str, float]]) -> None:
        self.log.append((self.name, "end", [m["i"] for m in history]))


def run(callbacks: LearnCallbacks, iterations: int, fail_at: int | None = None) -> None:
    """The loop of Agent.learn; iteration i's metrics are {"i": i} and what the bar shows."""
    with callbacks:
        for i in range(iterations):
            if i == fail_at:
                raise RuntimeError("boom")
            if not callbacks.after({"i": i, "reward_mean": 0.5, "completion_length": 3.0}):
                break


def test_an_early_stop_lets_every_callback_see_the_iteration_then_ends_learning():
    log: list = []
    callbacks = LearnCallbacks(
        FakeAgent(), [Recorder(log, "a", stop_at=1), Recorder(log, "b")], 5, False
    )
    run(callbacks, 5)
    assert log == [
        ("a", "start"),
        ("b", "start"),
        ("a", 0),
        ("b", 0),
        ("a", 1),
        ("b", 1),
        ("a", "end", [0, 1]),
        ("b", "end", [0, 1]),
    ]
    assert [m["i"] for m in callbacks.history] == [0, 1]


def test_an_exception_skips_on_learn_end_and_still_closes_the_progress_bar():
    log: list = []
    callbacks = LearnCallbacks(FakeAgent(), Recorder(log, "a"), 3, progress_bar=True)
    with pytest.raises(RuntimeError, match="boom"):
        run(callbacks, 3, fail_at=1)
    assert log == [("a", "start"), ("a", 0)]
    assert callbacks.bar is not None and callbacks.bar.bar.disable  # tqdm's state once closed
    assert callbacks.bar.bar.n == 1


def test_a_plain_function_is_one_callback_and_none_is_no_callback():
    seen: list[int] = []
    run(LearnCallbacks(FakeAgent(), lambda agent, metrics: seen.append(metrics["i"]), 2, False), 2)
    assert seen == [0, 1]
    callbacks = LearnCallbacks(FakeAgent(), None, 2, False)
    run(callbacks, 2)
    assert callbacks.callbacks == [] and len(callbacks.history) == 2


def test_a_callback_that_is_not_callable_is_refused_before_learning():
    log: list = []
    with pytest.raises(TypeError, match="callback: int is not callable; lmgym calls callback"):
        LearnCallbacks(FakeAgent(), [Recorder(log, "a"), 3], 2, False)
    assert log == []


class StopAfter:
    """Stops learning after ``n`` iterations; records what on_learn_end saw."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ended_with: list[float] | None = None

    def __call__(self, agent, metrics: dict[str, float]) -> bool:
        return metrics["iteration"] < self.n

    def on_learn_end(self, agent, history: list[dict[str, float]]) -> None:
        self.ended_with = [m["iteration"] for m in history]


def test_learn_stops_when_a_callback_returns_false_and_returns_the_history(make_env, policy):
    agent = GRPO(policy, make_env(num_prompts=2, group_size=2, max_new_tokens=3))
    seen: list[float] = []
    stop = StopAfter(2)
    history = agent.learn(5, callback=[stop, lambda agent, m: seen.append(m["iteration"])])
    assert [m["iteration"] for m in history] == [1.0, 2.0]
    assert agent.iteration == 2 and seen == [1.0, 2.0] and stop.ended_with == [1.0, 2.0]
