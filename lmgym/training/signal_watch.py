"""A warning when a run has no learning signal: every group flat, or no gradient at all.

A group-relative method learns from the spread of rewards within a group. When
every completion of every group gets the same reward (``frac_reward_zero_std``
1.0: typically all 0 on a task the model never solves), every advantage is 0, the
loss has no gradient, and the model does not move, however long it trains. The
same holds whenever ``grad_norm`` is 0. ``NoSignalWarning`` counts such iterations
in a row and, at ``NO_SIGNAL_PATIENCE``, prints one line saying so and what to
change; it warns again only after the signal came back and went away again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lmgym.training.callbacks import Printer, TrainingCallback, tqdm_print
from lmgym.typed_values import check_at_least

NO_SIGNAL_PATIENCE = 20
"""Iterations in a row without signal before the warning."""


def has_no_signal(metrics: dict[str, float], max_reward: float | None = None) -> bool:
    """Whether an iteration's metrics show no learning signal (flat groups or no gradient).

    Args:
        max_reward: the task's highest reward: flat groups that all reach it are a
            solved task, not a stuck one.
    """
    flat = metrics.get("frac_reward_zero_std")
    grad = metrics.get("grad_norm")
    reward = metrics.get("reward_mean")
    if max_reward is not None and reward is not None and reward >= max_reward - 1e-6:
        return False
    return (flat is not None and flat >= 1.0) or (grad is not None and grad == 0.0)


@dataclass(eq=False)
class NoSignalWarning(TrainingCallback):
    """Warn after ``patience`` iterations in a row without a learning signal.

    Args:
        group_size, temperature: the run's, quoted in the advice.
        max_reward: the task's highest reward (a solved task is flat too), if known.
        patience: iterations in a row (default ``NO_SIGNAL_PATIENCE``).
        out: where the line goes.

    Attributes:
        warned_at: the iterations at which it warned.
    """

    state_key: ClassVar[str] = "no_signal"

    group_size: int
    temperature: float
    max_reward: float | None = None
    patience: int = NO_SIGNAL_PATIENCE
    out: Printer | None = tqdm_print
    streak: int = field(default=0, init=False)
    warned_at: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        check_at_least("patience", self.patience)

    def message(self, agent: Any, metrics: dict[str, float]) -> str:
        """The warning line for the iteration that completes the streak."""
        first = agent.iteration - self.streak + 1
        why = (
            f"every group's completions got the same reward (reward_mean "
            f"{metrics.get('reward_mean', float('nan')):.3f}), so every advantage is 0"
            if metrics.get("frac_reward_zero_std", 0.0) >= 1.0
            else "the gradient norm is 0"
        )
        return (
            f"warning: no learning signal for {self.streak} iterations in a row ({first}-"
            f"{agent.iteration}): {why} and the model does not change. Sample more completions "
            f"per prompt (--group-size, now {self.group_size}), a higher --temperature (now "
            f"{self.temperature:g}), or an easier task (one the model sometimes solves)"
        )

    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        if not has_no_signal(metrics, self.max_reward):
            self.streak = 0
            return None
        self.streak += 1
        if self.streak == self.patience:
            self.warned_at.append(agent.iteration)
            if self.out is not None:
                self.out(self.message(agent, metrics))
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "warned_at": list(self.warned_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.warned_at = list(state["warned_at"])
