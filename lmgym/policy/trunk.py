"""The transformer under a causal LM's head, as the rollout engine and the learner call it.

``ModelTrunk`` runs ``transformer_of(model).base_model`` to final hidden states:
eagerly over any inputs, or as the compiled one-token decode step over KV slots
(``compiled_decode``). It also knows the model facts the rollout engine needs: the
name of the trunk's cache argument, whether it wants an attention mask even on
unpadded input, and how to make an empty cache. What a pass runs under (autocast,
activation checkpointing, a disabled adapter) is its owner's choice: ``context`` is
entered around every pass.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lmgym.policy.adapters import transformer_of
from lmgym.policy.compiled_decode import CompiledDecode, RowRuns, slot_attention_on
from lmgym.profiling import TRUNK, labelled


class ModelTrunk:
    """A transformers model's trunk (``base_model``), its KV cache and its decode step.

    Args:
        model: the causal LM (a ``peft.PeftModel`` too: its adapter layers run).
        context: called around every pass; the manager to run it under.
        compile_decode: run one-token steps over KV slots through ``torch.compile``
            (``CompiledDecode``; it falls back to eager after a failure).

    Attributes:
        mask_always: the model's config names a pad id, so transformers cannot tell a
            real token with that id (an EOS equal to it, a BOS) from padding and warns
            "We strongly recommend passing in an `attention_mask`": give it the mask
            it asks for even where every column is real.
        compiled_decode: the compiled step and its fallback state.
    """

    def __init__(
        self,
        model: nn.Module,
        context: Callable[[], contextlib.AbstractContextManager[None]],
        compile_decode: bool = False,
    ) -> None:
        self.model = model
        self.context = context
        lm = transformer_of(model)
        params = inspect.signature(lm.base_model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.mask_always = getattr(lm.config, "pad_token_id", None) is not None
        self.compiled_decode = CompiledDecode(compile_decode)

    @property
    def compiles(self) -> bool:
        """Whether one-token steps over slots go through the compiled step."""
        return self.compiled_decode.enabled

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def new_cache(self) -> DynamicCache:
        """An empty KV cache of the model's layer kinds."""
        return DynamicCache(config=self.model.config)

    @labelled(TRUNK)
    def hidden_states(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor,
        cache: DynamicCache | None = None,
        packed: tuple[Tensor, Tensor] | tuple[Tensor, Tensor, RowRuns] | None = None,
    ) -> Tensor:
        """Final hidden states of the trunk: ``[N, S, H]`` for ``[N, S]`` inputs.

        ``attention_mask`` is ``[N, C]`` over cache plus input columns (bool or int),
        or ``None`` when every column is real (plain causal attention).

        ``packed``: a packed decode step over KV slots (``kv_engine``): the inputs are
        ``[N + T, 1]``, ``N`` rows' new tokens then ``T`` tokens appended to given
        rows, ``attention_mask`` is ``[N, 1, 1, C] bool`` and ``packed`` the
        ``(rows, allowed)`` of ``compiled_decode.slot_attention``, which the model
        then attends with.
        """
        trunk = transformer_of(self.model).base_model
        kwargs = {self._cache_kwarg: cache, "use_cache": cache is not None}
        attention: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if packed is not None:
            kwargs["lmgym_packed"] = packed
            attention = slot_attention_on(trunk.config)
        with self.context(), attention:
            out = trunk(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **kwargs,
            )
        return out.last_hidden_state

    @labelled(TRUNK)
    def compiled_hidden_states(
        self,
        input_ids: Tensor,
        cache_mask: Tensor,
        position_ids: Tensor,
        cache: DynamicCache,
        filled: int,
        packed: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | None:
        """``hidden_states`` of a one-token step through the compiled step:
        ``[N (+ T), H]``, or ``None`` when compiling failed (``compiled_decode``).

        ``cache_mask`` is ``[N, C] bool`` over every slot column; ``filled`` the
        columns in use after the step; ``packed`` as in ``hidden_states``.
        """
        trunk = transformer_of(self.model).base_model
        with self.context():
            return self.compiled_decode(
                trunk, input_ids, cache_mask, position_ids, cache, self._cache_kwarg, filled, packed
            )
