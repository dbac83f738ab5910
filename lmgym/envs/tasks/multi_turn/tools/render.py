"""How the tools are declared to the policy, in its own format.

- A chat template that renders ``tools`` (Qwen2.5, Hermes, Llama 3.1, ...): the
  prompt is what ``apply_chat_template(messages, tools=[schema, ...])`` writes. The
  env renders prompts without ``tools``, so ``tool_messages`` turns that into a
  system message: the text the template wrote for the tools and the system turn
  (found between the template's own system header and closer), checked by
  rendering it back: the prompt's ids are exactly those of the tools rendering.
- A chat template without tool support (SmolLM2's ChatML, for one), or one whose
  tools rendering cannot be expressed as a system message: the *default format*,
  the Hermes convention as a system message (appended to the conversation's own
  system message if it has one)::

      You may call functions to help with the user's request. Their signatures,
      one JSON schema a line, are inside <tools></tools>:
      <tools>
      {"type": "function", "function": {"name": "get_weather", ...}}
      </tools>
      To call one, write its name and arguments as JSON inside <tool_call></tool_call>:
      <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>
      The result comes back as a tool message.

- A plain-text prompt (no chat template: the character tokenizer) gets
  ``plain_tool_text``: one short lowercase sentence per tool, in the one-line call form
  (``tool get_weather: the weather in a city today. call get_weather: city``).

``template_uses_tools`` tells which: whether rendering with ``tools`` changes the
text at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from lmgym.envs.tasks.multi_turn.tools.schema import Tool

_PROBE_USER = "lmgym-tools-user-probe"
_PROBE_SYSTEM = "lmgym-tools-system-probe"

DEFAULT_TOOL_PROMPT = (
    "You may call functions to help with the user's request. Their signatures, one "
    "JSON schema a line, are inside <tools></tools>:\n<tools>\n{schemas}\n</tools>\n"
    "To call one, write its name and arguments as JSON inside <tool_call></tool_call>:\n"
    '<tool_call>{{"name": <function-name>, "arguments": <args-json-object>}}</tool_call>\n'
    "The result comes back as a tool message."
)


def schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools' JSON schemas, in order."""
    return [t.schema for t in tools]


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, Any]], **kw: Any
) -> str:
    return str(
        tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **kw
        )
    )


def template_uses_tools(tokenizer: PreTrainedTokenizerBase, tools: Sequence[Tool]) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` (the text with them
    differs from the text without); ``False`` without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": _PROBE_USER}]
    try:
        return _render(tokenizer, probe, tools=schemas(tools)) != _render(tokenizer, probe)
    except Exception:
        return False


def default_tool_prompt(tools: Sequence[Tool]) -> str:
    """The default format's system text declaring ``tools``."""
    return DEFAULT_TOOL_PROMPT.format(schemas="\n".join(json.dumps(s) for s in schemas(tools)))


def _with_system(messages: Sequence[Mapping[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` as the system message (after the existing one's
    content, if any)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{text}"
        return out
    return [{"role": "system", "content": text}, *out]


def _template_system(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]
) -> list[dict[str, Any]] | None:
    """``messages`` with one system message that renders, without ``tools``, to
    exactly what the template writes with them; ``None`` where there is none."""
    target = _render(tokenizer, messages, tools=schemas(tools))
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    frame = _render(tokenizer, [{"role": "system", "content": _PROBE_SYSTEM}, *rest])
    if frame.count(_PROBE_SYSTEM) != 1:
        return None
    head, tail = frame.split(_PROBE_SYSTEM)
    if not (
        target.startswith(head) and target.endswith(tail) and len(target) >= len(head) + len(tail)
    ):
        return None
    system = target[len(head) : len(target) - len(tail)]
    candidate = [{"role": "system", "content": system}, *rest]
    return candidate if _render(tokenizer, candidate) == target else None


def tool_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool], tokenizer: PreTrainedTokenizerBase
) -> list[dict[str, Any]]:
    """A chat prompt that declares ``tools`` in the model's format (module
    docstring): the template's own when it renders ``tools`` and that fits in a
    system message, else the default format."""
    if template_uses_tools(tokenizer, tools):
        own = _template_system(tokenizer, messages, tools)
        if own is not None:
            return own
    return _with_system(messages, default_tool_prompt(tools))


def _plain_type(spec: Mapping[str, Any]) -> str:
    kind = spec.get("type", "string")
    return kind if isinstance(kind, str) else " or ".join(kind)


def plain_tool_text(tools: Sequence[Tool]) -> str:
    """One lowercase sentence per tool, in the one-line call form, for a plain-text
    prompt (joined by ``". "``, no newline: the character tokenizer has none):
    ``tool NAME: SUMMARY. call NAME: PARAM`` (no parameter: ``call NAME:``)."""
    lines = []
    for tool in tools:
        summary = tool.description.strip().rstrip(".").lower()
        param = tool.required[0] if len(tool.required) == 1 else ""
        call = f"call {tool.name}: {param}".rstrip()
        lines.append(
            f"tool {tool.name}: {summary}. {call}" if summary else f"tool {tool.name}. {call}"
        )
    return ". ".join(lines)
