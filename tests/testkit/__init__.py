"""Helpers shared by the test suite: tiny policies, state snapshots, scripted
multi-turn play, the decode-mode fixture body, example loading, quiet CLI runs and
checkpoint tampering.

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so a test module imports
``from testkit import ...`` (the suite runs with ``--import-mode=importlib``, where
test folders are not packages). Helpers that need an optional dependency live in a
submodule of their own (``testkit.sb3``), so importing this one stays cheap.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from lmgym.persistence import write_manifest
from lmgym.policy import CausalLMPolicy, compiled_decode, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

QUIET_CLI = [
    "--no-progress",
    "--log-interval",
    "0",
    "--eval-prompts",
    "2",
    "--eval-samples",
    "2",
    "--samples",
    "2",
]
"""``lmgym train`` flags for small evaluations and no periodic printing: each run
takes well under a second."""

CHEAP_TASKS = [
    "lmgym/TargetString-v0",
    "lmgym/Reverse-v0",
    "lmgym/Sort-v0",
    "lmgym/CopyRule-v0",
    "lmgym/Arithmetic-v0",
    "lmgym/ArithmeticProcess-v0",
    "lmgym/LengthControl-v0",
    "lmgym/WordProblem-v0",
]
"""Registered tasks cheap enough to build in every case of a parametrized test."""


# ------------------------------------------------------------------ tiny policies
def biased_head_policy(
    tokenizer: Any, biases: Mapping[int, float], seed: int = 0, **policy_kwargs: Any
) -> CausalLMPolicy:
    """A tiny GPT-2 (``make_tiny_model(len(tokenizer), seed=seed)``) whose LM head,
    tied to the input embeddings, gains a bias: ``biases[token_id]`` for the ids named
    (set in the mapping's order), zero elsewhere. ``policy_kwargs`` go to
    ``CausalLMPolicy``."""
    model = make_tiny_model(len(tokenizer), seed=seed)
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    head.weight = old.weight
    with torch.no_grad():
        head.bias.zero_()
        for token_id, bias in biases.items():
            head.bias[token_id] = bias
    model.set_output_embeddings(head)
    return CausalLMPolicy(model, tokenizer, **policy_kwargs)


def eos_biased_policy(
    tokenizer: Any, eos_bias: float = 3.0, seed: int = 0, compile_decode: bool = False
) -> CausalLMPolicy:
    """A tiny policy whose LM head favours EOS, so episodes end at varied lengths."""
    return biased_head_policy(
        tokenizer, {tokenizer.eos_token_id: eos_bias}, seed=seed, compile_decode=compile_decode
    )


def mistral_policy(
    tokenizer: Any, sliding_window: int | None, eos_bias: float, compile_decode: bool = False
) -> CausalLMPolicy:
    """A tiny Mistral (rotary positions, grouped KV heads, ``sliding_window`` as given;
    weights from seed 0) whose untied LM head adds ``eos_bias`` to EOS, so episodes
    end at different steps."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=sliding_window,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = eos_bias
    model.lm_head = head
    return CausalLMPolicy(model, tokenizer, compile_decode=compile_decode)


def decode_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Body of a ``decode`` fixture parametrized over ``"eager"``, ``"fixed_shape"`` and
    ``"compiled"``: yields ``compile_decode`` for the policy under test. In
    ``fixed_shape`` mode the step ``torch.compile`` would compile runs as plain Python;
    in both compiled modes a fallback to eager decoding fails the test instead of
    passing as eager. Use as ``yield from decode_mode(request, monkeypatch)``."""
    if request.param == "fixed_shape":
        monkeypatch.setattr(
            compiled_decode, "compile_step", lambda mode, packed=False: compiled_decode._step
        )
    # dynamo keeps at most recompile_limit graphs per function; a test session
    # compiles the step for many models and shapes (a process rarely does).
    with torch._dynamo.config.patch(recompile_limit=64), warnings.catch_warnings():
        if request.param != "eager":
            warnings.filterwarnings("error", "compile_decode: torch.compile of the decode step")
        yield request.param != "eager"


def collected_and_admission(
    make: Callable[[], tuple[CausalLMPolicy, Any, torch.Generator]], batches: int, seed: int = 3
) -> tuple[list[Any], Any]:
    """The first ``batches`` batches ``lmgym.rollout.collect`` gives on one fresh
    ``(policy, env, generator)`` from ``make`` (``seed`` on the first), and an
    ``AdmissionCollector`` over another fresh triple with the same ``seed``: what a
    test compares, batch for batch."""
    from lmgym.asynchronous.sampler import AdmissionCollector
    from lmgym.rollout import collect

    policy, env, generator = make()
    expected = [
        collect(env, policy, seed=seed if i == 0 else None, generator=generator)
        for i in range(batches)
    ]
    policy, env, generator = make()
    return expected, AdmissionCollector(env, policy, generator, seed=seed)


# ------------------------------------------------------------------ state snapshots
def snapshot(obj: Any) -> Any:
    """Every piece of state an object holds, as comparable values (tensors cloned,
    generators as their state, dataclasses as dicts of their fields)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: snapshot(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [snapshot(v) for v in obj]
    return obj


def assert_same(actual: Any, expected: Any, where: str) -> None:
    """Assert two ``snapshot`` values equal: tensors in dtype and every element, dicts
    key for key, lists item for item; ``where`` names the place in a failure."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


# ------------------------------------------------------------------ scripted turns
def encode_turn(tok: Any, text: str) -> list[int]:
    """A scripted policy turn: the text's ids, then the stop id."""
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def step_scripted_turns(
    env: Any, scripts: Sequence[Sequence[str]], obs: Any = None, sticky_done: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """Step each row of a reset multi-turn ``env`` through its scripted turns
    (``scripts[row]``, each turn encoded by ``encode_turn``; EOS once a script is
    spent) until every row's episode is over or every script is spent.

    A row counts as over when the last step ended it, or, with ``sticky_done``, when
    any step did. ``obs`` is returned as it is if no step runs. Returns ``(returns,
    terminated, truncated, obs)``: the summed rewards and the last step's flags."""
    tok = env.tokenizer
    streams = [[i for text in turns for i in encode_turn(tok, text)] for turns in scripts]
    returns = torch.zeros(env.num_envs)
    done = torch.zeros(env.num_envs, dtype=torch.bool)
    position = 0
    while not bool(done.all()) and any(position < len(s) for s in streams):
        actions = [s[position] if position < len(s) else tok.eos_token_id for s in streams]
        obs, reward, terminated, truncated, _ = env.step(torch.tensor(actions))
        returns += reward
        done = (done | terminated | truncated) if sticky_done else (terminated | truncated)
        position += 1
    return returns, terminated, truncated, obs


# ------------------------------------------------------------------ examples, CLI
def skip_module_unless_found(module: str) -> None:
    """Skip the calling test module whole, as ``pytest.importorskip(module)`` would, when
    ``module`` is not installed; found, not imported, so collection (on every xdist
    worker) does not pay for a heavy extra the module imports where it uses it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing too
        found = False
    if not found:
        pytest.skip(f"could not import {module!r}: not installed", allow_module_level=True)


def import_script(path: Path, name: str) -> ModuleType:
    """Import the script at ``path`` (an example, a benchmark) as a fresh module named
    ``name``, registered in ``sys.modules`` (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single stderr line captured so far (asserts there is exactly one), without
    its newline."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err[:-1]


def refused_line(
    command: Callable[..., int], capsys: pytest.CaptureFixture[str], *args: str
) -> str:
    """Run ``command(*args)`` (a CLI entry point such as the ``train`` fixture), assert it
    refuses (exit status 2) and return the one stderr line it wrote (``one_line``)."""
    capsys.readouterr()
    assert command(*args) == 2
    return one_line(capsys)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts (``python -m lmgym``, torchrun and
    its ranks): one OpenMP thread, the repository root first on ``PYTHONPATH``, plus
    ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node NPROC ARGS`` as this interpreter runs it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*command, "--nproc-per-node", str(nproc), *args]


def run_lmgym_train(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m lmgym train ARGS`` in a child process run from the repository root
    (``child_env``), its output captured."""
    command = [sys.executable, "-m", "lmgym", "train", *args]
    return subprocess.run(
        command, env=child_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def empty_model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Name an empty model cache under ``tmp_path`` by ``LMGYM_MODEL_CACHE`` and return
    it. Asserts ``cache_root()`` follows the variable first, so that a cache_root
    ignoring it fails here instead of letting a test convert into, or clear, the
    user's real cache."""
    from lmgym.policy.packaged import cache_root

    root = tmp_path / "cache"
    monkeypatch.setenv("LMGYM_MODEL_CACHE", str(root))
    assert cache_root() == root
    return root


# ------------------------------------------------------------------ checkpoints
def reseal(checkpoint: Path) -> None:
    """Recompute both manifests of a CLI checkpoint, as anyone who can write the
    directory can."""
    write_manifest(checkpoint / "agent")
    write_manifest(checkpoint, ["trainer_state.pt", "agent/manifest.json"])


def edit_agent_config(checkpoint: Path, **changes: Any) -> dict[str, Any]:
    """Set ``changes`` in a CLI checkpoint's ``agent/agent_config.json`` (written back
    with indent 2, manifests not recomputed); returns the config as it was."""
    config_file = checkpoint / "agent" / "agent_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, **changes}, indent=2))
    return config
