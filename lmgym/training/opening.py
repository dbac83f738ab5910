"""The lines that open a training session: what trains, on how many processes, from where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmgym.training.holdout import holdout_lines
from lmgym.training.run import TrainConfig


def opening_lines(
    config: TrainConfig,
    async_config: Any,
    world_size: int,
    resumed: tuple[Path | None, int, int | None] | None,
) -> list[str]:
    """What a session says before it trains.

    Args:
        config: the run's settings.
        async_config: the ``AsyncConfig`` of an asynchronous run, else ``None``.
        world_size: data-parallel processes.
        resumed: ``(checkpoint, its iteration, the run's saved threads)`` of a resume.
    """
    cfg, lines = config, []
    if resumed is not None:
        checkpoint, iteration, saved_threads = resumed
        lines.append(
            f"resuming {cfg.algo} on {cfg.task} from {checkpoint} at iteration {iteration}; "
            f"training to {cfg.iterations}"
        )
        if saved_threads is not None and cfg.threads != saved_threads:
            lines.append(
                f"note: threads={cfg.threads} differs from the run's {saved_threads}; the metrics "
                "may then differ in the last digits from a run that kept its thread count "
                "(float sums in another order)"
            )
    elif async_config is not None:
        lines.append(
            f"{cfg.algo} on {cfg.task}, asynchronous: {async_config.actors} actor(s) x "
            f"{cfg.num_prompts} prompts x {cfg.group_size}, {async_config.learners} learner(s), "
            f"max_staleness={async_config.max_staleness}, {cfg.iterations} updates"
        )
    else:
        lines.append(
            f"{cfg.algo} on {cfg.task}: {cfg.num_prompts * cfg.group_size} rows "
            f"({cfg.num_prompts} prompts x {cfg.group_size}), {cfg.iterations} iterations, "
            f"model {cfg.model or 'tiny GPT-2 (built locally)'}"
        )
    if resumed is None:
        lines += holdout_lines(cfg.prompts, cfg.prompt_field, cfg.holdout, cfg.eval_prompts_file)
    if async_config is None and world_size > 1:
        lines.append(
            f"data parallel: {world_size} processes x {cfg.num_prompts} prompts = "
            f"{world_size * cfg.num_prompts} prompts per iteration"
        )
    return lines
