"""Tools declared in the model's format: the chat template's own ``tools``
rendering where it has one (the prompt renders to exactly what
``apply_chat_template(..., tools=...)`` writes), the documented default format
where it has not (SmolLM2), and one line per tool for plain text."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.prompts import render_chat
from lmgym.envs.tasks.multi_turn.tools import (
    Tool,
    default_tool_prompt,
    plain_tool_text,
    template_uses_tools,
    tool_messages,
)

# A Qwen2.5-style template: the tools go in the system turn.
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each function call, return a json object within <tool_call></tool_call> tags."
    "<|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{%- endif %}"
    "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama 3.1 style: the tools go in the first user message: not a system message.
IN_USER = (
    "{% for m in messages %}{{ m['role'] }}: {% if loop.first and tools %}"
    "{% for t in tools %}{{ t | tojson }} {% endfor %}{% endif %}{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def get_weather(city: str) -> str:
    """The weather in a city today.

    Args:
        city: The city's name.
    """
    return "sun"


TOOLS = [Tool(get_weather)]
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def with_template(template: str):
    tok = make_char_tokenizer()
    tok.chat_template = template
    return tok


@pytest.fixture
def smollm2(smollm2_tokenizer):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path)


def test_which_templates_render_tools(smollm2):
    assert template_uses_tools(with_template(QWEN_LIKE), TOOLS)
    assert template_uses_tools(with_template(IN_USER), TOOLS)
    assert not template_uses_tools(smollm2, TOOLS)  # SmolLM2's ChatML ignores tools
    assert not template_uses_tools(make_char_tokenizer(), TOOLS)  # no template at all


@pytest.mark.parametrize(
    "messages", [ASK, [{"role": "system", "content": "Be brief."}, *ASK]], ids=["bare", "system"]
)
def test_a_template_with_tools_renders_exactly_as_with_tools(messages):
    tok = with_template(QWEN_LIKE)
    prompt = tool_messages(messages, TOOLS, tok)
    expected = tok.apply_chat_template(
        messages, tools=[t.schema for t in TOOLS], tokenize=False, add_generation_prompt=True
    )
    assert render_chat(tok, prompt) == expected
    assert json.dumps(TOOLS[0].schema) in expected


def test_a_template_that_puts_tools_elsewhere_gets_the_default_format():
    prompt = tool_messages(ASK, TOOLS, with_template(IN_USER))
    assert prompt == [{"role": "system", "content": default_tool_prompt(TOOLS)}, *ASK]


def test_a_template_without_tools_gets_the_default_format(smollm2):
    prompt = tool_messages(ASK, TOOLS, smollm2)
    assert prompt[0]["role"] == "system" and prompt[1:] == ASK
    system = prompt[0]["content"]
    assert f"<tools>\n{json.dumps(TOOLS[0].schema)}\n</tools>" in system
    assert (
        '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>'
        in system
    )
    text = render_chat(smollm2, prompt)
    assert text.startswith("<|im_start|>system\nYou may call functions")
    assert "named SmolLM" not in text  # our system message replaces the default one
    own = tool_messages([{"role": "system", "content": "Be brief."}, *ASK], TOOLS, smollm2)
    assert own[0]["content"] == "Be brief.\n\n" + system


def test_plain_text_lists_each_tool_in_the_one_line_form():
    def ping() -> str:
        """Answer pong."""
        return "pong"

    assert plain_tool_text([*TOOLS, Tool(ping)]) == (
        "tool get_weather: the weather in a city today. call get_weather: city. "
        "tool ping: answer pong. call ping:"
    )
