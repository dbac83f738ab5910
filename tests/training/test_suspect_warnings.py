"""Warnings that a result is suspect (issue 38, item 2): each fires on a planted case,
in the log and on the progress bar, names what to try, and stays quiet on a healthy run.

Planted runs go through the real ``Trainer`` (the tiny GPT-2, a prompt file of
yes/no rows and a reward that reads the ``answer`` column); what is planted is the
failure itself: a hook that makes the policy answer one thing to every prompt, a
reward that goes flat, a reward that rises on the training rows and falls on the
held-out ones.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from lmgym.agents import GRPOConfig
from lmgym.training import TrainConfig, Trainer
from lmgym.training.evaluation import EvalResult, answer_key, answer_spread
from lmgym.training.holdout import prompt_parts
from lmgym.training.session import postfix
from lmgym.training.suspect import FLAT_WINDOW, RunKnobs, SuspectWatch

KNOBS = RunKnobs(learning_rate=1e-4, temperature=1.0, group_size=8, beta=0.0)


class Agent:
    iteration = 0


def result(reward: float, share: float, distinct: float, top_reward: float, **kw) -> EvalResult:
    return EvalResult(
        reward_mean=reward, reward_std=0.1, completion_length=2.0, pass_at_1=None,
        pass_at_k=None, num_prompts=64, samples_per_prompt=4, split="eval",
        distinct_per_prompt=distinct, top_answer="yes", top_answer_share=share,
        top_answer_reward=top_reward, **kw,
    )  # fmt: skip


def watch_with(lines: list[str], baseline: EvalResult | None = None) -> SuspectWatch:
    watch = SuspectWatch(KNOBS, 1.0, out=lines.append)
    if baseline is not None:
        watch.baseline(baseline)
    return watch


def feed(watch: SuspectWatch, steps: list[tuple[float, float]], start: int = 1) -> Agent:
    agent = Agent()
    for i, (flat, reward) in enumerate(steps, start):
        agent.iteration = i
        watch(agent, {"frac_reward_zero_std": flat, "reward_mean": reward})
    return agent


# ------------------------------------------------------------------ spread
def test_answers_ignore_case_space_and_trailing_punctuation():
    assert answer_key(" Yes.") == answer_key("yes") == answer_key("YES!\n") == "yes"
    spread = answer_spread(["Yes.", "no", "yes", "Yes"], [0, 0, 1, 1], [1.0, 0.0, 0.0, 1.0])
    assert spread.top_answer == "yes" and spread.top_answer_share == 0.75
    assert spread.distinct_per_prompt == 1.5 and spread.top_answer_reward == pytest.approx(2 / 3)


# --------------------------------------------------------- planted: unit level
def test_collapse_to_one_answer_warns_with_advice_and_shows_on_the_bar():
    lines: list[str] = []
    watch = watch_with(lines, result(0.24, share=0.55, distinct=2.5, top_reward=0.3))
    agent = feed(watch, [(0.2, 0.3)] * 3)
    watch.check_eval(agent, result(0.47, share=1.0, distinct=1.0, top_reward=0.47))
    assert len(lines) == 1 and lines[0].startswith(
        "warning: the policy is collapsing to one answer at iteration 3: 100% of the held-out "
        "completions answer 'yes' (before training 55%"
    )
    for advice in ("--beta 0.04", "--learning-rate (now 0.0001)", "--temperature", "--group-size"):
        assert advice in lines[0]
    assert watch.status() == "collapse"
    assert postfix({"reward_mean": 0.5}, False, watch.status())["warn"] == "collapse"
    watch.check_eval(agent, result(0.47, share=1.0, distinct=1.0, top_reward=0.47))
    assert len(lines) == 1  # once, until it clears


def test_each_prompts_samples_agreeing_without_a_gain_is_a_collapse_too():
    lines: list[str] = []
    watch = watch_with(lines, result(0.40, share=0.3, distinct=3.5, top_reward=0.4))
    watch.check_eval(Agent(), result(0.38, share=0.4, distinct=1.0, top_reward=0.4))
    assert lines and "collapsing to one answer" in lines[0]


def test_no_collapse_warning_when_healthy_solved_or_sharpening_onto_better_answers():
    lines: list[str] = []
    before = result(0.24, share=0.5, distinct=2.5, top_reward=0.3)
    watch = watch_with(lines, before)
    watch.check_eval(Agent(), result(0.60, share=0.55, distinct=2.2, top_reward=0.6))  # healthy
    watch.check_eval(Agent(), result(1.0, share=1.0, distinct=1.0, top_reward=1.0))  # solved
    watch.check_eval(Agent(), result(0.80, share=0.3, distinct=1.0, top_reward=0.8))  # sharper
    assert lines == [] and watch.status() == ""


def test_a_rising_share_of_flat_groups_warns_before_twenty_in_a_row():
    lines: list[str] = []
    watch = watch_with(lines)
    feed(watch, [(0.1, 0.3)] * FLAT_WINDOW + [(0.6, 0.4)] * 2 * FLAT_WINDOW)
    assert (
        len(lines) == 1 and "60% of groups were flat over the last 5 iterations (to 15;" in lines[0]
    )
    assert "--temperature (now 1)" in lines[0] and "--group-size; now 8" in lines[0]
    assert watch.status() == "flat"
    feed(watch, [(0.1, 0.4)] * FLAT_WINDOW, start=16)
    assert watch.status() == ""  # cleared


@pytest.mark.parametrize(
    "steps",
    [
        [(0.9, 0.02)] * 5
        + [(0.5, 0.3)] * 5
        + [(0.2, 0.6)] * 5,  # the demo: flat at first, then not
        [(0.2, 0.3)] * 5 + [(0.3, 0.35)] * 10,  # steady
        [(0.2, 0.3)] * 5 + [(1.0, 1.0)] * 10,  # solved: flat at the best reward
        [(0.2, 0.3)] * 5 + [(0.2 + 0.06 * i, 0.3 + 0.05 * i) for i in range(12)],  # solving
    ],
)
def test_no_flat_warning_on_healthy_shares(steps):
    lines: list[str] = []
    feed(watch_with(lines), steps)
    assert lines == []


def test_held_out_falling_while_training_rises_warns():
    lines: list[str] = []
    watch = watch_with(lines, result(0.40, share=0.5, distinct=2.5, top_reward=0.4))
    agent = feed(watch, [(0.2, 0.24)] * FLAT_WINDOW + [(0.2, 0.47)] * FLAT_WINDOW)
    watch.check_eval(agent, result(0.30, share=0.5, distinct=2.5, top_reward=0.3))
    assert len(lines) == 1 and lines[0].startswith(
        "warning: the held-out reward fell from 0.400 before training to 0.300 at iteration 10 "
        "(split eval) while the training reward rose from 0.240 to 0.470"
    )
    assert "--learning-rate" in lines[0] and "--beta 0.04" in lines[0]
    assert watch.status() == "held-out falls"


def test_no_divergence_warning_when_held_out_rises_or_training_does_not():
    lines: list[str] = []
    watch = watch_with(lines, result(0.40, share=0.5, distinct=2.5, top_reward=0.4))
    agent = feed(watch, [(0.2, 0.24)] * FLAT_WINDOW + [(0.2, 0.47)] * FLAT_WINDOW)
    watch.check_eval(agent, result(0.55, share=0.5, distinct=2.5, top_reward=0.5))
    flat_watch = watch_with(lines, result(0.40, share=0.5, distinct=2.5, top_reward=0.4))
    agent = feed(flat_watch, [(0.2, 0.3)] * 2 * FLAT_WINDOW)
    flat_watch.check_eval(agent, result(0.30, share=0.5, distinct=2.5, top_reward=0.3))
    assert lines == []


def test_the_watch_state_survives_a_checkpoint():
    watch = watch_with([])
    feed(watch, [(0.1, 0.3)] * FLAT_WINDOW + [(0.6, 0.4)] * 2)
    again = watch_with([])
    again.load_state_dict(json.loads(json.dumps(watch.state_dict())))
    assert again.state_dict() == watch.state_dict()


# --------------------------------------------------------------- planted runs
REWARD = """
HELD = set()
STAGE = {"n": 0, "mode": "answer"}

def score(prompts, completions, answer, **columns):
    mode = STAGE["mode"]
    if mode == "flat" and STAGE["n"] >= 5:
        return [0.5 for _ in completions]  # every group flat, short of the best
    if mode in ("flat", "noise"):  # before that: rewards that differ within a group
        import zlib
        return [float(zlib.crc32(c.encode()) % 2) for c in completions]
    if mode == "diverge":
        rise = min(1.0, STAGE["n"] / 6)
        return [1.0 - rise if p in HELD else rise for p in prompts]
    return [float(c.strip()[:1] == a) for c, a in zip(completions, answer)]
"""


@pytest.fixture
def yes_no(tmp_path, monkeypatch) -> Path:
    (tmp_path / "yn_score.py").write_text(textwrap.dedent(REWARD))
    rows = [{"prompt": f"q{i}?", "answer": "y" if i % 4 else "n"} for i in range(40)]
    (tmp_path / "yn.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("yn_score", None)
    gym.registry.pop("prompts/yn-v0", None)


def planted_run(path: Path, mode: str, plant=None, iterations: int = 12) -> list[str]:
    """Train on the yes/no file with the reward in ``mode``; ``plant(agent)`` runs after
    every iteration. Returns the lines the run printed."""
    config = TrainConfig(
        prompts=str(path / "yn.jsonl"), reward="yn_score:score", iterations=iterations,
        num_prompts=2, group_size=4, eval_prompts=4, eval_samples=4, eval_every=6,
        sample_every=0, log_interval=0, no_progress=True, run_dir=str(path / f"run-{mode}"),
        env_kwargs={"max_new_tokens": 2},
    )  # fmt: skip
    lines: list[str] = []
    module = None

    def stage(agent, metrics):
        module.STAGE["n"] = agent.iteration
        if plant is not None:
            plant(agent)

    trainer = Trainer(config, GRPOConfig(), callbacks=[stage], out=lines.append)
    module = sys.modules["yn_score"]
    module.STAGE["mode"] = mode
    parts, _ = prompt_parts(path / "yn.jsonl", "prompt", None)
    module.HELD.update(parts["eval"][i] for i in range(len(parts["eval"])))
    trainer.run()
    return lines


def warnings(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("warning: ")]


def test_a_planted_collapse_to_yes_warns(yes_no):
    """From iteration 3 a bias on the LM head pushes every token to 'y': every
    completion is 'yy', right on three rows in four."""
    hooks = []

    def plant(agent):
        if agent.iteration == 3 and not hooks:
            y = agent.policy.tokenizer.convert_tokens_to_ids("y")
            bias = torch.zeros(len(agent.policy.tokenizer))
            bias[y] = 1e4
            head = agent.policy.model.get_output_embeddings()  # lmgym applies its weight and bias
            head.bias = torch.nn.Parameter(bias, requires_grad=False)
            hooks.append(head)

    found = warnings(planted_run(yes_no, "answer", plant))
    assert any("the policy is collapsing to one answer" in w and "'yy'" in w for w in found)


def test_planted_flat_groups_warn(yes_no):
    found = warnings(planted_run(yes_no, "flat", iterations=16))
    assert any("of groups were flat over the last 5 iterations" in w for w in found)


def test_a_planted_divergence_warns(yes_no):
    found = warnings(planted_run(yes_no, "diverge"))
    assert any(w.startswith("warning: the held-out reward fell from") for w in found)


def test_a_healthy_run_stays_quiet(tmp_path):
    """The demo task learns (reward and held-out reward rise): no warning at all.

    Its target is "world", not the default "hello": "hello" has a trap ('helll', reward
    0.8) that a run may sit in for tens of iterations, and the collapse warning is right
    to name it. Whether seed 0 falls in depends on the CPU's float rounding (on an AMD
    EPYC it sits there from iteration ~40 to ~70); "world" has no repeated letter and
    rose to >= 0.95 by iteration 40 on seeds 0-2 without a warning there.
    """
    config = TrainConfig(
        iterations=40, eval_every=20, eval_prompts=4, eval_samples=4, sample_every=0,
        log_interval=0, no_progress=True, run_dir=str(tmp_path / "run"),
        env_kwargs={"target": "world"},
    )  # fmt: skip
    lines: list[str] = []
    result = Trainer(config, GRPOConfig(), out=lines.append).run()
    assert result.after is not None and result.before is not None
    assert result.after.reward_mean > result.before.reward_mean
    assert warnings(lines) == []
