"""``lmgym train``: read the command line (``lmgym.cli.train_args``), start the processes
it asks for (``lmgym.cli.launch``) or train here, and report the result or a one-line error."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmgym.cli.common import error as _error
from lmgym.training.sample_text import sample_line


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
    from lmgym.distributed import shutdown

    try:
        return _train(argv)
    finally:
        shutdown()


def _start(argv: Sequence[str]) -> tuple[Any, Any]:
    """``(request, trainer)`` of a command line, or ``(None, exit status)``.

    Under torchrun every rank reads its own command line, then the ranks agree before
    training: when one refuses its flags, every rank exits 2 with one line naming the
    value (``agree_to_start``), instead of the others failing on a lost peer.
    """
    from lmgym.cli.launch import agree_to_start, launch
    from lmgym.cli.train_args import UsageError, check_before_launch, make_trainer, parse_train
    from lmgym.persistence import CheckpointError
    from lmgym.training.ranks import launched_ranks

    request = trainer = None
    failure: str | None = None
    try:
        request = parse_train(argv)
        if request.processes is not None:
            check_before_launch(request)  # one line here, not one from every process
            return None, launch(request.processes, request.argv)
        trainer = make_trainer(request)
    except (UsageError, CheckpointError, OSError, TypeError, ValueError) as exc:
        failure = str(exc)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        if exc.code in (0, None) or launched_ranks() <= 1:
            raise
        failure = "bad command line on this rank (its usage message is above)"
    if launched_ranks() > 1:
        failure = agree_to_start(failure, trainer, argv)
    if failure is not None:
        return None, _error("train", failure)
    return request, trainer


def _train(argv: Sequence[str]) -> int:
    from lmgym.asynchronous import PeerLostError
    from lmgym.persistence import CheckpointError, DirectoryLockedError
    from lmgym.training.termination import StoppedError

    request, trainer = _start(argv)
    if request is None:
        return trainer
    try:
        result = trainer.run()
    except (CheckpointError, DirectoryLockedError, OSError, ValueError) as exc:
        # OSError includes a full disk (ENOSPC): checkpoints are all-or-nothing, so the
        # last complete one is intact.
        write_error = isinstance(exc, OSError) and not isinstance(
            exc, FileExistsError | FileNotFoundError
        )
        hint = _stopped_hint(trainer.config.run_dir) if write_error else ""
        return _error("train", f"{exc}{hint}")
    except (FloatingPointError, PeerLostError, StoppedError) as exc:
        # a non-finite loss, gradient or statistic; a lost process of the run
        return _error("train", f"{exc}{_stopped_hint(trainer.config.run_dir)}")
    except KeyboardInterrupt:
        run_dir = trainer.config.run_dir
        hint = _stopped_hint(run_dir) or (
            f"; no checkpoint was written yet (start again with --run-dir {run_dir} --overwrite)"
            if run_dir and Path(run_dir).is_dir()
            else ""
        )
        print(f"\nlmgym train: interrupted{hint}", file=sys.stderr)
        return 130

    line = result.report_line()
    if line is None or result.after is None:
        return 0  # a data-parallel rank other than 0: rank 0 reports
    print(line)
    for sample in result.after.samples[: trainer.config.samples]:
        print(sample_line(*sample))
    return 0
