"""examples/custom_reward.py runs end to end and the reward rises."""

from __future__ import annotations

import pytest
from testkit import ROOT, import_script

EXAMPLE = ROOT / "examples" / "custom_reward.py"


def load_example():
    return import_script(EXAMPLE, "custom_reward_example")


@pytest.mark.learning
def test_custom_reward_example_learns(capsys):
    before, after = load_example().main(iterations=20, seed=0)
    assert after > before + 0.1, (before, after)
    assert "lmgym/VowelShare-v0: mean reward" in capsys.readouterr().out
