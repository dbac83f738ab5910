"""The bisection statistics of benchmarks/guess_bisect.py, on hand-played games."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from testkit import import_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the script imports harness, parts, workloads
gb = import_script(BENCHMARKS / "guess_bisect.py", "benchmark_guess_bisect")

HIGHER = "[\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n]"
LOWER = "[\n<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n]"


def test_a_bisecting_game() -> None:
    # secret 6 in 1..8: 4 (mid of 1..8) higher -> 6 (mid of 5..8 is 6 or 7): hit.
    stats = gb.bisection(["4" + HIGHER + "6"], [1 - 1 / 6])
    assert (stats.guesses, stats.consistent, stats.midpoint) == (2, 1.0, 1.0)
    assert (stats.solved, stats.turns_solved) == (1.0, 2.0)


def test_counting_up_is_consistent_but_not_bisecting() -> None:
    # secret 3: 1 higher, 2 higher, 3. Ranges 1..8, 2..8, 3..8: midpoints 4/5, 5, 5/6.
    stats = gb.bisection(["1" + HIGHER + "2" + HIGHER + "3"], [1 - 2 / 6])
    assert (stats.guesses, stats.consistent, stats.midpoint) == (3, 1.0, 0.0)
    assert stats.turns_solved == 3.0


def test_inconsistent_guesses_talk_and_unsolved_games() -> None:
    # 5 lower -> range 1..4; 7 is outside it; "no idea" has no number; never solved.
    texts = ["5" + LOWER + "7" + LOWER + "no idea", "4" + HIGHER + "is it 6?"]
    stats = gb.bisection(texts, [0.0, 0.0])
    assert stats.guesses == 4  # 5, 7 / 4, 6
    assert stats.consistent == pytest.approx(3 / 4)  # 7 is not
    assert stats.midpoint == pytest.approx(3 / 4)  # 5 (1..8), 4 (1..8), 6 (5..8); not 7
    assert stats.solved == 0.0 and math.isnan(stats.turns_solved)
