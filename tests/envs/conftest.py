"""Env tests leave Gymnasium's registry and ``TASKS`` as they found them."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import pytest

from lmgym.envs import TASKS


@pytest.fixture(autouse=True)
def _forget_registered_envs() -> Iterator[None]:
    # A custom env registered by one test would otherwise show up in every later
    # listing of the tasks (e.g. `lmgym bench`'s list of valid names).
    registry, tasks = set(gym.registry), set(TASKS)
    yield
    for env_id in set(gym.registry) - registry:
        del gym.registry[env_id]
    for env_id in set(TASKS) - tasks:
        del TASKS[env_id]


# ------------------------------------------------------- a Llama-style BPE tokenizer
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BPE_CORPUS = [
    "the cat sat on the mat",
    "kim has 3 pens and gets 4 more. how many pens now? 7",
    "add two numbers: 3+4=7",
    "user assistant system",
]


def make_bpe_tokenizer():
    """A byte-level BPE tokenizer trained here with ``tokenizers``, with Llama's
    conventions (``<s>`` added before text by its post-processor, ``</s>`` EOS, no pad)
    and a ChatML chat template that starts with the BOS token; ``<|im_end|>`` is a
    special end-of-turn token, as in Qwen2's chat models. No download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(BPE_CORPUS * 20, trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
    )


@pytest.fixture
def bpe_tokenizer():
    return make_bpe_tokenizer()


@pytest.fixture
def tiny_llama(bpe_tokenizer):
    """A one-layer Llama built from a config for ``bpe_tokenizer``; its
    ``generation_config`` stops on ``</s>`` and ``<|im_end|>``, as chat models do."""
    from lmgym.policy import make_tiny_llama

    tok = bpe_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    return make_tiny_llama(
        len(tok),
        num_layers=1,
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.eos_token_id, im_end],
        max_position_embeddings=128,
    )
