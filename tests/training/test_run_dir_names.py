"""Default run directories: the name is chosen by creating the directory, so runs started
in the same second get their own (issue 27 §6)."""

from __future__ import annotations

import threading

from lmgym.training.run import RunDirectory


def test_a_taken_name_gets_the_next_suffix(tmp_path):
    base = tmp_path / "runs" / "grpo-TargetString-20260101-000000"
    first = RunDirectory.create_unique(base)
    second = RunDirectory.create_unique(base)
    try:
        assert first.path == base
        assert second.path == base.with_name(base.name + "-2")
    finally:
        first.release_lock()
        second.release_lock()


def test_runs_started_together_get_distinct_directories(tmp_path):
    base = tmp_path / "grpo-TargetString-20260101-000000"
    made: list[RunDirectory] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        made.append(RunDirectory.create_unique(base))

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({run.path for run in made}) == 4
    for run in made:
        run.release_lock()
