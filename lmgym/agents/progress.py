"""``Agent.learn(progress_bar=True)``: a tqdm bar with live reward, KL and length."""

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
