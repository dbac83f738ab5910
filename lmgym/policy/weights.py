"""Checks on the weights a policy is given, before anything runs on them: the weight
files of a model directory before transformers reads them (``check_weight_files``),
and the loaded values (``check_finite_weights``)."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch
from torch import nn


def check_finite_weights(model: nn.Module) -> None:
    """Refuse a model that holds a NaN or infinite weight, naming where.

    Such a weight came with the model (a damaged or badly converted file), not from
    training: lmgym never saves weights an update made non-finite. Left in, it
    surfaces later as a NaN sampling probability or a non-finite parameter norm
    after the first optimizer step, whose messages can only blame the update. Even
    a row no token uses (an embedding row past the tokenizer's ids) counts: the
    optimizer and the parameter-norm check see every weight.

    Args:
        model: the policy's model (a ``peft.PeftModel`` too).

    Raises:
        ValueError: the first parameter with a non-finite value, its row and count.
    """
    for name, param in model.named_parameters():
        finite = torch.isfinite(param)
        if bool(finite.all()):
            continue
        bad = (~finite).nonzero()[0].tolist()
        where = f"row {bad[0]}" if param.dim() > 1 else f"index {bad[0]}"
        count = int((~finite).sum())
        raise ValueError(
            f"model: {name} holds {count} NaN/inf value(s) (first at {where}) before any "
            "training; the model's weight file is damaged or was badly converted, so load "
            "an intact copy of the model"
        )


PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth")
"""Weight files transformers reads with ``torch.load`` when a directory has no safetensors."""


def check_weight_files(directory: str | Path) -> None:
    """Refuse, in one line naming the file and the fix, a model directory whose weight
    file cannot be read, before transformers reads it (and fails with a traceback).

    A ``*.safetensors`` file's header must read (a truncated file's does not); with no
    safetensors, each ``*.bin`` / ``*.pt`` / ``*.pth`` is loaded as transformers would,
    ``torch.load(weights_only=True)`` (memory-mapped where the format allows), so a
    truncated file, or one holding pickled objects other than tensors (a whole pickled
    module), is named here.

    Raises:
        ValueError: ``model weights FILE is truncated or damaged (...)`` or ``... holds
            pickled objects other than tensors (...)``, with the fix.
    """
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    safetensors = sorted(directory.glob("*.safetensors"))
    for file in safetensors:
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as exc:
            raise ValueError(_damaged(file, exc)) from None
    if safetensors:
        return  # transformers loads these, never a .bin beside them
    for file in sorted(p for pattern in PICKLED_WEIGHTS for p in directory.glob(pattern)):
        try:
            torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
        except pickle.UnpicklingError as exc:
            found = re.search(r"Unsupported global: GLOBAL [\w.]+", str(exc))
            what = found.group(0) if found else _first_line(exc)
            raise ValueError(
                f"model weights {file} holds pickled objects other than tensors ({what}), which "
                "lmgym does not unpickle; load the model where you trust it and save it with "
                "save_pretrained (safetensors)"
            ) from None
        except (RuntimeError, EOFError, ValueError, OSError) as exc:
            raise ValueError(_damaged(file, exc)) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _damaged(file: Path, exc: BaseException) -> str:
    return (
        f"model weights {file} is truncated or damaged ({type(exc).__name__}: "
        f"{_first_line(exc)}); get an intact copy of the model (download it again, or "
        "save_pretrained it again)"
    )
