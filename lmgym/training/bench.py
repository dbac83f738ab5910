"""The agent benchmark: agents x tasks x seeds with equal budgets, a table and learning curves.

Every run trains a fresh tiny GPT-2 (``make_tiny_model(seed=seed)``, character
tokenizer) on one task with the same budget for every agent: the same number of
iterations and the same batch shape (``num_prompts x group_size`` completions
per iteration), bandit reward, each agent at its documented defaults except the
learning rate (``AGENT_OVERRIDES``: the settings the learning tests use). Runs are
independent processes (``workers`` at a time, default one, one torch thread each;
a fresh process per run, so its peak RSS is its own).

Measured per run: the ``reward_mean`` and ``tokens_generated`` of every
iteration, wall time of ``learn`` and the process's peak resident memory
(``ru_maxrss``, which includes the ~0.5 GB that importing torch and transformers
costs). Reported per agent and task (``summarize``): the final reward (mean of the
last ``window`` iterations' ``reward_mean``) as mean +- std over seeds; the
iterations and tokens to the solved threshold (first iteration whose rolling
mean over ``window`` iterations reaches ``TaskInfo.solved_threshold``; mean over
the seeds that got there, with their count); mean wall time; max peak RSS.
``write_report`` writes ``README.md`` (tables), ``results.json`` (every curve) and
one PNG per task: reward (rolling mean) against completion tokens generated, one
line per agent (mean over seeds) with a +-1 std band.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import os
import resource
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_AGENTS: tuple[str, ...] = ("reinforce", "rloo", "ppo", "grpo", "gspo", "cispo")
DEFAULT_TASKS: tuple[str, ...] = (
    "lmgym/TargetString-v0",
    "lmgym/LengthControl-v0",
    "lmgym/Preference-v0",
)
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2)
DEFAULT_OUT = "benchmarks/results/agents"
TASK_ITERATIONS: dict[str, int] = {
    "lmgym/TargetString-v0": 150,
    "lmgym/LengthControl-v0": 250,
    "lmgym/Preference-v0": 100,
}
"""Iterations per task (the same for every agent); other tasks get ``DEFAULT_ITERATIONS``."""
DEFAULT_ITERATIONS = 150
AGENT_OVERRIDES: dict[str, dict[str, Any]] = {
    "reinforce": {"learning_rate": 2e-3},
    "rloo": {"learning_rate": 2e-3},
    "ppo": {},
    "grpo": {"learning_rate": 2e-3},
    "drgrpo": {"learning_rate": 1e-3},
    "gspo": {"learning_rate": 2e-3},
    "cispo": {"learning_rate": 1e-3},
}
"""Config overrides per agent: learning rates of tests/agents/test_learning.py (PPO: its 3e-4)."""
THRESHOLD_TOLERANCE = 1e-6
"""Slack when comparing a rolling mean of float32 rewards with a threshold."""
# Relative cost of an iteration, to start the longest runs first.
_COST = {"ppo": 3.0}


class BenchOutputExistsError(FileExistsError):
    """The output directory already holds results and ``overwrite`` was not given."""


@dataclass(frozen=True)
class BenchSpec:
    """What ``run_bench`` runs.

    Attributes:
        agents: algorithm names (``ALGORITHMS`` keys).
        tasks: task ids.
        seeds: one run per seed (model init, sampler, prompt order).
        iterations: for every task; ``None``: ``TASK_ITERATIONS`` (else 150).
        num_prompts, group_size: batch shape, the same for every agent.
        workers: processes running at once (a fresh one per run); 0 runs everything in
            this process. Default 1: concurrent runs share the CPU caches and memory
            bandwidth and, on a 2-vCPU machine measured for the committed results, slowed
            each other about 2x, which gained nothing and made wall times meaningless.
        window: iterations in the rolling mean (final reward, solved threshold).
        agent_overrides: config overrides per agent.
        env_kwargs: extra env factory arguments per task.
    """

    agents: tuple[str, ...] = DEFAULT_AGENTS
    tasks: tuple[str, ...] = DEFAULT_TASKS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    iterations: int | None = None
    num_prompts: int = 4
    group_size: int = 8
    workers: int = 1
    window: int = 5
    agent_overrides: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {k: dict(v) for k, v in AGENT_OVERRIDES.items()}
    )
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def quick(cls) -> BenchSpec:
        """A smoke run for tests: one task, two agents, one seed, 6 iterations, in-process."""
        return cls(
            agents=("grpo", "rloo"),
            tasks=("lmgym/TargetString-v0",),
            seeds=(0,),
            iterations=6,
            workers=0,
            window=3,
        )

    def replace(self, **changes: Any) -> BenchSpec:
        """A copy with the non-``None`` ``changes`` applied (sequences become tuples)."""
        changes = {
            k: tuple(v) if isinstance(v, list) else v for k, v in changes.items() if v is not None
        }
        return dataclasses.replace(self, **changes)

    def iterations_for(self, task: str) -> int:
        """The iteration budget of ``task``."""
        if self.iterations is not None:
            return self.iterations
        return TASK_ITERATIONS.get(task, DEFAULT_ITERATIONS)

    def check(self) -> None:
        """Raise ``ValueError`` naming bad agents/tasks (with the valid ones) or sizes."""
        import lmgym  # noqa: F401  (registers the tasks)
        from lmgym.agents import ALGORITHMS
        from lmgym.envs.registration import TASKS

        bad = [a for a in self.agents if a not in ALGORITHMS]
        if bad:
            raise ValueError(
                f"unknown agent(s) {', '.join(bad)}; valid: {', '.join(sorted(ALGORITHMS))}"
            )
        bad = [t for t in self.tasks if t not in TASKS or not TASKS[t].available()]
        if bad:
            valid = sorted(t for t, info in TASKS.items() if info.available())
            raise ValueError(f"unknown task(s) {', '.join(bad)}; valid: {', '.join(valid)}")
        if not self.agents or not self.tasks or not self.seeds:
            raise ValueError("agents, tasks and seeds must each name at least one")
        for name in ("num_prompts", "group_size", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"iterations={self.iterations}: must be >= 1")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers}: must be >= 0")

    def jobs(self) -> list[dict[str, Any]]:
        """One job per (task, agent, seed), longest first."""
        jobs = [
            {
                "agent": agent,
                "task": task,
                "seed": seed,
                "iterations": self.iterations_for(task),
                "num_prompts": self.num_prompts,
                "group_size": self.group_size,
                "overrides": dict(self.agent_overrides.get(agent, {})),
                "env_kwargs": dict(self.env_kwargs.get(task, {})),
            }
            for task in self.tasks
            for agent in self.agents
            for seed in self.seeds
        ]
        return sorted(jobs, key=lambda j: -j["iterations"] * _COST.get(j["agent"], 1.0))


def _rss_mib() -> float:
    """Current resident memory of this process in MiB (Linux ``/proc``; else 0)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (agent, task, seed) and return its curve, wall time and memory.

    Runs in a worker process (or in this one with ``workers=0``) with one torch thread.
    """
    import gymnasium as gym
    import torch
    from transformers.utils import logging as hf_logging

    import lmgym  # noqa: F401  (registers the tasks)
    from lmgym.agents import ALGORITHMS
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    hf_logging.disable_progress_bar()  # a worker loading the Preference reward model
    torch.set_num_threads(1)
    seed = job["seed"]
    torch.manual_seed(seed)
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)
    env = gym.make_vec(
        job["task"],
        num_envs=job["num_prompts"] * job["group_size"],
        group_size=job["group_size"],
        tokenizer=tokenizer,
        **job["env_kwargs"],
    )
    agent = ALGORITHMS[job["agent"]](policy, env, seed=seed, **job["overrides"])  # type: ignore[arg-type]
    start_rss = _rss_mib()
    start = time.perf_counter()
    history = agent.learn(job["iterations"])
    wall = time.perf_counter() - start
    keys = ("iteration", "tokens_generated", "reward_mean", "completion_length")
    return {
        **job,
        "history": [{k: m[k] for k in keys} for m in history],
        "wall_s": wall,
        "start_rss_mib": start_rss,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _prepare_tasks(spec: BenchSpec) -> None:
    """Build each task's env once here, so a task with a one-off setup (Preference trains
    and caches its reward model) does it once, before the workers start."""
    import gymnasium as gym

    from lmgym.policy import make_char_tokenizer

    tokenizer = make_char_tokenizer()
    for task in spec.tasks:
        gym.make_vec(
            task,
            num_envs=spec.group_size,
            group_size=spec.group_size,
            tokenizer=tokenizer,
            **spec.env_kwargs.get(task, {}),
        )


def run_jobs(
    spec: BenchSpec, log: Callable[[str], None] | None = print
) -> tuple[list[dict[str, Any]], float]:
    """Run every job of ``spec``; returns ``(results, total wall seconds)``."""
    jobs = spec.jobs()
    results: list[dict[str, Any]] = []
    start = time.perf_counter()

    def done(result: dict[str, Any]) -> None:
        results.append(result)
        if log is not None:
            final = final_reward(result["history"], spec.window)
            log(
                f"[{len(results)}/{len(jobs)}] {result['agent']} on {result['task']} seed "
                f"{result['seed']}: final reward {final:.3f}, {result['wall_s']:.1f} s"
            )

    if spec.workers == 0:
        for job in jobs:
            done(run_job(job))
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(spec.workers, maxtasksperchild=1) as pool:
            for result in pool.imap_unordered(run_job, jobs):
                done(result)
    return results, time.perf_counter() - start


# ------------------------------------------------------------------ summary
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


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(
    results: list[dict[str, Any]], spec: BenchSpec
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {agent: row}}`` with the reported numbers (see the module docstring)."""
    from lmgym.envs.registration import TASKS

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for task in spec.tasks:
        threshold = TASKS[task].solved_threshold
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
                "iterations_to_solved": statistics.fmean(s[0] for s in solved) if solved else None,
                "tokens_to_solved": statistics.fmean(s[1] for s in solved) if solved else None,
                "tokens_total": statistics.fmean(
                    r["history"][-1]["tokens_generated"] for r in runs
                ),
                "wall_s": statistics.fmean(r["wall_s"] for r in runs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                "start_rss_mib": max(r["start_rss_mib"] for r in runs),
            }
    return table


def format_summary(table: dict[str, dict[str, dict[str, Any]]], spec: BenchSpec) -> str:
    """Agents x tasks: final reward mean ± std and seeds solved, as a Markdown table."""
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
                f"({row['solved']}/{row['seeds']} solved)"
            )
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt_count(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def format_table(task_rows: dict[str, dict[str, Any]]) -> str:
    """One task's rows as a Markdown table."""
    lines = [
        "| agent | final reward (mean ± std) | solved | iterations to solved | tokens to solved "
        "| tokens total | wall time (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for agent, row in task_rows.items():
        lines.append(
            f"| {agent} | {row['final_mean']:.3f} ± {row['final_std']:.3f} "
            f"| {row['solved']}/{row['seeds']} | {_fmt_count(row['iterations_to_solved'])} "
            f"| {_fmt_count(row['tokens_to_solved'])} | {_fmt_count(row['tokens_total'])} "
            f"| {row['wall_s']:.1f} | {row['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def _agent_settings(spec: BenchSpec, agent: str) -> str:
    """``learning_rate=0.002`` style text of an agent's overrides (or its default rate)."""
    from lmgym.agents import ALGORITHMS

    changes = spec.agent_overrides.get(agent, {})
    if not changes:
        rate = ALGORITHMS[agent].config_class().learning_rate
        return f"its defaults (learning_rate={rate:g})"
    return ", ".join(
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

    from lmgym.envs.registration import TASKS

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
    info = TASKS[task]
    if info.solved_threshold is not None:
        ax.axhline(info.solved_threshold, color="grey", linestyle="--", linewidth=1)
        ax.text(0, info.solved_threshold, " solved", va="bottom", color="grey", fontsize=8)
    ax.set_xlabel("completion tokens generated")
    ax.set_ylabel(f"reward (rolling mean of {spec.window} iterations)")
    ax.set_title(
        f"{task}: {spec.iterations_for(task)} iterations of "
        f"{spec.num_prompts}x{spec.group_size} completions"
    )
    ax.set_ylim(*info.reward_range)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


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
    if str(out) != DEFAULT_OUT:
        parts += ["--out", str(out)]
    return shlex.join(parts)


def write_report(
    results: list[dict[str, Any]], spec: BenchSpec, out: str | Path, total_s: float
) -> str:
    """Write ``README.md``, ``results.json`` and one PNG per task into ``out``.

    Returns:
        The Markdown written to ``README.md``.
    """
    import platform

    import torch

    from lmgym.envs.registration import TASKS

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = summarize(results, spec)
    overrides = "; ".join(f"{agent} {_agent_settings(spec, agent)}" for agent in spec.agents)
    iterations = ", ".join(f"{_short(t)} {spec.iterations_for(t)}" for t in spec.tasks)
    process = (
        "the run's own, fresh worker process"
        if spec.workers
        else "the one process that ran every run (so it is a maximum over all of them)"
    )
    lines = [
        "# Agent benchmark",
        "",
        f"Command: `{bench_command(spec, out)}` — {len(results)} runs in "
        f"{total_s / 60:.1f} min, {_at_a_time(spec)} with one torch thread "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}).",
        "",
        "Settings, equal for every agent: a fresh tiny GPT-2 per run (2 layers, 64 wide, "
        "character tokenizer, initialised with the run's seed), "
        f"{spec.num_prompts} prompts x {spec.group_size} completions per iteration, bandit "
        f"reward, iterations per task: {iterations}; seeds {', '.join(map(str, spec.seeds))}. "
        f"Each agent runs its documented defaults except: {overrides}.",
        "",
        f"Columns: *final reward* = mean `reward_mean` of the last {spec.window} iterations, "
        f"mean ± std over seeds; *solved* = seeds whose rolling mean of `reward_mean` over "
        f"{spec.window} iterations reached the task's solved threshold; *iterations / tokens "
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
    if (out / "ablations.md").exists():  # hand-written notes kept beside the results
        lines += [
            "Single-change ablations behind the comparison: [ablations.md](ablations.md).",
            "",
        ]
    lines += ["## Summary", "", format_summary(table, spec), ""]
    for task in spec.tasks:
        info = TASKS[task]
        lines += [
            f"## {task}",
            "",
            f"{info.description}. Solved at {info.solved_threshold:g}; a random policy scores "
            f"{info.random_baseline if info.random_baseline is not None else '?'}.",
            "",
            format_table(table[task]),
            "",
            f"![{_short(task)} learning curves]({_short(task)}.png)",
            "",
        ]
        plot_curves(results, spec, task, out / f"{_short(task)}.png")
    markdown = "\n".join(lines)
    (out / "README.md").write_text(markdown)
    (out / "results.json").write_text(
        json.dumps(
            {
                "spec": dataclasses.asdict(spec),
                "total_s": round(total_s, 1),
                "summary": table,
                "runs": [_compact(r) for r in results],
            }
        )
        + "\n"
    )
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


def run_bench(
    spec: BenchSpec,
    out: str | Path = DEFAULT_OUT,
    *,
    overwrite: bool = False,
    log: Callable[[str], None] | None = print,
) -> str:
    """Run the benchmark and write its report into ``out``.

    Raises:
        BenchOutputExistsError: ``out`` holds results and ``overwrite`` is False.
        ValueError: a bad ``spec`` (unknown agent or task names list the valid ones), or
            matplotlib is not installed.

    Returns:
        The Markdown report.
    """
    spec.check()
    if importlib.util.find_spec("matplotlib") is None:  # fail now, not after the runs
        raise ValueError(
            "lmgym bench draws its learning curves with matplotlib: pip install matplotlib "
            "(or the 'plot' extra)"
        )
    out = Path(out)
    if not overwrite and any((out / name).exists() for name in ("README.md", "results.json")):
        raise BenchOutputExistsError(
            f"bench output {out} already holds results; pass --overwrite to replace them"
        )
    _prepare_tasks(spec)
    if log is not None:
        log(
            f"bench: {len(spec.agents)} agents x {len(spec.tasks)} tasks x {len(spec.seeds)} "
            f"seeds = {len(spec.jobs())} runs on {max(spec.workers, 1)} process(es)"
        )
    results, total = run_jobs(spec, log)
    return write_report(results, spec, out, total)
