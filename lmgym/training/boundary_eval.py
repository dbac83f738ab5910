"""The evaluations at the start and the end of a training session: announced, timed, recorded.

On a real model an evaluation takes a minute; run silently it looks like a hang.
``BoundaryEval`` says what it is about to evaluate before it starts, prints the
summary with the time it took, and appends the result to the run's ``eval.jsonl``
with ``"at": "start"`` or ``"end"`` (periodic evaluations have no ``"at"``), so the
before/after figures are on disk and not only on the terminal.

Both use the seed ``derived_seed(seed, iteration, 0)`` and their own env and
generator, so they never move the training streams; a resumed session's start
evaluation equals the previous session's end evaluation at that iteration (same
weights, same seed). So a resume does not run it again: when ``eval.jsonl`` holds
an end record at the checkpoint's iteration with the same prompts and samples, that
result is the start record (a minute saved per resume on a real model).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Literal

from lmgym.agents.base import Agent
from lmgym.persistence.atomic import complete_lines
from lmgym.training.callbacks import Printer
from lmgym.training.evaluation import EvalResult, HeldOut
from lmgym.training.run import RunDirectory
from lmgym.training.suspect import SuspectWatch

Boundary = Literal["start", "end"]


class BoundaryEval:
    """Evaluate a session's policy at its start or end, saying so and recording it.

    Args:
        held_out: what to evaluate on (``evaluation.HeldOut``).
        run: where to append ``eval.jsonl`` (``None``: nowhere).
        out: where the lines go.
        watch: the run's suspect-result warnings: the start evaluation is their
            baseline, the end one is checked against it (``None``: none).
    """

    def __init__(
        self,
        held_out: HeldOut,
        run: RunDirectory | None,
        out: Printer,
        watch: SuspectWatch | None = None,
    ) -> None:
        self.held_out, self.run, self.out, self.watch = held_out, run, out, watch

    def _recorded_end(self, iteration: int) -> EvalResult | None:
        """The end evaluation ``eval.jsonl`` holds at ``iteration`` with these settings."""
        if self.run is None:
            return None
        for line in reversed(complete_lines(self.run.eval_path)):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("iteration") != iteration or record.get("at") != "end":
                continue
            fields = {f.name for f in dataclasses.fields(EvalResult)}
            data = {k: v for k, v in record.items() if k in fields}
            data["samples"] = [tuple(sample) for sample in data.get("samples", [])]
            result = EvalResult(**data)
            held_out = self.held_out
            same = (result.num_prompts, result.samples_per_prompt, result.split) == (
                held_out.num_prompts,
                held_out.env.group_size,
                held_out.split,
            )
            return result if same else None
        return None

    def __call__(self, agent: Agent, at: Boundary) -> EvalResult:
        """Evaluate ``agent.policy`` now; ``at`` says which end of the session this is."""
        which = "before" if at == "start" else "after"
        recorded = self._recorded_end(agent.iteration) if at == "start" else None
        if recorded is not None:
            self.out(
                f"eval before: {recorded.summary()} (the end evaluation of the session before, "
                "from eval.jsonl)"
            )
            self._append(agent, at, recorded)
            self._watch(agent, at, recorded)
            return recorded
        self.out(
            f"evaluating {which} training (iteration {agent.iteration}): "
            f"{self.held_out.num_prompts} prompts x {self.held_out.env.group_size} samples, "
            f"split {self.held_out.split} ..."
        )
        start = time.perf_counter()
        result = self.held_out.evaluate(agent.policy, agent.iteration, stream=0)
        self.out(f"eval {which}: {result.summary()} in {time.perf_counter() - start:.1f} s")
        self._append(agent, at, result)
        self._watch(agent, at, result)
        return result

    def _watch(self, agent: Agent, at: Boundary, result: EvalResult) -> None:
        if self.watch is None:
            return
        if at == "start":
            self.watch.baseline(result)
        else:
            self.watch.check_eval(agent, result)

    def _append(self, agent: Agent, at: Boundary, result: EvalResult) -> None:
        if self.run is not None:
            self.run.append_jsonl(
                RunDirectory.EVAL, {"iteration": agent.iteration, "at": at, **result.to_json()}
            )
