"""Where ``--model`` comes from: a local directory, a packaged model, the Hugging Face
cache, or the Hub.

``resolve_model(model)`` decides before transformers is asked, so a wrong path or
an offline machine fails at once with one line saying what to pass, instead of
after transformers' network retries:

1. an existing directory with a ``config.json`` (a transformers model) or an
   ``adapter_config.json`` (a peft adapter, which ``CausalLMPolicy.from_pretrained``
   loads onto its base) is used as is (a file, or a directory with neither, is an
   error), so ``--model`` takes what ``GRPO("path/or/name", env)`` takes;
2. a packaged model's name (``smollm2-135m-instruct``, ``lmgym.policy.packaged``) is
   its cached transformers directory, converted from the installed package on first
   use (without the package: one line naming the install command; a damaged cache
   or GGUF file, or an ``LMGYM_MODEL_CACHE`` that is not a directory: one line
   naming it and the fix); a bare name close to a packaged one
   (``smollm2-135m-instrct``) is refused at once, naming the close match;
3. something that can only be a path (``./m``, ``/m``, ``~/m``, ``a/b/c``, a
   trailing ``/``) and does not exist is an error naming it;
4. otherwise it is a hub name (``gpt2``, ``org/name``). With ``HF_HUB_OFFLINE`` /
   ``TRANSFORMERS_OFFLINE`` set, or when the Hub does not answer a TCP connect
   within ``PROBE_SECONDS``, the cached snapshot is used if there is one (no
   network at all), else the error says how to pass a local directory. When the
   Hub answers, the name goes to transformers unchanged.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from lmgym.policy.packaged import (
    PACKAGED_MODELS,
    PackagedModelError,
    PackagedModelMissingError,
    close_packaged_names,
    is_packaged_name,
    packaged_model_dir,
)

PROBE_SECONDS = 2.0
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class ModelNotFoundError(FileNotFoundError):
    """``--model`` names neither a local directory nor a hub model this machine can get."""


def hub_offline() -> str | None:
    """The variable that switches the Hub off (``"HF_HUB_OFFLINE=1"``), or ``None``."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name}={os.environ[name]}"
    return None


def hub_endpoint() -> str:
    """The Hub's URL (``HF_ENDPOINT``, default https://huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the Hub opens within ``timeout`` seconds."""
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def cached_snapshot(name: str) -> Path | None:
    """The local snapshot directory of hub model ``name`` in the Hugging Face cache, if any."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an invalid repo id: not cached
        return None
    return Path(found).parent if isinstance(found, str) else None


def _looks_like_path(model: str) -> bool:
    return (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or _HUB_NAME.fullmatch(model) is None  # a trailing "/", a backslash, a space...
    )


def resolve_model(model: str) -> str:
    """A local directory for ``model``, or the hub name when the Hub can be reached.

    Raises:
        ModelNotFoundError: a missing directory, a file, or a hub name that is neither
            cached nor reachable; the message says what to pass instead.
    """
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(
                f"--model {model} is a file; pass a model directory (what save_pretrained "
                "writes) or a hub name"
            )
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelNotFoundError(
                f"--model {model} is not a model directory (no config.json or "
                "adapter_config.json; pass what save_pretrained writes, or a run / checkpoint "
                "to lmgym eval)"
            )
        return str(path)
    if is_packaged_name(model):
        try:
            return str(packaged_model_dir(model))
        except PackagedModelMissingError as exc:
            raise ModelNotFoundError(f"--model {model}: {exc}") from None
        except PackagedModelError as exc:
            raise PackagedModelError(f"--model {model}: {exc}") from None
    close = [] if "/" in model else close_packaged_names(model)
    if close:
        raise ModelNotFoundError(
            f"--model {model}: no such directory, and not a packaged model; did you mean "
            f"--model {close[0]}? (packaged models: {', '.join(sorted(PACKAGED_MODELS))})"
        )
    if _looks_like_path(model):
        raise ModelNotFoundError(
            f"--model {model}: no such directory (pass a directory written by save_pretrained, "
            "or a hub name such as gpt2)"
        )
    offline = hub_offline()
    why = (
        f"downloads are off ({offline})"
        if offline
        else None
        if hub_reachable()
        else f"the Hub ({hub_endpoint()}) did not answer within {PROBE_SECONDS:g} s"
    )
    if why is None:
        return model
    snapshot = cached_snapshot(model)
    if snapshot is not None:
        return str(snapshot)
    raise ModelNotFoundError(
        f"--model {model}: no local directory {model} and not in the Hugging Face cache, and "
        f"{why}; download it where there is a network (e.g. `huggingface-cli download {model} "
        f"--local-dir DIR`) and pass --model DIR"
    )
