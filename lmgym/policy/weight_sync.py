"""What an external inference engine loads to serve the policy as it is now.

- ``weights_key(policy)``: changes whenever the policy's weights are written (an
  optimizer step, a loaded state dict, a swapped tensor); the rollout engines
  compare it between calls to know that the weights moved.
- ``engine_weights(policy)``: ``(name, tensor)`` pairs in the transformers
  checkpoint's names, the form vLLM's weight loader reads. A LoRA policy's adapted
  layers come merged, ``W + scale * B @ A`` (peft's own ``get_delta_weight``), so
  the engine serves exactly the policy's function without knowing about adapters.
- ``save_for_engine(policy, directory)``: a plain transformers directory (config,
  generation config, safetensors) of the same tensors, to start an engine from or
  to reload a child-process engine from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from torch import Tensor

from lmgym.policy.adapters import is_peft_model, transformer_of

if TYPE_CHECKING:
    from lmgym.policy.causal_lm import CausalLMPolicy

__all__ = ["engine_weights", "save_for_engine", "weights_key"]


def weights_key(policy: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    """Each parameter's storage and in-place version: equal keys, unchanged weights."""
    return tuple((p.data_ptr(), p._version) for p in policy.parameters())


def _lora_layers(lm: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The adapted modules of ``lm`` (peft's ``BaseTunerLayer``), by name."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name: m for name, m in lm.named_modules() if isinstance(m, BaseTunerLayer)}


@torch.no_grad()
def engine_weights(policy: CausalLMPolicy) -> Iterator[tuple[str, Tensor]]:
    """Every tensor of the policy as a transformers checkpoint names it, adapters merged.

    Each tensor is detached and contiguous; merged layers are new tensors, the others
    the policy's own (not copies). Tied tensors (input and output embeddings) come
    under each name: vLLM's in-place reload reloads each of its layers from the
    names it expects, and a layer given nothing keeps stale weights.
    """
    lm = transformer_of(policy.model)
    tuned = _lora_layers(lm) if is_peft_model(policy.model) else {}
    for key, value in lm.state_dict().items():
        owner = next((name for name in tuned if key.startswith(f"{name}.")), None)
        if owner is None:
            name, tensor = key, value
        elif key == f"{owner}.base_layer.weight":
            layer = tuned[owner]
            delta = sum(
                (layer.get_delta_weight(adapter) for adapter in layer.active_adapters),
                torch.zeros_like(value),
            )
            name, tensor = f"{owner}.weight", value + delta.to(value.dtype)
        elif key.startswith(f"{owner}.base_layer."):
            name, tensor = f"{owner}.{key[len(owner) + len('.base_layer.') :]}", value
        else:
            continue  # the adapter's own tensors: merged above
        yield name, tensor.detach().contiguous()


def save_for_engine(policy: CausalLMPolicy, directory: Path) -> None:
    """Write ``directory`` as a plain transformers model of the policy (adapters merged):
    ``config.json``, ``generation_config.json`` and ``model.safetensors``."""
    lm = transformer_of(policy.model)
    directory.mkdir(parents=True, exist_ok=True)
    lm.config.save_pretrained(directory)
    if getattr(lm, "generation_config", None) is not None:
        lm.generation_config.save_pretrained(directory)
    # Every name gets its own copy, tied ones included (safetensors refuses shared
    # memory): vLLM's in-place reload from this directory leaves a layer it finds no
    # tensor for (a tied lm_head) on its old weights.
    tensors = {name: tensor.to("cpu").clone() for name, tensor in engine_weights(policy)}
    # A new file renamed over the old: a reader still mapping the old one keeps it whole.
    partial = directory / "model.safetensors.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    partial.replace(directory / "model.safetensors")
