"""A forked tool worker's memory bound: what a call may add, however it allocates.

A forked worker inherits its parent's heap, free chunks included, and a tool that
allocates in pieces reuses them before it asks the kernel for more. A bound on the
address space alone (``RLIMIT_AS`` at fork plus the limit) therefore let a tool grow
through all the memory its parent had freed: a parent holding 1 GiB of freed
1 MiB blocks let ``while True: chunks.append(bytearray(1 << 20))`` take 1.1 GiB
under a 64 MiB limit, 17 s of copied pages on a busy machine. So the worker is bound
twice:

- **address space**: ``RLIMIT_AS`` at its size after fork plus the limit, so one
  large allocation fails at once, even inside C code;
- **resident anonymous memory**: at fork the inherited free heap is handed back to
  the kernel (glibc's ``malloc_trim``; reusing it then takes fresh pages) and the
  inherited objects are frozen out of the collector (``gc.freeze``: a collection
  would touch, and page in, every one of them); while a call runs, a CPU-time timer
  (``SIGPROF``, every ``CHECK_INTERVAL`` seconds of CPU) compares the resident
  anonymous memory with its size at fork and raises ``MemoryError`` in the tool once
  it has grown by more than the limit. After a call that leaves the worker over
  half the limit the heap is trimmed again, so memory a call freed does not count
  against the next.

Not bound: free space left inside the parent's ``pymalloc`` arenas (objects under
512 bytes), which the tool reuses without new pages; it is what the parent had
fragmented, not what the tool can grow to.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import signal
from collections.abc import Callable, Iterator
from types import FrameType

CHECK_INTERVAL = 0.005  # seconds of the worker's CPU time between checks


def _address_space() -> int:
    """This process's virtual memory size in bytes (``/proc``; 0 where unknown)."""
    return _statm()[0]


def _anonymous_resident() -> int:
    """This process's resident memory not backed by a file, in bytes (``/proc``;
    0 where unknown): what allocations take, not the libraries paged in."""
    _, resident, shared = _statm()
    return resident - shared


def _statm() -> tuple[int, int, int]:
    """``/proc/self/statm``'s size, resident and shared (file-backed) memory in bytes,
    read once; zeros where unknown."""
    try:
        with open("/proc/self/statm") as f:
            pages = [int(field) for field in f.read().split()[:3]]
    except (OSError, ValueError):
        return 0, 0, 0
    if len(pages) < 3:
        return 0, 0, 0
    size = os.sysconf("SC_PAGE_SIZE")
    return pages[0] * size, pages[1] * size, pages[2] * size


def _heap_trimmer() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)`` (free heap pages back to the kernel), or nothing
    where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


class WorkerMemoryLimit:
    """The memory bound of a forked worker; build it in the worker, once, in the
    main thread (it sets a rlimit and a signal handler).

    Args:
        limit: bytes a call may add (> 0).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._trim = _heap_trimmer()
        gc.freeze()
        self._trim()
        address_space = _address_space() + limit
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            address_space = min(address_space, hard)
        resource.setrlimit(resource.RLIMIT_AS, (address_space, hard))
        self._baseline = _anonymous_resident()
        signal.signal(signal.SIGPROF, self._check)

    def _check(self, signum: int, frame: FrameType | None) -> None:
        if _anonymous_resident() - self._baseline > self.limit:
            raise MemoryError(f"the call grew the worker by more than {self.limit} bytes")

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Check the resident memory while the body (one call) runs; trim after."""
        signal.setitimer(signal.ITIMER_PROF, CHECK_INTERVAL, CHECK_INTERVAL)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)

    def release(self) -> None:
        """Hand the heap's free pages back once the worker holds more than half the
        limit beyond its size at fork, so what a call freed is not counted against
        the next (checked, not done, after every call: a trim costs far more)."""
        if _anonymous_resident() - self._baseline > self.limit // 2:
            self._trim()
