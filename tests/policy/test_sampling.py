"""The sampler's draw (inverse CDF on CPU) and ``sample_step``, which shares the draw's
work with the special-token mass."""

from __future__ import annotations

import math

import pytest
import torch

from lmgym.policy import sampling
from lmgym.policy.sampling import draw, sample_step, sample_tokens, special_mass


def test_draw_matches_the_weights_and_never_draws_a_zero_weight():
    weights = torch.tensor([0.0, 0.25, 0.0, 1.0, 0.5, 0.0]).expand(200_000, 6)
    ids, totals = draw(weights, torch.Generator().manual_seed(0))
    assert ids.shape == (200_000, 1) and ids.dtype == torch.int64
    assert totals.tolist() == [1.75] * 200_000
    counts = torch.bincount(ids[:, 0], minlength=6)
    assert counts[[0, 2, 5]].tolist() == [0, 0, 0]
    expected = torch.tensor([0.25, 1.0, 0.5]) / 1.75 * 200_000
    # Binomial standard deviations are below 220 here: 5 of them.
    assert (counts[[1, 3, 4]] - expected).abs().max() < 1100


@pytest.mark.parametrize(("uniform", "expected"), [(0.0, 3), (1.0 - 2.0**-24, 1)])
def test_draw_at_the_uniform_extremes_picks_a_positive_weight(monkeypatch, uniform, expected):
    """u = 0 targets the whole total: the last id of positive weight (not the weight-0
    last id); the largest u below 1 targets 2**-24 of it: the first positive one (not
    the weight-0 id 0)."""
    monkeypatch.setattr(sampling.torch, "rand", lambda shape, **_: torch.full(shape, uniform))
    weights = torch.tensor([[0.0, 0.5, 0.0, 1.0, 0.0]])
    ids, _ = draw(weights)
    assert ids.tolist() == [[expected]]


def test_draw_is_reproducible_under_a_seed():
    weights = torch.rand(64, 49)
    first, _ = draw(weights, torch.Generator().manual_seed(3))
    again, _ = draw(weights, torch.Generator().manual_seed(3))
    assert torch.equal(first, again)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_raise_with_multinomials_wording(bad):
    """Agent._draw turns this message into NonFiniteUpdateError (diverged weights)."""
    logits = torch.zeros(3, 4)
    logits[1, 2] = bad
    with pytest.raises(RuntimeError, match=r"probability tensor contains .* rows \[1\]"):
        sample_tokens(logits, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8)]
)
def test_sample_step_is_sample_tokens_plus_the_special_mass(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(256, 6) * 2
    refused = torch.tensor([True, False, False, True, False, False])
    actions, lp = sample_tokens(
        logits, temperature, top_k, top_p, torch.Generator().manual_seed(1), refused
    )
    step_actions, step_lp, mass = sample_step(
        logits, temperature, top_k, top_p, torch.Generator().manual_seed(1), refused
    )
    assert torch.equal(step_actions, actions) and torch.equal(step_lp, lp)
    assert not bool(refused[actions].any())
    torch.testing.assert_close(mass, special_mass(logits, refused, temperature))
    assert sample_step(logits, temperature, top_k, top_p, None, None)[2] is None


def test_sampler_logprob_is_the_log_softmax_of_the_drawn_id():
    logits = torch.tensor([[3.0, -1.0, 0.5, 2.0]]).expand(100, 4)
    refused = torch.tensor([False, False, True, False])
    actions, lp, mass = sample_step(
        logits, 0.5, None, None, torch.Generator().manual_seed(0), refused
    )
    expected = (logits / 0.5).masked_fill(refused, -math.inf).log_softmax(-1)
    torch.testing.assert_close(lp, expected[torch.arange(100), actions], rtol=0, atol=1e-6)
    full = (logits[0] / 0.5).softmax(-1)
    assert mass[0].item() == pytest.approx(full[2].item(), abs=1e-6)


def test_greedy_sample_step_returns_the_untempered_mass():
    logits = torch.tensor([[0.1, 2.0, 1.0, 3.0]])
    refused = torch.tensor([False, False, False, True])
    actions, _, mass = sample_step(logits, 0.0, refused=refused)
    assert actions.tolist() == [1]
    assert mass.item() == pytest.approx(logits.softmax(-1)[0, 3].item(), rel=1e-6)
