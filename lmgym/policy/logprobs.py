"""Per-token log-probabilities and entropy from hidden states, chunked over positions.

A float32 ``[B, L, V]`` log-softmax is never held at once: the LM head is applied
to a chunk of positions, reduced to ``[B, c]`` log-probs and entropies, and (when
gradients are needed) recomputed chunk by chunk in the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Elements of one chunk's float32 logits (~64 MiB).
DEFAULT_CHUNK_ELEMENTS = 1 << 24


def _chunk_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float,
    with_entropy: bool,
    refused: Tensor | None,
) -> tuple[Tensor, Tensor]:
    logits = F.linear(hidden, weight, bias).float() / temperature  # [B, c, V]
    if refused is not None:
        logits = logits.masked_fill(refused, float("-inf"))
    log_norm = logits.logsumexp(dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if refused is not None:
        # Padding targets are the pad id, which is refused: 0, not -inf, so that
        # multiplying by the completion mask zeroes them instead of giving NaN.
        logprobs = logprobs.masked_fill(refused[targets], 0.0)
    if not with_entropy:
        return logprobs, torch.zeros_like(logprobs)
    # H = log Z - sum_v p_v * logit_v; a refused id has p_v = 0 and adds nothing
    # (its -inf logit is replaced, or 0 * -inf would give NaN).
    finite = logits if refused is None else logits.masked_fill(refused, 0.0)
    entropy = log_norm - (logits.softmax(dim=-1) * finite).sum(dim=-1)
    return logprobs, entropy


def token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int | None = None,
    refused: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target id and the entropy of each predictive distribution.

    Args:
        hidden: ``[B, L, H]`` hidden states; position ``t`` predicts ``targets[:, t]``.
        weight: ``[V, H]`` LM-head weight (only the tokenizer's ``V`` rows).
        bias: ``[V]`` or ``None``.
        targets: ``[B, L] int64``.
        temperature: logits are divided by it (as when sampling).
        with_entropy: compute entropy (else zeros).
        chunk_size: positions per chunk; default keeps a chunk's logits near 64 MiB.
        refused: ``[V] bool`` ids the sampler never draws (the policy's special-token
            mask): the distribution is renormalised over the others, as when
            sampling. A target at a refused id (the padding after a completion:
            the pad id is refused) gets log-prob 0 rather than ``-inf``, so that
            multiplying by the mask zeroes it.

    Returns:
        ``(logprobs [B, L] float32, entropy [B, L] float32)``.
    """
    b, length, _ = hidden.shape
    if refused is not None:
        refused = refused.to(hidden.device)
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // max(1, b * weight.shape[0]))
    # Recomputing in backward only pays when there are several chunks: one chunk's
    # saved activations are within the same bound as the recomputation's.
    recompute = (
        torch.is_grad_enabled()
        and (hidden.requires_grad or weight.requires_grad)
        and length > chunk_size
    )
    logprobs, entropies = [], []
    for start in range(0, length, chunk_size):
        args = (
            hidden[:, start : start + chunk_size],
            weight,
            bias,
            targets[:, start : start + chunk_size],
            temperature,
            with_entropy,
            refused,
        )
        if recompute:
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1)
