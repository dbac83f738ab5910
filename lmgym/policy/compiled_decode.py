"""A decode step over the KV slots, compiled once with ``torch.compile``.

The eager decode step (``kv_engine``) feeds ``[N, 1]`` tokens whose attention reads
the slot columns in use, ``[0, filled)``, through views whose width changes every
step. The compiled step takes the whole slot buffers instead (``set_step(...,
read_all=True)``) and a boolean ``[N, 1, 1, W]`` mask, and its attention reads the
first ``W`` columns, the mask's width:

- on CPU ``W = filled``, marked as a dynamic size, so one graph with a symbolic
  width serves every step (a step reads the cache columns in use, as ``generate``'s
  growing cache does, not the whole budget: decode attention is bound by reading
  the cache);
- on CUDA ``W`` is the slot capacity, a fixed shape that one CUDA graph replays at
  every step (the step compiles with ``mode="reduce-overhead"``; the slot buffers
  are marked as static addresses).

Row ``i`` writes its new key/value at column ``cols[i]`` in place (``SlotLayer``),
so the step mutates its inputs and allocates no cache memory. A step that also
carries appended text (``kv_engine``'s ``PackedText``: restarted rows' new
episodes, a multi-turn env's actions and observations) has as many inputs as that
text has tokens: it compiles once more, with dynamic shapes.

Attention is ``slot_attention``, registered with transformers' ``AttentionInterface``
as ``"lmgym_slots"`` and switched on only around the compiled call: a plain
``softmax(q k^T * scale) v`` that inductor fuses with the mask (on CPU it beats the
compiled SDPA kernel, which is built for long queries, not one token), and that
reads grouped key/value heads without copying them (``repeat_kv``).

Where ``torch.compile`` is unavailable or fails (no C++ compiler, an op dynamo
cannot trace, an attention function that needs more than a mask), the first
failure is reported once as a warning and the policy decodes eagerly from then on.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, DynamicCache

ATTENTION_NAME = "lmgym_slots"

# Attention arguments that change what attention computes; slot_attention refuses them.
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "sinks")


def slot_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    lmgym_packed: tuple[Tensor, Tensor] | tuple[Tensor, Tensor, RowRuns] | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """Masked scaled dot-product attention over the slot columns (transformers'
    attention-function signature).

    Args:
        module: the attention module (unused; part of the interface).
        query: ``[N, Hq, S, D]``, or ``[N + T, Hq, 1, D]`` with ``lmgym_packed``.
        key, value: ``[N, Hkv, C, D]``; ``Hq`` is a multiple of ``Hkv`` (grouped
            heads: query head ``h`` reads key/value head ``h // (Hq // Hkv)``).
        attention_mask: ``[N, 1, S, W] bool``, True where a column may be read;
            only the first ``W <= C`` columns are read (``None``: all ``C`` are).
        scaling: the score scale (default ``D ** -0.5``).
        dropout: must be 0 (the policy runs in eval mode).
        lmgym_packed: ``(rows [T] int64, allowed [T, W] bool[, RowRuns])``: ``T`` more
            one-token queries after the first ``N`` (appended text, packed
            into the decode step): query ``N + t`` reads columns ``[0, W)`` of cache
            row ``rows[t]`` where ``allowed[t]``.

    Returns:
        ``(out [N (+ T), S, Hq, D], None)``.

    Raises:
        NotImplementedError: a sliding window, logit soft-capping or attention
            sinks, which this function does not apply.
    """
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{ATTENTION_NAME} attention does not apply {name}")
    if dropout:
        raise NotImplementedError(f"{ATTENTION_NAME} attention does not apply dropout")
    if attention_mask is not None:  # the columns in use (CompiledDecode, on CPU), or all
        # Sliced unconditionally: a branch on width < C would split the graph in two.
        width = attention_mask.shape[-1]
        key, value = key[:, :, :width], value[:, :, :width]
    if lmgym_packed is None:
        return _attend(query, key, value, attention_mask, scaling), None
    rows, allowed, *grouped = lmgym_packed
    n, width = key.shape[0], allowed.shape[1]
    out = _attend(query[:n], key, value, attention_mask, scaling)
    key, value = key[:, :, :width], value[:, :, :width]
    if grouped and not torch.compiler.is_compiling():
        packed = _attend_by_row(query[n:], key, value, allowed, grouped[0], scaling)
    else:  # one graph for every step: a [T, Hkv, W, D] gather, each query its own row
        packed = _attend(query[n:], key[rows], value[rows], allowed[:, None, None], scaling)
    return torch.cat([out, packed]), None


@dataclass(frozen=True)
class RowRuns:
    """Packed queries as runs of one cache row, for ``_attend_by_row``: computed once
    a step (``row_runs``), not in each layer's attention.

    Attributes:
        rows: ``[R] int64`` each run's cache row.
        run_of: ``[T] int64`` each query's run.
        within: ``[T] int64`` its place in the run.
        longest: the longest run's length.
    """

    rows: Tensor
    run_of: Tensor
    within: Tensor
    longest: int


def row_runs(rows: Tensor) -> RowRuns:
    """The runs of equal consecutive entries of ``rows`` (``[T] int64``)."""
    runs, run_of, lengths = torch.unique_consecutive(rows, return_inverse=True, return_counts=True)
    within = torch.arange(rows.shape[0], device=rows.device) - (lengths.cumsum(0) - lengths)[run_of]
    return RowRuns(runs, run_of, within, int(lengths.max()))


def _attend_by_row(
    query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, runs: RowRuns, scaling: float | None
) -> Tensor:
    """Packed one-token queries, each reading its row's columns where ``allowed``.

    A run of queries of one row attends as one block, ``[Hq, t, D]`` against that
    row's ``[Hkv, W, D]``, so each row's cache is read once per step. A per-query
    gather would copy it once per query: a restarted row packs its whole new prompt,
    and ``T`` copies of a ``W``-column cache made such a step about 2.3x slower
    (SmolLM2, 16 rows restarting 151-token GuessNumber prompts:
    benchmarks/results/multi_turn_cost.md's notes).

    Args:
        query: ``[T, Hq, 1, D]``.
        key, value: ``[N, Hkv, W, D]`` the cache rows' first ``W`` columns.
        allowed: ``[T, W] bool`` the columns each query reads.
        runs: the queries' runs of one row (``row_runs``).

    Returns:
        ``[T, 1, Hq, D]``, as ``_attend`` gives.
    """
    n_runs, run_of, within = runs.rows.shape[0], runs.run_of, runs.within
    block = query.new_zeros(n_runs, query.shape[1], runs.longest, query.shape[3])
    block[run_of, :, within] = query[:, :, 0]
    mask = allowed.new_zeros(n_runs, 1, runs.longest, allowed.shape[1])
    mask[run_of, 0, within] = allowed  # a block's padding reads nothing and is dropped
    out = _attend(block, key[runs.rows], value[runs.rows], mask, scaling)  # [R, t, Hq, D]
    return out[run_of, within][:, None]


def _attend(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float | None
) -> Tensor:
    """``slot_attention`` without packed queries: ``[N, S, Hq, D]``."""
    n, heads, s, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    # [N, Hkv, group * S, D]: a group's query heads share their key/value head.
    grouped = query.reshape(n, kv_heads, group * s, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (scaling or dim**-0.5)
    if attention_mask is not None:
        allowed = attention_mask.view(n, 1, 1, s, -1).expand(n, 1, group, s, -1)
        allowed = allowed.reshape(n, 1, group * s, -1)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = scores.float().softmax(dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(n, heads, s, dim)
    return out.transpose(1, 2)


AttentionInterface.register(ATTENTION_NAME, slot_attention)


@contextlib.contextmanager
def slot_attention_on(config: object) -> Iterator[None]:
    """Make the model of ``config`` use ``slot_attention`` inside the block."""
    previous = config._attn_implementation  # type: ignore[attr-defined]
    config._attn_implementation = ATTENTION_NAME  # type: ignore[attr-defined]
    try:
        yield
    finally:
        config._attn_implementation = previous  # type: ignore[attr-defined]


def _step(
    trunk: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    cache: DynamicCache,
    cache_kwarg: str,
    packed: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The traced function: the trunk on one token per input row, ``[N (+ T), H]``
    last hidden states.

    A module-level function of its inputs (no ``self``): a deep copy of the policy
    (a frozen reference) shares no state with it through the compiled code.
    """
    kwargs = {cache_kwarg: cache}
    if packed is not None:
        kwargs["lmgym_packed"] = packed
    out = trunk(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        **kwargs,
    )
    return out.last_hidden_state[:, 0]


_compiled: dict[tuple[str, bool], Callable[..., Tensor]] = {}


def _only_differentiating_guards(on: bool) -> contextlib.AbstractContextManager:
    """Inside: dynamo evaluates only the guards that tell its compiled graphs apart."""
    if not on:
        return contextlib.nullcontext()
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)


def compile_step(mode: str | None, packed: bool = False) -> Callable[..., Tensor]:
    """``torch.compile(_step)``, made once per mode and kind (dynamo keeps one graph
    per model and shape under it). Sizes the caller marks dynamic (the read width on
    CPU; a packed step's number of inputs and appended width) become symbolic, the
    rest stay fixed. The CPU's default mode writes the graph's call function in C++
    (``cpp_wrapper``: ~5% of a small model's step is the Python that launches each
    kernel). Tests replace this function to run the step uncompiled."""
    key = (mode or "default", packed)
    if key not in _compiled:
        options = {"cpp_wrapper": True} if mode is None else None
        _compiled[key] = torch.compile(
            _step, mode=mode, dynamic=None, fullgraph=True, options=options
        )
    return _compiled[key]


class CompiledDecode:
    """The compiled decode step of one policy, with its fallback to eager.

    Guards. Before each call dynamo evaluates the graph's guards (several hundred on
    the trunk's modules, config and cache object), ~0.25 ms: about a tenth of a
    small model's step on a CPU. A rollout's steps differ only in tensor values: the
    same trunk, the same cache object and slot buffers, the same row count, grad
    mode and adapters. So the first plain step over a cache runs the guards in full
    and picks (or compiles) the graph; the later plain steps over the same cache,
    trunk, rows and slot buffers evaluate only the guards that tell dynamo's
    compiled graphs apart (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``,
    ~6 us). A packed step (its sizes change) and the plain step after it run them in
    full again. Where a later step needs a new graph after all (a model whose second
    step turns a size dynamic), dynamo refuses to compile under the shortcut, before
    running anything, and the step reruns with every guard.

    Attributes:
        enabled: compile the decode step (the policy's ``compile_decode``); cleared
            after the first failure, which is reported once as a warning.
        skip_guards: the guard shortcut above (on; tests turn it off to compare).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.skip_guards = True
        # (cache, trunk, (rows, slot shape, slot address)) of the last fully guarded step
        self._checked: tuple[weakref.ref, weakref.ref, tuple] | None = None

    def _guards_checked(
        self, trunk: nn.Module, cache: DynamicCache, input_ids: Tensor, packed: bool
    ) -> bool:
        """Whether this step's guards were evaluated in full at an earlier step of the
        same run (see the class docstring); records this step otherwise."""
        if packed:
            self._checked = None
            return False
        slots = cache.layers[0].key_slots
        key = (input_ids.shape, slots.shape, slots.data_ptr())
        seen = self._checked
        if seen is not None and seen[0]() is cache and seen[1]() is trunk and seen[2] == key:
            return True
        self._checked = (weakref.ref(cache), weakref.ref(trunk), key)
        return False

    def __call__(
        self,
        trunk: nn.Module,
        input_ids: Tensor,
        cache_mask: Tensor,
        position_ids: Tensor,
        cache: DynamicCache,
        cache_kwarg: str,
        filled: int,
        packed: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | None:
        """Run the compiled step; ``None`` when compiling failed (decode eagerly).

        Args:
            trunk: the transformers base model (``model.base_model``).
            input_ids: ``[N (+ T), 1] int64``.
            cache_mask: ``[N, C] bool`` over every slot column, the new ones included.
            position_ids: ``[N (+ T), 1] int64``.
            cache: slots planned by ``set_step(..., read_all=True)``.
            cache_kwarg: the trunk's name for the cache argument.
            filled: the columns in use after this step (``cols.max() < filled``):
                the read width on CPU.
            packed: ``T`` packed inputs (``slot_attention``'s ``lmgym_packed``).

        Returns:
            ``[N (+ T), H]`` last hidden states, or ``None``.
        """
        cuda = input_ids.device.type == "cuda"
        try:
            step = compile_step("reduce-overhead" if cuda else None, packed is not None)
            if packed is not None:  # mark what changes from one packed step to the next
                for tensor in (
                    input_ids,
                    position_ids,
                    *packed,
                    cache.layers[0].cols,
                    cache.layers[0].write_rows,
                ):
                    torch._dynamo.maybe_mark_dynamic(tensor, 0)
                torch._dynamo.maybe_mark_dynamic(packed[1], 1)
            mask = cache_mask[:, None, None, :]
            if not cuda:  # contiguous: one stride pattern for every width (one graph)
                mask = mask[..., :filled].contiguous()
                torch._dynamo.maybe_mark_dynamic(mask, 3)
            if cuda:
                for layer in cache.layers:
                    torch._dynamo.mark_static_address(layer.key_slots)
                    torch._dynamo.mark_static_address(layer.value_slots)
                torch.compiler.cudagraph_mark_step_begin()
            shortcut = self.skip_guards and self._guards_checked(
                trunk, cache, input_ids, packed is not None
            )
            args = (trunk, input_ids, mask, position_ids, cache, cache_kwarg, packed)
            with slot_attention_on(trunk.config):
                try:
                    with _only_differentiating_guards(shortcut):
                        hidden = step(*args)
                except RuntimeError as error:
                    # No graph fits without a recompile (one that dynamo refuses under
                    # the shortcut, before running anything): run with every guard.
                    if not shortcut or "skip_guard_eval_unsafe" not in str(error):
                        raise
                    hidden = step(*args)
            # A CUDA graph's output is overwritten by its next replay.
            return hidden.clone() if cuda else hidden
        except Exception as error:  # noqa: BLE001  # any compile failure: decode eagerly
            self.enabled = False
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            warnings.warn(
                f"compile_decode: torch.compile of the decode step failed "
                f"({type(error).__name__}: {first_line}); decoding eagerly from now on",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
