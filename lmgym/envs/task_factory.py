"""A task's parameters as a dataclass; its body becomes its Gymnasium vector factory.

A task declares its own parameters as a frozen, keyword-only dataclass deriving
from ``TaskParams`` (a task that holds data out derives from
``lmgym.envs.tasks._common.DataSplit``, itself a ``TaskParams``), and a body
``body(options: EnvOptions, params: TheParams) -> TokenVectorEnv`` that makes its
prompts and reward and returns ``build_env(options, prompts, reward,
max_new_tokens=<its default budget>)``. ``task_factory(TheParams)`` turns the body
into a ``TaskFactory``: the task's ``vector_entry_point``, which takes the
parameters' fields and every ``EnvOptions`` field as keyword arguments (or a
ready ``params=TheParams(...)``), so ``gymnasium.make_vec(id, tokenizer=...,
per_token_form="dense", shard=(1, 2), split="eval")`` works the same for every
task. ``factory_arguments`` lists what a factory takes, with types and defaults:
``--env KEY=VALUE`` (``lmgym.training.env_args``), ``env_option_names`` and the
single-env face (``lmgym.envs.single``) read it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, make_dataclass, replace
from typing import Any, Generic, TypeVar

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.options import ENV_OPTION_NAMES, OPTION_TYPES, EnvOptions, rows_of
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import Responder
from lmgym.types import PromptSource, RewardModel

VectorFactory = Callable[..., TokenVectorEnv]

#: The factory arguments that fix the batch, in this order: ``num_envs`` (Gymnasium's
#: rows, positional or keyword), ``group_size`` (positional or keyword) and
#: ``num_prompts`` (keyword; the run's pair is ``(num_prompts, group_size)``).
BATCHING = ("num_envs", "group_size", "num_prompts")


@dataclass(frozen=True, kw_only=True)
class TaskParams:
    """Base of a task's parameters: a frozen, keyword-only dataclass whose fields are
    the task's own keyword arguments (a field without a default is required). A
    task without parameters of its own takes ``TaskParams()``."""


P = TypeVar("P", bound=TaskParams)


def params_with_defaults(params: type[P], name: str, **defaults: Any) -> type[P]:
    """A subclass of ``params`` called ``name`` whose fields in ``defaults`` default
    to the values given: one task of a family (each game its own seed count)."""
    hints = typing.get_type_hints(params)
    unknown = sorted(set(defaults) - set(hints))
    if unknown:
        raise TypeError(f"{params.__name__} has no field(s) {unknown}")
    changed = [(key, hints[key], field(default=value)) for key, value in defaults.items()]
    made = make_dataclass(name, changed, bases=(params,), frozen=True, kw_only=True)
    made.__module__ = params.__module__
    return made


@dataclass(frozen=True)
class Argument:
    """One keyword argument of a vector factory.

    Attributes:
        name: the keyword.
        type: its annotation (``Any`` where unknown): what ``--env`` converts to.
        default: its default; ``MISSING``: required.
    """

    name: str
    type: Any
    default: Any = MISSING


def build_env(
    options: EnvOptions,
    prompts: PromptSource,
    reward: RewardModel | None,
    *,
    responder: Responder | None = None,
    max_new_tokens: int | None = None,
) -> TokenVectorEnv:
    """The ``TokenVectorEnv`` over ``prompts`` and ``reward`` with ``options``: what a
    task body returns.

    Args:
        options: The options the body was given.
        prompts: The task's prompt source.
        reward: The task's reward model; ``None`` for a multi-turn task whose turn
            rewards are its only rewards.
        responder: Makes the task multi-turn (``lmgym.envs.turns``); ``None``:
            single-turn.
        max_new_tokens: The task's default budget, used when the options leave
            ``max_new_tokens`` at ``None``.
    """
    if options.max_new_tokens is None:
        options = replace(options, max_new_tokens=max_new_tokens)
    return TokenVectorEnv(
        options.tokenizer or make_char_tokenizer(), prompts, reward, options, responder=responder
    )


def check_option_defaults(defaults: Mapping[str, Any], where: str) -> None:
    """Raise ``TypeError`` naming any key of ``defaults`` that is not an ``EnvOptions`` field."""
    unknown = sorted(set(defaults) - set(ENV_OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"{where}: unknown env option(s) {unknown}; the options are the fields of "
            f"EnvOptions: {', '.join(ENV_OPTION_NAMES)}"
        )


def param_arguments(params: type[TaskParams]) -> dict[str, Argument]:
    """The fields of a ``TaskParams`` class as arguments, in field order (a type that
    does not resolve is ``Any``)."""
    try:
        hints = typing.get_type_hints(params)
    except Exception:  # an annotation only a type checker can resolve: left unchecked
        hints = {}
    out = {}
    for f in fields(params):
        default = f.default if f.default_factory is MISSING else f.default_factory()
        out[f.name] = Argument(f.name, hints.get(f.name, Any), default)
    return out


class TaskFactory(Generic[P]):
    """A task's vector factory: ``factory(num_envs, group_size, *, params=None,
    **arguments)`` builds the ``EnvOptions`` and the task's parameters from its
    keyword arguments and calls the body with both.

    Args:
        body: ``body(options, params) -> TokenVectorEnv``; its name and docstring
            become the factory's.
        params: the task's ``TaskParams`` class.
        defaults: the task's defaults for ``EnvOptions`` fields.

    Raises:
        TypeError: a default that is not an ``EnvOptions`` field, or a parameter
            named like one.
    """

    def __init__(
        self,
        body: Callable[[EnvOptions, P], TokenVectorEnv],
        params: type[P],
        defaults: Mapping[str, Any],
    ) -> None:
        check_option_defaults(defaults, "task_factory")
        clash = sorted({f.name for f in fields(params)} & {*ENV_OPTION_NAMES, *BATCHING, "params"})
        if clash:
            raise TypeError(
                f"{params.__name__}: parameters {clash} are EnvOptions fields; rename them"
            )
        self.body, self.params, self.option_defaults = body, params, dict(defaults)
        self.__name__ = self.__qualname__ = body.__name__
        self.__module__ = body.__module__
        self.__doc__ = (inspect.getdoc(body) or "").rstrip() + (
            f"\n\nParameters: the fields of ``{params.__name__}`` and every ``EnvOptions`` "
            "field (``lmgym.envs.EnvOptions``), as keyword arguments; ``factory_arguments`` "
            "lists them with this task's defaults."
        )

    def arguments(self) -> dict[str, Argument]:
        """What the factory takes, in order: ``num_envs``, ``group_size``, the task's
        parameters, the other ``EnvOptions`` fields (with this task's defaults)."""

        def option(name: str) -> Argument:
            default = self.option_defaults.get(name, EnvOptions.__dataclass_fields__[name].default)
            return Argument(name, OPTION_TYPES[name], default)

        rest = [name for name in ENV_OPTION_NAMES if name not in BATCHING]
        return {
            "num_envs": option("num_envs"),
            "group_size": option("group_size"),
            "num_prompts": Argument("num_prompts", int | None, None),
            **param_arguments(self.params),
            **{name: option(name) for name in rest},
        }

    def __call__(
        self,
        num_envs: int | None = None,
        group_size: int | None = None,
        *,
        num_prompts: int | None = None,
        params: P | None = None,
        **arguments: Any,
    ) -> TokenVectorEnv:
        """The task's env; ``params`` (an instance of the task's ``TaskParams`` class)
        gives its parameters at once, a keyword naming a field overrides it.

        The batch is ``num_envs`` rows of ``group_size`` completions per prompt, or
        ``num_prompts`` prompts of ``group_size`` each (``num_envs = num_prompts *
        group_size``): ``gymnasium.make_vec(id, num_prompts=2, group_size=4)``.
        ``make_vec`` always passes ``num_envs`` (its default 1), so with
        ``num_prompts`` a ``num_envs`` of 1 counts as not given.

        Raises:
            TypeError: an argument the factory does not take (listing those it does),
                a required parameter missing, ``params`` of another class, or
                ``num_envs`` and ``num_prompts`` that disagree.
        """
        names = {f.name for f in fields(self.params)}
        unknown = sorted(set(arguments) - names - set(ENV_OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"{self.__name__}() got an unexpected keyword argument {unknown[0]!r}; "
                f"valid: {', '.join(self.arguments())}"
            )
        task = {k: v for k, v in arguments.items() if k in names}
        chosen = {k: v for k, v in arguments.items() if k not in names}
        if group_size is not None:
            chosen["group_size"] = group_size
        if num_prompts is not None:
            size = chosen.get("group_size", self.option_defaults.get("group_size", 1))
            rows = rows_of(num_prompts, size)
            if num_envs not in (None, 1, rows):
                raise TypeError(
                    f"{self.__name__}(): num_envs={num_envs} but num_prompts={num_prompts} x "
                    f"group_size={size} = {rows}; pass num_prompts or num_envs, not both"
                )
            num_envs = rows
        if num_envs is not None:
            chosen["num_envs"] = num_envs
        if params is not None and not isinstance(params, self.params):
            raise TypeError(
                f"{self.__name__}(): params is a {type(params).__name__}; "
                f"pass a {self.params.__name__}"
            )
        try:
            made = self.params(**task) if params is None else replace(params, **task)
        except TypeError as err:  # a required field missing
            raise TypeError(f"{self.__name__}(): {err}") from None
        options = EnvOptions(**{**self.option_defaults, **chosen})
        if options.tokenizer is None:
            options = replace(options, tokenizer=make_char_tokenizer())
        return self.body(options, made)

    def __repr__(self) -> str:
        return f"<task factory {self.__module__}.{self.__name__}>"


def task_factory(
    params: type[P] = TaskParams,  # type: ignore[assignment]
    **defaults: Any,
) -> Callable[[Callable[[EnvOptions, P], TokenVectorEnv]], TaskFactory[P]]:
    """Decorator: a task body ``body(options: EnvOptions, params: P)`` becomes the
    task's vector factory (a ``TaskFactory``), taking the fields of ``params`` and
    every ``EnvOptions`` field. The factory fills a ``None`` tokenizer with the
    character tokenizer before calling the body, so ``options.tokenizer`` is set.

    Args:
        params: the task's ``TaskParams`` class (default: no parameters).
        defaults: Task defaults for ``EnvOptions`` fields (e.g. ``reward_mode="per_token"``).

    Raises:
        TypeError: a default that is not an ``EnvOptions`` field, or a parameter
            named like one.

    Example::

        @dataclass(frozen=True, kw_only=True)
        class EchoParams(TaskParams):
            word: str = "hi"

        @task_factory(EchoParams, max_new_tokens=8)
        def make_echo_vector(options: EnvOptions, params: EchoParams) -> TokenVectorEnv:
            return build_env(options, [f"say {params.word}:"], EchoReward(params.word))
    """
    check_option_defaults(defaults, "task_factory")

    def decorate(body: Callable[[EnvOptions, P], TokenVectorEnv]) -> TaskFactory[P]:
        return TaskFactory(body, params, defaults)

    return decorate


def named_task_factory(
    body: Callable[[EnvOptions, P], TokenVectorEnv],
    params: type[P],
    name: str,
    doc: str,
    **defaults: Any,
) -> TaskFactory[P]:
    """``task_factory(params, **defaults)(body)`` for a body that a function makes, one
    per task of a family: the factory is called ``name`` (its module's attribute of
    that name) and its docstring is ``doc``."""
    body.__name__ = body.__qualname__ = name
    body.__doc__ = doc
    return TaskFactory(body, params, defaults)


def factory_arguments(factory: Callable[..., Any]) -> tuple[dict[str, Argument], bool]:
    """What a vector factory takes: ``({name: Argument}, takes_any)``.

    A ``TaskFactory`` lists its ``arguments()``; a user's plain function its named
    parameters (typed by their annotations where they resolve), ``takes_any`` when
    it has ``**kwargs``.
    """
    if isinstance(factory, TaskFactory):
        return factory.arguments(), False
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: takes nothing we can name
        return {}, False
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # a user factory's annotation that does not resolve: unchecked
        hints = {}
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = {
        p.name: Argument(
            p.name, hints.get(p.name, Any), MISSING if p.default is p.empty else p.default
        )
        for p in params
        if p.kind not in variadic
    }
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
