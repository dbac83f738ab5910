"""Fixtures the command-line tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tiny_llama(tmp_path: Path) -> Path:
    """A saved Llama-architecture model built from a config, with the character
    tokenizer (``tmp_path / "llama"``): what the LoRA tests train an adapter on."""
    from lmgym.policy import make_char_tokenizer, make_tiny_llama

    tokenizer = make_char_tokenizer()
    model = make_tiny_llama(
        len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    path = tmp_path / "llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
