"""Metrics loggers: Stable-Baselines3's ``Logger`` with CSV, TensorBoard and stdout formats.

A run uses two SB3 loggers: one for files (``progress.csv`` every iteration, plus
TensorBoard events when the ``tensorboard`` package is installed) and one for the
terminal (SB3's table, printed every ``log_interval`` iterations through
``tqdm.write`` so it does not tear the progress bar).

The CSV format is lmgym's own ``KVWriter`` (``CrashSafeCSV``), because SB3's
rewrites ``progress.csv`` in place whenever a new column appears (the first
evaluation, say): a kill during that rewrite could lose rows already written.
Here a row is appended and flushed, and a new column rewrites the file to a
temporary name and renames it over the old one, so a crash leaves every finished
row intact (at most an unfinished last line, which readers drop). Its columns
keep the order in which they first appeared.

On resume the run directory has already cut ``progress.csv`` back to the
checkpoint's iteration (``RunDirectory.rewind``); the CSV format appends from
there, and TensorBoard gets ``purge_step`` so its curves drop the steps after the
checkpoint instead of showing them twice.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import sys
import time
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import (
    HumanOutputFormat,
    KVWriter,
    Logger,
    TensorBoardOutputFormat,
    filter_excluded_keys,
)

from lmgym.persistence.atomic import append_line, atomic_write_text, complete_lines

PROGRESS = "progress.csv"


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


def _csv_cells(line: str) -> list[str]:
    return next(csv.reader([line]), [])


def read_progress(path: str | Path) -> list[dict[str, float]]:
    """The finished rows of a ``progress.csv``, as ``{column: float}`` (empty cells and an
    unfinished last line left out)."""
    lines = complete_lines(path)
    if not lines:
        return []
    header = _csv_cells(lines[0])
    rows = []
    for line in lines[1:]:
        parsed = {}
        for key, value in zip(header, _csv_cells(line), strict=False):
            if value == "":
                continue
            try:
                parsed[key] = float(value)
            except ValueError:
                continue
        rows.append(parsed)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow([value])
        return out.getvalue()
    return str(value)


class CrashSafeCSV(KVWriter):
    """SB3 ``KVWriter`` for ``progress.csv``: rows appended, a new column rewrites atomically.

    Args:
        path: the CSV file.
        append: continue the file's finished rows (resume); otherwise start it empty.
    """

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        lines = complete_lines(self.path) if append else []
        self.keys: list[str] = _csv_cells(lines[0]) if lines else []
        self.lines: list[str] = lines[1:]
        self._rewrite()

    def _rewrite(self) -> None:
        header = [",".join(_cell(k) for k in self.keys)] if self.keys else []
        atomic_write_text(self.path, "".join(line + "\n" for line in header + self.lines))

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0
    ) -> None:
        values = filter_excluded_keys(key_values, key_excluded, "csv")
        extra = [key for key in values if key not in self.keys]
        if extra:
            self.keys += extra
            self.lines = [line + "," * len(extra) for line in self.lines]
        line = ",".join(_cell(values.get(key)) for key in self.keys)
        self.lines.append(line)
        if extra:
            self._rewrite()
        else:
            append_line(self.path, line)

    def close(self) -> None:
        """Nothing to close: every write opened and closed the file."""


class _PurgingTensorBoard(TensorBoardOutputFormat):
    """SB3's TensorBoard format with ``SummaryWriter(purge_step=...)``: on resume, the
    steps from ``purge_step`` on that an earlier session wrote are hidden."""

    def __init__(self, folder: str, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _after_earlier_event_files(Path(folder))
        self.writer = SummaryWriter(log_dir=folder, purge_step=purge_step)
        self._is_closed = False


# An event file's name: events.out.tfevents.<whole-second start time, 10 digits>.<host>.<pid>.<n>
_EVENTS = "events.out.tfevents."
# A clock more than this behind an earlier session's file is not waited out.
_MAX_WAIT_S = 2.0


def _after_earlier_event_files(folder: Path) -> None:
    """Wait until the whole second of the newest event file in ``folder`` has passed.

    TensorBoard reads a directory's event files in name order, and a name orders by
    its start second first, then by host, pid and a per-process counter compared as
    text (``...1.10`` before ``...1.9``). A session started within the second of an
    earlier one (a quick resume) could then be read before it, and its ``purge_step``
    would hide its own new steps instead of the abandoned ones (seen in the test
    suite, where one process had made ten writers).
    """
    seconds = [
        int(stamp)
        for path in folder.glob(_EVENTS + "*")
        if (stamp := path.name[len(_EVENTS) :].split(".", 1)[0]).isdigit()
    ]
    if seconds:
        wait = max(seconds) + 1 - time.time()
        if 0 < wait <= _MAX_WAIT_S:
            time.sleep(wait)


def make_logger(
    folder: str | Path,
    *,
    tensorboard: bool | None = None,
    resume_at: int | None = None,
) -> Logger:
    """The file logger of a run: ``progress.csv`` (+ TensorBoard events) in ``folder``.

    Args:
        folder: the run directory.
        tensorboard: write TensorBoard events; ``None``: when the package is installed.
        resume_at: resume: the checkpoint's iteration; ``progress.csv`` (already cut
            back to it) is continued and TensorBoard purges later steps. ``None``
            starts a fresh file.

    Returns:
        An SB3 ``Logger``; ``record(key, value)`` then ``dump(step)`` once per iteration.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    formats: list[KVWriter] = [CrashSafeCSV(folder / PROGRESS, append=resume_at is not None)]
    if tensorboard is None:
        tensorboard = tensorboard_available()
    if tensorboard:
        purge = resume_at + 1 if resume_at is not None else None
        formats.append(_PurgingTensorBoard(str(folder), purge))
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
