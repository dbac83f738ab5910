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

import torch
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.single import single_env_factory
from lmgym.envs.tasks._common import (
    ExactMatchReward,
    PositionMatchReward,
    Split,
    build_env,
    encode,
    select_split,
    target_table,
)
from lmgym.envs.token_env import RewardMode, TokenVectorEnv, Unfinished
from lmgym.policy.special_tokens import AllowedSpecialTokens

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


def _arithmetic_vector(
    process: bool,
    *,
    num_envs: int,
    group_size: int,
    max_operand: int,
    operations: str,
    split: Split,
    eval_fraction: float,
    data_seed: int,
    max_new_tokens: int | None,
    reward_mode: RewardMode,
    unfinished: Unfinished,
    autoreset: bool,
    allowed_special_tokens: AllowedSpecialTokens,
    tokenizer: PreTrainedTokenizerBase | None,
    device: torch.device | str,
) -> TokenVectorEnv:
    tokenizer = tokenizer or make_char_tokenizer()
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer: arithmetic answers end with EOS; use a tokenizer with one")
    every = arithmetic_items(max_operand, operations)
    items = select_split(every, split, eval_fraction, data_seed)
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
    return build_env(
        tokenizer,
        [prompt for prompt, _ in items],
        reward,
        num_envs=num_envs,
        group_size=group_size,
        max_new_tokens=max_new_tokens or longest,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        device=device,
    )


def make_arithmetic_vector(
    num_envs: int = 1,
    group_size: int = 1,
    max_operand: int = 9,
    operations: str = "+",
    split: Split = "train",
    eval_fraction: float = 0.25,
    data_seed: int = 0,
    max_new_tokens: int | None = None,
    reward_mode: RewardMode = "bandit",
    unfinished: Unfinished = "score",
    autoreset: bool = False,
    allowed_special_tokens: AllowedSpecialTokens = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | str = "cpu",
) -> TokenVectorEnv:
    """``lmgym/Arithmetic-v0`` as a native vector env (exact-match outcome reward).

    Args:
        num_envs: ``num_prompts * group_size`` rows.
        group_size: completions per prompt.
        max_operand: operands range over ``[0, max_operand]``.
        operations: operators drawn from ``"+-*"``.
        split: ``"train"``, ``"eval"`` (held-out problems) or ``"all"``.
        eval_fraction: share of problems held out for ``"eval"``.
        data_seed: seeds the split.
        max_new_tokens: token budget (default: the longest answer plus EOS).
        reward_mode: ``"bandit"`` or ``"per_token"``.
        unfinished: the env's unfinished-completion policy.
        autoreset: next-step autoreset (continuous batching).
        tokenizer: default the built-in character tokenizer.
        device: where the env's tensors live.
    """
    return _arithmetic_vector(
        False,
        num_envs=num_envs,
        group_size=group_size,
        max_operand=max_operand,
        operations=operations,
        split=split,
        eval_fraction=eval_fraction,
        data_seed=data_seed,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        tokenizer=tokenizer,
        device=device,
    )


make_arithmetic = single_env_factory(make_arithmetic_vector)


def make_arithmetic_process_vector(
    num_envs: int = 1,
    group_size: int = 1,
    max_operand: int = 9,
    operations: str = "+",
    split: Split = "train",
    eval_fraction: float = 0.25,
    data_seed: int = 0,
    max_new_tokens: int | None = None,
    reward_mode: RewardMode = "per_token",
    unfinished: Unfinished = "score",
    autoreset: bool = False,
    allowed_special_tokens: AllowedSpecialTokens = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | str = "cpu",
) -> TokenVectorEnv:
    """``lmgym/ArithmeticProcess-v0`` as a native vector env (a reward per correct
    digit; per-token by default). Arguments as ``make_arithmetic_vector``."""
    return _arithmetic_vector(
        True,
        num_envs=num_envs,
        group_size=group_size,
        max_operand=max_operand,
        operations=operations,
        split=split,
        eval_fraction=eval_fraction,
        data_seed=data_seed,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        tokenizer=tokenizer,
        device=device,
    )


make_arithmetic_process = single_env_factory(make_arithmetic_process_vector)
