"""Tools as typed functions: the schema the model is shown (transformers'
``get_json_schema``), the argument check, and calls parsed from a turn's text,
good and bad."""

from __future__ import annotations

import pytest
from transformers.utils import get_json_schema

from lmgym.envs.tasks.multi_turn.tools import (
    ArgumentError,
    Tool,
    ToolSchemaError,
    check_arguments,
    parse_call,
    tool_table,
)


def get_weather(city: str, days: int = 1, metric: bool = True) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
        days: How many days ahead.
        metric: Celsius if true.
    """
    return city


def ping() -> str:
    """Answer pong."""
    return "pong"


def secret(key: str, vault: dict) -> str:
    """Look up a key.

    Args:
        key: The key.
        vault: The hidden table.
    """
    return vault[key]


TOOLS = tool_table([get_weather, ping])


def test_the_schema_is_transformers_own():
    tool = Tool(get_weather)
    assert tool.schema == get_json_schema(get_weather)
    assert tool.name == "get_weather" and tool.required == ["city"]
    assert tool.parameters["days"] == {"type": "integer", "description": "How many days ahead."}
    assert tool.description == "The weather in a city."


def test_a_renamed_tool_says_its_new_name_and_injected_parameters_are_hidden():
    tool = Tool(secret, name="lookup", injected=("vault",))
    assert tool.schema["function"]["name"] == "lookup"
    assert list(tool.parameters) == ["key"] and tool.required == ["key"]
    with pytest.raises(ArgumentError, match="unknown argument 'vault'"):
        check_arguments(tool, {"key": "a", "vault": {}})


def test_functions_without_a_schema_are_refused_with_the_fix():
    def untyped(x):
        """No types."""

    with pytest.raises(ToolSchemaError, match="type hint"):
        Tool(untyped)
    with pytest.raises(ToolSchemaError, match="injected parameter 'nope'"):
        Tool(secret, injected=("nope",))
    with pytest.raises(ToolSchemaError, match="two tools are named 'ping'"):
        tool_table([ping, ping])
    with pytest.raises(ToolSchemaError, match="must be a Python identifier"):
        Tool(ping, name="no spaces")


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({}, "missing required argument 'city'"),
        ({"city": 3}, "argument 'city' must be string, got int 3"),
        ({"city": "x", "days": "2"}, "argument 'days' must be integer"),
        ({"city": "x", "days": True}, "argument 'days' must be integer"),
        ({"city": "x", "metric": 1}, "argument 'metric' must be boolean"),
        ({"city": "x", "hours": 2}, "unknown argument 'hours'"),
        (["x"], "arguments must be a JSON object"),
    ],
)
def test_arguments_that_do_not_fit_the_schema_name_the_argument(arguments, error):
    with pytest.raises(ArgumentError, match=error):
        check_arguments(TOOLS["get_weather"], arguments)


def test_an_integral_float_is_an_integer():
    assert check_arguments(TOOLS["get_weather"], {"city": "x", "days": 2.0}) == {
        "city": "x",
        "days": 2,
    }


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "oslo"}}</tool_call>',
         "get_weather", {"city": "oslo"}),
        ('Let me check.\n<tool_call>\n{"name": "get_weather",\n "arguments": {"city": "rome", '
         '"days": 3}}\n</tool_call>', "get_weather", {"city": "rome", "days": 3}),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "lima"}}', "get_weather",
         {"city": "lima"}),  # no closing tag: to the end of the turn
        ('<TOOL_CALL>{"name": "get_weather", "parameters": {"city": "x"}}</TOOL_CALL>',
         "get_weather", {"city": "x"}),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"x\\"}"}</tool_call>',
         "get_weather", {"city": "x"}),  # OpenAI-style arguments string
        ('<tool_call>{"name": "ping"}</tool_call>', "ping", {}),
        ("get_weather: oslo", "get_weather", {"city": "oslo"}),
        ("hm. Get_Weather:  new york \nthanks", "get_weather", {"city": "new york"}),
        ("ping:", "ping", {}),
        ('ping: <tool_call>{"name": "get_weather", "arguments": {"city": "x"}}</tool_call>',
         "ping", None),  # the earliest call counts; "ping" takes no arguments
    ],
)  # fmt: skip
def test_calls_parse(text, name, arguments):
    call = parse_call(text, TOOLS)
    assert call is not None and call.name == name
    if arguments is None:
        assert (
            call.error
            == 'ping: takes no arguments, got \'<tool_call>{"name": "get_weather", "arguments": {"city": "x"}}</tool_call>\''
        )
    else:
        assert call.ok and call.arguments == arguments


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{name: get_weather}</tool_call>", "malformed tool call: Expecting property "
         "name enclosed in double quotes at position 1"),
        ("<tool_call>[1, 2]</tool_call>", 'need a JSON object with a "name" string'),
        ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
         "unknown tool 'get_time'; the tools are ['get_weather', 'ping']"),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>',
         "get_weather: argument 'city' must be string, got int 7"),
        ('<tool_call>{"name": "get_weather", "arguments": "{city"}</tool_call>',
         "get_weather: arguments are not valid JSON"),
    ],
)  # fmt: skip
def test_calls_that_cannot_run_say_why(text, error):
    call = parse_call(text, TOOLS)
    assert call is not None and not call.ok
    assert error in call.error


def test_no_call_and_line_calls_off():
    assert parse_call("the weather is fine", TOOLS) is None
    assert parse_call("forget_weather: x", TOOLS) is None  # a name must start a word
    assert parse_call("get_weather: oslo", TOOLS, line_calls=False) is None


def test_a_line_call_reads_the_parameter_type():
    def square(n: int) -> int:
        """Square a number.

        Args:
            n: The number.
        """
        return n * n

    tools = tool_table([square, get_weather])
    assert parse_call("square: 12", tools).arguments == {"n": 12}
    assert (
        parse_call("square: twelve", tools).error
        == "square: argument 'n' must be integer, got 'twelve'"
    )
