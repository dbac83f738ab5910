"""README's real-model agent table is the one benchmarks/lm_bench.py renders from the
committed bench results (a README number is checked, not remembered)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import lm_bench  # noqa: E402


def _between_markers(text: str) -> str:
    start = text.index(lm_bench.BEGIN) + len(lm_bench.BEGIN)
    return text[start : text.index(lm_bench.END)].strip()


def test_readme_and_the_results_readme_carry_the_table_the_results_give():
    table = lm_bench.table()
    assert _between_markers((ROOT / "README.md").read_text()) == table
    assert _between_markers((lm_bench.RESULTS / "README.md").read_text()) == table


def test_held_out_means_over_seeds_and_the_gain_spread_by_hand():
    def run(agent: str, base: float, trained: float) -> dict:
        return {
            "agent": agent,
            "base_eval": {"sampled": {"reward_mean": base}},
            "trained_eval": {"sampled": {"reward_mean": trained}},
        }

    runs = [run("grpo", 0.25, 0.5), run("grpo", 0.25, 0.75), run("rloo", 0.0, 1.0)]
    base, trained, spread = lm_bench.held_out(runs, "grpo", "sampled")
    # gains 0.25 and 0.5: mean 0.375, sample standard deviation sqrt(0.03125)
    assert (base, trained) == (0.25, 0.625)
    assert spread == pytest.approx(0.17677669529663687)
    assert lm_bench.held_out(runs, "rloo", "sampled") == (0.0, 1.0, 0.0)
