"""ChatArithmetic: arithmetic questions for a chat model, answered with a number.

Prompts are chat conversations (rendered with the policy tokenizer's chat
template; pass ``stop_token_ids=policy.stop_token_ids`` so the model's end of turn,
e.g. ``<|im_end|>``, ends the completion): ``"What is 7 + 8? Reply with the number
only."``, with addition, subtraction (never below zero) and small multiplication
(a ``digits``-digit number times one digit). ``digits=1`` (the default) draws
operands from ``[0, 9]``, ``digits=2`` from ``[10, 99]``, and so on. A tokenizer
without a chat template (the character tokenizer) gets the question as plain text
(``chat=`` forces either form).

Reward (``answer=``), on the completion's text (the stop token is not part of it):

- ``"last_number"`` (the default, lenient): ``R = 1`` iff the last integer in the
  text (``-?[0-9]+``) is the answer, else 0, as lm-evaluation-harness's
  "flexible-extract" reads a GSM8K answer: ``"7 + 8 = 15"`` and ``"The answer is
  15."`` score 1, ``"15, or 16"`` scores 0, ``"-15"`` is not ``15``.
- ``"first_number"`` (lenient, answer first): the first integer instead:
  ``"The answer is 15."`` scores 1, ``"7 + 8 = 15"`` scores 0 (its first number is 7).
- ``"exact"``: ``R = 1`` iff the text, whitespace stripped, is the answer in
  decimal (``"15"``, ``"-3"``), else 0. ``"The answer is 15."`` scores 0.

Range ``[0, 1]``; bandit mode is the meaningful one. Random-policy baseline (the
character tokenizer's uniform token ids, plain-text prompts): about 0.04, a lucky
digit under the lenient rule. Solved: ``R >= 0.9``.

Why ``"last_number"`` is the default. SmolLM2-135M-Instruct, asked for the number
only, mostly writes the equation out (``"8 * 8 = 64."``: how it computes) or
answers in a sentence, and at temperature 1 it often rambles. Measured on the
one-digit eval split, it scores 0 with ``"exact"`` (greedy and sampled), 0.06 to
0.14 sampled with ``"first_number"`` depending on the draw (an echoed equation
starts with an operand), and about 0.2 sampled (0.7 greedy) with
``"last_number"``: the default that most surely leaves a group-relative method a
learning signal. ``"first_number"``, ``"exact"`` and ``digits=2`` are the harder
levels (base scores for each: ``benchmarks/results/real_model_tasks.md``).

``split`` holds out ``eval_fraction`` of the problems (under ``data_seed``);
``dataset_size`` keeps a seeded subset of the distinct problems before the split
(default: all 255 one-digit problems; 1000 of the 9821 two-digit ones).
The default budget is 12 tokens: room for the equation written out, ``"47 + 38 =
85"`` (SmolLM2's tokenizer spends a token per digit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.prompts import RecordPrompts, shuffle_prompts
from lmgym.envs.rewards import FunctionReward
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt
from lmgym.envs.token_env import TokenVectorEnv

SOLVED_THRESHOLD = 0.9
OPERATORS = "+-*"
DEFAULT_MAX_NEW_TOKENS = 12
DEFAULT_DATASET_SIZE = 1000
QUESTION = "What is {a} {op} {b}? Reply with the number only."
AnswerRule = Literal["last_number", "first_number", "exact"]
_NUMBER = re.compile(r"-?\d+")


def problems(digits: int = 1, operations: str = OPERATORS) -> list[tuple[int, str, int, int]]:
    """Every distinct ``(a, op, b, result)``, in a fixed order.

    ``a`` ranges over the ``digits``-digit numbers (``[0, 9]`` for one digit), ``b``
    too for ``+`` and ``-`` (with ``a >= b``, so no result is negative) and over
    ``[0, 9]`` for ``*``.

    Raises:
        ValueError: ``digits`` not in ``[1, 4]``, or ``operations`` not distinct
            operators from ``"+-*"``.
    """
    if not isinstance(digits, int) or not 1 <= digits <= 4:
        raise ValueError(f"digits={digits!r}: must be an integer in [1, 4]")
    bad = [op for op in operations if op not in OPERATORS]
    if not operations or bad or len(set(operations)) != len(operations):
        raise ValueError(f"operations={operations!r}: pick distinct operators from {OPERATORS!r}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    span = range(low, 10**digits)
    out: list[tuple[int, str, int, int]] = []
    for op in operations:
        if op == "+":
            out += [(a, op, b, a + b) for a in span for b in span]
        elif op == "-":
            out += [(a, op, b, a - b) for a in span for b in span if a >= b]
        else:
            out += [(a, op, b, a * b) for a in span for b in range(10)]
    return out


def chat_arithmetic_items(
    digits: int = 1,
    operations: str = OPERATORS,
    dataset_size: int | None = None,
    data_seed: int = 0,
    *,
    chat: bool = True,
) -> list[tuple[object, str]]:
    """``(prompt, answer)`` pairs: a seeded subset of ``dataset_size`` problems (in
    source order); ``None``: every problem, or ``DEFAULT_DATASET_SIZE`` of them where
    there are more (two or more digits).

    Raises:
        ValueError: bad ``digits``/``operations`` (see ``problems``), or a
            ``dataset_size`` outside ``[1, number of problems]``.
    """
    every = problems(digits, operations)
    items = [
        (chat_prompt(QUESTION.format(a=a, op=op, b=b), chat=chat), str(r)) for a, op, b, r in every
    ]
    if dataset_size is None:
        if len(items) <= DEFAULT_DATASET_SIZE:
            return items
        dataset_size = DEFAULT_DATASET_SIZE
    if not isinstance(dataset_size, int) or not 1 <= dataset_size <= len(items):
        raise ValueError(
            f"dataset_size={dataset_size!r}: must be in [1, {len(items)}] (the distinct "
            f"problems for digits={digits}, operations={operations!r}), or None for all"
        )
    keep = sorted(shuffle_prompts(items, data_seed).indices[:dataset_size])
    return [items[i] for i in keep]


def first_number(text: str) -> str | None:
    """The first integer in ``text`` (``-?[0-9]+``) as written, or ``None``."""
    match = _NUMBER.search(text)
    return match.group() if match else None


def last_number(text: str) -> str | None:
    """The last integer in ``text`` (``-?[0-9]+``) as written, or ``None``."""
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def exact_number(
    prompts: Sequence[object], completions: Sequence[str], answer: Sequence[str]
) -> list[float]:
    """1.0 where the completion, whitespace stripped, is exactly ``answer``, else 0.0."""
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def first_number_match(
    prompts: Sequence[object], completions: Sequence[str], answer: Sequence[str]
) -> list[float]:
    """1.0 where the completion's first integer is ``answer``, else 0.0 (lenient)."""
    return [float(first_number(c) == a) for c, a in zip(completions, answer, strict=True)]


def last_number_match(
    prompts: Sequence[object], completions: Sequence[str], answer: Sequence[str]
) -> list[float]:
    """1.0 where the completion's last integer is ``answer``, else 0.0 (lenient)."""
    return [float(last_number(c) == a) for c, a in zip(completions, answer, strict=True)]


REWARDS = {
    "last_number": last_number_match,
    "first_number": first_number_match,
    "exact": exact_number,
}


@dataclass(frozen=True, kw_only=True)
class ChatArithmeticParams(ChatSplit):
    """ChatArithmetic's parameters (and ``ChatSplit``'s; ``data_seed`` also seeds the
    subset).

    Attributes:
        answer: ``"last_number"`` (lenient: the reply's last integer),
            ``"first_number"`` (its first integer) or ``"exact"`` (the reply is the
            number and nothing else).
        digits: operand digits (1: ``[0, 9]``, 2: ``[10, 99]``, ...; ``*`` always
            multiplies by one digit).
        operations: operators drawn from ``"+-*"``.
        dataset_size: keep this many problems (a seeded subset); ``None``: all of
            them, at most ``DEFAULT_DATASET_SIZE`` (1000).
    """

    answer: AnswerRule = "last_number"
    digits: int = 1
    operations: str = OPERATORS
    dataset_size: int | None = None


@task_factory(ChatArithmeticParams)
def make_chat_arithmetic_vector(
    options: EnvOptions, params: ChatArithmeticParams
) -> TokenVectorEnv:
    """``lmgym/ChatArithmetic-v0`` as a native vector env (parameters:
    ``ChatArithmeticParams``); token budget 12 by default."""
    answer = params.answer
    if answer not in REWARDS:
        raise ValueError(f"answer={answer!r}: must be one of {sorted(REWARDS)}")
    chat = params.wants_chat(options.tokenizer)
    every = chat_arithmetic_items(
        params.digits, params.operations, params.dataset_size, params.data_seed, chat=chat
    )
    items = params.select(every)
    source = RecordPrompts([{"prompt": prompt, "answer": a} for prompt, a in items])
    reward = FunctionReward(REWARDS[answer], name=f"{answer}_match")
    return build_env(options, source, reward, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


make_chat_arithmetic = single_env_factory(make_chat_arithmetic_vector)
