"""Measurement helpers shared by the benchmark scripts in this directory.

Every benchmark runs both sides in one process, alternated after a warm-up, and
reports medians; these are the pieces they have in common: a meter of the CPU load
of *other* processes (a benchmark is only meaningful on an otherwise idle machine),
waiting for an idle machine and rerunning a disturbed measurement, ABBA
alternation, running a measurement in a fresh process, and the machine / version
lines of a results file.

The scripts are run as ``.venv/bin/python benchmarks/<name>.py`` from the
repository root; each puts this directory on ``sys.path`` so ``import _common``
works from a checkout. This module imports nothing heavy (no torch), so a script
can import it before deciding what else it needs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

NOISY = 0.10
"""Other processes' share of the CPUs above which a measurement is flagged (noisy)."""


class CpuMeter:
    """Share of the machine's CPUs that *other* processes used while a benchmark ran.

    The benchmark is only meaningful on an otherwise idle machine; this makes a
    contended run visible instead of silently wrong. Construct it when the
    measurement starts and call ``other_load`` when it ends. Linux only
    (``/proc/stat``); elsewhere it reports NaN.
    """

    def __init__(self) -> None:
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float] | None:
        """``(wall seconds, CPU-seconds busy on the whole machine, this process's CPU-seconds)``."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + fields[4]  # idle + iowait
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system

    def other_load(self) -> float:
        """Other processes' CPU-seconds since construction / (wall seconds x CPU count)."""
        end = self._snapshot()
        if self.start is None or end is None:
            return float("nan")
        wall = end[0] - self.start[0]
        others = (end[1] - self.start[1]) - (end[2] - self.start[2])
        return max(0.0, others / (wall * (os.cpu_count() or 1)))


def wait_until_idle(deadline: float) -> bool:
    """Sleep until other processes use at most ``NOISY`` of the CPUs over 2 s, or ``deadline``.

    Args:
        deadline: a ``time.perf_counter()`` value.

    Returns:
        True when the machine was idle, False when the deadline passed first.
    """
    while True:
        meter = CpuMeter()
        time.sleep(2.0)
        load = meter.other_load()
        if not load > NOISY:  # NaN (no /proc/stat) counts as idle
            return True
        if time.perf_counter() >= deadline:
            return False
        print(f"  waiting for an idle machine (other CPU load {load:.0%})", flush=True)


def run_undisturbed(
    run: Callable[[], T],
    other_load: Callable[[T], float],
    deadline: float | None,
    label: str | Callable[[T], str] = "",
) -> T:
    """Run one measurement; with a ``deadline``, wait for idle CPUs first and rerun a
    measurement that other processes disturbed (``other_load(result) > NOISY``), until
    the deadline passes. Without a deadline, run once and return.

    Args:
        run: does the measurement and returns its result.
        other_load: reads the other processes' CPU share off a result.
        deadline: a ``time.perf_counter()`` value, or None (measure at once).
        label: prefix of the "rerunning" message, or a function of the result giving it.
    """
    while True:
        if deadline is not None:
            wait_until_idle(deadline)
        result = run()
        load = other_load(result)
        if deadline is None or not load > NOISY or time.perf_counter() >= deadline:
            return result
        name = label(result) if callable(label) else label
        prefix = f"{name}: " if name else ""
        print(f"  {prefix}other CPU load {load:.0%}, rerunning", flush=True)


def alternate(
    a: Callable[[], float], b: Callable[[], float], warmup: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Time ``a`` and ``b`` alternately (ABBA order), after ``warmup`` untimed calls each.

    Each callable does its own timing and returns seconds, so untimed setup stays
    out of the measurement.

    Returns:
        ``(seconds of a, seconds of b)``, ``repeats`` each.
    """
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for i in range(repeats):
        if i % 2 == 0:
            ta.append(a())
            tb.append(b())
        else:
            tb.append(b())
            ta.append(a())
    return ta, tb


def in_fresh_process(fn: Callable[[], T], init: Callable[[], None] | None = None) -> T:
    """Run ``fn`` in a new (spawned) Python process, after ``init``, and return its
    result (``fn``, ``init`` and the result must pickle).

    Absolute CPU speed moves by up to 30% between processes (allocator and cache
    state), and not always for both sides of a comparison alike; a row measured in
    several fresh processes reports the median of their ratios.
    """
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1, initializer=init) as pool:
        return pool.apply(fn)


def quiet_worker(threads: int) -> None:
    """Set up a fresh measuring process: ``threads`` torch threads, transformers
    warnings off (pass with ``functools.partial`` as ``in_fresh_process``'s init)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()


def add_wait_idle_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--wait-idle SECONDS`` (default 0: measure at once) to ``parser``."""
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on a shared machine: before each row wait for the other processes' CPU load "
        f"to drop below {NOISY * 100:.0f}%%, and rerun a disturbed row, for at most SECONDS "
        "in all (default 0: measure at once)",
    )


def deadline_from(wait_idle: float, start: float) -> float | None:
    """The ``perf_counter`` deadline of ``--wait-idle`` (None when it is 0)."""
    return start + wait_idle if wait_idle > 0 else None


# ----------------------------------------------------------------- report header
def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def utc_now() -> str:
    """The current time as ``YYYY-MM-DD HH:MM UTC``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def machine_line(threads: str) -> str:
    """``- machine: N CPU cores (arch, model), <threads>, no GPU`` for a results file.

    Args:
        threads: how many torch threads ran, e.g. ``"torch threads = 2"``.
    """
    return (
        f"- machine: {os.cpu_count()} CPU cores ({platform.machine()}, {cpu_model()}), "
        f"{threads}, no GPU"
    )


def versions_line(modules: Sequence[str]) -> str:
    """``- python X, torch Y, ...`` with the ``__version__`` of each named module."""
    parts = [f"python {platform.python_version()}"]
    for name in modules:
        module = importlib.import_module(name)
        parts.append(f"{name} {getattr(module, '__version__', '?')}")
    return "- " + ", ".join(parts)


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command that reruns ``benchmarks/<script>`` with ``argv`` from the repository root."""
    return " ".join([".venv/bin/python", f"benchmarks/{script}", *argv])


def write_report(text: str, out: Path | None) -> None:
    """Write a Markdown report to ``out`` (parents created) and say so; no-op for None."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", flush=True)
