"""One policy turn's tool call, answered: parsed, run within the limits, and the
text the environment says back.

``answer_call(text, tools, runner)`` reads the turn's first call (``parse.parse_call``)
and, for a call that parses, runs it (``runner.ToolRunner``). The observation is
the result's text, or ``"error: ..."`` with the reason (malformed JSON, unknown
tool, wrong arguments, the tool raised, the time or memory limit). A turn without
a call is ``None``: the task decides what it means (usually the final answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmgym.envs.tasks.multi_turn.tools.parse import ParsedCall, parse_call
from lmgym.envs.tasks.multi_turn.tools.runner import ToolResult, ToolRunner
from lmgym.envs.tasks.multi_turn.tools.schema import Tool


@dataclass(frozen=True)
class CallOutcome:
    """A turn's call and what came of it.

    Attributes:
        call: the call read from the turn.
        result: what running it gave (``None`` when it did not parse, so never ran).
        observation: the tool message's text: the result, or ``"error: REASON"``.
    """

    call: ParsedCall
    result: ToolResult | None
    observation: str

    @property
    def ok(self) -> bool:
        """The call parsed, ran and returned."""
        return self.result is not None and self.result.ok


def answer_call(
    text: str,
    tools: Mapping[str, Tool],
    runner: ToolRunner,
    *,
    injected: Mapping[str, Any] | None = None,
    line_calls: bool = True,
) -> CallOutcome | None:
    """Parse the turn's first call and run it; ``None`` when the turn has no call.

    Args:
        text: the policy's turn.
        tools: the tools it may call, by name.
        runner: runs the call within its time and memory limits.
        injected: values for the called tool's ``injected`` parameters (only
            those it declares are passed).
        line_calls: read one-line calls (``name: argument``) as well as
            ``<tool_call>`` JSON.
    """
    call = parse_call(text, tools, line_calls=line_calls)
    if call is None:
        return None
    if not call.ok:
        return CallOutcome(call, None, f"error: {call.error}")
    hidden = {k: v for k, v in (injected or {}).items() if k in tools[call.name].injected}
    result = runner.call(call.name, {**call.arguments, **hidden})
    return CallOutcome(call, result, result.text if result.ok else f"error: {result.error}")
