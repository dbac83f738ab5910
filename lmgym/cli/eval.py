"""``lmgym eval``: evaluate a run's checkpoint, or any causal LM, on a task.

What is evaluated is ``--run RUN`` (its latest checkpoint, on the run's task unless
another is named) or ``--model M`` (a model directory, hub name, packaged model,
peft adapter or ``Agent.save`` directory). What it is evaluated on takes the same
flags, with the same meaning, as ``lmgym train``: ``--task ID`` (``module:Id``
for your own), or ``--prompts FILE.jsonl --reward module:function`` (with
``--prompt-field``). A model has no task of its own, so ``--model`` needs one of
them: scoring a toy task nobody asked for would be a silent wrong answer.
``--num-prompts N`` prompts are drawn and ``-k K`` completions sampled for each,
from the task's held-out ``--split eval`` by default: for a prompt file the rows
``lmgym train --prompts FILE`` holds out (``lmgym.training.holdout``; a run's own
``--eval-prompts-file`` or ``--no-holdout`` with ``--run``), ``--split all`` every row.

Before this release ``--prompts`` was the count; a number given to ``--prompts``,
or a file given to ``--num-prompts``, is an error naming the other flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmgym.agents.config import config_from_dict
from lmgym.cli.common import add_env_flag, error, file_given_as_count, quiet_transformers
from lmgym.cli.flags import flag_dataclass, make_parser
from lmgym.training.holdout import TooFewRows
from lmgym.training.run import DEFAULT_TASK, TrainConfig
from lmgym.training.sample_text import sample_line
from lmgym.training.threads import auto_threads


@dataclass
class EvalArgs:
    """``lmgym eval``'s own flags; the ones it shares with ``lmgym train`` are
    ``TrainConfig``'s fields (``_RUN_FIELDS``)."""

    run: str | None = field(default=None, metadata={"metavar": "RUN"})
    """Run directory (its latest checkpoint) or a checkpoint; or --model."""
    model: str | None = field(default=None, metadata={"metavar": "MODEL"})
    """Model directory, hub or packaged name, Agent.save directory or a checkpoint; or --run."""
    num_prompts: int = field(default=64, metadata={"metavar": "N"})
    """Prompts drawn."""
    k: int = field(default=8, metadata={"aliases": ["-k"], "metavar": "K"})
    """Completions per prompt, the k of pass@k."""
    split: Literal["eval", "train", "all"] = "eval"
    """Which prompts, where the task has a split."""
    seed: int = 0
    """Seed of the prompt order and the sampler."""
    correct_threshold: float | None = None
    """Reward counted as correct for pass@k (None: the task's maximum on verified tasks)."""
    json: str | None = field(default=None, metadata={"metavar": "FILE"})
    """Also write the result as JSON to this file."""


# TrainConfig's fields that mean the same in lmgym eval, and eval's own defaults of some.
_RUN_FIELDS = (
    "task",
    "prompts",
    "reward",
    "prompt_field",
    "temperature",
    "samples",
    "device",
    "threads",
    "rollout_engine",
    "vllm_kv_cache_gib",
)
_RUN_DEFAULTS = {"task": None, "temperature": None}
_RUN_NOTES = {
    "task": "Default: the run's; --model needs it, or --prompts and --reward.",
    "temperature": "0 is greedy decoding. Default: the run's, or 1.",
}


def moved_count_error(prompts: str | None) -> str | None:
    """The error for an old-style ``--prompts N`` (a count, not a file), or ``None``."""
    if prompts is None or Path(prompts).exists():
        return None
    try:
        count = int(prompts)
    except ValueError:
        return None
    return (
        f"--prompts {prompts}: --prompts is a JSON Lines prompt file (as in lmgym train); "
        f"the number of prompts drawn is --num-prompts {count}"
    )


def eval_parser() -> argparse.ArgumentParser:
    """The ``lmgym eval`` argument parser: ``EvalArgs`` and ``TrainConfig``'s ``_RUN_FIELDS``."""
    parser = make_parser(
        [
            flag_dataclass(EvalArgs, group="what to evaluate, and how"),
            flag_dataclass(
                TrainConfig,
                only=_RUN_FIELDS,
                defaults=_RUN_DEFAULTS,
                notes=_RUN_NOTES,
                group="the task and the sampler (as lmgym train)",
            ),
        ],
        prog="lmgym eval",
        description="Evaluate a run's checkpoint (or any causal LM) on a task, or on your prompt "
        "file and reward: mean reward, pass@k where the task has a verifier, mean length.",
    )
    add_env_flag(parser, "default: the run's")
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    """``lmgym eval``'s flags, read; exits 2 with argparse's usage for a bad command line."""
    parser = eval_parser()
    args = parser.parse_args(argv)
    if (args.run is None) == (args.model is None):
        parser.error("pass one of --run RUN and --model MODEL")
    return args


def _check_args(args: argparse.Namespace) -> str | None:
    """The first problem with the flags themselves, as an error message, or ``None``."""
    moved = moved_count_error(args.prompts)
    if moved is not None:
        return moved
    if args.num_prompts < 1 or args.k < 1:
        return f"--num-prompts and --k must be >= 1, got {args.num_prompts} and {args.k}"
    if args.temperature is not None and args.temperature < 0:
        return f"--temperature {args.temperature}: must be >= 0 (0: greedy)"
    if args.task is not None and (args.prompts or args.reward) is not None:
        return (
            f"--task {args.task} and --prompts/--reward both name the task; pass one "
            "(--prompts builds the task from the file and --reward)"
        )
    return None


def _own_task(args: argparse.Namespace) -> tuple[str, str] | None:
    """``(label, env id)`` of the task the flags name (``--task`` or ``--prompts`` with
    ``--reward``), registered; ``None`` when they name none."""
    from lmgym.training.user_code import prepare_task, resolve_task

    if args.task is not None:
        return args.task, resolve_task(args.task)
    if args.prompts is None and args.reward is None:
        return None
    # The held-out rows are the ones lmgym train --prompts FILE holds out (the default
    # --split eval: a baseline before training); --split all scores every row.
    config = TrainConfig(
        prompts=args.prompts,
        reward=args.reward,
        prompt_field=args.prompt_field,
        holdout=args.split != "all",
    )
    try:
        env_id = prepare_task(config)
    except TooFewRows as exc:
        raise ValueError(f"{exc}; lmgym eval --split all scores every row") from None
    return env_id, env_id


def _run_task(saved: dict[str, Any]) -> tuple[str, str]:
    """``(label, env id)`` of a run's own task: its module imported again, or its prompt
    file registered again (a changed file is noted on stderr)."""
    from lmgym.training.user_code import check_prompt_file, prepare_task

    run_config = saved["run"]
    changed = check_prompt_file(saved.get("imports"), "evaluate")
    if changed is not None:
        print(f"lmgym eval: note: {changed}; evaluating on it as it is now", file=sys.stderr)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    known = {k: v for k, v in run_config.items() if k in fields}
    env_id = prepare_task(config_from_dict(TrainConfig, known))
    return (env_id if run_config.get("prompts") is not None else run_config["task"]), env_id


def _target(args: argparse.Namespace) -> tuple[Path | str, str, dict[str, Any] | None]:
    """``(model path, label, the run's saved config or None)`` of ``--run`` / ``--model``."""
    from lmgym.persistence import check_agent_dir
    from lmgym.training.checkpoint import CheckpointManager, is_checkpoint
    from lmgym.training.model_source import resolve_model
    from lmgym.training.resume import find_checkpoint
    from lmgym.training.run import RunDirectory

    target = args.run or args.model
    path = Path(target)
    if args.run is not None or is_checkpoint(path) or RunDirectory(path).is_run():
        run, checkpoint = find_checkpoint(path)
        CheckpointManager.verify(checkpoint)
        return checkpoint / "agent" / "policy", str(checkpoint), run.read_config()
    if (path / "policy").is_dir() and (path / "agent_config.json").is_file():
        check_agent_dir(path)  # a directory written by Agent.save
        return path / "policy", target, None
    return resolve_model(target), target, None


def run_eval(argv: Sequence[str]) -> int:
    """``lmgym eval``: evaluate, print the result (and write ``--json``); the exit status."""
    import torch

    from lmgym.persistence import CheckpointError
    from lmgym.policy import CausalLMPolicy
    from lmgym.policy.engines import choose_rollout_engine
    from lmgym.training.env_args import check_env_kwargs, with_policy_stop_ids
    from lmgym.training.evaluation import correct_threshold_for, evaluate_policy, make_eval_env
    from lmgym.training.run import check_device
    from lmgym.training.user_code import check_task_factory

    moved = file_given_as_count(
        argv,
        "--num-prompts",
        "the number of prompts drawn",
        "a prompt file is --prompts {} --reward module:function",
    )
    if moved is not None:
        return error("eval", moved)
    args = _parse(list(argv))
    problem = _check_args(args)
    if problem is not None:
        return error("eval", problem)
    if args.threads < 0:
        return error("eval", f"--threads {args.threads}: must be >= 1, or 0 to choose")
    torch.set_num_threads(args.threads or auto_threads()[0])
    quiet_transformers()
    try:
        check_device(args.device)
        named = _own_task(args)
        model_path, label, saved = _target(args)
        if named is None and saved is None:
            return error(
                "eval",
                f"--model {args.model}: name what to evaluate it on: --task ID (lmgym tasks "
                f"lists them, e.g. --task {DEFAULT_TASK}), or --prompts FILE.jsonl --reward "
                "module:function",
            )
        task, env_id = named if named is not None else _run_task(saved)  # type: ignore[arg-type]
        run_config = saved["run"] if saved is not None else {}
        check_task_factory(env_id, task)
        env_kwargs = check_env_kwargs(
            env_id,
            dict(args.env_kwargs) if args.env_kwargs else dict(run_config.get("env_kwargs", {})),
        )
        # `is None`, not `or`: --temperature 0 means greedy, not "the run's temperature".
        temperature = (
            args.temperature if args.temperature is not None else run_config.get("temperature", 1.0)
        )
        policy = CausalLMPolicy.from_pretrained(
            model_path, device=args.device, temperature=temperature
        )
        choose_rollout_engine(policy, args.rollout_engine, args.vllm_kv_cache_gib)
        env, split = make_eval_env(
            env_id,
            policy.tokenizer,
            args.num_prompts,
            args.k,
            split=args.split,
            env_kwargs=with_policy_stop_ids(env_id, env_kwargs, policy),
            device=args.device,
        )
        if args.prompts is not None and args.split == "all":
            split = f"all (every row of {Path(args.prompts).name})"
        threshold = (
            args.correct_threshold
            if args.correct_threshold is not None
            else correct_threshold_for(env_id)
        )
        result = evaluate_policy(
            policy, env, args.num_prompts, seed=args.seed, correct_threshold=threshold, split=split
        )
    except (CheckpointError, FileNotFoundError, ValueError, OSError, ImportError) as exc:
        return error("eval", str(exc))

    print(
        f"eval of {label} on {task} (split {split}): {args.num_prompts} prompts x {args.k} samples"
    )
    print(f"  mean reward     {result.reward_mean:.4f}  (std {result.reward_std:.4f})")
    if result.pass_at_1 is not None and result.pass_at_k is not None:
        print(f"  pass@1          {result.pass_at_1:.4f}  (correct: reward >= {threshold:.6g})")
        print(f"  pass@{args.k:<11d}{result.pass_at_k:.4f}")
    else:
        print("  pass@k          -  (no verifier for this task; see --correct-threshold)")
    # A multi-turn episode's length counts the policy's turns, not the env's answers.
    whose = " (the policy's turns)" if env.responder is not None else ""
    print(f"  mean length     {result.completion_length:.3f} tokens{whose}")
    for sample in result.samples[: args.samples]:
        print(sample_line(*sample))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": label, "task": task, **result.to_json()}, indent=2) + "\n"
        )
    return 0
