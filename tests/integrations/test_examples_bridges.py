"""The bridge examples run end to end: examples/textarena_games.py,
examples/openenv_client.py and examples/openenv_server.py (live local servers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_textarena_example_solves_the_tower_of_hanoi(capsys):
    pytest.importorskip("textarena")
    assert load("textarena_games").main() == [1.0, 1.0]
    out = capsys.readouterr().out
    assert "[B C]<eos>You attempted an invalid move." in out
    assert "[A C]<eos>You moved disk 1 from A to C." in out


def test_openenv_client_example_plays_every_row_to_the_end(capsys):
    pytest.importorskip("openenv.core")
    returns = load("openenv_client").main(rows=3)
    # games 0, 1, 2 (digits 7, 3, 1) in the order the prompt stream deals them;
    # 1 - 0.1 per wrong guess
    assert sorted(returns) == pytest.approx([0.4, 0.8, 1.0])
    assert "1<eos>higher." in capsys.readouterr().out


def test_openenv_server_example_plays_frozen_lake_over_openenv(capsys):
    pytest.importorskip("openenv.core")
    assert load("openenv_server").main() == 1.0
    assert "> right: reward 1.0, done True" in capsys.readouterr().out
