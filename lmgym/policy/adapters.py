"""PEFT adapters (LoRA and peft's other layer tuners) under ``CausalLMPolicy``.

``peft`` is an optional extra (``pip install 'lmgym[peft]'``): nothing here imports
it until a PEFT feature is used, and a model can only be a ``PeftModel`` if the
user's own code imported peft first.

The policy runs the transformers model *under* the ``PeftModel`` wrapper
(``get_base_model()``): peft injects its layers into that model in place, so its
trunk and LM head are the adapted ones, and ``PeftModel.disable_adapter()`` turns
them off for the KL reference without a second copy of the weights.

A policy checkpoint of a PEFT model is a directory::

    adapter_config.json, adapter_model.safetensors   peft's own files (save_pretrained)
    base_model.json                                  where the frozen base model is, and the
                                                     SHA-256 of its weights (base_reference)
    tokenizer files

The base model is not copied into every checkpoint (545 MB for a 135M-parameter
model): ``base_model.json`` names it (an absolute directory or a hub name) with a
content hash of its weights, as peft's ``base_model_name_or_path`` does but
checked. Loading finds the base there (or at ``$LMGYM_LORA_BASE`` when it moved),
and refuses weights whose hash differs. A base that cannot be named durably (a
model built in memory, a directory that is gone or holds other weights than the
policy's) and a policy marked with ``keep_base_weights`` are written whole into
``base/`` instead, and then the directory alone reloads with no network.

The adapter files sit at the top so that peft and transformers tools recognise the
directory as an adapter; the base weights sit apart so that
``AutoModelForCausalLM.from_pretrained(directory)`` never silently loads the base
model alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_DIR = "base"
BASE_REFERENCE = "base_model.json"
BASE_ENV = "LMGYM_LORA_BASE"
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""Where to look for a referenced base model that is no longer where it was recorded."""
INSTALL_HINT = "pip install 'lmgym[peft]' (or pip install 'peft>=0.13')"


def require_peft(feature: str) -> ModuleType:
    """Import peft, or raise ``ImportError`` naming ``feature`` and the extra to install."""
    try:
        import peft
    except ImportError as error:
        raise ImportError(
            f"{feature} needs the optional dependency peft: {INSTALL_HINT}"
        ) from error
    return peft


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (False when peft was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def transformer_of(model: nn.Module) -> PreTrainedModel:
    """The transformers model that runs: ``model`` itself, or the one under a PEFT
    wrapper with the adapter layers injected in place."""
    return model.get_base_model() if is_peft_model(model) else model  # type: ignore[return-value]


def check_adapter_model(model: nn.Module) -> None:
    """Reject adapter setups the policy cannot run, train and save exactly.

    Raises:
        TypeError: transformers-integrated adapters (``model.add_adapter``), whose
            ``save_pretrained`` writes the adapter alone.
        NotImplementedError: prompt-learning methods (prefix/prompt tuning), which
            act in ``PeftModel.forward`` and not in the trunk the policy calls, or
            more than one adapter.
    """
    if getattr(model, "_hf_peft_config_loaded", False):
        raise TypeError(
            "model: adapters added with transformers' model.add_adapter are not supported; "
            "wrap the plain model with peft.get_peft_model(model, config), or pass "
            "peft_config=... to CausalLMPolicy"
        )
    if not is_peft_model(model):
        return
    if model.active_peft_config.is_prompt_learning:
        raise NotImplementedError(
            f"model: peft {model.active_peft_config.peft_type} is a prompt-learning method, "
            "which the policy's trunk pass bypasses; use a layer tuner such as LoRA"
        )
    if list(model.peft_config) != ["default"]:
        raise NotImplementedError(
            f"model: has adapters {list(model.peft_config)}; the policy trains and saves one "
            "adapter named 'default' (peft.get_peft_model's name)"
        )


@contextmanager
def _peft_wrapping() -> Iterator[None]:
    """Wrap a model in ``PeftModel`` without transformers' deprecation warning.

    ``PeftModel.__init__`` (peft 0.21.2, the newest) reads the model's
    ``is_gradient_checkpointing``, which transformers 5 deprecates for
    ``is_activation_checkpointing`` with a FutureWarning on every LoRA policy built
    or loaded. The value is still right (lmgym turns checkpointing on after wrapping),
    so only that warning, and only during the wrap, is silenced.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def add_adapter(model: PreTrainedModel, peft_config: Any) -> nn.Module:
    """``peft.get_peft_model(model, peft_config)``: the base weights frozen, the
    adapter's trainable."""
    peft = require_peft("peft_config")
    if not isinstance(peft_config, peft.PeftConfig):
        raise TypeError(
            f"peft_config: expected a peft.PeftConfig such as peft.LoraConfig(...), "
            f"got {type(peft_config).__name__}"
        )
    if is_peft_model(model):
        raise ValueError("peft_config: the model is already a PeftModel; pass one or the other")
    with _peft_wrapping():
        return peft.get_peft_model(model, peft_config)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (``PeftModel.disable_adapter``); a no-op for a
    plain model. peft's context re-enables the adapter by marking it trainable, so
    every parameter's ``requires_grad`` is put back as it was."""
    if not is_peft_model(model):
        yield
        return
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        with model.disable_adapter():
            yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is a local directory holding a peft adapter."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def _base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the model under the adapter, with the original key names.

    peft wraps each adapted module as ``<name>.base_layer`` next to its adapter
    weights; this keeps the base layer's entries under ``<name>`` and drops the
    adapter's.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    lm = transformer_of(model)
    tuned = [name for name, module in lm.named_modules() if isinstance(module, BaseTunerLayer)]
    state = {}
    for key, value in lm.state_dict().items():
        owner = next((name for name in tuned if key.startswith(f"{name}.")), None)
        if owner is None:
            state[key] = value
        elif key.startswith(f"{owner}.base_layer."):
            state[f"{owner}.{key[len(owner) + len('.base_layer.') :]}"] = value
    return state


class BaseModelError(ValueError):
    """A LoRA checkpoint's base model is missing, or is not the model it was trained on."""


class AdapterMismatchError(ValueError):
    """An adapter's saved weights do not fit the adapter its config and base model build
    (a rank or a layer's shape changed after the save)."""


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
    r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)


def _adapter_mismatch(path: Path, exc: RuntimeError) -> str:
    """One line for peft's ``load_state_dict`` error on the adapter at ``path``."""
    found = _SIZE_MISMATCH.search(str(exc))
    if found:
        name, saved, built = found.groups()
        what = (
            f"{name} is {saved} in {ADAPTER_WEIGHTS}, but {ADAPTER_CONFIG} and the base model "
            f"make it {built}"
        )
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        what = (lines[1] if len(lines) > 1 else lines[0] if lines else "")[:200]
    return (
        f"LoRA checkpoint {path}: its adapter weights do not fit its adapter ({what}); "
        f"{ADAPTER_WEIGHTS} or {ADAPTER_CONFIG} was changed after the save, or they come from "
        "different saves: resume from another checkpoint, or restore both files from the "
        "same save"
    )


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 of a state dict's content: every key, dtype, shape and byte, keys sorted."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def keep_base_weights(model: nn.Module, keep: bool = True) -> None:
    """Make ``save_adapter_model`` write ``model``'s base weights into every save (``base/``)
    instead of a reference to its base model."""
    model._lmgym_keep_base_weights = keep  # type: ignore[assignment]


def _durable_name(source: str) -> str | None:
    """``source`` as a reference that outlives this process: an existing directory's
    absolute path, or a hub name (``name``, ``org/name``); ``None`` for anything else."""
    path = Path(source).expanduser() if source else None
    if path is not None and path.is_dir():
        return str(path.resolve())
    if source and not source.startswith((".", "~")) and _HUB_NAME.fullmatch(source):
        return source
    return None


def base_reference(model: nn.Module) -> dict[str, str] | None:
    """``{"name_or_path", "sha256", "dtype"}`` naming ``model``'s base, or ``None`` when
    the base must be saved whole (see the module docstring).

    The first call loads the base from where it came from and checks that its weights
    hash equal to those under the adapter, so a reference always reloads exactly; the
    answer is kept on the model (the base is frozen).
    """
    if getattr(model, "_lmgym_keep_base_weights", False):
        return None
    known = getattr(model, "_lmgym_base_reference", None)
    if known is not None:
        return known or None
    lm = transformer_of(model)
    record: dict[str, str] | bool = False
    name = _durable_name(str(getattr(lm, "name_or_path", "") or ""))
    if name is not None:
        digest = state_sha256(_base_state_dict(model))
        try:
            source = AutoModelForCausalLM.from_pretrained(name, dtype=lm.dtype)
        except (OSError, ValueError):
            source = None
        if source is not None and state_sha256(source.state_dict()) == digest:
            record = {"name_or_path": name, "sha256": digest, "dtype": str(lm.dtype)}
            record.update(_packaged_name(name))
        del source
    model._lmgym_base_reference = record  # type: ignore[assignment]
    return record or None


def save_adapter_model(model: nn.Module, path: Path) -> None:
    """Write the adapter (peft's files) and its base under ``path``: ``base_model.json``
    (``base_reference``), or the frozen base weights in ``base/`` when it has none."""
    model.save_pretrained(path)
    reference = base_reference(model)
    if reference is not None:
        (path / BASE_REFERENCE).write_text(json.dumps(reference, indent=2) + "\n")
        return
    lm = transformer_of(model)
    lm.save_pretrained(path / BASE_DIR, state_dict=_base_state_dict(model))


def _packaged_name(directory: str) -> dict[str, str]:
    """``{"packaged": name}`` when ``directory`` is a packaged model's cached conversion
    (``lmgym.policy.packaged``), which can be made again where the cache now is."""
    from lmgym.policy.packaged import MARKER

    marker = Path(directory) / MARKER
    try:
        return {"packaged": str(json.loads(marker.read_text())["name"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _referenced_base(path: Path, reference: dict[str, str]) -> str:
    """Where the base ``reference`` names is now: ``$LMGYM_LORA_BASE``, else its recorded
    place, else (a packaged model) its cached conversion wherever the cache now is.

    Raises:
        BaseModelError: none holds a model; one line saying what to pass.
    """
    recorded = reference["name_or_path"]
    moved = os.environ.get(BASE_ENV)
    if moved:
        return moved
    if not Path(recorded).is_absolute() or Path(recorded).is_dir():
        return recorded
    if reference.get("packaged"):
        from lmgym.policy.packaged import packaged_model_dir

        return str(packaged_model_dir(reference["packaged"]))
    raise BaseModelError(
        f"LoRA checkpoint {path}: its base model {recorded} is gone (weights SHA-256 "
        f"{reference['sha256'][:16]}...); put the same model back there, or set "
        f"{BASE_ENV}=DIR to a copy of it (its weights are checked against that hash)"
    )


def save_merged_model(model: nn.Module, path: Path) -> None:
    """Write the adapter merged into the base weights as a plain transformers model.

    Merges a copy (``merge_and_unload`` on a deep copy), so the policy keeps training
    unchanged; this needs room for a second copy of the model on its device.
    """
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(path)


def _checked_base(path: Path, base_path: str | Path) -> str | Path:
    """``base_path`` through the checks and name resolution of any model given by name or
    directory (``lmgym.policy.packaged.local_model_path``): a packaged name becomes its
    cached directory, and a damaged or pickled weight file, or a misspelled packaged
    name, is one line naming the adapter, its base and the fix.
    """
    from lmgym.policy.packaged import local_model_path

    try:
        return local_model_path(base_path)
    except (ValueError, FileNotFoundError) as exc:
        raise type(exc)(f"adapter {path}: its base model {base_path}: {exc}") from None


def load_adapter_model(
    path: Path, dtype: torch.dtype, device: torch.device | str
) -> tuple[nn.Module, str | Path]:
    """Base model plus the trainable adapter saved at ``path``, and where the base came from.

    The base comes from ``path/base`` (an lmgym checkpoint) or, for a plain peft
    adapter directory, from the ``base_model_name_or_path`` of its config.
    """
    peft = require_peft(f"loading the adapter at {path}")
    base_path: str | Path = path / BASE_DIR
    reference = None
    if (path / BASE_REFERENCE).is_file() and not Path(base_path).is_dir():
        reference = json.loads((path / BASE_REFERENCE).read_text())
        base_path = _referenced_base(path, reference)
    elif not Path(base_path).is_dir():
        base_path = peft.PeftConfig.from_pretrained(path).base_model_name_or_path
        if not base_path:
            raise FileNotFoundError(
                f"{path} holds an adapter without its base model: no {BASE_DIR}/ directory "
                f"and no base_model_name_or_path in {ADAPTER_CONFIG}"
            )
    base_path = _checked_base(path, base_path)
    try:  # a referenced base is read as safetensors only: a checkpoint never unpickles
        base = AutoModelForCausalLM.from_pretrained(
            base_path, dtype=dtype, **({"use_safetensors": True} if reference else {})
        )
    except OSError as exc:
        if reference is None:
            raise
        raise BaseModelError(
            f"LoRA checkpoint {path}: cannot load its base model from {base_path} ({exc}); "
            f"set {BASE_ENV}=DIR to a copy of {reference['name_or_path']}"
        ) from None
    if reference is not None:
        digest = state_sha256(base.state_dict())
        if digest != reference["sha256"]:
            raise BaseModelError(
                f"LoRA checkpoint {path}: the base model at {base_path} is not the one it was "
                f"trained on (weights SHA-256 {digest[:16]}..., recorded "
                f"{reference['sha256'][:16]}... for {reference['name_or_path']} in "
                f"{reference.get('dtype', '?')}); pass the same model ({BASE_ENV}=DIR)"
            )
    with _peft_wrapping():
        try:
            model = peft.PeftModel.from_pretrained(base, path, is_trainable=True)
        except RuntimeError as exc:
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            raise AdapterMismatchError(_adapter_mismatch(path, exc)) from None
    model = model.to(device)
    if reference is not None:  # saved again, it names the same base (where it is now)
        model._lmgym_base_reference = {
            **reference,
            "name_or_path": str(_durable_name(str(base_path)) or base_path),
        }
    elif Path(base_path) == path / BASE_DIR:
        keep_base_weights(model)  # a base that lives inside a checkpoint goes when it is pruned
    return model, base_path
