"""Which token ids are special, and which of them a policy may sample or an env accepts.

A special token (``<pad>``, ``<unk>``, ``<bos>``, a chat marker, ...) has no text of
its own: ``decode(..., skip_special_tokens=True)`` drops it. A policy that may
emit one can game a string reward (``'<pad>cc<unk>cccc'`` decodes to ``'cccccc'``).
So by default ``CausalLMPolicy`` never samples a special token other than its
stop token, ``TokenVectorEnv`` refuses one other than its stop ids, and both take
``allowed_special_tokens`` to permit more (ids or token strings, or ``"all"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

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


def refused_special_ids(
    tokenizer: PreTrainedTokenizerBase,
    keep: Iterable[int],
    allowed: AllowedSpecialTokens,
    field: str = "allowed_special_tokens",
) -> list[int]:
    """The special ids outside ``keep`` (the stop ids) and ``allowed``, sorted.

    Args:
        tokenizer: Defines the special tokens.
        keep: Ids always allowed (the stop token(s)).
        allowed: Further special tokens allowed, or ``"all"`` (then nothing is refused).
        field: The option's name, for errors.
    """
    if isinstance(allowed, str) and allowed == "all":
        return []
    allowed_ids = resolve_special_tokens(tokenizer, allowed, field)
    return sorted(set(special_token_ids(tokenizer)) - set(keep) - set(allowed_ids))


def check_special_tokens_match(
    tokenizer: PreTrainedTokenizerBase,
    masked_ids: Sequence[int],
    env_stop_ids: Sequence[int],
    env_refused_ids: Sequence[int],
) -> None:
    """Fail early when a policy's special-token mask and an env's rules disagree.

    Args:
        tokenizer: For token names in the message.
        masked_ids: Ids the policy never samples.
        env_stop_ids: Ids that end the env's episodes.
        env_refused_ids: Special ids the env refuses as actions.

    Raises:
        ValueError: the policy masks a stop id (it could never end a completion), or
            may sample a special id the env refuses.
    """
    masked = set(masked_ids)
    unstoppable = [i for i in env_stop_ids if i in masked]
    if unstoppable:
        names = ", ".join(token_names(tokenizer, unstoppable))
        raise ValueError(
            f"the env stops on {names}, which the policy never samples (a masked special "
            f"token), so no completion could end; build the policy with "
            f"allowed_special_tokens=[...] naming it"
        )
    refused = sorted(set(env_refused_ids) - masked)
    if refused:
        names = ", ".join(token_names(tokenizer, refused))
        raise ValueError(
            f"the policy may sample {names}, which the env refuses as actions; pass the same "
            "allowed_special_tokens to the env, or leave them out of the policy's"
        )
