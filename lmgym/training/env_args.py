"""A task's env arguments (``--env KEY=VALUE``, ``env_kwargs``) checked and typed.

``check_env_kwargs(task, kwargs)`` checks that the task's vector factory
(``gymnasium.make_vec``'s ``vector_entry_point``) takes each argument and converts
its value to the argument's type: an env option's type is its ``EnvOptions`` field's
(``lmgym.envs.options.OPTION_TYPES``), a task's own parameter's the factory's
annotation. Conversion is strict: a ``bool`` takes a boolean, 1/0, or the strings
true/false/yes/no/1/0 (any case), and anything else (``"maybe"``) is an error
naming the argument and the type; an ``int`` takes an integer (not ``2.5``, not
``True``); a ``Literal`` one of its values; ``X | None`` also ``None``, ``"none"``
or ``"null"``; a sequence a list whose items convert. A string never becomes
``True`` by being non-empty. The arguments the run sets itself (``num_envs``,
``group_size``, ``tokenizer``, ``device``, ...) are refused. A factory taking
``**kwargs`` accepts any name (an env option's value still typed).
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any

from lmgym.envs.options import OPTION_TYPES
from lmgym.training.evaluation import vector_factory

RESERVED = {
    "num_envs": "--num-prompts x --group-size",
    "group_size": "--group-size",
    "tokenizer": "the policy's tokenizer",
    "device": "--device",
    "shard": "the data-parallel rank (torchrun)",
    "render_mode": "the run (it renders nothing)",
}
_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")
_NONE = ("none", "null")
_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


class _NoMatch(Exception):
    """``value`` does not convert to the type asked for."""


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """``value`` converted to ``annotation`` (see the module docstring).

    Raises:
        ValueError: it does not convert; the message names ``key`` and the type.
    """
    try:
        return _convert(value, annotation)
    except _NoMatch:
        raise ValueError(f"env argument {key}={value!r}: expected {describe(annotation)}") from None


def describe(annotation: Any) -> str:
    """The type in words, for an error: ``int | None`` -> ``"an integer"``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return f"one of {', '.join(map(repr, args))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None))
    if _item_type(annotation) is not None:
        return f"a list ({describe(_item_type(annotation))} each)"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _item_type(annotation: Any) -> Any:
    """``X`` of ``Sequence[X]``, ``list[X]`` or ``tuple[X, ...]``, else ``None``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (collections.abc.Sequence, list) and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _convert(value: Any, annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        if value is None or (isinstance(value, str) and value.lower() in _NONE):
            return None
        raise _NoMatch
    if origin in (typing.Union, types.UnionType):
        # None first ("none" is not the string "none" where None is allowed), then a
        # member the value already is (the item "5" of a list of ids or names stays a
        # name), then the first member it converts to.
        members = sorted(args, key=lambda a: a is not type(None))
        exact = [a for a in members if isinstance(a, type) and type(value) is a]
        for member in exact + members:
            try:
                return _convert(value, member)
            except _NoMatch:
                pass
        raise _NoMatch
    if origin is typing.Literal:
        if value not in args:
            raise _NoMatch
        return value
    item = _item_type(annotation)
    if item is not None:
        if not isinstance(value, list | tuple):
            raise _NoMatch
        return [_convert(v, item) for v in value]
    if annotation in _SCALARS:
        return _convert_scalar(value, annotation)
    return (
        value  # a type this module does not convert (a device, a tokenizer): the factory checks it
    )


def _convert_scalar(value: Any, annotation: type) -> Any:
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise _NoMatch
    if isinstance(value, bool):
        raise _NoMatch  # True is not the number 1
    if annotation is int or annotation is float:
        return _convert_number(value, annotation)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    raise _NoMatch


def _convert_number(value: Any, annotation: type[int] | type[float]) -> int | float:
    """An ``int`` (from an int or its text) or a ``float`` (from a number or its text)."""
    accepted = int if annotation is int else int | float
    if isinstance(value, accepted):
        return annotation(value)
    if isinstance(value, str):
        try:
            return annotation(value)
        except ValueError:
            raise _NoMatch from None
    raise _NoMatch


def check_env_kwargs(task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against ``task``'s vector factory and converted to its types.

    Args:
        task: a registered task id.
        kwargs: the env arguments, e.g. ``{"autoreset": "false", "max_new_tokens": 6}``.

    Returns:
        A new dict with converted values, e.g. ``{"autoreset": False, "max_new_tokens": 6}``.

    Raises:
        ValueError: an argument the run sets itself, one the factory does not take
            (listing those it does), or a value of the wrong type; each names the key.
    """
    factory = vector_factory(task)
    params = inspect.signature(factory).parameters
    types_ = _argument_types(factory)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    valid = sorted(n for n, p in params.items() if p.kind not in variadic and n not in RESERVED)
    out = {}
    for key, value in kwargs.items():
        if key in RESERVED:
            raise ValueError(
                f"env argument {key}: set by the run ({RESERVED[key]}), not an env argument"
            )
        if key not in params or params[key].kind in variadic:
            if takes_any:
                out[key] = coerce_value(key, value, OPTION_TYPES.get(key, Any))
                continue
            raise ValueError(
                f"env argument {key}: task {task} takes no such argument; valid: {', '.join(valid)}"
            )
        out[key] = coerce_value(key, value, types_.get(key, Any))
    return out


def _argument_types(factory: Any) -> dict[str, Any]:
    """The type of each argument ``factory`` takes: an env option's is its ``EnvOptions``
    field's, a task parameter's the factory's annotation (none where unresolvable)."""
    try:
        annotations = typing.get_type_hints(factory)
    except Exception:  # a user factory's annotation that does not resolve: unchecked
        annotations = {}
    return {**annotations, **OPTION_TYPES}


def with_policy_stop_ids(task: str, kwargs: dict[str, Any], policy: Any) -> dict[str, Any]:
    """``kwargs`` with ``stop_token_ids`` set to the policy's, where the run needs them.

    A chat model stops on more than its tokenizer's EOS (SmolLM2: ``<|im_end|>`` and
    ``<|endoftext|>``, from its generation config); an env built with the default
    (the EOS alone) refuses the others as actions, and the policy refuses such an env.
    So when the user gave no ``stop_token_ids``, the task's factory takes them, and
    the policy has more than the EOS, the run uses ``policy.stop_token_ids``; written
    into the run's ``env_kwargs``, they are recorded in ``config.json`` and a resume
    and ``lmgym eval --run`` build the same env.
    """
    from lmgym.training.evaluation import factory_accepts

    stop = [int(i) for i in getattr(policy, "stop_token_ids", [])]
    eos = policy.tokenizer.eos_token_id
    if "stop_token_ids" in kwargs or stop in ([], [eos]):
        return kwargs
    if not factory_accepts(task, "stop_token_ids"):
        return kwargs
    return {**kwargs, "stop_token_ids": stop}
