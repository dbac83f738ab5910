"""Resuming never deletes history: abandoned branches are kept, live files stay continuous."""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from lmgym.training import TrainConfig, Trainer
from lmgym.training.logger import make_logger, read_progress

RUN = ["--task", "lmgym/Reverse-v0", "--sample-every", "2", "--eval-every", "2"]


def iterations(path) -> list[int]:
    return [int(row["iteration"]) for row in read_progress(path)]


def test_resume_from_an_older_checkpoint_keeps_the_abandoned_branch(
    tmp_path, train, same_history, capsys
):
    """The issue's scenario: train to 6, resume from 2 and stop at 3 (Ctrl-C), resume to 8."""
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert train(*RUN, "--iterations", "8", "--run-dir", str(whole)) == 0
    assert train(*RUN, "--iterations", "6", "--save-every", "2", "--keep-checkpoints", "0",
                 "--run-dir", str(run)) == 0  # fmt: skip

    def interrupt_after_3(agent, metrics):
        if agent.iteration == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer.resume(
            run / "checkpoints" / "iter_000002",
            changes={"iterations": 6},
            callbacks=[interrupt_after_3],
            out=lambda line: None,
        ).run()
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "8") == 0
    out = capsys.readouterr().out

    same_history(run, whole)  # live files: iterations 1..8, continuous
    assert iterations(run / "progress.csv") == list(range(1, 9))
    first, second = sorted((run / "abandoned").iterdir())
    assert first.name == "001-after-iter_000002" and second.name == "002-after-iter_000002"
    assert iterations(first / "progress.csv") == [1, 2, 3, 4, 5, 6]  # the original branch
    assert sorted(p.name for p in (first / "checkpoints").iterdir()) == [
        "iter_000004",
        "iter_000006",
    ]
    samples = [json.loads(line)["iteration"] for line in (first / "samples.jsonl").open()]
    assert sorted(set(samples)) == [2, 4, 6]
    assert iterations(second / "progress.csv") == [1, 2, 3]  # the interrupted session's row 3
    assert f"was moved to {second}; nothing was deleted" in out


def test_tensorboard_hides_the_abandoned_steps_after_a_resume(tmp_path, train):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert train("--iterations", "4", "--save-every", "2", "--keep-checkpoints", "0",
                 "--run-dir", str(run)) == 0  # fmt: skip
    assert train("--resume", str(run / "checkpoints" / "iter_000002"), "--iterations", "5") == 0
    events = EventAccumulator(str(run))
    events.Reload()
    assert [event.step for event in events.Scalars("reward_mean")] == [1, 2, 3, 4, 5]


def test_a_resume_within_the_same_second_writes_an_event_file_read_after_the_earlier_one(
    tmp_path,
):
    """TensorBoard reads event files in name order: start second, then host, pid and a
    per-process counter as text. An earlier session's file from this very second, with
    a pid that sorts after any real one, must still be read before the resumed one."""
    pytest.importorskip("tensorboard")
    earlier = (
        tmp_path / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.99999999.9"
    )
    earlier.write_bytes(b"")
    logger = make_logger(tmp_path, tensorboard=True, resume_at=2)
    logger.close()
    files = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2 and files[0] == earlier.name, files


def test_a_full_disk_while_rewinding_loses_no_row(tmp_path, train, capsys, fail_at, write_points):
    run = tmp_path / "run"
    assert train(*RUN, "--iterations", "4", "--save-every", "2", "--keep-checkpoints", "0",
                 "--run-dir", str(run)) == 0  # fmt: skip
    before = {name: (run / name).read_bytes() for name in ("progress.csv", "samples.jsonl")}
    resume = ["--resume", str(run / "checkpoints" / "iter_000002"), "--iterations", "4"]
    probe = tmp_path / "probe"
    shutil.copytree(run, probe)
    write_points.clear()
    assert train("--resume", str(probe / "checkpoints" / "iter_000002"), "--iterations", "4") == 0
    k = write_points.index("rename progress.csv") + 1  # the live file's rewrite, mid-way
    fail_at(k)
    capsys.readouterr()
    assert train(*resume) == 2
    assert capsys.readouterr().err.startswith(
        "lmgym train: error: [Errno 28] No space left on device"
    )
    assert (run / "progress.csv").read_bytes() == before["progress.csv"]  # not emptied
    assert not list(run.glob(".progress.csv.tmp-*"))
    kept = run / "abandoned" / "001-after-iter_000002"
    assert {name: (kept / name).read_bytes() for name in before} == before


def test_threads_changed_on_resume_are_pointed_out(tmp_path, capsys):
    run = tmp_path / "run"
    quiet = {"no_progress": True, "log_interval": 0, "sample_every": 0, "eval_prompts": 2}
    Trainer(TrainConfig(iterations=1, run_dir=str(run), eval_samples=2, **quiet)).run()
    lines: list[str] = []
    Trainer.resume(run, changes={"threads": 2}, out=lines.append).run()
    assert (
        "note: threads=2 differs from the run's 1; the metrics may then differ in the last "
        "digits from a run that kept its thread count (float sums in another order)"
    ) in lines
