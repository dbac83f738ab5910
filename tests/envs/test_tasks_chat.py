"""The chat tasks of issue 25: ChatArithmetic, Instructions, PositiveContinuation.

Rewards are checked on strings against hand-computed values; envs are built with the
character tokenizer (plain-text prompts, or a chat template set on it) and once with
the real SmolLM2 tokenizer (chat template, ``<|im_end|>`` stop) when it is cached.
No model generates anything here.
"""

from __future__ import annotations

import importlib.util
import sys

import gymnasium as gym
import pytest
import torch

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TASKS, available_tasks, format_task_table, reward_component_means
from lmgym.envs.prompts import RowColumns
from lmgym.envs.tasks import random_policy_return
from lmgym.envs.tasks._chat import chat_prompt, distinct_draws
from lmgym.envs.tasks.chat_arithmetic import (
    chat_arithmetic_items,
    exact_number,
    first_number,
    first_number_match,
    last_number,
    last_number_match,
    make_chat_arithmetic_vector,
    problems,
)
from lmgym.envs.tasks.instructions import (
    CHECKS,
    CONSTRAINTS,
    EXAMPLES,
    answer_tags,
    answer_text,
    include_word,
    lowercase,
    make_instructions_vector,
    no_commas,
    parse_constraints,
    word_count,
    words,
)
from lmgym.types import RewardInput

HAS_VADER = importlib.util.find_spec("vaderSentiment") is not None
CHAT_TASKS = ["lmgym/ChatArithmetic-v0", "lmgym/Instructions-v0", "lmgym/PositiveContinuation-v0"]
SIMPLE_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def chat_char_tokenizer():
    tok = make_char_tokenizer()
    tok.chat_template = SIMPLE_TEMPLATE
    return tok


def reward_on(env, completions: list[str], prompt_index: int = 0) -> torch.Tensor:
    """The env's reward model on hand-written completions of one of its prompts."""
    table, n = env.prompt_table, len(completions)
    ids = torch.zeros(n, 1, dtype=torch.long)
    batch = RewardInput(
        prompt_ids=table.ids[[prompt_index] * n],
        prompt_mask=table.mask[[prompt_index] * n],
        completion_ids=ids,
        completion_mask=torch.ones(n, 1, dtype=torch.bool),
        prompts=[table.prompts[prompt_index]] * n,
        prompt_index=torch.full((n,), prompt_index),
        finished=torch.ones(n, dtype=torch.bool),
        decode=lambda ids: list(completions),
        columns=RowColumns(table.columns, [prompt_index] * n),
    )
    return torch.as_tensor(env.reward_model(batch), dtype=torch.float32)


# ------------------------------------------------------------------ shared pieces
def test_chat_prompt_and_its_plain_text_form():
    shots = [("What is 1 + 1?", "2")]
    assert chat_prompt("What is 2 + 2?", "Be brief.", shots) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert chat_prompt("q?") == [{"role": "user", "content": "q?"}]
    assert chat_prompt("q?", "s", shots, chat=False) == "s\n\nWhat is 1 + 1?\n2\n\nq?\n"


def test_distinct_draws_are_seeded_and_bounded():
    draws = distinct_draws(lambda rng: rng.randrange(10), 5, 10, 3, "dataset_size")
    assert len(set(draws)) == 5 and draws == distinct_draws(
        lambda rng: rng.randrange(10), 5, 10, 3, "dataset_size"
    )
    with pytest.raises(ValueError, match=r"dataset_size=6: must be in \[1, 5\]"):
        distinct_draws(lambda rng: rng.randrange(10), 6, 10, 0, "dataset_size")


# ------------------------------------------------------------------ arithmetic
def test_arithmetic_problems():
    one = problems(1, "+-*")
    assert len(one) == 100 + 55 + 100
    assert (7, "+", 8, 15) in one and (3, "-", 9, -6) not in one and (9, "-", 3, 6) in one
    assert all(r >= 0 for *_, r in one)
    two = problems(2, "*")
    assert (
        len(two) == 90 * 10 and min(a for a, *_ in two) == 10 and max(b for _, _, b, _ in two) == 9
    )
    with pytest.raises(ValueError, match="digits=0"):
        problems(0)
    with pytest.raises(ValueError, match="operations='/'"):
        problems(1, "/")


def test_arithmetic_items_subset_and_error():
    items = chat_arithmetic_items(1, "+", dataset_size=10, data_seed=1)
    assert len(items) == 10 and items == chat_arithmetic_items(1, "+", 10, 1)
    prompt, answer = items[0]
    assert prompt[0]["content"].endswith("? Reply with the number only.")
    assert str(eval(prompt[0]["content"].removeprefix("What is ").split("?")[0])) == answer
    assert len(chat_arithmetic_items(2)) == 1000  # capped by default
    with pytest.raises(ValueError, match=r"dataset_size=101: must be in \[1, 100\]"):
        chat_arithmetic_items(1, "+", dataset_size=101)


def test_number_rewards_by_hand():
    completions = ["15", " 15\n", "The answer is 15.", "7 + 8 = 15", "-15", "", "15.", "150"]
    completions += ["15, or 16"]
    answers = ["15"] * len(completions)
    assert exact_number(None, completions, answers) == [1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert first_number_match(None, completions, answers) == [1, 1, 1, 0, 0, 0, 1, 0, 1]
    assert last_number_match(None, completions, answers) == [1, 1, 1, 1, 0, 0, 1, 0, 0]
    assert last_number_match(None, ["9 - 12 = -3", "9 - 12 = 3"], ["-3", "-3"]) == [1, 0]
    assert last_number("none") is None and last_number("1 2 x-30y") == "-30"
    assert first_number_match(None, ["It is -3, not 3", "minus 3"], ["-3", "-3"]) == [1, 0]
    assert exact_number(None, ["-3"], ["-3"]) == [1]
    assert first_number("no digits") is None and first_number("x-12y") == "-12"


def test_arithmetic_env_reward_and_split_with_the_character_tokenizer():
    train = make_chat_arithmetic_vector(num_envs=2, operations="+", chat=False)
    held_out = make_chat_arithmetic_vector(num_envs=2, operations="+", chat=False, split="eval")
    assert (len(train.prompt_table), len(held_out.prompt_table)) == (75, 25)
    assert not set(train.prompt_table.texts) & set(held_out.prompt_table.texts)
    assert train.max_new_tokens == 12
    text = train.prompt_table.texts[0]
    assert text.startswith("What is ") and text.endswith("? Reply with the number only.\n")
    answer = train.prompt_table.columns["answer"][0]
    lenient = reward_on(train, [answer, f"the answer is {answer}.", f"1 + 2 = {answer}", "1234"])
    assert lenient.tolist() == [1.0, 1.0, 1.0, 0.0]  # the last number counts
    first = make_chat_arithmetic_vector(num_envs=2, answer="first_number", operations="+")
    assert reward_on(first, [f"{answer} = 1 + 2", f"1 + 2 = {answer}"]).tolist() == [1.0, 0.0]
    exact = make_chat_arithmetic_vector(num_envs=2, answer="exact", operations="+", chat=False)
    assert reward_on(exact, [answer, f"the answer is {answer}."]).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer='loose'"):
        make_chat_arithmetic_vector(answer="loose", chat=False)


# ------------------------------------------------------------------ instructions
def test_answer_text_and_words():
    assert answer_text("sure! <answer> a b </answer> bye") == "a b"
    assert answer_text("  no tags here ") == "no tags here"
    assert words("don't stop, well-known 42 times!") == [
        "don't",
        "stop",
        "well-known",
        "42",
        "times",
    ]
    assert words("  ,.! ") == []


def test_each_constraint_by_hand():
    done = "<answer>the blue sea is calm</answer>"
    c = [done, "The blue sea, calm", "", "   ", "<answer></answer>", "the BLUE sea\n"]
    assert word_count(None, c, [5] * 6) == [1, 0, 0, 0, 0, 0]
    assert word_count(None, ["<answer>a b c</answer> d e"], [3]) == [1]  # inside the tags
    assert lowercase(None, c) == [1, 0, 0, 0, 0, 0]
    assert lowercase(None, ["42 !"]) == [0]  # no letter: no credit
    assert include_word(None, c, ["blue"] * 6) == [1, 1, 0, 0, 0, 1]
    assert include_word(None, ["bluebird", "Blue."], ["blue", "blue"]) == [0, 1]
    assert no_commas(None, c) == [1, 0, 0, 0, 0, 1]
    assert answer_tags(None, c) == [1, 0, 0, 0, 0, 0]
    assert answer_tags(None, ["  <answer>hi</answer>\n", "x <answer>hi</answer>"]) == [1, 0]


def test_instructions_reward_is_the_mean_and_logs_each_constraint():
    env = make_instructions_vector(num_envs=2, chat=False)
    table = env.prompt_table
    n, word = table.columns["num_words"][0], table.columns["word"][0]
    assert f"Use exactly {n} words." in table.texts[0] and f'"{word}"' in table.texts[0]
    perfect = "<answer>" + " ".join([word] + ["ok"] * (n - 1)) + "</answer>"
    wrong_count = "<answer>" + " ".join([word] * (n + 1)) + "</answer>"
    rewards = reward_on(env, [perfect, wrong_count, "", "Hello, World"])
    assert rewards.tolist() == pytest.approx([1.0, 0.8, 0.0, 0.0])
    means = reward_component_means(env)
    assert means == pytest.approx(
        {
            "reward/word_count": 0.25,
            "reward/lowercase": 0.5,
            "reward/include_word": 0.5,
            "reward/no_commas": 0.5,
            "reward/answer_tags": 0.5,
        }
    )
    strict = make_instructions_vector(num_envs=2, chat=False, strict=True)
    assert reward_on(strict, [perfect, wrong_count]).tolist() == [1.0, 0.0]
    assert set(reward_component_means(strict)) == set(means)


def test_the_worked_examples_meet_every_rule():
    for _, n, word, sentence in EXAMPLES:
        reply = f"<answer>{sentence}</answer>"
        columns = {"word_count": {"num_words": [n]}, "include_word": {"word": [word]}}
        for name in CONSTRAINTS:
            assert CHECKS[name](None, [reply], **columns.get(name, {})) == [1.0], (sentence, name)
    env = make_instructions_vector(num_envs=2, chat=True, tokenizer=chat_char_tokenizer())
    prompt = env.prompt_table.prompts[0]
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert prompt[1]["content"] == "<answer>the green garden smells sweet</answer>"
    no_tags = make_instructions_vector(
        num_envs=2, constraints="lowercase", examples=2, tokenizer=chat_char_tokenizer()
    )
    assert [m["content"] for m in no_tags.prompt_table.prompts[0][1:4:2]] == [
        "the green garden smells sweet",
        "fresh bread smells good",
    ]
    plain = make_instructions_vector(num_envs=2, chat=False, examples=0)
    assert plain.prompt_table.texts[0].startswith("Write one sentence about ")
    with pytest.raises(ValueError, match=r"examples=3: must be an integer in \[0, 2\]"):
        make_instructions_vector(chat=False, examples=3)


def test_instructions_options_and_split():
    assert parse_constraints(" no_commas,word_count ") == ["word_count", "no_commas"]
    with pytest.raises(ValueError, match="constraints='commas'"):
        parse_constraints("commas")
    env = make_instructions_vector(num_envs=2, chat=False, constraints="lowercase,no_commas")
    assert (
        "Rules:\n- Use only lowercase letters.\n- Do not use any commas.\n"
        in env.prompt_table.texts[0]
    )
    assert reward_on(env, ["the sea", "The sea"]).tolist() == [1.0, 0.5]
    train = make_instructions_vector(num_envs=2, chat=False, dataset_size=40)
    held_out = make_instructions_vector(num_envs=2, chat=False, dataset_size=40, split="eval")
    assert (len(train.prompt_table), len(held_out.prompt_table)) == (30, 10)
    assert not set(train.prompt_table.texts) & set(held_out.prompt_table.texts)
    with pytest.raises(ValueError, match="min_words=5, max_words=2"):
        make_instructions_vector(chat=False, min_words=5, max_words=2)


# ------------------------------------------------------------- positive continuation
@pytest.mark.skipif(not HAS_VADER, reason="needs vaderSentiment")
def test_positive_continuation_reward_is_vader_compound():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    from lmgym.envs.tasks.positive_continuation import make_positive_continuation_vector

    env = make_positive_continuation_vector(num_envs=2, chat=False, dataset_size=40)
    texts = ["I loved it, a wonderful film!", "It was terrible.", "", "The plot follows a man."]
    expected = [SentimentIntensityAnalyzer().polarity_scores(t)["compound"] for t in texts]
    assert expected[0] > 0.5 and expected[1] < -0.3 and expected[2:] == [0.0, 0.0]
    assert reward_on(env, texts).tolist() == pytest.approx(expected, abs=1e-6)
    assert env.max_new_tokens == 48 and env.prompt_table.texts[0][-1] != "\n"
    held_out = make_positive_continuation_vector(
        num_envs=2, chat=False, dataset_size=40, split="eval"
    )
    assert len(env.prompt_table) == 30 and len(held_out.prompt_table) == 10
    assert not set(env.prompt_table.texts) & set(held_out.prompt_table.texts)


def test_positive_continuation_without_vader_is_unavailable_not_a_crash(monkeypatch):
    from lmgym.envs.tasks import positive_continuation

    for module in ("vaderSentiment", "vaderSentiment.vaderSentiment"):
        monkeypatch.setitem(sys.modules, module, None)  # any import of it raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lmgym\[sentiment\]'"):
        positive_continuation.make_positive_continuation_vector(chat=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert "lmgym/PositiveContinuation-v0" not in available_tasks()
    assert "lmgym/ChatArithmetic-v0" in available_tasks()


# ------------------------------------------------------------------ registration
def test_chat_tasks_are_registered_with_their_base_scores():
    table = format_task_table()
    for env_id in CHAT_TASKS:
        info = TASKS[env_id]
        assert info.base_model == "smollm2-135m-instruct"
        line = next(row for row in table.splitlines() if row.startswith(env_id + " "))
        if info.base_score is not None:
            greedy, sampled = info.base_score
            assert f"{greedy:.2f}/{sampled:.2f}" in line
            assert 0.1 <= sampled <= 0.7  # the default difficulty gives a learning signal
    assert TASKS["lmgym/PositiveContinuation-v0"].requires == "sentiment"


@pytest.mark.parametrize("env_id", CHAT_TASKS)
def test_chat_tasks_with_a_chat_template_on_the_character_tokenizer(env_id):
    if env_id not in available_tasks():
        pytest.skip("optional dependency missing")
    env = gym.make_vec(env_id, num_envs=32, group_size=2, tokenizer=chat_char_tokenizer())
    assert env.prompt_table.texts[0].startswith("user: ")
    assert env.prompt_table.texts[0].endswith("\nassistant: ")
    # The table's random baseline is what uniform token ids get (here with chat prompts).
    assert random_policy_return(env, num_batches=2) == pytest.approx(
        TASKS[env_id].random_baseline, abs=0.06
    )
    single = gym.make(env_id, tokenizer=chat_char_tokenizer())
    single.reset(seed=0)
    _, reward, *_ = single.step(single.action_space.sample())
    assert isinstance(reward, float)


@pytest.mark.parametrize("env_id", CHAT_TASKS)
def test_without_a_chat_template_prompts_are_plain_text_unless_chat_is_forced(env_id):
    if env_id not in available_tasks():
        pytest.skip("optional dependency missing")
    with pytest.raises(ValueError, match="needs a tokenizer with a chat_template"):
        gym.make_vec(env_id, num_envs=1, chat=True)
    plain = gym.make_vec(env_id, num_envs=1)  # no template: plain-text prompts
    assert all(isinstance(p, str) for p in plain.prompt_table.prompts)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from lmgym.policy.packaged import PACKAGED_MODELS, cache_root

    model = PACKAGED_MODELS["smollm2-135m-instruct"]
    path = cache_root() / f"{model.name}-{model.version}"
    if not path.is_dir():
        pytest.skip("smollm2-135m-instruct is not converted in the cache")
    return AutoTokenizer.from_pretrained(path)


def test_real_tokenizer_renders_the_chat_template_and_stops_on_im_end(smollm2_tokenizer):
    tok = smollm2_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    env = gym.make_vec(
        "lmgym/ChatArithmetic-v0", num_envs=2, tokenizer=tok, stop_token_ids=[im_end], split="eval"
    )
    table = env.prompt_table
    expected = tok.apply_chat_template(table.prompts[0], add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    ids = table.ids[0][table.mask[0]].tolist()
    assert ids == list(expected) and table.texts[0].endswith("<|im_start|>assistant\n")
    # "The answer is 15." then <|im_end|>: the stop token ends the text, the number scores.
    env.reset(seed=0)
    row = env._info()["prompt_index"][0].item()
    answer = table.columns["answer"][row]
    reply = tok(f"The answer is {answer}.", add_special_tokens=False)["input_ids"] + [im_end]
    total = torch.zeros(2)
    for t, token in enumerate(reply):
        _, reward, terminated, truncated, _ = env.step(torch.tensor([token, token]))
        total += reward
        if t < len(reply) - 1:
            assert not terminated.any()
    assert terminated.all() and total[0].item() == 1.0
