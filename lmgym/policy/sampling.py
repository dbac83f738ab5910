"""Sampling one token per row from next-token logits (special-token mask, temperature,
top-k, top-p, or greedy decoding at temperature 0).

``SamplingSettings`` is the one record of how a policy samples: the rollout engine
draws with it and the teacher-forced pass takes its log-prob temperature from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch
from torch import Tensor

_NEG_INF = float("-inf")


def check_sampling_settings(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Reject settings the sampler cannot use, naming the field.

    Raises:
        TypeError: ``temperature`` or ``top_p`` is not a real number (a bool included),
            ``top_k`` not an int.
        ValueError: ``temperature`` negative or not finite, ``top_p`` outside ``(0, 1]``
            or NaN, ``top_k`` negative.
    """
    for field, value in (("temperature", temperature), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            raise TypeError(f"{field}={value!r}: expected a number")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(
            f"temperature={temperature}: must be a finite number >= 0 (0 means greedy decoding)"
        )
    if top_p is not None and not 0.0 < top_p <= 1.0:  # NaN fails the comparison too
        raise ValueError(f"top_p={top_p}: must be in (0, 1]")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise TypeError(f"top_k={top_k!r}: expected an int")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k={top_k}: must be >= 0 (0 or None disables it)")


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is drawn; checked when made (``check_sampling_settings``).

    Frozen: a caller that samples differently for a while (ReMax's greedy baseline)
    swaps in another record, so nothing sees half-changed settings.

    Attributes:
        temperature: > 0 samples at that temperature; 0 is greedy decoding (argmax).
        top_k: keep the ``k`` most likely ids (``None`` or 0: all).
        top_p: nucleus mass (``None`` or 1.0: no filter).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_sampling_settings(self.temperature, self.top_k, self.top_p)

    @property
    def logprob_temperature(self) -> float:
        """The temperature log-probs are taken at (``logprob_temperature``)."""
        return logprob_temperature(self.temperature)


def logprob_temperature(temperature: float) -> float:
    """The temperature log-probs are taken at: ``temperature``, or 1 for greedy decoding.

    Greedy decoding (``temperature=0``) samples from no distribution; its sampler
    log-prob is that of the chosen id under the untempered model, so the
    teacher-forced pass uses temperature 1 too and the two stay equal.
    """
    return temperature if temperature > 0 else 1.0


def filter_logits(
    logits: Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    refused: Tensor | None = None,
) -> Tensor:
    """Mask refused ids, temperature-scale and filter logits; removed ids get ``-inf``.

    Args:
        logits: ``[N, V] float32``.
        temperature: > 0.
        top_k: keep the ``k`` largest logits per row (``None`` or 0: all).
        top_p: keep the smallest set of ids whose probability reaches ``top_p``
            (``None`` or 1.0: all); the most likely id is always kept.
        refused: ``[V] bool`` ids never sampled (masked before everything else).

    Returns:
        ``[N, V] float32`` new tensor.
    """
    if refused is not None:
        logits = logits.masked_fill(refused.to(logits.device), float("-inf"))
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop an id when the mass strictly before it already reaches top_p.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _greedy(logits: Tensor, refused: Tensor | None) -> tuple[Tensor, Tensor]:
    """The masked argmax of ``[N, V] float32`` logits and its untempered log-prob."""
    if refused is not None:
        logits = logits.masked_fill(refused.to(logits.device), _NEG_INF)
    best, actions = logits.max(dim=-1)
    return actions, best - logits.logsumexp(dim=-1)


def sample_tokens(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    refused: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one id per row, independently (or the most likely one, when greedy).

    Args:
        logits: ``[N, V]`` raw next-token logits.
        temperature: > 0 samples; 0 is greedy decoding (argmax).
        top_k, top_p: see ``filter_logits`` (no effect when greedy: the argmax is
            always kept).
        generator: RNG of the draw.
        refused: ``[V] bool`` ids never chosen (the policy's special-token mask).

    Returns:
        ``(actions [N] int64, logprobs [N] float32)``. When sampling, ``logprobs`` is
        the log-prob of the drawn id under the distribution actually sampled from
        (masked, tempered and filtered): the sampler log-prob ``lp_s`` of
        docs/algorithms.md#notation. When greedy, it is the chosen id's log-prob under the masked,
        untempered and unfiltered distribution (``logprob_temperature``).

    Raises:
        RuntimeError: non-finite logits ("probability tensor contains either inf, nan
            or element < 0", ``torch.multinomial``'s words, from ``draw_categorical``;
            ``Agent`` names the cause).
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    actions, logprobs, _ = sample_step(logits, settings, generator, refused)
    return actions, logprobs


def sample_step(
    logits: Tensor,
    settings: SamplingSettings = SamplingSettings(),  # noqa: B008  # frozen: safe to share
    generator: torch.Generator | None = None,
    refused: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``sample_tokens`` and ``special_mass`` of one step, sharing their work (the
    masked, tempered logits: one ``[N, V]`` mask and division fewer).

    Args:
        logits: ``[N, V]`` raw next-token logits.
        settings: temperature, top-k and top-p.
        generator, refused: as ``sample_tokens``.
        uniforms: ``[N]`` the uniform each row's draw inverts
            (``draw_categorical``), instead of drawing them from ``generator``.

    Returns:
        ``(actions [N] int64, logprobs [N] float32, special_mass [N] float32 | None)``:
        ``sample_tokens``'s pair and ``special_mass(logits, refused, temperature)``,
        bit for bit (``None`` when ``refused`` is ``None``).
    """
    temperature, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
    logits = logits.float()
    if temperature == 0:
        actions, logprobs = _greedy(logits, refused)
        mass = special_mass(logits, refused, 0.0) if refused is not None else None
        return actions, logprobs, mass
    # filter_logits' first two steps, kept for the mass: masking before or after the
    # division gives the same values (-inf / T is -inf).
    scaled = logits / temperature if temperature != 1.0 else logits
    kept = scaled if refused is None else scaled.masked_fill(refused.to(scaled.device), _NEG_INF)
    probs = filter_logits(kept, 1.0, top_k, top_p).softmax(dim=-1)
    actions = draw_categorical(probs, generator, uniforms)
    # log of the drawn id's probability only: one [N] log instead of a [N, V] log_softmax.
    # A drawn id has probability well above float32's underflow, so this matches
    # log_softmax to rounding.
    logprobs = probs.gather(1, actions).squeeze(1).log()
    mass = None
    if refused is not None:  # special_mass's formula on the same tensors
        mass = -torch.expm1(kept.logsumexp(dim=-1) - scaled.logsumexp(dim=-1))
    return actions.squeeze(1), logprobs, mass


def draw_categorical(
    probs: Tensor, generator: torch.Generator | None = None, uniforms: Tensor | None = None
) -> Tensor:
    """One id per row of ``probs [N, V]`` (non-negative, rows summing to about 1), drawn
    by inversion: the first id whose cumulative probability exceeds ``u * total``,
    ``u ~ U[0, 1)``, one uniform per row: from ``generator``, or ``uniforms`` (``[N]``
    values in ``[0, 1)``, e.g. ``counter_rng.counter_uniforms``) when given.

    The same distribution as ``torch.multinomial(probs, 1)``, which on a CPU draws
    ``N x V`` exponentials for it: at a 49k vocabulary that was 13% of a real model's
    decode step (benchmarks/results/real_model_rollout.md). The cumulative sum is in
    float64 (float32 where the device has none), so an id of probability 1e-12 is
    still drawn at its rate, and an id of probability 0 (masked or filtered) never:
    its cumulative value equals its predecessor's and the search takes the first
    strictly greater one.

    Returns:
        ``[N, 1] int64``.

    Raises:
        RuntimeError: a row holds NaN or inf or no mass, with ``torch.multinomial``'s
            words (``rollout_source.collect_batch`` turns them into ``NonFiniteUpdateError``).
    """
    wide = torch.float32 if probs.device.type == "mps" else torch.float64
    cdf = probs.to(wide).cumsum(dim=-1)
    total = cdf[:, -1:]  # NaN anywhere in a row reaches its total
    if not bool((torch.isfinite(total) & (total > 0)).all()):
        raise RuntimeError(
            "probability tensor contains either inf, nan or element < 0 (or a row with no mass)"
        )
    if uniforms is None:
        u = torch.rand(total.shape, generator=generator, dtype=wide, device=probs.device)
    else:
        u = uniforms.to(device=probs.device, dtype=wide)[:, None]
    # u < 1 gives u * total < total in floating point, so the index is at most V - 1.
    return torch.searchsorted(cdf, u * total, right=True)


def special_mass(logits: Tensor, refused: Tensor, temperature: float) -> Tensor:
    """Probability the refused ids had before they were masked: ``[N] float32``.

    Measured under the policy's tempered distribution before top-k/top-p (untempered
    when greedy), ``1 - Z_kept / Z_all`` computed in log space.

    Args:
        logits: ``[N, V]`` raw next-token logits.
        refused: ``[V] bool``.
        temperature: The sampling temperature (0: greedy).
    """
    scaled = logits.float()
    if logprob_temperature(temperature) != 1.0:
        scaled = scaled / logprob_temperature(temperature)
    kept = scaled.masked_fill(refused.to(scaled.device), _NEG_INF).logsumexp(dim=-1)
    return -torch.expm1(kept - scaled.logsumexp(dim=-1))
