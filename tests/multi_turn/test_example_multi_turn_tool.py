"""examples/multi_turn_tool.py runs end to end with tiny settings: the scripted
episode solves the task through the calculator, and GRPO trains on the multi-turn env."""

from __future__ import annotations

import math

import torch
from testkit import ROOT, import_script

EXAMPLE = ROOT / "examples" / "multi_turn_tool.py"


def load_example():
    return import_script(EXAMPLE, "multi_turn_tool_example")


def test_show_brackets_the_environments_tokens():
    example = load_example()
    from lmgym.char_tokenizer import make_char_tokenizer

    tok = make_char_tokenizer()
    ids = torch.tensor(tok("ab12cd", add_special_tokens=False)["input_ids"] + [0, 0])
    mask = torch.tensor([True] * 6 + [False] * 2)
    mine = torch.tensor([True, True, False, False, True, True, False, False])
    assert example.show(tok, ids, mask, mine) == "ab[12]cd"


def test_multi_turn_tool_example_runs(capsys):
    total, history = load_example().main(iterations=2, num_envs=4, group_size=2)
    out = capsys.readouterr().out
    assert total == 1.0
    assert "calc: " in out and "<eos>[" in out and "]answer: " in out
    assert [int(row["iteration"]) for row in history] == [1, 2]
    assert all(math.isfinite(row["reward_mean"]) for row in history)
    assert "a sampled episode of the trained policy:" in out
