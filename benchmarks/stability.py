"""Seed robustness: does each agent reach the solved threshold, and keep it?

Every agent x TargetString and LengthControl x 5 seeds, with the settings of
``lmgym bench`` (``lmgym.bench.run``: a fresh tiny GPT-2 per seed, its batch
shape, 4 prompts x 16 completions, bandit reward, each agent's documented defaults,
150 / 250 iterations). Per agent and task the table
counts the seeds that *reached* the threshold (rolling mean over 5 iterations), that
*kept* it (mean of the last 10 iterations at the threshold) and that ended on a
*plateau* (not kept, last 10 iterations within 0.05: stuck at a local optimum); the
definitions live in ``lmgym.bench.report`` (``kept``, ``plateaued``), the
same ones ``lmgym bench`` reports. Target (issue 26): every agent keeps the solution
on at least 4 of 5 seeds on both tasks.

Each finished run is appended to ``--runs`` (JSON lines) at once, and a rerun skips
the runs already there (a run is its agent, task, seed, batch shape and overrides,
so runs at other settings stay in the file but are neither skipped nor shown), so a
long table can be filled in several sittings; the Markdown table is rendered from
that file alone (``--render-only``). ``--workers 2`` runs two at once: the table
counts rewards, which do not depend on the load, only the wall times do.

    .venv/bin/python benchmarks/stability.py --workers 2          # everything (~2-3 h on 2 cores)
    .venv/bin/python benchmarks/stability.py --agents ppo,vapo --tasks lmgym/TargetString-v0
    .venv/bin/python benchmarks/stability.py --render-only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lmgym.agents import ALGORITHMS
from lmgym.bench.report import KEEP_WINDOW, PLATEAU_RANGE, machine_line, summarize
from lmgym.bench.run import BenchSpec, run_job

TASKS = ("lmgym/TargetString-v0", "lmgym/LengthControl-v0")
SEEDS = (0, 1, 2, 3, 4)
TARGET_KEPT = 4
"""Seeds of 5 on which every agent must keep the solution (issue 26)."""
WHY_MISSED: dict[tuple[str, str], str] = {
    ("reinforce", "lmgym/LengthControl-v0"): (
        "REINFORCE is the textbook one-step estimator, kept as the comparison's reference "
        "point: at one step of 1e-3 it is still climbing at 250 iterations, as every critic-free agent "
        "was at one step. Under PPO's schedule it reached the threshold on 5 of 5 seeds and "
        "kept it on 3, with the token clip or without; REINFORCE++ (the same batch-mean "
        "baseline, whitened, under the clip) keeps it on 5 of 5."
    ),
}
"""Why a documented miss is one (issue 26: "where an algorithm genuinely cannot, say why"),
printed under the table; measured in benchmarks/results/stability_notes.md."""


def job_key(job: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two runs the same run: agent, task, seed and settings."""
    settings = json.dumps(
        [job["num_prompts"], job["group_size"], job["overrides"], job["iterations"]],
        sort_keys=True,
    )
    return job["agent"], job["task"], job["seed"], settings


def load_runs(path: Path) -> list[dict[str, Any]]:
    """The run records already in ``path`` (JSON lines), none if it does not exist."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def commit() -> str:
    """The commit measured, ``+dirty`` when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "lmgym"]).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def run_missing(spec: BenchSpec, path: Path, done: list[dict[str, Any]], workers: int = 1) -> None:
    """Run every job of ``spec`` not in ``done``, one fresh process each, appending each
    record (with the commit measured) to ``path`` as it finishes."""
    measured = commit()
    have = {job_key(r) for r in done}
    # Task by task, seed by seed: a table cut short still covers every agent.
    order = {task: index for index, task in enumerate(spec.tasks)}
    jobs = sorted(
        (job for job in spec.jobs() if job_key(job) not in have),
        key=lambda job: (order[job["task"]], job["seed"], job["agent"]),
    )
    print(f"stability: {len(jobs)} runs to do, {len(have)} already in {path}", flush=True)
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, maxtasksperchild=1) as pool, path.open("a") as out:
        for index, result in enumerate(pool.imap_unordered(run_job, jobs), 1):
            result["commit"] = measured
            out.write(json.dumps(result) + "\n")
            out.flush()
            rewards = [m["reward_mean"] for m in result["history"]]
            tail = rewards[-KEEP_WINDOW:]
            print(
                f"[{index}/{len(jobs)}] {result['agent']} {result['task']} seed "
                f"{result['seed']}: max {max(rewards):.3f}, last {KEEP_WINDOW} "
                f"{sum(tail) / len(tail):.3f}, {result['wall_s']:.0f} s",
                flush=True,
            )


def render(runs: list[dict[str, Any]], spec: BenchSpec, command: str) -> str:
    """The Markdown table of ``runs``: per agent and task, reached / kept / plateau."""
    table = summarize(runs, spec)
    lines = [
        "# Seed robustness: reached and kept",
        "",
        "Why the misses happen, and what was changed: [stability_notes.md](stability_notes.md) "
        "(hand-written, kept beside the results).",
        "",
        f"Command: `{command}` ({machine_line()}); commits measured: "
        + ", ".join(sorted({r.get("commit", "?") for r in runs}))
        + ".",
        "",
        "Settings: those of `lmgym bench` (a fresh tiny GPT-2 per seed, "
        f"{spec.num_prompts} prompts x {spec.group_size} completions, bandit reward, each "
        "agent's documented defaults"
        + (
            " except the spec's `agent_overrides`"
            if spec.learning_rate is None and any(spec.agent_overrides.values())
            else ""
        )
        + (f", learning_rate={spec.learning_rate:g} for every agent" if spec.learning_rate else "")
        + "), iterations: "
        + ", ".join(f"{t.split('/')[-1]} {spec.iterations_for(t)}" for t in spec.tasks)
        + ".",
        "",
        "Cells: *reached* = seeds whose rolling mean of `reward_mean` over "
        f"{spec.window} iterations reached the solved threshold (0.9); *kept* = seeds whose "
        f"mean over the last {KEEP_WINDOW} iterations is at the threshold; *plateau* = seeds "
        f"that did not keep it and whose last {KEEP_WINDOW} iterations span at most "
        f"{PLATEAU_RANGE:g}; *final* = mean of the last {spec.window} iterations, mean ± std "
        f"over seeds. Target: kept on at least {TARGET_KEPT} of 5 seeds; ✗ marks a miss, "
        "and a cell over fewer seeds than asked is a partial result.",
        "",
        "| agent | " + " | ".join(t.split("/")[-1] for t in spec.tasks) + " |",
        "|---|" + "---|" * len(spec.tasks),
    ]
    for agent in spec.agents:
        cells = []
        for task in spec.tasks:
            row = table[task].get(agent)
            if row is None:
                cells.append("not run")
                continue
            n = row["seeds"]
            miss = " ✗" if n == len(spec.seeds) and row["kept"] < TARGET_KEPT else ""
            cells.append(
                f"reached {row['solved']}/{n}, kept {row['kept']}/{n}{miss}, plateau "
                f"{row['plateau']}/{n}; final {row['final_mean']:.2f} ± {row['final_std']:.2f}"
            )
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    misses = [
        f"- **{agent}, {task.split('/')[-1]}**: {why}"
        for (agent, task), why in WHY_MISSED.items()
        if agent in spec.agents and task in spec.tasks
    ]
    if misses:
        lines += ["", "Why the misses marked ✗ are left (details in the notes):", "", *misses]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="all", help="comma list, or all (default)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="every agent's rate (an ablation)"
    )
    parser.add_argument("--runs", default="benchmarks/results/stability.jsonl")
    parser.add_argument("--out", default="benchmarks/results/stability.md")
    parser.add_argument("--render-only", action="store_true", help="no runs: render --runs")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (default 1)")
    args = parser.parse_args(argv)
    agents = tuple(sorted(ALGORITHMS)) if args.agents == "all" else tuple(args.agents.split(","))
    spec = BenchSpec(
        agents=agents,
        tasks=tuple(args.tasks.split(",")),
        seeds=tuple(int(s) for s in args.seeds.split(",")),
        workers=1,
        learning_rate=args.learning_rate,
    )
    spec.check()
    path = Path(args.runs)
    runs = load_runs(path)
    if not args.render_only:
        run_missing(spec, path, runs, args.workers)
        runs = load_runs(path)
    mine = [r for r in runs if job_key(r) in {job_key(j) for j in spec.jobs()}]
    command = shlex.join([".venv/bin/python", "benchmarks/stability.py", *argv])
    Path(args.out).write_text(render(mine, spec, command))
    print(Path(args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
