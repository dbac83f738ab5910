"""README's benchmark figures are the committed results', not remembered ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def parked_ratios(results: str) -> dict[int, str]:
    """``{rows: "19.86x"}`` from the ``parked`` rows of concurrent_responders.md's table."""
    out = {}
    for line in results.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] == "parked":
            out[int(cells[1])] = next(c for c in cells if re.fullmatch(r"[0-9.]+x", c))
    return out


def test_parked_ratios_parse_a_table() -> None:
    table = "| parked | 64 | 4 | 1 / 2 | 3.0 | 1.0 | 5 | 6 | 19.86x | 9 |\n| aligned | 8 | 1x |"
    assert parked_ratios(table) == {64: "19.86x"}


def test_readme_parking_figures_match_the_results() -> None:
    results = (ROOT / "benchmarks/results/concurrent_responders.md").read_text()
    ratios = parked_ratios(results)
    assert set(ratios) == {8, 64}
    sentence = re.search(r"responder_park_after`.*?\(same results file", README, re.S)
    assert sentence, "README lost its sentence on parked rows"
    text = " ".join(sentence.group().split())
    assert f"{ratios[64]} the synchronous path's tokens/s at 64 rows" in text
    assert f"{ratios[8]} at 8" in text


def test_readme_guess_number_bisection_figures_match_the_record() -> None:
    import json

    record = json.loads((ROOT / "benchmarks/results/guess_bisect/guess_bisect-s0.json").read_text())
    first, last = record["evals"][0], record["evals"][-1]
    assert (len(record["history"]), last["iteration"]) == (80, 80)
    text = " ".join(README.split())
    greedy = (
        f"greedy return went from {first['greedy']['return']:.3f} to {last['greedy']['return']:.3f}"
    )
    sampled = (
        f"sampled one from {first['sampled']['return']:.3f} to {last['sampled']['return']:.3f}"
    )
    assert greedy in text and sampled in text
    assert f"{last['greedy']['midpoint']:.0%} of guesses at the middle" in text
    assert f"against {first['greedy']['midpoint']:.0%} for the base model" in text
    assert last["greedy"]["solved"] == 1.0 and "(all solved," in text
