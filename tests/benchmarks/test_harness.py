"""benchmarks/harness.py: alternation order, tables, phase tables from lmgym's labels,
and the time-boxed sections gpu.py relies on when it runs unattended."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import harness as h  # noqa: E402

from lmgym.profiling import phase  # noqa: E402


def test_alternate_warms_up_then_runs_abba():
    calls: list[str] = []

    def side(name: str, seconds: float):
        def run() -> float:
            calls.append(name)
            return seconds

        return run

    ta, tb = h.alternate(side("A", 1.0), side("B", 2.0), warmup=1, repeats=4)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]
    assert ta == [1.0] * 4 and tb == [2.0] * 4


def test_table_spread_and_pooled_ratios():
    assert h.table("name | x | y", [["a", 1, 2], "b | 3 | 4"], left=1) == [
        "| name | x | y |",
        "|---|---:|---:|",
        "| a | 1 | 2 |",
        "| b | 3 | 4 |",
    ]
    assert h.spread([1.0, 2.0, 3.0, 4.0, 5.0], digits=1) == "3.0 [2.0, 4.0] (1.0-5.0)"
    rows = [
        h.Comparison("r", a, b, 2, load) for a, b, load in [(4, 2, 0.0), (3, 3, 0.2), (9, 3, 0.1)]
    ]
    pooled = h.pool(rows)
    assert (pooled.a, pooled.b, pooled.repeats, pooled.other_load) == (4, 3, 6, 0.2)
    assert pooled.process_ratios == (2.0, 1.0, 3.0) and pooled.ratio == 2.0
    assert h.ratios_block([pooled]) == ["", "- r: per-process ratios 2.00x, 1.00x, 3.00x"]
    assert h.ratios_block(rows) == []


def test_phase_table_rows_are_label_paths_in_tree_order_with_shares():
    phases: h.Phases = {
        "wall": (2.0, 1.0),
        "collect": (0.2, 1.0),
        "collect/act": (0.4, 8.0),
        "backward": (1.0, 1.0),
        "collect/act/decode/trunk": (0.2, 7.0),
        "unlabelled": (0.2, 0.0),
    }
    assert h.phase_table({"run": phases}, {"run": {"steps": 8.0}}) == [
        "| phase (exclusive s per call) | run |",
        "|---|---:|",
        "| wall | 2.000 |",
        "| `collect` | 0.200 (10%) |",
        "| `collect/act` | 0.400 (20%) [8] |",
        "| `collect/act/decode/trunk` | 0.200 (10%) [7] |",
        "| `backward` | 1.000 (50%) |",
        "| unlabelled | 0.200 (10%) |",
        "| *steps* | 8.00 |",
    ]


def test_profile_phases_reads_lmgym_labels_exclusively_and_per_call():
    def work() -> None:
        with phase("lmgym.outer"):
            time.sleep(0.02)
            with phase("lmgym.inner"):
                time.sleep(0.01)
        time.sleep(0.01)

    phases = h.profile_phases(work, calls=2)
    assert set(phases) == {"wall", "outer", "outer/inner", "unlabelled"}
    assert phases["outer/inner"][1] == 1.0  # entries per call
    assert 0.02 <= phases["outer"][0] < 0.03 + 0.02  # exclusive of the inner label
    assert 0.01 <= phases["outer/inner"][0] < 0.01 + 0.02
    assert phases["unlabelled"][0] >= 0.01
    assert sum(s for k, (s, _) in phases.items() if k != "wall") == pytest.approx(phases["wall"][0])


def test_a_section_that_raises_overruns_or_comes_late_says_so(tmp_path):
    out = tmp_path / "report.md"
    report = h.SectionedReport(["# title", ""], out)
    start = time.perf_counter()

    def fails(section: h.Section, deadline: float) -> None:
        section.body.append("measured 1")
        raise ValueError("boom")

    def overruns(section: h.Section, deadline: float) -> None:
        section.body.append("measured 2")
        time.sleep(30)

    assert h.run_section(report, "A", fails, 10, 0.0, start + 60) == "failed"
    assert h.run_section(report, "B", overruns, 0.5, 0.5, start + 60) == "interrupted"
    assert time.perf_counter() - start < 10
    assert h.run_section(report, "C", fails, 10, 0.0, start + 60, skip="no model") == "skipped"
    assert h.run_section(report, "D", fails, 10, 0.0, start) == "skipped"
    text = out.read_text()
    assert "**Partial: the run has not finished.**" in text
    assert "Status: failed: ValueError: boom." in text and "measured 1" in text
    assert "Status: interrupted: over its slice" in text and "measured 2" in text
    assert "Status: skipped: no model." in text
    assert "Status: skipped: " in text.split("## D")[1]
    report.write(finished=True)
    assert "Partial" not in out.read_text()


def test_options_fill_quick_defaults_and_name_bad_items(capsys):
    p = h.parser("Doc.\n\nMore.")
    p.add_argument("--repeats", type=int)
    p.add_argument("--models")
    args = p.parse_args(["--quick", "--repeats", "5"])
    h.fill_defaults(args, dict(repeats=9, models="small,large"), dict(repeats=2, models="small"))
    assert (args.repeats, args.models) == (5, "small")
    assert h.csv("small, large", ["small", "large"], "--models", p) == ["small", "large"]
    with pytest.raises(SystemExit):
        h.csv("small,huge", ["small", "large"], "--models", p)
    assert "--models: unknown 'huge'; choose from ['small', 'large']" in capsys.readouterr().err


def test_a_row_over_processes_is_the_median_ratio_and_the_worst_load():
    rows = [
        h.Comparison("r", a, b, 2, load) for a, b, load in [(4, 2, 0.0), (3, 3, 0.2), (9, 3, 0.1)]
    ]
    row = h.Runs("r", rows)
    assert (row.ratio, row.process_ratios, row.other_load) == (2.0, (2.0, 1.0, 3.0), 0.2)
    assert h.Runs("r", rows[:1]).process_ratios == ()  # one process: nothing to list
    assert (
        h.target_line("r", 1.499, 1.5, "a vs b") == "- r: 1.50x a vs b (target >= 1.5x) -> NOT MET"
    )
    assert h.target_line("r", 1.5, 1.5, "a vs b") == "- r: 1.50x a vs b (target >= 1.5x) -> MET"
    assert h.targets_section("Target", ["- r: ..."], rows[:1]) == ["", "## Target", "", "- r: ..."]
    noisy = h.targets_section("Target", [], rows)
    assert noisy[:3] == ["", "## Target", ""] and noisy[3].startswith("- WARNING: other processes")


def test_common_options_and_the_decode_line_in_the_header():
    p = h.parser("Doc.")
    h.add_common(p, 2, ["small", "large"], 1, "9", "3", compile_decode=True)
    args = p.parse_args(["--compile-decode"])
    assert (args.threads, args.warmup, args.repeats, args.processes) == (2, 1, None, None)
    assert args.compile_decode and args.wait_idle == 0.0 and args.models is None
    assert not p.parse_args([]).compile_decode
    head = h.header("T", "torch threads = 2", [], "cmd", compile_decode=True)
    assert head[-1].startswith("- lmgym decode: compiled (`--compile-decode`")
    assert h.header("T", "t", [], "cmd", compile_decode=False)[-1] == (
        "- lmgym decode: eager (the default; `--compile-decode` compiles it)"
    )
    assert not any("decode" in line for line in h.header("T", "t", [], "cmd"))


def test_processes_must_be_at_least_one(capsys):
    p = h.parser("Doc.")
    h.add_common(p, processes="3")
    assert p.parse_args(["--processes", "1"]).processes == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--processes", "0"])
    assert "argument --processes: 0: must be >= 1" in capsys.readouterr().err


def test_a_parser_without_quick_has_only_out():
    p = h.parser("Doc.", quick=None)
    assert vars(p.parse_args(["--out", "x.md"])) == {"out": Path("x.md")}


def test_the_source_line_names_the_commit_the_run_started_from(monkeypatch):
    """Reports are written at the end of a run: a commit made meanwhile is not the one
    measured (a results file named a commit made while it ran)."""
    h.source_line.cache_clear()
    h.parser("Doc.")  # every script's start
    first = h.source_line()
    monkeypatch.setattr(h.subprocess, "run", lambda *a, **k: pytest.fail("git ran again"))
    assert h.header("T", "t", [], "cmd")[5] == first
    assert first.startswith("- source: commit ")


def test_the_header_names_a_module_that_is_not_installed():
    # A report renders without the bench extra (trl); the versions line says so.
    versions = h.header("T", "t", ["torch", "no_such_module_here"], "cmd")[4]
    assert f"torch {torch.__version__}" in versions
    assert versions.endswith("no_such_module_here not installed")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="CpuMeter reads Linux's /proc")
def test_cpu_meter_counts_this_process_tree_as_its_own():
    # A compile worker or a launched benchmark worker is not "other" load: a row was
    # flagged noisy by its own inductor compile pool. The child burns 0.3 CPU-seconds,
    # says so and waits: the meter must count it while it lives and after it is
    # reaped (the old meter counted this process alone and saw ~0).
    import subprocess

    burn = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"
    meter = h.CpuMeter()
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "done\n"
    live = h.CpuMeter._snapshot()[2] - meter.start[2]
    child.stdin.close()
    child.wait()
    child.stdout.close()
    finished = h.CpuMeter._snapshot()[2] - meter.start[2]
    assert live >= 0.28 and finished >= live - 0.02  # clock ticks: 0.01 s each
