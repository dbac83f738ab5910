"""String tasks: Reverse, Sort and CopyRule (copy with a hidden rule).

Each prompt carries a random string over ``alphabet`` (default ``"abcde"``, length
4) and the completion must transform it:

- ``lmgym/Reverse-v0``: ``"rev:abcd="`` -> ``"dcba"``;
- ``lmgym/Sort-v0``: ``"sort:dbca="`` -> ``"abcd"``;
- ``lmgym/CopyRule-v0``: ``"shift:abce="`` -> ``"bcda"``: copy, moving every
  character ``shift`` places along the alphabet (cyclically), a rule the policy
  must discover from the reward alone.

Reward: the fraction of answer positions reproduced in place,
``R = (1/K) * sum_{t<K} [y_t == answer_t]`` (``K`` = answer length in tokens),
range ``[0, 1]``; tokens past ``K`` do not count and the default budget is ``K``
tokens. In per-token mode the potential form gives ``r_t = [y_t == answer_t] / K``.

Random-policy baseline (uniform token ids, default settings): about 0.02 for
each task (``1/V`` per position, ``V = 49``). Solved: ``R >= 0.9``.

Data. ``dataset_size`` distinct strings are drawn under ``data_seed``; ``split``
picks the train part, the held-out eval part (``eval_fraction`` of them, see
``lmgym.envs.prompts.split_prompts``) or all of them, so generalisation to unseen
strings can be measured with ``split="eval"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import VectorFactory, build_env, named_task_factory, task_factory
from lmgym.envs.tasks._common import (
    DataSplit,
    PositionMatchReward,
    encode,
    target_table,
)
from lmgym.envs.token_env import TokenVectorEnv

SOLVED_THRESHOLD = 0.9
Rule = Literal["reverse", "sort", "shift"]
PREFIX: dict[str, str] = {"reverse": "rev", "sort": "sort", "shift": "shift"}


def random_strings(count: int, length: int, alphabet: str, seed: int) -> list[str]:
    """``count`` distinct strings of ``length`` characters over ``alphabet``, drawn under ``seed``.

    Raises:
        ValueError: ``count`` exceeds the ``len(alphabet) ** length`` possible strings,
            or a bad ``length``/``alphabet``.
    """
    if length < 1:
        raise ValueError(f"length={length}: must be >= 1")
    if len(alphabet) < 1 or len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet={alphabet!r}: needs at least one character, each once")
    total = len(alphabet) ** length
    if not 1 <= count <= total:
        raise ValueError(
            f"dataset_size={count}: must be in [1, {total}] (there are only "
            f"len(alphabet) ** length = {total} distinct strings)"
        )
    generator = torch.Generator()
    generator.manual_seed(seed)
    if total <= 1_000_000:
        codes = torch.randperm(total, generator=generator)[:count].tolist()
    else:  # too many to enumerate: rejection-sample distinct codes
        chosen: dict[int, None] = {}
        while len(chosen) < count:
            for code in torch.randint(0, total, (count,), generator=generator).tolist():
                chosen.setdefault(code, None)
        codes = list(chosen)[:count]
    base = len(alphabet)
    return ["".join(alphabet[(code // base**i) % base] for i in range(length)) for code in codes]


def transform(rule: Rule, text: str, alphabet: str, shift: int = 1) -> str:
    """The answer to ``text`` under ``rule`` (``"shift"`` moves along ``alphabet`` cyclically)."""
    if rule == "reverse":
        return text[::-1]
    if rule == "sort":
        return "".join(sorted(text, key=alphabet.index))
    if rule == "shift":
        return "".join(alphabet[(alphabet.index(c) + shift) % len(alphabet)] for c in text)
    raise ValueError(f"rule={rule!r} is not one of ['reverse', 'sort', 'shift']")


def string_task_items(
    rule: Rule, length: int, alphabet: str, dataset_size: int, data_seed: int, shift: int = 1
) -> list[tuple[str, str]]:
    """``(prompt, answer)`` pairs, e.g. ``("rev:abcd=", "dcba")``."""
    strings = random_strings(dataset_size, length, alphabet, data_seed)
    return [(f"{PREFIX[rule]}:{s}=", transform(rule, s, alphabet, shift)) for s in strings]


@dataclass(frozen=True, kw_only=True)
class StringParams(DataSplit):
    """The string tasks' parameters (and ``DataSplit``'s; ``data_seed`` also seeds
    the strings).

    Attributes:
        length: characters per string.
        alphabet: the strings' characters.
        dataset_size: distinct strings drawn (before the split).
    """

    length: int = 4
    alphabet: str = "abcde"
    dataset_size: int = 64


@dataclass(frozen=True, kw_only=True)
class CopyRuleParams(StringParams):
    """CopyRule's parameters: ``StringParams`` and ``shift``, the places each
    character moves along ``alphabet`` (cyclically)."""

    shift: int = 1


def _string_task_vector(
    rule: Rule, options: EnvOptions, params: StringParams, shift: int = 0
) -> TokenVectorEnv:
    tokenizer = options.text_tokenizer()
    alphabet = params.alphabet
    unknown = [c for c in alphabet if tokenizer.unk_token_id in encode(tokenizer, c)]
    if unknown:
        raise ValueError(
            f"alphabet: characters {unknown} are not in the tokenizer's vocabulary; "
            "use characters the tokenizer knows"
        )
    items = params.select(
        string_task_items(
            rule, params.length, alphabet, params.dataset_size, params.data_seed, shift
        )
    )
    ids, lengths = target_table(
        [encode(tokenizer, answer) for _, answer in items], tokenizer.pad_token_id or 0
    )
    return build_env(
        options,
        [prompt for prompt, _ in items],
        PositionMatchReward(ids, lengths, name=f"{rule}_match"),
        max_new_tokens=ids.shape[1],
    )


def _string_factory(rule: Rule, factory_name: str, doc: str) -> VectorFactory:
    """The vector factory of the string task with ``rule`` and no other parameter."""

    def body(options: EnvOptions, params: StringParams) -> TokenVectorEnv:
        return _string_task_vector(rule, options, params)

    return named_task_factory(body, StringParams, factory_name, doc)


make_reverse_vector = _string_factory(
    "reverse",
    "make_reverse_vector",
    """``lmgym/Reverse-v0`` as a native vector env: write the prompt's string backwards.

    Parameters: ``StringParams``; token budget by default the answer length.
    """,
)
make_reverse = single_env_factory(make_reverse_vector)
make_sort_vector = _string_factory(
    "sort",
    "make_sort_vector",
    """``lmgym/Sort-v0`` as a native vector env: write the string's characters in
    alphabet order. Arguments as ``make_reverse_vector``.""",
)
make_sort = single_env_factory(make_sort_vector)


@task_factory(CopyRuleParams)
def make_copy_rule_vector(options: EnvOptions, params: CopyRuleParams) -> TokenVectorEnv:
    """``lmgym/CopyRule-v0`` as a native vector env: copy the string, moving each
    character ``shift`` places along ``alphabet`` (cyclically). Parameters:
    ``CopyRuleParams``."""
    return _string_task_vector("shift", options, params, params.shift)


make_copy_rule = single_env_factory(make_copy_rule_vector)
