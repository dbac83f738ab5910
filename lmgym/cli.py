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
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmgym.training.run import DEFAULT_TASK, FIXED_ON_RESUME, TrainConfig

# Fields whose flags are not generated from their annotation.
_SPECIAL_FIELDS = ("env_kwargs", "callbacks")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _flag_type(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """argparse ``type`` and extra kwargs for a config field annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = origin in (typing.Union, types.UnionType) and len(args) < len(
        typing.get_args(annotation)
    )
    if optional and len(args) == 1:
        inner, extra = _flag_type(args[0])

        def maybe(text: str) -> Any:
            return None if text.lower() == "none" else inner(text)

        maybe.__name__ = getattr(inner, "__name__", "value")
        return maybe, extra
    if origin is typing.Literal:
        return str, {"choices": list(typing.get_args(annotation))}
    if origin is tuple:
        return float, {"nargs": len(typing.get_args(annotation))}
    if annotation is bool:
        # `--flag` alone means true; `--flag false` is accepted too.
        return _parse_bool, {"metavar": "{true,false}", "nargs": "?", "const": True}
    return annotation, {}


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def add_config_flags(
    parser: argparse.ArgumentParser,
    config_class: type,
    *,
    prefix: str = "config",
    skip: Sequence[str] = (),
    suppress: bool = False,
    choices: dict[str, list[str]] | None = None,
) -> None:
    """One ``--field-name`` flag per config field, typed, with its default and help.

    Args:
        parser: the parser to extend (one argument group per config class).
        config_class: a config dataclass whose field docstrings are the help.
        prefix: the flags' ``dest`` is ``<prefix>.<field>``.
        skip: fields to leave out.
        suppress: leave unset flags out of the namespace (finds what was given).
        choices: valid values of some fields.
    """
    from lmgym.agents.config import field_help

    helps = field_help(config_class)
    hints = typing.get_type_hints(config_class)
    group = parser.add_argument_group(f"{config_class.__name__} fields")
    for field in dataclasses.fields(config_class):
        if field.name in skip:
            continue
        kind, extra = _flag_type(hints[field.name])
        if choices and field.name in choices:
            extra = {**extra, "choices": choices[field.name]}
        default = _default_of(field)
        if "metavar" not in extra and "choices" not in extra:
            extra = {**extra, "metavar": getattr(kind, "__name__", "VALUE").upper()}
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=f"{prefix}.{field.name}",
            type=kind,
            default=argparse.SUPPRESS if suppress else default,
            help=f"{helps.get(field.name, '')} (default: {default})",
            **extra,
        )


def _parse_env_kwarg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _train_parser(algo: str, suppress: bool = False) -> argparse.ArgumentParser:
    from lmgym.agents import ALGORITHMS

    default: Callable[[Any], Any] = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    parser = argparse.ArgumentParser(
        prog="lmgym train",
        description="Train an agent on an lmgym task. Every TrainConfig and agent config "
        "field is a flag; --config FILE sets them from JSON/YAML (flags override).",
    )
    parser.add_argument("--config", default=default(None), help="JSON or YAML file of field values")
    parser.add_argument(
        "--resume",
        default=default(None),
        metavar="RUN_DIR",
        help="continue a run (its latest checkpoint, or the checkpoint directory given); "
        "--iterations is then the new total",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        default=default(False),
        help="replace the run directory if it exists (only an lmgym run directory)",
    )
    add_config_flags(
        parser,
        TrainConfig,
        prefix="run",
        skip=_SPECIAL_FIELDS,
        suppress=suppress,
        choices={"algo": sorted(ALGORITHMS)},
    )
    parser.add_argument(
        "--env",
        dest="run.env_kwargs",
        action="append",
        type=_parse_env_kwarg,
        default=default(None),
        metavar="KEY=VALUE",
        help="an argument of the task's env factory, e.g. --env reward_mode=per_token "
        "(VALUE converted to the parameter's type: booleans from true/false/yes/no/1/0 only); "
        "repeatable",
    )
    parser.add_argument(
        "--callback",
        dest="run.callbacks",
        action="append",
        default=default(None),
        metavar="MODULE:NAME",
        help="a custom callback(agent, metrics), imported from 'package.module:name' (a class "
        "is instantiated); repeatable",
    )
    add_config_flags(parser, ALGORITHMS[algo].config_class, suppress=suppress)
    return parser


def _actions_by_field(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        action.dest.split(".", 1)[1]: action
        for action in parser._actions
        if action.dest.startswith(("run.", "config."))
    }


def _convert_file_value(action: argparse.Action, field: str, value: Any, source: str) -> Any:
    """A config-file value checked and converted like the flag would be."""
    where = f"--config {source}: {field}"
    if field == "env_kwargs":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return sorted(value.items())
    if field == "callbacks":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}: expected a list of 'module:name' strings")
        return values
    convert = action.type or (lambda text: text)
    name = getattr(convert, "__name__", "value")
    if isinstance(action.nargs, int):
        if not isinstance(value, list | tuple) or len(value) != action.nargs:
            raise ValueError(f"{where}: expected a list of {action.nargs} values, got {value!r}")
        items = list(value)
    else:
        items = [value]
    out = []
    for item in items:
        text = (
            "none" if item is None else str(item).lower() if isinstance(item, bool) else str(item)
        )
        try:
            converted = convert(text)  # type: ignore[operator]
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ValueError(f"{where}: invalid {name} value: {item!r}") from None
        if action.choices is not None and converted not in action.choices:
            raise ValueError(
                f"{where}: invalid choice: {item!r} (choose from {', '.join(map(str, action.choices))})"
            )
        out.append(converted)
    return out if isinstance(action.nargs, int) else out[0]


def _apply_file_values(
    parser: argparse.ArgumentParser, values: dict[str, Any], source: str
) -> None:
    """Set the parser's defaults from a config file's ``{field: value}``."""
    actions = _actions_by_field(parser)
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise ValueError(
            f"--config {source}: unknown field(s) {', '.join(unknown)}; valid fields: "
            f"{', '.join(sorted(actions))}"
        )
    parser.set_defaults(
        **{
            actions[field].dest: _convert_file_value(actions[field], field, value, source)
            for field, value in values.items()
        }
    )


def _split_namespace(namespace: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    run, agent = {}, {}
    for key, value in vars(namespace).items():
        if key.startswith("run."):
            run[key[4:]] = value
        elif key.startswith("config."):
            agent[key[7:]] = value
    if "env_kwargs" in run:
        run["env_kwargs"] = dict(run["env_kwargs"] or [])
    if "callbacks" in run:
        run["callbacks"] = list(run["callbacks"] or [])
    if "adam_betas" in agent:
        agent["adam_betas"] = tuple(agent["adam_betas"])
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
    from lmgym.training.config_file import ConfigFileError, read_config_file
    from lmgym.training.env_args import check_env_kwargs
    from lmgym.training.trainer import Trainer, check_task

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
            from lmgym.training.config_file import flatten_config

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
    parser = _train_parser(algo)
    try:
        _apply_file_values(parser, file_values, str(source))
    except ValueError as exc:
        return _error("train", str(exc))
    args = parser.parse_args(argv)
    run_values, agent_values = _split_namespace(args)
    try:
        check_task(run_values["task"])
        run_values["env_kwargs"] = check_env_kwargs(run_values["task"], run_values["env_kwargs"])
    except ValueError as exc:
        return _error("train", str(exc))

    trainer: Trainer | None = None
    try:
        if saved is not None:
            given_run, given_agent = _split_namespace(
                _train_parser(algo, suppress=True).parse_args(argv)
            )
            if "env_kwargs" in given_run:
                given_run["env_kwargs"] = check_env_kwargs(
                    saved["run"]["task"], given_run["env_kwargs"]
                )
            for field, value in given_agent.items():
                old = saved["agent"][field]
                old = tuple(old) if isinstance(old, list) else old
                if value != old:
                    return _error(
                        "train",
                        f"--resume: {_flag(field)} {value!r} differs from the run's {old!r}; a "
                        "resumed run keeps its agent config (start a new run to change it)",
                    )
            if "run_dir" in given_run:
                return _error(
                    "train",
                    "--run-dir cannot be combined with --resume (a run continues in "
                    "its own directory)",
                )
            for field in FIXED_ON_RESUME:
                if field in given_run and given_run[field] != saved["run"][field]:
                    return _error(
                        "train",
                        f"--resume: {_flag(field)} {given_run[field]!r} differs from the run's "
                        f"{saved['run'][field]!r}; a resumed run keeps its algorithm, task, "
                        "model, batch shape, temperature and env arguments",
                    )
            _quiet_transformers()
            trainer = Trainer.resume(known.resume, changes=given_run)
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
        "--task", default=None, help=f"task id (default: the run's, or {DEFAULT_TASK})"
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
    from lmgym.training.trainer import Trainer, check_task

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
            run_config = run.read_config()["run"]
            CheckpointManager.verify(checkpoint)
            model_path: Path | str = checkpoint / "agent" / "policy"
            label = str(checkpoint)
        elif (path / "policy").is_dir() and (path / "agent_config.json").is_file():
            check_agent_dir(path)  # a directory written by Agent.save
            model_path, label = path / "policy", target
        else:
            model_path, label = resolve_model(target), target
        task = args.task or run_config.get("task") or DEFAULT_TASK
        check_task(task)
        env_kwargs = check_env_kwargs(
            task, dict(args.env) if args.env else dict(run_config.get("env_kwargs", {}))
        )
        # `is None`, not `or`: --temperature 0 means greedy, not "the run's temperature".
        temperature = (
            args.temperature if args.temperature is not None else run_config.get("temperature", 1.0)
        )
        policy = CausalLMPolicy.from_pretrained(
            model_path, device=args.device, temperature=temperature
        )
        env, split = make_eval_env(
            task,
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
            else correct_threshold_for(task)
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
        help=f"comma list (default: {','.join(DEFAULT_AGENTS)})",
    )
    parser.add_argument(
        "--tasks",
        type=_csv_list,
        default=None,
        help=f"comma list of task ids (default: {','.join(DEFAULT_TASKS)})",
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
    from lmgym.training.bench import BenchOutputExistsError, BenchSpec, run_bench

    args = _bench_parser().parse_args(list(argv))
    _quiet_transformers()
    try:
        spec = BenchSpec.quick() if args.quick else BenchSpec()
        spec = spec.replace(
            agents=args.agents,
            tasks=args.tasks,
            seeds=args.seeds,
            iterations=args.iterations,
            num_prompts=args.num_prompts,
            group_size=args.group_size,
            workers=args.workers,
        )
        summary = run_bench(spec, args.out, overwrite=args.overwrite)
    except (BenchOutputExistsError, ValueError) as exc:
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
