"""``lmgym train`` on 2 processes (gloo): one run directory, global metrics, resume, errors."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testkit import run_lmgym_train

from lmgym.persistence.state import load_state
from lmgym.policy import CausalLMPolicy

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAST = ["--no-progress", "--eval-prompts", "2", "--eval-samples", "2", "--samples", "1"]


def lmgym(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_lmgym_train(*args, timeout=timeout)


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "progress.csv") as file:
        return list(csv.DictReader(file))


def without_time(row: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("dp") / "run"
    done = lmgym(
        "--nproc-per-node", "2", "--iterations", "4", "--save-every", "2",
        "--keep-checkpoints", "0", "--run-dir", str(run), *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run, done


def test_two_processes_write_one_run_directory_with_global_metrics(two_process_run):
    run, done = two_process_run
    assert done.stdout.count("reward before:") == 1  # rank 0 alone prints
    assert "data parallel: 2 processes x 4 prompts = 8 prompts per iteration" in done.stdout
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000002",
        "iter_000004",
        "latest",
    ]
    saved = (run / "config.json").read_text()
    assert '"launch": {\n    "world_size": 2\n  }' in saved
    table = rows(run)
    assert [float(r["iteration"]) for r in table] == [1, 2, 3, 4]
    # Global: both ranks' tokens (each rank counts only its own 32 rows).
    state = load_state(run / "checkpoints" / "iter_000004" / "trainer_state.pt")
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
    per_rank = [r["tokens_generated"] for r in state["ranks"]]
    assert float(table[-1]["tokens_generated"]) == sum(per_rank)
    assert state["ranks"][0]["env"]["shard"] == (0, 2)
    assert state["ranks"][1]["env"]["shard"] == (1, 2)
    assert not torch.equal(state["ranks"][0]["generator"], state["ranks"][1]["generator"])


def resume_a_copy_and_compare(run: Path, copy: Path) -> None:
    """Resume a copy of the 4-iteration 2-process ``run`` from its iteration-2 checkpoint
    and assert iterations 3 and 4 log exactly the uninterrupted run's metrics."""
    shutil.copytree(run, copy)
    done = lmgym(
        "--nproc-per-node", "2", "--resume", str(copy / "checkpoints" / "iter_000002"),
        "--iterations", "4", *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed, straight = rows(copy), rows(run)
    assert [float(r["iteration"]) for r in resumed] == [1, 2, 3, 4]
    assert [without_time(r) for r in resumed[2:]] == [without_time(r) for r in straight[2:]]


def test_two_process_resume_reproduces_the_uninterrupted_run(two_process_run, tmp_path):
    run, _ = two_process_run
    resume_a_copy_and_compare(run, tmp_path / "run")


def test_resume_with_another_world_size_is_refused(two_process_run):
    run, _ = two_process_run
    done = lmgym("--resume", str(run), "--iterations", "5", *FAST)
    assert done.returncode == 2
    assert "was written by a run of 2 process(es) (world size 2) and this run has 1" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert len(rows(run)) == 4  # nothing written


def test_a_train_config_that_differs_between_ranks_fails_on_every_rank(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(HERE / "cli_rank_argv.py"), str(tmp_path)]
    command += ["--num-prompts 4", "--num-prompts 2", "--", "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(tmp_path / f"rc{r}").read_text() for r in range(2)] == ["2", "2"]
    assert done.stderr.count("TrainConfig differs between ranks in ['num_prompts']") == 2
    assert not (tmp_path / "run").exists()


@pytest.mark.learning
def test_two_process_grpo_solves_target_string(tmp_path):
    run = tmp_path / "run"
    done = lmgym(
        "--nproc-per-node", "2", "--algo", "grpo", "--group-size", "16", "--iterations", "150",
        "--early-stop", "--save-every", "0", "--log-interval", "0", "--sample-every", "0",
        "--run-dir", str(run), *FAST, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "early stop at iteration" in done.stdout


def test_num_minibatches_not_dividing_a_rank_s_batch_fails_on_every_rank(tmp_path):
    """Each rank's batch (num_prompts * group_size = 8 rows) must split into whole
    minibatches: 3 does not divide it, an error on both ranks, exit 2, no run directory."""
    bad = ["--num-prompts", "2", "--group-size", "4", "--num-minibatches", "3", *FAST]
    message = (
        "lmgym train: error: num_minibatches=3 does not divide the batch of 8 rows "
        "(num_prompts * group_size); pick a divisor of 8"
    )
    done = lmgym("--nproc-per-node", "2", *bad, "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2
    assert message in done.stderr
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(HERE / "cli_rank_argv.py"), str(tmp_path), "", ""]
    command += ["--", *bad, "--run-dir", str(tmp_path / "run")]
    each = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert each.returncode == 0, each.stderr[-3000:]  # every rank returned: no hang
    assert [(tmp_path / f"rc{r}").read_text() for r in range(2)] == ["2", "2"]
    assert each.stderr.count(message) == 2
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fsdp") / "run"
    done = lmgym(
        "--nproc-per-node", "2", "--data-parallel", "fsdp", "--iterations", "4",
        "--save-every", "2", "--keep-checkpoints", "0", "--run-dir", str(run), *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run


def test_fsdp_run_matches_the_ddp_run(two_process_run, fsdp_run):
    """``--data-parallel fsdp``: the same run as DDP (metrics row for row, the checkpoint's
    full weights), up to float rounding."""
    ddp_run, _ = two_process_run
    fsdp_rows, ddp_rows = rows(fsdp_run), rows(ddp_run)
    assert len(fsdp_rows) == len(ddp_rows) == 4
    for got, want in zip(fsdp_rows, ddp_rows, strict=True):
        for key, value in without_time(want).items():
            assert float(got[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key
    policy = Path("checkpoints", "iter_000004", "agent", "policy")
    got_weights = CausalLMPolicy.from_pretrained(fsdp_run / policy).model.state_dict()
    want_weights = CausalLMPolicy.from_pretrained(ddp_run / policy).model.state_dict()
    assert got_weights.keys() == want_weights.keys()
    # AdamW moves an entry by ~learning_rate (1e-3) per step whatever its gradient's
    # size, so rounding in a near-zero gradient shows up to ~1e-5 here; a weight not
    # gathered back after a step would be off by ~1e-3.
    for name, weight in want_weights.items():
        torch.testing.assert_close(got_weights[name], weight, rtol=0, atol=1e-4, msg=name)


def test_fsdp_checkpoints_hold_every_rank_s_optimizer_shard(fsdp_run):
    """Each rank's AdamW moments (its shard, marked) sit in the checkpoint's per-rank state;
    together they cover every trainable parameter's moments once."""
    state = load_state(fsdp_run / "checkpoints" / "iter_000002" / "trainer_state.pt")
    policy = CausalLMPolicy.from_pretrained(
        fsdp_run / "checkpoints" / "iter_000002" / "agent" / "policy"
    )
    total = sum(p.numel() for p in policy.model.parameters())  # tied weights once
    sizes = []
    for rank, own in enumerate(state["ranks"]):
        optimizer = own["optimizer"]
        assert optimizer["fsdp_shard"] == {"rank": rank, "world_size": 2}
        moments = [v for p in optimizer["state"].values() for k, v in p.items() if k != "step"]
        assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in moments)
        sizes.append(sum(v.numel() for v in moments))
    assert sum(sizes) == 2 * total  # exp_avg and exp_avg_sq of every parameter
    assert 0 < sizes[1] < sum(sizes)


def test_fsdp_resume_reproduces_the_uninterrupted_run(fsdp_run, tmp_path):
    """Stopped after iteration 2 and resumed with 2 processes: iterations 3 and 4 equal
    the uninterrupted fsdp run's, every metric (each rank reloads its optimizer shard)."""
    copy = tmp_path / "run"
    resume_a_copy_and_compare(fsdp_run, copy)
    policy = Path("checkpoints", "iter_000004", "agent", "policy")
    got = CausalLMPolicy.from_pretrained(copy / policy).model.state_dict()
    want = CausalLMPolicy.from_pretrained(fsdp_run / policy).model.state_dict()
    for name, weight in want.items():
        torch.testing.assert_close(got[name], weight, rtol=0, atol=0, msg=name)
