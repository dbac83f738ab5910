"""Every failure a user can cause is one line on stderr with exit status 2: no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from testkit import one_line

from lmgym.cli import main
from lmgym.training import model_source


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "device='gpu' is not a torch device; use cpu, cuda or cuda:N"),
        (
            "cuda",
            "device='cuda': CUDA is not available on this machine (torch.cuda.is_available() is "
            "False); use --device cpu",
        ),
    ],
)
def test_a_device_this_machine_lacks(tmp_path, train, capsys, monkeypatch, device, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    assert train("--device", device, "--run-dir", str(run)) == 2
    assert one_line(capsys) == f"lmgym train: error: {message}"
    assert not run.exists()
    assert main(["eval", "--model", str(tmp_path), "--device", device]) == 2
    assert one_line(capsys) == f"lmgym eval: error: {message}"


def test_a_missing_model_directory(tmp_path, train, capsys):
    assert train("--model", "./no/such/dir", "--run-dir", str(tmp_path / "r")) == 2
    assert one_line(capsys) == (
        "lmgym train: error: --model ./no/such/dir: no such directory (pass a directory written "
        "by save_pretrained, or a hub name such as gpt2)"
    )
    assert main(["eval", "--model", str(tmp_path / "nope")]) == 2
    assert one_line(capsys).startswith(f"lmgym eval: error: --model {tmp_path / 'nope'}: no such")


def test_a_hub_name_while_offline_fails_at_once_saying_how_to_pass_a_path(
    tmp_path, train, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    start = time.perf_counter()
    assert train("--model", "gpt2", "--run-dir", str(tmp_path / "r")) == 2
    assert time.perf_counter() - start < 5
    assert one_line(capsys) == (
        "lmgym train: error: --model gpt2: no local directory gpt2 and not in the Hugging Face "
        "cache, and downloads are off (HF_HUB_OFFLINE=1); download it where there is a network "
        "(e.g. `huggingface-cli download gpt2 --local-dir DIR`) and pass --model DIR"
    )
    assert not (tmp_path / "r").exists()


def test_a_hub_name_when_the_hub_does_not_answer(tmp_path, train, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    probes = []
    monkeypatch.setattr(model_source, "hub_reachable", lambda: probes.append(1) or False)
    assert main(["eval", "--model", "someone/some-model"]) == 2
    assert one_line(capsys) == (
        "lmgym eval: error: --model someone/some-model: no local directory someone/some-model "
        "and not in the Hugging Face cache, and the Hub (https://huggingface.co) did not answer "
        "within 2 s; download it where there is a network (e.g. `huggingface-cli download "
        "someone/some-model --local-dir DIR`) and pass --model DIR"
    )
    assert probes == [1]


def test_an_unknown_env_argument_lists_the_valid_ones(tmp_path, train, capsys):
    assert train("--env", "bogus=1", "--run-dir", str(tmp_path / "r")) == 2
    assert one_line(capsys) == (
        "lmgym train: error: env argument bogus: task lmgym/TargetString-v0 takes no such "
        "argument; valid: allowed_special_tokens, autoreset, center_potential, max_new_tokens, max_prompt_length, max_turn_tokens, max_turns, on_responder_timeout, per_token_form, prompt, prompt_order, responder_park_after, responder_timeout, reward_mode, stop_token_ids, target, unfinished, unfinished_penalty"
    )
    assert train("--env", "group_size=2", "--run-dir", str(tmp_path / "r")) == 2
    assert one_line(capsys) == (
        "lmgym train: error: env argument group_size: set by the run (--group-size), not an env "
        "argument"
    )


@pytest.mark.parametrize(
    ("value", "saved"), [("false", False), ("False", False), ("no", False), ("1", True)]
)
def test_env_booleans_are_parsed_strictly(tmp_path, train, value, saved):
    run = tmp_path / "run"
    assert train("--iterations", "1", "--env", f"autoreset={value}", "--run-dir", str(run)) == 0
    assert json.loads((run / "config.json").read_text())["run"]["env_kwargs"] == {
        "autoreset": saved
    }


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("autoreset=maybe", "env argument autoreset='maybe': expected true or false"),
        ("max_new_tokens=2.5", "env argument max_new_tokens=2.5: expected an integer or none"),
        (
            "reward_mode=dense",
            "env argument reward_mode='dense' is not one of ['bandit', 'per_token']",
        ),
    ],
)
def test_a_mistyped_env_value_names_the_key(tmp_path, train, capsys, arg, message):
    from lmgym.policy import save_tiny

    assert train("--env", arg, "--run-dir", str(tmp_path / "r")) == 2
    assert one_line(capsys) == f"lmgym train: error: {message}"
    model = save_tiny(tmp_path / "tiny")
    assert (
        main(["eval", "--model", str(model), "--task", "lmgym/TargetString-v0", "--env", arg]) == 2
    )
    assert one_line(capsys) == f"lmgym eval: error: {message}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"dynamic_sampling": "maybe"}, "dynamic_sampling='maybe': expected true or false"),
        ({"whiten_advantages": 2}, "whiten_advantages=2: expected true or false"),
        ({"env_kwargs": {"autoreset": "maybe"}}, "env argument autoreset='maybe': expected true"),
    ],
)
def test_booleans_in_a_config_file_are_parsed_strictly(tmp_path, train, capsys, content, message):
    config = tmp_path / "c.json"
    config.write_text(json.dumps(content))
    assert train("--config", str(config), "--run-dir", str(tmp_path / "r")) == 2
    assert message in one_line(capsys)
    assert not (tmp_path / "r").exists()


def test_a_false_string_in_a_config_file_is_false(tmp_path, train):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"whiten_advantages": "false", "iterations": 1}))
    run = tmp_path / "run"
    assert train("--config", str(config), "--run-dir", str(run)) == 0
    assert json.loads((run / "config.json").read_text())["agent"]["whiten_advantages"] is False


def test_a_non_finite_step_is_one_line_naming_the_last_checkpoint(
    tmp_path, train, capsys, monkeypatch
):
    from lmgym.agents.base import Agent

    step = Agent.step

    def failing_step(self):
        if self.iteration == 2:
            raise FloatingPointError("loss is nan at iteration 3")
        return step(self)

    monkeypatch.setattr(Agent, "step", failing_step)
    run = tmp_path / "run"
    assert train("--iterations", "4", "--save-every", "2", "--run-dir", str(run)) == 2
    assert one_line(capsys) == (
        "lmgym train: error: loss is nan at iteration 3; its last complete checkpoint is "
        f"{run / 'checkpoints' / 'iter_000002'} (continue: lmgym train --resume {run})"
    )
    assert not (run / ".lmgym.lock.pid").exists()  # the lock was released


def test_eval_temperature_zero_is_greedy(tmp_path, capsys):
    """--temperature 0 must decode greedily (not fall back to the run's temperature): every
    one of a prompt's k completions is then the same. Needs the sampler's temperature=0
    (greedy) support in lmgym.policy.sampling."""
    from lmgym.policy import save_tiny

    model = save_tiny(tmp_path / "tiny")
    out = tmp_path / "eval.json"
    args = ["eval", "--model", str(model), "--task", "lmgym/TargetString-v0", "--num-prompts", "1"]
    args += ["-k", "4", "--samples", "0"]
    assert main([*args, "--temperature", "0", "--json", str(out)]) == 0
    completions = [sample[1] for sample in json.loads(out.read_text())["samples"]]
    assert len(completions) == 4 and len(set(completions)) == 1
    assert main([*args, "--temperature", "1", "--json", str(out)]) == 0
    assert len({sample[1] for sample in json.loads(out.read_text())["samples"]}) > 1


def test_a_real_process_prints_one_line_and_exits_2():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "lmgym", "train", "--device", "gpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "lmgym train: error: device='gpu' is not a torch device; use cpu, cuda or cuda:N\n"
    )
