"""The benchmark scripts start (``--help``), time lmgym's phases through its labels,
and build the workloads they claim."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = [
    "rollout",
    "continuous",
    "trl_iteration",
    "memory",
    "sb3_ppo",
    "gpu",
    "data_parallel",
    "update",
    "async",
    "ragged",
    "vllm_engine",
    "multi_turn_cost",
    "guess_bisect",
]
sys.path.insert(0, str(BENCHMARKS))

import harness as h  # noqa: E402
from testkit import import_script  # noqa: E402


def load(name: str) -> ModuleType:
    return import_script(BENCHMARKS / f"{name}.py", f"benchmark_{name}")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_imports_and_prints_its_help(name, capsys):
    module = load(name)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse rewraps the description
    first_words = " ".join(module.__doc__.split()[:5])
    assert out.startswith("usage: ") and first_words in out


def test_trl_iteration_profile_times_every_agent_phase(tmp_path):
    """The profile used to wrap private agent methods that no longer exist, so its
    update rows read 0; it now reads lmgym's labels, which every update enters."""
    trl = load("trl_iteration")
    path = trl.build_checkpoint(tmp_path / "small", "small")
    phases = trl.profile_lmgym(path, "grpo", iters=1)
    for label in (
        "prepare",
        "loss",
        "backward",
        "optimizer",
        "metrics",
        "collect/act/decode/trunk",
    ):
        seconds, calls = phases[label]
        assert seconds > 0 and calls >= 1, label


def test_trl_iteration_report_shows_issue_18s_targets():
    trl = load("trl_iteration")
    fast, slow = trl.Run([0.25], [0.625], [0.5], 0.0), trl.Run([0.5], [0.75], [0.5], 0.0)
    results = [
        trl.Result("GRPO, GPT-2 2L/128d, 2 thread(s)", [fast], "grpo", "small", 2),
        trl.Result("RLOO, GPT-2 6L/384d, 1 thread(s)", [slow], "rloo", "large", 1),
    ]
    args = argparse.Namespace(compile_decode=False, warmup=1, iters=1, processes=1, profile_iters=0)
    lines = trl.report(results, args, "cmd", 1.0)
    start = lines.index("## Targets (issue 18's for GRPO, RLOO held to the same; 2 torch threads)")
    assert lines[start + 1 :] == [
        "",
        "- GRPO, GPT-2 2L/128d, 2 thread(s): 2.50x lmgym vs TRL (target >= 2.5x) -> MET",
        "- RLOO, GPT-2 6L/384d, 1 thread(s): 1.50x lmgym vs TRL (target >= 2x) -> NOT MET"
        " (for information: not the issue's setting)",
    ]


def test_update_batch_is_bimodal_with_exact_lengths(tokenizer):
    update = load("update")
    batch = update.bimodal_batch(tokenizer)
    rows, short = update.PROMPTS * update.GROUP, torch.arange(64) % 2 == 0
    assert batch.completion_ids.shape == (rows, update.NEW_TOKENS)
    assert batch.lengths.tolist() == [3, 128] * 32
    assert torch.equal(batch.completion_mask.sum(1), batch.lengths)
    assert torch.equal(batch.terminated, short) and torch.equal(batch.truncated, ~short)
    assert bool((batch.completion_ids[short, 2] == tokenizer.eos_token_id).all())
    assert bool((batch.completion_ids[short, 3:] == tokenizer.pad_token_id).all())
    assert not bool((batch.completion_ids[~short] == tokenizer.eos_token_id).any())
    # One prompt per group, a reward only at each row's last token.
    assert torch.equal(batch.prompt_ids[::8].repeat_interleave(8, 0), batch.prompt_ids)
    assert not bool((batch.rewards != 0)[~batch.dones].any())
    assert torch.equal(batch.dones.sum(1), torch.ones(rows, dtype=torch.long))


@pytest.mark.parametrize("name", ["rollout", "continuous", "trl_iteration", "gpu"])
def test_lmgym_side_can_decode_compiled(name, capsys):
    with pytest.raises(SystemExit):
        load(name).main(["--help"])
    assert "--compile-decode" in capsys.readouterr().out


def test_a_compile_fallback_fails_the_run_instead_of_timing_eager_decoding():
    workloads = load("workloads")
    eager = type("Policy", (), {"compile_decode": False})()
    workloads.check_compiled(eager, requested=False)
    with pytest.raises(RuntimeError, match="--compile-decode: torch.compile of the decode step"):
        workloads.check_compiled(eager, requested=True)


def test_rollout_report_renders_its_table_and_targets():
    """The report crashed after every measurement: it gave ``harness.table`` a list
    for the header, which takes a ``" | "``-joined string."""
    rollout = load("rollout")
    rows = [
        h.Comparison("rollout, GPT-2 2L/128d, B=64, 16+64 tok", 2000.0, 1000.0, 7, 0.0),
        h.Comparison("env steps, lmgym/TargetString-v0, 256 envs, 64 steps/call", 5e5, 1e4, 5, 0.2),
    ]
    lines = rollout.markdown(rows, "cmd", 10.0, compiled=False)
    start = lines.index(
        "| benchmark | unit | lmgym (median) | baseline | baseline (median) | ratio | repeats "
        "| other CPU load |"
    )
    assert lines[start + 1 : start + 4] == [
        "|---|---|---:|---:|---:|---:|---:|---:|",
        "| rollout, GPT-2 2L/128d, B=64, 16+64 tok | completion tok/s | 2,000 | model.generate "
        "| 1,000 | 2.00x | 7 | 0% |",
        "| env steps, lmgym/TargetString-v0, 256 envs, 64 steps/call | env steps/s | 500,000 "
        "| SyncVectorEnv | 10,000 | 50.00x | 5 | 20% (noisy) |",
    ]
    assert (
        "- rollout >= 1.0x generate (eager decode: issue 7's target), GPT-2 2L/128d: 2.00x -> MET"
        in lines
    )
    assert "- native env >= 20x SyncVectorEnv at 256 envs: 50.0x -> MET" in lines
    assert "- lmgym decode: eager (the default; `--compile-decode` compiles it)" in lines


def test_rollout_target_is_issue_18s_with_a_compiled_decode_and_issue_7s_eager():
    rollout = load("rollout")
    row = h.Comparison("rollout, GPT-2 6L/256d, B=64, 16+64 tok", 1400.0, 1000.0, 7, 0.0)
    assert rollout.verdicts([row], compiled=True) == [
        "- rollout >= 1.5x generate (compiled decode: issue 18's target), GPT-2 6L/256d: "
        "1.40x -> NOT MET"
    ]
    assert rollout.verdicts([row], compiled=False) == [
        "- rollout >= 1.0x generate (eager decode: issue 7's target), GPT-2 6L/256d: 1.40x -> MET"
    ]


def test_rollout_profile_counts_only_the_decode_steps_trunk():
    # Matmuls from Python or from the compiled graph's C++ wrapper, inductor kernels
    # and guard checks count inside a decode step's trunk; the prefill's trunk and
    # the LM head's matmul (outside any trunk) do not.
    from types import SimpleNamespace as Event

    rollout = load("rollout")
    decode = Event(name="lmgym.decode", cpu_parent=Event(name="lmgym.act", cpu_parent=None))
    prefill = Event(name="lmgym.prefill", cpu_parent=decode.cpu_parent)
    trunk, prefill_trunk = (Event(name="lmgym.trunk", cpu_parent=p) for p in (decode, prefill))
    graph = Event(name="## Call CompiledFxGraph abc ##", cpu_parent=trunk)
    cases = [
        ("aoti_torch_cpu_addmm_out", graph, "matmuls"),
        ("aten::addmm", trunk, "matmuls"),
        ("graph_0_cpp_fused_softmax_1", graph, "compiled kernels"),
        ("TorchDynamo Cache Lookup", trunk, "guard checks"),
        ("aten::addmm", prefill_trunk, None),
        ("aten::addmm", decode.cpu_parent, None),
        ("aten::copy_", trunk, None),
    ]
    for name, parent, kind in cases:
        assert rollout.decode_trunk_kind(Event(name=name, cpu_parent=parent)) == kind, name
    with pytest.raises(SystemExit):
        rollout.main(["--profile", "0"])  # CALLS must be >= 1 (omit the flag for none)


def test_ragged_variants_compute_the_dense_step():
    """ragged.py times four attentions of one decode step; the two that read fewer
    columns (row buckets, flex attention's block mask) must give the same hidden
    states as lmgym's dense step (the script asserts it; the run must get there)."""
    ragged = load("ragged")
    args = argparse.Namespace(filled=60, block_size=16, warmup=0, repeats=1, threads=2)
    run = ragged.bench("small", args, 0)
    assert set(run.ms) == set(ragged.VARIANTS) and all(ms > 0 for ms in run.ms.values())
    assert max(run.max_diff.values()) <= ragged.TOLERANCE
    assert 16 < run.mean_columns < 60
