"""The rollout engine: reproducibility and a batch that carries everything agents need."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmgym.rollout import collect, score_policy


def test_same_seed_gives_identical_rollouts(make_env, policy):
    kw = dict(prompts=["ab", "cd", "ef"], num_prompts=2, group_size=3, max_new_tokens=6)
    a = collect(make_env(**kw), policy, seed=7)
    b = collect(make_env(**kw), policy, seed=7)
    c = collect(make_env(**kw), policy, seed=8)
    for field in dataclasses.fields(a):
        assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_batch_is_self_consistent(make_env, make_eos_policy, tokenizer):
    env = make_env(prompts=["ab", "cd"], num_prompts=2, group_size=8, max_new_tokens=6)
    batch = collect(env, make_eos_policy(tokenizer, eos_bias=1.0), seed=0)
    b, length = 16, 6
    assert batch.completion_ids.shape == (b, length) and batch.sampler_logprobs.shape == (b, length)
    assert torch.equal(batch.lengths, batch.completion_mask.sum(1))
    # The mask is a prefix: real tokens, then padding.
    positions = torch.arange(length)
    assert torch.equal(batch.completion_mask, positions[None] < batch.lengths[:, None])
    assert torch.equal(batch.dones, positions[None] == (batch.lengths - 1)[:, None])
    last = batch.completion_ids.gather(1, (batch.lengths - 1)[:, None]).squeeze(1)
    assert torch.equal(batch.terminated, last == tokenizer.eos_token_id)
    assert torch.equal(batch.truncated, ~batch.terminated & (batch.lengths == length))
    assert (batch.sampler_logprobs[~batch.completion_mask] == 0).all()
    assert (batch.sampler_logprobs[batch.completion_mask] < 0).all()
    assert batch.terminated.any() and batch.truncated.any()


def test_agents_need_nothing_but_the_batch(make_env, policy):
    """Group-relative advantages and per-prompt lookups come from batch fields alone."""
    env = make_env(prompts=["aa", "bb"], num_prompts=2, group_size=4, max_new_tokens=5)
    batch = collect(env, policy, seed=3)
    groups, inverse = torch.unique(batch.group_ids, return_inverse=True)
    assert groups.numel() == 2
    means = torch.zeros(2).index_add_(0, inverse, batch.scores) / 4
    advantages = batch.scores - means[inverse]
    torch.testing.assert_close(advantages.view(2, 4).sum(1), torch.zeros(2), atol=1e-5, rtol=0)
    expected = torch.tensor(
        [float(c.count("a")) for c in env.decode_completions(batch.completion_ids)]
    )
    torch.testing.assert_close(batch.scores, expected)
    # Prompt ids in the batch decode back to the prompt source's text.
    prompts = env.tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)
    assert prompts == [["aa", "bb"][i] for i in batch.prompt_index.tolist()]


def test_no_attention_mask_warning_when_pad_is_eos_and_a_row_stops(make_env):
    """A model whose config names a pad id equal to EOS (as many do) gets an attention
    mask whenever it is fed that id: transformers' "We strongly recommend passing in an
    `attention_mask`" warning used to break the first progress-bar line."""
    import logging

    from transformers.utils import logging as hf_logging

    from lmgym.char_tokenizer import make_char_tokenizer
    from lmgym.policy import CausalLMPolicy, make_tiny_model

    tokenizer = make_char_tokenizer(pad_equals_eos=True)
    eos = tokenizer.eos_token_id
    model = make_tiny_model(len(tokenizer), seed=0, eos_token_id=eos, pad_token_id=eos)
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] *= 0
        model.get_output_embeddings().weight[eos, 0] = 8.0  # EOS likely, not certain
    policy = CausalLMPolicy(model, tokenizer)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    root = hf_logging.get_logger("transformers")
    root.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # the warning is once per process
    try:
        env = make_env(
            prompts=["ab", "cd"], num_prompts=2, group_size=8, max_new_tokens=6, tokenizer=tokenizer
        )
        batch = collect(env, policy, seed=0)
    finally:
        root.removeHandler(handler)
    # Some rows stopped early and others went on: EOS (= pad) was fed while unpadded.
    assert 1 in batch.lengths.tolist() and batch.lengths.max() > 2
    assert not [r for r in records if "attention_mask" in r.getMessage()]


def test_score_policy_refuses_the_training_env_and_moves_nothing(make_env, policy):
    kw = dict(prompts=["ab", "cd"], num_prompts=2, group_size=2, max_new_tokens=4)
    training = make_env(**kw)
    with pytest.raises(ValueError, match="env: evaluate needs an env of its own"):
        score_policy(training, policy, training_env=training)
    scored = score_policy(make_env(**kw), policy, num_batches=2, seed=5, training_env=training)
    assert scored == score_policy(make_env(**kw), policy, num_batches=2, seed=5)


def test_collect_records_what_a_per_step_recorder_records(make_env, make_eos_policy, tokenizer):
    """collect writes its per-step records once at the end (record_steps): the batch is
    bit for bit that of the per-step EpisodeRecorder.record loop, +0.0 past each end."""
    from lmgym.rollout import EpisodeRecorder

    kw = dict(prompts=["ab", "cd"], num_prompts=2, group_size=4, max_new_tokens=6)
    policy = make_eos_policy(tokenizer, eos_bias=1.0)
    batch = collect(make_env(**kw), policy, seed=3)
    env = make_env(**kw)
    generator = torch.Generator().manual_seed(3)
    obs, info = env.reset(seed=3)
    recorder, state = EpisodeRecorder(env), None
    live = torch.ones(env.num_envs, dtype=torch.bool)
    while bool(live.any()):
        actions, logprobs, state = policy.act(obs, state, generator=generator)
        obs, reward, terminated, truncated, next_info = env.step(actions)
        recorder.record(info, live, logprobs, reward, state.special_mass)
        info, live = next_info, ~(terminated | truncated)
    expected = recorder.finished(obs, info, torch.arange(8), terminated, truncated)
    assert batch.terminated.any() and not batch.terminated.all()
    for field in dataclasses.fields(batch):
        a, b = getattr(batch, field.name), getattr(expected, field.name)
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)  # -0.0 is not +0.0 here
        assert torch.equal(a, b), field.name
