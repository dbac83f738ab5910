"""Config files for ``lmgym train --config FILE``: JSON always, YAML when pyyaml is installed.

A file is a mapping of field names (``learning_rate`` or ``learning-rate``) to
values, either flat::

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

import json
from pathlib import Path
from typing import Any

from lmgym.training.run import RUN_MARKER


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
