"""Tool calls run in a worker process, each bounded in time and memory.

``ToolRunner(tools, time_limit=2.0, memory_limit_mb=256)`` keeps one worker process
(forked on the first call, so the tools need not be picklable; POSIX only). Each
call is sent to it over a pipe with its checked arguments, and

- **time**: the runner waits ``time_limit`` seconds for the answer; a call still
  running then is stopped by killing the worker (``SIGKILL``: a tool stuck in C
  code or a ``while True`` is stopped too), and the next call forks a fresh one.
- **memory**: a call may add ``memory_limit_mb`` to the worker, in address space
  (``RLIMIT_AS``) and in resident memory (checked while it runs, so memory the
  worker inherited free from its parent counts too: ``memory``); beyond that
  the tool gets ``MemoryError`` (the worker frees it and goes on), and a worker
  killed outright (the OOM killer, a crash) is reported as such and replaced.
- **size**: the result's text is cut to ``max_result_chars`` characters (the env
  also bounds what it appends by the row's token budget).

A call never raises for what the tool does: ``call`` answers a ``ToolResult``
whose ``error`` says what went wrong (the exception's type and message, the
time or memory limit; a tool that raises ``MemoryError`` itself reads as the limit), in words for the policy. The function's return value is
its text: a ``str`` as it is, anything else as JSON (``repr`` if JSON cannot hold
it). Calls from several threads take turns (a lock). The runner drops its
worker when pickled (a copy forks its own) and on ``close()``.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from lmgym.envs.tasks.multi_turn.tools.memory import WorkerMemoryLimit

DEFAULT_TIME_LIMIT = 2.0
DEFAULT_MEMORY_LIMIT_MB = 256
DEFAULT_MAX_RESULT_CHARS = 2000


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back.

    Attributes:
        text: the result as text (``""`` when ``error`` is set).
        error: ``None`` for a call that returned; else why it did not, e.g.
            ``"ZeroDivisionError: division by zero"``,
            ``"time limit: the call ran longer than 2 s"``.
        error_type: the exception's class name (``"MemoryError"``, ``"TimeLimit"``,
            ``"WorkerDied"``), ``None`` for a call that returned.
        message: the exception's message alone (``"division by zero"``), for a
            tool whose messages are written for the policy.
    """

    text: str
    error: str | None = None
    error_type: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        """The call returned."""
        return self.error is None


def result_text(value: Any) -> str:
    """A tool's return value as text: a string as is, else JSON (``repr`` if JSON
    cannot hold it)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _serve(
    conn: Connection, tools: Mapping[str, Callable[..., Any]], memory_limit: int, max_chars: int
) -> None:
    """The worker's loop: run each ``(name, arguments)`` it is sent, answer a
    ``(text, error, error_type)`` tuple; stop at ``None`` or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops us
    bound = WorkerMemoryLimit(memory_limit) if memory_limit > 0 else None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        name, arguments = message
        try:
            with bound.watching() if bound is not None else contextlib.nullcontext():
                value = tools[name](**arguments)
            answer: tuple[str, ...] | tuple[str, None, None, None] = (
                result_text(value)[:max_chars],
                None,
                None,
                None,
            )
        except MemoryError:
            limit = f"memory limit: the call needed more than {memory_limit >> 20} MB"
            answer = ("", limit, "MemoryError", limit)
        except Exception as err:  # the tool's fault, reported to the policy
            kind = type(err).__name__
            answer = ("", f"{kind}: {err}"[:max_chars], kind, str(err)[:max_chars])
        value = None  # free it before answering
        if bound is not None:
            bound.release()
        try:
            conn.send(answer)
        except (OSError, ValueError):
            return


class ToolRunner:
    """Runs tool functions in a forked worker, each call bounded (module docstring).

    Args:
        tools: name -> function.
        time_limit: seconds a call may take (> 0).
        memory_limit_mb: address space a call may add to the worker, in MiB
            (0: no limit).
        max_result_chars: the most characters of a result (or error) kept.

    Raises:
        ValueError: a limit out of range (the message names it).
    """

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]],
        time_limit: float = DEFAULT_TIME_LIMIT,
        memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        if not time_limit > 0:
            raise ValueError(f"time_limit={time_limit!r}: must be > 0 seconds")
        if not isinstance(memory_limit_mb, int) or memory_limit_mb < 0:
            raise ValueError(
                f"memory_limit_mb={memory_limit_mb!r}: must be an integer >= 0 (0: none)"
            )
        if not isinstance(max_result_chars, int) or max_result_chars < 1:
            raise ValueError(f"max_result_chars={max_result_chars!r}: must be an integer >= 1")
        self.tools = dict(tools)
        self.time_limit = float(time_limit)
        self.memory_limit_mb = memory_limit_mb
        self.max_result_chars = max_result_chars
        self._pid: int | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # one call at a time on the worker's pipe

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pid"] = state["_conn"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _alive(self) -> bool:
        if self._pid is None:
            return False
        try:
            pid, _ = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def _start(self) -> Connection:
        if self._conn is not None and self._alive():
            return self._conn
        self._stop()
        parent, child = multiprocessing.Pipe()
        # os.fork rather than multiprocessing.Process: a daemonic process (a
        # Gymnasium AsyncVectorEnv worker) may not start multiprocessing children.
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                parent.close()
                _serve(child, self.tools, self.memory_limit_mb << 20, self.max_result_chars)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        child.close()
        self._pid, self._conn = pid, parent
        return parent

    def _stop(self) -> None:
        pid, conn = self._pid, self._conn
        self._pid = self._conn = None
        if conn is not None:
            conn.close()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run tool ``name`` on ``arguments`` (already checked) within the limits.

        Raises:
            KeyError: no tool of that name (a parser's job to refuse it first).
        """
        if name not in self.tools:
            raise KeyError(f"no tool named {name!r}; the tools are {sorted(self.tools)}")
        with self._lock:
            return self._call(name, arguments)

    def _call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        conn = self._start()
        try:
            conn.send((name, dict(arguments)))
            ready = conn.poll(self.time_limit)
            answer = conn.recv() if ready else None
        except (EOFError, OSError):
            self._stop()
            died = "the tool's worker died (out of memory or crashed)"
            return ToolResult("", died, "WorkerDied", died)
        if answer is None:
            self._stop()
            late = f"time limit: the call ran longer than {self.time_limit:g} s"
            return ToolResult("", late, "TimeLimit", late)
        return ToolResult(*answer)

    def close(self) -> None:
        """Stop the worker (a later call forks a new one)."""
        with self._lock:
            self._stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop()
