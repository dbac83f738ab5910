"""``lmgym train``'s command line, read into a ``TrainRequest``, and the ``Trainer`` it asks for.

Every field of ``TrainConfig`` and of the chosen algorithm's config is a flag
(``lmgym.cli.flags``); ``--config FILE`` (or the resumed run's ``config.json``)
gives the defaults the flags override. Nothing here starts a process or writes a
file: ``lmgym.cli.train`` decides (``launch``) and runs.

Config files (``--config FILE``): JSON always, YAML when pyyaml is installed. A file
is a mapping of field names (``learning_rate`` or ``learning-rate``) to values, either
flat::

    algo: ppo
    task: lmgym/LengthControl-v0
    iterations: 200
    learning_rate: 3.0e-4
    env_kwargs: {reward_mode: per_token}

or in the sections a run's ``config.json`` uses (``{"algo", "run": {...},
"agent": {...}}``), so ``--config runs/x/config.json`` repeats run ``x`` (in a
new run directory). Flags on the command line override the file's values.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmgym.cli.common import add_env_flag, file_given_as_count, quiet_transformers
from lmgym.cli.launch import (
    add_launch_flags,
    async_config,
    async_flags,
    flag,
    launch_flag_names,
    pop_nproc,
)
from lmgym.training.ranks import launched_ranks
from lmgym.training.run import RUN_MARKER, TrainConfig


class UsageError(ValueError):
    """A command line ``lmgym train`` refuses (the message is the one line it prints)."""


class ConfigFileError(ValueError):
    """A config file that cannot be read or has the wrong shape."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML config file into one flat ``{field_name: value}`` mapping.

    Raises:
        ConfigFileError: missing file, unknown extension, a parse error, YAML without
            pyyaml, or not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigFileError(f"--config {path}: no such file")
    text = path.read_text()
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigFileError(f"--config {path}: invalid JSON: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigFileError(
                f"--config {path}: reading YAML needs pyyaml (pip install pyyaml); "
                "or write the config as JSON"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigFileError(f"--config {path}: invalid YAML: {exc}") from None
    else:
        raise ConfigFileError(
            f"--config {path}: unknown extension {path.suffix!r}; use .json, .yaml or .yml"
        )
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"--config {path}: expected a mapping of field names to values, got "
            f"{type(data).__name__}"
        )
    flat = flatten_config(data, str(path))
    if RUN_MARKER in data:
        flat.pop("run_dir", None)  # repeating a saved run: a new directory, not the old one
    return flat


def flatten_config(data: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Merge a ``{"run": ..., "agent": ...}`` config into one flat mapping; keys get
    underscores. A flat mapping passes through (keys normalised)."""
    flat: dict[str, Any] = {}
    sections = {"run", "agent"}
    for key, value in data.items():
        if key == RUN_MARKER or (key in ("imports", "launch") and RUN_MARKER in data):
            continue  # a run's "imports" and "launch" are records of how it ran
        if key in sections:
            if not isinstance(value, dict):
                raise ConfigFileError(f"--config {source}: section {key!r} must be a mapping")
            for inner, inner_value in value.items():
                flat[str(inner).replace("-", "_")] = inner_value
        else:
            flat[str(key).replace("-", "_")] = value
    return flat


ASYNC_RESUME_REFUSED = (
    "--resume cannot be combined with --actors/--learners: a resumed run continues on the "
    "synchronous path (asynchronous runs cannot be resumed as such: docs/async.md)"
)


# TrainConfig fields with flags of their own (repeatable KEY=VALUE / MODULE:NAME).
_SPECIAL_FIELDS = ("env_kwargs", "callbacks")


def _train_parser(algo: str) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """The ``lmgym train`` parser for ``algo``: ``(parser, TrainConfig fields, agent fields)``.

    The typed flags of both config classes come from ``HfArgumentParser``
    (``lmgym.cli.flags``); the run's own flags are added here.
    """
    from lmgym.agents import ALGORITHMS
    from lmgym.cli.flags import field_names, flag_dataclass, make_parser

    run_flags = flag_dataclass(
        TrainConfig, skip=_SPECIAL_FIELDS, choices={"algo": sorted(ALGORITHMS)}
    )
    agent_flags = flag_dataclass(ALGORITHMS[algo].config_class)
    parser = make_parser(
        [run_flags, agent_flags, async_flags()],
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
    add_env_flag(parser, "adds to the config file's")
    parser.add_argument(
        "--callback",
        dest="callbacks",
        action="append",
        default=None,
        metavar="MODULE:NAME",
        help="a custom callback(agent, metrics), imported from 'package.module:name' (a class "
        "is instantiated); repeatable",
    )
    add_launch_flags(parser)
    return parser, field_names(run_flags) + list(_SPECIAL_FIELDS), field_names(agent_flags)


def _apply_file_values(
    parser: argparse.ArgumentParser, values: dict[str, Any], source: str
) -> None:
    """Set the parser's defaults from a config file's ``{field: value}`` (flags then
    override them), each value converted by ``parse_value`` with its field's type, as
    the flag converts what it is given."""
    import typing

    from lmgym.cli.flags import flag_annotations
    from lmgym.typed_values import parse_value

    where = f"--config {source}"
    hints = typing.get_type_hints(TrainConfig)
    launch = launch_flag_names()
    typed = {f: kind for f, kind in flag_annotations(parser).items() if f not in launch}
    annotations = {**typed, **{f: hints[f] for f in _SPECIAL_FIELDS}}
    unknown = sorted(set(values) - set(annotations))
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid fields: "
            f"{', '.join(sorted(annotations))}"
        )
    defaults = {
        field: parse_value(field, value, annotations[field], where=where)
        for field, value in values.items()
    }
    if "env_kwargs" in defaults:  # --env appends (key, value) pairs to these
        defaults["env_kwargs"] = sorted(defaults["env_kwargs"].items())
    parser.set_defaults(**defaults)


def _split_namespace(
    namespace: argparse.Namespace, run_fields: list[str], agent_fields: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(TrainConfig values, agent config values)`` of a parsed command line."""
    values = vars(namespace)
    run = {name: values[name] for name in run_fields}
    agent = {name: values[name] for name in agent_fields}
    run["env_kwargs"] = dict(run["env_kwargs"] or [])
    # --env and --callback add to the config file's (or the resumed run's) entries.
    run["callbacks"] = list(dict.fromkeys(run["callbacks"] or []))
    return run, agent


def _pretrained_defaults(run: dict[str, Any], agent: dict[str, Any], given: set[str]) -> None:
    """Apply ``PRETRAINED_DEFAULTS`` where the user set nothing; print the line (rank 0)."""
    from lmgym.training.pretrained import apply_pretrained_defaults

    line = apply_pretrained_defaults(run, agent, given)
    if line is not None and os.environ.get("RANK", "0") == "0":
        print(line)


@dataclass
class TrainRequest:
    """What an ``lmgym train`` command line asks for.

    Attributes:
        argv: the command line without ``--nproc-per-node``.
        processes: start this many processes of ``argv`` here through torch's launcher
            (``None``: train in this process).
        resume: ``--resume``'s path, or ``None``.
        overwrite: ``--overwrite``.
        algo: the algorithm.
        run_values, agent_values: ``TrainConfig`` and agent config values.
        async_config: the ``AsyncConfig`` of an asynchronous run, else ``None``.
    """

    argv: list[str]
    processes: int | None
    resume: str | None
    overwrite: bool
    algo: str
    run_values: dict[str, Any]
    agent_values: dict[str, Any]
    async_config: Any


def _known(argv: list[str]) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    for name in ("--algo", "--config", "--resume", "--actors", "--learners"):
        pre.add_argument(name, default=None)
    pre.add_argument("--model", default=None)
    pre.add_argument("--lora-r", "--lora_r", dest="lora_r", default=None)
    return pre.parse_known_args(argv)[0]


def _show_pretrained_defaults(
    parser: argparse.ArgumentParser, known: argparse.Namespace, values: dict[str, Any]
) -> None:
    """Make ``--help`` show the defaults a run with ``--model`` gets (``PRETRAINED_DEFAULTS``):
    set them as the parser's defaults for the fields the config file does not set. The
    values the run uses are applied after parsing (``_pretrained_defaults``), the same."""
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS

    model = known.model if known.model is not None else values.get("model")
    if model is None or str(model).lower() in ("none", "null"):
        return
    lora_r = known.lora_r if known.lora_r is not None else values.get("lora_r", 0)
    try:
        lora = int(lora_r) > 0
    except (TypeError, ValueError):
        return  # the parser names the bad value
    from lmgym.policy.adapters import is_adapter_dir

    lora = lora or is_adapter_dir(str(model))  # as apply_pretrained_defaults decides
    defaults = {
        field: value
        for field, (_, value) in PRETRAINED_DEFAULTS.values(lora).items()
        if field not in values and any(a.dest == field for a in parser._actions)
    }
    parser.set_defaults(**defaults)


def _file_values(known: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """``(values, source)`` of ``--config`` or of the resumed run's ``config.json``."""
    from lmgym.training.resume import saved_values

    if known.resume is not None:
        run, saved = saved_values(known.resume)
        values = flatten_config(saved, str(run.config_path))
        values.pop("run_dir", None)
        return values, str(run.config_path)
    if known.config is not None:
        return read_config_file(known.config), known.config
    return {}, None


def _processes(nproc: int | None, config: Any, resume: str | None) -> int | None:
    """How many processes to start from here (``None``: train in this one)."""
    if config is not None:
        if resume is not None:
            raise UsageError(ASYNC_RESUME_REFUSED)
        world = config.world_size
        if nproc is not None and nproc != world:
            raise UsageError(
                f"--nproc-per-node {nproc} differs from --actors {config.actors} + "
                f"--learners {config.learners} = {world}; drop --nproc-per-node"
            )
        return world if launched_ranks() <= 1 else None
    return nproc if nproc is not None and nproc > 1 else None


def parse_train(argv: Sequence[str]) -> TrainRequest:
    """Read an ``lmgym train`` command line.

    Raises:
        UsageError: a refused combination or value (one line).
        SystemExit: argparse's ``--help`` (0) or usage error (2).
    """
    from lmgym.cli.flags import given_fields
    from lmgym.training.build import check_algo

    nproc, argv = pop_nproc(list(argv))
    if nproc is not None:
        if launched_ranks() > 1:
            raise UsageError(
                "--nproc-per-node: this process was already started by torchrun (WORLD_SIZE="
                f"{launched_ranks()}); give --nproc-per-node to torchrun or to lmgym train, "
                "not both"
            )
        if nproc < 1:
            raise UsageError(f"--nproc-per-node {nproc}: must be >= 1")
    moved = file_given_as_count(
        argv,
        "--eval-prompts",
        "the number of prompts per evaluation",
        "a file of held-out prompts is --eval-prompts-file {}",
    )
    if moved is not None:
        raise UsageError(moved)
    known = _known(argv)
    if known.resume is not None and (known.actors or known.learners) is not None:
        raise UsageError(ASYNC_RESUME_REFUSED)
    if known.resume is not None and known.config is not None:
        raise UsageError("--config and --resume cannot be combined (a run keeps its config)")
    values, source = _file_values(known)
    algo = known.algo or values.get("algo") or "grpo"
    try:  # checked here, before the parser (it is built for the algo)
        check_algo(algo, "--algo" if known.algo is not None else f"algo (in {source})")
    except ValueError as err:
        raise UsageError(str(err)) from None
    if known.resume is not None and known.algo is not None and known.algo != values["algo"]:
        raise UsageError(f"--algo {known.algo} differs from the resumed run's {values['algo']}")
    values["algo"] = algo
    parser, run_fields, agent_fields = _train_parser(algo)
    # A resumed run's saved values are the defaults: a flag that changes one shows.
    _apply_file_values(parser, values, str(source))
    if known.resume is None:  # --help with --model shows the defaults the run will use
        _show_pretrained_defaults(parser, known, values)
    args = parser.parse_args(argv)
    run_values, agent_values = _split_namespace(args, run_fields, agent_fields)
    try:
        config = async_config(args)
    except TypeError as exc:
        raise UsageError(str(exc)) from None
    if known.resume is None:  # a fresh run on a pretrained model: its defaults, said in one line
        _pretrained_defaults(run_values, agent_values, given_fields(parser, argv) | {*values})
    elif run_values["run_dir"] is not None:
        raise UsageError(
            "--run-dir cannot be combined with --resume (a run continues in its own directory)"
        )
    return TrainRequest(
        argv=argv,
        processes=_processes(nproc, config, known.resume),
        resume=known.resume,
        overwrite=args.overwrite,
        algo=algo,
        run_values=run_values,
        agent_values=agent_values,
        async_config=config,
    )


def make_trainer(request: TrainRequest) -> Any:
    """The ``Trainer`` a request asks for (a resume's rules: ``lmgym.training.resume``).

    Raises:
        UsageError: a resume would change what a resumed run keeps (naming the flag).
        ValueError, TypeError: a value no run can use.
    """
    from lmgym.training.resume import FixedOnResumeError
    from lmgym.training.trainer import Trainer

    quiet_transformers()
    if request.resume is not None:
        try:
            return Trainer.resume(
                request.resume, changes=request.run_values, agent_changes=request.agent_values
            )
        except FixedOnResumeError as exc:
            raise UsageError(
                f"--resume: {flag(exc.field)} {exc.value!r} differs from the run's {exc.old!r}; "
                f"{exc.KEPT}"
            ) from None
    config, agent_config = _fresh_configs(request)
    return Trainer(
        config, agent_config, overwrite=request.overwrite, async_config=request.async_config
    )


def _fresh_configs(request: TrainRequest) -> tuple[TrainConfig, Any]:
    """``(TrainConfig, agent config)`` of a fresh run's request (not yet checked)."""
    from lmgym.training.resume import agent_config_from_dict

    try:
        agent_config = agent_config_from_dict(request.algo, request.agent_values)
    except TypeError as exc:
        raise UsageError(str(exc)) from None
    return TrainConfig(**request.run_values), agent_config


def check_before_launch(request: TrainRequest) -> None:
    """Refuse here, before any process of a launch starts, what every one of them would
    refuse alike: the run's and the agent's values (``resolve``: the task, its env
    arguments, the shared agent fields), and a ``num_minibatches`` that does
    not divide each process's batch of ``num_prompts * group_size`` rows (data parallel
    gives each rank that many; so does an asynchronous run each actor and learner). A
    resume's saved values were checked when its run started; its processes check what
    it changes.

    Raises:
        UsageError, ValueError, TypeError: as ``make_trainer``.
    """
    if request.resume is not None:
        return
    from lmgym.agents.config import check_complete
    from lmgym.envs.options import rows_of
    from lmgym.training.resolved import resolve

    run = resolve(*_fresh_configs(request))
    check_complete(run.agent_config, rows_of(run.config.num_prompts, run.config.group_size))
