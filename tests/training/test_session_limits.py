"""A session bounded by --max-time stops cleanly (final checkpoint, after-evaluation);
Ctrl-C suggests --resume only when a checkpoint exists; a run without learning signal
says so; the progress bar shows KL only when there is a reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmgym.cli import main
from lmgym.training.session import postfix
from lmgym.training.suspect import NO_SIGNAL_PATIENCE, NoSignalWarning
from lmgym.training.wall_clock import WallClockLimit, parse_duration

QUIET = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]
QUIET += ["--samples", "0", "--sample-every", "0", "--num-prompts", "2", "--group-size", "4"]


class Agent:
    iteration = 0


def test_durations_read_with_or_without_a_unit():
    assert [parse_duration(t) for t in ("600", "90s", "10m", "1.5h", 30)] == [
        600,
        90,
        600,
        5400,
        30,
    ]
    for bad in ("10x", "-5", "0", "m"):
        with pytest.raises(ValueError, match=r"max_time=.*expected a positive duration"):
            parse_duration(bad)


def test_the_limit_stops_before_an_iteration_that_would_end_past_it():
    now = [100.0]
    lines: list[str] = []
    limit = WallClockLimit(10.0, 100.0, "--max-time 10s", lines.append, clock=lambda: now[0])
    agent = Agent()
    limit.on_learn_start(agent)
    stops = []
    while not stops or stops[-1] is None:
        agent.iteration += 1
        now[0] += 3.0  # every iteration takes 3 s: after the 2nd (6 s) a 3rd ends at 9 s
        stops.append(limit(agent, {}))
    assert stops == [None, None, False]  # after the 3rd (9 s) a 4th would end at 12 s
    assert limit.stopped_at == 3
    assert lines == [
        "stopping after iteration 3: --max-time 10s (9.0s elapsed, an iteration takes up to "
        "3.0s); the final checkpoint and evaluation follow"
    ]


def test_max_time_ends_the_run_with_its_checkpoint_and_evaluation(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", *QUIET, "--iterations", "100000", "--max-time", "3s", "--save-every", "0"]
    assert main([*args, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    stop = next(line for line in out.splitlines() if line.startswith("stopping after iteration"))
    stopped = int(stop.split()[3].rstrip(":"))
    assert 0 < stopped < 100000 and "--max-time 3s" in stop
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"iter_{stopped:06d}"
    end = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    assert (end["iteration"], end["at"]) == (stopped, "end")
    assert "reward before: " in out


def test_a_bad_max_time_is_one_line(tmp_path, capsys):
    assert main(["train", *QUIET, "--max-time", "ten", "--run-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        "lmgym train: error: max_time='ten': expected a positive duration: seconds (600) or "
        "with a unit (90s, 10m, 1.5h)\n"
    )


INTERRUPT = """
def at_two(agent, metrics):
    if agent.iteration == 2:
        raise KeyboardInterrupt
"""


@pytest.mark.parametrize(("save_every", "checkpoint"), [("0", False), ("1", True)])
def test_ctrl_c_suggests_resume_only_with_a_checkpoint(
    tmp_path, capsys, monkeypatch, save_every, checkpoint
):
    (tmp_path / "interrupt_cb.py").write_text(INTERRUPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    args = ["train", *QUIET, "--iterations", "5", "--callback", "interrupt_cb:at_two"]
    assert main([*args, "--save-every", save_every, "--run-dir", str(run)]) == 130
    err = capsys.readouterr().err.strip()
    if checkpoint:
        assert err == (
            f"lmgym train: interrupted; its last complete checkpoint is "
            f"{run / 'checkpoints' / 'iter_000001'} (continue: lmgym train --resume {run})"
        )
    else:
        assert err == (
            f"lmgym train: interrupted; no checkpoint was written yet (start again with "
            f"--run-dir {run} --overwrite)"
        )


def test_no_signal_warns_once_per_streak_and_says_what_to_change():
    lines: list[str] = []
    watch = NoSignalWarning(group_size=4, temperature=0.7, patience=3, out=lines.append)
    agent = Agent()
    flat = {"frac_reward_zero_std": 1.0, "reward_mean": 0.0, "grad_norm": 0.0}
    signal = {"frac_reward_zero_std": 0.5, "reward_mean": 0.1, "grad_norm": 0.3}
    for agent.iteration, metrics in enumerate([flat] * 5 + [signal] + [flat] * 3, start=1):
        watch(agent, metrics)
    assert watch.warned_at == [3, 9]
    assert lines[0] == (
        "warning: no learning signal for 3 iterations in a row (1-3): every group's completions "
        "got the same reward (reward_mean 0.000), so every advantage is 0 and the model does not "
        "change. Sample more completions per prompt (--group-size, now 4), a higher "
        "--temperature (now 0.7), or an easier task (one the model sometimes solves)"
    )
    solved = NoSignalWarning(4, 1.0, max_reward=1.0, patience=1, out=lines.append)
    solved(agent, {"frac_reward_zero_std": 1.0, "reward_mean": 1.0, "grad_norm": 0.0})
    assert solved.warned_at == []  # every completion right: solved, not stuck
    zero_grad = NoSignalWarning(4, 1.0, patience=1, out=lines.append)
    zero_grad(agent, {"frac_reward_zero_std": 0.2, "grad_norm": 0.0})
    assert "the gradient norm is 0" in lines[-1]


ZERO = "def zero(prompts, completions, **columns):\n    return [0.0 for _ in completions]\n"


def test_a_run_on_a_reward_that_never_varies_warns(tmp_path, capsys, monkeypatch):
    (tmp_path / "zero_reward.py").write_text(ZERO)
    (tmp_path / "p.jsonl").write_text('{"prompt": "say hello:"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["train", *QUIET, "--prompts", str(tmp_path / "p.jsonl"), "--reward", "zero_reward:zero"]
    args += ["--no-holdout"]  # one row: nothing to hold out
    args += ["--iterations", str(NO_SIGNAL_PATIENCE), "--run-dir", str(tmp_path / "run")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"warning: no learning signal for {NO_SIGNAL_PATIENCE} iterations in a row" in out


def test_the_progress_bar_shows_kl_only_with_a_reference():
    metrics = {"reward_mean": 0.25, "frac_reward_zero_std": 0.5, "completion_length": 3.0}
    assert postfix(metrics, show_kl=False) == {"reward": "0.250", "flat": "50%", "len": "3.0"}
    with_ref = postfix({**metrics, "kl_ref_k3": 0.01}, show_kl=True)
    assert with_ref["kl"] == "0.0100" and list(with_ref) == ["reward", "flat", "kl", "len"]


def test_the_bar_is_drawn_by_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    quiet = [a for a in QUIET if a != "--no-progress"]
    assert main(["train", *quiet, "--iterations", "2", "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert "reward=" in err and "flat=" in err and "kl=" not in err
    assert Path(run / "progress.csv").is_file()
