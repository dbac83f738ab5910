"""How a multi-turn env calls its responder: batched, or per row concurrently.

A responder that declares nothing is called as it always was: ``respond`` once per
step, batched over the rows that ended a turn, on the env's thread, no timeout.

A *concurrent* responder (``respond`` is ``async def``, or the responder has
``thread_safe = True``) is called once per row, every row's call at the same time:

- ``async def respond``: the calls are gathered on an event loop the caller keeps
  on a daemon thread of its own (made on first use, so that ``step`` works from
  inside a running loop too, and an async client bound to that loop lives across
  steps); a late call is cancelled.
- ``thread_safe = True``: each call runs on a daemon thread of a pool the caller
  keeps (an idle thread reused, else a new one: a call never waits for a thread);
  a late call cannot be stopped, it runs on (holding its thread) and its answer is
  dropped.

Each call has ``timeout`` seconds (``None``: no limit) counted from its own start.
The answers are put together in row order, whatever order they came in, so the
step does not depend on the calls' timing. ``on_timeout`` says what a late call
means: ``"penalty"``, the caller marks the row ``timed_out`` (the env ends its
episode as a cut-off one, ``lmgym.envs.turn_step``); ``"raise"``, a
``ResponderTimeout`` naming every late row. A call that raises is a
``ResponderError`` naming its row (raised once every call has answered or timed
out, the lowest such row first), so the env stays as it was.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from lmgym.envs.turns import (
    EpisodeStart,
    Responder,
    ResponderError,
    ResponderTimeout,
    TurnInput,
    TurnOutput,
)

OnTimeout = Literal["penalty", "raise"]

#: The ``TurnOutput`` fields that hold one value per row.
ROW_FIELDS = ("observations", "rewards", "done", "states")


def is_concurrent(responder: object) -> bool:
    """Whether ``responder`` is called per row, concurrently: an ``async def respond``
    or ``thread_safe = True``."""
    respond = getattr(responder, "respond", None)
    return inspect.iscoroutinefunction(respond) or getattr(responder, "thread_safe", False) is True


def call_failed(name: str, method: str, err: Exception, rows: str) -> ResponderError:
    """The error of responder ``name``'s ``method()`` call that raised ``err``, saying
    what the call was doing with which env rows (``rows``: "answering env row 3")."""
    return ResponderError(
        f"responder {name!r}: {method}() raised {type(err).__name__}: {err} ({rows})"
    )


def check_answer_shape(answer: object, row_list: list[int], where: str) -> TurnOutput:
    """``answer`` after checking it is a ``TurnOutput`` with one value per row in
    each field (``truncated`` may be ``None``).

    Raises:
        ResponderError: naming ``where`` (the responder and call) and the env rows.
    """
    if not isinstance(answer, TurnOutput):
        raise ResponderError(
            f"{where} returned a {type(answer).__name__}; return a TurnOutput (lmgym.envs.turns)"
        )
    k = len(row_list)
    fields = ROW_FIELDS if answer.truncated is None else (*ROW_FIELDS, "truncated")
    for field in fields:
        values = getattr(answer, field)
        size = len(values) if hasattr(values, "__len__") else None
        if size != k:
            raise ResponderError(
                f"{where} answered {size} {field} for {k} rows (env rows {row_list}); "
                "return one per row, in TurnInput's order"
            )
    return answer


@dataclass(frozen=True)
class Answers:
    """The answers to ``k`` rows, in row order.

    Attributes:
        output: a ``TurnOutput`` of ``k`` rows, checked for shape; a timed-out row
            holds a placeholder (no observation, reward 0, not done, its old state).
        timed_out: ``k`` bools, the row's call ran past the timeout (only under
            ``on_timeout="penalty"``; ``"raise"`` raises instead).
    """

    output: TurnOutput
    timed_out: list[bool]


def row_input(turns: TurnInput, j: int) -> TurnInput:
    """Row ``j`` of ``turns`` as a ``TurnInput`` of one row."""
    return TurnInput(
        rows=turns.rows[j : j + 1],
        prompts=[turns.prompts[j]],
        prompt_index=turns.prompt_index[j : j + 1],
        columns={name: [values[j]] for name, values in turns.columns.items()},
        turn_texts=[turns.turn_texts[j]],
        turn_ids=[turns.turn_ids[j]],
        turn_index=turns.turn_index[j : j + 1],
        states=[turns.states[j]],
    )


class _Late:
    """The marker of a call that ran past its timeout."""


_LATE = _Late()


class _LoopThread:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="lmgym-responder-loop", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Awaitable[Any]) -> Any:
        """Run ``coroutine`` on the loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()  # type: ignore[arg-type]


class ResponderCaller:
    """Calls one responder's ``start`` and ``respond`` the way it asks to be called.

    Args:
        responder: The responder.
        name: Its name, for errors.
        timeout: Seconds each concurrent call may take; ``None``: no limit.
        on_timeout: ``"penalty"`` or ``"raise"`` (the module docstring).

    Raises:
        ValueError: a ``timeout`` for a responder that is not concurrent (the call
            would have to run on another thread, which a responder that is not
            thread-safe does not allow), or a bad ``timeout``/``on_timeout``.
    """

    def __init__(
        self,
        responder: Responder,
        name: str,
        *,
        timeout: float | None = None,
        on_timeout: OnTimeout = "penalty",
    ) -> None:
        self.responder = responder
        self.name = name
        self.concurrent = is_concurrent(responder)
        self.is_async = inspect.iscoroutinefunction(getattr(responder, "respond", None))
        if timeout is not None and not self.concurrent:
            raise ValueError(
                f"responder_timeout={timeout}: responder {name!r} is called once per step on "
                "the env's thread and cannot be timed out; make its respond 'async def' or "
                "set thread_safe = True on it (the env then calls it per row, concurrently), "
                "or leave responder_timeout None"
            )
        if on_timeout not in ("penalty", "raise"):
            raise ValueError(
                f"on_responder_timeout={on_timeout!r} is not one of ['penalty', 'raise']"
            )
        self.timeout = timeout
        self.on_timeout = on_timeout
        self._loop: _LoopThread | None = None
        self._pool: DaemonPool | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (or deep-copied) without its event loop and threads; a copy makes its own."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_loop", "_pool", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._loop, self._pool, self._lock = None, None, threading.Lock()

    def _run(self, coroutine: Awaitable[Any]) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
        return self._loop.run(coroutine)

    def _threads(self) -> DaemonPool:
        """The pool the calls of a ``thread_safe`` responder run on (made on first use;
        its idle threads are reused, so a step does not start a thread per call)."""
        with self._lock:
            if self._pool is None:
                self._pool = DaemonPool("lmgym-responder")
        return self._pool

    # ------------------------------------------------------------------ start
    def start(self, episodes: EpisodeStart) -> list[Any]:
        """``responder.start(episodes)`` as a list (awaited on the loop if async)."""
        result = self.responder.start(episodes)
        if inspect.isawaitable(result):
            result = self._run(result)
        return list(result)

    # ---------------------------------------------------------------- respond
    def respond(self, turns: TurnInput, row_list: list[int]) -> Answers:
        """The answers to the ``k`` rows of ``turns`` (env rows ``row_list``).

        Raises:
            ResponderError: a call raised or answered the wrong shape.
            ResponderTimeout: a call ran late under ``on_timeout="raise"``.
        """
        if not self.concurrent:
            try:
                answer = self.responder.respond(turns)
            except Exception as err:
                raise call_failed(
                    self.name, "respond", err, f"answering env rows {row_list}"
                ) from err
            where = f"responder {self.name!r}: respond()"
            return Answers(check_answer_shape(answer, row_list, where), [False] * len(row_list))
        inputs = [row_input(turns, j) for j in range(len(row_list))]
        if self.is_async:
            results = self._run(self._gather(inputs))
        else:
            results = _threaded(self._threads(), self.responder.respond, inputs, self.timeout)
        return self.assemble(results, turns, row_list)

    async def _one(self, turn: TurnInput) -> Any:
        """One async call: its answer, the exception it raised, or ``_LATE``."""
        try:
            return await asyncio.wait_for(self.responder.respond(turn), self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return _LATE
        except Exception as err:  # reported by row, after every call is back
            return err

    async def _gather(self, inputs: list[TurnInput]) -> list[Any]:
        return list(await asyncio.gather(*(self._one(t) for t in inputs)))

    def submit(self, turns: TurnInput, row_list: list[int]) -> list[PendingCall]:
        """Start a call per row of ``turns`` (env rows ``row_list``) and return at once:
        one ``PendingCall`` per row, in row order (a concurrent responder only; the
        env parks the rows whose call is still running, ``lmgym.envs.turn_park``)."""
        if not self.concurrent:
            raise ValueError(
                f"responder {self.name!r}: only a concurrent responder (async def respond, "
                "or thread_safe = True) can be called in the background"
            )
        calls = [PendingCall() for _ in row_list]
        inputs = [row_input(turns, j) for j in range(len(row_list))]
        if self.is_async:
            with self._lock:
                if self._loop is None:
                    self._loop = _LoopThread()
            for call, turn in zip(calls, inputs, strict=True):
                call.future = asyncio.run_coroutine_threadsafe(self._one(turn), self._loop.loop)
        else:
            pool = self._threads()
            for call, turn in zip(calls, inputs, strict=True):
                pool.submit(_run_call, call, self.responder.respond, turn)
        return calls

    def assemble(self, results: list[Any], turns: TurnInput, row_list: list[int]) -> Answers:
        """The per-row results (answers, exceptions, ``_LATE``) as one ``Answers``.

        Raises:
            ResponderError: a call raised (the lowest such row named) or answered the
                wrong shape.
            ResponderTimeout: a call ran late under ``on_timeout="raise"``.
        """
        for row, result in zip(row_list, results, strict=True):
            if isinstance(result, Exception):
                raise call_failed(
                    self.name, "respond", result, f"answering env row {row}"
                ) from result
        late = [row for row, result in zip(row_list, results, strict=True) if result is _LATE]
        if late and self.on_timeout == "raise":
            raise ResponderTimeout(
                f"responder {self.name!r}: respond() did not answer env row(s) {late} within "
                f"responder_timeout={self.timeout} s; raise the timeout, or pass "
                "on_responder_timeout='penalty' to end those episodes as cut off instead"
            )
        parts: list[TurnOutput] = []
        for j, (row, result) in enumerate(zip(row_list, results, strict=True)):
            if result is _LATE:
                result = TurnOutput([None], [0.0], [False], [turns.states[j]])
            where = f"responder {self.name!r}: respond() for env row {row}"
            parts.append(check_answer_shape(result, [row], where))
        truncated = None
        if any(p.truncated is not None for p in parts):
            truncated = [bool(p.truncated[0]) if p.truncated is not None else False for p in parts]
        output = TurnOutput(
            observations=[p.observations[0] for p in parts],
            rewards=[p.rewards[0] for p in parts],
            done=[p.done[0] for p in parts],
            states=[p.states[0] for p in parts],
            truncated=truncated,
        )
        return Answers(output, [result is _LATE for result in results])


class PendingCall:
    """One row's responder call running in the background (``ResponderCaller.submit``).

    Attributes:
        future: resolves to the call's answer, the exception it raised, or
            ``_LATE`` (an async call cancelled at its timeout).
        started: ``time.monotonic()`` when the call began (when it was submitted,
            until its thread picks it up).
        took: seconds a threaded call ran, once it finished (``None`` for an async
            call, whose timeout the event loop enforces).
    """

    def __init__(self) -> None:
        self.future: Future[Any] = Future()
        self.started = time.monotonic()
        self.took: float | None = None

    def outcome(self, timeout: float | None, now: float) -> Any:
        """The call's result (answer or exception), ``_LATE`` if it ran past
        ``timeout`` seconds from its start, or ``RUNNING``."""
        if self.future.done():
            if timeout is not None and self.took is not None and self.took > timeout:
                return _LATE  # finished, after its deadline
            return self.future.result()
        if timeout is not None and now - self.started > timeout:
            return _LATE
        return RUNNING

    def deadline(self, timeout: float | None) -> float | None:
        """When the call turns late (``time.monotonic()``), or ``None``: never."""
        return None if timeout is None else self.started + timeout


class _Running:
    """The marker of a call still running, within its time."""


RUNNING = _Running()


def _run_call(call: PendingCall, respond: Callable[[TurnInput], Any], turn: TurnInput) -> None:
    """Run ``respond(turn)`` on a pool thread, timed, into ``call`` (never raises)."""
    call.started = begun = time.monotonic()
    try:
        result = respond(turn)
    except Exception as err:  # reported by row when the env collects it
        result = err
    call.took = time.monotonic() - begun
    call.future.set_result(result)


class DaemonPool:
    """Daemon threads that run submitted calls, an idle one reused, else a new one
    started: a call never waits for a thread, and a call that never returns holds
    its own thread only (never the interpreter's exit: the threads are daemons)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0
        self.threads = 0

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on a thread of the pool (``fn`` must not raise)."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # that thread takes this call
            else:
                self.threads += 1
                name = f"{self.name}-{self.threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._tasks.put((fn, args))

    def _work(self) -> None:
        while True:
            fn, args = self._tasks.get()
            fn(*args)
            with self._lock:
                self._idle += 1


def _threaded(
    pool: DaemonPool,
    call: Callable[[TurnInput], Any],
    inputs: Sequence[TurnInput],
    timeout: float | None,
) -> list[Any]:
    """``call(x)`` for every ``x`` on ``pool``'s threads; per input, its answer, the
    exception it raised, or ``_LATE`` if it ran past ``timeout`` seconds from its start."""
    results: list[Any] = [_LATE] * len(inputs)
    finished = [threading.Event() for _ in inputs]
    started: list[float | None] = [None] * len(inputs)
    took = [float("inf")] * len(inputs)

    def work(j: int) -> None:
        started[j] = begun = time.monotonic()
        try:
            results[j] = call(inputs[j])
        except Exception as err:
            results[j] = err
        finally:
            took[j] = time.monotonic() - begun
            finished[j].set()

    for j in range(len(inputs)):
        pool.submit(work, j)
    out: list[Any] = []
    for j, event in enumerate(finished):
        while not event.is_set():
            begun = started[j]
            if timeout is None:
                event.wait()
            elif begun is None:  # its thread has not picked it up yet: no clock yet
                event.wait(0.01)
            elif not event.wait(max(0.0, begun + timeout - time.monotonic())):
                break
        # A call that finished after its deadline is late however soon this thread
        # looked: the outcome is the call's duration against the timeout.
        on_time = event.is_set() and (timeout is None or took[j] <= timeout)
        out.append(results[j] if on_time else _LATE)
    return out


__all__ = [
    "RUNNING",
    "Answers",
    "OnTimeout",
    "PendingCall",
    "ResponderCaller",
    "check_answer_shape",
    "is_concurrent",
    "row_input",
]
