"""How ``lmgym train`` starts its processes: ``--nproc-per-node`` (data parallel through
torch's launcher) and the asynchronous actor-learner flags (docs/distributed.md,
docs/async.md)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any


def flag(field: str) -> str:
    """The command-line flag of a config field: ``learning_rate`` -> ``--learning-rate``."""
    return "--" + field.replace("_", "-")


# AsyncConfig's fields with flags of their own name (--async-timeout-s: "timeout" alone
# would read as the run's).
_RENAMED = {"timeout_s": "async_timeout_s"}


def _async_fields() -> list[str]:
    from lmgym.asynchronous import AsyncConfig

    return [f.name for f in dataclasses.fields(AsyncConfig)]


def launch_flag_names() -> tuple[str, ...]:
    """The flags of the launch (not ``TrainConfig`` fields; not in a config file)."""
    return ("nproc_per_node", *(_RENAMED.get(name, name) for name in _async_fields()))


def async_flags() -> type:
    """``AsyncConfig``'s fields as flags (``flag_dataclass``), each ``None`` unless given:
    any of them makes the run asynchronous (``async_config``)."""
    from lmgym.asynchronous import AsyncConfig
    from lmgym.cli.flags import flag_dataclass

    defaults = {
        f.name: f.default for f in dataclasses.fields(AsyncConfig) if f.name not in _RENAMED
    }
    return flag_dataclass(
        AsyncConfig,
        skip=tuple(_RENAMED),
        defaults=dict.fromkeys(defaults),
        notes={name: f"Async; default {value}." for name, value in defaults.items()},
        group="asynchronous actor-learner (docs/async.md): any of these makes the run one",
    )


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """``--nproc-per-node`` (data parallel) and ``--async-timeout-s``; the other
    asynchronous flags are ``async_flags``."""
    from lmgym.agents.config import field_help
    from lmgym.asynchronous import AsyncConfig
    from lmgym.cli.flags import add_typed_flag

    group = parser.add_argument_group(
        "processes", "data parallel (docs/distributed.md); the asynchronous run's timeout"
    )
    add_typed_flag(
        group,
        "--nproc-per-node",
        kind=int,
        default=None,
        metavar="N",
        help="start N data-parallel processes on this machine through torch's launcher "
        "(torchrun); --num-prompts is per process. Several machines: run torchrun "
        "--nnodes ... -m lmgym train yourself (docs/distributed.md)",
    )
    for name, flag_name in _RENAMED.items():
        add_typed_flag(
            group,
            flag(flag_name),
            kind=typing.get_type_hints(AsyncConfig)[name],
            default=None,
            metavar="SECONDS",
            help=f"Async: {field_help(AsyncConfig)[name]} Default "  # type: ignore[arg-type]
            f"{AsyncConfig.__dataclass_fields__[name].default}.",
        )


def async_config(args: argparse.Namespace) -> Any:
    """The ``AsyncConfig`` the flags ask for, or ``None`` for a synchronous run."""
    from lmgym.asynchronous import AsyncConfig

    values = {
        name: getattr(args, _RENAMED.get(name, name))
        for name in _async_fields()
        if getattr(args, _RENAMED.get(name, name)) is not None
    }
    if not values:
        return None
    config = AsyncConfig(**values)
    config.check()
    return config


def pop_nproc(argv: list[str]) -> tuple[int | None, list[str]]:
    """``(--nproc-per-node N or None, argv without it)``."""
    from lmgym.cli.flags import add_typed_flag

    pre = argparse.ArgumentParser(prog="lmgym train", add_help=False)
    add_typed_flag(pre, "--nproc-per-node", "--nproc_per_node", kind=int, default=None)
    known, _ = pre.parse_known_args(argv)
    if known.nproc_per_node is None:
        return None, argv
    rest, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--nproc-per-node", "--nproc_per_node"):
            skip = "=" not in arg and i + 1 < len(argv)
            continue
        rest.append(arg)
    return known.nproc_per_node, rest


def launch(nproc: int, argv: list[str]) -> int:
    """Start ``nproc`` processes of ``lmgym train ARGV`` on this machine through torch's own
    launcher (``torchrun --standalone --nproc-per-node N -m lmgym train ARGV``).

    Returns:
        0, or the exit status of the first process that failed (2: bad input).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "-m", "lmgym", "train", *argv]
    )
    try:
        run(args)
    except ChildFailedError as exc:
        codes = [f.exitcode for _, f in sorted(exc.failures.items()) if f.exitcode]
        return next((c for c in codes if c > 0), 1)
    return 0


def _peek_device(argv: Sequence[str]) -> str:
    """``--device`` of a command line that could not be read whole (default ``cpu``)."""
    import torch

    pre = argparse.ArgumentParser(prog="lmgym train", add_help=False)
    pre.add_argument("--device", default="cpu")
    device = pre.parse_known_args(list(argv))[0].device
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        return "cpu"
    return device


def agree_to_start(failure: str | None, trainer: Any, argv: Sequence[str]) -> str | None:
    """Under torchrun: join the process group and share every rank's start-up outcome.

    Args:
        failure: this rank's one-line refusal of its command line, or ``None``.
        trainer: this rank's ``Trainer`` when it was built (its device and, for an
            asynchronous run, its timeout choose the process group's).
        argv: the command line (its ``--device`` when no trainer was built).

    Returns:
        ``None`` when every rank can start; else this rank's refusal, or the first
        failing rank's, as one line.
    """
    from lmgym.distributed import DEFAULT_TIMEOUT_S
    from lmgym.training.ranks import Ranks, local_device

    timeout = DEFAULT_TIMEOUT_S
    if trainer is not None:
        device = trainer.config.device
        if trainer.async_config is not None:
            timeout = trainer.async_config.timeout_s
    else:
        device = _peek_device(argv)
    local_device(device)
    outcomes = Ranks.start(device, timeout).gather(failure)
    first = next(((rank, text) for rank, text in enumerate(outcomes) if text), None)
    if failure is not None or first is None:
        return failure
    return f"rank {first[0]} failed, so this rank stops too: {first[1]}"
