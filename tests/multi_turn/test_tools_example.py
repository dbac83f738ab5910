"""examples/tool_weather.py runs end to end with tiny settings: the tool demo's
calls are answered (one refused for its argument type, one stopped at the time
limit), the scripted Weather episode is solved, and GRPO trains on the task."""

from __future__ import annotations

import math

from testkit import ROOT, import_script

EXAMPLE = ROOT / "examples" / "tool_weather.py"


def load_example():
    return import_script(EXAMPLE, "tool_weather_example")


def test_tool_weather_example_runs(capsys):
    heard, total, history = load_example().main(iterations=2)
    out = capsys.readouterr().out
    assert heard == [
        "done",
        "error: wait: argument 'seconds' must be number, got str 'a while'",
        "error: time limit: the call ran longer than 0.5 s",
    ]
    assert total == 1.0
    assert "weather: atlantis<eos>[error: " in out and "]answer: " in out
    assert "<tools>\n" in out and "<tool_call>" in out
    assert [int(row["iteration"]) for row in history] == [1, 2]
    assert all(math.isfinite(row["reward_mean"]) for row in history)
