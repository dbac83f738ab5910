"""When a periodic report is due: every N iterations or every T of wall time, whichever first.

On the tiny demo an iteration takes a fraction of a second and 50 iterations pass in
seconds; on a real model one takes half a minute, and 50 never come in a 12-minute
run, so a report by iterations alone never shows. ``Pace`` is the one rule the
metric table, the printed samples and the periodic evaluations share: due at an
iteration that is a multiple of ``every`` (``0``: never by iterations), or once
``seconds`` have passed since the last report ended (``None``: never by time). The
clock starts when ``learn`` starts and restarts when a report is done, so the time
a report itself takes (an evaluation: a minute on a real model) never counts.

A report by time depends on the machine's speed: two runs of the same seed can
print (and record) their time-triggered reports at different iterations. The
training itself never changes: reports use their own env and generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lmgym.training.durations import parse_duration


@dataclass
class Pace:
    """Due every ``every`` iterations or every ``seconds`` of wall time, whichever first.

    Args:
        every: iterations between reports (0: not by iterations).
        seconds: wall time between reports (``None``: not by time).
        clock: the clock (``time.perf_counter``; tests pass their own).
    """

    every: int
    seconds: float | None = None
    clock: Callable[[], float] = time.perf_counter
    last: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"every={self.every}: must be >= 0 (0: not by iterations)")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds={self.seconds}: must be > 0 (None: not by time)")

    @property
    def active(self) -> bool:
        """Whether it is ever due."""
        return self.every > 0 or self.seconds is not None

    def start(self) -> None:
        """Start the clock (``learn`` starts)."""
        self.last = self.clock()

    def due(self, iteration: int) -> bool:
        """Whether a report is due after ``iteration``."""
        if self.every and iteration % self.every == 0:
            return True
        if self.seconds is None:
            return False
        if self.last is None:
            self.start()
            return False
        return self.clock() - self.last >= self.seconds

    def done(self) -> None:
        """A report just ended: the time clock restarts."""
        self.last = self.clock()


def pace_of(every: int, duration: str | None, field_name: str) -> Pace:
    """The ``Pace`` of a run's ``every`` field and duration field (``"2m"`` or ``None``)."""
    seconds = parse_duration(duration, field_name) if duration is not None else None
    return Pace(every, seconds)
