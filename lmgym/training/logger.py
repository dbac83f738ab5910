"""Metrics loggers: Stable-Baselines3's ``Logger`` with its CSV, TensorBoard and stdout formats.

lmgym does not write its own logger. A run uses two SB3 loggers: one for files
(``progress.csv`` every iteration, plus TensorBoard events when the
``tensorboard`` package is installed) and one for the terminal (SB3's table,
printed every ``log_interval`` iterations through ``tqdm.write`` so it does not
tear the progress bar).

On resume the CSV file is rewritten from the rows up to the checkpoint's
iteration, so ``progress.csv`` of a resumed run reads exactly like one that was
never interrupted (rows a crashed session wrote past its last checkpoint are
dropped; the resumed run recomputes them).
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import HumanOutputFormat, KVWriter, Logger, make_output_format


def tensorboard_available() -> bool:
    """Whether TensorBoard event files can be written (the ``tensorboard`` package is installed)."""
    return importlib.util.find_spec("tensorboard") is not None


class _TqdmStream:
    """A text stream that prints through ``tqdm.write`` (safe while a bar is shown)."""

    def write(self, text: str) -> int:
        from tqdm.auto import tqdm

        tqdm.write(text, file=sys.stdout, end="")
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def close(self) -> None:
        """Nothing to close: stdout belongs to the process."""


def read_progress(path: str | Path) -> list[dict[str, float]]:
    """The rows of a ``progress.csv``, as ``{column: float}`` (empty cells left out)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            parsed = {}
            for key, value in row.items():
                if value in (None, ""):
                    continue
                try:
                    parsed[key] = float(value)
                except ValueError:
                    continue
            rows.append(parsed)
    return rows


def make_logger(
    folder: str | Path,
    *,
    tensorboard: bool | None = None,
    keep_rows_until: int | None = None,
) -> Logger:
    """The file logger of a run: ``progress.csv`` (+ TensorBoard events) in ``folder``.

    Args:
        folder: the run directory.
        tensorboard: write TensorBoard events; ``None``: when the package is installed.
        keep_rows_until: resume: keep the existing ``progress.csv`` rows whose
            ``iteration`` is at most this (and drop later ones); ``None`` starts a
            fresh file.

    Returns:
        An SB3 ``Logger``; ``record(key, value)`` then ``dump(step)`` once per iteration.
    """
    folder = Path(folder)
    old_rows = read_progress(folder / "progress.csv") if keep_rows_until is not None else []
    formats: list[KVWriter] = [make_output_format("csv", str(folder))]
    if tensorboard is None:
        tensorboard = tensorboard_available()
    if tensorboard:
        formats.append(make_output_format("tensorboard", str(folder)))
    csv_format = formats[0]
    for row in old_rows:
        if row.get("iteration", 0) <= (keep_rows_until or 0):
            csv_format.write(row, dict.fromkeys(row), int(row.get("iteration", 0)))
    return Logger(str(folder), formats)


def make_stdout_logger() -> Logger:
    """A logger that prints SB3's metrics table to stdout (through ``tqdm.write``)."""
    return Logger(None, [HumanOutputFormat(_TqdmStream())])  # type: ignore[arg-type]


def record_metrics(logger: Logger, metrics: dict[str, Any], step: int) -> None:
    """Record every numeric entry of ``metrics`` and dump them at ``step``."""
    for key, value in metrics.items():
        if isinstance(value, int | float):
            logger.record(key, float(value))
    logger.dump(step)
