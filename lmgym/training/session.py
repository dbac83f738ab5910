"""Rank 0's callbacks for one training session, in their order, and their clean-up.

``main_callbacks`` builds what the run's rank 0 calls after every iteration:

1. ``RunProgressBar`` (unless ``no_progress``): reward, flat groups, KL when ``beta > 0``,
   the suspect-result warnings that hold;
2. ``PeriodicEval`` (``eval_every`` iterations or ``eval_time``, whichever first),
   adding ``eval/*`` for the loggers after it;
3. ``EarlyStopAtThreshold`` (``early_stop``);
4. ``MetricsLogger``: ``progress.csv``, TensorBoard, the stdout table (``log_interval``
   iterations or ``report_time``);
5. ``NoSignalWarning``: flat groups or zero gradients for many iterations in a row;
6. ``SuspectWatch``: collapse to one answer, a high share of flat groups, the held-out
   reward falling while the training reward rises (it also sees every evaluation);
7. ``SamplePrinter`` (``sample_every`` iterations or ``report_time``);
8. the ``--callback`` ones and the ``Trainer``'s ``callbacks``;
9. ``WallClockLimit`` (``max_time``), last, so its stop line follows the others.

Reports come "whichever first" of an iteration count and a wall time
(``lmgym.training.pace``), so a slow real-model run shows numbers within minutes.

``assemble`` then adds the checkpoint callback on every process that takes part
in checkpoints, restores the callbacks' saved state on a resume, and (data
parallel) wraps them so every rank stops together. Every training path (one
process, data parallel, asynchronous) gets its callbacks from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmgym.agents.base import Callback
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.training.callbacks import (
    CheckpointCallback,
    EarlyStopAtThreshold,
    MetricsLogger,
    PeriodicEval,
    Printer,
    RankCallbacks,
    SamplePrinter,
    TrainingCallback,
)
from lmgym.training.checkpoint import CheckpointManager
from lmgym.training.evaluation import HeldOut
from lmgym.training.logger import make_logger, make_stdout_logger
from lmgym.training.pace import pace_of
from lmgym.training.ranks import Ranks
from lmgym.training.resolved import ResolvedRun
from lmgym.training.resume import fixed_fields
from lmgym.training.run import RunDirectory, TrainConfig
from lmgym.training.suspect import NoSignalWarning, RunKnobs, SuspectWatch
from lmgym.training.wall_clock import WallClockLimit, parse_duration

# The training run's progress bar: the metrics that say whether it learns.
#
# ``Agent.learn(progress_bar=True)`` shows reward, a KL and length whatever the run;
# without a reference model (``beta`` 0) that KL is always 0. ``RunProgressBar``
# shows the reward, the share of flat groups (``flat``: groups whose rewards are all
# equal give no signal), the completion length, and the KL to the reference only
# when the run has one (``beta > 0``), and ``warn``: the suspect-result warnings that
# hold now (``lmgym.training.suspect``: ``collapse``, ``flat``, ``held-out falls``).


def postfix(metrics: dict[str, float], show_kl: bool, warn: str = "") -> dict[str, str]:
    """The bar's ``name: value`` fields for one iteration's metrics (and warnings)."""
    fields = {"reward": f"{metrics.get('reward_mean', float('nan')):.3f}"}
    if "frac_reward_zero_std" in metrics:
        fields["flat"] = f"{metrics['frac_reward_zero_std']:.0%}"
    if show_kl:
        kl = metrics.get("kl_ref_k3", metrics.get("kl_ref", float("nan")))
        fields["kl"] = f"{kl:.4f}"
    if "completion_length" in metrics:
        fields["len"] = f"{metrics['completion_length']:.1f}"
    if warn:
        fields["warn"] = warn
    return fields


class RunProgressBar(TrainingCallback):
    """A tqdm bar over a session's iterations (from the agent's iteration to ``total``).

    Args:
        total: the run's total iterations.
        name: the bar's label (the algorithm).
        show_kl: show the KL to the reference (the run has ``beta > 0``).
        warnings: returns the warnings that hold now (``SuspectWatch.status``), if any.
    """

    def __init__(
        self,
        total: int,
        name: str,
        show_kl: bool,
        warnings: Callable[[], str] | None = None,
    ) -> None:
        self.total, self.name, self.show_kl, self.warnings = total, name, show_kl, warnings
        self.bar: Any = None

    def on_learn_start(self, agent: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, initial=agent.iteration, desc=self.name, unit="it")

    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        if self.bar is not None:
            self.bar.update(1)
            warn = self.warnings() if self.warnings is not None else ""
            self.bar.set_postfix(postfix(metrics, self.show_kl, warn))
        return None

    def on_learn_end(self, agent: Any, history: list[dict[str, float]]) -> None:
        self.close()

    def close(self) -> None:
        """Close the bar (also after an exception, when ``on_learn_end`` is not called)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@dataclass
class Session:
    """Rank 0's callbacks of a session and the parts the trainer reads after it.

    Attributes:
        callbacks: in calling order.
        early: the early stop, if any (``solved_at`` says whether it stopped the run).
        wall_clock: the ``max_time`` bound, if any.
        watch: the suspect-result warnings (the evaluations before and after training
            reach it through ``BoundaryEval``).
        closers: loggers and the progress bar, closed by ``close``.
    """

    callbacks: list[Callback] = field(default_factory=list)
    early: EarlyStopAtThreshold | None = None
    wall_clock: WallClockLimit | None = None
    watch: SuspectWatch | None = None
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Close the loggers and the progress bar (after ``learn``, however it ended)."""
        for item in self.closers:
            item.close()


def main_callbacks(
    record: ResolvedRun,
    eval_env: TokenVectorEnv,
    split: str,
    run: RunDirectory,
    *,
    seed: int,
    beta: float,
    learning_rate: float = float("nan"),
    correct_threshold: float | None,
    resumed_at: int | None,
    start: float,
    extra: Sequence[Callback] = (),
    out: Printer,
) -> Session:
    """Rank 0's callbacks for a session (see the module docstring for the order).

    Args:
        record: the resolved run (its settings, task id and early-stop threshold).
        eval_env, split: the evaluation env and which prompts it holds.
        run: the run directory (logs, samples, evaluations).
        seed: the agent's seed (evaluations and samples derive theirs).
        beta: the agent's KL coefficient (the bar shows KL when > 0).
        learning_rate: the agent's, quoted in the warnings' advice.
        correct_threshold: reward counted as correct, for pass@k.
        resumed_at: a resume's checkpoint iteration (``progress.csv`` continues), else None.
        start: ``time.perf_counter()`` when the session began (``max_time`` counts from it).
        extra: the user's callbacks, after the built-in ones.
        out: where lines go.
    """
    config = record.config
    session = Session()
    add = session.callbacks.append
    from lmgym.envs.registration import TASKS

    info = TASKS.get(record.env_id)
    best = info.reward_range[1] if info is not None else None
    knobs = RunKnobs(learning_rate, config.temperature, config.group_size, beta)
    session.watch = watch = SuspectWatch(knobs, best, out=out)
    if not config.no_progress:
        bar = RunProgressBar(
            config.iterations, config.algo, show_kl=beta > 0, warnings=watch.status
        )
        add(bar)
        session.closers.append(bar)
    eval_pace = pace_of(config.eval_every, config.eval_time, "eval_time")
    if eval_pace.active:
        held_out = HeldOut(eval_env, config.eval_prompts, seed, correct_threshold, split)
        add(PeriodicEval(held_out, eval_pace, run, out, on_result=watch.check_eval))
    if record.stop_threshold is not None:
        session.early = EarlyStopAtThreshold(record.stop_threshold, config.stop_window, out=out)
        add(session.early)
    logger = make_logger(run.path, resume_at=resumed_at)
    table_pace = pace_of(config.log_interval, config.report_time, "report_time")
    stdout = make_stdout_logger() if config.log_interval else None
    session.closers += [logger] + ([stdout] if stdout is not None else [])
    add(MetricsLogger(logger, stdout, table_pace))
    add(NoSignalWarning(config.group_size, config.temperature, best, out=out))
    add(watch)
    if config.sample_every and config.samples:
        sample_pace = pace_of(config.sample_every, config.report_time, "report_time")
        add(SamplePrinter(eval_env, sample_pace, config.samples, seed, run, out))
    session.callbacks += list(extra)
    if config.max_time is not None:
        limit = parse_duration(config.max_time)
        session.wall_clock = WallClockLimit(limit, start, f"--max-time {config.max_time}", out)
        add(session.wall_clock)
    return session


def assemble(
    session: Session,
    run: RunDirectory,
    config: TrainConfig,
    state: dict[str, Any],
    checkpoint_ranks: Ranks | None,
    *,
    share_stop: Ranks | None = None,
) -> tuple[list[Callback], CheckpointCallback | None]:
    """This process's callbacks for ``learn``, and its checkpoint callback.

    Args:
        session: rank 0's ``main_callbacks`` (an empty ``Session`` on other processes).
        run: the run directory (checkpoints go to its ``checkpoints/``).
        config: the run's settings (``save_every``, ``keep_checkpoints``).
        state: a resumed checkpoint's trainer state (``{}`` for a fresh run): each
            callback with a ``state_key`` in it gets its state back.
        checkpoint_ranks: the processes that write checkpoints together, or ``None``
            when this process takes no part (an asynchronous actor or learner > 0).
        share_stop: data parallel: every rank stops when one callback says so.

    Returns:
        ``(callbacks, checkpoint)``; ``checkpoint`` is ``None`` when this process
        takes no part in checkpoints.
    """
    callbacks = list(session.callbacks)
    saved = state.get("callbacks", {})
    for cb in callbacks:
        key = getattr(cb, "state_key", None)
        if key is not None and key in saved:
            cb.load_state_dict(saved[key])  # type: ignore[attr-defined]

    def trainer_state() -> dict[str, Any]:
        states = {
            cb.state_key: cb.state_dict()  # type: ignore[attr-defined]
            for cb in callbacks
            if hasattr(cb, "state_key") and hasattr(cb, "state_dict")
        }
        return {"callbacks": states, "run": fixed_fields(config)}

    checkpoint = None
    if checkpoint_ranks is not None:
        manager = CheckpointManager(run.checkpoints, config.keep_checkpoints)
        checkpoint = CheckpointCallback(
            manager, config.save_every, trainer_state, ranks=checkpoint_ranks
        )
        callbacks.append(checkpoint)
    if share_stop is not None and share_stop.size > 1:
        callbacks = [RankCallbacks(callbacks, share_stop)]
    return callbacks, checkpoint
