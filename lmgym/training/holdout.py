"""Held-out evaluation of your own data: the split of a ``--prompts`` file, in one place.

``lmgym train --prompts data.jsonl --reward m:f`` trains on part of the file and
evaluates on the rest, so the figures it prints measure prompts the model never
trained on. The rule:

- **Default: a part of the file is held out.** ``holdout_size(n)`` rows, the smaller
  of ``HOLDOUT_FRACTION`` (10%) of the file and ``HOLDOUT_MAX_ROWS`` (64), at least
  one; which rows is a permutation seeded with ``HOLDOUT_SEED`` (it depends only on
  the number of rows, not on the run's seed, so every run on the file, and ``lmgym
  eval --prompts`` on it, holds out the same rows). The two parts never share a row.
- **``--eval-prompts-file FILE``**: evaluate on that file; train on every row of
  ``--prompts``.
- **``--no-holdout``**: train on every row, and evaluate on the training prompts;
  every evaluation then says so (its split reads
  ``lmgym.training.evaluation.TRAINING_SPLIT``).

The task registered for the file (``register_split_task``) takes ``split="train"``
(the training part, what a run trains on), ``"eval"`` (the held-out part, what
every evaluation of the run uses) or ``"all"`` (every row of ``--prompts``), as the
built-in tasks with a held-out split do; ``lmgym.training.evaluation.make_eval_env``
picks ``"eval"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.prompts import JsonlPrompts, PromptSubset, split_prompts
from lmgym.envs.task_factory import TaskParams, VectorFactory, build_env, task_factory
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.types import PromptSource, RewardModel

HOLDOUT_FRACTION = 0.10
"""Share of a ``--prompts`` file held out for evaluation (unless ``HOLDOUT_MAX_ROWS`` is smaller)."""
HOLDOUT_MAX_ROWS = 64
"""At most this many rows are held out."""
HOLDOUT_SEED = 0
"""Seed of the permutation that picks the held-out rows (fixed: the same rows in every run)."""

Split = Literal["train", "eval", "all"]


@dataclass(frozen=True, kw_only=True)
class PromptFileParams(TaskParams):
    """A prompt file task's one parameter: ``split``, the rows its env serves."""

    split: Split = "train"


class TooFewRows(ValueError):
    """A prompt file too small to hold out a part of (the message says what to do in
    ``lmgym train``; ``lmgym eval`` adds its own way out)."""


def holdout_size(rows: int) -> int:
    """Rows held out of a file of ``rows``: ``min(HOLDOUT_MAX_ROWS, round(10% of rows))``,
    at least 1.

    Raises:
        TooFewRows: fewer than 2 rows (nothing would be left on one side).
    """
    if rows < 2:
        raise TooFewRows(
            f"the prompt file has {rows} row(s): too few to hold out a part for evaluation; "
            "add rows, name held-out prompts with --eval-prompts-file FILE, or pass "
            "--no-holdout (the evaluation is then on the training prompts)"
        )
    return max(1, min(HOLDOUT_MAX_ROWS, round(HOLDOUT_FRACTION * rows)))


def split_holdout(source: PromptSource) -> tuple[PromptSubset, PromptSubset]:
    """``(train, held_out)`` parts of ``source``: disjoint, together every row once."""
    rows = len(source)
    held = holdout_size(rows)
    train, held_out = split_prompts(source, held / rows, HOLDOUT_SEED)
    assert len(held_out) == held  # round(held / rows * rows) == held
    return train, held_out


def prompt_parts(
    prompts: str | Path, prompt_field: str, eval_file: str | Path | None
) -> tuple[dict[str, PromptSource], str]:
    """``({split: prompts}, description)`` of a prompt file, held out as the module says.

    Args:
        prompts: the ``--prompts`` file.
        prompt_field: the field holding the prompt.
        eval_file: ``--eval-prompts-file``, or ``None`` to split ``prompts``.

    Raises:
        ValueError: the eval file is missing or holds no prompt.
        TooFewRows: too few rows to split.
    """
    source = JsonlPrompts(prompts, field=prompt_field)
    if eval_file is not None:
        path = Path(eval_file)
        if not path.is_file():
            raise ValueError(
                f"eval_prompts_file {str(eval_file)!r}: no such file (a JSON Lines file with "
                "the fields of --prompts)"
            )
        held_out: PromptSource = JsonlPrompts(path, field=prompt_field)
        if len(held_out) == 0:
            raise ValueError(f"eval_prompts_file {str(eval_file)!r}: the file holds no prompt")
        parts = {"train": source, "eval": held_out, "all": source}
        return parts, f"{len(source)} train, {len(held_out)} held out in {path.name}"
    try:
        train, held = split_holdout(source)
    except TooFewRows as exc:
        raise TooFewRows(f"prompts {str(prompts)!r}: {exc}") from None
    parts = {"train": train, "eval": held, "all": source}
    return parts, f"{len(train)} train, {len(held)} held out (seed {HOLDOUT_SEED})"


def split_factory(reward: RewardModel, parts: dict[str, PromptSource]) -> VectorFactory:
    """A vector factory over ``reward`` whose ``split`` argument picks the prompts.

    It takes every ``EnvOptions`` field (``max_new_tokens`` defaults to 16, as
    ``register_reward_env``'s) and ``split`` (default ``"train"``).
    """

    @task_factory(PromptFileParams, max_new_tokens=16)
    def make_prompt_file_vector(options: EnvOptions, params: PromptFileParams) -> TokenVectorEnv:
        if params.split not in parts:
            raise ValueError(f"split={params.split!r} is not one of {sorted(parts)}")
        return build_env(options, parts[params.split], reward)

    return make_prompt_file_vector


def register_split_task(
    env_id: str, reward: RewardModel, parts: dict[str, PromptSource], description: str
) -> str:
    """Register ``split_factory(reward, parts)`` under ``env_id`` (both Gymnasium faces,
    listed in ``TASKS``, replacing an earlier registration); returns ``env_id``."""
    from lmgym.envs.registration import TaskInfo, _register_custom

    info = TaskInfo(env_id, None, description, (0.0, 1.0), None, (EnvOptions.reward_mode,))
    return _register_custom(env_id, split_factory(reward, parts), info)


def overlap(train: PromptSource, held_out: PromptSource) -> int:
    """How many held-out prompts also occur (as text) among the training prompts."""
    seen = {repr(train[i]) for i in range(len(train))}
    return sum(repr(held_out[i]) in seen for i in range(len(held_out)))


def holdout_lines(
    prompts: str | None, prompt_field: str, holdout: bool, eval_file: str | None
) -> list[str]:
    """What a run on a prompt file says before training: which rows it evaluates on, and
    a note when a named held-out file shares prompts with the training file."""
    if prompts is None:
        return []
    name = Path(prompts).name
    if eval_file is None and not holdout:
        return [
            f"held-out prompts: none (--no-holdout): every evaluation is on training prompts "
            f"of {name}"
        ]
    parts, _ = prompt_parts(prompts, prompt_field, eval_file)
    train, held = parts["train"], parts["eval"]
    if eval_file is None:
        return [
            f"held-out prompts: {len(held)} of the {len(parts['all'])} rows of {name} (seed "
            f"{HOLDOUT_SEED}), never trained on; training on the other {len(train)}"
        ]
    lines = [
        f"held-out prompts: the {len(held)} of {Path(eval_file).name}; training on every row of {name}"
    ]
    shared = overlap(train, held)
    if shared:
        lines.append(
            f"note: {shared} of the {len(held)} prompts of {Path(eval_file).name} are also in "
            f"{name}: the evaluation of those is not held out"
        )
    return lines
