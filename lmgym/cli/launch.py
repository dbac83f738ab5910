"""How ``lmgym train`` starts its processes: ``--nproc-per-node`` (data parallel through
torch's launcher) and the asynchronous actor-learner flags (docs/distributed.md,
docs/async.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def flag(field: str) -> str:
    """The command-line flag of a config field: ``learning_rate`` -> ``--learning-rate``."""
    return "--" + field.replace("_", "-")


# Flags of the launch (not TrainConfig fields; not in a config file).
LAUNCH_FLAGS = (
    "nproc_per_node",
    "actors",
    "learners",
    "max_staleness",
    "stale_policy",
    "weight_sync",
    "keep_kv_cache",
    "async_timeout_s",
)


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """``--nproc-per-node`` (data parallel) and the asynchronous actor-learner's flags."""
    from lmgym.agents.config import field_help
    from lmgym.asynchronous import AsyncConfig
    from lmgym.cli.flags import add_typed_flag

    helps = field_help(AsyncConfig)  # type: ignore[arg-type]
    group = parser.add_argument_group(
        "processes", "data parallel (docs/distributed.md) and asynchronous (docs/async.md)"
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
    for name, kind in (("actors", int), ("learners", int), ("max_staleness", int)):
        add_typed_flag(
            group, flag(name), kind=kind, default=None, help=f"async: {helps[name]} (default: 1)"
        )
    group.add_argument(
        "--stale-policy", choices=["wait", "drop"], default=None, help=helps["stale_policy"]
    )
    group.add_argument(
        "--weight-sync",
        choices=["in_flight", "row_boundary"],
        default=None,
        help=helps["weight_sync"],
    )
    add_typed_flag(
        group,
        "--keep-kv-cache",
        kind=bool,
        default=None,
        metavar="BOOL",
        help=helps["keep_kv_cache"],
    )
    add_typed_flag(
        group, "--async-timeout-s", kind=float, default=None, help="async: " + helps["timeout_s"]
    )


def async_config(args: argparse.Namespace) -> Any:
    """The ``AsyncConfig`` the flags ask for, or ``None`` for a synchronous run."""
    from lmgym.asynchronous import AsyncConfig

    values = {
        name: getattr(args, name)
        for name in LAUNCH_FLAGS
        if name != "nproc_per_node" and getattr(args, name) is not None
    }
    if not values:
        return None
    if "async_timeout_s" in values:
        values["timeout_s"] = values.pop("async_timeout_s")
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
