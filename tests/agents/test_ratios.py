import math

import pytest
import torch

from lmgym.agents.aggregation import aggregate
from lmgym.agents.ratios import (
    cispo_loss,
    clip_objective,
    clipped_surrogate_loss,
    gspo_loss,
    gspo_token_ratio,
    log_ratio,
    policy_gradient_loss,
    tis_weights,
)

F64 = torch.float64


def t(values: list | float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def grad_of(loss: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    return grad


def test_log_ratio_is_a_clamp_not_a_clip() -> None:
    lr = log_ratio(t([50.0, -50.0, 0.3]), t([0.0, 0.0, 0.0]))
    torch.testing.assert_close(lr, t([20.0, -20.0, 0.3]))


def test_policy_gradient_loss_value_and_gradient() -> None:
    logprobs = t([[-1.0, -2.0]]).requires_grad_()
    advantages = t([[2.0, -3.0]])
    loss = policy_gradient_loss(logprobs, advantages)
    torch.testing.assert_close(loss, t([[2.0, -6.0]]))
    torch.testing.assert_close(grad_of(loss, logprobs), t([[-2.0, 3.0]]))


# (advantage, ratio, loss, d loss / d logprob) with eps = 0.2 on both sides (docs/algorithms.md#token-clip).
# Where the clip binds the gradient is 0; elsewhere it is -A * rho.
SIX_CASES = [
    pytest.param(2.0, 0.5, -1.0, -1.0, id="A>0 below: unclipped wins, pushes rho up"),
    pytest.param(2.0, 1.1, -2.2, -2.2, id="A>0 inside"),
    pytest.param(2.0, 1.5, -2.4, 0.0, id="A>0 above: clipped, no gradient"),
    pytest.param(-2.0, 0.5, 1.6, 0.0, id="A<0 below: clipped, no gradient"),
    pytest.param(-2.0, 1.1, 2.2, 2.2, id="A<0 inside"),
    pytest.param(-2.0, 1.5, 3.0, 3.0, id="A<0 above: unclipped wins, pushes rho down"),
]


@pytest.mark.parametrize(("advantage", "ratio", "expected_loss", "expected_grad"), SIX_CASES)
def test_clipped_surrogate_six_cases(
    advantage: float, ratio: float, expected_loss: float, expected_grad: float
) -> None:
    logprobs = t([[math.log(ratio)]]).requires_grad_()
    old_logprobs = t([[0.0]])
    loss, rho = clipped_surrogate_loss(logprobs, old_logprobs, t([[advantage]]))
    torch.testing.assert_close(rho, t([[ratio]]))
    assert not rho.requires_grad
    assert loss.item() == pytest.approx(expected_loss)
    assert grad_of(loss, logprobs).item() == pytest.approx(expected_grad)


def test_clip_higher_widens_the_upper_side_only() -> None:
    logprobs = t([[math.log(1.25), math.log(0.75)]]).requires_grad_()
    advantages = t([[1.0, -1.0]])
    loss, _ = clipped_surrogate_loss(logprobs, t([[0.0, 0.0]]), advantages, 0.2, 0.28)
    torch.testing.assert_close(loss, t([[-1.25, 0.8]]))
    # 1.25 < 1.28: inside, gradient -A*rho; 0.75 < 0.8 with A < 0: clipped.
    torch.testing.assert_close(grad_of(loss, logprobs), t([[-1.25, 0.0]]))


def test_losses_treat_advantages_and_old_logprobs_as_constants() -> None:
    logprobs = t([[-1.0]]).requires_grad_()
    old_logprobs = t([[-1.1]]).requires_grad_()
    advantages = t([[1.0]]).requires_grad_()
    loss, _ = clipped_surrogate_loss(logprobs, old_logprobs, advantages)
    loss.sum().backward()
    assert old_logprobs.grad is None and advantages.grad is None


def test_gspo_length_normalisation_and_mask() -> None:
    # Same per-token log-ratio 0.1 on 2 and on 4 real tokens; row 0's padding holds 5.0.
    old_logprobs = t([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
    logprobs = (old_logprobs + t([[0.1, 0.1, 5.0, 5.0], [0.1, 0.1, 0.1, 0.1]])).requires_grad_()
    mask = t([[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, seq_ratio = gspo_loss(logprobs, old_logprobs, t([1.0, -1.0]), mask)
    s = math.exp(0.1)  # 1.10517..., far above 1 + 4e-4
    torch.testing.assert_close(seq_ratio, t([s, s]))
    # A > 0 above the interval: clipped to 1 + 4e-4; A < 0 above: unclipped.
    torch.testing.assert_close(loss, t([-1.0004, s]))
    # Row 0 clipped: no gradient. Row 1: -A * s / T_i on each real token.
    torch.testing.assert_close(grad_of(loss, logprobs), t([[0, 0, 0, 0], [s / 4] * 4]))


def test_gspo_inside_the_interval_is_unclipped() -> None:
    logprobs = t([[1e-4, 1e-4, 0.0]]).requires_grad_()
    mask = t([[1, 1, 0]])
    loss, seq_ratio = gspo_loss(logprobs, t([[0.0, 0.0, 0.0]]), t([2.0]), mask)
    s = math.exp(1e-4)
    torch.testing.assert_close(seq_ratio, t([s]))
    torch.testing.assert_close(loss, t([-2 * s]))
    torch.testing.assert_close(grad_of(loss, logprobs), t([[-s, -s, 0.0]]))


def test_cispo_keeps_gradient_of_tokens_outside_the_band() -> None:
    ratios = [1.5, 0.5, 1.0]
    logprobs = t([[math.log(r) for r in ratios]]).requires_grad_()
    old_logprobs = t([[0.0, 0.0, 0.0]])
    advantages = t([[1.0, 1.0, -1.0]])
    loss, rho = cispo_loss(logprobs, old_logprobs, advantages, weight_low=0.2, weight_high=0.2)
    torch.testing.assert_close(rho, t([ratios]))
    # weights clip(rho, 0.8, 1.2) = [1.2, 0.8, 1.0]; loss = -w * A * lp
    torch.testing.assert_close(loss, t([[-1.2 * math.log(1.5), -0.8 * math.log(0.5), 0.0]]))
    # d loss / d lp = -clip(rho) * A exactly, even for the clipped tokens 0 and 1 ...
    torch.testing.assert_close(grad_of(loss, logprobs), t([[-1.2, -0.8, 1.0]]))
    # ... while PPO gives token 0 (A > 0, rho above 1 + eps) no gradient at all.
    ppo_loss, _ = clipped_surrogate_loss(logprobs, old_logprobs, advantages)
    assert grad_of(ppo_loss, logprobs)[0, 0].item() == 0.0


def test_cispo_absolute_upper_cap_mapping() -> None:
    # min(rho, eps_max) with eps_max = 5 is weight_high = 4, weight_low = 1 (no lower bound).
    logprobs = t([[math.log(0.01), math.log(7.0)]]).requires_grad_()
    loss, _ = cispo_loss(logprobs, t([[0.0, 0.0]]), t([[1.0, 1.0]]), 1.0, 4.0)
    torch.testing.assert_close(grad_of(loss, logprobs), t([[-0.01, -5.0]]))


def test_tis_cap_versus_numerical_clamp() -> None:
    old_logprobs = t([[50.0, 0.5, -1.0, 100.0]]).requires_grad_()
    sampler_logprobs = t([[0.0, 0.0, 0.0, 0.0]])
    weights = tis_weights(old_logprobs, sampler_logprobs, cap=2.0)
    # The cap gives exactly C; small weights pass through (one-sided).
    torch.testing.assert_close(weights, t([[2.0, math.exp(0.5), math.exp(-1.0), 2.0]]))
    assert weights[0, 0].item() == 2.0
    assert not weights.requires_grad
    # Without a cap only the clamp bounds the weight: exp(20), finite even for 100.
    uncapped = tis_weights(old_logprobs, sampler_logprobs, cap=math.inf)
    assert uncapped[0, 0].item() == pytest.approx(4.851651954097903e8)
    assert torch.isfinite(uncapped).all()
    float32_weights = tis_weights(t([[100.0]]).float(), t([[0.0]]).float(), cap=math.inf)
    assert torch.isfinite(float32_weights).all()


def test_clip_objective_takes_the_ratio_it_is_given() -> None:
    ratio = t([1.5, 1.5, 0.5, 1.1]).requires_grad_()
    advantages = t([2.0, -2.0, -2.0, 1.0])
    loss = clip_objective(ratio, advantages, 0.2, 0.2)
    # max(-A rho, -A clip(rho, 0.8, 1.2)): [-2.4 clipped, 3.0, 1.6 clipped, -1.1]
    torch.testing.assert_close(loss, t([-2.4, 3.0, 1.6, -1.1]))
    torch.testing.assert_close(grad_of(loss, ratio), t([0.0, 2.0, 0.0, -1.0]))


# (advantage, log ratio, loss, d loss / d logprob) with eps = 0.2 and c = 3.
DUAL_CLIP_CASES = [
    pytest.param(-2.0, 30.0, 6.0, 0.0, id="A<0, huge rho (clamped to e^20): -cA, no gradient"),
    pytest.param(-2.0, math.log(10.0), 6.0, 0.0, id="A<0, rho=10 > c: -cA, no gradient"),
    pytest.param(-2.0, math.log(2.9), 5.8, 5.8, id="A<0, rho=2.9 < c: PPO's -A rho"),
    pytest.param(-2.0, math.log(0.5), 1.6, 0.0, id="A<0, rho below: PPO's clip"),
    pytest.param(2.0, math.log(10.0), -2.4, 0.0, id="A>0, rho=10: PPO's clip, not -cA"),
    pytest.param(2.0, math.log(0.5), -1.0, -1.0, id="A>0, rho below: PPO's -A rho"),
    pytest.param(0.0, math.log(10.0), 0.0, 0.0, id="A=0: nothing"),
]


@pytest.mark.parametrize(
    ("advantage", "log_rho", "expected_loss", "expected_grad"), DUAL_CLIP_CASES
)
def test_dual_clip_bounds_negative_advantages_only(
    advantage: float, log_rho: float, expected_loss: float, expected_grad: float
) -> None:
    logprobs = t([[log_rho]]).requires_grad_()
    loss, rho = clipped_surrogate_loss(
        logprobs, t([[0.0]]), t([[advantage]]), 0.2, 0.2, dual_clip=3.0
    )
    assert not rho.requires_grad
    assert rho.item() == pytest.approx(math.exp(min(log_rho, 20.0)))
    assert loss.item() == pytest.approx(expected_loss)
    assert grad_of(loss, logprobs).item() == pytest.approx(expected_grad)


@pytest.mark.parametrize(("advantage", "ratio", "expected_loss", "expected_grad"), SIX_CASES)
def test_dual_clip_is_ppo_below_the_bound(
    advantage: float, ratio: float, expected_loss: float, expected_grad: float
) -> None:
    logprobs = t([[math.log(ratio)]]).requires_grad_()
    loss, _ = clipped_surrogate_loss(logprobs, t([[0.0]]), t([[advantage]]), dual_clip=3.0)
    assert loss.item() == pytest.approx(expected_loss)
    assert grad_of(loss, logprobs).item() == pytest.approx(expected_grad)


def test_gspo_token_ratio_is_the_sequence_ratio_with_per_token_gradients() -> None:
    old_logprobs = t([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
    log_ratios = t([[0.1, 0.3, 5.0, 5.0], [0.2, 0.2, 0.2, -0.2]])
    logprobs = (old_logprobs + log_ratios).requires_grad_()
    mask = t([[1, 1, 0, 0], [1, 1, 1, 1]])
    ratio = gspo_token_ratio(logprobs, old_logprobs, mask)
    s0, s1 = math.exp(0.2), math.exp(0.1)  # exp of the row means (0.1 + 0.3)/2, 0.4/4
    torch.testing.assert_close(ratio, t([[s0] * 4, [s1] * 4]))
    _, seq_ratio = gspo_loss(logprobs, old_logprobs, t([1.0, 1.0]), mask)
    assert torch.equal(ratio.detach(), seq_ratio[:, None].expand(2, 4))  # bit-equal
    # d (sum_t w_t s_{i,t}) / d lp_{i,t} = w_t * s_i: each token its own gradient.
    weights = t([[1.0, 2.0, 3.0, 4.0], [1.0, -1.0, 0.5, 0.0]])
    torch.testing.assert_close(grad_of(weights * ratio, logprobs), weights * t([[s0], [s1]]))


def test_gspo_token_with_sequence_advantages_has_gspo_loss_and_gradient() -> None:
    # Row 0 inside the tiny interval, rows 1 and 2 clipped on either side, row 3 A < 0 above.
    old_logprobs = torch.zeros(4, 3, dtype=F64)
    log_ratios = t([[1e-4, -1e-4, 3e-4], [0.01, 0.01, 0.0], [-0.02, 0.0, 0.0], [0.1, 0.2, 0.3]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    advantages = t([1.5, 2.0, -1.0, -0.5])
    logprobs = log_ratios.clone().requires_grad_()
    seq_loss, _ = gspo_loss(logprobs, old_logprobs, advantages, mask)
    gspo = seq_loss.sum() / 4
    token_loss = clip_objective(
        gspo_token_ratio(logprobs, old_logprobs, mask),
        advantages[:, None].expand(4, 3),
        3e-4,
        4e-4,
    )
    token = aggregate(
        token_loss, mask, "seq-mean-token-mean", num_sequences=4, num_tokens=9, max_len=3
    )
    torch.testing.assert_close(token, gspo)
    gspo_grad = grad_of(gspo, logprobs)
    torch.testing.assert_close(grad_of(token, logprobs), gspo_grad)
    assert gspo_grad[1:3].abs().sum() == 0.0  # the clipped rows
    assert gspo_grad[0].abs().min() > 0.0 and gspo_grad[3].abs().min() > 0.0
