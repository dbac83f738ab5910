"""`lmgym eval` on a user's own prompt file and reward, with train's flags and meaning;
the old count flag refused with the new one named; no silent default task for --model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from lmgym.cli import main
from lmgym.envs.registration import TASKS

SUMS = [("1+1=", "2"), ("2+3=", "5"), ("4+4=", "8")]
REWARD_MODULE = """
def exact_answer(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""
# A module registering its task with register_reward_env("Sums", ...): lmgym/Sums-v0.
TASK_MODULE = """
from lmgym.envs import FunctionReward, register_reward_env

register_reward_env(
    "EvalSums", FunctionReward(lambda p, c: float(c.strip() == "2"), batched=False), ["1+1="]
)
"""


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "eval_rewards.py").write_text(REWARD_MODULE)
    (tmp_path / "eval_tasks.py").write_text(TASK_MODULE)
    (tmp_path / "sums.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in SUMS)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for module in ("eval_rewards", "eval_tasks"):
        sys.modules.pop(module, None)
    for env_id in ("prompts/sums-v0", "lmgym/EvalSums-v0"):  # as a new process would be
        gym.registry.pop(env_id, None)
        TASKS.pop(env_id, None)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lmgym.policy import save_tiny

    return save_tiny(tmp_path_factory.mktemp("model") / "tiny")


def test_eval_takes_a_prompt_file_and_reward_as_train_does(user_dir, tiny_model, capsys):
    args = ["eval", "--model", str(tiny_model), "--prompts", "sums.jsonl"]
    args += ["--reward", "eval_rewards:exact_answer", "--num-prompts", "3", "-k", "2"]
    assert main(args) == 0  # the row lmgym train --prompts sums.jsonl holds out
    out = capsys.readouterr().out
    assert out.startswith(f"eval of {tiny_model} on prompts/sums-v0 (split eval)")
    assert ": 3 prompts x 2 samples" in out.splitlines()[0]
    assert main([*args, "--split", "all"]) == 0  # every row
    out = capsys.readouterr().out
    assert out.startswith(f"eval of {tiny_model} on prompts/sums-v0 (split all (every row of ")
    assert "  reward 0.00: '1+1=' -> " in out or "  reward 1.00: '1+1=' -> " in out


def test_eval_of_a_model_needs_a_task(tiny_model, capsys):
    assert main(["eval", "--model", str(tiny_model)]) == 2
    assert one_line(capsys) == (
        f"lmgym eval: error: --model {tiny_model}: name what to evaluate it on: --task ID "
        "(lmgym tasks lists them, e.g. --task lmgym/TargetString-v0), or --prompts FILE.jsonl "
        "--reward module:function"
    )


def test_a_count_given_to_prompts_names_num_prompts(tiny_model, capsys):
    args = ["eval", "--model", str(tiny_model), "--task", "lmgym/Reverse-v0"]
    assert main([*args, "--prompts", "128"]) == 2
    assert one_line(capsys) == (
        "lmgym eval: error: --prompts 128: --prompts is a JSON Lines prompt file (as in lmgym "
        "train); the number of prompts drawn is --num-prompts 128"
    )
    assert main([*args, "--num-prompts", "sums.jsonl"]) == 2
    assert one_line(capsys) == (
        "lmgym eval: error: --num-prompts sums.jsonl: --num-prompts is the number of prompts "
        "drawn; a prompt file is --prompts sums.jsonl --reward module:function"
    )


def test_train_names_num_prompts_when_prompts_gets_a_count(user_dir, capsys):
    rc = main(["train", "--prompts", "128", "--reward", "eval_rewards:exact_answer"])
    assert rc == 2
    assert one_line(capsys) == (
        f"lmgym train: error: prompts '{user_dir / '128'}': no such file (a JSON Lines prompt "
        "file); the number of prompts per batch is --num-prompts 128"
    )


def test_task_and_prompts_together_are_refused(user_dir, tiny_model, capsys):
    args = ["eval", "--model", str(tiny_model), "--task", "lmgym/Reverse-v0"]
    assert main([*args, "--prompts", "sums.jsonl", "--reward", "eval_rewards:exact_answer"]) == 2
    assert one_line(capsys).startswith(
        "lmgym eval: error: --task lmgym/Reverse-v0 and --prompts/--reward both name the task"
    )


@pytest.mark.parametrize("task", ["eval_tasks:EvalSums-v0", "eval_tasks:lmgym/EvalSums-v0"])
def test_a_module_task_is_found_without_its_namespace(user_dir, tiny_model, capsys, task):
    args = ["eval", "--model", str(tiny_model), "--task", task, "--num-prompts", "1", "-k", "2"]
    assert main(args) == 0
    assert f"on {task} (split training prompts (no held-out split))" in capsys.readouterr().out
