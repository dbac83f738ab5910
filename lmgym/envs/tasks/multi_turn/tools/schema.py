"""Tools as typed Python functions: the JSON schema a model is shown, and the
check a call's arguments must pass before the function runs.

A tool is a plain function with type hints and a Google-style docstring (a summary
line, then ``Args:`` with one line per parameter); its schema is derived by
``transformers.utils.get_json_schema``, exactly the dict ``apply_chat_template(...,
tools=[fn])`` would render::

    def get_weather(city: str) -> str:
        \"\"\"The weather in a city today.

        Args:
            city: The city's name, e.g. "oslo".
        \"\"\"

``Tool(get_weather)`` holds the function, its name (``name=`` renames it: the
schema says the new name) and schema. ``check_arguments`` compares a call's
arguments with the schema: every required parameter present, no unknown one, and
each value of the declared JSON type (``string``, ``integer``, ``number``,
``boolean``, ``array``, ``object``, ``null``; a list of types; ``enum``). An
``integer`` parameter also takes an integral float (``3.0``), a ``number`` any int;
a ``bool`` is never a number. The error message names the tool, the argument and
what to send instead; it is shown to the policy as the tool's answer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import get_json_schema


class ToolSchemaError(ValueError):
    """A function cannot be a tool: no type hints or no docstring for a parameter
    (the message says which, from ``get_json_schema``), or a bad ``name``."""


class ArgumentError(ValueError):
    """A call's arguments do not fit the tool's schema; the message is meant for the
    policy (it is the tool's answer)."""


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


@dataclass(frozen=True)
class Tool:
    """A typed Python function offered to the policy as a tool.

    Args:
        fn: the function (type hints on every parameter, a Google-style docstring).
        name: the name the policy calls it by (default: the function's name).
        injected: parameters the environment fills in (an episode's hidden world,
            say) and the policy neither sees in the schema nor may set.

    Attributes:
        schema: ``{"type": "function", "function": {"name", "description",
            "parameters", ...}}`` as ``get_json_schema`` derives it (name replaced).

    Raises:
        ToolSchemaError: the function has no usable schema, or ``name`` is not an
            identifier.
    """

    fn: Callable[..., Any]
    name: str = ""
    injected: tuple[str, ...] = ()
    schema: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        try:
            schema = copy.deepcopy(get_json_schema(self.fn))
        except Exception as err:  # transformers raises its own TypeError subclasses
            raise ToolSchemaError(
                f"tool {getattr(self.fn, '__name__', self.fn)!r}: no JSON schema ({err}); give "
                "every parameter a type hint and a line under 'Args:' in a Google-style docstring"
            ) from err
        name = self.name or schema["function"]["name"]
        if not name.isidentifier():
            raise ToolSchemaError(
                f"tool name {name!r}: must be a Python identifier, e.g. 'get_weather'"
            )
        schema["function"]["name"] = name
        params = schema["function"].get("parameters", {})
        for hidden in self.injected:
            if hidden not in params.get("properties", {}):
                raise ToolSchemaError(
                    f"tool {name!r}: injected parameter {hidden!r} is not one of its parameters "
                    f"{sorted(params.get('properties', {}))}"
                )
            del params["properties"][hidden]
            if hidden in params.get("required", []):
                params["required"].remove(hidden)
        object.__setattr__(self, "injected", tuple(self.injected))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "schema", schema)

    @property
    def parameters(self) -> dict[str, Any]:
        """The schema's ``properties``: parameter name -> its JSON schema."""
        return dict(self.schema["function"].get("parameters", {}).get("properties", {}))

    @property
    def required(self) -> list[str]:
        """The parameters without a default."""
        return list(self.schema["function"].get("parameters", {}).get("required", []))

    @property
    def description(self) -> str:
        """The docstring's summary."""
        return str(self.schema["function"].get("description", ""))


def as_tool(tool: Tool | Callable[..., Any]) -> Tool:
    """``tool`` itself, or a function wrapped as ``Tool(fn)``."""
    return tool if isinstance(tool, Tool) else Tool(tool)


def tool_table(tools: Mapping[str, Tool] | list[Any] | tuple[Any, ...]) -> dict[str, Tool]:
    """Tools (or functions) by name.

    Raises:
        ToolSchemaError: two tools share a name, or there are none.
    """
    items = list(tools.values()) if isinstance(tools, Mapping) else list(tools)
    table: dict[str, Tool] = {}
    for item in items:
        tool = as_tool(item)
        if tool.name in table:
            raise ToolSchemaError(
                f"two tools are named {tool.name!r}; rename one with Tool(fn, name=...)"
            )
        table[tool.name] = tool
    if not table:
        raise ToolSchemaError("tools: none given; pass at least one typed function")
    return table


def _type_names(spec: Mapping[str, Any]) -> list[str]:
    kind = spec.get("type")
    if kind is None:
        return []
    return [kind] if isinstance(kind, str) else list(kind)


def check_value(tool: str, name: str, spec: Mapping[str, Any], value: Any) -> Any:
    """``value`` if it fits the parameter's schema ``spec`` (an integral float for an
    ``integer`` becomes an int).

    Raises:
        ArgumentError: the wrong type, or not one of the ``enum`` values.
    """
    kinds = _type_names(spec)
    if kinds and not any(_JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
        raise ArgumentError(
            f"{tool}: argument {name!r} must be {' or '.join(kinds)}, got "
            f"{type(value).__name__} {value!r}"
        )
    if "enum" in spec and value not in spec["enum"]:
        raise ArgumentError(
            f"{tool}: argument {name!r} must be one of {spec['enum']}, got {value!r}"
        )
    if kinds == ["integer"] and isinstance(value, float):
        return int(value)
    return value


def check_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """The arguments of a call to ``tool`` after checking them against its schema.

    Raises:
        ArgumentError: not an object, a missing required or an unknown argument, or
            a value of the wrong type (the message names the argument).
    """
    if not isinstance(arguments, dict):
        raise ArgumentError(
            f"{tool.name}: arguments must be a JSON object like "
            f'{{"{next(iter(tool.parameters), "x")}": ...}}, got {type(arguments).__name__}'
        )
    params = tool.parameters
    unknown = sorted(set(arguments) - set(params))
    if unknown:
        raise ArgumentError(
            f"{tool.name}: unknown argument {unknown[0]!r}; it takes {sorted(params)}"
        )
    missing = [name for name in tool.required if name not in arguments]
    if missing:
        raise ArgumentError(f"{tool.name}: missing required argument {missing[0]!r}")
    return {name: check_value(tool.name, name, params[name], v) for name, v in arguments.items()}


def line_arguments(tool: Tool, text: str) -> dict[str, Any]:
    """The arguments of a one-line call ``name: TEXT``: ``{}`` for a tool without
    parameters (``TEXT`` must be empty), else ``TEXT`` as the tool's one required
    parameter, read as its type (a number from its digits, ``true``/``false``).

    Raises:
        ArgumentError: the tool takes more than one required parameter (call it
            with JSON), or ``TEXT`` cannot be read as the parameter's type.
    """
    text = text.strip()
    required = tool.required
    if not required and not tool.parameters:
        if text:
            raise ArgumentError(f"{tool.name}: takes no arguments, got {text!r}")
        return {}
    if len(required) != 1:
        raise ArgumentError(
            f"{tool.name}: takes {len(required)} required arguments; call it with "
            f'<tool_call>{{"name": "{tool.name}", "arguments": {{...}}}}</tool_call>'
        )
    name = required[0]
    kinds = _type_names(tool.parameters[name]) or ["string"]
    value: Any = text
    if "string" not in kinds:
        value = _read_scalar(tool.name, name, text, kinds)
    return check_arguments(tool, {name: value})


def _read_scalar(tool: str, name: str, text: str, kinds: list[str]) -> Any:
    if "boolean" in kinds and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in kinds or "number" in kinds:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
    raise ArgumentError(f"{tool}: argument {name!r} must be {' or '.join(kinds)}, got {text!r}")
