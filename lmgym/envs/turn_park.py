"""Parked rows: a multi-turn env's step that does not wait for slow responder calls.

With ``responder_park_after`` set (an autoreset env, a concurrent responder:
``lmgym.envs.turn_calls``), ``TokenVectorEnv.step`` answers ended turns through a
``ParkedTurns`` instead of waiting for every call:

1. each row whose policy turn ended this step gets its call started in the
   background (``ResponderCaller.submit``), one call per row;
2. the step waits at most ``park_after`` seconds for those calls, then looks at
   every call in flight, this step's and earlier ones';
3. the rows whose call has answered (or run past ``responder_timeout``) are
   answered exactly as a waiting step answers them (``TurnStepper.answered``:
   observation appended, turn reward, episode ends, the timeout's outcome), in
   row order; the others are *parked*: ``waiting`` on the env's rows. A parked
   row writes nothing and ignores its actions; the env commits its call with the
   step and looks again on the next one.

When every row would be parked, no row could act on the next step: the step then
waits until one call answers (or turns late), so a loop over ``step`` never spins.

A parked row's turn reward (and, if its episode ends, the reward model's score or
the unfinished penalty) comes on the step that answers it, not on the step its
stop id was written; ``ContinuousCollector`` books it on the stop id's column, as
a waiting step would have. A call that raises, or turns late under
``on_responder_timeout="raise"``, raises when a step finds it (the env left as it
was, the row still parked with the same call: every later step raises the same
until the row is reset).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lmgym.envs.turn_calls import RUNNING, PendingCall
from lmgym.envs.turn_step import TurnStep, TurnStepper


class Parked(NamedTuple):
    """A parking step's outcome.

    Attributes:
        turn: what the answered rows change (``TurnStep``), the capped rows included.
        calls: the calls still in flight, by env row.
        waiting: ``[N] bool`` the rows those calls park.
    """

    turn: TurnStep
    calls: dict[int, PendingCall]
    waiting: Tensor


class ParkedTurns:
    """Answers a step's ended turns without waiting for the slow calls.

    Args:
        stepper: The env's ``TurnStepper`` (its caller must be concurrent).
        park_after: Seconds a step waits for the calls it starts.
    """

    def __init__(self, stepper: TurnStepper, park_after: float) -> None:
        self.stepper = stepper
        self.park_after = park_after

    def respond(
        self,
        rows_state: Any,
        states: tuple[Any, ...],
        ended: Tensor,
        calls: Mapping[int, PendingCall],
    ) -> Parked:
        """Start the calls of the rows in ``ended`` (``[N] bool``), answer every row
        whose call is back, park the rest.

        Args:
            rows_state: The env's rows after this step's tokens; ``waiting`` holds the
                rows parked before this step (the keys of ``calls``).
            states: The ``N`` responder states before this step.
            ended: ``[N] bool`` rows whose action this step was a stop id.
            calls: The calls in flight before this step, by env row. Not edited.

        Raises:
            ResponderError: a call that is back raised or answered unusably.
            ResponderTimeout: a call ran late under ``on_responder_timeout="raise"``.
        """
        stepper = self.stepper
        caller = stepper.caller
        pending = dict(calls)
        started = ended.nonzero().squeeze(1)
        if started.numel() > 0:
            row_list = started.tolist()
            turns = stepper.turn_input(rows_state, states, started)
            fresh = caller.submit(turns, row_list)
            pending.update(zip(row_list, fresh, strict=True))
            wait([c.future for c in fresh], timeout=self.park_after)
        outcomes = self._outcomes(pending, ended.numel())
        back = sorted(row for row, result in outcomes.items() if result is not RUNNING)
        left = {row: pending[row] for row in pending if outcomes[row] is RUNNING}
        waiting = torch.zeros_like(ended)
        if left:
            waiting[list(left)] = True
        if not back:
            return Parked(
                stepper.answered(rows_state, states, ended, started[:0], None), left, waiting
            )
        rows = torch.tensor(back, dtype=torch.long, device=ended.device)
        turns = stepper.turn_input(rows_state, states, rows)
        answers = caller.assemble([outcomes[row] for row in back], turns, back)
        return Parked(stepper.answered(rows_state, states, ended, rows, answers), left, waiting)

    def _outcomes(self, pending: dict[int, PendingCall], n: int) -> dict[int, Any]:
        """Each call's outcome (``RUNNING`` while it runs within its time); when all
        ``n`` rows would be parked, after waiting for the first to answer or turn late."""
        timeout = self.stepper.caller.timeout
        while True:
            now = time.monotonic()
            outcomes = {row: call.outcome(timeout, now) for row, call in pending.items()}
            if len(pending) < n or any(r is not RUNNING for r in outcomes.values()):
                return outcomes
            deadlines = [c.deadline(timeout) for c in pending.values()]
            soonest = None if timeout is None else min(deadlines) - now  # type: ignore[type-var]
            wait(
                [c.future for c in pending.values()],
                timeout=None if soonest is None else max(soonest, 0.0) + 1e-3,
                return_when=FIRST_COMPLETED,
            )


__all__ = ["Parked", "ParkedTurns"]
