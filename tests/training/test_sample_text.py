"""Printed samples show what the user asked (a chat prompt's last user message, a long
prompt's end), not the whole rendered chat prompt with its system prompt."""

from __future__ import annotations

import json

from lmgym.cli import main
from lmgym.training.sample_text import PROMPT_CHARS, prompt_label, sample_line, shorten

CHAT = [
    {"role": "system", "content": "you are a careful assistant who answers tersely"},
    {"role": "user", "content": "what is 1+1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "and 2+2?"},
]


def test_a_chat_prompt_is_labelled_by_its_last_user_message():
    assert prompt_label(CHAT, "<rendered template text>") == "and 2+2?"
    assert prompt_label("say hello:", "say hello:") == "say hello:"


def test_a_long_prompt_is_shown_by_its_end():
    text = "x" * 100 + "the question?"
    shown = shorten(text)
    assert len(shown) == PROMPT_CHARS and shown.startswith("...") and shown.endswith("question?")
    assert shorten("short") == "short"
    assert sample_line(text, "yes", 0.5) == f"  reward 0.50: {shown!r} -> 'yes'"


def test_eval_prints_the_last_user_message_not_the_system_prompt(tmp_path, capsys, monkeypatch):
    from lmgym.policy import save_tiny
    from lmgym.policy.tiny import make_tiny_lm

    model, tokenizer = make_tiny_lm()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}a:"
    )
    path = save_tiny(tmp_path / "chat", (model, tokenizer))
    (tmp_path / "chat_reward.py").write_text(
        "def one(prompts, completions, **columns):\n    return [1.0 for _ in completions]\n"
    )
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt": CHAT}) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = ["eval", "--model", str(path), "--prompts", "chat.jsonl", "--reward", "chat_reward:one"]
    assert main([*args, "--num-prompts", "1", "-k", "2"]) == 2  # one row: nothing held out
    assert "lmgym eval --split all scores every row" in capsys.readouterr().err
    args += ["--split", "all"]
    assert main([*args, "--num-prompts", "1", "-k", "2", "--json", "out.json"]) == 0
    out = capsys.readouterr().out
    assert "  reward 1.00: 'and 2+2?' -> " in out
    assert "careful assistant" not in out
    assert json.loads((tmp_path / "out.json").read_text())["samples"][0][0] == "and 2+2?"
