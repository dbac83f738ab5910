"""The agent's generators (agents/rollout_source.seeded_generators)."""

from __future__ import annotations

import torch

from lmgym.agents.rollout_source import seeded_generators


def draws(generator: torch.Generator) -> list[int]:
    return torch.randint(0, 1_000_000, (4,), generator=generator).tolist()


def reference(seed: int) -> list[int]:
    return draws(torch.Generator().manual_seed(seed))


def test_rank_zero_samples_as_one_process_and_the_shuffle_has_its_own_seed():
    sampler, shuffle = seeded_generators(3, torch.device("cpu"), rank=0)
    assert draws(sampler) == reference(3)
    assert draws(shuffle) == reference(4)  # seed + 1


def test_other_ranks_sample_other_completions_and_shuffle_alike():
    sampler, shuffle = seeded_generators(3, torch.device("cpu"), rank=2)
    assert draws(sampler) == reference(3 + 2 * 7919)
    assert draws(shuffle) == reference(4)  # every rank orders its minibatches alike
