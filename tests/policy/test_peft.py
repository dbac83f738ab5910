"""CausalLMPolicy under a peft adapter (LoRA on a tiny Llama built from a config).

The adapter layers must sit in the trunk both the sampler and the learner run; only
the adapter trains; a checkpoint reloads base plus adapter and the optimizer
exactly; the KL reference is the base model seen through the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from lmgym.agents import GRPO
from lmgym.envs import FunctionReward
from lmgym.policy import CausalLMPolicy, make_tiny_llama
from lmgym.policy.value import AdapterDisabledReference, frozen_copy
from lmgym.rollout import ContinuousCollector, collect

peft = pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    return make_tiny_llama(
        len(tokenizer),
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def lora(init: bool = True) -> peft.LoraConfig:
    # init=False draws B at random too, so the adapter changes the outputs from the start.
    return peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init
    )


def first_char(prompts: list, completions: list[str]) -> list[float]:
    """A reward that varies within a group whatever the draw (unlike counting a rare
    character, whose groups are often flat: zero advantages, zero gradients)."""
    return [float(ord(c[0])) if c else 0.0 for c in completions]


def lora_policy(tokenizer, init: bool = True) -> CausalLMPolicy:
    return CausalLMPolicy(tiny_llama(tokenizer), tokenizer, peft_config=lora(init))


def teacher_forced(policy: CausalLMPolicy, batch) -> torch.Tensor:
    ids, mask = batch.input_ids()
    with torch.no_grad():
        return policy.logprobs(ids, mask, batch.max_new_tokens, with_entropy=False)[0]


def lora_parameters(policy: CausalLMPolicy) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in policy.model.named_parameters() if "lora_" in n}


def test_a_lora_policy_rolls_out_and_its_sampler_logprobs_equal_teacher_forcing(
    make_env, tokenizer
):
    model = peft.get_peft_model(tiny_llama(tokenizer), lora(init=False))
    policy = CausalLMPolicy(model, tokenizer)  # a PeftModel made by the user
    env = make_env(
        prompts=["ab", "hello there", "x"], num_prompts=3, group_size=2, max_new_tokens=8
    )
    batch = collect(env, policy, seed=0)
    mask = batch.completion_mask
    teacher = teacher_forced(policy, batch)
    assert ((teacher - batch.sampler_logprobs) * mask).abs().max() < 1e-4
    # The adapter is in the path: the base model alone gives other log-probs.
    base = CausalLMPolicy(tiny_llama(tokenizer), tokenizer)
    assert ((teacher_forced(base, batch) - teacher) * mask).abs().max() > 1e-2

    env = make_env(
        prompts=["ab", "xyz"], num_prompts=2, group_size=2, max_new_tokens=8, autoreset=True
    )
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(2):
        batch = collector.collect(num_groups=2)
        gap = (teacher_forced(policy, batch) - batch.sampler_logprobs) * batch.completion_mask
        assert gap.abs().max() < 1e-4


def test_only_the_adapter_gets_gradients_and_optimizer_slots(make_env, tokenizer):
    policy = lora_policy(tokenizer)
    adapter = lora_parameters(policy)
    assert adapter and all(p.requires_grad for p in adapter.values())
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if n not in adapter}
    env = make_env(num_prompts=2, group_size=4, reward=FunctionReward(first_char))
    agent = GRPO(policy, env, learning_rate=1e-2)

    optimized = {id(p) for group in agent.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in adapter.values()}
    agent.learn(1)
    assert {id(p) for p in agent.optimizer.state} == {id(p) for p in adapter.values()}
    for name, param in policy.model.named_parameters():
        if name in base:
            assert param.grad is None, name
            assert torch.equal(param, base[name]), name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter.values())


def test_agent_save_then_load_restores_adapter_and_optimizer_exactly(make_env, tokenizer, tmp_path):
    env = make_env(num_prompts=2, group_size=4)
    agent = GRPO(lora_policy(tokenizer), env, learning_rate=1e-2, seed=3)
    agent.learn(2)
    path = agent.save(tmp_path / "ckpt")

    policy_dir = path / "policy"
    names = {p.name for p in policy_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "base"} <= names
    assert "model.safetensors" not in names  # transformers must not load the base alone
    assert (policy_dir / "base" / "model.safetensors").is_file()
    assert json.loads((policy_dir / "adapter_config.json").read_text())["r"] == 4

    loaded = GRPO.load(path, make_env(num_prompts=2, group_size=4))
    assert isinstance(loaded.policy.model, peft.PeftModel)
    batch = collect(make_env(num_prompts=2, group_size=4), agent.policy, seed=5)
    assert torch.equal(teacher_forced(loaded.policy, batch), teacher_forced(agent.policy, batch))
    for (name, a), (_, b) in zip(
        agent.policy.model.named_parameters(), loaded.policy.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
        assert a.requires_grad == b.requires_grad, name

    # The next update is the same: Adam's moments and step counts came back.
    agent.learn(1)
    loaded.learn(1)
    for a, b in zip(
        lora_parameters(agent.policy).values(), lora_parameters(loaded.policy).values(), strict=True
    ):
        assert torch.equal(a, b)

    # The policy directory alone reloads the same model.
    again = CausalLMPolicy.from_pretrained(policy_dir)
    assert isinstance(again.model, peft.PeftModel)
    assert {n for n, p in again.model.named_parameters() if p.requires_grad} == set(
        lora_parameters(again)
    )


def test_kl_reference_is_the_base_model_through_the_same_weights(make_env, tokenizer):
    policy = lora_policy(tokenizer)  # LoRA's default init: B = 0, the policy starts as the base
    ref = frozen_copy(policy)
    assert isinstance(ref, AdapterDisabledReference)
    # No second copy: every parameter of the reference is the policy's own tensor.
    assert ref.model is policy.model
    ref_storage = {p.data_ptr() for p in ref.parameters()}
    assert ref_storage == {p.data_ptr() for p in policy.parameters()}

    env = make_env(num_prompts=2, group_size=4, reward=FunctionReward(first_char))
    agent = GRPO(policy, env, ref, beta=0.1, learning_rate=5e-2)
    batch = collect(make_env(num_prompts=2, group_size=4), policy, seed=0)
    data = agent.prepare(batch.to(policy.device))
    assert torch.equal(data.ref_logprobs, teacher_forced(policy, batch))
    flags = {n: p.requires_grad for n, p in policy.model.named_parameters()}

    base = CausalLMPolicy(tiny_llama(tokenizer), tokenizer)
    agent.learn(2)
    mask = batch.completion_mask
    after = teacher_forced(policy, batch)
    lp_ref = teacher_forced(ref, batch)
    assert ((after - lp_ref) * mask).abs().max() > 1e-3  # the adapter moved the policy...
    assert ((lp_ref - teacher_forced(base, batch)) * mask).abs().max() < 1e-5  # ...not the base
    # peft's disable/enable context toggles requires_grad; it is put back.
    assert {n: p.requires_grad for n, p in policy.model.named_parameters()} == flags


def test_a_saved_adapter_brings_its_kl_reference_along(make_env, tokenizer, tmp_path):
    env = make_env(num_prompts=2, group_size=4)
    policy = lora_policy(tokenizer)
    agent = GRPO(policy, env, frozen_copy(policy), beta=0.1, learning_rate=1e-2)
    agent.learn(1)
    path = agent.save(tmp_path / "ckpt")
    # Agent.load needs no ref_policy for an adapter: the base under it is the reference.
    loaded = GRPO.load(path, make_env(num_prompts=2, group_size=4))
    assert isinstance(loaded.ref_policy, AdapterDisabledReference)
    assert loaded.ref_policy.model is loaded.policy.model
    batch = collect(make_env(num_prompts=2, group_size=4), policy, seed=1)
    assert torch.equal(
        teacher_forced(loaded.ref_policy, batch), teacher_forced(agent.ref_policy, batch)
    )
    # A policy given by its directory, as Stable-Baselines3 takes a policy name.
    by_path = GRPO(str(path / "policy"), make_env(num_prompts=2, group_size=4), beta=0.1)
    assert by_path.policy.is_peft and isinstance(by_path.ref_policy, AdapterDisabledReference)
    assert torch.equal(teacher_forced(by_path.policy, batch), teacher_forced(policy, batch))


def test_merged_save_is_a_plain_model_with_the_adapters_logprobs(make_env, tokenizer, tmp_path):
    policy = lora_policy(tokenizer, init=False)
    policy.save_pretrained(tmp_path / "merged", merged=True)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = CausalLMPolicy.from_pretrained(tmp_path / "merged")
    assert type(merged.model) is LlamaForCausalLM
    assert not any("lora_" in n for n, _ in merged.model.named_parameters())
    batch = collect(make_env(num_prompts=2, group_size=2), policy, seed=0)
    gap = (teacher_forced(merged, batch) - teacher_forced(policy, batch)) * batch.completion_mask
    assert gap.abs().max() < 1e-5
    # Writing the merged copy left the policy's adapter in place.
    assert isinstance(policy.model, peft.PeftModel) and lora_parameters(policy)


def test_from_pretrained_with_peft_config_wraps_a_saved_model(tokenizer, tmp_path):
    model = tiny_llama(tokenizer)
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    policy = CausalLMPolicy.from_pretrained(tmp_path / "base", peft_config=lora())
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_parameters(policy)) and trainable

    policy.save_pretrained(tmp_path / "adapted")
    with pytest.raises(ValueError, match="already holds an adapter; load it without peft_config"):
        CausalLMPolicy.from_pretrained(tmp_path / "adapted", peft_config=lora())


def test_a_plain_peft_adapter_directory_loads_with_its_base_model(make_env, tokenizer, tmp_path):
    tiny_llama(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    # Trained elsewhere with peft alone: adapter files only, the base named in the config.
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    peft.get_peft_model(base, lora(init=False)).save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "tokenizer_config.json").exists()

    policy = CausalLMPolicy.from_pretrained(tmp_path / "adapter")
    assert policy.is_peft and policy.vocab_size == len(tokenizer)
    reference = CausalLMPolicy(
        peft.PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
        ),
        tokenizer,
    )
    batch = collect(make_env(num_prompts=2, group_size=2), reference, seed=0)
    assert torch.equal(teacher_forced(policy, batch), teacher_forced(reference, batch))


def test_adapter_setups_the_policy_cannot_run_fail_with_the_fix(tokenizer):
    with pytest.raises(TypeError, match=r"expected a peft.PeftConfig such as peft.LoraConfig"):
        CausalLMPolicy(tiny_llama(tokenizer), tokenizer, peft_config={"r": 4})
    on_head = peft.LoraConfig(r=2, target_modules=["q_proj", "lm_head"])
    with pytest.raises(TypeError, match="leave lm_head out of an adapter's target_modules"):
        CausalLMPolicy(tiny_llama(tokenizer), tokenizer, peft_config=on_head)
    prefix = peft.get_peft_model(
        tiny_llama(tokenizer), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    )
    with pytest.raises(NotImplementedError, match="prompt-learning method"):
        CausalLMPolicy(prefix, tokenizer)


def test_transformers_integrated_adapters_fail_with_the_fix(tokenizer):
    model = tiny_llama(tokenizer)
    try:
        model.add_adapter(lora())
    except ValueError as error:  # transformers may ask for a newer peft than is installed
        pytest.skip(f"transformers' add_adapter is unavailable: {error}")
    with pytest.raises(TypeError, match="model.add_adapter are not supported; wrap the plain"):
        CausalLMPolicy(model, tokenizer)


def test_lmgym_imports_without_peft_and_names_the_extra_when_it_is_needed():
    script = """
import sys
sys.modules["peft"] = None  # as if peft were not installed
import lmgym, lmgym.agents, lmgym.policy, lmgym.policy.value, lmgym.training
from lmgym.policy import CausalLMPolicy, make_tiny_lm
model, tok = make_tiny_lm()
CausalLMPolicy(model, tok)  # a plain model needs no peft
try:
    CausalLMPolicy(model, tok, peft_config=object())
except ImportError as error:
    print(error)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert "peft_config needs the optional dependency peft: pip install 'lmgym[peft]'" in out.stdout


def test_the_adapter_disabled_reference_masks_the_policys_special_tokens(tokenizer, ids):
    # A reference that refused a token the policy may sample would score it -inf
    # (an infinite KL) wherever the policy sampled it.
    policy = CausalLMPolicy(
        tiny_llama(tokenizer), tokenizer, peft_config=lora(), allowed_special_tokens=["<pad>"]
    )
    ref = frozen_copy(policy)
    assert ref.masked_token_ids == policy.masked_token_ids
    text = torch.tensor([[*ids("ab"), tokenizer.pad_token_id, *ids("c")]])
    attn = torch.ones_like(text, dtype=torch.bool)
    with torch.no_grad():
        lp_ref = ref.logprobs(text, attn, 2, with_entropy=False)[0]
        lp = policy.logprobs(text, attn, 2, with_entropy=False)[0]
    assert torch.isfinite(lp_ref).all()
    torch.testing.assert_close(lp_ref, lp)  # LoRA's B = 0: the base is the policy


def test_a_lora_run_raises_no_checkpointing_deprecation_warning(make_env, tokenizer, tmp_path):
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a
    model; building, training, saving and loading a LoRA policy must not show it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make_env(num_prompts=2, group_size=2)
        agent = GRPO(lora_policy(tokenizer), env, learning_rate=1e-2, seed=0)
        agent.learn(1)
        GRPO.load(agent.save(tmp_path / "ckpt"), make_env(num_prompts=2, group_size=2))
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


# ------------------------------------------- a checkpoint references its base model
def saved_base(tokenizer, path: Path) -> Path:
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_checkpoint_of_a_saved_base_holds_the_adapter_and_a_checked_reference(
    make_env, tokenizer, tmp_path
):
    from lmgym.policy.adapters import BASE_REFERENCE, state_sha256

    base = saved_base(tokenizer, tmp_path / "base")
    policy = CausalLMPolicy.from_pretrained(base, peft_config=lora(init=False))
    agent = GRPO(policy, make_env(num_prompts=2, group_size=4), learning_rate=1e-2, seed=3)
    agent.learn(1)
    path = agent.save(tmp_path / "ckpt")
    policy_dir = path / "policy"
    assert not (policy_dir / "base").exists()  # no copy of the base weights
    reference = json.loads((policy_dir / BASE_REFERENCE).read_text())
    loaded_base = AutoModelForCausalLM.from_pretrained(base)
    assert reference["name_or_path"] == str(base.resolve())
    assert reference["sha256"] == state_sha256(loaded_base.state_dict())

    # It reloads exactly, optimizer included, and saved again names the same base.
    loaded = GRPO.load(path, make_env(num_prompts=2, group_size=4))
    batch = collect(make_env(num_prompts=2, group_size=4), agent.policy, seed=5)
    assert torch.equal(teacher_forced(loaded.policy, batch), teacher_forced(agent.policy, batch))
    agent.learn(1)
    loaded.learn(1)
    for a, b in zip(
        lora_parameters(agent.policy).values(), lora_parameters(loaded.policy).values(), strict=True
    ):
        assert torch.equal(a, b)
    again = loaded.save(tmp_path / "again")
    assert json.loads((again / "policy" / BASE_REFERENCE).read_text()) == reference


def test_other_base_weights_or_a_moved_base_fail_in_one_line_naming_the_fix(
    tokenizer, tmp_path, monkeypatch
):
    from lmgym.policy.adapters import BASE_ENV, BaseModelError

    base = saved_base(tokenizer, tmp_path / "base")
    CausalLMPolicy.from_pretrained(base, peft_config=lora()).save_pretrained(tmp_path / "a")

    other = tiny_llama(tokenizer, seed=1)  # same shapes, other weights
    other.save_pretrained(base)
    with pytest.raises(BaseModelError, match="is not the one it was trained on") as info:
        CausalLMPolicy.from_pretrained(tmp_path / "a")
    assert "\n" not in str(info.value) and f"{BASE_ENV}=DIR" in str(info.value)

    moved = tmp_path / "moved"
    saved_base(tokenizer, moved)
    import shutil

    shutil.rmtree(base)
    with pytest.raises(BaseModelError) as info:
        CausalLMPolicy.from_pretrained(tmp_path / "a")
    assert str(info.value).startswith(
        f"LoRA checkpoint {tmp_path / 'a'}: its base model {base.resolve()} is gone (weights "
        "SHA-256 "
    )
    assert str(info.value).endswith(
        f"put the same model back there, or set {BASE_ENV}=DIR to a copy of it (its weights "
        "are checked against that hash)"
    )
    monkeypatch.setenv(BASE_ENV, str(moved))
    assert CausalLMPolicy.from_pretrained(tmp_path / "a").is_peft


def test_keep_base_weights_writes_the_base_into_the_checkpoint(tokenizer, tmp_path):
    from lmgym.policy.adapters import BASE_REFERENCE, keep_base_weights

    base = saved_base(tokenizer, tmp_path / "base")
    policy = CausalLMPolicy.from_pretrained(base, peft_config=lora(init=False))
    keep_base_weights(policy.model)
    policy.save_pretrained(tmp_path / "whole")
    assert (tmp_path / "whole" / "base" / "model.safetensors").is_file()
    assert not (tmp_path / "whole" / BASE_REFERENCE).exists()
    import shutil

    shutil.rmtree(base)  # the checkpoint alone reloads
    assert CausalLMPolicy.from_pretrained(tmp_path / "whole").is_peft


def test_a_packaged_base_is_found_again_where_its_cache_now_is(tokenizer, tmp_path, monkeypatch):
    import shutil

    import lmgym.policy.packaged as packaged
    from lmgym.policy.adapters import BASE_REFERENCE

    base = saved_base(tokenizer, tmp_path / "cache" / "smollm2-135m-instruct-0.1.2")
    (base / packaged.MARKER).write_text(json.dumps({"name": "smollm2-135m-instruct"}))
    CausalLMPolicy.from_pretrained(base, peft_config=lora()).save_pretrained(tmp_path / "a")
    reference = json.loads((tmp_path / "a" / BASE_REFERENCE).read_text())
    assert reference["packaged"] == "smollm2-135m-instruct"

    moved = tmp_path / "other-cache" / base.name  # LMGYM_MODEL_CACHE changed
    shutil.copytree(base, moved)
    shutil.rmtree(base)
    asked = []
    monkeypatch.setattr(packaged, "packaged_model_dir", lambda name: asked.append(name) or moved)
    assert CausalLMPolicy.from_pretrained(tmp_path / "a").is_peft
    assert asked == ["smollm2-135m-instruct"]
