"""`lmgym bench` on a pretrained model (issue 38): LoRA and the pretrained defaults,
equal budgets (iterations or wall time), base and trained models evaluated on held-out
prompts, your own ``--prompts/--reward`` task, and a killed bench that continues where
it stopped. A tiny Llama with the character tokenizer stands in for the real model."""

from __future__ import annotations

import json
import sys
import textwrap

import gymnasium as gym
import pytest

from lmgym.bench import run as bench
from lmgym.bench.run import BenchSpec, BenchSpecChangedError, run_bench, run_jobs
from lmgym.bench.spec import MAX_TIME_ITERATIONS
from lmgym.cli import main
from lmgym.training.pretrained import PRETRAINED_DEFAULTS

pytest.importorskip("matplotlib")
TASK = "lmgym/Arithmetic-v0"  # a held-out split and a verifier (pass@k)
SMALL = ["--seeds", "0", "--iterations", "2", "--num-prompts", "2", "--workers", "0"]
SMALL += ["--eval-prompts", "2", "--eval-samples", "2"]


def lm_spec(model, **changes) -> BenchSpec:
    """Two runs on the tiny Llama with LoRA, evaluated on two held-out prompts."""
    spec = BenchSpec(agents=("grpo", "rloo"), tasks=(TASK,), seeds=(0,), iterations=2,
                     num_prompts=2, group_size=2, workers=0, model=str(model), lora_r=4,
                     evaluate=True, eval_prompts=2, eval_samples=2)  # fmt: skip
    return spec.replace(**changes)


def test_a_pretrained_model_trains_lora_with_the_pretrained_defaults_and_is_evaluated(
    tiny_llama, tmp_path
):
    out = tmp_path / "bench"
    args = ["bench", "--model", str(tiny_llama), "--lora-r", "4", "--agents", "grpo,rloo"]
    assert main([*args, "--tasks", TASK, *SMALL, "--out", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert (
        "| agent | base (greedy / sampled / pass@2) | trained (greedy / sampled / pass@2) "
        "| gain (greedy / sampled / pass@2) | reached / kept | iterations | s/it "
        "| peak RSS (MiB) |" in readme
    )
    assert "Held-out evaluation (2 prompts, split eval):" in readme
    assert "kept 0/1); held-out greedy " in readme  # the summary's cell
    assert "training a fresh LoRA adapter (r 4, alpha 32, on q_proj k_proj v_proj o_proj)" in readme
    assert "--lora-r 4" in readme and "| grpo | " in readme and "| rloo | " in readme
    assert (out / "Arithmetic.png").read_bytes()[:4] == b"\x89PNG"
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 2
    for run in runs:
        assert run["group_size"] == PRETRAINED_DEFAULTS.group_size  # 8: --model's default
        assert run["overrides"]["learning_rate"] == PRETRAINED_DEFAULTS.learning_rate_lora
        assert run["overrides"]["beta"] == 0.0 and run["lora_r"] == 4
        for which in ("trained_eval", "base_eval"):
            greedy, sampled = run[which]["greedy"], run[which]["sampled"]
            assert greedy["samples_per_prompt"] == 1 and sampled["samples_per_prompt"] == 2
            assert sampled["split"] == "eval" and sampled["pass_at_k"] is not None
    # The base model is evaluated once per (task, seed), and both agents compare to it.
    assert [p.name for p in (out / "base").iterdir()] == ["lmgym_Arithmetic-v0__seed0.json"]
    assert runs[0]["base_eval"] == runs[1]["base_eval"]


def test_a_killed_bench_continues_where_it_stopped(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "bench"
    spec = lm_spec(tiny_llama)
    real_job, real_base = bench.run_job, bench.run_base_eval
    calls: list[str] = []

    def killed_after_one(job):
        if calls:
            raise KeyboardInterrupt  # the bench is killed during its second run
        calls.append(job["agent"])
        return real_job(job)

    monkeypatch.setattr(bench, "run_job", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_bench(spec, out, log=None)
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        "lmgym_Arithmetic-v0__grpo__seed0.json"
    ]
    assert not (out / "README.md").exists() and (out / "bench_spec.json").exists()
    first = json.loads((out / "runs" / "lmgym_Arithmetic-v0__grpo__seed0.json").read_text())

    # Another spec in the unfinished bench is refused, in one line.
    with pytest.raises(BenchSpecChangedError, match=r"iterations 2 -> 3") as refused:
        run_bench(spec.replace(iterations=3), out, log=None)
    assert "\n" not in str(refused.value) and "--overwrite" in str(refused.value)

    # The same spec continues: only the missing run, and no second base evaluation.
    ran, based = [], []
    monkeypatch.setattr(bench, "run_job", lambda job: ran.append(job["agent"]) or real_job(job))
    monkeypatch.setattr(bench, "run_base_eval", lambda job: based.append(job) or real_base(job))
    lines: list[str] = []
    run_bench(spec.replace(workers=0), out, log=lines.append)
    assert ran == ["rloo"] and based == []
    assert "resuming in" in lines[1] and "1 of 2 runs and 1 base evaluations" in lines[1]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(r["agent"] for r in runs) == ["grpo", "rloo"]
    kept = next(r for r in runs if r["agent"] == "grpo")
    assert kept["wall_s"] == first["wall_s"]  # read back, not run again

    # A finished bench is not rerun; --overwrite starts over.
    with pytest.raises(bench.BenchOutputExistsError, match="already holds results"):
        run_bench(spec, out, log=None)
    ran.clear()
    run_bench(spec, out, overwrite=True, log=None)
    assert sorted(ran) == ["grpo", "rloo"] and len(based) == 1


def test_the_cli_refuses_another_spec_in_one_line(tiny_llama, tmp_path, capsys):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench_spec.json").write_text(json.dumps({"iterations": 5}))
    args = ["bench", "--model", str(tiny_llama), "--agents", "grpo", "--tasks", TASK, *SMALL]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmgym bench: error: bench output {out} holds unfinished runs of")
    assert err.count("\n") == 1


def test_a_wall_time_budget_bounds_every_run(tmp_path):
    spec = BenchSpec(agents=("grpo",), tasks=("lmgym/TargetString-v0",), seeds=(0,),
                     max_time="1s", num_prompts=2, group_size=2, workers=0)  # fmt: skip
    spec.check()
    assert spec.iterations_for("lmgym/TargetString-v0") == MAX_TIME_ITERATIONS
    assert spec.budget_text("lmgym/TargetString-v0") == "1s of wall time"
    (result,), _ = run_jobs(spec, log=None)
    assert 1 <= len(result["history"]) < MAX_TIME_ITERATIONS
    assert result["wall_s"] < 3.0 and "trained_eval" not in result


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_time": "soon"}, "max_time='soon': expected a positive duration"),
        ({"lora_r": 4}, "lora_r=4 needs --model"),
        ({"eval_samples": 0}, "eval_samples"),
        ({"prompts": "x.jsonl"}, "needs reward too"),
    ],
)
def test_bad_budgets_and_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        BenchSpec.quick().replace(**changes).check()


REWARD = """
def exact_answer(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""


def test_your_own_prompts_and_reward(tiny_llama, tmp_path, monkeypatch):
    (tmp_path / "bench_rewards.py").write_text(textwrap.dedent(REWARD))
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "bench"
    args = ["bench", "--model", str(tiny_llama), "--agents", "grpo", *SMALL]
    args += ["--prompts", "sums.jsonl", "--reward", "bench_rewards:exact_answer"]
    try:
        assert main([*args, "--out", str(out)]) == 0
    finally:
        sys.modules.pop("bench_rewards", None)
        gym.registry.pop("prompts/sums-v0", None)
    readme = (out / "README.md").read_text()
    assert (
        "## prompts/sums-v0" in readme and "Held-out evaluation (2 prompts, split eval)" in readme
    )
    assert f"--prompts {tmp_path / 'sums.jsonl'} --reward bench_rewards:exact_answer" in readme
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["task"] == "prompts/sums-v0" and run["base_eval"]["greedy"]["split"] == "eval"


def test_the_tiny_model_bench_evaluates_held_out_with_eval():
    spec = BenchSpec.quick().replace(
        agents=("grpo",), tasks=("lmgym/Reverse-v0",), iterations=1, evaluate=True,
        eval_prompts=2, eval_samples=2, num_prompts=2, group_size=2,
    )  # fmt: skip
    (result,), _ = run_jobs(spec, log=None)
    for which in ("base_eval", "trained_eval"):
        assert result[which]["sampled"]["split"] == "eval"
        assert result[which]["greedy"]["num_prompts"] == 2
