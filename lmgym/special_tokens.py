"""Which token ids are special, and which of them are legal actions (``TokenRules``).

A special token (``<pad>``, ``<unk>``, ``<bos>``, a chat marker, ...) has no text of
its own: ``decode(..., skip_special_tokens=True)`` drops it. A policy that may
emit one can game a string reward (``'<pad>cc<unk>cccc'`` decodes to ``'cccccc'``).
So by default only the stop ids are legal special actions; ``allowed_special_tokens``
(ids or token strings, or ``"all"``) permits more. The env builds these rules once
(``TokenVectorEnv.token_rules``) and hands them to the policy
(``CausalLMPolicy.check_env``), which refuses to sample what the env refuses: one
record, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

#: Special tokens allowed beyond the stop token(s): ids or token strings, or ``"all"``.
AllowedSpecialTokens = Sequence[int | str] | Literal["all"]


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids ``decode(..., skip_special_tokens=True)`` drops, sorted.

    The tokenizer's named special tokens (pad, eos, unk, bos, ...,
    ``additional_special_tokens``) and every added token flagged ``special``.
    """
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return sorted(i for i in ids if 0 <= i < len(tokenizer))


def stop_ids_for(model: Any, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that should end a completion of ``model``: the tokenizer's EOS, then
    each id of the model's ``generation_config.eos_token_id`` (an int or a list).

    Chat models often stop on more than the tokenizer's EOS (Qwen2's ``<|im_end|>``
    and ``<|endoftext|>``, Llama 3's ``<|eot_id|>``); pass the result to the env as
    ``stop_token_ids`` so every one of them ends an episode (``CausalLMPolicy`` keeps
    them samplable and exposes them as ``policy.stop_token_ids``).

    Args:
        model: a transformers model (a ``peft`` model too), or anything with a
            ``generation_config``; ``None`` for the tokenizer's EOS only.
        tokenizer: the model's tokenizer.

    Returns:
        Distinct ids in that order; ids outside ``[0, len(tokenizer))`` are left out
        (the policy samples only the tokenizer's ids, so they could never occur).
    """
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is not None:
        ids.extend(int(i) for i in ([eos] if isinstance(eos, int) else eos))
    vocab = len(tokenizer)
    return [i for i in dict.fromkeys(ids) if 0 <= i < vocab]


def token_names(tokenizer: PreTrainedTokenizerBase, ids: Iterable[int]) -> list[str]:
    """``['<pad>' (id 0), ...]``-style names for error messages."""
    return [f"{tokenizer.convert_ids_to_tokens(int(i))!r} (id {int(i)})" for i in ids]


def resolve_special_tokens(
    tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int | str], field: str
) -> list[int]:
    """Ids of ``tokens`` (ids or token strings), each checked to be a special token.

    Raises:
        TypeError: ``tokens`` is a single string other than ``"all"``, or an entry is
            neither an int nor a string.
        ValueError: an entry is not a special token of ``tokenizer``.
    """
    if isinstance(tokens, str):
        raise TypeError(f"{field}={tokens!r}: pass a list of tokens, e.g. [{tokens!r}], or 'all'")
    special = set(special_token_ids(tokenizer))
    ids = []
    for token in tokens:
        if isinstance(token, str):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if tokenizer.convert_ids_to_tokens(token_id) != token:  # unknown: mapped to <unk>
                raise ValueError(f"{field}: {token!r} is not a token of this tokenizer")
        elif isinstance(token, int) and not isinstance(token, bool):
            token_id = token
        else:
            raise TypeError(f"{field}: {token!r} is neither a token id (int) nor a token string")
        if token_id not in special:
            raise ValueError(
                f"{field}: {token!r} is not a special token of this tokenizer (its special "
                f"tokens: {', '.join(token_names(tokenizer, sorted(special)))}); ordinary "
                "tokens are always allowed"
            )
        ids.append(int(token_id))
    return ids


@dataclass(frozen=True)
class TokenRules:
    """Which ids end a completion and which special ids are legal actions: one record,
    built by the env (``TokenVectorEnv.token_rules``) and handed to the policy
    (``CausalLMPolicy.check_env``), which then samples by it.

    Attributes:
        stop_ids: Ids that end a completion (a policy turn), in the order given.
        allowed_ids: Special ids that are legal actions besides the stop ids, sorted.
        refused_ids: Special ids that are not legal actions, sorted: the env refuses
            them and the policy never samples them (probability 0).
    """

    stop_ids: tuple[int, ...]
    allowed_ids: tuple[int, ...]
    refused_ids: tuple[int, ...]

    @classmethod
    def build(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        stop_ids: Iterable[int],
        allowed: AllowedSpecialTokens,
        field: str = "allowed_special_tokens",
    ) -> TokenRules:
        """The rules of ``tokenizer``'s special tokens: every one outside ``stop_ids``
        and ``allowed`` is refused.

        Args:
            tokenizer: Defines the special tokens.
            stop_ids: Ids that end a completion (always legal).
            allowed: Further special tokens allowed (ids or token strings), or
                ``"all"`` (then nothing is refused).
            field: The option's name, for errors.

        Raises:
            TypeError, ValueError: ``allowed`` names something that is not a special
                token of ``tokenizer`` (``resolve_special_tokens``).
        """
        stop = tuple(int(i) for i in stop_ids)
        special = set(special_token_ids(tokenizer)) - set(stop)
        if isinstance(allowed, str) and allowed == "all":
            allowed_ids = special
        else:
            allowed_ids = set(resolve_special_tokens(tokenizer, allowed, field)) - set(stop)
        return cls(stop, tuple(sorted(allowed_ids)), tuple(sorted(special - allowed_ids)))

    def refused_mask(self, vocab_size: int, device: torch.device | str = "cpu") -> Tensor | None:
        """``[V] bool``, True at ``refused_ids``; ``None`` when nothing is refused."""
        if not self.refused_ids:
            return None
        mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        mask[list(self.refused_ids)] = True
        return mask

    def check_model_stops(
        self, tokenizer: PreTrainedTokenizerBase, model_stop_ids: Iterable[int]
    ) -> None:
        """Fail when a model would have to end its turns on an id these rules refuse.

        Args:
            tokenizer: For token names in the message.
            model_stop_ids: The model's own stop ids (``stop_ids_for(model, tokenizer)``).

        Raises:
            ValueError: one of them is refused, naming the fix.
        """
        refused = set(self.refused_ids)
        unstoppable = [int(i) for i in model_stop_ids if i in refused]
        if unstoppable:
            names = ", ".join(token_names(tokenizer, unstoppable))
            raise ValueError(
                f"the model stops on {names} (its generation_config.eos_token_id), which the "
                "env refuses as an action; build the env with "
                "stop_token_ids=policy.stop_token_ids (lmgym.envs.stop_ids_for(model, "
                "tokenizer)) so that it ends completions there too"
            )
