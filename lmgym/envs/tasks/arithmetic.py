"""Verifiable arithmetic, with outcome and process supervision.

Process supervision: docs/algorithms.md#process-supervision.

Prompts are ``"a<op>b="`` for every pair of operands in ``[0, max_operand]`` and
every operator in ``operations`` (default ``"+"``: 100 prompts such as ``"3+5="``);
the answer is the result in decimal (``"8"``, ``"-2"`` for subtraction), and the
completion must be the answer followed by the stop id (EOS), so a completion that
runs on is wrong. The default budget is the longest answer plus one token.

- ``lmgym/Arithmetic-v0`` (outcome supervision): ``R = 1`` iff the completion is
  exactly answer + EOS, else 0; range ``[0, 1]``. In per-token mode the potential
  form puts the whole reward on the final step, so bandit mode is the meaningful
  one. Random-policy baseline: about 0.001. Solved: ``R >= 0.9``.
- ``lmgym/ArithmeticProcess-v0`` (process supervision): the fraction of answer +
  EOS positions that are right, ``R = (1/K) * sum_{t<K} [y_t == target_t]``, range
  ``[0, 1]``. Its default is ``reward_mode="per_token"``: the potential form gives
  ``r_t = [digit t correct] / K``, a reward per correct digit (pair it with GRPO's
  ``advantage="process"``). Random-policy baseline: about 0.02. Solved: ``R >= 0.9``.

The two share prompts and the same optimum, so they compare outcome against
process supervision directly. ``split`` holds out ``eval_fraction`` of the
problems (under ``data_seed``) to test generalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import VectorFactory, build_env, named_task_factory
from lmgym.envs.tasks._common import (
    DataSplit,
    ExactMatchReward,
    PositionMatchReward,
    encode,
    target_table,
)
from lmgym.envs.token_env import TokenVectorEnv

SOLVED_THRESHOLD = 0.9
OPERATORS = "+-*"


def arithmetic_items(max_operand: int = 9, operations: str = "+") -> list[tuple[str, str]]:
    """Every ``(prompt, answer)`` pair, e.g. ``("3+5=", "8")``, in a fixed order.

    Raises:
        ValueError: ``max_operand < 0`` or an operator outside ``"+-*"``.
    """
    if not isinstance(max_operand, int) or max_operand < 0:
        raise ValueError(f"max_operand={max_operand!r}: must be an integer >= 0")
    bad = [op for op in operations if op not in OPERATORS]
    if not operations or bad or len(set(operations)) != len(operations):
        raise ValueError(f"operations={operations!r}: pick distinct operators from {OPERATORS!r}")
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return [
        (f"{a}{op}{b}=", str(apply[op](a, b)))
        for op in operations
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]


@dataclass(frozen=True, kw_only=True)
class ArithmeticParams(DataSplit):
    """Arithmetic's parameters (and ``DataSplit``'s: which problems the env serves).

    Attributes:
        max_operand: operands range over ``[0, max_operand]``.
        operations: operators drawn from ``"+-*"``.
    """

    max_operand: int = 9
    operations: str = "+"


def _arithmetic_vector(
    process: bool, options: EnvOptions, params: ArithmeticParams
) -> TokenVectorEnv:
    tokenizer = options.text_tokenizer()
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer: arithmetic answers end with EOS; use a tokenizer with one")
    every = arithmetic_items(params.max_operand, params.operations)
    items = params.select(every)
    targets = [encode(tokenizer, answer) + [tokenizer.eos_token_id] for _, answer in items]
    ids, lengths = target_table(targets, tokenizer.pad_token_id or 0)
    # The default budget fits the longest answer of *all* problems, so the train and
    # eval envs have the same shapes.
    longest = max(len(encode(tokenizer, answer)) for _, answer in every) + 1
    reward = (
        PositionMatchReward(ids, lengths, name="digit_match")
        if process
        else ExactMatchReward(ids, lengths, name="exact_match")
    )
    return build_env(options, [prompt for prompt, _ in items], reward, max_new_tokens=longest)


def _arithmetic_factory(
    process: bool, factory_name: str, doc: str, **defaults: Any
) -> VectorFactory:
    """The vector factory of the arithmetic task: per-digit reward iff ``process``."""

    def body(options: EnvOptions, params: ArithmeticParams) -> TokenVectorEnv:
        return _arithmetic_vector(process, options, params)

    return named_task_factory(body, ArithmeticParams, factory_name, doc, **defaults)


make_arithmetic_vector = _arithmetic_factory(
    False,
    "make_arithmetic_vector",
    """``lmgym/Arithmetic-v0`` as a native vector env (exact-match outcome reward).

    Parameters: ``ArithmeticParams``; token budget by default the longest answer
    plus EOS.
    """,
)
make_arithmetic = single_env_factory(make_arithmetic_vector)
make_arithmetic_process_vector = _arithmetic_factory(
    True,
    "make_arithmetic_process_vector",
    """``lmgym/ArithmeticProcess-v0`` as a native vector env (a reward per correct
    digit; per-token by default). Arguments as ``make_arithmetic_vector``.""",
    reward_mode="per_token",
)
make_arithmetic_process = single_env_factory(make_arithmetic_process_vector)
