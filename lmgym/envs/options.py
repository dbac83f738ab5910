"""The env options every task takes, declared once.

``EnvOptions`` holds the options of ``TokenVectorEnv`` that a task does not fix
itself: batching (``num_envs``, ``group_size``), the token budget, the reward
mode and its forms, the unfinished-completion policy, stop ids, special tokens,
reset mode, prompt order, sharding, rendering, tokenizer and device.

``task_factory`` turns a task's body ``body(options, **task_params) ->
TokenVectorEnv`` into its Gymnasium ``vector_entry_point``: one function that
takes the task's own parameters and every ``EnvOptions`` field as keyword
arguments, with a real signature (``inspect.signature`` lists them all with
their annotations, so ``--env KEY=VALUE`` can be checked against it). Built-in
tasks, ``register_reward_env`` and ``reward_env_factory`` all go through it, so
``gymnasium.make_vec(id, tokenizer=..., per_token_form="dense", shard=(1, 2))``
works the same for every task; ``single_env_factory`` (``lmgym.envs.single``)
gives the ``gymnasium.make`` face with the same options.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.token_env import (
    PerTokenForm,
    PromptOrder,
    RenderMode,
    RewardMode,
    TokenVectorEnv,
    Unfinished,
)
from lmgym.special_tokens import AllowedSpecialTokens
from lmgym.types import PromptSource, RewardModel

VectorFactory = Callable[..., TokenVectorEnv]


@dataclass(frozen=True)
class EnvOptions:
    """Options every task accepts, in ``gymnasium.make_vec`` and ``gymnasium.make`` alike.

    A task may change a default (``ArithmeticProcess`` defaults to
    ``reward_mode="per_token"``); its factory's signature shows the defaults it uses.
    See ``TokenVectorEnv`` for what each option does.

    Attributes:
        num_envs: Rows, ``num_prompts * group_size`` (``make_vec``'s ``num_envs``).
        group_size: Completions per prompt (``G``).
        max_new_tokens: Token budget of a completion; ``None``: the task's default.
        max_prompt_length: Width of the prompt region; ``None``: the longest prompt.
        reward_mode: ``"bandit"`` or ``"per_token"``.
        per_token_form: ``"potential"`` or ``"dense"`` (per-token mode).
        center_potential: Potential form: subtract ``R(x, empty)``.
        unfinished: ``"score"``, ``"penalty"`` or ``"mask"``.
        unfinished_penalty: Return of a cut-off completion under ``"penalty"``.
        stop_token_ids: Ids that end a completion; ``None``: the tokenizer's EOS. Pass
            ``stop_ids_for(model, tokenizer)`` (or ``policy.stop_token_ids``) to stop
            on every id of the model's ``generation_config`` too.
        allowed_special_tokens: Special tokens that are legal actions besides the stop
            ids (ids, token strings or ``"all"``).
        autoreset: ``False`` episode-synchronous, ``True`` next-step autoreset.
        prompt_order: ``"shuffle"`` or ``"sequential"``.
        shard: ``(rank, world_size)``: this env's share of a prompt stream shared by
            ``world_size`` data-parallel ranks; ``(0, 1)``: all of it.
        render_mode: ``None`` or ``"ansi"``.
        tokenizer: The policy's tokenizer; ``None``: the built-in character tokenizer.
        device: Where the env's tensors (and a task's reward model) live.
    """

    num_envs: int = 1
    group_size: int = 1
    max_new_tokens: int | None = None
    max_prompt_length: int | None = None
    reward_mode: RewardMode = "bandit"
    per_token_form: PerTokenForm = "potential"
    center_potential: bool = False
    unfinished: Unfinished = "score"
    unfinished_penalty: float = -1.0
    stop_token_ids: Sequence[int] | None = None
    allowed_special_tokens: AllowedSpecialTokens = ()
    autoreset: bool = False
    prompt_order: PromptOrder = "shuffle"
    shard: tuple[int, int] = (0, 1)
    render_mode: RenderMode | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    device: torch.device | str = "cpu"

    @property
    def num_prompts(self) -> int:
        """``num_envs // group_size``, after checking the division is exact."""
        return num_prompts_of(self.num_envs, self.group_size)

    def stop_ids(self) -> list[int]:
        """The ids that end a completion: ``stop_token_ids``, else the tokenizer's EOS.

        Raises:
            ValueError: neither is set.
        """
        if self.stop_token_ids is not None:
            return [int(i) for i in self.stop_token_ids]
        tokenizer = self.tokenizer or make_char_tokenizer()
        if tokenizer.eos_token_id is None:
            raise ValueError(
                "stop_token_ids: the tokenizer has no eos_token_id; pass stop_token_ids"
            )
        return [tokenizer.eos_token_id]

    def build(
        self, prompts: PromptSource, reward: RewardModel, *, max_new_tokens: int | None = None
    ) -> TokenVectorEnv:
        """The ``TokenVectorEnv`` over ``prompts`` and ``reward`` with these options.

        Args:
            prompts: The task's prompt source.
            reward: The task's reward model.
            max_new_tokens: The task's default budget, used when the options leave
                ``max_new_tokens`` at ``None``.
        """
        budget = self.max_new_tokens if self.max_new_tokens is not None else max_new_tokens
        if budget is None:
            raise ValueError("max_new_tokens: no token budget given; pass max_new_tokens=...")
        return TokenVectorEnv(
            self.tokenizer or make_char_tokenizer(),
            prompts,
            reward,
            num_prompts=self.num_prompts,
            group_size=self.group_size,
            max_new_tokens=budget,
            max_prompt_length=self.max_prompt_length,
            reward_mode=self.reward_mode,
            per_token_form=self.per_token_form,
            center_potential=self.center_potential,
            unfinished=self.unfinished,
            unfinished_penalty=self.unfinished_penalty,
            stop_token_ids=self.stop_token_ids,
            allowed_special_tokens=self.allowed_special_tokens,
            autoreset=self.autoreset,
            prompt_order=self.prompt_order,
            device=self.device,
            shard=self.shard,
            render_mode=self.render_mode,
        )


#: The ``EnvOptions`` field names, in declaration order.
ENV_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(EnvOptions))


def num_prompts_of(num_envs: int, group_size: int) -> int:
    """``num_envs // group_size``, after checking the division is exact."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r}: must be a positive integer")
    if not isinstance(num_envs, int) or num_envs < 1 or num_envs % group_size != 0:
        raise ValueError(
            f"num_envs={num_envs} is not a multiple of group_size={group_size}; "
            "num_envs = num_prompts * group_size"
        )
    return num_envs // group_size


def check_option_defaults(defaults: dict[str, Any], where: str) -> None:
    """Raise ``TypeError`` naming any key of ``defaults`` that is not an ``EnvOptions`` field."""
    unknown = sorted(set(defaults) - set(ENV_OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"{where}: unknown env option(s) {unknown}; the options are the fields of "
            f"EnvOptions: {', '.join(ENV_OPTION_NAMES)}"
        )


def task_factory(**defaults: Any) -> Callable[[Callable[..., TokenVectorEnv]], VectorFactory]:
    """Decorator: a task body ``body(options: EnvOptions, **task_params)`` becomes the
    task's vector factory, taking its parameters and every ``EnvOptions`` field.

    The factory's signature is: the body's required parameters, ``num_envs``,
    ``group_size``, then (keyword-only) the body's optional parameters and the other
    ``EnvOptions`` fields, each annotated. The factory fills a ``None`` tokenizer with
    the character tokenizer before calling the body, so ``options.tokenizer`` is set.

    Args:
        defaults: Task defaults for ``EnvOptions`` fields (e.g. ``reward_mode="per_token"``).

    Raises:
        TypeError: a default that is not an ``EnvOptions`` field, or a body parameter
            named like one.

    Example::

        @task_factory(max_new_tokens=8)
        def make_echo_vector(options: EnvOptions, word: str = "hi") -> TokenVectorEnv:
            return options.build([f"say {word}:"], EchoReward(word))
    """
    check_option_defaults(defaults, "task_factory")

    def decorate(body: Callable[..., TokenVectorEnv]) -> VectorFactory:
        return _make_factory(body, defaults)

    return decorate


def _make_factory(body: Callable[..., TokenVectorEnv], defaults: dict[str, Any]) -> VectorFactory:
    body_params = list(inspect.signature(body).parameters.values())[1:]  # after ``options``
    clash = sorted({p.name for p in body_params} & set(ENV_OPTION_NAMES))
    if clash:
        raise TypeError(f"{body.__name__}: parameters {clash} are EnvOptions fields; rename them")
    body_hints = typing.get_type_hints(body)
    option_hints = typing.get_type_hints(EnvOptions)
    POK, KW = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY

    def option(name: str, kind: inspect._ParameterKind) -> inspect.Parameter:
        default = defaults.get(name, EnvOptions.__dataclass_fields__[name].default)
        return inspect.Parameter(name, kind, default=default, annotation=option_hints[name])

    def task_param(p: inspect.Parameter, kind: inspect._ParameterKind) -> inspect.Parameter:
        return p.replace(kind=kind, annotation=body_hints.get(p.name, p.annotation))

    required = [task_param(p, POK) for p in body_params if p.default is p.empty]
    optional = [task_param(p, KW) for p in body_params if p.default is not p.empty]
    batching = [option("num_envs", POK), option("group_size", POK)]
    rest = [option(n, KW) for n in ENV_OPTION_NAMES if n not in ("num_envs", "group_size")]
    signature = inspect.Signature(
        [*required, *batching, *optional, *rest], return_annotation=TokenVectorEnv
    )
    names = list(signature.parameters)

    def factory(*args: Any, **kwargs: Any) -> TokenVectorEnv:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{factory.__name__}(): {err}; valid: {', '.join(names)}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        options = EnvOptions(**{name: values.pop(name) for name in ENV_OPTION_NAMES})
        if options.tokenizer is None:
            options = replace(options, tokenizer=make_char_tokenizer())
        return body(options, **values)

    factory.__name__ = factory.__qualname__ = body.__name__
    factory.__module__ = body.__module__
    factory.__doc__ = (inspect.getdoc(body) or "").rstrip() + (
        "\n\nEnv options: every ``EnvOptions`` field (``lmgym.envs.EnvOptions``) as a keyword "
        "argument; the signature shows this task's defaults."
    )
    factory.__signature__ = signature  # type: ignore[attr-defined]
    factory.__annotations__ = {
        **{p.name: p.annotation for p in signature.parameters.values()},
        "return": TokenVectorEnv,
    }
    return factory
