"""A character-level tokenizer, built locally with no download.

The built-in tasks default to it, and the tiny demo models (``lmgym.policy.tiny``)
are sized for it; it lives outside ``lmgym.policy`` because the envs need it
without a policy.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DEFAULT_CHARS = string.ascii_lowercase + string.digits + " +-*=:.,?!"


def make_char_tokenizer(
    chars: str = DEFAULT_CHARS, pad_equals_eos: bool = False
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer made with the ``tokenizers`` library.

    Ids: ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2, then one id per character of
    ``chars`` in order. Decoding concatenates characters without spaces.

    Args:
        chars: The characters of the vocabulary (duplicates are an error).
        pad_equals_eos: Use ``<eos>`` as the pad token too (pad id == eos id), as
            many real tokenizers do; there is then no separate ``<pad>`` entry.
    """
    if len(set(chars)) != len(chars):
        raise ValueError("chars: contains duplicate characters; pass each character once")
    specials = [EOS, UNK] if pad_equals_eos else [PAD, EOS, UNK]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for c in chars:
        vocab[c] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=EOS if pad_equals_eos else PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
