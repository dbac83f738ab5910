"""Small helpers the ``lmgym`` commands share: the one-line error, ``--env KEY=VALUE``,
a file given to a count flag, and quieting transformers' progress bars."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def error(command: str, message: str) -> int:
    """Print ``lmgym COMMAND: error: MESSAGE`` as one line (a library's multi-line message
    is joined) and return the exit status 2."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    # One write with its newline: print() writes the text and the newline separately, and
    # ranks sharing one stderr pipe then interleaved ("...> 0lmgym train: error: ...").
    sys.stderr.write(f"lmgym {command}: error: {line}\n")
    sys.stderr.flush()
    return 2


def parse_env_kwarg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(key, value)``, the value read as JSON when it parses (``[1, 2]``,
    ``5``, ``true``), else kept as text; ``lmgym.training.env_args`` then converts it to
    the argument's type (``lmgym.typed_values.parse_value``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def quiet_transformers() -> None:
    """Turn off transformers' download/loading progress bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def add_env_flag(parser: argparse.ArgumentParser, note: str) -> None:
    """``--env KEY=VALUE`` (repeatable) into ``env_kwargs``: ``TrainConfig.env_kwargs``
    given one argument at a time; ``note`` is the command's own word on it."""
    parser.add_argument(
        "--env",
        dest="env_kwargs",
        action="append",
        type=parse_env_kwarg,
        default=None,
        metavar="KEY=VALUE",
        help="an argument of the task's env factory, e.g. --env reward_mode=per_token (VALUE "
        "converted to the parameter's type: booleans from true/false/yes/no/1/0 only); "
        f"repeatable; {note}",
    )


def file_given_as_count(argv: Sequence[str], flag: str, meaning: str, instead: str) -> str | None:
    """The error for a file given to the count flag ``flag`` (``--eval-prompts
    sums.jsonl``), naming the flag that takes the file, or ``None``.

    Args:
        argv: the command line.
        flag: the count flag (its ``--a-b`` spelling; ``--a_b`` is found too).
        meaning: what the count is (``"the number of prompts drawn"``).
        instead: the flag to use, ``{}`` standing for the value (``"--prompts {}"``).
    """
    names = (flag, flag[:2] + flag[2:].replace("-", "_"))
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name not in names:
            continue
        if not sep:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        try:
            int(value)
        except ValueError:
            if value.endswith(".jsonl") or os.path.isfile(value):
                return f"{flag} {value}: {flag} is {meaning}; {instead.format(value)}"
    return None
