"""A task's body becomes its Gymnasium vector factory, taking every env option.

A task body ``body(options: EnvOptions, **task_params) -> TokenVectorEnv`` makes
its prompts and reward and returns ``build_env(options, prompts, reward,
max_new_tokens=<its default budget>)``.

``task_factory`` turns a task's body ``body(options, **task_params) ->
TokenVectorEnv`` into its ``vector_entry_point``: one function that takes the
task's own parameters and every ``EnvOptions`` field as keyword arguments, with a
real signature (``inspect.signature`` lists them all with their annotations, for
``help()`` and ``env_option_names``). Built-in tasks, ``register_reward_env`` and
``reward_env_factory`` all go through it, so ``gymnasium.make_vec(id,
tokenizer=..., per_token_form="dense", shard=(1, 2))`` works the same for every
task; ``single_env_factory`` (``lmgym.envs.single``) gives the ``gymnasium.make``
face with the same options.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.options import ENV_OPTION_NAMES, OPTION_TYPES, EnvOptions
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import Responder
from lmgym.types import PromptSource, RewardModel

VectorFactory = Callable[..., TokenVectorEnv]


class TaskParams:
    """Base of a frozen dataclass of task parameters that a task body takes as one
    argument (e.g. ``lmgym.envs.tasks._common.DataSplit``).

    A body parameter whose default is such a record (``data: DataSplit =
    DataSplit()``) stands, in the factory's signature, as the record's fields: one
    keyword argument each, in field order, with the default's values; the factory
    builds the record from them and passes it to the body.
    """


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
            return build_env(options, [f"say {word}:"], EchoReward(word))
    """
    check_option_defaults(defaults, "task_factory")

    def decorate(body: Callable[..., TokenVectorEnv]) -> VectorFactory:
        return _make_factory(body, defaults)

    return decorate


def named_task_factory(
    body: Callable[..., TokenVectorEnv], name: str, doc: str, **defaults: Any
) -> VectorFactory:
    """``task_factory(**defaults)(body)`` for a body that a function makes, one per task
    of a family: the factory is called ``name`` (its module's attribute of that name)
    and its docstring is ``doc``."""
    body.__name__ = body.__qualname__ = name
    body.__doc__ = doc
    return task_factory(**defaults)(body)


def _expand_records(
    params: list[inspect.Parameter], hints: dict[str, Any]
) -> tuple[list[inspect.Parameter], dict[str, tuple[type, list[str]]]]:
    """The body's parameters with each ``TaskParams`` one replaced by its fields (see
    ``TaskParams``), and ``{record parameter: (its class, its field names)}``."""
    flat: list[inspect.Parameter] = []
    records: dict[str, tuple[type, list[str]]] = {}
    for p in params:
        if not isinstance(p.default, TaskParams):
            flat.append(p)
            continue
        cls = type(p.default)
        field_hints = typing.get_type_hints(cls)
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        records[p.name] = (cls, names)
        for name in names:
            default = getattr(p.default, name)
            flat.append(inspect.Parameter(name, p.kind, default=default))
            hints[name] = field_hints[name]
    return flat, records


def _make_factory(body: Callable[..., TokenVectorEnv], defaults: dict[str, Any]) -> VectorFactory:
    body_hints = typing.get_type_hints(body)
    body_params, records = _expand_records(
        list(inspect.signature(body).parameters.values())[1:],
        body_hints,  # after ``options``
    )
    clash = sorted({p.name for p in body_params} & set(ENV_OPTION_NAMES))
    if clash:
        raise TypeError(f"{body.__name__}: parameters {clash} are EnvOptions fields; rename them")
    POK, KW = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY

    def option(name: str, kind: inspect._ParameterKind) -> inspect.Parameter:
        default = defaults.get(name, EnvOptions.__dataclass_fields__[name].default)
        return inspect.Parameter(name, kind, default=default, annotation=OPTION_TYPES[name])

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
        for name, (cls, record_fields) in records.items():
            values[name] = cls(**{field: values.pop(field) for field in record_fields})
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
