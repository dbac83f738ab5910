"""Small helpers every ``lmgym`` subcommand shares: the one-line error, ``--env KEY=VALUE``
parsing, and quieting transformers' progress bars."""

from __future__ import annotations

import argparse
import json
import sys
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
