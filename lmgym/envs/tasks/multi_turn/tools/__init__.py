"""Tools in the model's format (issue 39): typed Python functions the policy calls
between its turns, each call parsed from its text and run with a time and memory
limit; the result is appended as a ``tool`` message.

One job a module:

- ``schema``: ``Tool`` (a typed function and its JSON schema, as ``transformers``
  derives it), the argument check;
- ``render``: the tools declared in the prompt, through the chat template's
  ``tools`` support when it has one, else a documented default format;
- ``parse``: the first call of a turn, ``<tool_call>`` JSON or one line
  ``name: argument``, with the error the policy is told when it cannot run;
- ``runner``: ``ToolRunner``, the calls run in a forked worker within the limits;
- ``memory``: the forked worker's memory bound (address space and resident memory);
- ``turn``: ``answer_call``, a turn's call parsed, run and answered.

``lmgym.envs.tasks.multi_turn.weather`` (``lmgym/Weather-v0``) and ``calculator``
(``lmgym/Calculator-v0``) are built on it.
"""

from lmgym.envs.tasks.multi_turn.tools.parse import ParsedCall, parse_call
from lmgym.envs.tasks.multi_turn.tools.render import (
    DEFAULT_TOOL_PROMPT,
    default_tool_prompt,
    plain_tool_text,
    template_uses_tools,
    tool_messages,
)
from lmgym.envs.tasks.multi_turn.tools.runner import ToolResult, ToolRunner
from lmgym.envs.tasks.multi_turn.tools.schema import (
    ArgumentError,
    Tool,
    ToolSchemaError,
    check_arguments,
    tool_table,
)
from lmgym.envs.tasks.multi_turn.tools.turn import CallOutcome, answer_call

__all__ = [
    "DEFAULT_TOOL_PROMPT",
    "ArgumentError",
    "CallOutcome",
    "ParsedCall",
    "Tool",
    "ToolResult",
    "ToolRunner",
    "ToolSchemaError",
    "answer_call",
    "check_arguments",
    "default_tool_prompt",
    "parse_call",
    "plain_tool_text",
    "template_uses_tools",
    "tool_messages",
    "tool_table",
]
