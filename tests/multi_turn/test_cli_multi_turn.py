"""`lmgym train` and `lmgym eval` on a multi-turn task, end to end: printed samples show
the whole episode (the environment's observations in [...]), evaluation counts the
policy's tokens as the update does, a run checkpoints and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

from lmgym import CausalLMPolicy, make_tiny_model
from lmgym.cli import main
from lmgym.rollout import collect
from lmgym.training.evaluation import evaluate_policy
from lmgym.training.logger import read_progress
from lmgym.training.sample_text import episode_texts

TASK = "lmgym/GuessNumber-v0"
SMALL = [
    "--task", TASK, "--no-progress", "--log-interval", "0", "--num-prompts", "2",
    "--group-size", "4", "--eval-prompts", "2", "--eval-samples", "2", "--samples", "2",
]  # fmt: skip


def guess_episode(env, guesses: list[str]):
    """Play ``guesses`` as row 0's turns (the other rows write the same), and return the
    last observation's completion region as a batch-like record ``[1, L]``."""
    tok = env.tokenizer
    obs, _ = env.reset(seed=0)
    for guess in guesses:
        for token in tok(guess, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            obs, *_ = env.step(torch.full((env.num_envs,), token))
    region = slice(env.prompt_width, None)
    return SimpleNamespace(
        completion_ids=obs["input_ids"][:1, region],
        completion_mask=obs["attention_mask"][:1, region].bool(),
        policy_mask=obs["policy_mask"][:1, region],
    )


def test_a_printed_episode_shows_each_turn_and_the_observations_between_them():
    env = gym.make_vec(TASK, num_envs=1, group_size=1, max_turns=4)
    secret = int(env.prompt_table.columns["secret"][0])
    wrong = 1 if secret != 1 else 2
    batch = guess_episode(env, ["x", str(wrong)])
    said = "higher" if secret > wrong else "lower"
    unk = env.tokenizer.unk_token  # the character tokenizer's newline
    assert episode_texts(env, batch) == [f"x[say a number{unk}]{wrong}[{said}{unk}]"]
    # A single-turn batch reads as the string reward sees it.
    single = SimpleNamespace(**{**vars(batch), "policy_mask": batch.completion_mask})
    assert episode_texts(env, single) == env.decode_completions(
        batch.completion_ids, batch.completion_mask
    )


def test_evaluation_counts_the_policys_tokens_as_the_update_does():
    env = gym.make_vec(TASK, num_envs=8, group_size=2, split="eval")
    policy = CausalLMPolicy(make_tiny_model(len(env.tokenizer), seed=0), env.tokenizer)
    result = evaluate_policy(policy, env, num_prompts=env.num_prompts, seed=3)
    generator = torch.Generator(device=policy.device)
    generator.manual_seed(3)
    batch = collect(env, policy, seed=3, generator=generator)
    assert (batch.lengths > batch.policy_lengths).any()  # the environment spoke
    assert result.completion_length == pytest.approx(batch.policy_lengths.float().mean().item())
    assert result.reward_mean == pytest.approx(batch.scores.mean().item())
    # The kept samples are whole episodes, one per prompt first.
    texts, k = episode_texts(env, batch), env.group_size
    order = sorted(range(len(texts)), key=lambda i: (i % k, i // k))[: len(result.samples)]
    assert [c for _, c, _ in result.samples] == [texts[i] for i in order]


def test_train_eval_and_resume_on_a_multi_turn_task(tmp_path: Path, capsys):
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = [*SMALL, "--sample-every", "1", "--eval-every", "2", "--save-every", "1"]
    assert main(["train", *common, "--iterations", "3", "--run-dir", str(whole)]) == 0
    out = capsys.readouterr().out
    assert "eval before: " in out and "eval after: " in out and "[samples @ 1]" in out
    assert (whole / "checkpoints" / "latest").read_text().strip() == "iter_000003"
    samples = [json.loads(s) for s in (whole / "samples.jsonl").read_text().splitlines()]
    # Whole episodes: the environment's answers appear between the turns.
    assert any("[higher" in s["completion"] or "[lower" in s["completion"] for s in samples)

    rows = read_progress(whole / "progress.csv")
    assert [row["iteration"] for row in rows] == [1.0, 2.0, 3.0]
    evals = [json.loads(line) for line in (whole / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["completion_length"] <= 64  # the policy's tokens only, within budget

    assert main(["train", *common, "--iterations", "2", "--run-dir", str(split)]) == 0
    assert main(["train", "--resume", str(split), "--iterations", "3"]) == 0
    drop = ("time/",)
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows] == [
        {k: v for k, v in r.items() if not k.startswith(drop)}
        for r in read_progress(split / "progress.csv")
    ]
    assert (split / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()

    capsys.readouterr()
    report = tmp_path / "eval.json"
    assert main(["eval", "--run", str(whole), "--num-prompts", "2", "-k", "2"]) == 0
    assert main(["eval", "--run", str(whole), "--task", TASK, "--num-prompts", "2", "-k", "2",
                 "--json", str(report)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"on {TASK}" in out and "  reward " in out
    assert "tokens (the policy's turns)" in out  # a multi-turn length: the policy's tokens
    data = json.loads(report.read_text())
    assert data["completion_length"] <= 64 and data["samples"]


@pytest.mark.heavy
def test_a_task_longer_than_the_tiny_models_context_trains_and_resumes(tmp_path: Path):
    """FrozenLake's prompt plus budget (475 tokens) exceeds the tiny GPT-2's 256
    positions: lmgym train builds the tiny model one position longer than the task
    needs, and a resumed run (its KL reference rebuilt at that size) equals an
    uninterrupted one."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = [*SMALL[2:], "--task", "lmgym/FrozenLake-v0", "--beta", "0.05", "--save-every", "1"]
    assert main(["train", *common, "--iterations", "2", "--run-dir", str(whole)]) == 0
    assert main(["train", *common, "--iterations", "1", "--run-dir", str(split)]) == 0
    assert main(["train", "--resume", str(split), "--iterations", "2"]) == 0
    policy = whole / "checkpoints" / "iter_000002" / "agent" / "policy" / "config.json"
    assert json.loads(policy.read_text())["n_positions"] == 475  # exactly seq_len
    drop = ("time/",)
    assert [
        {k: v for k, v in r.items() if not k.startswith(drop)}
        for r in read_progress(split / "progress.csv")
    ] == [
        {k: v for k, v in r.items() if not k.startswith(drop)}
        for r in read_progress(whole / "progress.csv")
    ]


@pytest.mark.heavy
def test_lmgym_bench_runs_a_task_longer_than_the_tiny_model(tmp_path: Path):
    """lmgym bench's tiny GPT-2 is sized to FrozenLake (475 tokens) as lmgym train's is."""
    out = tmp_path / "bench"
    args = ["bench", "--agents", "grpo", "--tasks", "lmgym/FrozenLake-v0", "--seeds", "1"]
    args += ["--iterations", "1", "--num-prompts", "2", "--group-size", "2", "--workers", "0"]
    assert main([*args, "--out", str(out)]) == 0
    assert "| grpo |" in next(out.glob("*.md")).read_text()
