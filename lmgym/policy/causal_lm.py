"""``CausalLMPolicy``: any transformers causal LM as an lmgym policy.

Two faces:

- ``act`` (rollout time, no grad): reads the env's observation, feeds the model
  only what its KV cache has not seen, and samples the next token of every row at
  once. The policy delegates it to its ``RolloutEngine`` (``kv_engine``), which
  has the policy's trunk (``trunk.ModelTrunk``), the policy as its head and the
  sampling record (``sampling.SamplingSettings``), and returns the cache state it
  carries between calls (``PolicyState``).
- ``logprobs`` (learner time): a teacher-forced pass that recomputes per-token
  log-probs and entropies of given sequences, chunked so a float32 ``[B, L, V]``
  log-softmax is never held at once.

This module holds the model wrapper (loading, saving, checks, the LM head, mixed
precision, activation checkpointing) and the teacher-forced pass.
The model may be a ``peft.PeftModel`` (``lmgym.policy.adapters``): the trunk and
head are then those of the transformers model under it, with the adapter layers in.

Invariant under test: on the same sequences, ``act``'s sampler log-probs equal
``logprobs`` (float32, no top-k/top-p, same temperature).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lmgym.policy.activations import fuse_gelu
from lmgym.policy.adapters import (
    add_adapter,
    check_adapter_model,
    is_adapter_dir,
    is_peft_model,
    load_adapter_model,
    save_adapter_model,
    save_merged_model,
    transformer_of,
)
from lmgym.policy.groups import shared_pass, shared_rows
from lmgym.policy.kv_engine import PolicyState, RolloutEngine, TrunkPass
from lmgym.policy.logprobs import token_logprobs
from lmgym.policy.packaged import local_model_path
from lmgym.policy.sampling import SamplingSettings
from lmgym.policy.trunk import ModelTrunk
from lmgym.policy.views import live_view
from lmgym.policy.weights import check_finite_weights
from lmgym.profiling import LM_HEAD, LOGPROBS, TEACHER_FORCED, labelled
from lmgym.special_tokens import AllowedSpecialTokens, TokenRules, stop_ids_for

if TYPE_CHECKING:
    from lmgym.envs.token_env import TokenVectorEnv

__all__ = ["CausalLMPolicy", "PolicyState"]


AUTOCAST_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _checkpointing(model: nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on; the attribute was renamed."""
    model = transformer_of(model)
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False


def _enable_checkpointing(model: PreTrainedModel) -> None:
    """Turn on transformers' activation checkpointing (non-reentrant: it needs no input
    that requires grad, so frozen embeddings under an adapter are fine)."""
    if not model.supports_gradient_checkpointing:
        raise ValueError(
            f"gradient_checkpointing=True: {type(model).__name__} does not support it; "
            "set gradient_checkpointing=False"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextlib.contextmanager
def _checkpointed_layers_training(model: PreTrainedModel) -> Iterator[None]:
    """Let transformers checkpoint while the model stays in eval mode.

    transformers checkpoints a layer only when the layer is in training mode, but
    lmgym keeps the model in eval mode (no dropout: the learner's log-probs must
    match the sampler's). This flips the ``training`` flag of the checkpointed
    modules alone, not of their children, so dropout stays off.
    """
    flagged = [
        m for m in model.modules() if getattr(m, "gradient_checkpointing", False) and not m.training
    ]
    for module in flagged:
        module.training = True
    try:
        yield
    finally:
        for module in flagged:
            module.training = False


def resolve_autocast_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    """``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"`` or the torch dtype; ``None``
    or float32: no autocast."""
    if value is None or value in (torch.float32, "float32", "fp32", "no"):
        return None
    if isinstance(value, str):
        if value not in AUTOCAST_DTYPES:
            raise ValueError(
                f"autocast_dtype={value!r} is not one of {[*AUTOCAST_DTYPES, 'float32', None]}"
            )
        return AUTOCAST_DTYPES[value]
    if value not in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"autocast_dtype={value}: must be torch.bfloat16, torch.float16 or None (float32)"
        )
    return value


class _EngineAct:
    """``policy.act``: its engine's ``act``, with the engine's signature and docstring.

    A non-data descriptor, so a caller may still set ``act`` on one policy (a
    benchmark wraps it to take notes) and delete it again after.
    """

    def __get__(
        self, policy: CausalLMPolicy | None, owner: type | None = None
    ) -> Callable[..., tuple[Tensor, Tensor, PolicyState]] | _EngineAct:
        return self if policy is None else policy.engine.act


def _sampling_field(name: str) -> property:
    """``policy.<name>``: that field of ``policy.sampling``; setting it replaces the
    record by a copy with the new value (checked, as every record is)."""

    def set_field(policy: CausalLMPolicy, value: Any) -> None:
        policy.sampling = dataclasses.replace(policy.sampling, **{name: value})

    return property(lambda policy: getattr(policy.sampling, name), set_field)


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
        allowed_special_tokens: Special tokens the policy may sample besides its
            stop ids, until an env hands over its own rules: ids or token strings, or
            ``"all"`` (no mask). Every other special token (``<pad>``, ``<unk>``, ...)
            gets probability 0, in sampling and in the teacher-forced log-probs alike;
            ``masked_token_ids`` lists them and each rollout records the probability
            removed (``RolloutBatch.special_mass``). ``check_env(env)`` (every
            collector and agent calls it) replaces these rules by the env's
            (``env.token_rules``): the policy then masks exactly what the env
            refuses, so give ``allowed_special_tokens`` to the env.
        peft_config: A ``peft.PeftConfig`` (e.g. ``LoraConfig(target_modules=[...])``):
            wrap ``model`` with ``peft.get_peft_model`` so that only the adapter
            trains. ``model`` may also be a ``peft.PeftModel`` already (a layer
            tuner such as LoRA, one adapter). Needs the ``peft`` extra.
        autocast_dtype: Mixed precision: run the trunk and the LM head under
            ``torch.autocast`` with ``torch.bfloat16`` (CUDA with bf16 support, or
            CPU) or ``torch.float16`` (CUDA only); strings ``"bfloat16"``/``"bf16"``,
            ``"float16"``/``"fp16"`` work too. The weights keep their dtype (float32
            master weights by default); log-probs and entropies are float32. The
            sampler and the learner then differ by bf16 rounding (TIS corrects it).
            The agents do no loss scaling, so under float16 small gradients may
            underflow: prefer bfloat16 where the GPU has it. ``None``: full precision.
        gradient_checkpointing: Recompute each layer's activations in the backward
            pass instead of storing them (transformers' activation checkpointing,
            non-reentrant): less memory, about one more forward pass of compute.
            The model stays in eval mode (no dropout).
        compile_decode: Run the rollout's one-token decode step as one graph compiled
            with ``torch.compile`` (inductor; CUDA graphs on a GPU) over
            preallocated KV slots (``lmgym.policy.compiled_decode``). It pays a
            compile of tens of seconds on a CPU per process and per (rows, cache
            capacity) shape, then runs each step with much less per-op overhead:
            worth it for long trainings of small models, not for a short script.
            Only KV caches lmgym moves into slots use it; where compiling fails, a
            warning says so once and the policy decodes eagerly.
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
        *,
        peft_config: Any = None,
        autocast_dtype: torch.dtype | str | None = None,
        gradient_checkpointing: bool = False,
        compile_decode: bool = False,
    ) -> None:
        super().__init__()
        sampling = SamplingSettings(temperature, top_k, top_p)
        self.autocast_dtype = resolve_autocast_dtype(autocast_dtype)
        if peft_config is not None:
            model = add_adapter(model, peft_config)
        check_adapter_model(model)
        check_finite_weights(model)
        lm = transformer_of(model)
        head = lm.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise TypeError(
                f"model: expected a linear output layer, got {type(head).__name__}; "
                "lmgym applies the head itself to avoid materialising full logits "
                "(leave lm_head out of an adapter's target_modules and modules_to_save)"
            )
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(lm.config, attr, None) not in (None, 1.0):
                raise NotImplementedError(
                    f"model.config.{attr}={getattr(lm.config, attr)}: logit post-processing "
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
        if gradient_checkpointing:
            _enable_checkpointing(lm)
        self.model = model
        self.tokenizer = tokenizer
        # The model's generation_config may stop on more ids than the tokenizer's EOS
        # (chat models' end-of-turn tokens): they stay samplable.
        self.stop_token_ids = stop_ids_for(model, tokenizer)
        self.allowed_special_tokens = allowed_special_tokens
        # Not persistent: checkpoints keep their keys; the mask follows the rules.
        self.register_buffer("_refused", None, persistent=False)
        # Until an env hands over its rules (check_env): the model's stop ids and
        # allowed_special_tokens, by the env's own builder.
        self.use_token_rules(
            TokenRules.build(tokenizer, self.stop_token_ids, allowed_special_tokens)
        )
        self.trunk = ModelTrunk(model, self._trunk_pass_context, compile_decode)
        self.engine = RolloutEngine(self.trunk, self, sampling)

    # -------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | str = torch.float32,
        *,
        peft_config: Any = None,
        **settings: Any,
    ) -> CausalLMPolicy:
        """Load model and tokenizer from a local directory, a packaged model's name
        (``lmgym.policy.packaged``, e.g. ``"smollm2-135m-instruct"``) or a hub name.

        A directory written by ``save_pretrained`` of a PEFT policy (or any local
        peft adapter directory) loads as base model plus trainable adapter.

        Args:
            dtype: dtype of the loaded weights (the base's, under an adapter; peft
                keeps adapter weights in float32).
            peft_config: wrap the loaded model with a new adapter (see the class).
            **settings: the class's keyword settings, passed on as they are:
                ``temperature``, ``top_k``, ``top_p``, ``fused_activations``,
                ``allowed_special_tokens``, ``autocast_dtype``,
                ``gradient_checkpointing``, ``compile_decode`` (the class documents
                each).

        Raises:
            TypeError: a name in ``settings`` that the class does not take (checked
                before anything loads).
        """
        taken = [*inspect.signature(cls.__init__).parameters][3:]  # after self, model, tokenizer
        unknown = sorted(set(settings) - set(taken))
        if unknown:
            raise TypeError(
                f"from_pretrained: unknown setting(s) {unknown}; the settings are {taken}"
            )
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        name_or_path = local_model_path(name_or_path)
        if is_adapter_dir(name_or_path):
            if peft_config is not None:
                raise ValueError(
                    f"peft_config: {name_or_path} already holds an adapter; load it without "
                    "peft_config to continue training it"
                )
            model, base = load_adapter_model(Path(name_or_path), dtype, device)
            # A plain peft adapter directory may hold no tokenizer: take its base model's.
            has_tokenizer = (Path(name_or_path) / "tokenizer_config.json").is_file()
            tokenizer = AutoTokenizer.from_pretrained(name_or_path if has_tokenizer else base)
        else:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).to(device)
        return cls(model.eval(), tokenizer, peft_config=peft_config, **settings)

    @classmethod
    def for_env(cls, name_or_path: str | Path, env: TokenVectorEnv) -> CausalLMPolicy:
        """``from_pretrained(name_or_path)`` on ``env.device``, checked to use the env's
        tokenizer (how an agent takes a policy given by name)."""
        policy = cls.from_pretrained(name_or_path, device=env.device)
        if (
            env.vocab_size != policy.vocab_size
            or env.tokenizer.get_vocab() != policy.tokenizer.get_vocab()
        ):
            raise ValueError(
                f"policy={str(name_or_path)!r}: its tokenizer ({policy.vocab_size} ids) differs "
                f"from the env's ({env.vocab_size} ids); build the env with "
                f"tokenizer=AutoTokenizer.from_pretrained({str(name_or_path)!r})"
            )
        return policy

    def save_pretrained(self, path: str | Path, merged: bool = False) -> None:
        """Write model and tokenizer so ``from_pretrained(path)`` restores them exactly.

        A PEFT model writes its adapter (``adapter_config.json``,
        ``adapter_model.safetensors``) and its base: ``base_model.json``, a reference to
        the base (path or name, and a SHA-256 of its weights, checked on load), or the
        frozen base weights in ``path/base`` when the base has no place to refer to
        (``lmgym.policy.adapters.save_adapter_model``).

        Args:
            merged: for a PEFT model, write instead the adapter merged into the base
                weights as a plain transformers model (for inference or export; it
                needs memory for a second copy of the model while it is written).
        """
        path = Path(path)
        if is_peft_model(self.model):
            if merged:
                save_merged_model(self.model, path)
            else:
                save_adapter_model(self.model, path)
        else:
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def is_peft(self) -> bool:
        """Whether the model is a ``peft.PeftModel``."""
        return is_peft_model(self.model)

    @property
    def compile_decode(self) -> bool:
        """Whether the rollout decodes with the compiled step (``False`` after a
        compile failure)."""
        return self.trunk.compiles

    @property
    def sampling(self) -> SamplingSettings:
        """How ``act`` samples; the teacher-forced pass takes its temperature from it.
        Assign a new record to sample differently (it is checked when made)."""
        return self.engine.sampling

    @sampling.setter
    def sampling(self, settings: SamplingSettings) -> None:
        self.engine.sampling = settings

    # Each reads the sampling record; setting one swaps in a new, checked record.
    temperature = _sampling_field("temperature")
    top_k = _sampling_field("top_k")
    top_p = _sampling_field("top_p")

    @property
    def refused_mask(self) -> Tensor | None:
        """``[V] bool``: the ids never sampled (``masked_token_ids``), or ``None``."""
        return self._refused

    @property
    def masked_token_ids(self) -> list[int]:
        """The special ids never sampled: ``token_rules.refused_ids``."""
        return list(self.token_rules.refused_ids)

    @property
    def num_masked_tokens(self) -> int:
        return len(self.token_rules.refused_ids)

    def use_token_rules(self, rules: TokenRules) -> None:
        """Sample (and compute teacher-forced log-probs) by ``rules``: never an id
        they refuse. ``check_env`` hands over the env's."""
        self.token_rules = rules
        self._refused = rules.refused_mask(self.vocab_size, self._head()[0].device)

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether activation checkpointing is on."""
        return _checkpointing(self.model)

    def settings(self) -> dict[str, Any]:
        """The constructor settings that ``from_pretrained`` takes back, beyond the
        weights: sampling, weight dtype, mixed precision, checkpointing, compiled decode."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            # dtypes by name: a checkpoint's state holds plain data only.
            "dtype": str(transformer_of(self.model).dtype).removeprefix("torch."),
            "autocast_dtype": None
            if self.autocast_dtype is None
            else str(self.autocast_dtype).removeprefix("torch."),
            "gradient_checkpointing": self.gradient_checkpointing,
            "compile_decode": self.compile_decode,
            "allowed_special_tokens": self.allowed_special_tokens,
        }

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_length(self) -> int | None:
        return _context_length(transformer_of(self.model))

    def check_env(self, env: TokenVectorEnv) -> None:
        """Fail early, with the field to change, if this policy cannot drive ``env``;
        then take the env's token rules (``env.token_rules``: its stop ids and refused
        special ids), so that the policy never samples what the env refuses.

        Raises:
            ValueError: another tokenizer, a longer context than the model's, or an
                env that refuses one of the model's own stop ids (a chat model's end of
                turn: build the env with ``stop_token_ids=policy.stop_token_ids``).
        """
        self._check_autocast()
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
        env.token_rules.check_model_stops(self.tokenizer, self.stop_token_ids)
        if env.token_rules != self.token_rules:
            self.use_token_rules(env.token_rules)

    # --------------------------------------------------------------- pieces
    def _check_autocast(self) -> None:
        dtype, device = self.autocast_dtype, self.device
        if dtype is torch.float16 and device.type != "cuda":
            raise ValueError(
                f"autocast_dtype=float16 needs a CUDA device, the policy is on {device}; "
                "use autocast_dtype='bfloat16' on CPU, or None (float32)"
            )
        if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(
                f"autocast_dtype=bfloat16: the GPU of {device} does not support bf16; "
                "use 'float16' or None (float32)"
            )

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """``torch.autocast`` at ``autocast_dtype`` on the policy's device (a no-op
        context when it is ``None``)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        device = self.device
        if self.autocast_dtype is torch.float16 and device.type != "cuda":
            self._check_autocast()  # raises, naming the fix
        return torch.autocast(device.type, dtype=self.autocast_dtype)

    def _trunk_context(self) -> contextlib.AbstractContextManager[None]:
        """What the trunk pass runs under, beyond autocast: checkpointing's training flag
        when a backward will follow. (The KL reference view adds the disabled adapter.)"""
        if torch.is_grad_enabled() and _checkpointing(self.model):
            return _checkpointed_layers_training(transformer_of(self.model))
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _trunk_pass_context(self) -> Iterator[None]:
        """Every trunk pass (``ModelTrunk.context``): autocast, then ``_trunk_context``."""
        with self.autocast(), self._trunk_context():
            yield

    def _head(self) -> tuple[Tensor, Tensor | None]:
        """The LM head restricted to the tokenizer's ids: ``([V, H], [V] | None)``."""
        head = transformer_of(self.model).get_output_embeddings()
        bias = head.bias[: self.vocab_size] if head.bias is not None else None
        return head.weight[: self.vocab_size], bias

    @property
    def hidden_states(self) -> TrunkPass:
        """The trunk's pass, ``[N, S]`` inputs -> ``[N, S, H]`` final hidden states
        (``ModelTrunk.hidden_states`` documents it)."""
        return self.trunk.hidden_states

    #: ``act(obs, state=None, episode_starts=None, generator=None, group_ids=None,
    #: idle=None)``: sample the next token of every row (``RolloutEngine.act``
    #: documents it), with the engine ``lmgym.policy.set_rollout_engine`` chose.
    #: lmgym's engine also takes ``uniforms=`` (counter-based draws, parked rows).
    act = _EngineAct()

    @labelled(LM_HEAD)
    def next_token_logits(self, hidden: Tensor) -> Tensor:
        """``[N, H]`` hidden -> ``[N, V] float32`` logits over the tokenizer's ids."""
        weight, bias = self._head()
        with self.autocast():
            return torch.nn.functional.linear(hidden, weight, bias).float()

    # ------------------------------------------------------------- learner
    def on_model(self, model: nn.Module) -> CausalLMPolicy:
        """This policy's teacher-forced pass run by ``model`` (a replica of ``self.model``,
        e.g. data-parallel FSDP's sharded one) instead of its own model.

        A view (``lmgym.policy.views.live_view``): its ``model`` and trunk are
        ``model``'s; its sampling record, token rules and tokenizer are this policy's,
        read live. This policy is not changed. (Its ``act`` is this policy's: the view
        is for the update's passes.)
        """
        view = live_view(self, model=model)
        view.trunk = ModelTrunk(model, view._trunk_pass_context)
        return view

    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        num_targets: int,
        *,
        group_ids: Tensor | None = None,
        with_entropy: bool = True,
        chunk_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Teacher-forced log-probs of the last ``num_targets`` columns.

        Args:
            input_ids: ``[B, S] int64`` prompt then completion (e.g.
                ``RolloutBatch.input_ids()``).
            attention_mask: ``[B, S] bool``; padding may sit anywhere.
            num_targets: ``L``; the targets are ``input_ids[:, S-L:]``.
            group_ids: ``[B] int64`` each row's group (``RolloutBatch.group_ids``): a
                group's prompt runs once (``sequence_hidden``). ``None``: a plain pass.
            with_entropy, chunk_size: as ``lmgym.policy.logprobs.token_logprobs``.

        Returns:
            ``(logprobs [B, L] float32, entropy [B, L] float32)`` at the sampling
            temperature (1 when greedy) under the special-token mask, as sampled;
            values at padded targets are meaningless (mask them).
        """
        hidden = self.sequence_hidden(input_ids, attention_mask, num_targets, group_ids)
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
        with self.autocast():
            return token_logprobs(
                hidden,
                weight,
                bias,
                targets,
                self.sampling.logprob_temperature,
                with_entropy,
                chunk_size,
                self._refused,
            )

    @labelled(TEACHER_FORCED)
    def sequence_hidden(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        num_targets: int,
        group_ids: Tensor | None = None,
    ) -> Tensor:
        """Hidden states that predict the last ``num_targets`` columns: ``[B, L, H]``.

        With ``group_ids`` (``[B] int64``, ``RolloutBatch.group_ids``) the rows of one
        group run their prompt columns (the first ``S - L``, checked to be the same
        within a group) through the trunk once; the prompt's KV cache is copied to
        every row of the group and the completions attend to it. The forward values
        are the same as the plain pass of ``group_ids=None`` (up to float rounding)
        and the copy's backward sums the group's gradients into the shared prompt
        computation, so gradients match too. With dropout active the group's rows
        share one dropout mask on the prompt.
        """
        mask = attention_mask.bool()
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        s = input_ids.shape[1]
        p = s - num_targets  # prompt columns; the last one predicts the first target
        shared = None
        if group_ids is not None and p > 1 and not _checkpointing(self.model):
            # (Gradient checkpointing turns the cache off, so it gets the plain pass.)
            shared = shared_rows(group_ids, input_ids[:, :p], mask[:, :p])
        if shared is None:
            hidden = self.hidden_states(input_ids, mask, positions)
            return hidden[:, p - 1 : s - 1]
        cache = self.trunk.new_cache()
        prompt_hidden = shared_pass(
            self.hidden_states, input_ids[:, :p], mask[:, :p], positions[:, :p], cache, shared
        )
        last_prompt = prompt_hidden[shared[1], p - 1 :]  # [B, 1, H]
        if num_targets == 1:
            return last_prompt
        completion_hidden = self.hidden_states(
            input_ids[:, p : s - 1], mask[:, : s - 1], positions[:, p : s - 1], cache
        )
        return torch.cat([last_prompt, completion_hidden], dim=1)
