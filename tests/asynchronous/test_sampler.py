"""The actor's sampler: collect()'s batches at one version, versions per token, admission, KV cache."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from testkit import collected_and_admission

from lmgym.asynchronous.sampler import AdmissionCollector
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

ROWS, GROUP, LENGTH = 12, 4, 6


def make(autoreset: bool = False):
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_target_string_vector(
        num_envs=ROWS,
        group_size=GROUP,
        max_new_tokens=LENGTH,
        tokenizer=tokenizer,
        autoreset=autoreset,
    )
    generator = torch.Generator()
    generator.manual_seed(5)
    return policy, env, generator


def run_to_end(collector: AdmissionCollector, version: int) -> None:
    while collector.num_live:
        collector.step(version)


def test_whole_batches_are_collects_batches_token_for_token():
    """Admitting every row only when all have finished is the synchronous loop:
    the same rows as lmgym.rollout.collect with the same seed and generator."""
    expected, collector = collected_and_admission(make, batches=3, seed=3)
    for i, batch in enumerate(expected):
        assert collector.admit(ROWS) == ROWS
        run_to_end(collector, version=i)
        got = collector.take_groups()
        for f in fields(batch):
            assert torch.equal(getattr(got.batch, f.name), getattr(batch, f.name)), f.name
        assert torch.equal(got.slots, torch.arange(i * ROWS, (i + 1) * ROWS))
        real = batch.completion_mask
        assert bool((got.versions[real] == i).all()) and bool((got.versions[~real] == -1).all())


def test_every_token_carries_the_version_that_sampled_it():
    policy, env, generator = make()
    collector = AdmissionCollector(env, policy, generator, seed=0)
    collector.admit(None)
    collector.step(version=0)
    collector.step(version=0)
    run_to_end(collector, version=1)  # new weights between the 2nd and 3rd token
    got = collector.take_groups()
    columns = torch.arange(LENGTH)[None, :].expand(ROWS, -1)
    expected = torch.where(columns < 2, 0, 1).masked_fill(~got.batch.completion_mask, -1)
    assert torch.equal(got.versions, expected)
    assert int(got.batch.lengths.max()) > 2  # some row does span both versions


def test_admission_starts_only_the_allowed_rows_with_the_next_slots():
    policy, env, generator = make()
    collector = AdmissionCollector(env, policy, generator, seed=0)
    with pytest.raises(ValueError, match="first admission starts every row"):
        collector.admit(ROWS - 1)
    assert collector.admit(None) == ROWS
    collector.step(version=0)
    assert collector.admit(None) == 0  # nothing has finished after one token
    run_to_end(collector, version=0)
    assert collector.admit(5) == 5
    assert collector.num_live == 5 and collector.next_slot == ROWS + 5
    live = collector.live.nonzero().squeeze(1)
    assert torch.equal(live, torch.arange(5))  # the lowest idle rows
    assert torch.equal(collector.slots[live], torch.arange(ROWS, ROWS + 5))
    # The env's group ids follow the slots: group = slot // G.
    assert torch.equal(collector._info["group_id"][live], collector.slots[live] // GROUP)


def test_take_groups_returns_only_whole_groups_in_slot_order():
    policy, env, generator = make()
    collector = AdmissionCollector(env, policy, generator, seed=0)
    collector.admit(None)
    run_to_end(collector, version=0)
    first = collector.take_groups()
    assert first.batch.batch_size == ROWS
    collector.admit(5)  # one whole group (slots 12..15) and one row of the next
    run_to_end(collector, version=1)
    second = collector.take_groups()
    assert torch.equal(second.slots, torch.arange(12, 16))
    assert torch.equal(second.batch.group_ids, torch.full((4,), 3))
    assert collector.take_groups() is None  # slot 16's group is not whole yet


def test_an_autoreset_env_is_refused_with_the_fix():
    policy, env, generator = make(autoreset=True)
    with pytest.raises(ValueError, match="build the actors' env with autoreset=False"):
        AdmissionCollector(env, policy, generator, seed=0)


@pytest.mark.parametrize("rebuild", [True, False])
def test_in_flight_weights_with_a_rebuilt_or_kept_kv_cache(rebuild):
    """After new weights, a rebuilt cache samples exactly the new policy (sampler
    log-probs equal teacher-forced ones); a kept cache (PipelineRL) does not: its
    prefix keys and values are the old weights', the mismatch TIS corrects."""
    policy, env, generator = make()
    collector = AdmissionCollector(env, policy, generator, seed=0)
    collector.admit(None)
    collector.step(version=0)
    collector.step(version=0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if rebuild:
        collector.drop_cache()
    run_to_end(collector, version=1)
    got = collector.take_groups()
    ids, attn = got.batch.input_ids()
    teacher, _ = policy.logprobs(ids, attn, LENGTH, with_entropy=False)
    after = got.versions == 1
    assert int(after.sum()) > 0
    gap = (teacher - got.batch.sampler_logprobs)[after].abs().max()
    if rebuild:
        assert gap < 1e-4
    else:
        assert gap > 1e-3
