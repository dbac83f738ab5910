"""Calculator: a tool-use task. The policy may call a calculator before it answers.

An episode: the prompt asks for the value of an expression too long to work out
in one's head (``"what is 37*23+19?"``, three two-digit operands by default). In
each turn the policy either

- calls the calculator: ``<calc>37*23</calc>`` (or, with no tags, ``calc: 37*23``
  to the end of the line); the responder (role ``"tool"``) evaluates the
  expression with ``safe_arith`` (never ``eval``; ``+ - * / // % **``,
  parentheses, decimals) and answers with its value (``"851"``) or the reason it
  cannot (``"error: division by zero"``); or
- answers: ``<answer>870</answer>`` (or ``answer: 870``), which ends the episode.

The first of these found in the turn counts (case-insensitive). A turn with
neither is answered with the format reminder ``FORMAT_HINT`` and the episode goes
on; the env ends it at ``max_turns`` or when the token budget runs out.

The calculator is a tool (``lmgym.envs.tasks.multi_turn.tools``): the typed
function ``calc(expression: str) -> str``, run in a worker process with a time and
a memory limit (``time_limit``, ``memory_limit_mb``) like every tool. A call in
the tool format, ``<tool_call>{"name": "calc", "arguments": {"expression":
"37*23"}}</tool_call>``, is read too (the earliest call or answer in the turn
counts); one that cannot run (malformed JSON, another tool's name, no
``expression``) is answered ``"error: ..."`` and counts as a call. With
``declare_tools=True`` a chat prompt declares ``calc`` in the model's format
(``tools.tool_messages``: the chat template's ``tools`` support, else the
default format) and asks for that call; the default keeps the prompts as they were.

Reward: on the answering turn, ``R = 1`` if the answer's text, whitespace
stripped, is a number equal to the expression's value (``"870"`` and
``"870.0"``; not ``"about 870"``), else 0; each calculator call adds
``-call_cost`` (default 0: calls are free, the turn limit bounds them). Range
``[0, 1]`` with the default ``call_cost``. Solved: ``R >= 0.9``.

The answer comes from the prompt source's ``answer`` column (an ``int``): problems
are drawn under ``data_seed`` (distinct, ``dataset_size`` of them) and split into
train/eval (``eval_fraction``) under the same seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt, distinct_draws
from lmgym.envs.tasks.multi_turn._common import Reply, column, split_records, turn_output
from lmgym.envs.tasks.multi_turn.safe_arith import evaluate, format_number
from lmgym.envs.tasks.multi_turn.tools import Tool, ToolRunner, parse_call, tool_messages
from lmgym.envs.tasks.multi_turn.tools.runner import DEFAULT_MEMORY_LIMIT_MB, DEFAULT_TIME_LIMIT
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

SOLVED_THRESHOLD = 0.9
DEFAULT_MAX_TURNS = 3
DEFAULT_MAX_NEW_TOKENS = 96
OPERATORS = "+-*"
FORMAT_HINT = "write calc: expression or answer: number"
_CALL = re.compile(
    r"<calc>(?P<calc>.*?)</calc>|<answer>(?P<answer>.*?)</answer>"
    r"|\bcalc:(?P<calc_line>[^\n]*)|\banswer:(?P<answer_line>[^\n]*)",
    re.IGNORECASE | re.DOTALL,
)
_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)")

Action = tuple[Literal["calc", "answer"], str]


def parse_turn(text: str) -> Action | None:
    """The turn's first calculator call or answer, ``("calc" | "answer", text)``, or
    ``None`` when it has neither. Tags (``<calc>...</calc>``) and line prefixes
    (``calc: ...`` to the end of the line) both count; the earliest one wins."""
    match = _CALL.search(text)
    if match is None:
        return None
    kind = match.lastgroup or ""
    return ("calc" if kind.startswith("calc") else "answer", match.group(kind).strip())


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "37*23+19".
    """
    return format_number(evaluate(expression))


CALC_TOOL = Tool(calc)


def parse_turn_with_tools(text: str) -> Action | tuple[Literal["error"], str] | None:
    """``parse_turn``, with a ``<tool_call>`` JSON call of ``calc`` read as well (the
    earliest of them counts): ``("calc", expression)``, ``("answer", text)``,
    ``("error", why)`` for a tool call that cannot run, or ``None``."""
    action = parse_turn(text)
    call = parse_call(text, {"calc": CALC_TOOL}, line_calls=False)
    if call is None:
        return action
    first = _CALL.search(text)
    if action is not None and first is not None and first.start() < call.start:
        return action
    if not call.ok:
        return ("error", str(call.error))
    return ("calc", str(call.arguments["expression"]))


def answer_matches(answer: str, expected: int | float) -> bool:
    """Whether ``answer`` (stripped) is a number equal to ``expected``."""
    answer = answer.strip()
    if not _DECIMAL.fullmatch(answer):
        return False
    return float(answer) == float(expected)


@dataclass(frozen=True)
class Calculator:
    """The responder: evaluates calculator calls, scores the final answer.

    The state of an episode is the number of calculator calls so far (an ``int``).

    Args:
        column: the prompt-source column holding each problem's answer (a number).
        call_cost: subtracted from the reward of each turn that calls the calculator.
        time_limit, memory_limit_mb: each call's bounds (``tools.ToolRunner``).
    """

    column: str = "answer"
    call_cost: float = 0.0
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    role: Literal["tool"] = "tool"
    runner: ToolRunner = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        runner = ToolRunner({"calc": calc}, self.time_limit, self.memory_limit_mb)
        object.__setattr__(self, "runner", runner)

    def start(self, episodes: EpisodeStart) -> list[int]:
        """No calls yet in any new episode (and every row has an answer to score).

        Raises:
            KeyError: the prompt source has no ``column`` column.
        """
        return [0] * len(column(episodes.columns, self.column, "Calculator"))

    def reply(self, text: str, expected: Any, calls: int) -> Reply:
        """The answer to one turn ``text`` whose problem's value is ``expected``."""
        action = parse_turn_with_tools(text)
        if action is None:
            return Reply(FORMAT_HINT, 0.0, False, calls)
        kind, body = action
        if kind == "answer":
            return Reply(None, float(answer_matches(body, expected)), True, calls)
        if kind == "error":
            return Reply(f"error: {body}", -self.call_cost, False, calls + 1)
        result = self.runner.call("calc", {"expression": body})
        if result.ok:
            observation = result.text
        elif result.error_type == "CalcError":  # written for the policy already
            observation = f"error: {result.message}"
        else:
            observation = f"error: {result.error}"
        return Reply(observation, -self.call_cost, False, calls + 1)

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's turn (see the module docstring)."""
        expected = column(turns.columns, self.column, "Calculator")
        return turn_output(
            [
                self.reply(text, answer, calls)
                for text, answer, calls in zip(
                    turns.turn_texts, expected, turns.states, strict=True
                )
            ],
            turns.prompts,
        )


def calculator_problems(
    dataset_size: int = 1000, digits: int = 2, operations: str = OPERATORS, data_seed: int = 0
) -> list[tuple[str, int]]:
    """``dataset_size`` distinct ``(expression, value)`` pairs ``"a op b op c"`` with
    ``digits``-digit operands, drawn under ``data_seed``.

    Raises:
        ValueError: ``digits`` not in ``[1, 3]``, ``operations`` not distinct operators
            from ``"+-*"``, or ``dataset_size`` beyond half the distinct expressions.
    """
    if not isinstance(digits, int) or not 1 <= digits <= 3:
        raise ValueError(f"digits={digits!r}: must be an integer in [1, 3]")
    bad = [op for op in operations if op not in OPERATORS]
    if not operations or bad or len(set(operations)) != len(operations):
        raise ValueError(f"operations={operations!r}: pick distinct operators from {OPERATORS!r}")
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def draw(rng: random.Random) -> str:
        a, b, c = (rng.randint(low, high) for _ in range(3))
        return f"{a}{rng.choice(operations)}{b}{rng.choice(operations)}{c}"

    distinct = (high - low + 1) ** 3 * len(operations) ** 2
    expressions = distinct_draws(draw, dataset_size, distinct, data_seed, "dataset_size")
    return [(expression, int(evaluate(expression))) for expression in expressions]


def question(expression: str, *, chat: bool, tool_call: bool = False) -> str:
    """The prompt's text for ``expression``: tags for a chat model (``tool_call``:
    the tool-call format instead of ``<calc>``), line prefixes in lowercase for plain
    text (the character tokenizer has no ``<``, ``>`` or ``/``)."""
    if chat and tool_call:
        return (
            f"What is {expression}? Call the calc tool to compute it, then give your final "
            "answer as <answer>number</answer>."
        )
    if chat:
        return (
            f"What is {expression}? You have a calculator: write <calc>expression</calc> "
            "and it replies with the value. Give your final answer as <answer>number</answer>."
        )
    return f"what is {expression}? calc: expression, answer: number."


@dataclass(frozen=True, kw_only=True)
class CalculatorParams(ChatSplit):
    """Calculator's parameters (and ``ChatSplit``'s: ``chat`` gives chat prompts with
    tags, ``False`` plain text with line prefixes; ``data_seed`` also seeds the
    problems).

    Attributes:
        digits: operand digits (2: ``[10, 99]``).
        operations: operators drawn from ``"+-*"``.
        dataset_size: distinct problems before the split.
        call_cost: reward subtracted per calculator call (default 0).
        time_limit: seconds a calculator call may run (default 2).
        memory_limit_mb: memory a call may add, MiB (default 256; 0: none).
        declare_tools: a chat prompt declares ``calc`` in the model's tool format
            and asks for a tool call (default: the ``<calc>`` tags, as before).
    """

    digits: int = 2
    operations: str = OPERATORS
    dataset_size: int = 1000
    call_cost: float = 0.0
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    declare_tools: bool = False


@task_factory(CalculatorParams, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, max_turns=DEFAULT_MAX_TURNS)
def make_calculator_vector(options: EnvOptions, params: CalculatorParams) -> TokenVectorEnv:
    """``lmgym/Calculator-v0`` as a native vector env (parameters: ``CalculatorParams``).

    Env options:
        max_turns: policy turns per episode (default 3: call, answer, one spare).
        max_new_tokens: token budget for the policy's turns and the tool's answers
            (default 96).
    """
    chat = params.wants_chat(options.tokenizer)
    tool_call = chat and params.declare_tools
    records = []
    problems = calculator_problems(
        params.dataset_size, params.digits, params.operations, params.data_seed
    )
    for expression, value in problems:
        prompt = chat_prompt(question(expression, chat=chat, tool_call=tool_call), chat=chat)
        if tool_call:
            prompt = tool_messages(prompt, [CALC_TOOL], options.tokenizer)
        records.append({"prompt": prompt, "answer": value})
    source = split_records(records, params)
    responder = Calculator("answer", params.call_cost, params.time_limit, params.memory_limit_mb)
    return build_env(
        options, source, None, responder=responder, max_new_tokens=DEFAULT_MAX_NEW_TOKENS
    )


make_calculator = single_env_factory(make_calculator_vector)
