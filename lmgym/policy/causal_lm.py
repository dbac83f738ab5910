"""``CausalLMPolicy``: any transformers causal LM as an lmgym policy.

Two faces:

- ``act`` (rollout time, no grad): reads the env's observation, feeds the model
  only what its KV cache has not seen (the whole prompt once, then one token per
  step), and samples the next token of every row at once. The cache is the
  policy's recurrent state (``PolicyState``), like an RNN's hidden state; the env
  owns the text.
- ``logprobs`` (learner time): a teacher-forced pass that recomputes per-token
  log-probs and entropies of given sequences, chunked so a float32 ``[B, L, V]``
  log-softmax is never held at once.

Invariant under test: on the same sequences, ``act``'s sampler log-probs equal
``logprobs`` (float32, no top-k/top-p, same temperature).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import DynamicLayer

from lmgym.policy.activations import fuse_gelu
from lmgym.policy.kv_slots import (
    is_slot_cache,
    reserve,
    set_step,
    slots_capacity,
    slots_filled,
    to_slots,
)
from lmgym.policy.logprobs import token_logprobs
from lmgym.policy.sampling import (
    check_sampling_settings,
    logprob_temperature,
    sample_tokens,
    special_mass,
)
from lmgym.policy.special_tokens import (
    AllowedSpecialTokens,
    check_special_tokens_match,
    refused_special_ids,
)

if TYPE_CHECKING:
    from lmgym.envs.token_env import TokenVectorEnv


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


def distinct_rows(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor] | None:
    """Find repeated rows, so that work on them is done once and copied.

    Rows are compared through ``mask`` (padded columns do not count): a group's
    ``G`` copies of one prompt are one distinct row.

    Args:
        ids: ``[N, W] int64``.
        mask: ``[N, W] bool``.

    Returns:
        ``(first [U] int64, inverse [N] int64)``: the first row of each distinct row
        and, per row, which distinct row it is (``ids[first][inverse]`` equals ``ids``
        on the masked columns); ``None`` when all ``N`` rows are distinct.
    """
    key = torch.where(mask, ids, -1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    n, u = key.shape[0], distinct.shape[0]
    if u == n:
        return None
    rows = torch.arange(n, device=ids.device)
    first = torch.full((u,), n, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def _checkpointing(model: PreTrainedModel) -> bool:
    """Whether activation (gradient) checkpointing is on; the attribute was renamed."""
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False


def _plain_cache(cache: DynamicCache) -> bool:
    """Whether every layer is a plain ``DynamicLayer`` (``[N, heads, C, dim]``
    key/value tensors that may move into slots; sliding-window or quantized layers
    keep extra state)."""
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def _widen(cache_mask: Tensor, columns: int) -> Tensor:
    """``[N, C]`` -> ``[N, columns]``, new columns False."""
    extra = columns - cache_mask.shape[1]
    if extra <= 0:
        return cache_mask
    return torch.cat([cache_mask, cache_mask.new_zeros(cache_mask.shape[0], extra)], dim=1)


def _context_length(model: PreTrainedModel) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


class CausalLMPolicy(nn.Module):
    """A transformers causal LM with a sampler and a teacher-forced log-prob pass.

    Args:
        model: Any ``AutoModelForCausalLM`` whose output layer is a linear head
            (``get_output_embeddings()``) on its trunk (``base_model``).
        tokenizer: The model's tokenizer; ``len(tokenizer)`` ids are sampled from
            (extra embedding rows of a padded vocabulary are never sampled).
        temperature: Sampling temperature (> 0); log-probs use the same one. 0 is
            greedy decoding (argmax); its sampler log-probs, like the teacher-forced
            ones, are then those of the untempered distribution.
        top_k: Keep only the ``k`` most likely ids when sampling (``None``: all).
        top_p: Nucleus sampling mass (``None``: no filter). With top-k/top-p the
            sampler log-probs are those of the filtered distribution, so they differ
            from the learner's: the learner-sampler mismatch TIS corrects.
        fused_activations: Replace the model's composed tanh-GELU modules (GPT-2's
            ``gelu_new``) by torch's fused kernel, in place: the same function up to
            float rounding, a few percent faster to train and sample (see
            ``lmgym.policy.activations``). ``False`` keeps the model untouched.
        allowed_special_tokens: Special tokens the policy may sample besides the
            tokenizer's EOS: ids or token strings, or ``"all"`` (no mask). By default
            every other special token (``<pad>``, ``<unk>``, ...) gets probability 0, in
            sampling and in the teacher-forced log-probs alike; ``masked_token_ids``
            lists them and each rollout records the probability removed
            (``RolloutBatch.special_mass``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        fused_activations: bool = True,
        allowed_special_tokens: AllowedSpecialTokens = (),
    ) -> None:
        super().__init__()
        check_sampling_settings(temperature, top_k, top_p)
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise TypeError(
                f"model: expected a linear output layer, got {type(head).__name__}; "
                "lmgym applies the head itself to avoid materialising full logits"
            )
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(model.config, attr, None) not in (None, 1.0):
                raise NotImplementedError(
                    f"model.config.{attr}={getattr(model.config, attr)}: logit post-processing "
                    "after the head is not supported yet"
                )
        self.vocab_size = len(tokenizer)
        if self.vocab_size > head.out_features:
            raise ValueError(
                f"tokenizer has {self.vocab_size} ids but the model's output layer has "
                f"{head.out_features}: pass the tokenizer the model was trained with, or "
                "call model.resize_token_embeddings(len(tokenizer)) before training"
            )
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("tokenizer: needs a pad or an eos token")
            tokenizer.pad_token = tokenizer.eos_token
        if fused_activations:
            fuse_gelu(model)
        self.model = model
        self.tokenizer = tokenizer
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        keep = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self.allowed_special_tokens = allowed_special_tokens
        self.masked_token_ids = refused_special_ids(tokenizer, keep, allowed_special_tokens)
        self.num_masked_tokens = len(self.masked_token_ids)
        refused = torch.zeros(self.vocab_size, dtype=torch.bool, device=head.weight.device)
        refused[self.masked_token_ids] = True
        # Not persistent: checkpoints keep their keys; the mask follows the tokenizer.
        self.register_buffer(
            "_refused", refused if self.masked_token_ids else None, persistent=False
        )
        params = inspect.signature(model.base_model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    # -------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        fused_activations: bool = True,
        allowed_special_tokens: AllowedSpecialTokens = (),
    ) -> CausalLMPolicy:
        """Load model and tokenizer from a hub name or a local directory."""
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
        return cls(
            model.to(device).eval(),
            tokenizer,
            temperature,
            top_k,
            top_p,
            fused_activations,
            allowed_special_tokens,
        )

    def save_pretrained(self, path: str | Path) -> None:
        """Write model and tokenizer so ``from_pretrained(path)`` restores them."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_length(self) -> int | None:
        return _context_length(self.model)

    def check_env(self, env: TokenVectorEnv) -> None:
        """Fail early, with the field to change, if this policy cannot drive ``env``."""
        if env.vocab_size != self.vocab_size or (
            # Comparing vocabularies builds two dicts; skip it for the same tokenizer.
            env.tokenizer is not self.tokenizer
            and env.tokenizer.get_vocab() != self.tokenizer.get_vocab()
        ):
            raise ValueError(
                f"env tokenizer ({env.vocab_size} ids) differs from the policy's "
                f"({self.vocab_size} ids); build the env with the policy's tokenizer"
            )
        ctx = self.context_length
        if ctx is not None and env.seq_len > ctx:
            raise ValueError(
                f"max_prompt_length + max_new_tokens = {env.prompt_width} + "
                f"{env.max_new_tokens} = {env.seq_len} exceeds the model's context of "
                f"{ctx} tokens; lower max_new_tokens or use shorter prompts"
            )
        check_special_tokens_match(
            self.tokenizer,
            self.masked_token_ids,
            env.stop_token_ids.tolist(),
            getattr(env, "refused_token_ids", []),
        )

    # --------------------------------------------------------------- pieces
    def _head(self) -> tuple[Tensor, Tensor | None]:
        """The LM head restricted to the tokenizer's ids: ``([V, H], [V] | None)``."""
        head = self.model.get_output_embeddings()
        bias = head.bias[: self.vocab_size] if head.bias is not None else None
        return head.weight[: self.vocab_size], bias

    def hidden_states(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor,
        cache: DynamicCache | None = None,
    ) -> Tensor:
        """Final hidden states of the trunk: ``[N, S, H]`` for ``[N, S]`` inputs.

        ``attention_mask`` is ``[N, C]`` over cache plus input columns (bool or int),
        or ``None`` when every column is real (plain causal attention).
        """
        kwargs = {self._cache_kwarg: cache, "use_cache": cache is not None}
        out = self.model.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **kwargs,
        )
        return out.last_hidden_state

    def _constant(self, kind: str, n: int, device: torch.device) -> Tensor:
        """A cached constant that ``act`` needs every step: ``"arange"``, ``arange(n)``;
        ``"true"``, an ``[n, 1]`` all-True column (the cache-mask column of a full
        step)."""
        cached: dict[tuple[str, int, torch.device], Tensor] = self.__dict__.setdefault(
            "_constants", {}
        )
        key = (kind, n, device)
        if key not in cached:
            if len(cached) >= 8:  # a caller with ever-changing widths
                cached.clear()
            if kind == "arange":
                cached[key] = torch.arange(n, device=device)
            else:
                cached[key] = torch.ones(n, 1, dtype=torch.bool, device=device)
        return cached[key]

    def next_token_logits(self, hidden: Tensor) -> Tensor:
        """``[N, H]`` hidden -> ``[N, V] float32`` logits over the tokenizer's ids."""
        weight, bias = self._head()
        return torch.nn.functional.linear(hidden, weight, bias).float()

    # ------------------------------------------------------------------ act
    def _prefill(self, ids: Tensor, mask: Tensor, last_col: Tensor) -> tuple[Tensor, PolicyState]:
        """Feed every row's text up to its last real column into a fresh cache.

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
        cache = DynamicCache(config=self.model.config)
        padded = not bool(mask.all())
        shared = distinct_rows(ids, mask)
        if shared is None:
            hidden = self.hidden_states(ids, mask if padded else None, positions, cache)
        else:
            # A group's rows share one prompt: prefill it once and copy its cache.
            first, inverse = shared
            hidden = self.hidden_states(
                ids[first], mask[first] if padded else None, positions[first], cache
            )[inverse]
            cache.batch_select_indices(inverse)
        cache_mask = mask
        if _plain_cache(cache):
            capacity = max(capacity, width + 1)
            to_slots(cache, capacity)
            cache_mask = _widen(mask, capacity)
        state = PolicyState(cache, cache_mask, mask.sum(1), last_col, padded)
        return hidden[:, -1], state

    def _decode(
        self,
        ids: Tensor,
        last_col: Tensor,
        state: PolicyState,
        all_advanced: bool = False,
        filled: int | None = None,
    ) -> tuple[Tensor, PolicyState]:
        """The common step: feed each advanced row's one new token.

        A row that did not advance (finished) feeds its last token again with that
        cache column masked out, so it sees nothing new. ``all_advanced``: the caller
        already knows every row advanced by one column. ``filled``: with per-row
        columns, the exact width in use after this step (default: an upper bound).
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
            set_step(cache, cols, filled)
            cache_mask[self._constant("arange", cols.shape[0], cols.device), cols] = advanced[:, 0]
            attention_mask = cache_mask[:, :filled]
            padded = True
        advanced = advanced[:, 0]
        hidden = self.hidden_states(
            tokens, attention_mask if padded else None, state.positions[:, None], cache
        )
        if padded:
            positions = state.positions + advanced
            last_col = torch.maximum(last_col, state.last_col)
            cols = None if cols is None else cols + advanced
        else:
            positions = state.positions + 1
        new_state = PolicyState(cache, cache_mask, positions, last_col, padded, cols)
        return hidden[:, 0], new_state

    def _restart(
        self, ids: Tensor, mask: Tensor, last_col: Tensor, restart: Tensor, state: PolicyState
    ) -> tuple[Tensor, PolicyState]:
        """Re-feed the restarted rows from their new text; the other rows take one decode step.

        The ``k`` restarted rows are prefilled alone, in a cache of their own, and
        their ``W`` new columns overwrite the first ``W`` slots of their own rows
        (their old columns are all dead; the rest are masked out). From then on each
        row writes its own next column (``PolicyState.cols``). Then one decode step
        feeds every advanced row its new token. The cost is a ``[k, W]`` prefill plus
        an ordinary ``[N, 1]`` step; nothing is copied or compacted, and attention
        reads about as many columns as the longest in-flight row holds.
        """
        cache = state.cache
        rows = restart.nonzero().squeeze(1)
        width = int(last_col[rows].max()) + 1
        new_ids, new_mask = ids[rows, :width], mask[rows, :width]
        new_positions = (new_mask.long().cumsum(1) - 1).clamp(min=0)
        fresh = DynamicCache(config=self.model.config)
        new_hidden = self.hidden_states(new_ids, new_mask, new_positions, fresh)
        newest = new_hidden[torch.arange(rows.numel(), device=ids.device), last_col[rows]]
        cache_mask = _widen(state.cache_mask, reserve(cache, width))
        for shared, own in zip(cache.layers, fresh.layers, strict=True):
            shared.write_rows(rows, own.keys, own.values)
        cache_mask = cache_mask & ~restart[:, None]
        cache_mask[rows, :width] = new_mask
        cols = state.cols
        if cols is None:  # the rows no longer share a write column
            cols = torch.full_like(state.positions, slots_filled(cache))
        cols = cols.index_fill(0, rows, width)
        state = PolicyState(
            cache,
            cache_mask,
            state.positions.index_put((rows,), new_mask.sum(1)),
            state.last_col.index_put((rows,), last_col[rows]),
            True,
            cols,
        )
        # Restarted rows now have last_col == state.last_col: _decode feeds them nothing.
        hidden, state = self._decode(ids, last_col, state, filled=int(cols.max()) + 1)
        return hidden.index_put((rows,), newest), state

    def act(
        self,
        obs: dict[str, Tensor],
        state: PolicyState | None = None,
        episode_starts: Tensor | None = None,
        generator: torch.Generator | None = None,
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
                Rows that moved back or jumped are detected without the flag.
            generator: RNG for sampling.

        Returns:
            ``(actions [N] int64, sampler_logprobs [N] float32, new_state)``.
            The state's tensors are inference-mode tensors: pass them back to
            ``act``, do not edit them.
        """
        # inference_mode, not no_grad: no version counters or view tracking on the
        # ~100 small ops of a step, a few percent of a tiny model's rollout.
        with torch.inference_mode():
            actions, logprobs, state = self._act(obs, state, episode_starts, generator)
        # Plain tensors for the caller, who may use them in autograd or edit them.
        return actions.clone(), logprobs.clone(), state

    def _act(
        self,
        obs: dict[str, Tensor],
        state: PolicyState | None,
        episode_starts: Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor, PolicyState]:
        device = self.device  # one parameter scan per call, not two
        ids = obs["input_ids"].to(device)
        mask = obs["attention_mask"].to(device).bool()
        last_col = (mask * self._constant("arange", ids.shape[1], ids.device)).argmax(dim=1)
        if state is None:
            hidden, state = self._prefill(ids, mask, last_col)
        else:
            # A row that moved back or by more than one column was restarted (a new
            # episode's text); so was any row the caller flags.
            step = last_col - state.last_col
            low, high = (int(x) for x in torch.aminmax(step))  # one pass, the usual case
            restart = (step < 0) | (step > 1) if low < 0 or high > 1 else None
            if episode_starts is not None and bool(episode_starts.any()):
                flagged = episode_starts.to(step.device).bool()
                restart = flagged if restart is None else restart | flagged
            if restart is None:
                hidden, state = self._decode(ids, last_col, state, all_advanced=low == 1)
            elif is_slot_cache(state.cache):
                hidden, state = self._restart(ids, mask, last_col, restart, state)
            else:  # a cache kind whose tensors lmgym does not edit: refill every row
                hidden, state = self._prefill(ids, mask, last_col)
        logits = self.next_token_logits(hidden)
        refused = self._refused
        actions, logprobs = sample_tokens(
            logits, self.temperature, self.top_k, self.top_p, generator, refused
        )
        if refused is not None:
            state.special_mass = special_mass(logits, refused, self.temperature)
        return actions, logprobs, state

    # ------------------------------------------------------------- learner
    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        num_targets: int,
        with_entropy: bool = True,
        chunk_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Teacher-forced log-probs of the last ``num_targets`` columns.

        Args:
            input_ids: ``[B, S] int64`` prompt then completion (e.g.
                ``RolloutBatch.input_ids()``).
            attention_mask: ``[B, S] bool``; padding may sit anywhere.
            num_targets: ``L``; the targets are ``input_ids[:, S-L:]``.

        Returns:
            ``(logprobs [B, L] float32, entropy [B, L] float32)`` at the sampling
            temperature (1 when greedy) under the special-token mask, as sampled;
            values at padded targets are meaningless (mask them).
        """
        hidden = self.sequence_hidden(input_ids, attention_mask, num_targets)
        return self.logprobs_from_hidden(hidden, input_ids, with_entropy, chunk_size)

    def logprobs_from_hidden(
        self,
        hidden: Tensor,
        input_ids: Tensor,
        with_entropy: bool = True,
        chunk_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies from ``sequence_hidden``'s ``[B, L, H]`` output.

        Lets a caller that also needs the hidden states (a shared value head) run
        the trunk once. The targets are the last ``L`` columns of ``input_ids``.
        """
        weight, bias = self._head()
        targets = input_ids[:, input_ids.shape[1] - hidden.shape[1] :]
        return token_logprobs(
            hidden,
            weight,
            bias,
            targets,
            logprob_temperature(self.temperature),
            with_entropy,
            chunk_size,
            self._refused,
        )

    def sequence_hidden(
        self, input_ids: Tensor, attention_mask: Tensor, num_targets: int
    ) -> Tensor:
        """Hidden states that predict the last ``num_targets`` columns: ``[B, L, H]``.

        Rows that share a prompt (a group) run their prompt columns through the
        trunk once; the prompt's KV cache is copied to every row of the group and
        the completions attend to it. The forward values are the same as one full
        pass (up to float rounding) and the copy's backward sums the group's
        gradients into the shared prompt computation, so gradients match too. With
        dropout active the group's rows share one dropout mask on the prompt.
        """
        mask = attention_mask.bool()
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        s = input_ids.shape[1]
        p = s - num_targets  # prompt columns; the last one predicts the first target
        shared = None
        if p > 1 and not _checkpointing(self.model):
            # (Gradient checkpointing turns the cache off, so it gets the plain pass.)
            shared = distinct_rows(input_ids[:, :p], mask[:, :p])
        if shared is None:
            hidden = self.hidden_states(input_ids, mask, positions)
            return hidden[:, p - 1 : s - 1]
        first, inverse = shared
        cache = DynamicCache(config=self.model.config)
        prompt_hidden = self.hidden_states(
            input_ids[first, :p], mask[first, :p], positions[first, :p], cache
        )
        last_prompt = prompt_hidden[inverse, p - 1 :]  # [B, 1, H]
        if num_targets == 1:
            return last_prompt
        cache.batch_select_indices(inverse)
        completion_hidden = self.hidden_states(
            input_ids[:, p : s - 1], mask[:, : s - 1], positions[:, p : s - 1], cache
        )
        return torch.cat([last_prompt, completion_hidden], dim=1)
