"""The real-model agent comparison (issue 38): four chat tasks, one table.

``lmgym bench`` wrote one directory per task under ``benchmarks/results/lm_bench/``
(each with its own README: per-seed curves, reached / kept, s/it, memory). This
script reads their ``results.json`` and ``bench_spec.json`` and writes
``benchmarks/results/lm_bench/README.md``: for every agent and task, the held-out
reward of the base model and of the trained one, sampled at temperature 1 and
greedy, as the mean over seeds, and the gain with its spread over seeds. The table
it prints between the markers is the one README.md carries
(tests/docs/test_lm_bench_table.py checks that they agree).

    python benchmarks/lm_bench.py            # rewrite the README of the results
    python benchmarks/lm_bench.py --table    # print the table README.md carries
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "lm_bench"
#: (directory, the task's short name), in the table's column order.
TASKS = (
    ("chat_arithmetic", "ChatArithmetic"),
    ("instructions", "Instructions"),
    ("positive_continuation", "PositiveContinuation"),
    ("guess_number", "GuessNumber"),
)
AGENTS = ("grpo", "rloo", "cispo", "ppo")
BEGIN, END = "<!-- lm-bench-table:begin -->", "<!-- lm-bench-table:end -->"


def load(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(spec, runs)`` of one bench directory (``runs``: results.json's runs)."""
    spec = json.loads((directory / "bench_spec.json").read_text())
    runs = json.loads((directory / "results.json").read_text())["runs"]
    return spec, runs


def held_out(runs: list[dict[str, Any]], agent: str, which: str) -> tuple[float, float, float]:
    """``(base, trained, gain std)`` of ``which`` (``greedy`` / ``sampled``) reward_mean,
    means over the agent's seeds."""
    mine = [r for r in runs if r["agent"] == agent]
    base = [r["base_eval"][which]["reward_mean"] for r in mine]
    trained = [r["trained_eval"][which]["reward_mean"] for r in mine]
    gains = [t - b for t, b in zip(trained, base, strict=True)]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    return statistics.fmean(base), statistics.fmean(trained), spread


def table() -> str:
    """The Markdown table: a row per agent, a column per task; each cell is the sampled
    held-out reward base -> trained (gain ± std over seeds), then the greedy one."""
    loaded = {name: load(RESULTS / folder) for folder, name in TASKS}
    header = "| agent | " + " | ".join(name for _, name in TASKS) + " |"
    lines = [header, "|---|" + "---|" * len(TASKS)]
    for agent in AGENTS:
        cells = []
        for _, name in TASKS:
            _, runs = loaded[name]
            b, t, s = held_out(runs, agent, "sampled")
            gb, gt, _ = held_out(runs, agent, "greedy")
            cells.append(f"{b:.2f} → {t:.2f} ({t - b:+.2f} ± {s:.2f}); greedy {gb:.2f} → {gt:.2f}")
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    budgets = []
    for _, name in TASKS:
        spec, runs = loaded[name]
        budgets.append(
            f"{name} {spec['iterations']} iterations of {spec['num_prompts']} x "
            f"{spec['group_size']}, {runs[0]['trained_eval']['sampled']['num_prompts']} "
            "held-out prompts"
        )
    seeds = sorted({r["seed"] for _, runs in loaded.values() for r in runs})
    lines.append("")
    lines.append(f"Seeds {', '.join(map(str, seeds))}; budgets: " + "; ".join(budgets) + ".")
    return "\n".join(lines)


def readme() -> str:
    """The results directory's README."""
    commands = []
    for folder, name in TASKS:
        text = (RESULTS / folder / "README.md").read_text()
        command = next(line for line in text.splitlines() if "lmgym bench" in line)
        commands.append(f"- {name} ([{folder}/]({folder}/README.md)): {command.strip('- ')}")
    return "\n".join(
        [
            "# Agents on a real chat model: SmolLM2-135M-Instruct + LoRA, four chat tasks",
            "",
            "Made by `lmgym bench` (one directory per task, each with its own tables and",
            "learning curves) and summarised by `python benchmarks/lm_bench.py`. Every run:",
            "the packaged `smollm2-135m-instruct` (float32, CPU, one torch thread), a fresh",
            "LoRA adapter (r 16, alpha 32 on q/k/v/o), the pretrained defaults (learning",
            "rate 1e-4, temperature 1, 8 completions per prompt, no KL term, one pass of",
            "one minibatch per batch), the same number of iterations for every agent of a",
            "task. Evaluation: the task's held-out split (`split=eval`), the same prompts",
            "and sampler seed for base and trained model; *sampled*: 4 completions per",
            "prompt at temperature 1; *greedy*: one. Cells: base -> trained (gain ± its",
            "standard deviation over the seeds).",
            "",
            BEGIN,
            table(),
            END,
            "",
            "These budgets are short (the whole comparison had to fit one working session",
            "on a 2-core machine beside other jobs): they rank what a few iterations do,",
            "not where each agent ends. Gains within about ±0.05 are seed noise at these",
            "prompt counts.",
            "",
            "## Commands",
            "",
            *commands,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return
    (RESULTS / "README.md").write_text(readme())
    print(f"wrote {RESULTS / 'README.md'}")


if __name__ == "__main__":
    main()
