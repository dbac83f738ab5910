"""The ``lmgym`` entry point: the command name chooses ``train``, ``eval``, ``bench`` or ``tasks``.

Each command's module is imported only when it runs, so ``lmgym tasks`` does not load
torch's launcher and ``lmgym eval`` does not load the benchmark.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _train(argv: Sequence[str]) -> int:
    from lmgym.cli.train import train

    return train(argv)


def _eval(argv: Sequence[str]) -> int:
    from lmgym.cli.eval import run_eval

    return run_eval(argv)


def _bench(argv: Sequence[str]) -> int:
    from lmgym.cli.bench import bench

    return bench(argv)


def _tasks(argv: Sequence[str]) -> int:
    """``lmgym tasks``: the registered tasks as a table."""
    from lmgym.envs import format_task_table

    print(format_task_table())
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "train": _train,
    "eval": _eval,
    "bench": _bench,
    "tasks": _tasks,
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
