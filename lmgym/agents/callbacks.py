"""What ``Agent.learn`` calls: the callback protocol, its check, and the progress bar."""

from __future__ import annotations

from typing import Any


class ProgressBar:
    """A learn callback drawing one tqdm bar over ``iterations``."""

    def __init__(self, iterations: int, name: str) -> None:
        self.iterations, self.name, self.bar = iterations, name, None

    def on_learn_start(self, agent: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.iterations, desc=self.name, unit="it")

    def __call__(self, agent: Any, metrics: dict[str, float]) -> None:
        kl = metrics.get("kl_ref_k3", metrics.get("approx_kl", 0.0))
        self.bar.update(1)  # type: ignore[union-attr]
        self.bar.set_postfix(  # type: ignore[union-attr]
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
