"""Rank 0's callbacks for one training session, in their order, and their clean-up.

``main_callbacks`` builds what the run's rank 0 calls after every iteration:

1. ``RunProgressBar`` (unless ``no_progress``): reward, flat groups, KL when ``beta > 0``;
2. ``PeriodicEval`` (``eval_every``), adding ``eval/*`` for the loggers after it;
3. ``EarlyStopAtThreshold`` (``early_stop``);
4. ``MetricsLogger``: ``progress.csv``, TensorBoard, the stdout table;
5. ``NoSignalWarning``: flat groups or zero gradients for many iterations in a row;
6. ``SamplePrinter`` (``sample_every``);
7. the ``--callback`` ones and the ``Trainer``'s ``callbacks``;
8. ``WallClockLimit`` (``max_time``), last, so its stop line follows the others.

``assemble`` then adds the checkpoint callback on every process that takes part
in checkpoints, restores the callbacks' saved state on a resume, and (data
parallel) wraps them so every rank stops together. Every training path (one
process, data parallel, asynchronous) gets its callbacks from here.
"""

from __future__ import annotations

from collections.abc import Sequence
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
)
from lmgym.training.checkpoint import CheckpointManager
from lmgym.training.evaluation import HeldOut
from lmgym.training.logger import make_logger, make_stdout_logger
from lmgym.training.progress import RunProgressBar
from lmgym.training.ranks import Ranks
from lmgym.training.resume import fixed_fields
from lmgym.training.run import RunDirectory, TrainConfig
from lmgym.training.signal_watch import NoSignalWarning
from lmgym.training.wall_clock import WallClockLimit, parse_duration


def stop_threshold(config: TrainConfig, env_id: str) -> float | None:
    """The early-stop threshold: ``stop_threshold``, else the task's solved threshold.

    Raises:
        ValueError: ``early_stop`` on a task with no solved threshold and none given.
    """
    if not config.early_stop:
        return None
    if config.stop_threshold is not None:
        return config.stop_threshold
    from lmgym.envs.registration import TASKS

    info = TASKS.get(env_id)
    if info is None or info.solved_threshold is None:
        raise ValueError(
            f"early_stop: task {config.task!r} states no solved threshold; set stop_threshold"
        )
    return info.solved_threshold


@dataclass
class Session:
    """Rank 0's callbacks of a session and the parts the trainer reads after it.

    Attributes:
        callbacks: in calling order.
        early: the early stop, if any (``solved_at`` says whether it stopped the run).
        wall_clock: the ``max_time`` bound, if any.
        closers: loggers and the progress bar, closed by ``close``.
    """

    callbacks: list[Callback] = field(default_factory=list)
    early: EarlyStopAtThreshold | None = None
    wall_clock: WallClockLimit | None = None
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Close the loggers and the progress bar (after ``learn``, however it ended)."""
        for item in self.closers:
            item.close()


def main_callbacks(
    config: TrainConfig,
    env_id: str,
    eval_env: TokenVectorEnv,
    split: str,
    run: RunDirectory,
    *,
    seed: int,
    beta: float,
    correct_threshold: float | None,
    resumed_at: int | None,
    start: float,
    extra: Sequence[Callback] = (),
    out: Printer,
) -> Session:
    """Rank 0's callbacks for a session (see the module docstring for the order).

    Args:
        config: the run's settings.
        env_id: the task's registered id.
        eval_env, split: the evaluation env and which prompts it holds.
        run: the run directory (logs, samples, evaluations).
        seed: the agent's seed (evaluations and samples derive theirs).
        beta: the agent's KL coefficient (the bar shows KL when > 0).
        correct_threshold: reward counted as correct, for pass@k.
        resumed_at: a resume's checkpoint iteration (``progress.csv`` continues), else None.
        start: ``time.perf_counter()`` when the session began (``max_time`` counts from it).
        extra: the user's callbacks, after the built-in ones.
        out: where lines go.
    """
    session = Session()
    add = session.callbacks.append
    if not config.no_progress:
        bar = RunProgressBar(config.iterations, config.algo, show_kl=beta > 0)
        add(bar)
        session.closers.append(bar)
    if config.eval_every:
        add(
            PeriodicEval(
                HeldOut(eval_env, config.eval_prompts, seed, correct_threshold, split),
                config.eval_every,
                run,
                out,
            )
        )
    threshold = stop_threshold(config, env_id)
    if threshold is not None:
        session.early = EarlyStopAtThreshold(threshold, config.stop_window, out=out)
        add(session.early)
    logger = make_logger(run.path, resume_at=resumed_at)
    stdout = make_stdout_logger() if config.log_interval else None
    session.closers += [logger] + ([stdout] if stdout is not None else [])
    add(MetricsLogger(logger, stdout, config.log_interval))
    from lmgym.envs.registration import TASKS

    info = TASKS.get(env_id)
    best = info.reward_range[1] if info is not None else None
    add(NoSignalWarning(config.group_size, config.temperature, best, out=out))
    if config.sample_every and config.samples:
        add(SamplePrinter(eval_env, config.sample_every, config.samples, seed, run, out))
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
