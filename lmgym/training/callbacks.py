"""Callbacks for ``Agent.learn``: early stopping, periodic evaluation, samples, logging, checkpoints.

Any ``callback(agent, metrics) -> bool | None`` works with ``Agent.learn``
(``False`` stops). ``TrainingCallback`` adds the optional hooks ``learn`` calls
(``on_learn_start``, ``on_learn_end``) and ``state_dict`` / ``load_state_dict``,
which the run's checkpoints save and restore so a resumed run's callbacks carry on
where they were (e.g. the early-stop window).

Order matters: a callback may add entries to ``metrics`` (``PeriodicEval`` adds
``eval/*``), which later callbacks in the list see (``MetricsLogger`` logs them).
The ``Trainer`` uses: PeriodicEval, EarlyStopAtThreshold, MetricsLogger,
SamplePrinter, the user's callbacks, CheckpointCallback.

Evaluation and sampling here use their own env and generator (seeded from the
run's seed and the iteration), so they never change what the training run draws:
a run is the same with or without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stable_baselines3.common.logger import Logger

from lmgym.agents.base import Agent
from lmgym.agents.callbacks import CALLBACK_PROTOCOL, check_callback  # noqa: F401 (re-exported)
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.persistence.agent import rank_state
from lmgym.rollout import collect
from lmgym.training.checkpoint import CheckpointManager
from lmgym.training.evaluation import EvalResult, HeldOut, derived_seed
from lmgym.training.logger import record_metrics
from lmgym.training.pace import Pace
from lmgym.training.ranks import Ranks
from lmgym.training.run import RunDirectory
from lmgym.training.sample_text import episode_texts, prompt_label, sample_line
from lmgym.typed_values import check_at_least

Printer = Callable[[str], None]


def tqdm_print(text: str) -> None:
    """Print a line without tearing a tqdm progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(text)


class TrainingCallback:
    """Base class: a callable with optional start/end hooks and checkpointable state.

    Attributes:
        state_key: the name its state is saved under in a checkpoint.
    """

    state_key = "callback"

    def on_learn_start(self, agent: Agent) -> None:
        """Called once before the first iteration of ``learn``."""

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        """Called after every iteration; return ``False`` to stop."""
        return None

    def on_learn_end(self, agent: Agent, history: list[dict[str, float]]) -> None:
        """Called once after the last iteration (not after an exception)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this callback."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s output."""


class EarlyStopAtThreshold(TrainingCallback):
    """Stop when the mean ``reward_mean`` of the last ``window`` iterations reaches ``threshold``.

    Args:
        threshold: e.g. the task's solved threshold (``TASKS[task].solved_threshold``).
        window: iterations in the rolling mean.
        key: the metric watched.
        out: where to print the stop message (``None``: silent).

    Attributes:
        solved_at: the iteration at which it stopped, or ``None``.
    """

    state_key = "early_stop"

    def __init__(
        self,
        threshold: float,
        window: int = 5,
        key: str = "reward_mean",
        out: Printer | None = tqdm_print,
    ) -> None:
        check_at_least("window", window)
        self.threshold, self.window, self.key, self.out = threshold, window, key, out
        self.recent: list[float] = []
        self.solved_at: int | None = None

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        self.recent = (self.recent + [metrics[self.key]])[-self.window :]
        if len(self.recent) == self.window:
            mean = sum(self.recent) / self.window
            if mean >= self.threshold - 1e-6:  # float32 metrics: 0.9 arrives as 0.89999998
                self.solved_at = agent.iteration
                if self.out is not None:
                    self.out(
                        f"early stop at iteration {agent.iteration}: mean {self.key} over the "
                        f"last {self.window} iterations is {mean:.3f} >= {self.threshold:g}"
                    )
                return False
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "solved_at": self.solved_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent = list(state["recent"])
        self.solved_at = state["solved_at"]


class PeriodicEval(TrainingCallback):
    """Every ``every`` iterations (or at a ``Pace``), evaluate the policy and add ``eval/*``
    to the metrics.

    Args:
        held_out: what to evaluate on (env, prompts, the run's seed, pass@k threshold,
            split); each evaluation derives its seed from the run's and the iteration.
        every: iterations between evaluations, or a ``Pace`` (iterations or wall time,
            whichever first: ``lmgym.training.pace``).
        run: where to append ``eval.jsonl`` (``None``: nowhere).
        out: where to print the one-line summary (``None``: silent).
        on_result: called with ``(agent, result)`` after each evaluation (the run's
            ``SuspectWatch``).

    Attributes:
        results: ``(iteration, EvalResult)`` of every evaluation so far.
    """

    state_key = "periodic_eval"

    def __init__(
        self,
        held_out: HeldOut,
        every: int | Pace,
        run: RunDirectory | None = None,
        out: Printer | None = tqdm_print,
        on_result: Callable[[Agent, EvalResult], None] | None = None,
    ) -> None:
        self.pace = _pace(every)
        self.every = self.pace.every
        self.held_out, self.run, self.out, self.on_result = held_out, run, out, on_result
        self.results: list[tuple[int, EvalResult]] = []

    def on_learn_start(self, agent: Agent) -> None:
        self.pace.start()

    def evaluate(self, agent: Agent) -> EvalResult:
        """Evaluate now (seeded by the iteration), without touching the training streams."""
        return self.held_out.evaluate(agent.policy, agent.iteration, stream=1)

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        if not self.pace.due(agent.iteration):
            return None
        result = self.evaluate(agent)
        self.results.append((agent.iteration, result))
        metrics.update(result.metrics())
        if self.run is not None:
            self.run.append_jsonl(
                RunDirectory.EVAL, {"iteration": agent.iteration, **result.to_json()}
            )
        if self.out is not None:
            self.out(f"[eval @ {agent.iteration}] {result.summary()}")
        if self.on_result is not None:
            self.on_result(agent, result)
        self.pace.done()
        return None


def _pace(every: int | Pace) -> Pace:
    """``every`` as a ``Pace`` (an int: every that many iterations, at least 1)."""
    if isinstance(every, Pace):
        if not every.active:
            raise ValueError("every: a Pace that is never due (every 0 and no seconds)")
        return every
    check_at_least("every", every)
    return Pace(every)


class SamplePrinter(TrainingCallback):
    """Every ``every`` iterations, print ``count`` sampled completions (and record them).

    Args:
        env: the env to sample from (e.g. the evaluation env).
        every: iterations between prints, or a ``Pace`` (iterations or wall time).
        count: completions printed.
        seed: the run's seed (each print derives its own).
        run: where to append ``samples.jsonl`` (``None``: nowhere).
        out: where to print.
    """

    state_key = "samples"

    def __init__(
        self,
        env: TokenVectorEnv,
        every: int | Pace,
        count: int = 4,
        seed: int = 0,
        run: RunDirectory | None = None,
        out: Printer | None = tqdm_print,
    ) -> None:
        self.pace = _pace(every)
        self.every = self.pace.every
        self.env, self.count, self.seed, self.run, self.out = env, count, seed, run, out

    def on_learn_start(self, agent: Agent) -> None:
        self.pace.start()

    def sample(self, agent: Agent) -> list[tuple[str, str, float]]:
        """``count`` ``(prompt, completion, reward)``, one per prompt first."""
        import torch

        generator = torch.Generator(device=agent.policy.device)
        seed = derived_seed(self.seed, agent.iteration, 2)
        generator.manual_seed(seed)
        with torch.no_grad():
            batch = collect(self.env, agent.policy, seed=seed, generator=generator)
        k = self.env.group_size
        texts = episode_texts(self.env, batch)
        order = sorted(range(len(texts)), key=lambda i: (i % k, i // k))[: self.count]
        table = self.env.prompt_table
        index = [int(batch.prompt_index[i]) for i in order]
        return [
            (prompt_label(table.prompts[j], table.texts[j]), texts[i], float(batch.scores[i]))
            for i, j in zip(order, index, strict=True)
        ]

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        if self.count == 0 or not self.pace.due(agent.iteration):
            return None
        samples = self.sample(agent)
        lines = [f"[samples @ {agent.iteration}]"] + [sample_line(*sample) for sample in samples]
        if self.out is not None:
            self.out("\n".join(lines))
        if self.run is not None:
            for prompt, completion, reward in samples:
                self.run.append_jsonl(
                    RunDirectory.SAMPLES,
                    {
                        "iteration": agent.iteration,
                        "prompt": prompt,
                        "completion": completion,
                        "reward": reward,
                    },
                )
        self.pace.done()
        return None


class MetricsLogger(TrainingCallback):
    """Send every iteration's metrics to an SB3 file logger, and to stdout every ``log_interval``.

    Adds ``time/elapsed_s`` (seconds since this session's ``learn`` started),
    ``time/iterations_per_s`` and, unless the agent's metrics have it,
    ``learning_rate``: the optimizer's (first parameter group's) learning rate after
    the iteration, i.e. the one its next step uses (what a schedule moves).

    Args:
        logger: the file logger (``make_logger``): CSV (+ TensorBoard).
        stdout: a stdout logger (``make_stdout_logger``), or ``None``.
        log_interval: iterations between stdout tables (0: never by iterations), or a
            ``Pace`` (iterations or wall time, whichever first).
    """

    state_key = "metrics_logger"

    def __init__(
        self, logger: Logger, stdout: Logger | None = None, log_interval: int | Pace = 0
    ) -> None:
        self.pace = log_interval if isinstance(log_interval, Pace) else Pace(log_interval)
        self.logger, self.stdout, self.log_interval = logger, stdout, self.pace.every
        self._start = time.perf_counter()
        self._iterations = 0

    def on_learn_start(self, agent: Agent) -> None:
        self._start = time.perf_counter()
        self._iterations = 0
        self.pace.start()

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        self._iterations += 1
        elapsed = time.perf_counter() - self._start
        row = {
            **metrics,
            "time/elapsed_s": elapsed,
            "time/iterations_per_s": self._iterations / max(elapsed, 1e-9),
        }
        if "learning_rate" not in row:
            row["learning_rate"] = float(agent.optimizer.param_groups[0]["lr"])
        record_metrics(self.logger, row, agent.iteration)
        if self.stdout is not None and self.pace.due(agent.iteration):
            record_metrics(self.stdout, row, agent.iteration)
            self.pace.done()
        return None


class CheckpointCallback(TrainingCallback):
    """Save a checkpoint every ``every`` iterations and once more at the end of ``learn``.

    Args:
        manager: where checkpoints go.
        every: iterations between checkpoints (0: only at the end).
        trainer_state: returns the extra state to save with each (callback states, ...).
        out: where to print "checkpoint written" lines (``None``: silent).

    Attributes:
        last: the newest checkpoint written, if any.
    """

    state_key = "checkpoint"

    def __init__(
        self,
        manager: CheckpointManager,
        every: int = 0,
        trainer_state: Callable[[], dict[str, Any]] | None = None,
        out: Printer | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        self.manager, self.every, self.trainer_state, self.out = manager, every, trainer_state, out
        self.ranks = ranks if ranks is not None else Ranks()
        self.last = None
        self._saved_at: int | None = None

    def save(self, agent: Agent) -> None:
        """Write a checkpoint of the agent now.

        Data parallel: called on every rank; every rank's ``rank_state`` is gathered
        and rank 0 writes one checkpoint holding them all. A failed write (a full
        disk) raises on rank 0 and ``RankFailedError`` on the others.
        """
        ranks = self.ranks
        state = self.trainer_state() if self.trainer_state is not None else {}
        if ranks.size > 1:
            state = {**state, "world_size": ranks.size, "ranks": ranks.gather(rank_state(agent))}
        self.last = ranks.on_main(lambda: self.manager.save(agent, state))
        self._saved_at = agent.iteration
        if self.out is not None:
            self.out(f"checkpoint: {self.last}")

    def on_learn_start(self, agent: Agent) -> None:
        def current() -> bool:
            latest = self.manager.latest()
            return latest is not None and latest.name == f"iter_{agent.iteration:06d}"

        self._saved_at = agent.iteration if self.ranks.on_main(current) else None

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        if self.every and agent.iteration % self.every == 0:
            self.save(agent)
        return None

    def on_learn_end(self, agent: Agent, history: list[dict[str, float]]) -> None:
        if self._saved_at != agent.iteration:
            self.save(agent)


class RankCallbacks(TrainingCallback):
    """Every rank's one callback in a data-parallel run: this rank's callbacks, then a
    shared stop decision.

    Rank 0 runs the writing and printing callbacks, every rank the checkpoint (a
    collective). Before they run, ``tokens_generated`` in ``metrics`` becomes the
    sum over ranks, so the logged metrics are global. A ``False`` from any callback
    on any rank stops every rank after this iteration.

    Args:
        callbacks: this rank's callbacks, in order.
        ranks: the run's ranks.
    """

    def __init__(self, callbacks: list[Any], ranks: Ranks) -> None:
        self.callbacks, self.ranks = callbacks, ranks

    def on_learn_start(self, agent: Agent) -> None:
        for cb in self.callbacks:
            if hasattr(cb, "on_learn_start"):
                cb.on_learn_start(agent)

    def __call__(self, agent: Agent, metrics: dict[str, float]) -> bool | None:
        if self.ranks.size > 1:
            metrics["tokens_generated"] = float(self.ranks.sum(agent.tokens_generated))
        stop = any([cb(agent, metrics) is False for cb in self.callbacks])
        return False if self.ranks.any(stop) else None

    def on_learn_end(self, agent: Agent, history: list[dict[str, float]]) -> None:
        for cb in self.callbacks:
            if hasattr(cb, "on_learn_end"):
                cb.on_learn_end(agent, history)
