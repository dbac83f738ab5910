"""Typed values: the one converter from outside values to a field's type, and the one check.

Every place lmgym reads a value for a typed field calls this module:

- ``parse_value`` converts a value that comes from outside Python: a command-line
  string (a flag, ``lmgym.cli.flags``), a JSON/YAML value (``--config FILE`` and
  a run's ``config.json``, ``lmgym.cli.train_args`` and
  ``lmgym.agents.config.config_from_dict``), an env argument (``--env KEY=VALUE``,
  read as JSON when it parses, and a config's ``env_kwargs``,
  ``lmgym.training.env_args``);
- ``check_value`` checks a value built in Python (an agent's or the asynchronous
  run's config, ``lmgym.agents.config.check_types``): it converts nothing.

Both raise ``FieldValueError``, whose message names the field, the value given and
what the field takes: ``iterations=2.5: expected an integer``,
``loss_aggregation='sum' is not one of ['seq-mean-token-mean', ...]``,
``beta=nan: must be a finite number``.

The rules of ``parse_value``, by annotation:

- ``bool``: ``True``/``False``, ``1``/``0``, or one of the words true/false,
  yes/no, 1/0 in any case. Nothing else: ``"maybe"``, ``2`` and ``"t"`` are errors,
  and a string is never true by being non-empty.
- ``int``: an integer, or its text; not ``2.5``, ``"2.5"`` or ``True``.
- ``float``: a finite number, or its text; not ``nan``/``inf``, not ``True``.
- ``str``: a string; a number or boolean is taken as its JSON text (``--env
  target=123`` is the string ``"123"``).
- ``Literal[...]``: one of its values (or a value's text).
- ``X | None``: ``None`` or the words none/null (any case), else an ``X``; so a
  ``str | None`` field cannot hold the string ``"none"``.
- ``A | B``: the member the value already is (the item ``"5"`` of a list of ids or
  names stays a name), else the first member that takes it; only when none does is
  a single value tried as a list of one (below).
- ``list[X]``, ``Sequence[X]``, ``tuple[X, ...]``: a list (or tuple) of ``X``;
  a single value is a list of that one value, in every source (``--env
  stop_token_ids=5``, ``lora_target_modules: q_proj`` in a file, and one value
  after a list flag alike).
- ``tuple[X, Y]``: a list of exactly that many values, returned as a tuple.
- ``dict[K, V]``: a mapping, keys and values converted.
- ``Any`` or any other type (a tokenizer, a ``torch.device``): the value unchanged;
  what receives it checks it.

``check_value`` takes the same types without converting: a ``bool`` field takes
only ``True``/``False`` (``"false"`` would count as true in Python), an ``int`` no
``bool`` or ``float``, a ``float`` a finite ``int`` or ``float``, a sequence a list
or tuple (never a single value), ``X | None`` also ``None``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

TRUE_WORDS = ("true", "yes", "1")
"""Text ``parse_value`` reads as ``True`` (any case)."""
FALSE_WORDS = ("false", "no", "0")
"""Text ``parse_value`` reads as ``False`` (any case)."""
NONE_WORDS = ("none", "null")
"""Text ``parse_value`` reads as ``None`` where a field allows it (any case)."""


class FieldValueError(ValueError, TypeError):
    """A value its field does not take; the message names the field, the value and the fix.

    Both a ``ValueError`` and a ``TypeError``: a caller that catches either (a
    command line's usage error, a constructor's type check) catches it.

    Attributes:
        field: the field's name as shown (``"iterations"``, ``"env argument autoreset"``).
        given: the value given.
        problem: what is wrong, e.g. ``": expected an integer"``.
        where: the source, e.g. ``"--config c.json"`` (``""``: none).
    """

    def __init__(self, field: str, given: Any, problem: str, where: str = "") -> None:
        self.field, self.given, self.problem, self.where = field, given, problem, where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field}={given!r}{problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its parts (the default would call __init__ with the message alone).
        return type(self), (self.field, self.given, self.problem, self.where)


class _Mismatch(Exception):
    """The value does not convert to the annotation asked for (internal)."""


class _NotFinite(_Mismatch):
    """A number that is NaN or infinite (internal)."""


@dataclasses.dataclass(frozen=True)
class _Reading:
    """How a value is read.

    Attributes:
        parse: convert an outside value (``parse_value``); ``False``: check a Python
            value (``check_value``).
        choices: a ``Literal`` of strings checks membership; ``False``: any string.
        wrap: a single value may stand for a list of one.
    """

    parse: bool
    choices: bool = True
    wrap: bool = True


def parse_value(field: str, raw: Any, annotation: Any, *, where: str = "") -> Any:
    """``raw`` (a command-line string or a JSON/YAML value) converted to ``annotation``.

    Args:
        field: the field's name, shown in an error.
        raw: the value given.
        annotation: the field's type, e.g. ``int | None`` or ``tuple[float, float]``.
        where: the source, prefixed to an error (``"--config c.json"``).

    Returns:
        The typed value (see the module docstring for the rules).

    Raises:
        FieldValueError: ``raw`` does not convert.
    """
    return _read(field, raw, annotation, _Reading(parse=True), where)


def check_value(field: str, value: Any, annotation: Any, choices: bool = True) -> None:
    """Check a Python value against ``annotation``, strictly; nothing is converted.

    Args:
        field: the field's name, shown in an error.
        value: the value.
        annotation: the field's type.
        choices: ``False``: a ``Literal`` of strings takes any string (the caller
            checks membership itself, with a message of its own).

    Raises:
        FieldValueError: the value has the wrong type, is a NaN or infinite float,
            or is not one of a ``Literal``'s values.
    """
    _read(field, value, annotation, _Reading(parse=False, choices=choices), "")


def describe(annotation: Any, *, python: bool = False) -> str:
    """What a field of ``annotation`` takes, in words: ``int | None`` -> ``"an integer or none"``.

    Args:
        annotation: the field's type.
        python: words for a Python value (``True or False``, ``None``) rather than
            for text (``true or false``, ``none``).
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None" if python else "none"
    if annotation is bool:
        return "True or False" if python else "true or false"
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (typing.Union, types.UnionType):
        ordered = sorted(args, key=lambda a: a is type(None))  # none last
        return " or ".join(describe(a, python=python) for a in ordered)
    item = _item_type(annotation)
    if item is not None:
        return f"a list ({describe(item, python=python)} each)"
    if origin is tuple:
        words = [describe(a, python=python) for a in args]
        items = f"{words[0]} each" if len(set(words)) == 1 else ", ".join(words)
        return f"a list of {len(args)} values ({items})"
    if annotation is dict or origin in (dict, collections.abc.Mapping):
        return "a mapping"
    return _WORDS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` (or ``Literal | None``) allows, ``None`` left out; else ``None``."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return literal_choices(inner[0])
    return None


def item_annotation(annotation: Any) -> Any:
    """The type of one item of a list-like or fixed-length tuple annotation, else ``None``.

    ``list[str]`` -> ``str``; ``tuple[float, float]`` -> ``float`` (a fixed tuple
    whose items differ has no single item type: ``None``).
    """
    item = _item_type(annotation)
    if item is not None:
        return item
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple and args and len(set(args)) == 1:
        return args[0]
    return None


# ------------------------------------------------------------------ internals
def _read(field: str, raw: Any, annotation: Any, reading: _Reading, where: str) -> Any:
    """``_convert``, its internal failure turned into the one public error."""
    try:
        return _convert(raw, annotation, reading)
    except _NotFinite:
        raise FieldValueError(field, raw, ": must be a finite number", where) from None
    except _Mismatch:
        raise FieldValueError(field, raw, _problem(annotation, reading), where) from None


def _problem(annotation: Any, reading: _Reading) -> str:
    """The error's tail: a choice not listed, else the type expected."""
    choices = literal_choices(annotation)
    if choices is not None and reading.choices:
        none = ""
        if type(None) in typing.get_args(annotation):
            none = f" or {describe(type(None), python=not reading.parse)}"
        return f" is not one of {list(choices)}{none}"
    return f": expected {describe(annotation, python=not reading.parse)}"


def _item_type(annotation: Any) -> Any:
    """``X`` of ``list[X]``, ``Sequence[X]`` or ``tuple[X, ...]``, else ``None``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, collections.abc.Sequence) and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _convert(raw: Any, annotation: Any, reading: _Reading) -> Any:
    """``raw`` as ``annotation`` under ``reading``; raises ``_Mismatch``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return _to_none(raw, reading)
    if origin in (typing.Union, types.UnionType):
        return _to_union(raw, args, reading)
    if origin is Literal:
        return _to_literal(raw, args, reading)
    item = _item_type(annotation)
    if item is not None:
        return _to_list(raw, item, origin is tuple, reading)
    if origin is tuple:
        return _to_tuple(raw, args, reading)
    if annotation is dict or origin in (dict, collections.abc.Mapping):
        return _to_mapping(raw, args or (Any, Any), reading)
    scalar = _SCALARS.get(annotation)
    return raw if scalar is None else scalar(raw, reading)


def _to_none(raw: Any, reading: _Reading) -> None:
    if raw is None or (reading.parse and isinstance(raw, str) and raw.lower() in NONE_WORDS):
        return None
    raise _Mismatch


def _to_union(raw: Any, members: tuple[Any, ...], reading: _Reading) -> Any:
    """``None`` first (``"none"`` is no value where none is allowed), then the member
    ``raw`` already is, then each member in order; a single value as a list of one last."""
    none = [a for a in members if a is type(None)]
    exact = [a for a in members if isinstance(a, type) and type(raw) is a]
    not_finite: _NotFinite | None = None
    for wrap in (False, True) if reading.parse else (False,):
        for member in none + exact + list(members):
            try:
                return _convert(raw, member, dataclasses.replace(reading, wrap=wrap))
            except _NotFinite as exc:
                not_finite = exc
            except _Mismatch:
                pass
    raise not_finite or _Mismatch()


def _to_literal(raw: Any, choices: tuple[Any, ...], reading: _Reading) -> Any:
    for choice in choices:
        if raw == choice and type(raw) is type(choice):  # True is not the choice 1
            return choice
    if reading.parse and isinstance(raw, str):
        for choice in choices:
            if str(choice) == raw:
                return choice
    if not reading.choices and isinstance(raw, str) and all(isinstance(c, str) for c in choices):
        return raw
    raise _Mismatch


def _to_list(raw: Any, item: Any, as_tuple: bool, reading: _Reading) -> Any:
    if isinstance(raw, list | tuple):
        items = list(raw)
    elif reading.parse and reading.wrap and raw is not None and not isinstance(raw, dict):
        items = [raw]
    else:
        raise _Mismatch
    inner = dataclasses.replace(reading, wrap=True)
    out = [_convert(value, item, inner) for value in items]
    return tuple(out) if as_tuple else out


def _to_tuple(raw: Any, items: tuple[Any, ...], reading: _Reading) -> tuple[Any, ...]:
    if not isinstance(raw, list | tuple) or len(raw) != len(items):
        raise _Mismatch
    return tuple(_convert(value, kind, reading) for value, kind in zip(raw, items, strict=True))


def _to_mapping(raw: Any, kinds: tuple[Any, ...], reading: _Reading) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        raise _Mismatch
    key_type, value_type = kinds
    return {
        _convert(key, key_type, reading): _convert(value, value_type, reading)
        for key, value in raw.items()
    }


def _to_bool(raw: Any, reading: _Reading) -> bool:
    if isinstance(raw, bool):
        return raw
    if reading.parse and isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if reading.parse and isinstance(raw, str) and raw.lower() in TRUE_WORDS + FALSE_WORDS:
        return raw.lower() in TRUE_WORDS
    raise _Mismatch


def _to_int(raw: Any, reading: _Reading) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if reading.parse and isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            raise _Mismatch from None
    raise _Mismatch


def _to_float(raw: Any, reading: _Reading) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = raw
    elif reading.parse and isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            raise _Mismatch from None
    else:
        raise _Mismatch
    if not math.isfinite(value):
        raise _NotFinite
    return float(value) if reading.parse else value


def _to_str(raw: Any, reading: _Reading) -> str:
    if isinstance(raw, str):
        return raw
    if reading.parse and isinstance(raw, int | float):  # bool included: true -> "true"
        return json.dumps(raw)
    raise _Mismatch


_SCALARS: dict[Any, Callable[[Any, _Reading], Any]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
}
_WORDS = {int: "an integer", float: "a number", str: "a string"}


def check_at_least(name: str, value: float, low: float = 1) -> None:
    """Raise ``ValueError`` ``"{name}={value}: must be >= {low}"`` when ``value < low``:
    the one wording of a lower bound on a count or a size."""
    if value < low:
        raise ValueError(f"{name}={value}: must be >= {low}")
