"""Crashes and full disks at every write point: nothing finished is lost, resume is exact.

Each durable write passes ``lmgym.persistence.atomic.write_point`` before and after
it; these tests stop a run at each such point, by killing a forked child there
(``os._exit``: no clean-up runs), by copying the run directory as it is there (what
a kill leaves), or by raising ``ENOSPC`` in this process.
"""

from __future__ import annotations

import shutil

import pytest

from lmgym.agents import GRPO
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.persistence import atomic, recover_leftovers
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.training import CheckpointManager

# Reverse has many prompts, so a prompt stream that did not resume would show; samples
# and evaluations every iteration so their files have write points too.
RUN = ["--task", "lmgym/Reverse-v0", "--sample-every", "1", "--eval-every", "1"]
RUN += ["--save-every", "1", "--keep-checkpoints", "2"]
AFTER = ("wrote ", "appended ")
"""Labels of points right after a write: nothing is written between one and the next point."""


def fresh_agent() -> GRPO:
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    return GRPO(policy, fresh_env())


def fresh_env():
    return make_target_string_vector(num_envs=8, group_size=4, tokenizer=make_char_tokenizer())


@pytest.mark.heavy
def test_a_kill_at_any_write_point_then_resume_equals_an_uninterrupted_run(
    tmp_path, train, same_history, killed_at, monkeypatch
):
    base = tmp_path / "base"  # an uninterrupted run: checkpoints 1, 2 and 3 (all kept)
    assert train(*RUN, "--iterations", "3", "--keep-checkpoints", "0", "--run-dir", str(base)) == 0

    # The session under test resumes base from checkpoint 2 to 3, keeping 1 checkpoint:
    # it sets row 3 and checkpoint 3 aside, rewrites the history files, writes latest
    # and config.json, then iteration 3 (row, samples, evaluation, checkpoint 3) and
    # prunes checkpoints 1 and 2.
    def session(run):
        checkpoint = str(run / "checkpoints" / "iter_000002")
        return train("--resume", checkpoint, "--iterations", "3", "--keep-checkpoints", "1")

    # What a kill at write point k leaves is the run directory as it is when the
    # session reaches point k: one session copies it there, at every point, instead
    # of one killed session per point. (The run lock is an flock, which a copy does
    # not hold, as a killed process no longer does; one real kill below checks it.)
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    labels: list[str] = []

    def snapshot(label: str) -> None:
        labels.append(label)
        if not label.startswith(AFTER):  # the files are as at the next point, which is tested
            shutil.copytree(probe, tmp_path / f"kill{len(labels)}")

    monkeypatch.setattr(atomic, "write_point", snapshot)
    assert session(probe) == 0
    monkeypatch.undo()
    for label in (
        "started 001-after-iter_000002",
        "set aside iter_000003",
        "rename progress.csv",
        "rename config.json",
        "append samples.jsonl",
        "append eval.jsonl",
        "append progress.csv",
        "saved agent",
        "renamed iter_000003",
        "rename latest",
        "prune iter_000002",
    ):
        assert label in labels, label

    k = labels.index("rename latest") + 1
    shutil.rmtree(tmp_path / f"kill{k}")
    shutil.copytree(base, tmp_path / f"kill{k}")
    assert killed_at(k, lambda: session(tmp_path / f"kill{k}")) == (77, "rename latest")
    for k, label in enumerate(labels, start=1):
        run = tmp_path / f"kill{k}"
        if not run.exists():
            continue  # a point right after a write
        # Then the user resumes the run (from its latest checkpoint) to the same total.
        assert train("--resume", str(run), "--iterations", "3") == 0, f"after a kill at {label}"
        same_history(run, base)
        assert CheckpointManager(run / "checkpoints").latest().name == "iter_000003"
        shutil.rmtree(run)


def test_a_full_disk_at_any_point_of_a_checkpoint_keeps_the_last_good_one(
    tmp_path, write_points, fail_at
):
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    agent = fresh_agent()
    agent.learn(1)
    first = manager.save(agent)
    first_files = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    agent.learn(1)
    write_points.clear()
    CheckpointManager(tmp_path / "probe").save(agent)  # lists a save's write points
    labels = list(write_points)
    assert labels[0] == "started iter_000002" and labels[-1] == "wrote latest"

    for k, label in enumerate(labels, start=1):
        fail_at(k)
        with pytest.raises(OSError, match="No space left on device"):
            manager.save(agent)
        names = sorted(p.name for p in manager.directory.iterdir())
        renamed = "renamed iter_000002" in labels[:k]
        assert names == ["iter_000001", *(["iter_000002"] if renamed else []), "latest"], label
        assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == first_files
        latest = manager.latest()
        CheckpointManager.verify(latest)  # whatever latest names is complete
        assert latest.name == ("iter_000002" if label == "wrote latest" else "iter_000001")
        if renamed:
            CheckpointManager.verify(manager.directory / "iter_000002")
            shutil.rmtree(manager.directory / "iter_000002")
            manager.point_latest_at(first)
    loaded, _ = CheckpointManager.load(manager.latest(), fresh_env())
    assert loaded.iteration == 1


def test_a_full_disk_during_a_run_is_one_line_and_the_run_resumes_exactly(
    tmp_path, train, same_history, capsys, monkeypatch
):
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert train(*RUN, "--iterations", "4", "--run-dir", str(whole)) == 0
    labels: list[str] = []

    def point(label: str) -> None:
        labels.append(label)
        if label == "manifest iter_000004":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "write_point", point)
    capsys.readouterr()
    assert train(*RUN, "--iterations", "4", "--run-dir", str(run)) == 2
    assert capsys.readouterr().err == (
        "lmgym train: error: [Errno 28] No space left on device; its last complete checkpoint "
        f"is {run / 'checkpoints' / 'iter_000003'} (continue: lmgym train --resume {run})\n"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000002",
        "iter_000003",
        "latest",
    ]
    monkeypatch.undo()
    assert train("--resume", str(run), "--iterations", "4") == 0
    same_history(run, whole)


def test_a_save_over_an_older_one_survives_a_kill_between_its_two_renames(
    tmp_path, killed_at, write_points
):
    agent = fresh_agent()
    agent.learn(1)
    path = tmp_path / "saved"
    agent.save(path)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    agent.learn(1)
    probe = tmp_path / "probe"
    agent.save(probe)
    write_points.clear()
    agent.save(probe)  # a save over an existing one: its write points
    k = write_points.index("moved aside probe") + 1

    assert killed_at(k, lambda: agent.save(path)) == (77, "moved aside saved")
    assert not path.exists() and len(list(tmp_path.glob(".saved.old-*"))) == 1
    assert recover_leftovers(tmp_path)[0].startswith("restored saved from .saved.old-")
    assert {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert GRPO.load(path, fresh_env()).iteration == 1
