"""examples/custom_reward.py runs end to end and the reward rises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_reward.py"


def load_example():
    spec = importlib.util.spec_from_file_location("custom_reward_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.learning
def test_custom_reward_example_learns(capsys):
    before, after = load_example().main(iterations=20, seed=0)
    assert after > before + 0.1, (before, after)
    assert "lmgym/VowelShare-v0: mean reward" in capsys.readouterr().out
