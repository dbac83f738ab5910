"""What ``Agent.learn`` calls: the callback protocol, its check, the progress bar, and
``LearnCallbacks``, which drives them around the learn loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# The first argument is the learning ``lmgym.agents.Agent``; typed ``Any`` because
# naming it here would make this module and ``agents.base`` import each other.
Callback = Callable[[Any, dict[str, float]], bool | None]
"""Called after every iteration with the agent and its metrics; returning False stops learning.

A callback object may also define ``on_learn_start(agent)`` and
``on_learn_end(agent, history)``; ``learn`` calls them, when present, before the
first and after the last iteration (``lmgym.training.callbacks`` has ready ones:
early stop at a threshold, periodic evaluation, sample printing, logging,
checkpoints)."""


class ProgressBar:
    """A learn callback drawing one tqdm bar over ``iterations``."""

    def __init__(self, iterations: int, name: str) -> None:
        self.iterations, self.name = iterations, name
        self.bar: Any = None  # a tqdm bar from on_learn_start on

    def on_learn_start(self, agent: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.iterations, desc=self.name, unit="it")

    def __call__(self, agent: Any, metrics: dict[str, float]) -> None:
        kl = metrics.get("kl_ref_k3", metrics.get("approx_kl", 0.0))
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{metrics['reward_mean']:.3f}",
            kl=f"{kl:.4f}",
            len=f"{metrics['completion_length']:.1f}",
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


CALLBACK_PROTOCOL = (
    "lmgym calls callback(agent, metrics) after every iteration (return False to stop) and, "
    "when the object has them, on_learn_start(agent) and on_learn_end(agent, history): pass a "
    "function or a lmgym.training.TrainingCallback subclass"
)


def check_callback(callback: object, where: str) -> None:
    """Raise ``TypeError`` for something ``Agent.learn`` cannot call as a callback.

    A Stable-Baselines3 ``BaseCallback`` (class or object) gets a message stating
    lmgym's protocol: SB3 drives its callbacks through an SB3 model (``init_callback``,
    ``on_step`` with the rollout's locals), which an lmgym agent is not.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    sb3 = isinstance(callback, BaseCallback) or (
        isinstance(callback, type) and issubclass(callback, BaseCallback)
    )
    if sb3:
        name = callback.__name__ if isinstance(callback, type) else type(callback).__name__
        raise TypeError(
            f"{where}: {name} is a Stable-Baselines3 BaseCallback, which drives an SB3 model "
            f"(on_step, rollout buffers), not an lmgym agent; {CALLBACK_PROTOCOL}"
        )
    if not callable(callback):
        raise TypeError(f"{where}: {type(callback).__name__} is not callable; {CALLBACK_PROTOCOL}")


class LearnCallbacks:
    """The callbacks of one ``Agent.learn`` call, with their protocol around its loop.

    ``with LearnCallbacks(...) as callbacks:`` calls every ``on_learn_start(agent)``;
    ``callbacks.after(metrics)`` records an iteration and calls every callback in
    order; leaving the block closes the progress bar and, unless an exception is
    leaving it, calls every ``on_learn_end(agent, history)``.

    Args:
        agent: the learning agent, passed to every call.
        callback: one callback, a sequence of them, or ``None``; each is checked
            (``check_callback``).
        iterations: the length of the progress bar.
        progress_bar: draw a tqdm bar (``ProgressBar``), called before the others.
    """

    def __init__(self, agent: Any, callback: Any, iterations: int, progress_bar: bool) -> None:
        is_one = callback is None or callable(callback) or not isinstance(callback, Sequence)
        callbacks = [] if callback is None else [callback] if is_one else list(callback)
        for cb in callbacks:
            check_callback(cb, "callback")
        self.bar = ProgressBar(iterations, agent.name) if progress_bar else None
        self.callbacks = [self.bar, *callbacks] if self.bar is not None else callbacks
        self.agent = agent
        self.history: list[dict[str, float]] = []

    def __enter__(self) -> LearnCallbacks:
        for cb in self.callbacks:
            if hasattr(cb, "on_learn_start"):
                cb.on_learn_start(self.agent)
        return self

    def after(self, metrics: dict[str, float]) -> bool:
        """Record one iteration's metrics and call every callback on them.

        Returns:
            ``False`` when a callback returned ``False`` (every one is still called).
        """
        self.history.append(metrics)
        return not any([cb(self.agent, metrics) is False for cb in self.callbacks])

    def __exit__(self, error_type: type[BaseException] | None, *rest: object) -> None:
        if self.bar is not None:
            self.bar.close()
        if error_type is None:
            for cb in self.callbacks:
                if hasattr(cb, "on_learn_end"):
                    cb.on_learn_end(self.agent, self.history)
