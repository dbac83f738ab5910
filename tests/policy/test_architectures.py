"""CausalLMPolicy on a non-GPT-2 architecture: rotary positions, grouped KV heads, and
a sliding-window cache (a kind lmgym does not move into KV slots).

The rollout's sampler log-probs must equal teacher forcing in both rollout modes:
episode-synchronous and continuous (rows restarting at different steps).
"""

from __future__ import annotations

import pytest
import torch
from testkit import mistral_policy
from transformers import DynamicCache

from lmgym.policy import CausalLMPolicy
from lmgym.policy.kv_slots import is_slot_cache
from lmgym.rollout import ContinuousCollector, collect


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
    policy = mistral_policy(tokenizer, sliding_window, eos_bias=2.5, compile_decode=decode)
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
