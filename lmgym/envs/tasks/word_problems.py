"""WordProblem: synthetic arithmetic word problems, checked against the data's answer.

Each prompt is a short story drawn from a few templates with a seeded RNG, e.g.
``"kim has 3 pens and gets 4 more. how many pens now? "`` (answer ``"7"``), ``"...
gives away 2. how many are left? "`` (subtraction, never below 0) or ``"... buys 3
bags of 4 eggs. how many eggs? "`` (multiplication), operands in ``[0,
max_operand]``. The problems are a ``RecordPrompts`` source with an ``answer``
column, so the reward is a plain function of the text and that column, the way a
user's own reward with a reference answer works (``FunctionReward`` passes the
column by name):

    R = 1 if completion == answer else 0

on the completion's text (a final EOS is not part of the text, see
``lmgym.envs.text``); range ``[0, 1]``. The default budget is the longest answer
plus one token, so a completion that runs on past the answer without stopping is
wrong. Bandit mode is the meaningful one (in per-token mode the potential form
pays the whole reward on the step that completes the answer).

Random-policy baseline (uniform token ids, default settings): about 0.0. Solved:
``R >= 0.9``. ``split`` holds out ``eval_fraction`` of the problems (under
``data_seed``) to test generalisation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from lmgym.envs.options import EnvOptions
from lmgym.envs.prompts import RecordPrompts
from lmgym.envs.rewards import FunctionReward
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._common import DataSplit, encode
from lmgym.envs.token_env import TokenVectorEnv

SOLVED_THRESHOLD = 0.9
NAMES = ("ann", "bob", "eve", "kim", "sam", "tom")
ITEMS = ("apple", "card", "egg", "pen", "shell")


def word_problem(rng: random.Random, max_operand: int) -> tuple[str, str]:
    """One ``(prompt, answer)`` pair drawn with ``rng``."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    kind = rng.randrange(3)
    if kind == 0:
        return f"{name} has {a} {item}s and gets {b} more. how many {item}s now? ", str(a + b)
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"{name} has {a} {item}s and gives away {b}. how many are left? ", str(a - b)
    return f"{name} buys {a} bags of {b} {item}s. how many {item}s? ", str(a * b)


def word_problem_items(
    dataset_size: int = 200, max_operand: int = 9, data_seed: int = 0
) -> list[tuple[str, str]]:
    """``dataset_size`` distinct ``(prompt, answer)`` pairs, in draw order.

    Raises:
        ValueError: ``max_operand < 0``, or more problems asked for than the templates
            can make distinct.
    """
    if not isinstance(max_operand, int) or max_operand < 0:
        raise ValueError(f"max_operand={max_operand!r}: must be an integer >= 0")
    distinct = 3 * len(NAMES) * len(ITEMS) * (max_operand + 1) ** 2
    if not isinstance(dataset_size, int) or not 1 <= dataset_size <= distinct // 2:
        raise ValueError(
            f"dataset_size={dataset_size!r}: must be in [1, {distinct // 2}] (half the "
            f"{distinct} problems the templates can make with max_operand={max_operand})"
        )
    rng = random.Random(data_seed)
    problems: dict[str, str] = {}
    while len(problems) < dataset_size:
        prompt, answer = word_problem(rng, max_operand)
        problems.setdefault(prompt, answer)
    return list(problems.items())


def exact_match(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str]
) -> list[float]:
    """1.0 where the completion's text is exactly the row's ``answer``, else 0.0."""
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


@dataclass(frozen=True, kw_only=True)
class WordProblemParams(DataSplit):
    """WordProblem's parameters (and ``DataSplit``'s; ``data_seed`` also seeds the
    problems).

    Attributes:
        dataset_size: distinct problems drawn (before the split).
        max_operand: operands range over ``[0, max_operand]``.
    """

    dataset_size: int = 200
    max_operand: int = 9


@task_factory(WordProblemParams)
def make_word_problem_vector(options: EnvOptions, params: WordProblemParams) -> TokenVectorEnv:
    """``lmgym/WordProblem-v0`` as a native vector env (exact match against the
    ``answer`` column); token budget by default the longest answer plus one token."""
    every = word_problem_items(params.dataset_size, params.max_operand, params.data_seed)
    items = params.select(every)
    source = RecordPrompts([{"prompt": prompt, "answer": answer} for prompt, answer in items])
    # The budget fits the longest answer of *all* problems: train and eval envs match.
    longest = max(len(encode(options.text_tokenizer(), answer)) for _, answer in every)
    return build_env(options, source, FunctionReward(exact_match), max_new_tokens=longest + 1)


make_word_problem = single_env_factory(make_word_problem_vector)
