"""The agent benchmark's report is rendered from run records alone: fixed records give
exactly these tables, and the JSON reads back as the records it came from."""

from __future__ import annotations

import json

import pytest

from lmgym.bench.report import (
    kept,
    load_results,
    plateaued,
    render_json,
    render_markdown,
    summarize,
    write_report,
)
from lmgym.bench.run import BenchSpec

TASK = "lmgym/TargetString-v0"
TOKENS_PER_ITERATION = 4096


def record(agent: str, seed: int, rewards: list[float], wall_s: float, peak: float) -> dict:
    """One ``run_job`` record with a 4-iteration curve."""
    history = [
        {
            "iteration": i + 1,
            "tokens_generated": TOKENS_PER_ITERATION * (i + 1),
            "reward_mean": r,
            "completion_length": 6.0,
        }
        for i, r in enumerate(rewards)
    ]
    return {
        "agent": agent,
        "task": TASK,
        "seed": seed,
        "iterations": 4,
        "num_prompts": 4,
        "group_size": 8,
        "overrides": {"learning_rate": 2e-3},
        "env_kwargs": {},
        "model": None,
        "history": history,
        "wall_s": wall_s,
        "start_rss_mib": 300.0,
        "peak_rss_mib": peak,
    }


SPEC = BenchSpec(agents=("grpo", "rloo"), tasks=(TASK,), seeds=(0, 1), iterations=4,
                 workers=0, window=2)  # fmt: skip
RECORDS = [
    # Rolling means over 2: 0.2, 0.35, 0.7, 0.95 -> solved at iteration 4; final 0.95.
    record("grpo", 0, [0.2, 0.5, 0.9, 1.0], 2.0, 400.0),
    # 0.9 at iteration 2 (the window is full) -> solved there; final (0.5 + 0.8) / 2.
    record("grpo", 1, [0.9, 0.9, 0.5, 0.8], 3.0, 410.0),
    record("rloo", 0, [0.0, 0.1, 0.2, 0.3], 4.0, 420.0),  # final 0.25, never solved
    record("rloo", 1, [0.1, 0.1, 0.1, 0.1], 5.0, 430.0),  # final 0.1
]


def test_fixed_records_render_to_exact_tables():
    markdown = render_markdown(RECORDS, SPEC, 90.0, out="out/bench", machine="test machine")
    lines = markdown.splitlines()
    assert lines[2] == (
        "Command: `lmgym bench --agents grpo,rloo --tasks lmgym/TargetString-v0 --seeds 0,1 "
        "--iterations 4 --workers 0 --out out/bench` — 4 runs in 1.5 min, every run in one "
        "process with one torch thread (test machine)."
    )
    summary = lines.index("## Summary")
    # grpo: finals 0.95 and 0.65 -> mean 0.8, std 0.212; rloo: 0.25 and 0.1.
    assert lines[summary + 2 : summary + 6] == [
        "| agent | TargetString |",
        "|---|---|",
        # Both grpo seeds reached 0.9, neither kept it: the means of their last (all 4)
        # iterations are 0.65 and 0.775.
        "| grpo | 0.800 ± 0.212 (reached 2/2, kept 0/2) |",
        "| rloo | 0.175 ± 0.106 (reached 0/2, kept 0/2) |",
    ]
    task = lines.index(f"## {TASK}")
    # grpo solved at iterations 4 and 2 (16,384 and 8,192 tokens): mean 3 and 12.3k;
    # 4 iterations x 4,096 tokens = 16.4k in all; wall mean; peak RSS max.
    assert lines[task + 4 : task + 10] == [
        "| agent | final reward (mean ± std) | reached | kept | plateau | iterations to solved "
        "| tokens to solved | tokens total | wall time (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        # rloo seed 1 ends flat at 0.1: a plateau; seed 0 still climbs (0.0 -> 0.3).
        "| grpo | 0.800 ± 0.212 | 2/2 | 0/2 | 0/2 | 3 | 12.3k | 16.4k | 2.5 | 410 |",
        "| rloo | 0.175 ± 0.106 | 0/2 | 0/2 | 1/2 | — | — | 16.4k | 4.5 | 430 |",
        "",
        "![TargetString learning curves](TargetString.png)",
    ]
    assert "ablations.md" not in markdown
    assert "[ablations.md](ablations.md)" in render_markdown(
        RECORDS, SPEC, 90.0, out="out/bench", machine="m", ablations=True
    )


def curve(rewards: list[float]) -> list[dict[str, float]]:
    return [{"reward_mean": r} for r in rewards]


@pytest.mark.parametrize(
    ("rewards", "is_kept", "is_plateau"),
    [
        ([0.0] * 5 + [0.9] * 10, True, False),  # the last 10 hold 0.9 exactly
        ([0.0] * 5 + [0.95] * 9 + [0.0], False, False),  # one slip: 0.855 over the last 10
        ([0.0] + [1.0] * 5 + [0.5] * 10, False, True),  # solved, then stuck at 0.5
        ([0.5] * 5 + [0.5, 0.56] * 5, False, False),  # 0.06 apart: not flat
        ([0.5] * 5 + [0.5, 0.55] * 5, False, True),  # 0.05 apart: flat
    ],
)
def test_kept_needs_the_last_ten_iterations_at_the_threshold(rewards, is_kept, is_plateau):
    assert kept(curve(rewards), 0.9) is is_kept
    assert plateaued(curve(rewards), 0.9) is is_plateau
    assert kept(curve(rewards), None) is None and plateaued(curve(rewards), None) is None


def test_json_holds_the_summary_and_reads_back_as_the_records(tmp_path):
    data = render_json(RECORDS, SPEC, 90.04)
    document = json.loads(data)
    assert document["total_s"] == 90.0
    assert document["summary"] == json.loads(json.dumps(summarize(RECORDS, SPEC)))
    assert document["runs"][0]["history"]["reward_mean"] == [0.2, 0.5, 0.9, 1.0]
    (tmp_path / "results.json").write_text(data)
    runs, total = load_results(tmp_path / "results.json")
    assert runs == RECORDS and total == 90.0


def test_write_report_writes_what_the_renderers_render(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "ablations.md").write_text("notes")
    markdown = write_report(RECORDS, SPEC, tmp_path, 90.0)
    assert (tmp_path / "README.md").read_text() == markdown
    assert "[ablations.md](ablations.md)" in markdown
    assert (tmp_path / "results.json").read_text() == render_json(RECORDS, SPEC, 90.0)
    assert (tmp_path / "TargetString.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
