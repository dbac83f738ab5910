"""The agent benchmark's report: summary numbers, Markdown tables, learning-curve PNGs.

``lmgym.bench.run`` runs the jobs of a ``BenchSpec`` (``bench_spec``); this
module turns their results into what ``run_bench`` writes: ``summarize`` (per agent and task: the final reward as mean
+- std over seeds, the seeds that reached the solved threshold and those that kept
it to the end, the seeds that ended on a plateau below it, iterations and tokens to
the threshold, wall time, peak RSS), ``format_summary`` / ``format_table`` (Markdown), ``plot_curves`` (reward
against completion tokens, a line per agent with a +-1 std band). Rendering is
apart from writing: ``render_markdown`` and ``render_json`` turn run records into
text with no side effects (the machine and date come in as an argument), and
``write_report`` writes ``README.md``, ``results.json`` and one PNG per task;
``load_results`` reads ``results.json`` back.

A task of the user's own (``module:Id``, registered without ``TaskInfo``) has no
solved threshold or description: its tables leave those out.

Runs with a held-out evaluation (``BenchSpec.evaluate``: ``trained_eval`` and
``base_eval`` in their records) get a second table per task (``format_eval_table``):
base, trained and gain on the held-out prompts, greedy and sampled (pass@k where the
task has a verifier), reached / kept, seconds per iteration and peak memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmgym.bench.spec import DEFAULT_OUT, BenchSpec

if TYPE_CHECKING:
    from lmgym.envs.registration import TaskInfo

THRESHOLD_TOLERANCE = 1e-6
"""Slack when comparing a rolling mean of float32 rewards with a threshold."""
KEEP_WINDOW = 10
"""A run *kept* the solution when its mean reward over its last this many iterations
is at the threshold: reaching it once and collapsing later does not count."""
PLATEAU_RANGE = 0.05
"""A run that did not keep the solution ended on a *plateau* when its reward over the
last ``KEEP_WINDOW`` iterations stayed within this range: stuck, not still climbing."""


def task_info(task: str) -> TaskInfo | None:
    """What ``lmgym tasks`` knows of ``task`` (``module:Id`` looks ``Id`` up), if anything."""
    from lmgym.envs.registration import TASKS

    return TASKS.get(task.rpartition(":")[2])


def _rolling(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def final_reward(history: list[dict[str, float]], window: int) -> float:
    """Mean ``reward_mean`` of the last ``window`` iterations."""
    tail = [m["reward_mean"] for m in history[-window:]]
    return sum(tail) / max(1, len(tail))


def solved_at(
    history: list[dict[str, float]], threshold: float | None, window: int
) -> tuple[int, float] | None:
    """``(iteration, tokens_generated)`` of the first iteration whose rolling mean of
    ``reward_mean`` over the last ``window`` iterations reaches ``threshold``."""
    if threshold is None:
        return None
    rolling = _rolling([m["reward_mean"] for m in history], window)
    for i, value in enumerate(rolling):
        # The metrics are float32 means: a mean of exactly 0.9 arrives as 0.89999998.
        if i + 1 >= window and value >= threshold - THRESHOLD_TOLERANCE:
            return int(history[i]["iteration"]), float(history[i]["tokens_generated"])
    return None


def kept(history: list[dict[str, float]], threshold: float | None) -> bool | None:
    """Whether the mean ``reward_mean`` of the last ``KEEP_WINDOW`` iterations reaches
    ``threshold`` (``None`` without a threshold)."""
    if threshold is None:
        return None
    return final_reward(history, KEEP_WINDOW) >= threshold - THRESHOLD_TOLERANCE


def plateaued(history: list[dict[str, float]], threshold: float | None) -> bool | None:
    """Whether the run ended below ``threshold`` with a flat curve: over the last
    ``KEEP_WINDOW`` iterations ``reward_mean`` spans at most ``PLATEAU_RANGE`` (a local
    optimum such as a constant completion), ``None`` without a threshold."""
    if threshold is None:
        return None
    tail = [m["reward_mean"] for m in history[-KEEP_WINDOW:]]
    flat = bool(tail) and max(tail) - min(tail) <= PLATEAU_RANGE + THRESHOLD_TOLERANCE
    return flat and not kept(history, threshold)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(
    results: list[dict[str, Any]], spec: BenchSpec
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {agent: row}}`` with the reported numbers (see the module docstring)."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for task in spec.tasks:
        info = task_info(task)
        threshold = info.solved_threshold if info is not None else None
        table[task] = {}
        for agent in spec.agents:
            runs = [r for r in results if r["task"] == task and r["agent"] == agent]
            if not runs:
                continue
            finals = [final_reward(r["history"], spec.window) for r in runs]
            solved = [s for r in runs if (s := solved_at(r["history"], threshold, spec.window))]
            mean, std = _mean_std(finals)
            table[task][agent] = {
                "final_mean": mean,
                "final_std": std,
                "seeds": len(runs),
                "solved": len(solved),
                "kept": sum(bool(kept(r["history"], threshold)) for r in runs),
                "plateau": sum(bool(plateaued(r["history"], threshold)) for r in runs),
                "iterations_to_solved": statistics.fmean(s[0] for s in solved) if solved else None,
                "tokens_to_solved": statistics.fmean(s[1] for s in solved) if solved else None,
                "tokens_total": statistics.fmean(
                    r["history"][-1]["tokens_generated"] for r in runs
                ),
                "wall_s": statistics.fmean(r["wall_s"] for r in runs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                "start_rss_mib": max(r["start_rss_mib"] for r in runs),
                "iterations": statistics.fmean(len(r["history"]) for r in runs),
                "s_per_iteration": statistics.fmean(
                    r["wall_s"] / max(1, len(r["history"])) for r in runs
                ),
            }
            if all("trained_eval" in r and "base_eval" in r for r in runs):
                table[task][agent]["held_out"] = _held_out(runs)
    return table


EVAL_MEASURES = (
    ("greedy", "greedy", "reward_mean"),
    ("sampled", "sampled", "reward_mean"),
    ("pass@k", "sampled", "pass_at_k"),
)
"""The held-out numbers of the table: (column, evaluation, field)."""


def _held_out(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{measure: {"base", "trained", "gain", "gain_std"}}`` over seeds (``None`` where
    the task has no verifier for pass@k), and ``k`` and ``split``."""
    row: dict[str, Any] = {}
    for column, which, key in EVAL_MEASURES:
        base = [r["base_eval"][which][key] for r in runs]
        trained = [r["trained_eval"][which][key] for r in runs]
        if any(v is None for v in base + trained):
            row[column] = None
            continue
        gain_mean, gain_std = _mean_std([t - b for t, b in zip(trained, base, strict=True)])
        row[column] = {
            "base": statistics.fmean(base),
            "trained": statistics.fmean(trained),
            "gain": gain_mean,
            "gain_std": gain_std,
        }
    sampled = runs[0]["trained_eval"]["sampled"]
    row["k"] = sampled["samples_per_prompt"]
    row["prompts"] = sampled["num_prompts"]
    row["split"] = sampled["split"]
    return row


def format_eval_table(task_rows: dict[str, dict[str, Any]]) -> str:
    """One task's held-out evaluation as a Markdown table: base, trained and gain
    (greedy reward / sampled reward / pass@k), reached / kept, s/it and peak memory."""
    rows = {agent: row for agent, row in task_rows.items() if "held_out" in row}
    if not rows:
        return ""
    k = next(iter(rows.values()))["held_out"]["k"]
    lines = [
        f"| agent | base (greedy / sampled / pass@{k}) | trained (greedy / sampled / pass@{k}) "
        f"| gain (greedy / sampled / pass@{k}) | reached / kept | iterations | s/it "
        "| peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cells(held: dict[str, Any], key: str) -> str:
        values = []
        for column, _, _ in EVAL_MEASURES:
            measure = held[column]
            if measure is None:
                values.append("—")
            elif key == "gain":
                values.append(f"{measure['gain']:+.3f}")
            else:
                values.append(f"{measure[key]:.3f}")
        return " / ".join(values)

    for agent, row in rows.items():
        held, seeds = row["held_out"], row["seeds"]
        lines.append(
            f"| {agent} | {cells(held, 'base')} | {cells(held, 'trained')} "
            f"| {cells(held, 'gain')} | {row['solved']}/{seeds} / {row['kept']}/{seeds} "
            f"| {row['iterations']:.0f} | {row['s_per_iteration']:.2f} "
            f"| {row['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def format_summary(table: dict[str, dict[str, dict[str, Any]]], spec: BenchSpec) -> str:
    """Agents x tasks: final reward mean ± std, seeds that reached and kept the threshold
    (and, with a held-out evaluation, its greedy reward before and after), as a Markdown
    table."""
    header = "| agent | " + " | ".join(_short(t) for t in spec.tasks) + " |"
    lines = [header, "|---|" + "---|" * len(spec.tasks)]
    for agent in spec.agents:
        cells = []
        for task in spec.tasks:
            row = table[task].get(agent)
            cells.append(
                "—"
                if row is None
                else f"{row['final_mean']:.3f} ± {row['final_std']:.3f} "
                f"(reached {row['solved']}/{row['seeds']}, kept {row['kept']}/{row['seeds']})"
                + _gain_text(row)
            )
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gain_text(row: dict[str, Any]) -> str:
    """``; held-out greedy 0.250 -> 0.500`` for a summary cell, or ``""``."""
    held = row.get("held_out")
    if held is None or held["greedy"] is None:
        return ""
    greedy = held["greedy"]
    return f"; held-out greedy {greedy['base']:.3f} -> {greedy['trained']:.3f}"


def _fmt_count(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def format_table(task_rows: dict[str, dict[str, Any]]) -> str:
    """One task's rows as a Markdown table."""
    lines = [
        "| agent | final reward (mean ± std) | reached | kept | plateau | iterations to solved "
        "| tokens to solved | tokens total | wall time (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for agent, row in task_rows.items():
        seeds = row["seeds"]
        lines.append(
            f"| {agent} | {row['final_mean']:.3f} ± {row['final_std']:.3f} "
            f"| {row['solved']}/{seeds} | {row['kept']}/{seeds} | {row['plateau']}/{seeds} "
            f"| {_fmt_count(row['iterations_to_solved'])} "
            f"| {_fmt_count(row['tokens_to_solved'])} | {_fmt_count(row['tokens_total'])} "
            f"| {row['wall_s']:.1f} | {row['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def _agent_settings(spec: BenchSpec, agent: str) -> str:
    """``with learning_rate=0.002`` style text of an agent's overrides, or ``at its
    defaults (learning_rate=0.001)``."""
    from lmgym.agents import ALGORITHMS

    changes = spec.overrides_for(agent)
    if not changes:
        rate = ALGORITHMS[agent].config_class().learning_rate
        return f"at its defaults (learning_rate={rate:g})"
    return "with " + ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in changes.items()
    )


def _at_a_time(spec: BenchSpec) -> str:
    if spec.workers == 0:
        return "every run in one process"
    if spec.workers == 1:
        return "one run at a time"
    return f"{spec.workers} runs at a time"


def _short(task: str) -> str:
    return task.split("/")[-1].removesuffix("-v0")


def plot_curves(
    results: list[dict[str, Any]], spec: BenchSpec, task: str, path: str | Path
) -> Path:
    """PNG of reward (rolling mean) against completion tokens for one task: a line per
    agent (mean over seeds, on a common token grid) with a +-1 std band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    colors = plt.get_cmap("tab10")
    for index, agent in enumerate(spec.agents):
        runs = [r for r in results if r["task"] == task and r["agent"] == agent]
        if not runs:
            continue
        curves = []
        for r in runs:
            tokens = np.array([m["tokens_generated"] for m in r["history"]], dtype=float)
            reward = np.array(_rolling([m["reward_mean"] for m in r["history"]], spec.window))
            curves.append((tokens, reward))
        begin = max(tokens[0] for tokens, _ in curves)
        end = min(tokens[-1] for tokens, _ in curves)
        grid = np.linspace(begin, max(begin, end), 200)
        ys = np.stack([np.interp(grid, tokens, reward) for tokens, reward in curves])
        mean, std = ys.mean(axis=0), ys.std(axis=0)
        color = colors(index % 10)
        ax.plot(
            grid,
            mean,
            color=color,
            label=f"{agent} ({len(runs)} seed{'s' if len(runs) > 1 else ''})",
            linewidth=1.6,
        )
        ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.18, linewidth=0)
    info = task_info(task)
    if info is not None and info.solved_threshold is not None:
        ax.axhline(info.solved_threshold, color="grey", linestyle="--", linewidth=1)
        ax.text(0, info.solved_threshold, " solved", va="bottom", color="grey", fontsize=8)
    ax.set_xlabel("completion tokens generated")
    ax.set_ylabel(f"reward (rolling mean of {spec.window} iterations)")
    ax.set_title(
        f"{task}: {spec.budget_text(task)} of {spec.num_prompts}x{spec.group_size} completions"
    )
    if info is not None:
        ax.set_ylim(*info.reward_range)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _model_text(spec: BenchSpec) -> str:
    if spec.model is None:
        return (
            "a fresh tiny GPT-2 per run (2 layers, 64 wide, character tokenizer, initialised "
            "with the run's seed)"
        )
    text = (
        f"the model {spec.model} with its tokenizer, loaded afresh for every run, every agent "
        "with the pretrained defaults (docs/cli.md, Pretrained models)"
    )
    if spec.lora_r:
        from lmgym.training.run import LORA_ALPHA, LORA_TARGETS

        text += (
            f", training a fresh LoRA adapter (r {spec.lora_r}, alpha {LORA_ALPHA:g}, on "
            f"{' '.join(LORA_TARGETS)})"
        )
    return text


def _task_text(task: str) -> str:
    """One line on a task: what it asks, its solved threshold and random baseline."""
    info = task_info(task)
    if info is None:
        return "A task of your own (no solved threshold stated)."
    solved = (
        f"Solved at {info.solved_threshold:g}"
        if info.solved_threshold is not None
        else "No solved threshold stated"
    )
    random = info.random_baseline if info.random_baseline is not None else "?"
    return f"{info.description}. {solved}; a random policy scores {random}."


def bench_command(spec: BenchSpec, out: str | Path) -> str:
    """The ``lmgym bench`` command line that reproduces ``spec``."""
    default = BenchSpec()
    parts = ["lmgym", "bench"]
    if spec.agents != default.agents:
        parts += ["--agents", ",".join(spec.agents)]
    if spec.tasks != default.tasks:
        parts += ["--tasks", ",".join(spec.tasks)]
    if spec.seeds != default.seeds:
        parts += ["--seeds", ",".join(map(str, spec.seeds))]
    if spec.iterations is not None:
        parts += ["--iterations", str(spec.iterations)]
    if spec.num_prompts != default.num_prompts:
        parts += ["--num-prompts", str(spec.num_prompts)]
    if spec.group_size != default.group_size:
        parts += ["--group-size", str(spec.group_size)]
    if spec.workers != default.workers:
        parts += ["--workers", str(spec.workers)]
    if spec.model is not None:
        parts += ["--model", spec.model]
    if spec.lora_r:
        parts += ["--lora-r", str(spec.lora_r)]
    if spec.learning_rate is not None:
        parts += ["--learning-rate", f"{spec.learning_rate:g}"]
    parts += _training_flags(spec, default)
    if str(out) != DEFAULT_OUT:
        parts += ["--out", str(out)]
    return shlex.join(parts)


def _training_flags(spec: BenchSpec, default: BenchSpec) -> list[str]:
    """``bench_command``'s flags for the wall-time budget, your task and the evaluation."""
    parts = []
    if spec.max_time is not None:
        parts += ["--max-time", spec.max_time]
    if spec.prompts is not None:
        parts += ["--prompts", spec.prompts, "--reward", str(spec.reward)]
        if spec.prompt_field != default.prompt_field:
            parts += ["--prompt-field", spec.prompt_field]
    if spec.evaluate != (spec.model is not None):
        parts += ["--eval" if spec.evaluate else "--no-eval"]
    if spec.evaluate and spec.eval_prompts != default.eval_prompts:
        parts += ["--eval-prompts", str(spec.eval_prompts)]
    if spec.evaluate and spec.eval_samples != default.eval_samples:
        parts += ["--eval-samples", str(spec.eval_samples)]
    return parts


def machine_line() -> str:
    """``x86_64, 2 CPUs, torch 2.13.0, 2026-11-30``: what ran the benchmark, and when."""
    import platform

    import torch

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    )


def render_markdown(
    results: list[dict[str, Any]],
    spec: BenchSpec,
    total_s: float,
    *,
    out: str | Path,
    machine: str,
    ablations: bool = False,
) -> str:
    """The report's ``README.md`` from run records, with no side effects.

    Args:
        results: ``run_job`` records (``history`` as a list of per-iteration dicts).
        spec: what ran (names, budgets, overrides).
        total_s: wall seconds of the whole benchmark.
        out: the output directory, as the reproducing command names it.
        machine: the machine and date text (``machine_line()``).
        ablations: link ``ablations.md`` (hand-written notes kept beside the results).
    """
    table = summarize(results, spec)
    overrides = "; ".join(f"{agent} {_agent_settings(spec, agent)}" for agent in spec.agents)
    if spec.max_time is not None:
        budget = f"the same budget per run: {spec.budget_text(spec.tasks[0])} of `learn`"
    else:
        budget = "iterations per task: " + ", ".join(
            f"{_short(t)} {spec.iterations_for(t)}" for t in spec.tasks
        )
    process = (
        "the run's own, fresh worker process"
        if spec.workers
        else "the one process that ran every run (so it is a maximum over all of them)"
    )
    lines = [
        "# Agent benchmark",
        "",
        f"Command: `{bench_command(spec, out)}` — {len(results)} runs in "
        f"{total_s / 60:.1f} min, {_at_a_time(spec)} with one torch thread ({machine}).",
        "",
        f"Settings, equal for every agent: {_model_text(spec)}, "
        f"{spec.num_prompts} prompts x {spec.group_size} completions per iteration, bandit "
        f"reward, {budget}; seeds {', '.join(map(str, spec.seeds))}. "
        f"Each agent runs its documented defaults but for what is named: {overrides}.",
        "",
        f"Columns: *final reward* = mean `reward_mean` of the last {spec.window} iterations, "
        f"mean ± std over seeds; *reached* = seeds whose rolling mean of `reward_mean` over "
        f"{spec.window} iterations reached the task's solved threshold at some point; *kept* = "
        f"seeds whose mean over the last {KEEP_WINDOW} iterations is at the threshold (reached "
        f"and not lost); *plateau* = seeds that did not keep it and whose last {KEEP_WINDOW} "
        f"iterations span at most {PLATEAU_RANGE:g} (stuck at a local optimum, not still "
        "climbing); *iterations / tokens "
        "to solved* = the first iteration where it did and the completion tokens generated "
        "until then (mean over the seeds that got there, — if none); *tokens total* = tokens "
        "generated in the whole run; *wall time* = seconds of `learn` per run, mean over "
        f"seeds ({_at_a_time(spec)}; this shared VM's timings vary by about ±30% between "
        f"repeats); *peak RSS* = `ru_maxrss` of {process}, max over seeds, which includes about "
        f"{max((r['start_rss_mib'] for r in results), default=0):.0f} MiB already resident "
        "when training starts (Python, torch, transformers, the model).",
        "",
        "Curves: reward (rolling mean) against completion tokens generated; the line is the "
        "mean over seeds and the band ± 1 std.",
        "",
    ]
    if spec.evaluate:
        lines += [_eval_text(spec, results), ""]
    if ablations:
        lines += [
            "Single-change ablations behind the comparison: [ablations.md](ablations.md).",
            "",
        ]
    lines += ["## Summary", "", format_summary(table, spec), ""]
    for task in spec.tasks:
        lines += [f"## {task}", "", _task_text(task), ""]
        lines += [format_table(table[task]), ""]
        held_out = format_eval_table(table[task])
        if held_out:
            lines += [f"Held-out evaluation ({_split_text(table[task])}):", "", held_out, ""]
        lines += [f"![{_short(task)} learning curves]({_short(task)}.png)", ""]
    return "\n".join(lines)


def _split_text(task_rows: dict[str, dict[str, Any]]) -> str:
    held = next(row["held_out"] for row in task_rows.values() if "held_out" in row)
    return f"{held['prompts']} prompts, split {held['split'] or '?'}"


def _eval_text(spec: BenchSpec, results: list[dict[str, Any]]) -> str:
    """The paragraph that says what the held-out tables measure."""
    k = spec.eval_samples
    return (
        f"Held-out evaluation: the base model (once per task and seed) and each trained "
        f"model, on {spec.eval_prompts} prompts of the task's held-out split (`split=eval`; "
        "a task without one is evaluated on its training prompts, and its table says so), "
        f"the same prompts and sampler seed for base and trained. *greedy* = mean reward of "
        f"the greedy completion; *sampled* = mean reward of {k} completions per prompt at "
        f"the run's temperature; *pass@{k}* = share of prompts with a correct completion "
        f"among the {k} (unbiased estimator; — where the task has no verifier); *gain* = "
        "trained - base, mean over seeds; *reached / kept* as above; *iterations* = "
        "iterations trained (mean over seeds); *s/it* = wall seconds of `learn` per "
        "iteration; *peak RSS* = `ru_maxrss` of the run's process, training and evaluation."
    )


def render_json(results: list[dict[str, Any]], spec: BenchSpec, total_s: float) -> str:
    """The report's ``results.json`` from run records: the spec, the summary and every
    run with its curve as columns (``load_results`` reads it back)."""
    document = {
        "spec": dataclasses.asdict(spec),
        "total_s": round(total_s, 1),
        "summary": summarize(results, spec),
        "runs": [_compact(r) for r in results],
    }
    return json.dumps(document) + "\n"


def write_report(
    results: list[dict[str, Any]], spec: BenchSpec, out: str | Path, total_s: float
) -> str:
    """Render the report and write ``README.md``, ``results.json`` and one PNG per task
    into ``out``.

    Returns:
        The Markdown written to ``README.md``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(
        results,
        spec,
        total_s,
        out=out,
        machine=machine_line(),
        ablations=(out / "ablations.md").exists(),
    )
    data = render_json(results, spec, total_s)
    for task in spec.tasks:
        plot_curves(results, spec, task, out / f"{_short(task)}.png")
    (out / "README.md").write_text(markdown)
    (out / "results.json").write_text(data)
    return markdown


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    """A run for ``results.json``: its curve as columns, floats to 6 digits."""
    history = result["history"]
    columns = {
        key: [round(float(m[key]), 6) for m in history] for key in (history[0] if history else {})
    }
    return {**{k: v for k, v in result.items() if k != "history"}, "history": columns}


def load_results(path: str | Path) -> tuple[list[dict[str, Any]], float]:
    """``(runs, total seconds)`` from a ``results.json`` written by ``write_report``."""
    data = json.loads(Path(path).read_text())
    runs = []
    for run in data["runs"]:
        columns = run["history"]
        keys = list(columns)
        rows = [
            dict(zip(keys, values, strict=True)) for values in zip(*columns.values(), strict=True)
        ]
        runs.append({**run, "history": rows})
    return runs, data["total_s"]
