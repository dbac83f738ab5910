"""The benchmark harness: what every script in this directory shares.

- **Measurement.** Both sides of a comparison run in one process, alternated (ABBA)
  after a warm-up (``alternate``). Absolute CPU speed moves by up to 30% between
  processes, and not always for both sides alike, so a row runs in several fresh
  (spawned) processes and reports the median of their ratios (``in_processes``).
  A benchmark is only meaningful on an otherwise idle machine: ``CpuMeter`` reports
  the share of the CPUs *other* processes used meanwhile (a row above ``NOISY`` is
  flagged), and ``--wait-idle`` waits for an idle machine before each row and
  reruns a disturbed one (``run_undisturbed``).
- **Reports.** The header lines of a results file (date, machine, versions, the
  git commit measured, the command), Markdown tables, spreads, verdicts and an
  atomic write.
- **Phase tables.** Where an lmgym call spends its time, from the
  ``torch.profiler.record_function`` labels lmgym places in its own code
  (``lmgym.profiling``): exclusive seconds per label path, so the rows add up.
- **Rows over processes.** ``Runs``: a row's per-process results, its ratio the
  median of theirs (``run_row`` runs and prints one).

The models, prompts, envs and the two sides of rollout-vs-generate live in
``workloads.py``.

Scripts run as ``.venv/bin/python benchmarks/<name>.py`` (Python puts this
directory on ``sys.path``); importing this module also puts the repository root
there, so ``import lmgym`` finds the checkout when the package is not installed.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
NOISY = 0.10
"""Other processes' share of the CPUs above which a measurement is flagged (noisy)."""
ONE_STEP: dict[str, int] = {"update_epochs": 1, "num_minibatches": 1}
"""One optimizer step per rollout batch: what the throughput benchmarks, the peer
comparisons (TRL's default, ``num_iterations=1``, also takes one) and the committed
real-model results measure. GRPO's own default is 4 epochs x 2 minibatches since
issue 26, so these scripts set it."""


# ------------------------------------------------------------------- measurement
def status_kib(name: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmHWM``: this process's peak resident
    memory, reset by exec; unlike ``ru_maxrss``, which a spawned worker inherits from
    its parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {name}")


def tree_cpu_seconds() -> float:
    """CPU-seconds of this process and its descendants: the finished ones it waited
    for (``os.times``) and the live ones (``/proc/<pid>/stat``, with the children
    they waited for), e.g. inductor's compile workers or a spawned benchmark worker."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU-seconds)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
            except OSError:  # exited meanwhile
                continue
            # fields[1] = ppid; [11:15] = utime, stime, cutime, cstime (clock ticks)
            procs[int(entry.name)] = (int(fields[1]), sum(map(int, fields[11:15])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in procs.items():
        children.setdefault(parent, []).append(pid)
    stack = list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += procs[pid][1]
        stack += children.get(pid, [])
    return total


class CpuMeter:
    """Share of the machine's CPUs that *other* processes used since construction:
    processes outside this one's tree (its own workers, such as inductor's compile
    pool, are not "other").

    Linux only (``/proc``); elsewhere ``other_load`` is NaN.
    """

    def __init__(self) -> None:
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float] | None:
        """``(wall s, CPU-seconds busy on the whole machine, this process tree's CPU-seconds)``."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + fields[4]  # idle + iowait
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
        return time.perf_counter(), busy, tree_cpu_seconds()

    def other_load(self) -> float:
        """Other processes' CPU-seconds since construction / (wall seconds x CPU count)."""
        end = self._snapshot()
        if self.start is None or end is None:
            return float("nan")
        others = (end[1] - self.start[1]) - (end[2] - self.start[2])
        return max(0.0, others / ((end[0] - self.start[0]) * (os.cpu_count() or 1)))


def wait_until_idle(deadline: float) -> None:
    """Sleep until other processes use at most ``NOISY`` of the CPUs over 2 s, or
    until ``deadline`` (a ``time.perf_counter()`` value)."""
    while True:
        meter = CpuMeter()
        time.sleep(2.0)
        load = meter.other_load()
        if not load > NOISY or time.perf_counter() >= deadline:  # NaN counts as idle
            return
        print(f"  waiting for an idle machine (other CPU load {load:.0%})", flush=True)


class Loaded(Protocol):
    other_load: float


L = TypeVar("L", bound=Loaded)


def run_undisturbed(run: Callable[[], L], deadline: float | None, label: str = "") -> L:
    """Run one measurement. With a ``deadline``: wait for idle CPUs first and rerun a
    result whose ``other_load`` exceeds ``NOISY``, until the deadline passes."""
    while True:
        if deadline is not None:
            wait_until_idle(deadline)
        result = run()
        load = result.other_load
        if deadline is None or not load > NOISY or time.perf_counter() >= deadline:
            return result
        print(f"  {label + ': ' if label else ''}other CPU load {load:.0%}, rerunning", flush=True)


def alternate(
    a: Callable[[], float], b: Callable[[], float], warmup: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Time ``a`` and ``b`` alternately (A B B A ...), after ``warmup`` untimed calls each.

    Each callable times itself and returns seconds, so its setup stays out.

    Returns:
        ``(seconds of a, seconds of b)``, ``repeats`` each.
    """
    for _ in range(warmup):
        a()
        b()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(repeats):
        first, second = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        first[1].append(first[0]())
        second[1].append(second[0]())
    return ta, tb


def quiet_worker(threads: int) -> None:
    """Set up a measuring process: ``threads`` torch threads; transformers, accelerate
    and Python warnings silenced."""
    import logging
    import warnings

    import transformers

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def worker_env(**overrides: str) -> dict[str, str]:
    """This process's environment for a worker subprocess: the repository root first on
    ``PYTHONPATH`` (the checkout's lmgym), then ``overrides``."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **overrides}


def forwarded(args: argparse.Namespace, *keys: str) -> list[str]:
    """``--key=value`` flags that give a worker process these options of ``args``."""
    return [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys]


def torchrun(processes: int, argv: Sequence[str]) -> None:
    """Run ``python argv`` as ``processes`` ``torchrun`` workers (one thread each)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    env = worker_env(OMP_NUM_THREADS="1")
    subprocess.run([*command, str(processes), *argv], env=env, check=True)


def in_fresh_process(fn: Callable[[], T], threads: int) -> T:
    """``fn()`` in a new (spawned) process set up by ``quiet_worker(threads)``
    (``fn`` and its result must pickle)."""
    import multiprocessing

    init = functools.partial(quiet_worker, threads)
    with multiprocessing.get_context("spawn").Pool(1, initializer=init) as pool:
        return pool.apply(fn)


def in_processes(
    work: Callable[[int], L],
    processes: int,
    threads: int,
    deadline: float | None,
    label: str,
    fresh: bool | None = None,
) -> list[L]:
    """``work(i)`` for each process ``i``, each in a fresh process (by default when
    ``processes > 1``; otherwise here) and each through ``run_undisturbed``."""
    fresh = processes > 1 if fresh is None else fresh
    results = []
    for i in range(processes):
        run = functools.partial(work, i)
        if fresh:
            run = functools.partial(in_fresh_process, run, threads)
        name = f"{label}, process {i + 1}" if processes > 1 else label
        results.append(run_undisturbed(run, deadline, label=name))
    return results


@dataclass
class Comparison:
    """One row of a two-sided comparison: each side's figure (median), ``ratio = a / b``
    (the median of the per-process ratios when the row ran in several processes)."""

    name: str
    a: float
    b: float
    repeats: int
    other_load: float
    seconds: float = 0.0
    process_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        return statistics.median(self.process_ratios) if self.process_ratios else self.a / self.b


def pool(rows: Sequence[Comparison]) -> Comparison:
    """One row from the same comparison in several processes: medians of each side,
    repeats and seconds summed, the worst load, every process's ratio."""
    return Comparison(
        rows[0].name,
        statistics.median(r.a for r in rows),
        statistics.median(r.b for r in rows),
        sum(r.repeats for r in rows),
        max(r.other_load for r in rows),
        sum(r.seconds for r in rows),
        tuple(r.ratio for r in rows),
    )


def ratios_block(rows: Sequence[Any]) -> list[str]:
    """A blank line and ``- name: per-process ratios 1.01x, 0.98x`` for each row that ran
    in several processes (rows with ``name`` and ``process_ratios``); nothing if none did."""
    lines = [
        f"- {r.name}: per-process ratios " + ", ".join(f"{x:.2f}x" for x in r.process_ratios)
        for r in rows
        if r.process_ratios
    ]
    return ["", *lines] if lines else []


class Ratioed(Loaded, Protocol):
    ratio: float


R = TypeVar("R", bound=Ratioed)


@dataclass
class Runs(Generic[R]):
    """One row measured in one or more processes: ``runs`` (each with ``ratio`` and
    ``other_load``); the row's ratio is the median of theirs, its load the worst."""

    name: str
    runs: list[R]

    @property
    def ratio(self) -> float:
        return statistics.median(r.ratio for r in self.runs)

    @property
    def process_ratios(self) -> tuple[float, ...]:
        """Every process's ratio when there were several (for ``ratios_block``)."""
        return tuple(r.ratio for r in self.runs) if len(self.runs) > 1 else ()

    @property
    def other_load(self) -> float:
        return max(r.other_load for r in self.runs)

    def pooled(self, key: str) -> list[Any]:
        """The items of list attribute ``key`` of every run, in order."""
        return [x for r in self.runs for x in getattr(r, key)]


def run_row(
    name: str,
    work: Callable[[int], R],
    processes: int,
    threads: int,
    deadline: float | None,
    fresh: bool | None = None,
) -> Runs[R]:
    """``in_processes`` for one row; prints its ratio (and each process's)."""
    row = Runs(name, in_processes(work, processes, threads, deadline, name, fresh))
    each = ", ".join(f"{x:.2f}x" for x in row.process_ratios)
    print(f"{name}: {row.ratio:.2f}x" + (f" (per process: {each})" if each else "")
          + f", other CPU load {row.other_load:.0%}", flush=True)  # fmt: skip
    return row


# ------------------------------------------------------------------------ options
def parser(doc: str | None, quick: str | None = "smoke run") -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` (help ``quick``; none when it is None) and
    ``--out`` (description: the doc's first paragraph)."""
    source_line()  # the commit measured: now, before the run, not when the report is written
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--out", type=Path, help="write a Markdown results file here")
    return p


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (``--processes``)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_wait_idle(p: argparse.ArgumentParser) -> None:
    """Add ``--wait-idle SECONDS`` (default 0: measure at once)."""
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on a shared machine: before each row wait for the other processes' CPU load "
        f"to drop below {NOISY * 100:.0f}%%, and rerun a disturbed row, for at most SECONDS "
        "in all (default 0: measure at once)",
    )


def add_common(
    p: argparse.ArgumentParser,
    threads: int | None = None,
    models: Sequence[str] = (),
    warmup: int | None = None,
    repeats: str = "",
    processes: str = "",
    compile_decode: bool = False,
    wait_idle: bool = True,
) -> None:
    """Add the options most comparisons share, each only where its argument is given:
    ``--threads`` (default ``threads``), ``--models`` (comma list of ``models``, default
    all), ``--warmup`` (pairs), ``--repeats`` / ``--processes`` (defaults left to
    ``fill_defaults``; the argument is the help's default text), ``--compile-decode``
    and ``--wait-idle``."""
    if threads is not None:
        p.add_argument("--threads", type=int, default=threads, help=f"torch threads ({threads})")
    if models:
        p.add_argument("--models", help=f"comma list of: {', '.join(models)} (default all)")
    if warmup is not None:
        p.add_argument("--warmup", type=int, default=warmup, help=f"warm-up pairs ({warmup})")
    if repeats:
        p.add_argument("--repeats", type=int, help=f"timed repeats per side ({repeats})")
    if processes:
        p.add_argument(
            "--processes", type=positive_int, help=f"fresh processes per row ({processes})"
        )
    if compile_decode:
        p.add_argument(
            "--compile-decode",
            action="store_true",
            help="lmgym decodes with CausalLMPolicy(compile_decode=True): a torch.compile'd "
            "step, compiled once per process and shape (the baseline is unchanged)",
        )
    if wait_idle:
        add_wait_idle(p)


def fill_defaults(args: argparse.Namespace, normal: dict[str, Any], quick: dict[str, Any]) -> None:
    """Set every option still ``None`` from ``quick`` (with ``--quick``) or ``normal``."""
    for key, value in {**normal, **(quick if args.quick else {})}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def deadline_from(wait_idle: float, start: float) -> float | None:
    """The ``perf_counter`` deadline of ``--wait-idle`` (None when it is 0)."""
    return start + wait_idle if wait_idle > 0 else None


def csv(text: str, valid: Sequence[str], option: str, p: argparse.ArgumentParser) -> list[str]:
    """A comma list checked against ``valid`` (``p.error`` names a bad item)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in valid:
            p.error(f"{option}: unknown {x!r}; choose from {list(valid)}")
    return items


# ------------------------------------------------------------------------ reports
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


@functools.cache
def source_line() -> str:
    """The git commit measured, and whether ``lmgym/`` had uncommitted changes, as at
    the first call (``parser`` makes it, so a report written at the end of a run names
    the commit it started from)."""
    try:
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "lmgym"], capture_output=True, text=True
        )
    except OSError:
        return "- source: unknown (no git)"
    state = "with uncommitted changes under lmgym/" if dirty.stdout.strip() else "lmgym/ clean"
    return f"- source: commit {head.stdout.strip() or '?'}, {state} (at the start of the run)"


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that reruns ``benchmarks/<script>`` with ``argv`` (default: this
    process's arguments) from the repository root."""
    return " ".join(
        [".venv/bin/python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)]
    )


def header(
    title: str,
    threads: str,
    modules: Sequence[str],
    command: str,
    note: str = "",
    device: str = "no GPU",
    compile_decode: bool | None = None,
) -> list[str]:
    """The first lines of a results file: title, date, machine, versions, source, command.

    Args:
        threads: how many torch threads ran, e.g. ``"torch threads = 2"``.
        modules: modules whose ``__version__`` to list after python's.
        command: the command line (``command_line``); ``note`` follows it.
        device: the accelerator part of the machine line.
        compile_decode: whether lmgym decoded with the compiled step (a line saying
            so; ``None``: no line, the script has no such choice).
    """
    versions = [f"python {platform.python_version()}"]
    for name in modules:
        try:
            version = getattr(importlib.import_module(name), "__version__", "?")
        except ModuleNotFoundError:  # e.g. trl without the bench extra: a report still renders
            version = "not installed"
        versions.append(f"{name} {version}")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"# {title}",
        "",
        f"- date: {now}",
        f"- machine: {os.cpu_count()} CPU cores ({platform.machine()}, {cpu_model()}), "
        f"{threads}, {device}",
        "- " + ", ".join(versions),
        source_line(),
        f"- command: `{command}`{note}",
        *([] if compile_decode is None else [decode_line(compile_decode)]),
    ]


def decode_line(compile_decode: bool) -> str:
    """The header line that says how lmgym decoded."""
    if compile_decode:
        return (
            "- lmgym decode: compiled (`--compile-decode`: `CausalLMPolicy(compile_decode=True)`"
            ", compiled before timing; an eager fallback fails the run)"
        )
    return "- lmgym decode: eager (the default; `--compile-decode` compiles it)"


def device_text(device: torch.device) -> str:
    """The accelerator part of the header's machine line: a CUDA device's name, memory,
    SMs and CUDA version, or ``no GPU``."""
    if device.type != "cuda":
        return "no GPU"
    props = torch.cuda.get_device_properties(device)
    return (
        f"{torch.cuda.get_device_name(device)}, {props.total_memory / 2**30:.0f} GiB, "
        f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
    )


def table(head: str, rows: Sequence[str | Sequence[Any]], left: int = 1) -> list[str]:
    """A Markdown table: ``head`` and string rows are cells joined by ``" | "``; the
    first ``left`` columns align left, the others right."""
    cells = head.split(" | ")
    align = ["---" if i < left else "---:" for i in range(len(cells))]
    body = [r if isinstance(r, str) else " | ".join(str(c) for c in r) for r in rows]
    return [f"| {head} |", "|" + "|".join(align) + "|", *[f"| {r} |" for r in body]]


def spread(xs: Sequence[float], digits: int = 3) -> str:
    """``median [q1, q3] (min-max)`` of ``xs``."""
    if len(xs) < 2:
        return f"{xs[0]:.{digits}f}" if xs else "n/a"
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    f = f".{digits}f"
    return f"{q2:{f}} [{q1:{f}}, {q3:{f}}] ({min(xs):{f}}-{max(xs):{f}})"


def load_cell(load: float) -> str:
    """The 'other CPU load' cell, flagged above ``NOISY``."""
    return f"{load:.0%}" + (" (noisy)" if load > NOISY else "")


def verdict(met: bool) -> str:
    return "MET" if met else "NOT MET"


def noisy_warning(loads: Sequence[float]) -> list[str]:
    """A warning line when any row's other-process load exceeded ``NOISY``."""
    if not any(x > NOISY for x in loads):
        return []
    return [
        f"- WARNING: other processes used more than {NOISY:.0%} of the CPUs during a row "
        "(column 'other CPU load'); those figures are unreliable, rerun on an idle machine"
    ]


def write_report(text: str, out: Path | None, say: bool = True) -> None:
    """Write ``text`` to ``out`` atomically (parents created); no-op for None."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    if say:
        print(f"wrote {out}", flush=True)


def finish(lines: Sequence[str], out: Path | None) -> str:
    """Join a report's lines, print it and write it to ``out`` (if given)."""
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    write_report(text, out)
    return text


def target_line(name: str, ratio: float, target: float, what: str) -> str:
    """``- name: 1.62x what (target >= 1.5x) -> MET``."""
    return f"- {name}: {ratio:.2f}x {what} (target >= {target:g}x) -> {verdict(ratio >= target)}"


def targets_section(title: str, lines: Sequence[str], rows: Sequence[Loaded]) -> list[str]:
    """A report's verdicts: a blank line, ``## title``, ``lines`` (from ``target_line``)
    and the ``noisy_warning`` of the measured ``rows`` (each with ``other_load``)."""
    return ["", f"## {title}", "", *lines, *noisy_warning([r.other_load for r in rows])]


# -------------------------------------------------------- unattended, time-boxed runs
class SectionTimeout(BaseException):
    """Raised by ``SIGALRM`` when a section overruns (not an ``Exception``, so library
    code's ``except Exception`` cannot swallow it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise SectionTimeout()


@dataclass
class Section:
    """One part of a sectioned report; ``body`` holds what it has measured so far."""

    title: str
    status: str = "started, not finished (the run ended during this part)"
    body: list[str] = field(default_factory=list)


@dataclass
class SectionedReport:
    """A Markdown report of sections, rewritten to ``out`` whenever ``write`` is called,
    so a run cut short still leaves what it measured."""

    head: list[str]
    out: Path | None
    sections: list[Section] = field(default_factory=list)

    def write(self, finished: bool = False) -> str:
        lines = [*self.head, *([] if finished else ["**Partial: the run has not finished.**", ""])]
        for sec in self.sections:
            lines += [f"## {sec.title}", "", f"Status: {sec.status}.", "", *sec.body, ""]
        text = "\n".join(lines).rstrip() + "\n"
        write_report(text, self.out, say=False)
        return text


def run_section(
    report: SectionedReport,
    title: str,
    fn: Callable[[Section, float], None],
    slice_s: float,
    grace: float,
    budget_end: float,
    skip: str = "",
) -> str:
    """Run ``fn(section, deadline)`` in a time slice and record how it ended.

    The soft ``deadline`` (now + ``slice_s``, at most ``budget_end``) tells ``fn`` not to
    start work it cannot finish; ``SIGALRM`` interrupts it ``grace`` seconds later.
    An exception's traceback goes into the section; the report is rewritten before
    and after.

    Returns:
        ``"done"``, ``"skipped"`` (``skip`` given, or under 8 s of the budget left),
        ``"interrupted"`` or ``"failed"``.
    """
    import signal
    import traceback

    section = Section(title)
    report.sections.append(section)
    now = time.perf_counter()
    if skip or budget_end - now < 8.0:
        section.status = f"skipped: {skip or f'{budget_end - now:.1f} s of the time budget left'}"
        report.write()
        return "skipped"
    deadline = now + min(slice_s, budget_end - now)
    print(f"\n[{title}] {deadline - now:.0f} s slice", flush=True)
    report.write()  # a run that ends during this section still shows which one it was
    signal.signal(signal.SIGALRM, _on_alarm)
    outcome = "failed"
    try:
        signal.setitimer(signal.ITIMER_REAL, max(1.0, deadline - now + grace))
        try:
            fn(section, deadline)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        outcome, section.status = "done", f"done ({time.perf_counter() - now:.1f} s)"
    except SectionTimeout:
        outcome = "interrupted"
        section.status = (
            f"interrupted: over its slice ({deadline - now:.0f} s + {grace:.0f} s grace); the "
            "figures are what it measured before"
        )
    except Exception as err:
        section.status = f"failed: {type(err).__name__}: {str(err)[:500]}"
        tail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
        section.body += ["```", tail.rstrip()[-3000:], "```"]
        traceback.print_exc()
    print("\n".join(section.body), flush=True)
    report.write()
    return outcome


def warm_then_time(
    section: Section,
    step: Callable[[int], None],
    times: dict[str, list[float]],
    most: int,
    deadline: float,
    show: Callable[[bool], None],
) -> None:
    """Inside a section: ``step(0)`` untimed (its figures shown, ``show(True)``, until a
    timed one replaces them; ``times`` cleared after it), then ``step(i)`` and
    ``show(False)`` up to ``most`` times while another fits before ``deadline``."""
    start = time.perf_counter()
    step(0)
    cost = time.perf_counter() - start
    show(True)
    for t in times.values():
        t.clear()
    for i in range(most):
        if time.perf_counter() + cost > deadline:
            section.body.append(f"Stopped after {i} timed runs (at most {most}): no time for more.")
            return
        step(i)
        show(False)


def on_device(
    fn: Callable[[Section, float], None], device: torch.device
) -> Callable[[Section, float], None]:
    """``fn`` as a section of a device benchmark: a CUDA device's peak-memory counter
    reset before (so a section reports its own peak), memory released after."""
    import gc

    def section(sec: Section, deadline: float) -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            fn(sec, deadline)
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    return section


# ------------------------------------------------------------------ phase tables
Phases = dict[str, tuple[float, float]]
"""``{label path: (exclusive seconds per call, entries per call)}``, plus ``"wall"``."""


def profile_phases(call: Callable[[], object], calls: int) -> Phases:
    """Run ``call()`` ``calls`` times under ``torch.profiler`` (CPU) and read lmgym's labels.

    Returns:
        ``"wall"`` (profiled seconds per call), each label path without the
        ``lmgym.`` prefix (``"collect/act/decode/trunk"``: exclusive seconds, i.e.
        minus the labels nested in it) and ``"unlabelled"`` (wall minus all labels).
    """
    return profiled(call, calls)[0]


def profiled(call: Callable[[], object], calls: int) -> tuple[Phases, Any]:
    """``profile_phases`` and the profiler itself (its events, for op-level detail)."""
    from torch.profiler import ProfilerActivity, profile

    from lmgym.profiling import PREFIX, phase_times

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        wall = (time.perf_counter() - start) / calls
    out: Phases = {"wall": (wall, 1.0)}
    for path, t in phase_times(prof.events()).items():
        out[path.replace(PREFIX, "")] = (t.seconds / calls, t.calls / calls)
    out["unlabelled"] = (wall - sum(s for k, (s, _) in out.items() if k != "wall"), 0.0)
    return out, prof


def phase_table(
    columns: dict[str, Phases], notes: dict[str, dict[str, float]] | None = None
) -> list[str]:
    """Markdown: ``wall``, a row per label path (union over columns, in tree order with
    siblings in order of appearance), ``unlabelled``, each cell ``seconds (share of
    wall) [entries per call]``; then a row per note (``notes``: column -> {note: value})."""
    seen = list(dict.fromkeys(n for p in columns.values() for n in p))

    def key(path: str) -> list[int]:  # each ancestor's first appearance, outermost first
        labels = path.split("/")
        prefixes = ("/".join(labels[: i + 1]) for i in range(len(labels)))
        return [seen.index(x) if x in seen else len(seen) for x in prefixes]

    paths = sorted((n for n in seen if n not in ("wall", "unlabelled")), key=key)
    rows = []
    for name in ["wall", *paths, "unlabelled"]:
        cells = []
        for phases in columns.values():
            sec, calls = phases.get(name, (0.0, 0.0))
            share = "" if name == "wall" else f" ({sec / phases['wall'][0]:.0%})"
            count = f" [{calls:.0f}]" if calls > 1.5 else ""
            cells.append(f"{sec:.3f}{share}{count}" if name in phases else "-")
        rows.append([name if name in ("wall", "unlabelled") else f"`{name}`", *cells])
    notes = notes or {}
    for note in dict.fromkeys(k for n in notes.values() for k in n):
        rows.append([f"*{note}*", *[f"{notes.get(c, {}).get(note, 0.0):.2f}" for c in columns]])
    return table(" | ".join(["phase (exclusive s per call)", *columns]), rows)


PHASE_NOTE = (
    "Exclusive seconds per call under `torch.profiler`, read from the labels lmgym places "
    "in its own code (`lmgym.profiling`): a path `a/b` is label `b` entered inside `a`, "
    "and each row excludes the labels nested in it, so the rows add up to 'wall' "
    "('unlabelled': the rest). (share of the call) [entries per call]. The profiler's own "
    "cost per op inflates every row a little."
)


def phase_section(
    title: str,
    note: str,
    columns: dict[str, Phases],
    notes: dict[str, dict[str, float]] | None = None,
) -> list[str]:
    """A report section: ``## title``, ``note`` + ``PHASE_NOTE`` and the ``phase_table``
    (nothing when no column was profiled)."""
    if not columns:
        return []
    return ["", f"## {title}", "", f"{note} {PHASE_NOTE}", "", *phase_table(columns, notes)]
