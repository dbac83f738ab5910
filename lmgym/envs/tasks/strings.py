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

from typing import Literal

import torch
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.single import single_env_factory
from lmgym.envs.tasks._common import (
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


def _string_task_vector(
    rule: Rule,
    *,
    num_envs: int,
    group_size: int,
    length: int,
    alphabet: str,
    dataset_size: int,
    split: Split,
    eval_fraction: float,
    data_seed: int,
    shift: int,
    max_new_tokens: int | None,
    reward_mode: RewardMode,
    unfinished: Unfinished,
    autoreset: bool,
    allowed_special_tokens: AllowedSpecialTokens,
    tokenizer: PreTrainedTokenizerBase | None,
    device: torch.device | str,
) -> TokenVectorEnv:
    tokenizer = tokenizer or make_char_tokenizer()
    unknown = [c for c in alphabet if tokenizer.unk_token_id in encode(tokenizer, c)]
    if unknown:
        raise ValueError(
            f"alphabet: characters {unknown} are not in the tokenizer's vocabulary; "
            "use characters the tokenizer knows"
        )
    items = select_split(
        string_task_items(rule, length, alphabet, dataset_size, data_seed, shift),
        split,
        eval_fraction,
        data_seed,
    )
    ids, lengths = target_table(
        [encode(tokenizer, answer) for _, answer in items], tokenizer.pad_token_id or 0
    )
    return build_env(
        tokenizer,
        [prompt for prompt, _ in items],
        PositionMatchReward(ids, lengths, name=f"{rule}_match"),
        num_envs=num_envs,
        group_size=group_size,
        max_new_tokens=max_new_tokens or ids.shape[1],
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        device=device,
    )


def make_reverse_vector(
    num_envs: int = 1,
    group_size: int = 1,
    length: int = 4,
    alphabet: str = "abcde",
    dataset_size: int = 64,
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
    """``lmgym/Reverse-v0`` as a native vector env: write the prompt's string backwards.

    Args:
        num_envs: ``num_prompts * group_size`` rows.
        group_size: completions per prompt.
        length: characters per string.
        alphabet: the strings' characters.
        dataset_size: distinct strings drawn (before the split).
        split: ``"train"``, ``"eval"`` (held out) or ``"all"``.
        eval_fraction: share of strings held out for ``"eval"``.
        data_seed: seeds the strings and the split.
        max_new_tokens: token budget (default: the answer length).
        reward_mode: ``"bandit"`` or ``"per_token"`` (potential form).
        unfinished: the env's unfinished-completion policy.
        autoreset: next-step autoreset (continuous batching).
        tokenizer: default the built-in character tokenizer.
        device: where the env's tensors live.
    """
    return _string_task_vector(
        "reverse",
        num_envs=num_envs,
        group_size=group_size,
        length=length,
        alphabet=alphabet,
        dataset_size=dataset_size,
        split=split,
        eval_fraction=eval_fraction,
        data_seed=data_seed,
        shift=0,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        tokenizer=tokenizer,
        device=device,
    )


make_reverse = single_env_factory(make_reverse_vector)


def make_sort_vector(
    num_envs: int = 1,
    group_size: int = 1,
    length: int = 4,
    alphabet: str = "abcde",
    dataset_size: int = 64,
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
    """``lmgym/Sort-v0`` as a native vector env: write the string's characters in
    alphabet order. Arguments as ``make_reverse_vector``."""
    return _string_task_vector(
        "sort",
        num_envs=num_envs,
        group_size=group_size,
        length=length,
        alphabet=alphabet,
        dataset_size=dataset_size,
        split=split,
        eval_fraction=eval_fraction,
        data_seed=data_seed,
        shift=0,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        tokenizer=tokenizer,
        device=device,
    )


make_sort = single_env_factory(make_sort_vector)


def make_copy_rule_vector(
    num_envs: int = 1,
    group_size: int = 1,
    length: int = 4,
    alphabet: str = "abcde",
    shift: int = 1,
    dataset_size: int = 64,
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
    """``lmgym/CopyRule-v0`` as a native vector env: copy the string, moving each
    character ``shift`` places along ``alphabet`` (cyclically). Other arguments as
    ``make_reverse_vector``."""
    return _string_task_vector(
        "shift",
        num_envs=num_envs,
        group_size=group_size,
        length=length,
        alphabet=alphabet,
        dataset_size=dataset_size,
        split=split,
        eval_fraction=eval_fraction,
        data_seed=data_seed,
        shift=shift,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        tokenizer=tokenizer,
        device=device,
    )


make_copy_rule = single_env_factory(make_copy_rule_vector)
