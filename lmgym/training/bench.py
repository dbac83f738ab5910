"""The agent benchmark: agents x tasks x seeds with equal budgets, a table and learning curves.

Every run trains a fresh model on one task with the same budget for every agent:
the same number of iterations and the same batch shape (``num_prompts x
group_size`` completions per iteration), bandit reward, each agent at its
documented defaults except the learning rate (``AGENT_OVERRIDES``: the settings
the learning tests use; ``learning_rate`` replaces every agent's). The model is a
tiny GPT-2 initialised with the run's seed (``make_tiny_model``, character
tokenizer), or ``model``: a directory or hub name of the user's own causal LM,
loaded afresh for each run. Tasks are registered ids or ``module:Id`` (the
module imported first, in every worker too). Runs are independent processes
(``workers`` at a time, default one, one torch thread each; a fresh process per
run, so its peak RSS is its own).

Measured per run: the ``reward_mean`` and ``tokens_generated`` of every
iteration, wall time of ``learn`` and the process's peak resident memory
(``ru_maxrss``, which includes the ~0.5 GB that importing torch and transformers
costs). Running and reporting are apart: ``run_jobs`` runs a spec and returns
its records (one dict per run), and ``lmgym.training.bench_report`` renders records
(``render_markdown``: the ``README.md`` tables; ``render_json``: ``results.json``
with every curve) and writes them with one PNG of learning curves per task
(``write_report``). ``run_bench`` is the two in a row.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmgym.training.bench_report import (  # noqa: F401  (re-exported: the report's API)
    THRESHOLD_TOLERANCE,
    final_reward,
    format_summary,
    format_table,
    load_results,
    machine_line,
    render_json,
    render_markdown,
    solved_at,
    summarize,
    write_report,
)

DEFAULT_AGENTS: tuple[str, ...] = ("reinforce", "rloo", "ppo", "grpo", "gspo", "cispo")
"""The agents of the committed results (``lmgym bench --agents all`` runs every one of
``lmgym.agents.ALGORITHMS``; the default stays at these six to keep its ~14 minutes)."""
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
    "reinforce_pp": {"learning_rate": 2e-3},
    "gspo_token": {"learning_rate": 2e-3},
    "dual_clip_ppo": {},
    # Without the entropy bonus ReMax collapses onto its greedy completion (remax.py).
    "remax": {"learning_rate": 2e-3, "entropy_coef": 0.02},
    "vapo": {},
}
"""Config overrides per agent: the settings of tests/agents/test_learning.py's CASES
(the PPO family and VAPO: their defaults)."""
# Relative cost of an iteration, to start the longest runs first.
_COST = {"ppo": 3.0, "dual_clip_ppo": 3.0, "vapo": 3.0, "remax": 1.5}


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
        model: a local directory or hub name of a causal LM (``None``: the tiny GPT-2).
        learning_rate: every agent's learning rate (``None``: ``agent_overrides``').
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
    model: str | None = None
    learning_rate: float | None = None

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
        """Raise ``ValueError`` naming bad agents/tasks (with the valid ones) or sizes.

        A ``module:Id`` task's module is imported here; ``model`` is resolved
        (``resolve_model``: a missing directory or an unreachable hub name fails now).
        """
        import lmgym  # noqa: F401  (registers the tasks)
        from lmgym.agents import ALGORITHMS
        from lmgym.envs.registration import TASKS
        from lmgym.training.user_code import check_task_factory, resolve_task

        bad = [a for a in self.agents if a not in ALGORITHMS]
        if bad:
            raise ValueError(
                f"unknown agent(s) {', '.join(bad)}; valid: {', '.join(sorted(ALGORITHMS))} "
                "(or all)"
            )
        bad = []
        for task in self.tasks:
            try:
                env_id = resolve_task(task)
            except ValueError:
                if ":" in task:
                    raise
                bad.append(task)
                continue
            if env_id in TASKS and not TASKS[env_id].available():
                bad.append(task)
            else:
                check_task_factory(env_id, task)
        if bad:
            valid = sorted(t for t, info in TASKS.items() if info.available())
            raise ValueError(
                f"unknown task(s) {', '.join(bad)}; valid: {', '.join(valid)}, or your own "
                "as module:TaskId-v0"
            )
        if self.model is not None:
            from lmgym.training.model_source import resolve_model

            resolve_model(self.model)
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate}: must be > 0")
        if not self.agents or not self.tasks or not self.seeds:
            raise ValueError("agents, tasks and seeds must each name at least one")
        for name in ("num_prompts", "group_size", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"iterations={self.iterations}: must be >= 1")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers}: must be >= 0")

    def overrides_for(self, agent: str) -> dict[str, Any]:
        """``agent``'s config overrides (``learning_rate`` replacing its rate when set)."""
        overrides = dict(self.agent_overrides.get(agent, {}))
        if self.learning_rate is not None:
            overrides["learning_rate"] = self.learning_rate
        return overrides

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
                "overrides": self.overrides_for(agent),
                "env_kwargs": dict(self.env_kwargs.get(task, {})),
                "model": self.model,
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


def bench_policy(model: str | None, seed: int) -> Any:
    """The policy of one run: ``model`` loaded afresh, or a tiny GPT-2 initialised with ``seed``."""
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    if model is not None:
        from lmgym.training.model_source import resolve_model

        return CausalLMPolicy.from_pretrained(resolve_model(model))
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (agent, task, seed) and return its curve, wall time and memory.

    Runs in a worker process (or in this one with ``workers=0``) with one torch thread.
    """
    import gymnasium as gym
    import torch
    from transformers.utils import logging as hf_logging

    from lmgym.agents import ALGORITHMS
    from lmgym.training.user_code import resolve_task

    hf_logging.disable_progress_bar()  # a worker loading the Preference reward model
    torch.set_num_threads(1)
    seed = job["seed"]
    torch.manual_seed(seed)
    policy = bench_policy(job.get("model"), seed)
    tokenizer = policy.tokenizer
    env = gym.make_vec(
        resolve_task(job["task"]),
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
    from lmgym.training.user_code import resolve_task

    if spec.model is None:
        tokenizer = make_char_tokenizer()
    else:
        from transformers import AutoTokenizer

        from lmgym.training.model_source import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(spec.model))
    for task in spec.tasks:
        gym.make_vec(
            resolve_task(task),
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
