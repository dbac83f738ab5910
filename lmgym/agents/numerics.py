"""Guards that keep a non-finite number out of the weights.

A NaN or infinite loss or gradient must never reach ``optimizer.step``: it would
poison every weight and surface much later, as ``torch.multinomial: probability
tensor contains inf/nan``. The learn loop checks the loss terms of every
micro-batch and the gradient norm of every optimizer step, and raises
``NonFiniteUpdateError`` naming the iteration and the quantity (or, with
``skip_nonfinite=True``, skips and counts the step).

The gradient norm is computed in float32 first and, only when that overflows,
again in float64: gradients of a loss scaled by a huge but finite reward (1e20)
are finite, but the sum of their squares is not representable in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class NonFiniteUpdateError(FloatingPointError):
    """A loss term or the gradient norm of an update is NaN or infinite."""


def check_finite(name: str, value: Tensor, where: str) -> None:
    """Raise ``NonFiniteUpdateError`` if any entry of ``value`` is NaN or infinite.

    Args:
        name: the quantity, e.g. ``"policy_loss"``.
        value: a tensor of any shape.
        where: the position in the run, e.g. ``"iteration 3, epoch 1, minibatch 2"``.
    """
    if not bool(torch.isfinite(value).all()):
        bad = value[~torch.isfinite(value)].flatten()[0].item()
        raise NonFiniteUpdateError(
            f"{name} is {bad} at {where}: the update was not applied. Lower learning_rate, "
            "check rewards and the model's weights for extreme values, or set "
            "skip_nonfinite=True to skip such steps and count them"
        )


def check_parameters(
    params: Sequence[Tensor],
    where: str,
    learning_rate: float,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Raise ``NonFiniteUpdateError`` if an optimizer step left a NaN/inf weight.

    A finite gradient times a huge learning rate can still overflow the weights;
    caught here, the error names the cause instead of the next rollout's sampler.
    One fused norm over the parameters: cheap next to a forward and backward pass.
    Only when it is not finite are the weights checked one by one: a model holding a
    large finite weight (1e30, in a row no token uses) overflows the float32 sum of
    squares without any weight being non-finite, and is not an error.

    The gradients were checked finite before the step, so a NaN in the optimizer's
    state for the weight that went bad (AdamW's moments) came from elsewhere: state
    loaded damaged, not the step size. With ``optimizer`` given, that case is named
    instead of the learning rate (AdamW moves even a weight whose gradient is 0, a
    row no token uses, by its moments).
    """
    if bool(torch.isfinite(torch.nn.utils.get_total_norm(params))):
        return
    if all(bool(torch.isfinite(p).all()) for p in params):
        return  # every weight is finite: only the float32 sum of their squares overflowed
    state = _nan_optimizer_state(params, optimizer) if optimizer is not None else None
    if state is not None:
        raise NonFiniteUpdateError(
            f"parameters are non-finite after the optimizer step at {where}: the optimizer "
            f"state {state} holds NaN, which no finite gradient puts there (the gradients "
            "were checked finite), so the state was loaded or set damaged; the learning rate "
            "is not the cause. Resume from an earlier checkpoint, or reset the optimizer"
        )
    raise NonFiniteUpdateError(
        f"parameters are non-finite after the optimizer step at {where} "
        f"(learning_rate={learning_rate}): the weights diverged. Resume from the last "
        "checkpoint with a lower learning_rate"
    )


def _nan_optimizer_state(params: Sequence[Tensor], optimizer: torch.optim.Optimizer) -> str | None:
    """``"exp_avg of parameter 3 (first NaN at row 48)"`` for the first non-finite
    parameter whose optimizer state holds a NaN, or ``None``."""
    for index, param in enumerate(params):
        if bool(torch.isfinite(param).all()):
            continue
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, Tensor) and value.is_floating_point():
                nan = value.isnan()
                if bool(nan.any()):
                    first = nan.nonzero()[0].tolist() if value.dim() else []
                    at = f" (first NaN at row {first[0]})" if value.dim() > 1 else ""
                    return f"{key} of parameter {index}{at}"
    return None


def total_grad_norm(params: Sequence[Tensor]) -> Tensor:
    """Global L2 norm of the parameters' gradients, without float32 overflow.

    Args:
        params: parameters; those without a gradient are left out.

    Returns:
        0-dim float tensor (float64 when float32 overflowed); NaN or inf only when
        a gradient entry itself is NaN or inf.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads)
    if torch.isfinite(norm):
        return norm
    # Overflow of the sum of squares, or a truly non-finite entry: recompute exactly.
    per_tensor = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
    return torch.linalg.vector_norm(per_tensor)


def clip_grads(params: Sequence[Tensor], max_norm: float | None, norm: Tensor) -> None:
    """Scale gradients in place so their global norm is at most ``max_norm``.

    Args:
        params: the parameters whose gradients ``norm`` was computed from.
        max_norm: the bound; ``None`` leaves the gradients as they are.
        norm: their global norm, finite (``total_grad_norm``).
    """
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
