"""Reports at the pace of the run (issue 38, item 3): the metric table, samples and
evaluations come every N iterations or every T of wall time, whichever first; ``--help``
shows the defaults that will apply; one LoRA default, stated in the README and docs."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

from lmgym.cli import main
from lmgym.training.callbacks import PeriodicEval
from lmgym.training.pace import Pace, pace_of
from lmgym.training.pretrained import PRETRAINED_DEFAULTS
from lmgym.training.run import LORA_ALPHA, LORA_TARGETS, TrainConfig

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_pace_is_due_by_iterations_or_by_time_whichever_first():
    clock = Clock()
    pace = Pace(50, 120.0, clock=clock)
    pace.start()
    clock.now = 24.0
    assert not pace.due(1)
    clock.now = 119.0
    assert not pace.due(5)
    clock.now = 120.0
    assert pace.due(5)  # two minutes, long before iteration 50
    pace.done()
    clock.now = 130.0
    assert not pace.due(6) and pace.due(50)  # 50 iterations, however quick
    assert not Pace(0, None).active and Pace(0, 60.0).active


def test_the_time_a_report_takes_does_not_count():
    clock = Clock()
    pace = Pace(0, 60.0, clock=clock)
    pace.start()
    clock.now = 60.0
    assert pace.due(3)
    clock.now = 100.0  # a 40 s evaluation
    pace.done()
    clock.now = 159.0
    assert not pace.due(4)
    clock.now = 160.0
    assert pace.due(5)


def test_a_slow_run_evaluates_by_wall_time(monkeypatch):
    """An evaluation by time: 24 s iterations, 5 minutes: due at iteration 13."""
    clock = Clock()

    class HeldOut:
        calls: list[int] = []

        def evaluate(self, policy, iteration, stream):
            self.calls.append(iteration)
            from lmgym.training.evaluation import EvalResult

            return EvalResult(0.5, 0.1, 2.0, None, None, 4, 2, "eval")

    class Agent:
        policy = None
        iteration = 0

    held_out = HeldOut()
    pace = Pace(0, 300.0, clock=clock)
    callback = PeriodicEval(held_out, pace, out=None)  # type: ignore[arg-type]
    agent = Agent()
    callback.on_learn_start(agent)
    for i in range(1, 29):
        clock.now += 24.0
        agent.iteration = i
        callback(agent, {})
    assert held_out.calls == [13, 26]


def test_durations_are_checked_and_none_turns_time_off():
    assert pace_of(50, None, "report_time").seconds is None
    assert pace_of(50, "2m", "report_time").seconds == 120.0
    with pytest.raises(ValueError, match="report_time='soon': expected a positive duration"):
        TrainConfig(report_time="soon").check()
    assert (TrainConfig().report_time, TrainConfig().eval_time) == ("2m", "5m")


def test_a_run_prints_its_table_and_samples_by_time(tmp_path, capsys):
    """--report-time 0.001s: every iteration is past it, so the table and samples print at
    every iteration though --log-interval and --sample-every are 1000."""
    args = ["train", "--no-progress", "--iterations", "2", "--log-interval", "1000"]
    args += ["--sample-every", "1000", "--report-time", "0.001s", "--eval-time", "none"]
    args += ["--eval-prompts", "2", "--eval-samples", "2", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[samples @ 1]" in out and "[samples @ 2]" in out
    assert out.count("| reward_mean ") == 2 and "[eval @" not in out


def _help(capsys, *argv: str) -> str:
    with contextlib.suppress(SystemExit):
        main(["train", *argv, "--help"])
    return re.sub(r"\s+", " ", capsys.readouterr().out)


def test_help_shows_the_defaults_a_pretrained_run_gets(capsys):
    tiny = _help(capsys)
    assert "Completions per prompt (G)" in tiny and "(default: 16)" in tiny
    assert "(default: 0.0003)" in tiny  # GRPO's own learning rate
    lora = _help(capsys, "--model", "some/model", "--lora-r", "16")
    rate = f"(default: {PRETRAINED_DEFAULTS.learning_rate_lora})"
    assert rate in lora and f"(default: {PRETRAINED_DEFAULTS.group_size})" in lora
    full = _help(capsys, "--model", "some/model")
    assert f"(default: {PRETRAINED_DEFAULTS.learning_rate_full})" in full


def test_one_lora_default_stated_in_the_readme_and_the_docs():
    config = TrainConfig(lora_r=16)
    assert (config.lora_alpha, tuple(config.lora_target_modules)) == (LORA_ALPHA, LORA_TARGETS)
    targets = " ".join(LORA_TARGETS)
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    docs = re.sub(r"\s+", " ", (ROOT / "docs" / "cli.md").read_text())
    assert f"--lora-alpha {LORA_ALPHA:g} --lora-target-modules {targets}" in readme
    assert f"lora_alpha={LORA_ALPHA:g}, target_modules={json.dumps(list(LORA_TARGETS))}" in readme
    assert f"alpha {LORA_ALPHA:g} on the attention projections `{targets}`" in readme
    assert f"default alpha {LORA_ALPHA:g} on `{targets}`" in docs
