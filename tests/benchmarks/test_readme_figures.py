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


def cost_ratios(results: str) -> dict[str, tuple[str, str]]:
    """``{baseline: ("1.08x", "1.43x")}``: the synchronous multi-turn side's time and
    memory ratios against each single-turn side, from multi_turn_cost.md."""
    pattern = (
        r"^- multi-turn / (single-turn[^:]*): \*\*([0-9.]+x)\*\* time .*?\*\*([0-9.]+x)\*\* peak"
    )
    return {m[1]: (m[2], m[3]) for m in re.finditer(pattern, results, re.M)}


def test_cost_ratios_parse_the_summary_lines() -> None:
    lines = (
        "- multi-turn / single-turn, equal tokens: **1.08x** time per iteration, **1.43x** "
        "peak memory (target)\n- multi-turn, continuous / single-turn, equal tokens: **2.18x** "
        "time per iteration, **1.40x** peak memory"
    )
    assert cost_ratios(lines) == {"single-turn, equal tokens": ("1.08x", "1.43x")}


def test_readme_multi_turn_cost_figures_match_the_results() -> None:
    results = (ROOT / "benchmarks/results/multi_turn_cost.md").read_text()
    ratios = cost_ratios(results)
    same, whole = (
        ratios["single-turn, equal tokens"],
        ratios["single-turn, equal tokens, whole-batch update"],
    )
    assert "--max-turn-tokens 16 --micro-batch-size 4" in results
    text = " ".join(README.split())
    assert f"took {same[0]} the time and {same[1]} the peak memory" in text
    assert f"and {whole[0]} the time of one whose update runs in a single pass" in text
