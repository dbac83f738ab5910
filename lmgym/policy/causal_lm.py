"""``CausalLMPolicy``: any transformers causal LM as an lmgym policy.

Two faces:

- ``act`` (rollout time, no grad): reads the env's observation, feeds the model
  only what its KV cache has not seen, and samples the next token of every row at
  once. It lives in ``kv_engine`` (``KVCacheRollout``, mixed in here) with the
  cache state it carries between calls (``PolicyState``).
- ``logprobs`` (learner time): a teacher-forced pass that recomputes per-token
  log-probs and entropies of given sequences, chunked so a float32 ``[B, L, V]``
  log-softmax is never held at once.

This module holds the model wrapper (loading, saving, checks, the trunk and the
LM head) and the teacher-forced pass.

Invariant under test: on the same sequences, ``act``'s sampler log-probs equal
``logprobs`` (float32, no top-k/top-p, same temperature).
"""

from __future__ import annotations

import inspect
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

from lmgym.policy.activations import fuse_gelu
from lmgym.policy.kv_engine import KVCacheRollout, PolicyState, distinct_rows
from lmgym.policy.logprobs import token_logprobs
from lmgym.policy.sampling import check_sampling_settings, logprob_temperature
from lmgym.policy.special_tokens import (
    AllowedSpecialTokens,
    check_special_tokens_match,
    refused_special_ids,
)
from lmgym.profiling import LM_HEAD, LOGPROBS, TEACHER_FORCED, TRUNK, labelled

if TYPE_CHECKING:
    from lmgym.envs.token_env import TokenVectorEnv

__all__ = ["CausalLMPolicy", "PolicyState", "distinct_rows"]


def _checkpointing(model: PreTrainedModel) -> bool:
    """Whether activation (gradient) checkpointing is on; the attribute was renamed."""
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False


def _context_length(model: PreTrainedModel) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


class CausalLMPolicy(KVCacheRollout, nn.Module):
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

    @labelled(TRUNK)
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

    @labelled(LM_HEAD)
    def next_token_logits(self, hidden: Tensor) -> Tensor:
        """``[N, H]`` hidden -> ``[N, V] float32`` logits over the tokenizer's ids."""
        weight, bias = self._head()
        return torch.nn.functional.linear(hidden, weight, bias).float()

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

    @labelled(LOGPROBS)
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

    @labelled(TEACHER_FORCED)
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
