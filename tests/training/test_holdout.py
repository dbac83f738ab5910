"""Held-out evaluation of a ``--prompts`` file (issue 38, item 1): the split never shares a
row with the training prompts, every evaluation of the run uses the held-out part and
names it, ``--eval-prompts-file`` names one, ``--no-holdout`` says the evaluation is on
training prompts, and a run written before held-out splits keeps training on every row."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

from lmgym.cli import main
from lmgym.training.evaluation import TRAINING_SPLIT
from lmgym.training.holdout import (
    HOLDOUT_MAX_ROWS,
    holdout_size,
    prompt_parts,
    split_holdout,
)

QUIET = [
    "--no-progress", "--log-interval", "0", "--eval-prompts", "4", "--eval-samples", "2",
    "--samples", "1", "--sample-every", "0", "--num-prompts", "2", "--group-size", "2",
    "--env", "max_new_tokens=2",
]  # fmt: skip

REWARD = """
SEEN = []

def exact(prompts, completions, answer, **columns):
    SEEN.extend(prompts)
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""


def rows(n: int, start: int = 0) -> str:
    return "".join(
        json.dumps({"prompt": f"q{i}:", "answer": str(i % 2)}) + "\n"
        for i in range(start, start + n)
    )


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    (tmp_path / "yn_reward.py").write_text(textwrap.dedent(REWARD))
    (tmp_path / "data.jsonl").write_text(rows(30))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("yn_reward", None)
    gym.registry.pop("prompts/data-v0", None)


def seen() -> set[str]:
    return set(sys.modules["yn_reward"].SEEN)


@pytest.mark.parametrize("n", [2, 5, 10, 30, 400, 641, 5000])
def test_the_split_is_disjoint_covers_every_row_and_has_the_documented_size(tmp_path, n):
    path = tmp_path / "d.jsonl"
    path.write_text(rows(n))
    parts, _ = prompt_parts(path, "prompt", None)
    train = [parts["train"][i] for i in range(len(parts["train"]))]
    held = [parts["eval"][i] for i in range(len(parts["eval"]))]
    assert not set(train) & set(held)
    assert sorted(train + held) == sorted(f"q{i}:" for i in range(n))
    assert len(held) == holdout_size(n) == max(1, min(HOLDOUT_MAX_ROWS, round(0.1 * n)))
    again, _ = prompt_parts(path, "prompt", None)  # the same rows every time
    assert [again["eval"][i] for i in range(len(again["eval"]))] == held


def test_a_one_row_file_cannot_be_split_and_says_what_to_do():
    with pytest.raises(ValueError, match="--eval-prompts-file FILE, or pass --no-holdout"):
        split_holdout(["only:"])


def test_train_never_trains_on_the_held_out_rows_and_reports_them(data, capsys):
    run = data / "run"
    args = ["--prompts", "data.jsonl", "--reward", "yn_reward:exact", "--iterations", "3"]
    assert main(["train", *QUIET, *args, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    parts, _ = prompt_parts(data / "data.jsonl", "prompt", None)
    held = {parts["eval"][i] for i in range(len(parts["eval"]))}
    assert len(held) == 3
    # Evaluations saw held-out rows, training batches only training rows: the reward
    # saw both, and every prompt it saw outside the held-out set is a training row.
    train_rows = {parts["train"][i] for i in range(len(parts["train"]))}
    assert seen() <= held | train_rows and seen() & held
    assert "split eval ..." in out and "(4 prompts x 2 samples, split eval)" in out
    assert "held-out prompts: 3 of the 30 rows of data.jsonl (seed 0), never trained on" in out
    assert "reward before: " in out and "measured on split eval: 4 prompts x 2 samples)" in out
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"eval"}
    saved = json.loads((run / "config.json").read_text())
    assert saved["run"]["holdout"] is True and saved["run"]["eval_prompts_file"] is None

    sys.modules["yn_reward"].SEEN.clear()
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--num-prompts", "3", "-k", "2"]) == 0
    assert "(split eval): 3 prompts x 2 samples" in capsys.readouterr().out
    assert seen() == held  # lmgym eval --run scores the held-out rows only


def test_the_training_env_holds_only_training_rows_and_the_eval_env_only_held_out_ones(data):
    from lmgym.training.run import TrainConfig
    from lmgym.training.user_code import prepare_task

    env_id = prepare_task(TrainConfig(prompts="data.jsonl", reward="yn_reward:exact"))
    parts, _ = prompt_parts(data / "data.jsonl", "prompt", None)
    held = {parts["eval"][i] for i in range(len(parts["eval"]))}
    train = gym.make_vec(env_id, num_envs=8, group_size=2, max_new_tokens=2)
    evaluation = gym.make_vec(env_id, num_envs=8, group_size=2, max_new_tokens=2, split="eval")
    assert len(train.prompt_table.prompts) == 27 and not set(train.prompt_table.prompts) & held
    assert set(evaluation.prompt_table.prompts) == held


def test_no_holdout_trains_on_every_row_and_every_report_says_so(data, capsys):
    run = data / "run"
    args = ["--prompts", "data.jsonl", "--reward", "yn_reward:exact", "--iterations", "1"]
    assert main(["train", *QUIET, *args, "--no-holdout", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "held-out prompts: none (--no-holdout): every evaluation is on training" in out
    assert f"split {TRAINING_SPLIT}" in out
    assert f"measured on split {TRAINING_SPLIT}: 4 prompts x 2 samples)" in out
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--num-prompts", "2", "-k", "2"]) == 0
    assert f"(split {TRAINING_SPLIT})" in capsys.readouterr().out


def test_an_eval_prompts_file_is_what_every_evaluation_uses(data, capsys):
    (data / "held.jsonl").write_text(rows(4, start=100))
    run = data / "run"
    args = ["--prompts", "data.jsonl", "--reward", "yn_reward:exact", "--iterations", "1"]
    args += ["--eval-prompts-file", "held.jsonl"]
    assert main(["train", *QUIET, *args, "--run-dir", str(run)]) == 0
    held = {f"q{i}:" for i in range(100, 104)}
    assert held <= seen()
    assert "held-out prompts: the 4 of held.jsonl; training on every row of data.jsonl" in (
        capsys.readouterr().out
    )
    saved = json.loads((run / "config.json").read_text())
    assert saved["run"]["eval_prompts_file"] == str(data / "held.jsonl")
    assert len(saved["imports"]["eval_prompts"]["sha256"]) == 64
    sys.modules["yn_reward"].SEEN.clear()
    assert main(["eval", "--run", str(run), "--num-prompts", "4", "-k", "2"]) == 0
    assert seen() == held

    (data / "held.jsonl").write_text(rows(5, start=100))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--iterations", "2"]) == 2
    assert "the run's held-out prompt file" in capsys.readouterr().err


def test_a_held_out_file_sharing_training_prompts_is_noted(data, capsys):
    (data / "held.jsonl").write_text(rows(2, start=0) + rows(2, start=100))
    args = ["--prompts", "data.jsonl", "--reward", "yn_reward:exact", "--iterations", "1"]
    args += ["--eval-prompts-file", "held.jsonl", "--run-dir", str(data / "run")]
    assert main(["train", *QUIET, *args]) == 0
    assert (
        "note: 2 of the 4 prompts of held.jsonl are also in data.jsonl: the evaluation of "
        "those is not held out" in capsys.readouterr().out
    )


def test_a_file_given_to_the_count_flag_names_the_file_flag(data, capsys):
    assert main(["train", "--eval-prompts", "held.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmgym train: error: --eval-prompts held.jsonl: --eval-prompts is the number of prompts "
        "per evaluation; a file of held-out prompts is --eval-prompts-file held.jsonl"
    )


def test_an_eval_prompts_file_without_prompts_is_refused(data, capsys):
    assert main(["train", *QUIET, "--eval-prompts-file", "x.jsonl"]) == 2
    assert "eval_prompts_file='x.jsonl' needs --prompts FILE.jsonl" in capsys.readouterr().err


def test_a_run_from_before_held_out_splits_resumes_on_every_row(data, capsys):
    """config.json without ``holdout``: that run trained on every row, and keeps doing so."""
    run = data / "run"
    args = ["--prompts", "data.jsonl", "--reward", "yn_reward:exact", "--iterations", "1"]
    assert main(["train", *QUIET, *args, "--no-holdout", "--run-dir", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    del config["run"]["holdout"], config["run"]["eval_prompts_file"]
    (run / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--iterations", "2"]) == 0
    assert f"split {TRAINING_SPLIT}" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["run"]["holdout"] is False
