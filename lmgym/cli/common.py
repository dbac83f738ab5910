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


def add_rollout_engine_flags(parser: argparse.ArgumentParser) -> None:
    """``--rollout-engine`` and ``--vllm-kv-cache-gib`` as ``lmgym train`` has them: the
    choices, defaults and help of ``TrainConfig``'s fields (``lmgym eval``, ``lmgym bench``)."""
    from typing import get_args

    from lmgym.agents.config import field_help
    from lmgym.cli.flags import add_typed_flag
    from lmgym.training.run import TrainConfig

    helps = field_help(TrainConfig)  # type: ignore[arg-type]
    defaults = TrainConfig()
    engines = get_args(TrainConfig.__dataclass_fields__["rollout_engine"].type)
    parser.add_argument(
        "--rollout-engine",
        "--rollout_engine",
        choices=engines or ("lmgym", "vllm"),
        default=defaults.rollout_engine,
        help=f"{helps['rollout_engine']} (default: {defaults.rollout_engine})",
    )
    add_typed_flag(
        parser,
        "--vllm_kv_cache_gib",
        "--vllm-kv-cache-gib",
        kind=float,
        default=defaults.vllm_kv_cache_gib,
        help=f"{helps['vllm_kv_cache_gib']} (default: {defaults.vllm_kv_cache_gib})",
    )
