"""The text a completion's actions produce, as string rewards see it.

Rule: every real completion token is decoded, special tokens included (a ``<pad>``
the policy chose is text, ``'<pad>'``), except a final stop token that is itself a
special token (the usual ``<eos>``), which ends the text rather than being part of
it. A stop id with ordinary text (a newline, ``'.'``) stays in the text. Padding
after the end is never decoded: it is found through the completion mask, not by
dropping special ids, so a tokenizer whose pad token is its EOS token decodes the
same way.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase


def infer_completion_mask(completion_ids: Tensor, stop_ids: Tensor, pad_token_id: int) -> Tensor:
    """Real tokens of completions known only by their ids: ``[N, T] bool``.

    A row runs up to and including its first stop id; a row without one up to its
    last non-pad id. (Exact for this env's completions, unless a row ends in a pad
    token chosen as an action: pass the real mask when you have it.)

    Args:
        completion_ids: ``[N, T] int64``, right-padded.
        stop_ids: ``[S] int64`` the env's stop ids.
        pad_token_id: The env's pad id.
    """
    is_stop = torch.isin(completion_ids, stop_ids.to(completion_ids.device)).long()
    upto_stop = (is_stop.cumsum(dim=1) - is_stop) == 0
    columns = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    last_real = torch.where(completion_ids != pad_token_id, columns, -1).max(dim=1).values
    upto_last = columns[None, :] <= last_real[:, None]
    return torch.where(is_stop.bool().any(dim=1, keepdim=True), upto_stop, upto_last)


def completion_texts(
    tokenizer: PreTrainedTokenizerBase,
    completion_ids: Tensor,
    completion_mask: Tensor,
    hidden_stop_ids: Tensor,
) -> list[str]:
    """Decode each row's real tokens by the module's rule.

    Args:
        tokenizer: Decodes the ids.
        completion_ids: ``[N, T] int64``.
        completion_mask: ``[N, T] bool``, a prefix of each row (the env's completions
            are right-padded).
        hidden_stop_ids: ``[S] int64`` stop ids left out of the text when they end it
            (the stop ids that are special tokens).

    Returns:
        ``N`` strings.
    """
    if completion_ids.shape[0] == 0:
        return []
    lengths = completion_mask.sum(dim=1)
    last = completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    hidden = (lengths > 0) & torch.isin(last, hidden_stop_ids.to(last.device))
    keep = (lengths - hidden.long()).tolist()
    rows = completion_ids.tolist()
    return tokenizer.batch_decode(
        [row[:k] for row, k in zip(rows, keep, strict=True)], skip_special_tokens=False
    )
