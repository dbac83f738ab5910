"""Calculator: turn parsing, the tool's answers and the final score on hand-made
turns, and whole episodes through the env with a scripted policy (no model)."""

from __future__ import annotations

import operator
import re

import pytest
import torch
from testkit import step_scripted_turns

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.tasks.multi_turn.calculator import (
    FORMAT_HINT,
    Calculator,
    answer_matches,
    calculator_problems,
    make_calculator_vector,
    parse_turn,
    question,
)
from lmgym.envs.turns import EpisodeStart, Responder, TurnInput

SIMPLE_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def turn_input(texts, answers, states=None, prompts=None) -> TurnInput:
    k = len(texts)
    return TurnInput(
        rows=torch.arange(k),
        prompts=prompts or ["what is 1+1?"] * k,
        prompt_index=torch.zeros(k, dtype=torch.long),
        columns={"answer": list(answers)},
        turn_texts=list(texts),
        turn_ids=[torch.tensor([1])] * k,
        turn_index=torch.ones(k, dtype=torch.long),
        states=list(states if states is not None else [0] * k),
    )


# ------------------------------------------------------------------ protocol
@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("<calc>12*7+3</calc>", ("calc", "12*7+3")),
        ("let me see: <CALC> 12 * 7 </CALC> ok", ("calc", "12 * 7")),
        ("calc: 12*7+3", ("calc", "12*7+3")),
        ("Calc: 2+2\nthen more", ("calc", "2+2")),
        ("<answer>87</answer>", ("answer", "87")),
        ("answer: 87", ("answer", "87")),
        ("<calc>1+1</calc> <answer>2</answer>", ("calc", "1+1")),  # the first one counts
        ("answer: 2 <calc>1+1</calc>", ("answer", "2 <calc>1+1</calc>")),
        ("87", None),
        ("recalc:", None),  # a prefix must start a word
    ],
)
def test_parse_turn(text, action):
    assert parse_turn(text) == action


def test_answer_matches_numbers_exactly():
    assert answer_matches("87", 87)
    assert answer_matches(" 87.0 ", 87)
    assert answer_matches("87.", 87)
    assert answer_matches("-21", -21)
    assert not answer_matches("about 87", 87)
    assert not answer_matches("88", 87)
    assert not answer_matches("", 87)


def test_it_is_a_responder_speaking_as_a_tool():
    assert isinstance(Calculator(), Responder)
    assert Calculator().role == "tool"


def test_start_counts_no_calls_and_names_a_missing_column():
    episodes = EpisodeStart(["q", "q"], torch.zeros(2, dtype=torch.long), {"answer": [3, 4]})
    assert Calculator().start(episodes) == [0, 0]
    with pytest.raises(KeyError, match="Calculator: the prompt source has no column 'answer'"):
        Calculator().start(EpisodeStart(["q"], torch.zeros(1, dtype=torch.long), {}))


def test_calls_answers_and_everything_else():
    responder = Calculator(call_cost=0.05)
    out = responder.respond(
        turn_input(
            ["calc: 12*7+3", "calc: 1/0", "calc: os.system(1)", "answer: 87", "answer: 86", "hm"],
            [87] * 6,
            states=[0, 1, 2, 3, 0, 2],
        )
    )
    assert list(out.observations) == [
        "87\n",
        "error: division by zero\n",
        "error: unexpected 'o' at position 0: only numbers, + - * / // % ** ^ and "
        "parentheses are allowed\n",
        None,
        None,
        FORMAT_HINT + "\n",
    ]
    assert list(out.rewards) == pytest.approx([-0.05, -0.05, -0.05, 1.0, 0.0, 0.0])
    assert list(out.done) == [False, False, False, True, True, False]
    assert list(out.states) == [1, 2, 3, 3, 0, 2]


def test_a_chat_prompt_gets_the_bare_value():
    chat = [{"role": "user", "content": "what is 2+2?"}]
    out = Calculator().respond(turn_input(["<calc>2+2</calc>"], [4], prompts=[chat]))
    assert list(out.observations) == ["4"]


def _value(expression: str) -> int:
    """The value of ``"a op b op c"`` with Python's precedence, without the evaluator."""
    a, op1, b, op2, c = re.fullmatch(r"(\d+)([-+*])(\d+)([-+*])(\d+)", expression).groups()
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    a, b, c = int(a), int(b), int(c)
    if op2 == "*" and op1 != "*":
        return ops[op1](a, b * c)
    return ops[op2](ops[op1](a, b), c)


def test_problems_are_distinct_seeded_and_right():
    problems = calculator_problems(200, digits=2, data_seed=1)
    assert problems == calculator_problems(200, digits=2, data_seed=1)
    assert problems != calculator_problems(200, digits=2, data_seed=2)
    assert len({e for e, _ in problems}) == 200
    for expression, value in problems:
        assert value == _value(expression), expression
        assert all(10 <= int(n) <= 99 for n in re.findall(r"\d+", expression))
    with pytest.raises(ValueError, match="digits=4"):
        calculator_problems(10, digits=4)
    with pytest.raises(ValueError, match="operations='/'"):
        calculator_problems(10, operations="/")


def test_question_forms():
    assert question("1+2*3", chat=False) == "what is 1+2*3? calc: expression, answer: number."
    assert "<calc>expression</calc>" in question("1+2*3", chat=True)


# ------------------------------------------------------------------ the env
def play(env, script, seed=0):
    """Reset, then step each row through the turns ``script(answers)`` gives it."""
    obs, info = env.reset(seed=seed)
    table = env.prompt_table
    answers = [table.columns["answer"][int(i)] for i in info["prompt_index"]]
    prompts = [table.prompts[int(i)] for i in info["prompt_index"]]
    returns, terminated, truncated, obs = step_scripted_turns(env, script(prompts), obs)
    return returns, terminated, truncated, obs, answers, prompts


def expression_of(prompt: str) -> str:
    return re.match(r"what is (\S+)\?", prompt).group(1)


def test_calling_the_calculator_then_copying_its_value_solves_the_task():
    env = make_calculator_vector(num_envs=4, group_size=1, autoreset=False, split="all")
    returns, terminated, truncated, obs, answers, prompts = play(
        env,
        lambda prompts: [
            [f"calc: {expression_of(p)}", f"answer: {_value(expression_of(p))}"] for p in prompts
        ],
    )
    assert terminated.all() and not truncated.any()
    assert returns.tolist() == [1.0] * 4
    for row, (answer, prompt) in enumerate(zip(answers, prompts, strict=True)):
        text = env.tokenizer.decode(obs["input_ids"][row][obs["attention_mask"][row].bool()])
        expected = f"calc: {expression_of(prompt)}<eos>{answer}<unk>answer: {answer}<eos>"
        assert text.endswith(expected), text


def test_a_wrong_answer_scores_zero_and_a_turn_without_an_action_gets_the_hint():
    env = make_calculator_vector(num_envs=2, group_size=1, autoreset=False, split="all")
    returns, terminated, _, obs, answers, _ = play(
        env, lambda prompts: [["hm", "answer: 1"], ["answer: 1"]]
    )
    assert terminated.all()
    assert returns.tolist() == [float(a == 1) for a in answers]
    text = env.tokenizer.decode(obs["input_ids"][0][obs["attention_mask"][0].bool()])
    assert text.endswith(f"hm<eos>{FORMAT_HINT}<unk>answer: 1<eos>")


def chat_expression(prompt) -> str:
    return re.search(r"is (\S+)\?", prompt[-1]["content"]).group(1)


def test_chat_prompts_render_the_tool_answer_through_the_template():
    tok = make_char_tokenizer()
    tok.chat_template = SIMPLE_TEMPLATE
    env = make_calculator_vector(
        num_envs=1, group_size=1, autoreset=False, split="all", tokenizer=tok
    )
    returns, terminated, _, obs, answers, prompts = play(
        env, lambda prompts: [[f"calc: {chat_expression(p)}", "answer: 0"] for p in prompts]
    )
    text = tok.decode(obs["input_ids"][0][obs["attention_mask"][0].bool()])
    assert f"<eos><unk>tool: {answers[0]}<unk>assistant: answer: 0<eos>" in text, text


def test_a_real_chat_tokenizer_hears_the_tool_as_a_tool_turn(smollm2_tokenizer):
    tok = smollm2_tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    env = make_calculator_vector(
        num_envs=1, group_size=1, autoreset=False, split="all", tokenizer=tok, stop_token_ids=[stop]
    )
    env.reset(seed=0)
    reward = terminated = None
    for turn in ("<calc>2+3</calc>", "<answer>5</answer>"):
        for token in tok(turn, add_special_tokens=False)["input_ids"] + [stop]:
            obs, reward, terminated, _, _ = env.step(torch.tensor([token]))
    text = tok.decode(obs["input_ids"][0][obs["attention_mask"][0].bool()])
    assert "Give your final answer as <answer>number</answer>.<|im_end|>\n" in text
    assert text.endswith(
        "<|im_start|>assistant\n<calc>2+3</calc><|im_end|>\n<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\n<answer>5</answer><|im_end|>"
    )
    assert bool(terminated[0]) and float(reward[0]) in (0.0, 1.0)
