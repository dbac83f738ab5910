"""How many torch CPU threads a run uses: ``--threads N``, or ``--threads 0`` to choose.

Measured (issue 25): on a busy 2-core machine, ``--threads 2`` made a 135M-parameter
model's iterations 10-20x slower than ``--threads 1`` (a rollout 24.6 s instead of
1.0 s). Torch's intra-op threads spin-wait for each other; when another process
holds one of the cores, every parallel op waits for the slowest thread. And the
built-in tiny GPT-2 is fastest on one thread whatever the machine. So the default
stays 1 thread, which is also what makes runs reproducible to the last digit
(another thread count sums floats in another order).

``--threads 0`` chooses from the machine (``auto_threads``): 1 when a process has
at most 2 cores, or when the 1-minute load average leaves fewer than 2 cores idle;
otherwise the idle cores, at most ``MAX_AUTO_THREADS``. The choice is made once
when the run starts, printed, and recorded in ``config.json`` (a resume keeps it).
"""

from __future__ import annotations

import os

MAX_AUTO_THREADS = 8
"""More intra-op threads than this rarely pays off for the models lmgym trains on CPU."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, or ``None`` where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def auto_threads(
    cores: int | None = None, load: float | None = None, processes: int = 1
) -> tuple[int, str]:
    """``(threads, why)``: the thread count ``--threads 0`` chooses (module docstring).

    Args:
        cores: usable cores (default: ``usable_cores()``).
        load: the 1-minute load average (default: ``load_average()``); ignored when
            ``processes > 1`` (ranks reading it at different moments could disagree).
        processes: processes of this run on the machine (data parallel), sharing the cores.
    """
    cores = usable_cores() if cores is None else cores
    own = cores // max(processes, 1)
    if own <= 2:
        return (
            1,
            f"{cores} cores for {processes} process(es): more threads would wait on each other",
        )
    if processes > 1:
        return min(own, MAX_AUTO_THREADS), f"{cores} cores / {processes} processes"
    load = load_average() if load is None else load
    idle = own if load is None else int(cores - load)
    if idle < 2:
        return 1, f"{cores} cores, load average {load:.1f}: the cores are busy"
    reason = f"{cores} cores" + ("" if load is None else f", load average {load:.1f}")
    return min(idle, MAX_AUTO_THREADS), reason
