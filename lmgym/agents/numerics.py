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


def check_parameters(params: Sequence[Tensor], where: str, learning_rate: float) -> None:
    """Raise ``NonFiniteUpdateError`` if an optimizer step left a NaN/inf weight.

    A finite gradient times a huge learning rate can still overflow the weights;
    caught here, the error names the cause instead of the next rollout's sampler.
    One fused norm over the parameters: cheap next to a forward and backward pass.
    """
    if not bool(torch.isfinite(torch.nn.utils.get_total_norm(params))):
        raise NonFiniteUpdateError(
            f"parameters are non-finite after the optimizer step at {where} "
            f"(learning_rate={learning_rate}): the weights diverged. Resume from the last "
            "checkpoint with a lower learning_rate"
        )


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
