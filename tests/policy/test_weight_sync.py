"""What an external engine loads (``lmgym.policy.weight_sync``): the policy's weights
in the transformers names, a LoRA adapter merged, and a plain model directory of them
that loads back to the same function. No vLLM needed: transformers is the oracle."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lmgym.policy import CausalLMPolicy, make_tiny_llama, make_tiny_model
from lmgym.policy.weight_sync import engine_weights, save_for_engine, weights_key

peft = pytest.importorskip("peft")


def lora_policy(tokenizer) -> CausalLMPolicy:
    model = make_tiny_llama(
        len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # init_lora_weights=False: B is random too, so the adapter changes the function.
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
    )
    return CausalLMPolicy(model, tokenizer, peft_config=config)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_weights_come_merged_under_the_base_models_names(tokenizer):
    policy = lora_policy(tokenizer)
    weights = dict(engine_weights(policy))
    merged = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    assert set(weights) == set(merged)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["lora", "tied"])
def test_a_saved_engine_directory_loads_back_to_the_policys_function(tokenizer, tmp_path, kind):
    # "tied": the tiny GPT-2 ties its input and output embeddings (stored once).
    if kind == "lora":
        policy = lora_policy(tokenizer)
    else:
        policy = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer)
    save_for_engine(policy, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, len(tokenizer), (3, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits(loaded, ids), logits(policy.model, ids), rtol=1e-5, atol=1e-5)


def test_the_weights_key_moves_with_an_optimizer_step_and_only_then(tokenizer):
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer)
    before = weights_key(policy)
    assert weights_key(policy) == before
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    loss = sum(p.sum() for p in policy.parameters())
    loss.backward()
    optimizer.step()
    assert weights_key(policy) != before
