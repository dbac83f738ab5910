"""A process of a multi-process run stopped from outside: SIGTERM as an exception.

When one process of a ``torchrun`` run ends (a killed actor, a crashed rank),
torch's launcher stops the others with SIGTERM. By default that ends them with no
word; ``sigterm_raises`` turns it into ``StoppedError`` in the main thread, so the
run says in one line what happened and where its last checkpoint is.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class StoppedError(RuntimeError):
    """This process received SIGTERM (its launcher stops the run)."""


def _raise(signum: int, frame: FrameType | None) -> None:
    raise StoppedError(
        "stopped by SIGTERM: torch's launcher stops every process of the run when one of them "
        "ends (a lost actor or rank is not replaced; its own message, if any, is above)"
    )


@contextmanager
def sigterm_raises(active: bool = True) -> Iterator[None]:
    """Within the block (when ``active``), SIGTERM raises ``StoppedError``."""
    if not active:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
