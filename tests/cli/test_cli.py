"""`lmgym train / eval / bench` in-process: smoke runs, resume equality, config files, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import QUIET_CLI as QUIET  # small evaluations, no periodic printing

from lmgym.agents import ALGORITHMS, GRPOConfig
from lmgym.bench.run import load_results
from lmgym.cli import main
from lmgym.training.logger import read_progress


def train(*args: str) -> int:
    return main(["train", *QUIET, *args])


def evals(run: Path) -> list[dict]:
    """eval.jsonl's records."""
    return [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]


def metric_rows(run: Path) -> list[dict[str, float]]:
    """progress.csv without the wall-clock columns."""
    return [
        {k: v for k, v in row.items() if not k.startswith("time/")}
        for row in read_progress(run / "progress.csv")
    ]


# ------------------------------------------------------------------ train
def test_train_writes_a_complete_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    rc = train(
        "--iterations", "4", "--run-dir", str(run), "--sample-every", "2", "--eval-every", "2",
        "--save-every", "2", "--log-interval", "2",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.rstrip().splitlines()
    assert lines[-3].startswith("reward before: ") and "   after: " in lines[-3]
    assert "(4 iterations in " in lines[-3]
    assert lines[-2].startswith("  reward ") and " -> " in lines[-2]
    assert "[samples @ 2]" in out and "[eval @ 4]" in out
    assert "| reward_mean " in out  # the SB3 stdout table, every --log-interval iterations

    config = json.loads((run / "config.json").read_text())
    assert config["algo"] == "grpo" and config["run"]["iterations"] == 4
    rows = read_progress(run / "progress.csv")
    assert [row["iteration"] for row in rows] == [1.0, 2.0, 3.0, 4.0]
    assert {"reward_mean", "policy_loss", "completion_length", "tokens_generated"} <= set(rows[0])
    assert "eval/pass@2" in rows[1] and "eval/pass@2" not in rows[0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["iteration"] for s in samples} == {2, 4} and samples[0]["prompt"] == "say hello:"
    records = [(e["iteration"], e.get("at")) for e in evals(run)]
    assert records == [(0, "start"), (2, None), (4, None), (4, "end")]
    assert evals(run)[-1]["reward_mean"] == pytest.approx(float(lines[-3].split()[4]), abs=1e-3)
    # The before/after evaluations say what they do, before they do it.
    assert "evaluating before training (iteration 0): 2 prompts x 2 samples, split " in out
    assert "evaluating after training (iteration 4): 2 prompts x 2 samples, split " in out
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "iter_000004"
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == [
        "iter_000002",
        "iter_000004",
    ]
    assert (checkpoints / "iter_000004" / "agent" / "policy" / "model.safetensors").is_file()
    pytest.importorskip("tensorboard")
    assert list(run.glob("events.out.tfevents.*"))


def test_default_run_directory_is_under_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train("--iterations", "1") == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("grpo-TargetString-")
    assert f"run directory: runs/{run.name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "algo_args",
    [["--algo", "ppo"], ["--algo", "reinforce", "--baseline", "ema"], ["--beta", "0.05"]],
    ids=["ppo", "reinforce-ema", "grpo-kl"],
)
def test_resumed_run_equals_an_uninterrupted_one(tmp_path, algo_args):
    # Reverse has many prompts, so a prompt stream that did not resume would show.
    common = [*algo_args, "--task", "lmgym/Reverse-v0", "--sample-every", "2", "--eval-every", "3"]
    common += ["--save-every", "2"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert train(*common, "--iterations", "5", "--run-dir", str(whole)) == 0
    assert train(*common, "--iterations", "3", "--run-dir", str(split)) == 0
    assert main(["resume-check"]) == 2  # an unknown command is refused, not run
    assert train("--resume", str(split), "--iterations", "5") == 0

    assert metric_rows(split) == metric_rows(whole)
    assert len(metric_rows(whole)) == 5
    assert (split / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    periodic = [e for e in evals(whole) if "at" not in e]
    assert periodic and [e for e in evals(split) if "at" not in e] == periodic
    # Each session's start and end evaluations are recorded: the resumed run has two sessions.
    assert [(e["iteration"], e["at"]) for e in evals(whole) if "at" in e] == [
        (0, "start"),
        (5, "end"),
    ]
    assert [(e["iteration"], e["at"]) for e in evals(split) if "at" in e] == [
        (0, "start"), (3, "end"), (3, "start"), (5, "end"),
    ]  # fmt: skip
    end_3, start_3 = (e for e in evals(split) if e["iteration"] == 3 and "at" in e)
    assert {**start_3, "at": "end"} == end_3  # the same evaluation: same weights and seed


def test_a_resume_takes_its_start_evaluation_from_the_end_record(tmp_path, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run)) == 0
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "3") == 0
    out = capsys.readouterr().out
    assert "evaluating before training" not in out
    assert "(the end evaluation of the session before, from eval.jsonl)" in out
    assert train("--resume", str(run), "--iterations", "4", "--eval-samples", "3") == 0
    assert "evaluating before training (iteration 3): 2 prompts x 3 samples" in (
        capsys.readouterr().out
    )  # other settings: evaluated again


def test_resume_from_an_older_checkpoint_drops_the_rows_after_it(tmp_path):
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert train("--iterations", "4", "--run-dir", str(whole), "--keep-checkpoints", "0") == 0
    assert train("--iterations", "4", "--run-dir", str(run), "--save-every", "2") == 0
    assert train("--resume", str(run / "checkpoints" / "iter_000002")) == 0
    assert metric_rows(run) == metric_rows(whole)


def test_resume_refuses_to_change_what_defines_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "1", "--run-dir", str(run)) == 0
    capsys.readouterr()
    assert train("--resume", str(run), "--learning-rate", "0.5") == 2
    assert capsys.readouterr().err.strip() == (
        "lmgym train: error: --resume: --learning-rate 0.5 differs from the run's "
        f"{GRPOConfig().learning_rate}; a resumed run keeps its agent config (start a new run to change it)"
    )
    assert train("--resume", str(run), "--group-size", "4") == 2
    assert "--group-size 4 differs from the run's 16" in capsys.readouterr().err


def test_early_stop_at_threshold(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["--early-stop", "--stop-threshold", "0", "--stop-window", "2"]
    assert train("--iterations", "10", "--run-dir", str(run), *args) == 0
    out = capsys.readouterr().out
    assert "early stop at iteration 2: mean reward_mean over the last 2 iterations" in out
    assert len(read_progress(run / "progress.csv")) == 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000002"


def test_custom_callback_from_the_command_line(tmp_path, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(
        "seen = []\ndef record(agent, metrics):\n    seen.append(agent.iteration)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    assert (
        train("--iterations", "3", "--run-dir", str(run), "--callback", "my_callbacks:record") == 0
    )
    import my_callbacks

    assert my_callbacks.seen == [1, 2, 3]


# ------------------------------------------------------------ config file
def test_config_file_yaml_and_flags_override_it(tmp_path):
    pytest.importorskip("yaml")
    config = tmp_path / "run.yaml"
    config.write_text(
        "algo: rloo\niterations: 5\nlearning-rate: 2.0e-3\nenv_kwargs: {reward_mode: per_token}\n"
    )
    run = tmp_path / "run"
    assert train("--config", str(config), "--iterations", "2", "--run-dir", str(run)) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["algo"] == "rloo"
    assert saved["run"]["iterations"] == 2  # the flag wins
    assert saved["run"]["env_kwargs"] == {"reward_mode": "per_token"}
    assert saved["agent"]["learning_rate"] == 2e-3


def test_a_saved_config_json_repeats_the_run(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train("--algo", "cispo", "--iterations", "2", "--run-dir", str(first)) == 0
    assert train("--config", str(first / "config.json"), "--run-dir", str(second)) == 0
    assert metric_rows(second) == metric_rows(first)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"learning_rate": "fast"}, "learning_rate='fast': expected a number"),
        ({"iterations": 2.5}, "iterations=2.5: expected an integer"),
        (
            {"loss_aggregation": "sum"},
            "loss_aggregation='sum' is not one of ['seq-mean-token-mean', 'token-mean', "
            "'seq-mean-token-sum-norm']",
        ),
        ({"learning_rat": 0.1}, "unknown field(s) learning_rat; valid fields: adam_betas,"),
    ],
)
def test_config_file_errors_name_the_field(tmp_path, capsys, content, message):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps(content))
    assert train("--config", str(config), "--run-dir", str(tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmgym train: error: --config {config}: ")
    assert message in err
    assert not (tmp_path / "run").exists()


# -------------------------------------------------------------- bad input
def test_unknown_algo_lists_the_valid_ones(capsys):
    assert main(["train", "--algo", "trpo"]) == 2
    assert capsys.readouterr().err == (
        f"lmgym train: error: unknown --algo 'trpo'; valid: {', '.join(sorted(ALGORITHMS))}\n"
    )


def test_unknown_task_lists_the_registered_ones(capsys, tmp_path):
    assert main(["train", "--task", "lmgym/Nope-v0", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "lmgym train: error: unknown task 'lmgym/Nope-v0'; registered: lmgym/Arithmetic-v0, "
    )
    assert "lmgym/TargetString-v0" in err


def test_a_flag_of_the_wrong_type_names_the_flag(capsys):
    assert main(["train", "--learning-rate", "abc"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lmgym train: error: argument --learning_rate/--learning-rate: "
        "learning_rate='abc': expected a number"
    )
    assert main(["train", "--whiten-advantages", "maybe"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lmgym train: error: argument --whiten_advantages/--whiten-advantages: "
        "whiten_advantages='maybe': expected true or false"
    )


def test_an_existing_run_directory_needs_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "1", "--run-dir", str(run)) == 0
    capsys.readouterr()
    assert train("--iterations", "1", "--run-dir", str(run)) == 2
    assert capsys.readouterr().err == (
        f"lmgym train: error: run directory {run} already exists; pass --overwrite to replace "
        f"it or --resume {run} to continue it\n"
    )
    assert train("--iterations", "2", "--run-dir", str(run), "--overwrite") == 0
    assert len(read_progress(run / "progress.csv")) == 2


def test_overwrite_never_deletes_a_directory_that_is_not_a_run(tmp_path, capsys):
    precious = tmp_path / "data"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    assert train("--run-dir", str(precious), "--overwrite") == 2
    assert "is not an lmgym run" in capsys.readouterr().err
    assert (precious / "thesis.tex").read_text() == "keep me"


def test_help_lists_config_fields_with_their_docstrings(capsys):
    assert main(["train", "--algo", "ppo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--gae-lambda FLOAT" in out and "PPOConfig fields" in out
    assert "Write a checkpoint every N iterations" in out


# ------------------------------------------------------------------- eval
def test_eval_reports_reward_pass_at_k_and_length(tmp_path, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run)) == 0
    capsys.readouterr()
    out_json = tmp_path / "eval.json"
    assert (
        main(["eval", "--run", str(run), "--num-prompts", "3", "-k", "4", "--json", str(out_json)])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(
        f"eval of {run / 'checkpoints' / 'iter_000002'} on lmgym/TargetString-v0 "
        "(split training prompts (no held-out split)): 3 prompts x 4 samples"
    )
    for label in ("mean reward", "pass@1", "pass@4", "mean length"):
        assert f"  {label}" in out
    result = json.loads(out_json.read_text())
    assert result["num_prompts"] == 3 and result["samples_per_prompt"] == 4
    assert 0.0 <= result["pass_at_1"] <= result["pass_at_k"] <= 1.0


def evaluate(model: Path, task: str, num_prompts: int, k: int) -> int:
    """``lmgym eval --model MODEL --task TASK --num-prompts N -k K``; its exit status."""
    return main(
        ["eval", "--model", str(model), "--task", task, "--num-prompts", str(num_prompts),
         "-k", str(k)]
    )  # fmt: skip


def test_eval_a_model_directory_on_a_task_with_a_held_out_split(tmp_path, capsys):
    from lmgym.policy import save_tiny

    model = save_tiny(tmp_path / "tiny")
    assert evaluate(model, "lmgym/Reverse-v0", num_prompts=5, k=2) == 0
    out = capsys.readouterr().out
    assert "on lmgym/Reverse-v0 (split eval): 5 prompts x 2 samples" in out
    assert "pass@2" in out
    assert evaluate(model, "lmgym/LengthControl-v0", num_prompts=2, k=2) == 0
    assert "pass@k          -  (no verifier for this task" in capsys.readouterr().out


# ------------------------------------------------------------------ bench
def test_bench_quick_writes_table_curves_and_results(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--out", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert (
        "| agent | final reward (mean ± std) | reached | kept | plateau | iterations to solved "
        in readme
    )
    assert "| grpo | " in readme and "| rloo | " in readme
    assert (out / "TargetString.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 and len(results["runs"][0]["history"]["reward_mean"]) == 6
    runs, _ = load_results(out / "results.json")  # the curves come back as rows
    assert [row["iteration"] for row in runs[0]["history"]] == [1, 2, 3, 4, 5, 6]
    capsys.readouterr()
    assert main(["bench", "--quick", "--out", str(out)]) == 2
    assert "already holds results; pass --overwrite" in capsys.readouterr().err


def test_bench_unknown_names_list_the_valid_ones(tmp_path, capsys):
    assert main(["bench", "--agents", "grpo,a2c", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"lmgym bench: error: unknown agent(s) a2c; valid: {', '.join(sorted(ALGORITHMS))} "
        "(or all)\n"
    )
    assert main(["bench", "--tasks", "lmgym/Chess-v0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(
        "lmgym bench: error: unknown task(s) lmgym/Chess-v0; valid: lmgym/Arithmetic-v0,"
    )
