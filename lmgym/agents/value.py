"""PPO value-function loss and its diagnostic (docs/algorithms.md#value-loss)."""

import torch
from torch import Tensor

from lmgym.agents.metrics import masked_var


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float | None
) -> Tensor:
    """Per-token value loss ½·max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²).

    Like PPO's policy clip, the max is pessimistic: a value prediction that moved
    more than ε_v from `old_values` gets no credit for moving towards the target.

    Args:
        values: `[B, T]` float, current value predictions (with gradient).
        old_values: `[B, T]` float, predictions when the batch was collected.
        returns: `[B, T]` float, value targets R (e.g. from `advantages.gae`).
        clip_range: ε_v; `None` gives the plain loss ½·(V − R)².

    Returns:
        `[B, T]` float per-token loss (multiply by `vf_coef`, then aggregate).
    """
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * unclipped
    old_values = old_values.detach()
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return 0.5 * torch.maximum(unclipped, (clipped_values - returns) ** 2)


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """Explained variance 1 − Var[R − V] / Var[R] over masked tokens.

    1 is a perfect critic, 0 is no better than a constant, negative is worse. When the
    targets have no variance there is nothing to explain and the result is 0.0
    (a finite value for logging; Stable-Baselines3 returns NaN here).

    Args:
        values: `[B, T]` float, value predictions.
        returns: `[B, T]` float, value targets.
        mask: `[B, T]` bool or float.

    Returns:
        A float in (−∞, 1].
    """
    target_variance = masked_var(returns, mask)
    if target_variance.item() == 0.0:
        return 0.0
    return (1.0 - masked_var(returns - values, mask) / target_variance).item()
