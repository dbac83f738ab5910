"""Model and optimisation settings of a run (dtype, checkpointing, LoRA config, merged
export, learning-rate schedules on resume, the logged learning rate) and callbacks that
are not lmgym's (Stable-Baselines3's)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lmgym.agents import ALGORITHMS, GRPOConfig
from lmgym.bench.run import DEFAULT_AGENTS, BenchSpec
from lmgym.cli import main
from lmgym.training import TrainConfig, Trainer
from lmgym.training.logger import read_progress

QUIET = [
    "--no-progress",
    "--log-interval", "0",
    "--eval-prompts", "2",
    "--eval-samples", "2",
    "--samples", "0",
    "--sample-every", "0",
]  # fmt: skip
SMALL = dict(
    eval_prompts=2, eval_samples=2, samples=0, sample_every=0, log_interval=0, no_progress=True
)


def train(*args: str) -> int:
    return main(["train", *QUIET, *args])


def quiet(_: str) -> None:
    pass


# ------------------------------------------------------------------ config
def test_lora_fields_make_a_peft_lora_config():
    peft = pytest.importorskip("peft")
    assert TrainConfig().peft_config() is None
    config = TrainConfig(lora_r=8, model="path/to/llama").peft_config()
    assert isinstance(config, peft.LoraConfig)  # the measured default: alpha 32 on q/k/v/o
    assert (config.r, config.lora_alpha) == (8, 32.0)
    assert config.target_modules == {"q_proj", "k_proj", "v_proj", "o_proj"}
    config = TrainConfig(lora_r=8).peft_config()  # the tiny GPT-2 has no q/k/v/o projections
    assert (config.lora_alpha, config.target_modules) == (32.0, "all-linear")
    named = TrainConfig(lora_r=8, lora_target_modules=["c_attn"]).peft_config()
    assert named.target_modules == {"c_attn"}  # targets given are used as given
    config = TrainConfig(lora_r=4, lora_alpha=8.0, lora_target_modules=["q_proj"]).peft_config()
    assert (config.r, config.lora_alpha, config.target_modules) == (4, 8.0, {"q_proj"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lora_r": -1}, "lora_r=-1: must be >= 0 (0: full fine-tuning)"),
        ({"lora_r": 4, "lora_alpha": 0.0}, "lora_alpha=0.0: must be > 0"),
        ({"lora_r": 4, "lora_target_modules": []}, "lora_target_modules: name at least one"),
        (
            {"dtype": "float16"},
            "dtype=float16 needs a CUDA device (device='cpu'); use bfloat16 or float32",
        ),
    ],
)
def test_bad_model_settings_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**changes).check()


def test_dtype_and_gradient_checkpointing_reach_the_policy_and_stay_on_resume(tmp_path, capsys):
    run = tmp_path / "run"
    config = TrainConfig(
        **SMALL, iterations=1, run_dir=str(run), dtype="bfloat16", gradient_checkpointing=True
    )
    result = Trainer(config, out=quiet).run()
    assert result.agent.policy.autocast_dtype is torch.bfloat16
    assert result.agent.policy.gradient_checkpointing is True
    resumed = Trainer.resume(run, changes={"iterations": 2}, out=quiet).run()
    assert resumed.agent.policy.autocast_dtype is torch.bfloat16
    assert resumed.agent.policy.gradient_checkpointing is True
    capsys.readouterr()
    assert train("--resume", str(run), "--dtype", "float32") == 2
    assert capsys.readouterr().err.startswith(
        "lmgym train: error: --resume: --dtype 'float32' differs from the run's 'bfloat16'; "
    )


def test_save_merged_writes_the_final_model(tmp_path):
    run = tmp_path / "run"
    result = Trainer(
        TrainConfig(**SMALL, iterations=1, run_dir=str(run), save_merged=True), out=quiet
    ).run()
    assert result.merged == run / "merged"
    merged = AutoModelForCausalLM.from_pretrained(result.merged)
    trained = result.agent.policy.model.state_dict()
    assert all(torch.equal(value, trained[key]) for key, value in merged.state_dict().items())


# ---------------------------------------------------------------- schedules
def test_the_learning_rate_is_logged_every_iteration(tmp_path):
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run), "--lr-scheduler-type", "linear") == 0
    # linear from GRPO's rate over the 2 iterations' optimizer steps: half of it after the
    # first iteration's steps, 0 after the second's
    rate = GRPOConfig().learning_rate
    rates = [row["learning_rate"] for row in read_progress(run / "progress.csv")]
    assert rates == pytest.approx([rate / 2, 0.0], abs=1e-12)
    constant = tmp_path / "constant"
    assert train("--iterations", "2", "--run-dir", str(constant)) == 0
    assert [r["learning_rate"] for r in read_progress(constant / "progress.csv")] == [rate, rate]


def test_a_resume_cannot_lengthen_a_decaying_schedule(tmp_path, capsys):
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run), "--lr-scheduler-type", "cosine") == 0
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "3") == 2
    assert capsys.readouterr().err == (
        "lmgym train: error: iterations=3: the run's cosine learning-rate schedule spans 2 "
        "iterations (fixed when the run started) and a resume cannot lengthen it; resume with "
        "--iterations 2 or fewer, or start a new run (with --schedule-iterations N to plan a "
        "longer one)\n"
    )
    assert len(read_progress(run / "progress.csv")) == 2  # nothing was moved or cut
    assert not (run / ".lmgym.lock.pid").exists()


def test_a_planned_schedule_resumes_where_it_was(tmp_path):
    run = tmp_path / "run"
    args = ["--lr-scheduler-type", "linear", "--schedule-iterations", "10"]
    assert train("--iterations", "2", "--run-dir", str(run), *args) == 0
    assert train("--resume", str(run), "--iterations", "3") == 0
    rates = [row["learning_rate"] for row in read_progress(run / "progress.csv")]
    rate = GRPOConfig().learning_rate  # linear to 0 over 10 iterations
    assert rates == pytest.approx([0.9 * rate, 0.8 * rate, 0.7 * rate], abs=1e-12)


# ---------------------------------------------------------------- callbacks
SB3_MODULE = """
from stable_baselines3.common.callbacks import CheckpointCallback

checkpoints = CheckpointCallback(save_freq=10, save_path="x")
"""
PROTOCOL = (
    "lmgym calls callback(agent, metrics) after every iteration (return False to stop) and, "
    "when the object has them, on_learn_start(agent) and on_learn_end(agent, history): pass a "
    "function or a lmgym.training.TrainingCallback subclass"
)


def test_a_stable_baselines3_callback_gets_lmgyms_protocol(tmp_path, monkeypatch, capsys):
    (tmp_path / "sb3_callbacks.py").write_text(SB3_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    assert train("--run-dir", str(run), "--callback", "sb3_callbacks:checkpoints") == 2
    assert capsys.readouterr().err == (
        "lmgym train: error: callback 'sb3_callbacks:checkpoints': CheckpointCallback is a "
        "Stable-Baselines3 BaseCallback, which drives an SB3 model (on_step, rollout buffers), "
        f"not an lmgym agent; {PROTOCOL}\n"
    )
    spec = "stable_baselines3.common.callbacks:EvalCallback"  # a class: refused, not built
    assert train("--run-dir", str(run), "--callback", spec) == 2
    assert "EvalCallback is a Stable-Baselines3 BaseCallback" in capsys.readouterr().err
    assert not run.exists()
    from sb3_callbacks import checkpoints

    with pytest.raises(TypeError, match="callbacks: CheckpointCallback is a Stable-Baselines3"):
        Trainer(TrainConfig(run_dir=str(run)), callbacks=[checkpoints])


# -------------------------------------------------------------------- bench
def test_the_bench_runs_every_agent_at_its_defaults_and_lmgym_train_s_batch():
    """Issue 26: the bench measures the library's defaults, not settings of its own."""
    assert set(DEFAULT_AGENTS) < set(ALGORITHMS)
    train = TrainConfig()
    spec = BenchSpec()
    assert spec.agent_overrides == {}
    assert (spec.num_prompts, spec.group_size) == (train.num_prompts, train.group_size)
    assert spec.overrides_for("remax") == {}
    assert BenchSpec(learning_rate=1e-5).overrides_for("remax") == {"learning_rate": 1e-5}


def test_bench_agents_all_runs_every_algorithm(monkeypatch, tmp_path):
    import lmgym.bench.run as bench

    seen = []
    monkeypatch.setattr(bench, "run_bench", lambda spec, out, overwrite: seen.append(spec) or "")
    assert main(["bench", "--agents", "all", "--out", str(tmp_path)]) == 0
    assert seen[0].agents == tuple(sorted(ALGORITHMS))


def test_bench_names_a_missing_model(tmp_path, capsys):
    assert main(["bench", "--model", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"lmgym bench: error: --model {tmp_path / 'nope'}: no such directory"
    )


def test_grpo_config_is_untouched_by_the_bench_defaults():
    assert GRPOConfig().learning_rate == 3e-4  # its documented default


def test_a_callback_given_again_on_resume_runs_once(tmp_path, monkeypatch):
    (tmp_path / "count_calls.py").write_text(
        "calls = []\ndef record(agent, metrics):\n    calls.append(agent.iteration)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    spec = "count_calls:record"
    assert train("--iterations", "1", "--run-dir", str(run), "--callback", spec) == 0
    assert train("--resume", str(run), "--iterations", "2", "--callback", spec) == 0
    import count_calls

    assert count_calls.calls == [1, 2]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"iterations": "5"}, "iterations='5': expected an integer"),
        ({"early_stop": "false"}, "early_stop='false': expected"),
        ({"stop_window": 2.5}, "stop_window=2.5"),
    ],
)
def test_a_config_built_in_python_is_type_checked_by_name(changes, message):
    # "false" would count as True and "5" < 0 raises a bare TypeError without the check.
    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes).check()
