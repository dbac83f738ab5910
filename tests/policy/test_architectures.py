"""CausalLMPolicy on a non-GPT-2 architecture: rotary positions, grouped KV heads, and
a sliding-window cache (a kind lmgym does not move into KV slots).

The rollout's sampler log-probs must equal teacher forcing in both rollout modes:
episode-synchronous and continuous (rows restarting at different steps).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

from lmgym.policy import CausalLMPolicy
from lmgym.policy.kv_slots import is_slot_cache
from lmgym.rollout import ContinuousCollector, collect


def mistral_policy(
    tokenizer, sliding_window: int | None, compile_decode: bool = False
) -> CausalLMPolicy:
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=sliding_window,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    # A biased head so that EOS is likely and episodes end at different steps.
    head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 2.5
    model.lm_head = head
    return CausalLMPolicy(model, tokenizer, compile_decode=compile_decode)


def max_logprob_gap(policy: CausalLMPolicy, batch) -> float:
    ids, mask = batch.input_ids()
    with torch.no_grad():
        teacher, _ = policy.logprobs(ids, mask, batch.max_new_tokens)
    gap = (teacher - batch.sampler_logprobs) * batch.completion_mask
    return gap.abs().max().item()


@pytest.mark.parametrize("sliding_window", [None, 4])
def test_rollouts_match_teacher_forcing_on_a_rotary_gqa_model(
    make_env, tokenizer, sliding_window, decode
):
    # Grouped KV heads: the compiled step's attention reads them without copying.
    policy = mistral_policy(tokenizer, sliding_window, decode)
    prompts = ["ab", "hello there", "x"]
    env = make_env(prompts=prompts, num_prompts=3, group_size=2, max_new_tokens=10)
    batch = collect(env, policy, seed=0)
    assert batch.lengths.min() < batch.lengths.max()
    assert max_logprob_gap(policy, batch) < 1e-4

    env = make_env(prompts=prompts, num_prompts=3, group_size=2, max_new_tokens=10, autoreset=True)
    collector = ContinuousCollector(env, policy, seed=0)
    batches = [collector.collect(num_groups=3) for _ in range(3)]
    for batch in batches:
        assert max_logprob_gap(policy, batch) < 1e-4
    assert policy.compile_decode == decode  # no fallback to eager
    # A plain cache moved into slots; a sliding-window cache is left to transformers.
    assert is_slot_cache(collector._state.cache) == (sliding_window is None)
    if sliding_window is not None:
        assert type(DynamicCache(config=policy.model.config).layers[0]).__name__ != "DynamicLayer"
