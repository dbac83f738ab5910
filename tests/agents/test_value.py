import pytest
import torch

from lmgym.agents.value import clipped_value_loss, explained_variance

F64 = torch.float64


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_clipped_value_loss_values_and_gradients() -> None:
    values = t([[1.5, 0.5, 1.1, 1.5]]).requires_grad_()
    old_values = t([[1.0, 1.0, 1.0, 1.0]])
    returns = t([[2.0, 0.0, 2.0, 1.0]])
    loss = clipped_value_loss(values, old_values, returns, clip_range=0.2)
    # 1: max(0.25, (1.2-2)^2=0.64); 2: max(0.25, 0.8^2); 3: inside, 0.9^2;
    # 4: max(0.25, (1.2-1)^2=0.04) -> unclipped.
    torch.testing.assert_close(loss, t([[0.32, 0.32, 0.405, 0.125]]))
    (grad,) = torch.autograd.grad(loss.sum(), values)
    # clipped branch wins at the bound: no gradient; otherwise V - R.
    torch.testing.assert_close(grad, t([[0.0, 0.0, -0.9, 0.5]]))


def test_value_loss_without_clip() -> None:
    values = t([[1.5, 0.5]])
    loss = clipped_value_loss(values, t([[1.0, 1.0]]), t([[2.0, 0.0]]), clip_range=None)
    torch.testing.assert_close(loss, t([[0.125, 0.125]]))


def test_explained_variance() -> None:
    values = t([[1.0, 2.0, 50.0], [3.0, 50.0, 50.0]])
    returns = t([[1.0, 2.0, -9.0], [4.0, -9.0, -9.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # R - V = [0, 0, 1]: var 1/3; R = [1, 2, 4]: var 7/3.
    assert explained_variance(values, returns, mask) == pytest.approx(6 / 7)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


def test_explained_variance_of_constant_targets_is_zero() -> None:
    mask = t([[1, 1, 1]])
    assert explained_variance(t([[0.1, 0.2, 0.3]]), t([[1.0, 1.0, 1.0]]), mask) == 0.0
