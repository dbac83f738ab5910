"""Rollouts and weights as tensors: exact round trips, prompt padding, clear errors."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from lmgym.asynchronous.channels import Message, _header, _read_header
from lmgym.asynchronous.transport import (
    BATCH_FIELDS,
    VersionedRollout,
    concat_rollouts,
    flatten_weights,
    load_weights,
    pack,
    unpack,
)
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch


def rollout(seed: int = 0) -> VersionedRollout:
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_target_string_vector(num_envs=4, group_size=2, tokenizer=tokenizer)
    batch = collect(env, policy, seed=seed)
    versions = torch.randint(0, 9, batch.completion_mask.shape).masked_fill(
        ~batch.completion_mask, -1
    )
    return VersionedRollout(batch, versions, torch.arange(4) + 10)


def test_every_rollout_field_travels():
    assert [name for name, _, _ in BATCH_FIELDS] == [f.name for f in fields(RolloutBatch)]


def test_pack_unpack_is_exact():
    original = rollout()
    ints, floats = pack(original)
    assert ints.dtype == torch.int64 and floats.dtype == torch.float32
    back = unpack(ints, floats, prompt_width=original.batch.prompt_ids.shape[1])
    for f in fields(RolloutBatch):
        a, b = getattr(original.batch, f.name), getattr(back.batch, f.name)
        assert a.dtype == b.dtype and torch.equal(a, b), f.name
    assert torch.equal(back.versions, original.versions)
    assert torch.equal(back.slots, original.slots)


def test_unpack_with_the_wrong_prompt_width_is_an_error():
    original = rollout()
    ints, floats = pack(original)
    with pytest.raises(ValueError, match="do not match prompt width"):
        unpack(ints, floats, prompt_width=original.batch.prompt_ids.shape[1] + 1)


def test_concat_left_pads_narrower_prompts():
    a = rollout()
    short = a.batch.prompt_ids.shape[1] - 2
    cut = RolloutBatch(
        **{
            **{f.name: getattr(a.batch, f.name) for f in fields(RolloutBatch)},
            "prompt_ids": a.batch.prompt_ids[:, 2:],
            "prompt_mask": a.batch.prompt_mask[:, 2:],
        }
    )
    joined = concat_rollouts([a, VersionedRollout(cut, a.versions, a.slots)])
    assert joined.batch.prompt_ids.shape == (8, short + 2)
    assert not bool(joined.batch.prompt_mask[4:, :2].any())
    assert torch.equal(joined.batch.prompt_ids[4:, 2:], a.batch.prompt_ids[:, 2:])


def test_weights_round_trip_into_another_model():
    source, target = make_tiny_model(40, seed=1), make_tiny_model(40, seed=2)
    load_weights(target, flatten_weights(source, torch.device("cpu")))
    for p, q in zip(source.parameters(), target.parameters(), strict=True):
        assert torch.equal(p, q)


def test_weights_of_another_model_are_refused():
    flat = flatten_weights(make_tiny_model(40, n_layer=1), torch.device("cpu"))
    with pytest.raises(ValueError, match="actors and learners must build the same model"):
        load_weights(make_tiny_model(40, n_layer=2), flat)


def test_mixed_parameter_dtypes_are_refused():
    model = make_tiny_model(40)
    first = next(model.parameters())
    first.data = first.data.double()
    with pytest.raises(TypeError, match="needs one parameter dtype"):
        flatten_weights(model, torch.device("cpu"))


def test_message_header_round_trip():
    message = Message([3, 7], [torch.zeros(2, 5), torch.zeros(4, 1, dtype=torch.int64)])
    end, specs, ints = _read_header(_header(message, torch.device("cpu")))
    assert not end
    assert specs == [(torch.float32, 2, 5), (torch.int64, 4, 1)]
    assert ints[:2] == [3, 7]
    assert _read_header(_header(Message(end=True), torch.device("cpu")))[0]
    with pytest.raises(ValueError, match="at most 8 ints"):
        _header(Message(list(range(9))), torch.device("cpu"))
