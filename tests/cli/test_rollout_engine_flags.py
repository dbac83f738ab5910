"""``--rollout-engine {lmgym,vllm}`` and ``--vllm-kv-cache-gib`` on train, eval and bench:
the same choices and defaults everywhere (from ``TrainConfig``), and one-line errors."""

from __future__ import annotations

import importlib.util

import pytest

from lmgym.bench.spec import BenchSpec
from lmgym.cli import main
from lmgym.training.run import TrainConfig


@pytest.mark.parametrize("command", ["train", "eval", "bench"])
def test_every_command_offers_both_engines_with_the_run_configs_default(command, capsys):
    # The parser, in this process (a `python -m lmgym` process costs ~7 s of imports per
    # command).
    assert main([command, "--help"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "--rollout-engine {lmgym,vllm}" in flat or "--rollout_engine {lmgym,vllm}" in flat
    assert "vllm_kv_cache_gib" in flat.replace("-", "_")
    assert "pip install 'lmgym[vllm]'" in flat


def test_vllm_without_vllm_installed_names_the_install_command(monkeypatch):
    from lmgym.policy import vllm_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(
        vllm_engine.importlib.util, "find_spec", lambda name: None if name == "vllm" else real(name)
    )
    with pytest.raises(ValueError, match=r"rollout_engine=vllm needs vLLM.*pip install"):
        TrainConfig(rollout_engine="vllm").check()
    TrainConfig(rollout_engine="lmgym").check()  # the default needs nothing


def test_a_kv_cache_of_no_memory_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"vllm_kv_cache_gib=0.0: must be > 0"):
        TrainConfig(vllm_kv_cache_gib=0.0).check()


def test_bench_jobs_carry_the_engine_only_when_it_is_not_the_default():
    plain = BenchSpec.quick()
    assert all("rollout_engine" not in job for job in plain.jobs())
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    chosen = plain.replace(rollout_engine="vllm", vllm_kv_cache_gib=1.5)
    assert {(j["rollout_engine"], j["vllm_kv_cache_gib"]) for j in chosen.jobs()} == {("vllm", 1.5)}


@pytest.mark.heavy
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
# In this process, which imports vLLM's attention backend to read its head sizes: on the
# worker of the vLLM engine's tests, whose process imports vLLM anyway.
@pytest.mark.xdist_group("vllm")
def test_vllm_on_the_tiny_model_is_a_one_line_error_naming_the_fix(tmp_path, capsys):
    # vLLM's CPU attention has no kernel for the tiny GPT-2's head size (16).
    argv = ["--rollout-engine", "vllm", "--iterations", "1", "--no-progress"]
    assert main(["train", *argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lmgym train: error")]
    assert len(lines) == 1, err
    assert "head sizes" in lines[0] and "rollout_engine='lmgym'" in lines[0]
