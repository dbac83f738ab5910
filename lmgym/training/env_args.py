"""A task's env arguments (``--env KEY=VALUE``, ``env_kwargs``) checked against its factory.

``check_env_kwargs(task, kwargs)`` looks up the task's vector factory
(``gymnasium.make_vec``'s ``vector_entry_point``) and, for each argument, checks
that the factory takes it and converts the value to the parameter's annotation,
strictly: a ``bool`` parameter takes a boolean, 1/0, or the strings
true/false/yes/no/1/0 (any case), and anything else (``"maybe"``) is an error
naming the argument; an ``int`` takes an integer (not ``2.5``, not ``True``); a
``Literal`` takes one of its values. A string never becomes ``True`` by being
non-empty. The arguments the run sets itself (``num_envs``, ``group_size``,
``tokenizer``, ``device``) are refused. A factory taking ``**kwargs`` accepts any
name (values unchecked).
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

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


def _fail(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"env argument {key}={value!r}: expected {expected}")


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """``value`` converted to ``annotation`` (see the module docstring).

    Raises:
        ValueError: it does not convert; the message names ``key``.
    """
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) < len(args) and (
            value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        ):
            return None
        if len(inner) == 1:
            return coerce_value(key, value, inner[0])
        return value  # e.g. ``torch.device | str``: left to the factory
    if origin is typing.Literal:
        if value not in args:
            raise _fail(key, value, f"one of {', '.join(map(repr, args))}")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise _fail(key, value, "true or false")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise _fail(key, value, "an integer")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _fail(key, value, "a number")
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise _fail(key, value, "a string")
    return value


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
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # unresolvable annotations: check names only
        hints = {}
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
                out[key] = value
                continue
            raise ValueError(
                f"env argument {key}: task {task} takes no such argument; valid: {', '.join(valid)}"
            )
        out[key] = coerce_value(key, value, hints.get(key, Any))
    return out


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
