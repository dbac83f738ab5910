"""Tool calls read from the policy's turn.

Two conventions are read; the one that starts earliest in the turn counts, and
only the first call of a turn is run (one call a turn):

- JSON in tags, the Hermes/Qwen convention most chat templates with tool support
  use: ``<tool_call>{"name": "get_weather", "arguments": {"city": "oslo"}}</tool_call>``.
  The closing tag may be missing (the JSON then runs to the end of the turn);
  ``"arguments"`` may also be a JSON-encoded string (OpenAI style) or be named
  ``"parameters"``; whitespace and newlines inside the tags are ignored.
- One line, for a tool with one required parameter (or none), and the only form
  a character-level model can write: ``get_weather: oslo`` (the tool's name at the
  start of a word, a colon, the argument to the end of the line; read as the
  parameter's type by ``schema.line_arguments``). Off with ``line_calls=False``.

A call that cannot be run is a ``ParsedCall`` whose ``error`` says why, in words
for the policy: malformed JSON (with the position), no ``name``, an unknown tool
(naming the tools there are), arguments that are not an object, or that do not fit
the schema (``schema.check_arguments``). A turn with no call is ``None``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lmgym.envs.tasks.multi_turn.tools.schema import (
    ArgumentError,
    Tool,
    check_arguments,
    line_arguments,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>(?P<body>.*?)(?:</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ParsedCall:
    """One call read from a turn.

    Attributes:
        name: the tool named (``""`` if none could be read).
        arguments: the checked arguments (``{}`` when ``error`` is set).
        error: why the call cannot run, for the policy; ``None`` for a good call.
        start: where the call starts in the turn's text.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    start: int = 0

    @property
    def ok(self) -> bool:
        """The call can run."""
        return self.error is None


def _line_pattern(names: list[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w])(?P<name>{alternatives})[ \t]*:(?P<rest>[^\n]*)", re.IGNORECASE)


def _tagged_call(body: str, tools: Mapping[str, Tool], start: int) -> ParsedCall:
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as err:
        return ParsedCall(
            "",
            error=f"malformed tool call: {err.msg} at position {err.pos}; write "
            f'{OPEN}{{"name": "...", "arguments": {{...}}}}{CLOSE}',
            start=start,
        )
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ParsedCall(
            "",
            error='malformed tool call: need a JSON object with a "name" string and "arguments"',
            start=start,
        )
    name = payload["name"]
    if name not in tools:
        return ParsedCall(
            name, error=f"unknown tool {name!r}; the tools are {sorted(tools)}", start=start
        )
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return ParsedCall(
                name, error=f"{name}: arguments are not valid JSON ({err.msg})", start=start
            )
    try:
        return ParsedCall(name, check_arguments(tools[name], arguments), start=start)
    except ArgumentError as err:
        return ParsedCall(name, error=str(err), start=start)


def parse_call(
    text: str, tools: Mapping[str, Tool], *, line_calls: bool = True
) -> ParsedCall | None:
    """The first tool call in ``text`` (see the module docstring), or ``None``."""
    found: list[ParsedCall] = []
    tagged = _TAGGED.search(text)
    if tagged is not None:
        found.append(_tagged_call(tagged.group("body"), tools, tagged.start()))
    if line_calls:
        match = _line_pattern(list(tools)).search(text)
        if match is not None:
            name = next(n for n in tools if n.lower() == match.group("name").lower())
            try:
                arguments = line_arguments(tools[name], match.group("rest"))
                found.append(ParsedCall(name, arguments, start=match.start()))
            except ArgumentError as err:
                found.append(ParsedCall(name, error=str(err), start=match.start()))
    return min(found, key=lambda c: c.start) if found else None
