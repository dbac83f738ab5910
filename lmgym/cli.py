"""The ``lmgym`` command: ``train``, ``eval``, ``bench`` and ``tasks``.

``lmgym train`` with no arguments runs GRPO on ``lmgym/TargetString-v0`` with a
tiny GPT-2 built locally (saved and reloaded through ``save_pretrained`` /
``from_pretrained``), shows progress, and prints the reward before and after plus
a few sampled completions. Every field of the run's ``TrainConfig`` and of the
chosen algorithm's config is a flag, typed, with its default and its docstring
as help (``lmgym train --algo ppo --help``); ``--config FILE`` (JSON, or YAML with
pyyaml) sets any of them, flags override the file. A run writes a run directory
(``runs/<algo>-<task>-<time>`` unless ``--run-dir``): ``config.json``,
``progress.csv``, TensorBoard events, ``samples.jsonl``, ``checkpoints/``.
``--resume RUN_DIR`` continues a run; ``lmgym eval --run RUN_DIR`` evaluates it;
``lmgym bench`` compares agents. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmgym.training.run import DEFAULT_TASK, TrainConfig

# TrainConfig fields with flags of their own (repeatable KEY=VALUE / MODULE:NAME).
_SPECIAL_FIELDS = ("env_kwargs", "callbacks")


def _parse_env_kwarg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _train_parser(algo: str) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """The ``lmgym train`` parser for ``algo``: ``(parser, TrainConfig fields, agent fields)``.

    The typed flags of both config classes come from ``HfArgumentParser``
    (``lmgym.training.flags``); the run's own flags are added here.
    """
    from lmgym.agents import ALGORITHMS
    from lmgym.training.flags import field_names, flag_dataclass, make_parser

    run_flags = flag_dataclass(
        TrainConfig, skip=_SPECIAL_FIELDS, choices={"algo": sorted(ALGORITHMS)}
    )
    agent_flags = flag_dataclass(ALGORITHMS[algo].config_class)
    parser = make_parser(
        [run_flags, agent_flags],
        prog="lmgym train",
        description="Train an agent on an lmgym task. Every TrainConfig and agent config "
        "field is a flag; --config FILE sets them from JSON/YAML (flags override).",
    )
    parser.add_argument("--config", default=None, help="JSON or YAML file of field values")
    parser.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue a run (its latest checkpoint, or the checkpoint directory given); "
        "--iterations is then the new total",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run directory if it exists (only an lmgym run directory)",
    )
    parser.add_argument(
        "--env",
        dest="env_kwargs",
        action="append",
        type=_parse_env_kwarg,
        default=None,
        metavar="KEY=VALUE",
        help="an argument of the task's env factory, e.g. --env reward_mode=per_token "
        "(VALUE converted to the parameter's type: booleans from true/false/yes/no/1/0 only); "
        "repeatable",
    )
    parser.add_argument(
        "--callback",
        dest="callbacks",
        action="append",
        default=None,
        metavar="MODULE:NAME",
        help="a custom callback(agent, metrics), imported from 'package.module:name' (a class "
        "is instantiated); repeatable",
    )
    return parser, field_names(run_flags) + list(_SPECIAL_FIELDS), field_names(agent_flags)


def _apply_file_values(
    parser: argparse.ArgumentParser, values: dict[str, Any], source: str
) -> None:
    """Set the parser's defaults from a config file's ``{field: value}`` (flags then
    override them), each value converted strictly by its flag's type."""
    from lmgym.training.flags import actions_by_dest, file_value

    where = f"--config {source}"
    actions = actions_by_dest(parser)
    fields = sorted(set(actions) - {"help", "config", "resume", "overwrite"})
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(fields)}"
        )
    defaults = {}
    for field, value in values.items():
        if field == "env_kwargs":
            if not isinstance(value, dict):
                raise ValueError(f"{where}: env_kwargs: expected a mapping, got {value!r}")
            defaults[field] = sorted(value.items())
        elif field == "callbacks":
            specs = [value] if isinstance(value, str) else value
            if not isinstance(specs, list) or not all(isinstance(v, str) for v in specs):
                raise ValueError(f"{where}: callbacks: expected a list of 'module:name' strings")
            defaults[field] = specs
        else:
            defaults[field] = file_value(actions[field], field, value, where)
    parser.set_defaults(**defaults)


def _split_namespace(
    namespace: argparse.Namespace, run_fields: list[str], agent_fields: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(TrainConfig values, agent config values)`` of a parsed command line."""
    values = vars(namespace)
    run = {name: values[name] for name in run_fields}
    agent = {name: values[name] for name in agent_fields}
    run["env_kwargs"] = dict(run["env_kwargs"] or [])
    run["callbacks"] = list(run["callbacks"] or [])
    for name, value in agent.items():
        if isinstance(value, list):  # nargs=2: a tuple field (adam_betas)
            agent[name] = tuple(value)
    return run, agent


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _error(command: str, message: str) -> int:
    """Print ``lmgym COMMAND: error: MESSAGE`` as one line (a library's multi-line message
    is joined) and return the exit status 2."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"lmgym {command}: error: {line}", file=sys.stderr)
    return 2


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _stopped_hint(run_dir: str | None) -> str:
    """How to continue a run that stopped on an error, when it has a checkpoint."""
    if not run_dir:
        return ""
    from lmgym.training.checkpoint import CheckpointManager
    from lmgym.training.run import RunDirectory

    try:
        latest = CheckpointManager(RunDirectory(run_dir).checkpoints).latest()
    except ValueError:
        return ""
    if latest is None:
        return ""
    return f"; its last complete checkpoint is {latest} (continue: lmgym train --resume {run_dir})"


def train(argv: Sequence[str]) -> int:
    """``lmgym train``: see the module docstring and docs/cli.md."""
    from lmgym.agents import ALGORITHMS
    from lmgym.persistence import CheckpointError, DirectoryLockedError
    from lmgym.training.config_file import ConfigFileError, flatten_config, read_config_file
    from lmgym.training.trainer import FixedOnResumeError, Trainer

    argv = list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algo", default=None)
    pre.add_argument("--config", default=None)
    pre.add_argument("--resume", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.algo is not None and known.algo not in ALGORITHMS:
        return _error(
            "train", f"unknown --algo {known.algo!r}; valid: {', '.join(sorted(ALGORITHMS))}"
        )
    if known.resume is not None and known.config is not None:
        return _error("train", "--config and --resume cannot be combined (a run keeps its config)")

    file_values: dict[str, Any] = {}
    source = known.config
    saved: dict[str, Any] | None = None
    try:
        if known.resume is not None:
            run = Trainer.find_run(known.resume)
            saved = run.read_config()
            file_values = flatten_config(saved, str(run.config_path))
            file_values.pop("run_dir", None)
            source = str(run.config_path)
        elif known.config is not None:
            file_values = read_config_file(known.config)
    except (ConfigFileError, OSError, ValueError) as exc:
        return _error("train", str(exc))

    algo = known.algo or file_values.get("algo") or "grpo"
    if algo not in ALGORITHMS:
        return _error(
            "train", f"unknown algo {algo!r} in {source}; valid: {', '.join(sorted(ALGORITHMS))}"
        )
    if saved is not None and known.algo is not None and known.algo != saved["algo"]:
        return _error(
            "train", f"--algo {known.algo} differs from the resumed run's {saved['algo']}"
        )
    file_values["algo"] = algo
    parser, run_fields, agent_fields = _train_parser(algo)
    try:
        # A resumed run's saved values are the defaults: a flag that changes one shows.
        _apply_file_values(parser, file_values, str(source))
    except ValueError as exc:
        return _error("train", str(exc))
    args = parser.parse_args(argv)
    run_values, agent_values = _split_namespace(args, run_fields, agent_fields)

    trainer: Trainer | None = None
    try:
        if saved is not None:
            for field, value in agent_values.items():
                old = saved["agent"].get(field)
                old = tuple(old) if isinstance(old, list) else old
                if value != old:
                    return _error(
                        "train",
                        f"--resume: {_flag(field)} {value!r} differs from the run's {old!r}; a "
                        "resumed run keeps its agent config (start a new run to change it)",
                    )
            if run_values["run_dir"] is not None:
                return _error(
                    "train",
                    "--run-dir cannot be combined with --resume (a run continues in "
                    "its own directory)",
                )
            changes = {k: v for k, v in run_values.items() if k != "run_dir"}
            try:
                _quiet_transformers()
                trainer = Trainer.resume(known.resume, changes=changes)
            except FixedOnResumeError as exc:
                return _error(
                    "train",
                    f"--resume: {_flag(exc.field)} {exc.value!r} differs from the run's "
                    f"{exc.old!r}; {exc.KEPT}",
                )
        else:
            config = TrainConfig(**run_values)
            try:
                agent_config = ALGORITHMS[algo].config_class(**agent_values)
            except TypeError as exc:
                return _error("train", str(exc))
            _quiet_transformers()
            trainer = Trainer(config, agent_config, overwrite=args.overwrite)
        result = trainer.run()
    except (CheckpointError, DirectoryLockedError, OSError, ValueError) as exc:
        # OSError includes a full disk (ENOSPC): checkpoints are all-or-nothing, so the
        # last complete one is intact.
        run_dir = trainer.config.run_dir if trainer is not None else None
        write_error = isinstance(exc, OSError) and not isinstance(
            exc, FileExistsError | FileNotFoundError
        )
        hint = _stopped_hint(run_dir) if write_error else ""
        return _error("train", f"{exc}{hint}")
    except FloatingPointError as exc:  # a non-finite loss, gradient or statistic
        run_dir = trainer.config.run_dir if trainer is not None else None
        return _error("train", f"{exc}{_stopped_hint(run_dir)}")
    except KeyboardInterrupt:
        run_dir = trainer.config.run_dir if trainer is not None else None
        hint = f"; continue from its last checkpoint: lmgym train --resume {run_dir}"
        print(f"\nlmgym train: interrupted{hint if run_dir else ''}", file=sys.stderr)
        return 130

    print(
        f"reward before: {result.before.reward_mean:.3f}   after: {result.after.reward_mean:.3f}"
        f"   ({len(result.history)} iterations in {result.seconds:.1f} s, "
        f"{result.tokens_generated} tokens generated)"
    )
    for prompt, completion, reward in result.after.samples[: trainer.config.samples]:
        print(f"  reward {reward:.2f}: {prompt!r} -> {completion!r}")
    return 0


# ------------------------------------------------------------------- eval
def _eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmgym eval",
        description="Evaluate a run's checkpoint (or any causal LM) on a task's eval prompts: "
        "mean reward, pass@k where the task has a verifier, mean completion length.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", help="run directory (its latest checkpoint) or a checkpoint")
    what.add_argument("--model", help="model directory or hub name (or a run/checkpoint)")
    parser.add_argument(
        "--task",
        default=None,
        help=f"task id, or 'your_module:YourTask-v0' (default: the run's, or {DEFAULT_TASK})",
    )
    parser.add_argument("--prompts", type=int, default=64, help="prompts drawn (default: 64)")
    parser.add_argument(
        "-k",
        "--k",
        type=int,
        default=8,
        help="completions per prompt, the k of pass@k (default: 8)",
    )
    parser.add_argument(
        "--split",
        choices=["eval", "train", "all"],
        default="eval",
        help="which prompts, where the task has a split (default: eval)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of prompt order and sampler")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature; 0 is greedy decoding (default: the run's, or 1)",
    )
    parser.add_argument(
        "--correct-threshold",
        type=float,
        default=None,
        help="reward counted as correct for pass@k (default: the task's maximum on verified tasks)",
    )
    parser.add_argument(
        "--env",
        action="append",
        type=_parse_env_kwarg,
        default=None,
        metavar="KEY=VALUE",
        help="an argument of the task's env factory (default: the run's); repeatable",
    )
    parser.add_argument("--samples", type=int, default=4, help="completions printed (default: 4)")
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="also write the result as JSON"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    return parser


def evaluate(argv: Sequence[str]) -> int:
    """``lmgym eval``: evaluate a run or a model."""
    import torch

    from lmgym.persistence import CheckpointError, check_agent_dir
    from lmgym.policy import CausalLMPolicy
    from lmgym.training.checkpoint import CheckpointManager, is_checkpoint
    from lmgym.training.env_args import check_env_kwargs
    from lmgym.training.evaluation import correct_threshold_for, evaluate_policy, make_eval_env
    from lmgym.training.model_source import resolve_model
    from lmgym.training.run import RunDirectory, check_device
    from lmgym.training.trainer import Trainer
    from lmgym.training.user_code import (
        check_prompt_file,
        check_task_factory,
        prepare_task,
        resolve_task,
    )

    args = _eval_parser().parse_args(list(argv))
    if args.prompts < 1 or args.k < 1:
        return _error("eval", f"--prompts and --k must be >= 1, got {args.prompts} and {args.k}")
    if args.temperature is not None and args.temperature < 0:
        return _error("eval", f"--temperature {args.temperature}: must be >= 0 (0: greedy)")
    torch.set_num_threads(args.threads)
    _quiet_transformers()
    target = args.run or args.model
    run_config: dict[str, Any] = {}
    try:
        check_device(args.device)
        path = Path(target)
        if args.run is not None or is_checkpoint(path) or RunDirectory(path).is_run():
            run, checkpoint = Trainer.find_checkpoint(path)
            saved = run.read_config()
            run_config = saved["run"]
            CheckpointManager.verify(checkpoint)
            model_path: Path | str = checkpoint / "agent" / "policy"
            label = str(checkpoint)
        elif (path / "policy").is_dir() and (path / "agent_config.json").is_file():
            check_agent_dir(path)  # a directory written by Agent.save
            model_path, label = path / "policy", target
        else:
            model_path, label = resolve_model(target), target
        if args.task is not None or not run_config:
            task = args.task or DEFAULT_TASK
            env_id = resolve_task(task)
        else:  # the run's task: its module imported, or its prompt file registered again
            changed = check_prompt_file(saved.get("imports"), "evaluate")
            if changed is not None:
                print(
                    f"lmgym eval: note: {changed}; evaluating on it as it is now", file=sys.stderr
                )
            fields = {f.name for f in dataclasses.fields(TrainConfig)}
            task = env_id = prepare_task(
                TrainConfig(**{k: v for k, v in run_config.items() if k in fields})
            )
            if run_config.get("prompts") is None:
                task = run_config["task"]
        check_task_factory(env_id, task)
        env_kwargs = check_env_kwargs(
            env_id, dict(args.env) if args.env else dict(run_config.get("env_kwargs", {}))
        )
        # `is None`, not `or`: --temperature 0 means greedy, not "the run's temperature".
        temperature = (
            args.temperature if args.temperature is not None else run_config.get("temperature", 1.0)
        )
        policy = CausalLMPolicy.from_pretrained(
            model_path, device=args.device, temperature=temperature
        )
        env, split = make_eval_env(
            env_id,
            policy.tokenizer,
            args.prompts,
            args.k,
            split=args.split,
            env_kwargs=env_kwargs,
            device=args.device,
        )
        threshold = (
            args.correct_threshold
            if args.correct_threshold is not None
            else correct_threshold_for(env_id)
        )
        result = evaluate_policy(
            policy, env, args.prompts, seed=args.seed, correct_threshold=threshold, split=split
        )
    except (CheckpointError, FileNotFoundError, ValueError, OSError) as exc:
        return _error("eval", str(exc))

    print(f"eval of {label} on {task} (split {split}): {args.prompts} prompts x {args.k} samples")
    print(f"  mean reward     {result.reward_mean:.4f}  (std {result.reward_std:.4f})")
    if result.pass_at_1 is not None and result.pass_at_k is not None:
        print(f"  pass@1          {result.pass_at_1:.4f}  (correct: reward >= {threshold:.6g})")
        print(f"  pass@{args.k:<11d}{result.pass_at_k:.4f}")
    else:
        print("  pass@k          -  (no verifier for this task; see --correct-threshold)")
    print(f"  mean length     {result.completion_length:.3f} tokens")
    for prompt, completion, reward in result.samples[: args.samples]:
        print(f"  reward {reward:.2f}: {prompt!r} -> {completion!r}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": label, "task": task, **result.to_json()}, indent=2) + "\n"
        )
    return 0


# ------------------------------------------------------------------ bench
def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _bench_parser() -> argparse.ArgumentParser:
    from lmgym.training.bench import DEFAULT_AGENTS, DEFAULT_OUT, DEFAULT_SEEDS, DEFAULT_TASKS

    parser = argparse.ArgumentParser(
        prog="lmgym bench",
        description="Train agents x tasks x seeds with equal budgets; write a Markdown table "
        "and PNG learning curves.",
    )
    parser.add_argument(
        "--agents",
        type=_csv_list,
        default=None,
        help=f"comma list, or all (default: {','.join(DEFAULT_AGENTS)})",
    )
    parser.add_argument(
        "--tasks",
        type=_csv_list,
        default=None,
        help="comma list of task ids, your own as module:TaskId-v0 "
        f"(default: {','.join(DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local directory or hub name of your causal LM, loaded afresh for every run "
        "(default: a tiny GPT-2 initialised with the run's seed)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="every agent's learning rate (default: the learning tests' rates, tuned for the "
        "tiny GPT-2; a pretrained model wants far less, e.g. 1e-6)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda t: [int(s) for s in _csv_list(t)],
        default=None,
        help=f"comma list (default: {','.join(map(str, DEFAULT_SEEDS))})",
    )
    parser.add_argument(
        "--iterations", type=int, default=None, help="iterations for every task (default: per task)"
    )
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per batch (default: 4)")
    parser.add_argument(
        "--group-size", type=int, default=8, help="completions per prompt (default: 8)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="runs at once, each in its own process with one torch thread; 0 runs them in "
        "this process (default: 1; 0 with --quick)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: TargetString, grpo and rloo, one seed, 6 iterations, in this process",
    )
    return parser


def bench(argv: Sequence[str]) -> int:
    """``lmgym bench``: the agent benchmark."""
    from lmgym.agents import ALGORITHMS
    from lmgym.training.bench import BenchOutputExistsError, BenchSpec, run_bench

    args = _bench_parser().parse_args(list(argv))
    _quiet_transformers()
    agents = sorted(ALGORITHMS) if args.agents == ["all"] else args.agents
    try:
        spec = BenchSpec.quick() if args.quick else BenchSpec()
        spec = spec.replace(
            agents=agents,
            model=args.model,
            learning_rate=args.learning_rate,
            tasks=args.tasks,
            seeds=args.seeds,
            iterations=args.iterations,
            num_prompts=args.num_prompts,
            group_size=args.group_size,
            workers=args.workers,
        )
        summary = run_bench(spec, args.out, overwrite=args.overwrite)
    except (BenchOutputExistsError, FileNotFoundError, ValueError) as exc:
        return _error("bench", str(exc))
    print(summary)
    return 0


# ------------------------------------------------------------------ tasks
def tasks(argv: Sequence[str]) -> int:
    """``lmgym tasks``: the registered tasks as a table."""
    from lmgym.envs import format_task_table

    print(format_task_table())
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "train": train,
    "eval": evaluate,
    "bench": bench,
    "tasks": tasks,
}
USAGE = (
    "usage: lmgym {train,eval,bench,tasks} [options]\n"
    "  train   train an agent (lmgym train --help; --algo ppo --help for PPO's fields)\n"
    "  eval    evaluate a run or a model (mean reward, pass@k, length)\n"
    "  bench   compare agents on tasks over seeds (table + learning curves)\n"
    "  tasks   list the registered tasks"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (argparse errors give 2, ``--help`` 0)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] not in COMMANDS:
        print(f"lmgym: unknown command {argv[0]!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        print(USAGE)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2


if __name__ == "__main__":
    raise SystemExit(main())
