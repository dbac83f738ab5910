"""Non-weight state on disk (optimizer, RNG states, counters, callback state), loaded without pickle.

``save_state`` writes a ``torch.save`` file holding only tensors and plain data
(``None``, bool, int, float, str, bytes, and lists, tuples and dicts of them);
it checks that before writing, so a value that could not be loaded back safely
fails at save time, naming where it sits. ``load_state`` reads it with
``torch.load(weights_only=True)``: a file carrying any other object (a pickled
``__reduce__`` payload, say) is refused with ``CheckpointError`` and nothing in
it runs. The global RNG states are converted to that plain form here
(``global_rng_state`` / ``set_global_rng_state``): numpy's legacy state holds an
array, which becomes a tensor.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmgym.persistence.manifest import CheckpointError
from lmgym.persistence.write_errors import writing

_PLAIN = (torch.Tensor, type(None), bool, int, float, str, bytes)


def check_plain(value: Any, where: str = "state") -> None:
    """Raise ``TypeError`` naming the first value that is neither a tensor nor plain data.

    Args:
        value: what will be saved.
        where: its name, for the message (``state.callbacks.my_cb.x``).
    """
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}, not a str or int")
            check_plain(item, f"{where}.{key}")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint holds "
        "only tensors, numbers, strings, None and lists/tuples/dicts of them (convert it, "
        "e.g. a numpy array with torch.from_numpy)"
    )


def save_state(state: dict[str, Any], path: str | Path, name: str = "state") -> None:
    """``torch.save`` ``state`` after checking it holds only tensors and plain data.

    Raises:
        TypeError: some value is another object (the message names it).
        OSError: the write failed (a full disk), naming ``path``.
    """
    check_plain(state, name)
    with writing(path):
        torch.save(state, path)


def load_state(path: str | Path, map_location: torch.device | str | None = None) -> dict[str, Any]:
    """Load a ``save_state`` file with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: the file holds anything but tensors and plain data (it is
            refused before any of it is built, so a planted payload never runs), or
            is not a torch file.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint file {path} is refused: it holds objects other than tensors and plain "
            f"data, and loading them could run code ({first.strip()[:200]})"
        ) from None
    except (RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint file {path} is not a readable torch file ({type(exc).__name__}: "
            f"{str(exc)[:200]})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {path} holds a {type(state).__name__}, not a dict")
    return state


def global_rng_state() -> dict[str, Any]:
    """The process-wide RNG states (torch CPU, numpy, python ``random``) as plain data."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``global_rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["bit_generator"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
