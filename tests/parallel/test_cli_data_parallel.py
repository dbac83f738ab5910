"""``lmgym train`` on 2 processes (gloo): one run directory, global metrics, resume, errors
(a command line only one rank refuses, issue 27 §6, among them), and a run that learns.

The runs share the suite's one torchrun launch of ``testkit.train_ranks`` (the session
fixture ``two_rank_train``; this module's part is ``two_rank_scenarios``): each is a
``main(["train", ...])`` on both ranks, what the ranks of ``lmgym train
--nproc-per-node 2`` run, so that the ranks' imports are paid once. The launcher
itself: ``--nproc-per-node N`` hands the rest of the command line to ``launch(N, ...)``
unchanged (tested here, in this process), and ``launch`` starts real processes in
tests/asynchronous/test_cli_async.py (``--actors 1``: the same function); a command line
every rank would refuse alike is refused before the launcher, in this process.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from testkit import refused_line
from testkit.train_ranks import GROUP, Outcome, Scenario

from lmgym.cli import launch, main
from lmgym.persistence.state import load_state
from lmgym.policy import CausalLMPolicy

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them
# The tests of the suite's shared two-rank launch (tests/conftest.py: two_rank_train) on
# one worker: it runs once.
ONE_WORKER = pytest.mark.xdist_group(GROUP)

FAST = ["--no-progress", "--eval-prompts", "2", "--eval-samples", "2", "--samples", "1"]
# Each rank's batch of 8 rows (num_prompts * group_size) does not split into 3 minibatches.
BAD_MINIBATCHES = ["--num-prompts", "2", "--group-size", "4", "--num-minibatches", "3", *FAST]
MINIBATCHES_MESSAGE = (
    "lmgym train: error: num_minibatches=3 does not divide the batch of 8 rows "
    "(num_prompts * group_size); pick a divisor of 8"
)


# GRPO learns TargetString on both ranks, stopped once solved (--early-stop).
LEARN = ["--algo", "grpo", "--group-size", "16", "--iterations", "150", "--early-stop",
         "--save-every", "0", "--log-interval", "0", "--sample-every", "0", *FAST]  # fmt: skip
# A multi-turn task (the env answers each guess) end to end on both ranks.
MULTI_TURN = ["--task", "lmgym/GuessNumber-v0", "--iterations", "3", "--save-every", "3",
              "--num-prompts", "2", "--group-size", "4", "--log-interval", "0", *FAST]  # fmt: skip


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "progress.csv") as file:
        return list(csv.DictReader(file))


def without_time(row: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def resume_from_iteration_2(run: Path, copy: Path) -> Scenario:
    """Resume a copy of the 4-iteration 2-process ``run`` from its iteration-2 checkpoint
    (its outcome is named after the copy)."""
    checkpoint = copy / "checkpoints" / "iter_000002"
    argv = ["--resume", str(checkpoint), "--iterations", "4", *FAST]
    return Scenario(copy.name, argv, copy=(str(run), str(copy)))


def four_iterations(*flags: str, run: Path) -> list[str]:
    """A 4-iteration run with checkpoints at iterations 2 and 4, all kept."""
    return [*flags, "--iterations", "4", "--save-every", "2", "--keep-checkpoints", "0",
            "--run-dir", str(run), *FAST]  # fmt: skip


def two_rank_scenarios(root: Path, selected: set[str]) -> list[Scenario]:
    """This module's runs in the shared launch; each writes under ``root / name``."""
    scenarios = [
        Scenario("ddp", four_iterations(run=root / "ddp")),
        resume_from_iteration_2(root / "ddp", root / "ddp-resume"),
        Scenario("fsdp", four_iterations("--data-parallel", "fsdp", run=root / "fsdp")),
        resume_from_iteration_2(root / "fsdp", root / "fsdp-resume"),
        Scenario("multi-turn", [*MULTI_TURN, "--run-dir", str(root / "multi-turn")]),
        # Before the other refusals: the scenarios after it show the launch goes on.
        Scenario(
            "bad-flag",
            ["--no-progress", "--run-dir", str(root / "bad-flag")],
            per_rank=("", "--learning-rate -1"),
        ),
        Scenario(
            "config-differs",
            ["--run-dir", str(root / "config-differs")],
            per_rank=("--num-prompts 4", "--num-prompts 2"),
        ),
        Scenario("minibatches", [*BAD_MINIBATCHES, "--run-dir", str(root / "minibatches")]),
    ]
    if "test_two_process_grpo_solves_target_string" in selected:
        scenarios.append(Scenario("learn", [*LEARN, "--run-dir", str(root / "learn")]))
    return scenarios


@pytest.fixture(scope="module")
def ranks(two_rank_train) -> tuple[Path, dict[str, Outcome]]:
    """``(directory, outcome by name)`` of the shared launch."""
    root, _, outcomes = two_rank_train
    return root, outcomes


@pytest.fixture(scope="module")
def two_process_run(ranks) -> tuple[Path, Outcome]:
    root, outcomes = ranks
    done = outcomes["ddp"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    return root / "ddp", done


@ONE_WORKER
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


def assert_continues_the_run(copy: Path, run: Path) -> None:
    """Iterations 3 and 4 of ``copy``, resumed from iteration 2, logged exactly the
    uninterrupted ``run``'s metrics."""
    resumed, straight = rows(copy), rows(run)
    assert [float(r["iteration"]) for r in resumed] == [1, 2, 3, 4]
    assert [without_time(r) for r in resumed[2:]] == [without_time(r) for r in straight[2:]]


@ONE_WORKER
def test_two_process_resume_reproduces_the_uninterrupted_run(two_process_run, ranks):
    run, _ = two_process_run
    root, outcomes = ranks
    done = outcomes["ddp-resume"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    assert_continues_the_run(root / "ddp-resume", run)


@ONE_WORKER
def test_nproc_per_node_hands_a_resume_to_its_ranks(two_process_run, monkeypatch):
    """``lmgym train --nproc-per-node 2 --resume ...`` reads the command line and starts
    2 processes of the rest of it: the ranks' resume above. (``launch`` itself starts
    real processes in tests/asynchronous/test_cli_async.py.)"""
    run, _ = two_process_run
    started: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(launch, "launch", lambda n, argv: started.append((n, argv)) or 0)
    argv = ["--resume", str(run / "checkpoints" / "iter_000002"), "--iterations", "4", *FAST]
    assert main(["train", "--nproc-per-node", "2", *argv]) == 0
    assert started == [(2, argv)]
    assert len(rows(run)) == 4  # nothing written by the parent


@ONE_WORKER
def test_resume_with_another_world_size_is_refused(two_process_run, capsys):
    """One process (this one: the refusal comes before any training) resuming the
    2-process run."""
    run, _ = two_process_run
    line = refused_line(main, capsys, ["train", "--resume", str(run), "--iterations", "5", *FAST])
    assert "was written by a run of 2 process(es) (world size 2) and this run has 1" in line
    assert len(rows(run)) == 4  # nothing written


@ONE_WORKER
def test_a_bad_flag_on_one_rank_ends_every_rank_with_one_line(two_rank_train):
    """A command line that only one rank refuses: every rank exits 2 with one line naming
    the bad value, none with a lost-peer traceback (issue 27 §6). The launch's stderr is
    every scenario's: a lost peer in any of them fails this test."""
    root, launch, outcomes = two_rank_train
    done = outcomes["bad-flag"]
    assert done.codes == [2, 2]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lmgym train: error:")]
    assert len(errors) == 2 and all("learning_rate=-1" in line for line in errors), errors
    assert any("rank 1 failed, so this rank stops too" in line for line in errors)
    for stderr in (done.stderr, launch.stderr):  # Python's, and what the processes wrote
        assert "Connection closed by peer" not in stderr and "Traceback" not in stderr
    assert not (root / "bad-flag").exists()


@ONE_WORKER
def test_a_train_config_that_differs_between_ranks_fails_on_every_rank(ranks):
    root, outcomes = ranks
    done = outcomes["config-differs"]
    assert done.codes == [2, 2]
    assert done.stderr.count("TrainConfig differs between ranks in ['num_prompts']") == 2
    assert not (root / "config-differs").exists()


@ONE_WORKER
def test_a_multi_turn_task_runs_on_two_processes(ranks):
    """Rank 0 reports once and writes every iteration, the last checkpoint and the
    evaluations before and after training."""
    root, outcomes = ranks
    done = outcomes["multi-turn"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("reward before:") == 1
    run = root / "multi-turn"
    assert [float(r["iteration"]) for r in rows(run)] == [1, 2, 3]
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000003"
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e.get("at") for e in evals] == ["start", "end"]


@ONE_WORKER
@pytest.mark.learning
def test_two_process_grpo_solves_target_string(ranks):
    _, outcomes = ranks
    done = outcomes["learn"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    assert "early stop at iteration" in done.stdout


@pytest.mark.parametrize(
    "launcher, bad, message",
    [
        (["--nproc-per-node", "2"], BAD_MINIBATCHES, MINIBATCHES_MESSAGE),
        (["--actors", "1"], BAD_MINIBATCHES, MINIBATCHES_MESSAGE),
        (["--nproc-per-node", "2"], ["--learning-rate", "-1", *FAST],
         "lmgym train: error: learning_rate=-1.0: must be > 0"),
        (["--nproc-per-node", "2"], ["--env", "nope=1", *FAST],
         "lmgym train: error: env argument nope: task lmgym/TargetString-v0 takes no such"),
    ],
    ids=["minibatches", "minibatches-async", "agent-value", "env-argument"],
)  # fmt: skip
def test_what_every_rank_would_refuse_fails_before_the_launcher(
    launcher, bad, message, tmp_path, capsys, monkeypatch
):
    """Each rank's batch (num_prompts * group_size = 8 rows) must split into whole
    minibatches: 3 does not divide it, so ``--nproc-per-node 2`` (or an asynchronous
    launch) exits 2 with the error its processes would each give, once, without starting
    them, and writes no run directory; so do a bad agent value and a bad env argument."""
    started: list[int] = []
    monkeypatch.setattr(launch, "launch", lambda n, argv: started.append(n) or 0)
    run = tmp_path / "run"
    assert main(["train", *launcher, *bad, "--run-dir", str(run)]) == 2
    assert capsys.readouterr().err.strip().startswith(message)
    assert started == []
    assert not run.exists()


def test_a_command_line_the_ranks_accept_goes_to_the_launcher(tmp_path, monkeypatch):
    """The control: the parent's check passes a good command line on, unchanged, and
    writes nothing itself."""
    started: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(launch, "launch", lambda n, argv: started.append((n, argv)) or 0)
    argv = ["--num-prompts", "2", "--group-size", "4", "--num-minibatches", "2", *FAST,
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(["train", "--nproc-per-node", "2", *argv]) == 0
    assert started == [(2, argv)]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "codes, status", [({0: 2, 1: -9}, 2), ({0: -9, 1: 2}, 2), ({0: -9}, 1), ({1: 1}, 1)]
)
def test_the_launcher_exits_with_the_first_failing_rank_s_status(codes, status, monkeypatch):
    """A rank's refusal (exit 2) is the launch's status, whichever rank gave it; a rank
    killed by a signal (a negative code) alone makes it 1."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failing_run(args):
        failures = {
            rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="")
            for rank, code in codes.items()
        }
        raise ChildFailedError("lmgym", failures)

    monkeypatch.setattr(torch.distributed.run, "run", failing_run)
    assert launch.launch(2, ["--iterations", "1"]) == status


@ONE_WORKER
def test_num_minibatches_not_dividing_a_rank_s_batch_fails_on_every_rank(ranks):
    """The same command line on each of two torchrun ranks: both refuse, exit 2, one
    error each, no run directory."""
    root, outcomes = ranks
    done = outcomes["minibatches"]
    assert done.codes == [2, 2]
    assert done.stderr.count(MINIBATCHES_MESSAGE) == 2
    assert not (root / "minibatches").exists()


@pytest.fixture(scope="module")
def fsdp_run(ranks) -> Path:
    root, outcomes = ranks
    done = outcomes["fsdp"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    return root / "fsdp"


@ONE_WORKER
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


@ONE_WORKER
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


@ONE_WORKER
def test_fsdp_resume_reproduces_the_uninterrupted_run(fsdp_run, ranks):
    """Stopped after iteration 2 and resumed with 2 processes: iterations 3 and 4 equal
    the uninterrupted fsdp run's, every metric (each rank reloads its optimizer shard)."""
    root, outcomes = ranks
    done = outcomes["fsdp-resume"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    copy = root / "fsdp-resume"
    assert_continues_the_run(copy, fsdp_run)
    policy = Path("checkpoints", "iter_000004", "agent", "policy")
    got = CausalLMPolicy.from_pretrained(copy / policy).model.state_dict()
    want = CausalLMPolicy.from_pretrained(fsdp_run / policy).model.state_dict()
    for name, weight in want.items():
        torch.testing.assert_close(got[name], weight, rtol=0, atol=0, msg=name)
