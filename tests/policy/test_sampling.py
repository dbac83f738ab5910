"""``sample_step``: ``sample_tokens`` and ``special_mass`` of one step sharing their work,
bit for bit the same as the two calls."""

from __future__ import annotations

import pytest
import torch

from lmgym.policy import sampling
from lmgym.policy.sampling import (
    SamplingSettings,
    draw_categorical,
    sample_step,
    sample_tokens,
    special_mass,
)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8), (0.0, None, None)],
)
def test_sample_step_is_sample_tokens_plus_the_special_mass_bit_for_bit(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(256, 6) * 2
    refused = torch.tensor([True, False, False, True, False, False])
    actions, lp = sample_tokens(
        logits, temperature, top_k, top_p, torch.Generator().manual_seed(1), refused
    )
    settings = SamplingSettings(temperature, top_k, top_p)
    step_actions, step_lp, mass = sample_step(
        logits, settings, torch.Generator().manual_seed(1), refused
    )
    assert torch.equal(step_actions, actions) and torch.equal(bits(step_lp), bits(lp))
    assert not bool(refused[actions].any())
    assert torch.equal(bits(mass), bits(special_mass(logits, refused, temperature)))
    assert sample_step(logits, settings, None, None)[2] is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_raise_the_error_agents_name(bad):
    """Agent._draw turns this message into NonFiniteUpdateError (diverged weights)."""
    logits = torch.zeros(3, 4)
    logits[1, 2] = bad
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        sample_step(logits, generator=torch.Generator().manual_seed(0))


def test_the_settings_record_is_frozen_and_checked_when_made():
    settings = SamplingSettings(0.5, 3, 0.9)
    with pytest.raises(AttributeError):
        settings.top_k = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"top_p=1.5: must be in \(0, 1\]"):
        SamplingSettings(top_p=1.5)
    assert SamplingSettings(0.0).logprob_temperature == 1.0
    assert settings.logprob_temperature == 0.5


def test_draws_by_inversion_follow_the_probabilities_and_never_pick_a_zero():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.001, 0.299, 0.0])
    n = 400_000
    ids = draw_categorical(probs.expand(n, -1), torch.Generator().manual_seed(0))
    assert ids.shape == (n, 1) and ids.dtype == torch.int64
    counts = torch.bincount(ids[:, 0], minlength=6).double()
    expected = probs.double() * n
    assert counts[1] == 0 and counts[5] == 0
    sigma = (expected * (1 - probs.double())).sqrt()
    assert bool(((counts - expected).abs() <= 5 * sigma).all()), (counts, expected)


@pytest.mark.parametrize(("u", "expected"), [(0.0, [1, 1]), (1.0 - 2.0**-53, [2, 3])])
def test_the_extreme_uniforms_land_on_the_first_and_last_ids_with_mass(monkeypatch, u, expected):
    """u = 0 must skip leading zero-probability ids, u just below 1 must not run past
    the last id with mass into masked ones."""

    def rand(shape, generator, dtype, device):
        return torch.full(shape, u, dtype=dtype)

    monkeypatch.setattr(sampling.torch, "rand", rand)
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0], [0.0, 0.25, 0.25, 0.5, 0.0]])
    assert draw_categorical(probs).squeeze(1).tolist() == expected
