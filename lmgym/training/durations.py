"""Durations as flags take them (``--max-time 10m``) and as runs print them.

Its own module, importing nothing from lmgym, because both the config check
(``training.run``) and the run's callbacks (``training.wall_clock``) read it.
"""

from __future__ import annotations

import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*")


def parse_duration(text: str | float | int, field: str = "max_time") -> float:
    """Seconds of ``text``: a number of seconds, or one with a unit ``s``, ``m`` or ``h``.

    Raises:
        ValueError: anything else, or a duration that is not positive; names ``field``.
    """
    match = _DURATION.fullmatch(str(text).lower())
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0
    if seconds <= 0:
        raise ValueError(
            f"{field}={text!r}: expected a positive duration: seconds (600) or with a unit "
            "(90s, 10m, 1.5h)"
        )
    return seconds


def format_duration(seconds: float) -> str:
    """``"9m52s"``, ``"45.0s"``."""
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.1f}s"
