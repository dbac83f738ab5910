import math

import pytest
import torch

from lmgym.agents.metrics import (
    approx_kl,
    clip_fractions,
    effective_sample_size,
    entropy_mean,
    frac_reward_zero_std,
    masked_mean,
    masked_std,
    masked_sum,
    masked_var,
    ratio_stats,
    rule_clip_fractions,
)

F64 = torch.float64


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# Non-finite padding must not leak into masked reductions.
X = t([[1.0, 2.0, math.nan], [6.0, math.inf, -math.inf]])
MASK = t([[1, 1, 0], [1, 0, 0]])


def test_masked_reductions_ignore_padding() -> None:
    assert masked_sum(X, MASK).item() == pytest.approx(9.0)
    assert masked_mean(X, MASK).item() == pytest.approx(3.0)
    # unbiased: ((1-3)^2 + (2-3)^2 + (6-3)^2) / 2 = 7
    assert masked_var(X, MASK).item() == pytest.approx(7.0)
    assert masked_var(X, MASK, unbiased=False).item() == pytest.approx(14 / 3)
    assert masked_std(X, MASK).item() == pytest.approx(math.sqrt(7))
    torch.testing.assert_close(masked_mean(X, MASK, dim=-1), t([1.5, 6.0]))
    torch.testing.assert_close(masked_sum(X, MASK.bool(), dim=-1), t([3.0, 6.0]))


def test_masked_reductions_degenerate_cases() -> None:
    empty = torch.zeros(2, 3, dtype=F64)
    assert masked_mean(X, empty).item() == 0.0
    assert masked_var(X, t([[1, 0, 0], [0, 0, 0]])).item() == 0.0
    torch.testing.assert_close(masked_mean(X, t([[1, 1, 0], [0, 0, 0]]), dim=-1), t([1.5, 0.0]))


def test_clip_fraction_differs_from_zeroed_fraction() -> None:
    # Tokens: (rho, A) = (0.5, +), (1.5, +), (0.5, -), (1.5, -), (1.0, +), padding (9, +).
    ratio = t([[0.5, 1.5, 0.5, 1.5, 1.0, 9.0]])
    advantages = t([[1.0, 1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1, 1, 1, 0]])
    fractions = clip_fractions(ratio, advantages, mask, clip_low=0.2, clip_high=0.2)
    # 4 of 5 real tokens are outside [0.8, 1.2], but only (1.5, +) and (0.5, -) lost
    # their gradient: the other two take the unclipped branch of the max (docs/algorithms.md#metrics).
    assert fractions == pytest.approx(
        {
            "clip_fraction": 0.8,
            "clip_fraction_low": 0.4,
            "clip_fraction_high": 0.4,
            "clip_zeroed_fraction": 0.4,
        }
    )


def test_rule_clip_fractions_follow_the_rule() -> None:
    ratio = t([[0.5, 1.5, 0.5, 1.5, 1.0, 9.0]])
    advantages = t([[1.0, 1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1, 1, 1, 0]])
    assert rule_clip_fractions(ratio, advantages, mask, None) == {}  # a rule without a clip
    clipped = rule_clip_fractions(ratio, advantages, mask, (0.2, 0.2))
    assert clipped == clip_fractions(ratio, advantages, mask, 0.2, 0.2)
    # CISPO's clip bounds a weight and never zeroes a gradient.
    weighted = rule_clip_fractions(ratio, advantages, mask, (0.2, 0.2), zeroes_gradient=False)
    assert weighted == pytest.approx({**clipped, "clip_zeroed_fraction": 0.0})
    assert clipped["clip_zeroed_fraction"] == pytest.approx(0.4)


def test_approx_kl() -> None:
    # rho = 2: (2 - 1) - log 2 = 0.30685; rho = 0.5: -0.5 + log 2 = 0.19315; mean 0.25
    logprobs = t([[math.log(2.0), math.log(0.5), 30.0]])
    old_logprobs = t([[0.0, 0.0, 0.0]])
    mask = t([[1, 1, 0]])
    assert approx_kl(logprobs, old_logprobs, mask) == pytest.approx(0.25)
    assert approx_kl(old_logprobs, old_logprobs, mask) == 0.0


def test_ratio_stats() -> None:
    stats = ratio_stats(t([[0.9, 1.3, 50.0], [1.1, 0.01, 0.01]]), t([[1, 1, 0], [1, 0, 0]]))
    assert stats == pytest.approx({"ratio_mean": 1.1, "ratio_min": 0.9, "ratio_max": 1.3})


def test_effective_sample_size() -> None:
    mask = t([[1, 1, 0], [1, 1, 1]])
    assert effective_sample_size(t([[0.7, 0.7, 5.0], [0.7, 0.7, 0.7]]), mask) == pytest.approx(1.0)
    # (1 + 3)^2 / (2 * (1 + 9)) = 0.8
    assert effective_sample_size(t([[1.0, 3.0]]), t([[1, 1]])) == pytest.approx(0.8)


def test_entropy_mean() -> None:
    assert entropy_mean(t([[2.0, 4.0, 100.0]]), t([[1, 1, 0]])) == pytest.approx(3.0)


def test_frac_reward_zero_std() -> None:
    scores = t([1.0, 0.0, 1.0, 0.5, 0.0, 0.5])
    group_ids = torch.tensor([11, 3, 11, 40, 3, 40])  # 11: {1, 1}, 3: {0, 0}, 40: {.5, .5}
    assert frac_reward_zero_std(scores, group_ids) == pytest.approx(1.0)
    group_ids = torch.tensor([11, 3, 3, 40, 11, 40])  # 11: {1, 0}, 3: {0, 1}, 40: {.5, .5}
    assert frac_reward_zero_std(scores, group_ids) == pytest.approx(1 / 3)


def test_sampler_gap_against_hand_computed_values():
    from lmgym.agents.metrics import sampler_gap

    learner = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, 0.0, 0.0]])
    sampler = torch.tensor([[-1.5, -2.0, -0.5], [-0.3, 9.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # d = lp_old - lp_s on the masked tokens: 0.5, 0.0, 0.2 (the 9.0 is masked out).
    got = sampler_gap(learner, sampler, mask)
    assert got["sampler_logprob_gap_mean"] == pytest.approx(0.7 / 3)
    assert got["sampler_logprob_gap_max"] == pytest.approx(0.5)
    k3 = sum(math.expm1(d) - d for d in (0.5, 0.0, 0.2)) / 3
    assert got["sampler_kl"] == pytest.approx(k3)
    empty = sampler_gap(learner, sampler, torch.zeros_like(mask))
    assert empty == {
        "sampler_logprob_gap_mean": 0.0,
        "sampler_logprob_gap_max": 0.0,
        "sampler_kl": 0.0,
    }
