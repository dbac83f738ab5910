"""lmgym/Weather-v0 and the calculator as tools, through the env with scripted
policies (no model): calls in either form are run and answered as tool messages,
calls that cannot run are told why and the episode goes on, the answer is scored."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from lmgym.envs import TASKS
from lmgym.envs.tasks import random_policy_return
from lmgym.envs.tasks.multi_turn.calculator import Calculator, make_calculator_vector
from lmgym.envs.tasks.multi_turn.weather import (
    Weather,
    WeatherState,
    answer_text,
    make_weather_vector,
    names_condition,
)
from lmgym.envs.turns import Responder

ENV_ID = "lmgym/Weather-v0"


def run(env, turns_of_row, seed=0):
    """Reset; every row writes its turns (texts, each ended by the stop id)."""
    tok = env.tokenizer
    stop = env.stop_token_ids[0].item()
    obs, info = env.reset(seed=seed)
    streams = [
        [i for text in turns for i in tok(text, add_special_tokens=False)["input_ids"] + [stop]]
        for turns in turns_of_row(info)
    ]
    returns = torch.zeros(env.num_envs)
    done = torch.zeros(env.num_envs, dtype=torch.bool)
    for position in range(max(len(s) for s in streams)):
        actions = [s[position] if position < len(s) else stop for s in streams]
        obs, reward, terminated, truncated, _ = env.step(torch.tensor(actions))
        returns += reward * ~done
        done |= terminated | truncated
        if bool(done.all()):
            break
    texts = [
        tok.decode(obs["input_ids"][r][obs["attention_mask"][r].bool()])
        for r in range(env.num_envs)
    ]
    return returns, terminated, texts


def test_it_is_a_tool_responder_and_registered():
    assert isinstance(Weather(), Responder) and Weather().role == "tool"
    info = TASKS[ENV_ID]
    assert info.modes == ("bandit",) and info.solved_threshold == 0.9
    assert info.description.startswith("multi-turn tool use")
    gym.make_vec(ENV_ID, num_envs=2, group_size=2).reset(seed=0)


def test_the_random_baseline_is_measured():
    info = TASKS[ENV_ID]
    random_return = random_policy_return(gym.make_vec(ENV_ID, num_envs=64), num_batches=2)
    assert random_return < info.solved_threshold
    assert random_return == pytest.approx(info.random_baseline, abs=0.06)


def test_answers_name_the_condition_and_no_other():
    conditions = ("sun", "rain", "snow", "fog")
    assert names_condition("rain", "rain", conditions)
    assert names_condition("It is Rainy today.", "rain", conditions)
    assert not names_condition("rain or sun", "rain", conditions)
    assert not names_condition("drizzle", "rain", conditions)
    assert answer_text("ok answer: fog") == " fog"
    assert answer_text("<answer>sun</answer>") == "sun"
    assert answer_text("fog") == "fog"


def test_calling_then_answering_what_the_tool_said_solves_every_row():
    env = make_weather_vector(
        num_envs=8, group_size=4, autoreset=False, split="all", cities=("oslo",)
    )
    replies: list[str] = []

    def turns(info):
        # Every row asks about its city (the prompt says which) and answers in turn 2
        # with what it will hear: read from the env's text after the call (below).
        return [["weather: oslo"]] * env.num_envs

    returns, terminated, texts = run(env, turns)
    assert not terminated.any()  # still going: the tool answered
    for text in texts:
        assert (
            "what is the weather in oslo today? tool weather: the weather in a city today. "
            "call weather: city. then answer: word." in text
        )
        heard = text.split("weather: oslo<eos>")[1].removesuffix("<unk>")
        assert heard in ("sun", "rain", "snow", "fog")
        replies.append(heard)
    assert len(set(replies[:4])) == 4  # a group hears every condition (spread)
    # Now the whole episode, answering what was heard.
    returns, terminated, texts = run(
        env, lambda info: [["weather: oslo", f"answer: {h}"] for h in replies]
    )
    assert terminated.all() and returns.tolist() == [1.0] * env.num_envs


def test_calls_that_cannot_run_are_told_why_and_cost_error_cost():
    env = make_weather_vector(
        num_envs=3, group_size=1, autoreset=False, split="all", error_cost=0.25, call_bonus=0.1,
        cities=("oslo",), max_new_tokens=128,
    )  # fmt: skip
    returns, terminated, texts = run(
        env,
        lambda info: [
            ["weather: paris", "answer: x"],
            ["weather: oslo", "weather: oslo", "answer: x"],
            ["x"],
        ],
    )
    # ValueError's capitals and the quotes read as <unk> in the character tokenizer
    said = "weather: paris<eos>error: <unk>alue<unk>rror: unknown city <unk>paris<unk>"
    assert said in texts[0] and texts[0].endswith("answer: x<eos>")
    assert returns.tolist() == pytest.approx([-0.25, 0.1, 0.0])  # the bonus once; "x" is wrong
    assert terminated.all()


def test_a_wrong_city_hears_another_citys_weather():
    responder = Weather()
    state = WeatherState("oslo", (("oslo", "sun"), ("rome", "rain")))
    assert responder.reply("weather: rome", state).observation == "rain"
    assert responder.reply("weather: oslo", state).observation == "sun"
    bad = responder.reply(
        '<tool_call>{"name": "weather", "arguments": {"town": "oslo"}}</tool_call>', state
    )
    assert bad.observation == "error: weather: unknown argument 'town'; it takes ['city']"
    assert not bad.done
    hidden = responder.reply(
        '<tool_call>{"name": "weather", "arguments": {"city": "oslo", "today": {}}}</tool_call>',
        state,
    )
    assert hidden.observation == "error: weather: unknown argument 'today'; it takes ['city']"


def test_a_chat_model_calls_in_json_and_hears_a_tool_message(smollm2_tokenizer):
    tok = smollm2_tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    env = make_weather_vector(
        num_envs=1, group_size=1, autoreset=False, split="all", tokenizer=tok,
        stop_token_ids=[stop], max_new_tokens=128,
    )  # fmt: skip
    call = '<tool_call>{"name": "weather", "arguments": {"city": "oslo"}}</tool_call>'
    _, _, texts = run(env, lambda info: [[call]])
    text = texts[0]
    assert text.startswith("<|im_start|>system\nYou may call functions")
    assert '"name": "weather", "description": "The weather in a city today."' in text
    assert '"today"' not in text  # injected, not shown
    heard = text.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0]
    assert text.endswith(
        f"{call}<|im_end|>\n<|im_start|>tool\n{heard}<|im_end|>\n<|im_start|>assistant\n"
    )
    returns, terminated, _ = run(env, lambda info: [[call, f"It is {heard}ny today."]])
    assert terminated.all() and returns.tolist() == [1.0]


# ---------------------------------------------------------------- the calculator
def test_the_calculator_reads_tool_calls_and_runs_calc_bounded():
    calc = Calculator()
    reply = calc.reply(
        '<tool_call>{"name": "calc", "arguments": {"expression": "37*23"}}</tool_call>', 851, 0
    )
    assert (reply.observation, reply.done, reply.state) == ("851", False, 1)
    bad = calc.reply('<tool_call>{"name": "calc", "arguments": {"expr": "1"}}</tool_call>', 1, 0)
    assert bad.observation == "error: calc: unknown argument 'expr'; it takes ['expression']"
    assert calc.reply("<calc>1/0</calc>", 1, 0).observation == "error: division by zero"
    first = calc.reply('<answer>3</answer> <tool_call>{"name": "calc"}</tool_call>', 3, 0)
    assert first.done and first.reward == 1.0  # the earliest action counts
    assert calc.runner.time_limit == 2.0 and calc.runner.memory_limit_mb == 256


def test_the_calculator_can_declare_calc_in_the_models_format(smollm2_tokenizer):
    tok = smollm2_tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    env = make_calculator_vector(
        num_envs=1, group_size=1, autoreset=False, split="all", tokenizer=tok,
        stop_token_ids=[stop], declare_tools=True, digits=1, operations="+", dataset_size=50,
        max_new_tokens=128,
    )  # fmt: skip
    obs, info = env.reset(seed=0)
    prompt = env.prompt_table.prompts[int(info["prompt_index"][0])]
    assert prompt[0]["role"] == "system" and '"name": "calc"' in prompt[0]["content"]
    expression = prompt[-1]["content"].split("What is ")[1].split("?")[0]
    value = env.prompt_table.columns["answer"][int(info["prompt_index"][0])]
    call = (
        f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
    )
    returns, terminated, texts = run(env, lambda info: [[call, f"<answer>{value}</answer>"]])
    assert f"<|im_start|>tool\n{value}<|im_end|>" in texts[0]
    assert terminated.all() and returns.tolist() == [1.0]
