"""The rollout engine: ``act`` with a KV cache over the env's rows.

``RolloutEngine.act`` (rollout time, no grad) reads the env's observation, feeds the
trunk only what its KV cache has not seen (the whole prompt once, then one token per
step), and samples the next token of every row at once. The cache is the policy's
recurrent state (``PolicyState``), like an RNN's hidden state; the env owns the
text.

The engine *has* its collaborators: a ``Trunk`` (inputs to final hidden states over
a KV cache; ``trunk.ModelTrunk`` for a transformers model, a stub in tests), a
``Head`` (hidden states to next-token logits, and the ids never sampled) and a
frozen ``SamplingSettings``. ``CausalLMPolicy`` builds one and delegates ``act``.

- ``_prefill``: a fresh cache from every row's text; a group's shared prompt runs
  once and its cache is copied to the group (``groups.shared_rows``, from the
  env's group ids); a plain cache then moves into in-place slots (``kv_slots``).
- ``_decode``: the common step, one new token per advanced row; with
  ``compile_decode`` a compiled step over the slot buffers (``compiled_decode``),
  rows writing their own columns from the prefill on.
- ``_append``: rows with new text, appended to their slots in the others' decode
  step. Rows that started a new episode (continuous batching, ``_restart``) have
  their slots cleared and their new text written from column 0. Rows of a
  multi-turn env that ended a turn moved by more than one column: the env appended
  their action and the environment's observation; both go after the row's own
  columns, with the positions that follow, and the history is never fed again.

Appending tokens to a row's KV slots in the next decode step is one named path:
a ``PackedText`` passed to ``_decode``, each token one more one-token input that
writes its row's given slot column and attends causally to its row (its kept
columns and the new ones up to its own). There is no separate prefill pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from lmgym.policy.compiled_decode import row_runs
from lmgym.policy.groups import shared_pass, shared_rows
from lmgym.policy.kv_slots import (
    is_slot_cache,
    reserve,
    set_step,
    slots_capacity,
    slots_filled,
    to_slots,
)
from lmgym.policy.sampling import SamplingSettings, sample_step
from lmgym.profiling import ACT, DECODE, PREFILL, RESTART, SAMPLE, labelled, phase

#: The trunk's pass: ``(input_ids [N, S] int64, attention_mask [N, C] | None,
#: position_ids [N, S] int64, cache, packed (rows [T], allowed [T, W]) | None)``
#: -> ``[N (+ T), S, H]`` (``ModelTrunk.hidden_states``).
TrunkPass = Callable[
    [Tensor, Tensor | None, Tensor, DynamicCache | None, tuple[Tensor, Tensor] | None], Tensor
]
#: A compiled one-token step: ``(input_ids, cache_mask [N, C] bool, position_ids, cache,
#: filled, packed)`` -> ``[N (+ T), H]``, or ``None`` to run it eagerly
#: (``ModelTrunk.compiled_hidden_states``).
CompiledPass = Callable[
    [Tensor, Tensor, Tensor, DynamicCache, int, tuple[Tensor, Tensor] | None], Tensor | None
]


class Trunk(Protocol):
    """What the engine runs: inputs to final hidden states over a KV cache
    (``trunk.ModelTrunk``; a stub in tests).

    Attributes:
        mask_always: give the attention mask even where every column is real.
        compiles: one-token steps over slots go through ``compiled_hidden_states``.
        device: where the trunk's weights are.
        hidden_states, compiled_hidden_states: its passes.
    """

    mask_always: bool
    compiles: bool
    device: torch.device
    hidden_states: TrunkPass
    compiled_hidden_states: CompiledPass

    def new_cache(self) -> DynamicCache:
        """An empty cache the trunk's layers fill."""
        ...


class Head(Protocol):
    """What turns the trunk's last hidden states into a draw."""

    @property
    def refused_mask(self) -> Tensor | None:
        """``[V] bool`` ids never sampled, or ``None``: every id may be."""
        ...

    def next_token_logits(self, hidden: Tensor) -> Tensor:
        """``[N, H]`` -> ``[N, V] float32``."""
        ...


@dataclass
class PolicyState:
    """The policy's recurrent state across ``act`` calls: a KV cache over ``N`` rows.

    Cache column ``c`` of row ``i`` is real iff ``cache_mask[i, c]``; cache columns
    are not observation columns (a restarted row's text goes to its first cache
    columns), so positions are tracked explicitly.

    Attributes:
        cache: the transformers KV cache: in-place slots (``kv_slots``, ``C`` =
            their capacity) for a plain cache, else as the model made it (``C``
            columns).
        cache_mask: ``[N, C] bool``; slot columns not yet written are False.
        positions: ``[N] int64`` position id of the next token fed for each row.
        last_col: ``[N] int64`` last observation column the cache has seen.
        padded: whether any column of ``cache_mask`` is masked out. While it is
            ``False`` the model gets no attention mask at all, which spares it
            building (and attention applying) an all-ones mask every step.
        cols: ``[N] int64`` slot column of each row's next token once rows have
            restarted at different times; ``None`` while all rows share one column.
        special_mass: ``[N] float32`` probability the special-token mask removed at
            the step that returned this state (``sampling.special_mass``); ``None``
            when the policy masks nothing.
    """

    cache: DynamicCache
    cache_mask: Tensor
    positions: Tensor
    last_col: Tensor
    padded: bool = True
    cols: Tensor | None = None
    special_mass: Tensor | None = None


@dataclass
class PackedText:
    """Tokens appended to given rows' KV slots in the next decode step, as ``T``
    extra one-token inputs after the ``N`` rows' own.

    Attributes:
        ids: ``[T] int64`` the tokens, each row's in order.
        positions: ``[T] int64`` their position ids.
        rows: ``[T] int64`` the cache row each one belongs to.
        cols: ``[T] int64`` the slot column each one writes.
        allowed: ``[T, W] bool`` the columns of its row each one attends to: the real
            ones up to its own.
    """

    ids: Tensor
    positions: Tensor
    rows: Tensor
    cols: Tensor
    allowed: Tensor


def _plain_cache(cache: DynamicCache) -> bool:
    """Whether every layer is a plain ``DynamicLayer`` (``[N, heads, C, dim]``
    key/value tensors that may move into slots; sliding-window or quantized layers
    keep extra state)."""
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def _appended_text(
    ids: Tensor,
    mask: Tensor,
    rows: Tensor,
    first_col: Tensor,
    last_col: Tensor,
    first_slot: Tensor,
    first_position: Tensor,
    kept: Tensor,
    first_input: int,
) -> tuple[PackedText, Tensor, Tensor, Tensor]:
    """Rows' new text, each row's observation columns ``[first_col, last_col]``
    appended at its slot columns from ``first_slot``.

    A restarted row's new text starts at observation column 0, slot 0, position 0; a
    row that ended a turn in a multi-turn env appends its action and the
    environment's observation after its own columns.

    Args:
        ids, mask: ``[N, S]`` the observation.
        rows: ``[k] int64`` the rows with new text.
        first_col, last_col: ``[k] int64`` the observation columns of each row's new
            text (padding inside is skipped).
        first_slot: ``[k] int64`` the slot column the first one writes.
        first_position: ``[k] int64`` its position id.
        kept: ``[k, W] bool`` the slot columns each row keeps (its cache so far; none
            for a restarted row), which its new tokens attend to; ``W`` covers every
            new slot column.
        first_input: the index the first packed token gets among the step's inputs
            (after the ``N`` rows' own).

    Returns:
        ``(packed, newest [k] int64, slots [k, W] bool, count [k] int64)``:
        ``newest[j]`` is the input index of row ``j``'s last new token (its next-token
        hidden state); ``slots`` the slot columns its new tokens write; ``count`` how
        many it has.
    """
    span = last_col - first_col + 1
    offsets = torch.arange(int(span.max()), device=ids.device)
    window = (first_col[:, None] + offsets[None, :]).clamp(max=ids.shape[1] - 1)
    real = (offsets[None, :] < span[:, None]) & mask[rows[:, None], window]
    local, offset = real.nonzero(as_tuple=True)  # row-major: each row's text in order
    slot = first_slot[local] + offset
    width = kept.shape[1]
    slots = torch.zeros_like(kept)
    slots[local, slot] = True
    count = real.sum(1)
    arange = torch.arange(width, device=ids.device)
    packed = PackedText(
        ids=ids[rows[local], window[local, offset]],
        positions=first_position[local] + real.long().cumsum(1)[local, offset] - 1,
        rows=rows[local],
        cols=slot,
        allowed=kept[local] | (slots[local] & (arange[None, :] <= slot[:, None])),
    )
    newest = count.cumsum(0) - 1 + first_input
    return packed, newest, slots, count


def _moved(
    step: Tensor, low: int, high: int, episode_starts: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """``(restart, grown)``, ``[N] bool`` each or ``None`` when no row is: which rows
    started a new episode (flagged, or moved back) and which gained more than one
    column (a multi-turn env appended an action and an observation), from each row's
    ``step`` (``[N] int64`` columns since the last call; ``low``/``high`` its range)."""
    restart = step < 0 if low < 0 else None
    if episode_starts is not None and bool(episode_starts.any()):
        flagged = episode_starts.to(step.device).bool()
        restart = flagged if restart is None else restart | flagged
    grown = step > 1 if high > 1 else None
    return restart, grown


def _widen(cache_mask: Tensor, columns: int) -> Tensor:
    """``[N, C]`` -> ``[N, columns]``, new columns False."""
    extra = columns - cache_mask.shape[1]
    if extra <= 0:
        return cache_mask
    return torch.cat([cache_mask, cache_mask.new_zeros(cache_mask.shape[0], extra)], dim=1)


class RolloutEngine:
    """``act`` over a KV cache, from a trunk, a head and a sampling record.

    Args:
        trunk: runs inputs to final hidden states over a KV cache.
        head: next-token logits and the ids never sampled.
        sampling: temperature, top-k, top-p. The attribute may be replaced by
            another record between calls (``dataclasses.replace``).
    """

    def __init__(self, trunk: Trunk, head: Head, sampling: SamplingSettings) -> None:
        self.trunk = trunk
        self.head = head
        self.sampling = sampling
        self._constants: dict[tuple[str, int, torch.device], Tensor] = {}

    def _trunk_mask(self, mask: Tensor, padded: bool) -> Tensor | None:
        """The attention mask to give the trunk: ``mask`` with padding, else ``None``
        (plain causal attention, the fast path), unless the trunk always wants one
        (``ModelTrunk.mask_always``)."""
        return mask if padded or self.trunk.mask_always else None

    def _constant(self, kind: str, n: int, device: torch.device) -> Tensor:
        """A cached constant that ``act`` needs every step: ``"arange"``, ``arange(n)``;
        ``"true"``, an ``[n, 1]`` all-True column (the cache-mask column of a full
        step)."""
        cached = self._constants
        key = (kind, n, device)
        if key not in cached:
            if len(cached) >= 8:  # a caller with ever-changing widths
                cached.clear()
            if kind == "arange":
                cached[key] = torch.arange(n, device=device)
            else:
                cached[key] = torch.ones(n, 1, dtype=torch.bool, device=device)
        return cached[key]

    # ------------------------------------------------------------------ act
    @labelled(PREFILL)
    def _prefill(
        self, ids: Tensor, mask: Tensor, last_col: Tensor, group_ids: Tensor | None
    ) -> tuple[Tensor, PolicyState]:
        """Feed every row's text up to its last real column into a fresh cache; the
        rows of one group (``group_ids``, checked to hold one text) run once.

        Each row's real tokens are first moved, in order, to the right end of the
        block, so every row's text is contiguous and ends at the last cache column
        (the env's rows have right padding after shorter completions). Attention with
        a sliding window counts cache columns, not tokens: a gap inside a row would
        shrink its window. A plain cache then moves into slots as wide as the
        observation: an env's rows never hold more columns, so the decode steps
        write in place.
        """
        capacity = ids.shape[1]
        width = int(last_col.max()) + 1
        ids, mask = ids[:, :width], mask[:, :width]
        if not bool((mask[:, 1:] >= mask[:, :-1]).all() & mask[:, -1].all()):
            # Padding first, then the real tokens in their order (a stable sort).
            order = torch.sort(mask.to(torch.uint8), dim=1, stable=True).indices
            ids, mask = ids.gather(1, order), mask.gather(1, order)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        cache = self.trunk.new_cache()
        padded = not bool(mask.all())
        groups = shared_rows(group_ids, ids, mask)
        attention_mask = self._trunk_mask(mask, padded)
        if groups is None:
            hidden = self.trunk.hidden_states(ids, attention_mask, positions, cache)
            source = self._constant("arange", ids.shape[0], ids.device)
        else:
            hidden = shared_pass(
                self.trunk.hidden_states, ids, attention_mask, positions, cache, groups
            )
            source = groups[1]
        cache_mask, cols = mask, None
        if _plain_cache(cache):
            capacity = max(capacity, width + 1)
            if self.trunk.compiles:
                # A spare column: the compiled step's read width stays below the
                # capacity (a width equal to it is a second graph: another compile).
                capacity += 1
            to_slots(cache, capacity)
            cache_mask = _widen(mask, capacity)
            if self.trunk.compiles:  # its one graph writes per-row columns
                cols, padded = torch.full_like(last_col, width), True
        state = PolicyState(cache, cache_mask, mask.sum(1), last_col, padded, cols)
        return hidden[source, -1], state

    @labelled(DECODE)
    def _decode(
        self,
        ids: Tensor,
        last_col: Tensor,
        state: PolicyState,
        all_advanced: bool = False,
        filled: int | None = None,
        packed: PackedText | None = None,
    ) -> tuple[Tensor, PolicyState]:
        """The common step: feed each advanced row's one new token.

        A row that did not advance (finished) feeds its last token again with that
        cache column masked out, so it sees nothing new. ``all_advanced``: the caller
        already knows every row advanced by one column. ``filled``: with per-row
        columns, the exact width in use after this step (default: an upper bound).
        ``packed``: tokens appended to their rows' slots in the same forward, after
        the ``N`` rows' own (per-row columns only): a restarted row's new text.

        Returns:
            ``(hidden [N (+ T), H], new_state)``: the ``N`` rows' last hidden states,
            then the packed tokens'.
        """
        tokens = ids.gather(1, last_col[:, None])
        if all_advanced:
            advanced = self._constant("true", ids.shape[0], ids.device)
            padded = state.padded
        else:
            advanced = (last_col > state.last_col)[:, None]
            padded = state.padded or not bool(advanced.all())
        cache, cols = state.cache, state.cols
        if not is_slot_cache(cache):  # a cache lmgym does not edit grows by a column
            cache_mask = torch.cat([state.cache_mask, advanced], dim=1)
            attention_mask = cache_mask
        elif cols is None:  # every row's new column is the next free slot
            col = slots_filled(cache)
            cache_mask = _widen(state.cache_mask, reserve(cache, col + 1)).clone()
            cache_mask[:, col] = advanced[:, 0]
            attention_mask = cache_mask[:, : col + 1]
        else:  # row i's new column is cols[i]
            if filled is None:
                # Every row moves at most one column a step, so this bounds
                # cols.max() + 1 without reading it; it is re-read when it hits the
                # capacity (a row restarted or stopped meanwhile).
                filled = slots_filled(cache) + 1
                if filled > slots_capacity(cache):
                    filled = int(cols.max()) + 1
            cache_mask = _widen(state.cache_mask, reserve(cache, filled)).clone()
            cache_mask[self._constant("arange", cols.shape[0], cols.device), cols] = advanced[:, 0]
            attention_mask = cache_mask[:, :filled]
            padded = True
        advanced = advanced[:, 0]
        fed = state.positions
        if padded:
            # A row that did not advance feeds a masked-out dummy, whose position only
            # has to exist: its next one is past the model's last when the row used its
            # whole budget (a multi-turn row can, while others go on).
            fed = torch.where(advanced, fed, (fed - 1).clamp(min=0))
        positions_in, write_cols, write_rows, attend = fed[:, None], cols, None, None
        if packed is not None:
            tokens = torch.cat([tokens, packed.ids[:, None]])
            positions_in = torch.cat([positions_in, packed.positions[:, None]])
            write_cols = torch.cat([cols, packed.cols])
            write_rows = torch.cat(
                [self._constant("arange", ids.shape[0], ids.device), packed.rows]
            )
            attend = (packed.rows, packed.allowed)
        hidden = None
        if cols is not None and self.trunk.compiles:
            set_step(cache, write_cols, filled, read_all=True, rows=write_rows)
            hidden = self.trunk.compiled_hidden_states(
                tokens, cache_mask, positions_in, cache, filled, attend
            )
        if hidden is None:  # eager (or the compiled step just failed)
            if cols is not None:
                set_step(cache, write_cols, filled, rows=write_rows)
            if packed is not None:
                attention_mask = attention_mask[:, None, None, :]
            if packed is not None:  # grouped once here, read by every layer's attention
                attend = (packed.rows, packed.allowed, row_runs(packed.rows))
            hidden = self.trunk.hidden_states(
                tokens, self._trunk_mask(attention_mask, padded), positions_in, cache, attend
            )[:, 0]
        if padded:
            positions = state.positions + advanced
            last_col = torch.maximum(last_col, state.last_col)
            cols = None if cols is None else cols + advanced
        else:
            positions = state.positions + 1
        new_state = PolicyState(cache, cache_mask, positions, last_col, padded, cols)
        return hidden, new_state

    @labelled(RESTART)
    def _append(
        self,
        ids: Tensor,
        mask: Tensor,
        last_col: Tensor,
        restart: Tensor,
        grown: Tensor,
        state: PolicyState,
    ) -> tuple[Tensor, PolicyState]:
        """Append rows' new text to their KV slots while the others take a decode step.

        ``restart`` (``[N] bool``) rows started a new episode: their old columns are
        dead, and their new text goes to their first slot columns, where the env shows
        it. ``grown`` (``[N] bool``) rows ended a turn of a multi-turn env: their
        action and the environment's observation go after their own columns, with the
        positions that follow them; their history is never fed again. From then on
        each row writes its own next column (``PolicyState.cols``). The new text is
        appended in the decode step (``PackedText``): its ``T`` real tokens are ``T``
        more one-token inputs after the ``N`` rows', each writing its own column and
        attending causally to its row, so the linear layers run once over ``N + T``
        tokens and there is no separate prefill. Nothing is copied or compacted, and
        attention reads about as many columns as the longest in-flight row holds.
        """
        cache = state.cache
        cols = state.cols
        if cols is None:  # the rows no longer share a write column
            cols = torch.full_like(state.positions, slots_filled(cache))
        rows = (restart | grown).nonzero().squeeze(1)
        again = restart[rows]
        zero = torch.zeros_like(rows)
        first_col = torch.where(again, zero, state.last_col[rows] + 1)
        first_slot = torch.where(again, zero, cols[rows])
        first_position = torch.where(again, zero, state.positions[rows])
        next_slot = first_slot + last_col[rows] - first_col + 1
        width = int(next_slot.max())
        cache_mask = _widen(state.cache_mask, reserve(cache, width)) & ~restart[:, None]
        kept = cache_mask[rows, :width]
        text = (rows, first_col, last_col[rows], first_slot, first_position, kept)
        packed, newest, slots, count = _appended_text(ids, mask, *text, first_input=ids.shape[0])
        cache_mask[rows, :width] = kept | slots
        cols = cols.index_put((rows,), next_slot)
        state = PolicyState(
            cache,
            cache_mask,
            state.positions.index_put((rows,), first_position + count),
            state.last_col.index_put((rows,), last_col[rows]),
            True,
            cols,
        )
        # These rows now have last_col == state.last_col: _decode feeds them nothing.
        hidden, state = self._decode(
            ids, last_col, state, filled=int(cols.max()) + 1, packed=packed
        )
        return hidden[: ids.shape[0]].index_put((rows,), hidden[newest]), state

    def _restart(
        self, ids: Tensor, mask: Tensor, last_col: Tensor, restart: Tensor, state: PolicyState
    ) -> tuple[Tensor, PolicyState]:
        """``_append`` of the ``restart`` rows' new episodes alone (no row grew)."""
        return self._append(ids, mask, last_col, restart, torch.zeros_like(restart), state)

    @labelled(ACT)
    def act(
        self,
        obs: dict[str, Tensor],
        state: PolicyState | None = None,
        *,
        episode_starts: Tensor | None = None,
        generator: torch.Generator | None = None,
        group_ids: Tensor | None = None,
        idle: Tensor | None = None,
        uniforms: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, PolicyState]:
        """Sample the next token of every row.

        Args:
            obs: the env's observation, ``input_ids [N, S] int64`` and
                ``attention_mask [N, S] bool``; each row's last real column is the
                newest token.
            state: the state returned by the previous call (``None`` at a batch start).
            episode_starts: ``[N] bool`` rows whose observation is the first of a new
                episode (next-step autoreset: the rows reset by the last ``step``).
                Those rows are re-fed from their prompt; the others keep their cache.
                Rows that moved back are detected without the flag. A row that moved
                forward by more than one column kept its text and gained new tokens
                (a multi-turn env's action and observation): they are appended to
                its cache.
            generator: RNG for sampling.
            group_ids: ``[N] int64`` each row's group, the env's ``info["group_id"]``:
                when ``state`` is ``None`` the rows of one group share one prefill. They
                must then show the same text, as a group does at its start (checked:
                a ``ValueError`` otherwise); pass ``None`` when rebuilding a cache
                mid-episode (``state=None`` on rows with completions). ``None``: no
                sharing. (Restarted rows' text is packed into the decode step, each
                row its own; the ids are not needed then.)
            idle: ``[N] bool`` rows whose action the env will ignore (finished, or
                about to be refilled). Unused here: one batched step decodes every
                row; an engine that generates per request (``vllm_engine``) skips them.
            uniforms: ``[N] float64`` in ``[0, 1)``, the uniform each row's draw
                inverts (``sampling.draw_categorical``) instead of ``generator``'s:
                ``ContinuousCollector`` passes counter-based ones when rows are parked
                (``lmgym.policy.counter_rng``). ``None``: drawn from ``generator``.

        Returns:
            ``(actions [N] int64, sampler_logprobs [N] float32, new_state)``.
            The state's tensors are inference-mode tensors: pass them back to
            ``act``, do not edit them.
        """
        # inference_mode, not no_grad: no version counters or view tracking on the
        # ~100 small ops of a step, a few percent of a tiny model's rollout.
        with torch.inference_mode():
            actions, logprobs, state = self._act(
                obs, state, episode_starts, generator, group_ids, uniforms
            )
        # Plain tensors for the caller, who may use them in autograd or edit them.
        return actions.clone(), logprobs.clone(), state

    def _act(
        self,
        obs: dict[str, Tensor],
        state: PolicyState | None,
        episode_starts: Tensor | None,
        generator: torch.Generator | None,
        group_ids: Tensor | None,
        uniforms: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, PolicyState]:
        device = self.trunk.device  # one parameter scan per call, not two
        ids = obs["input_ids"].to(device)
        mask = obs["attention_mask"].to(device).bool()
        groups = None if group_ids is None else group_ids.to(device)
        last_col = (mask * self._constant("arange", ids.shape[1], ids.device)).argmax(dim=1)
        if state is None:
            hidden, state = self._prefill(ids, mask, last_col, groups)
        else:
            step = last_col - state.last_col
            low, high = (int(x) for x in torch.aminmax(step))  # one pass, the usual case
            restart, grown = _moved(step, low, high, episode_starts)
            if restart is None and grown is None:
                hidden, state = self._decode(ids, last_col, state, all_advanced=low == 1)
            elif is_slot_cache(state.cache) and grown is None:
                hidden, state = self._restart(ids, mask, last_col, restart, state)
            elif is_slot_cache(state.cache):
                restart = torch.zeros_like(grown) if restart is None else restart
                hidden, state = self._append(ids, mask, last_col, restart, grown & ~restart, state)
            else:  # a cache kind whose tensors lmgym does not edit: refill every row
                # (mid-episode: a group's rows hold their own completions, no sharing)
                hidden, state = self._prefill(ids, mask, last_col, None)
        logits = self.head.next_token_logits(hidden)
        with phase(SAMPLE):  # one masked, tempered [N, V] for the draw and the special mass
            actions, logprobs, mass = sample_step(
                logits, self.sampling, generator, self.head.refused_mask, uniforms
            )
            if mass is not None:
                state.special_mass = mass
        return actions, logprobs, state
