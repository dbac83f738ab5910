"""Checks on the weights a policy is given, before anything runs on them."""

from __future__ import annotations

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
