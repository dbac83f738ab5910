"""``--max-time``: bound a training session by wall time and still end it cleanly.

``durations.parse_duration("10m")`` reads the flag (``90``, ``90s``, ``10m``, ``1.5h``); the
callback ``WallClockLimit`` stops ``learn`` at the first iteration boundary where
the next iteration would end past the limit (estimated from the longest iteration
so far), so the run stops *before* the bound rather than after it. Stopping is
``learn``'s ordinary early stop: the final checkpoint and the after-evaluation are
written as at a planned end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lmgym.training.callbacks import Printer, TrainingCallback
from lmgym.training.durations import format_duration, parse_duration

__all__ = ["WallClockLimit", "format_duration", "parse_duration"]


class WallClockLimit(TrainingCallback):
    """Stop ``learn`` before an iteration that would end past ``seconds`` after ``start``.

    Args:
        seconds: the bound.
        start: its origin (``time.perf_counter()``; default: when this is built).
        label: how the bound is named in the message (``--max-time 10m``).
        out: where the stop line goes.
        clock: the time source (seconds; tests give a fake one).

    Attributes:
        stopped_at: the iteration it stopped after, or ``None``.
    """

    def __init__(
        self,
        seconds: float,
        start: float | None = None,
        label: str = "max_time",
        out: Printer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.seconds, self.label, self.out, self.clock = seconds, label, out, clock
        self.start = clock() if start is None else start
        self._last = self.start
        self._longest = 0.0
        self.stopped_at: int | None = None

    def on_learn_start(self, agent: Any) -> None:
        self._last = self.clock()

    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        now = self.clock()
        self._longest = max(self._longest, now - self._last)
        self._last = now
        elapsed = now - self.start
        if elapsed + self._longest <= self.seconds:
            return None
        self.stopped_at = agent.iteration
        if self.out is not None:
            self.out(
                f"stopping after iteration {agent.iteration}: {self.label} "
                f"({format_duration(elapsed)} elapsed, an iteration takes up to "
                f"{format_duration(self._longest)}); the final checkpoint and evaluation follow"
            )
        return False
