import math

import pytest
import torch

from lmgym.agents.kl import kl_estimator, kl_in_reward, kl_k1, kl_k2, kl_k3

F64 = torch.float64


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


LOGPROBS = t([[-1.0, -2.0, -0.3]])
REF_LOGPROBS = t([[-1.5, -1.0, -0.3]])  # lp - lp_ref = [0.5, -1, 0]


def test_k1() -> None:
    torch.testing.assert_close(kl_k1(LOGPROBS, REF_LOGPROBS), t([[0.5, -1.0, 0.0]]))


def test_k2() -> None:
    torch.testing.assert_close(kl_k2(LOGPROBS, REF_LOGPROBS), t([[0.125, 0.5, 0.0]]))


def test_k3() -> None:
    # exp(lp_ref - lp) - (lp_ref - lp) - 1 with lp_ref - lp = [-0.5, 1, 0]
    expected = [[math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0, 0.0]]
    torch.testing.assert_close(kl_k3(LOGPROBS, REF_LOGPROBS), t(expected))
    torch.testing.assert_close(kl_k3(LOGPROBS, REF_LOGPROBS), t([[0.10653066, 0.71828183, 0.0]]))


def test_k3_is_non_negative_and_finite() -> None:
    generator = torch.Generator().manual_seed(0)
    logprobs = -10 * torch.rand(64, 32, generator=generator)
    ref_logprobs = -10 * torch.rand(64, 32, generator=generator)
    assert (kl_k3(logprobs, ref_logprobs) >= 0).all()
    assert (kl_k2(logprobs, ref_logprobs) >= 0).all()
    huge = kl_k3(torch.tensor([[-200.0]]), torch.tensor([[0.0]]))
    assert torch.isfinite(huge).all()


def test_kl_estimator_lookup() -> None:
    assert kl_estimator("k1") is kl_k1
    assert kl_estimator("k2") is kl_k2
    assert kl_estimator("k3") is kl_k3
    with pytest.raises(ValueError, match="'k1', 'k2', 'k3'"):
        kl_estimator("k4")  # type: ignore[arg-type]


def test_kl_in_reward() -> None:
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    old_logprobs = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, 3.0]])
    ref_logprobs = t([[-1.5, -1.0, -0.5], [-2.0, -1.0, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    before = rewards.clone()
    shaped = kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, beta=0.1)
    # k1 = [[0.5, -1, 0], [1, 0, (pad)]]
    torch.testing.assert_close(shaped, t([[-0.05, 0.1, 1.0], [-0.1, 2.0, 7.0]]))
    assert torch.equal(rewards, before)
