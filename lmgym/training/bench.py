"""The agent benchmark: agents x tasks x seeds with equal budgets, a table and learning curves.

Every run trains a fresh model on one task with the same budget for every agent:
the same number of iterations and the same batch shape (``num_prompts x
group_size`` completions per iteration, by default ``lmgym train``'s 4 x 16), bandit
reward, each agent at its documented defaults (``learning_rate`` replaces every
agent's rate; ``agent_overrides`` changes single agents). The model is a
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

import importlib.util
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
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
from lmgym.training.bench_spec import (  # noqa: F401  (re-exported: the spec's API)
    DEFAULT_AGENTS,
    DEFAULT_ITERATIONS,
    DEFAULT_OUT,
    DEFAULT_SEEDS,
    DEFAULT_TASKS,
    TASK_ITERATIONS,
    BenchSpec,
)


class BenchOutputExistsError(FileExistsError):
    """The output directory already holds results and ``overwrite`` was not given."""


def _rss_mib() -> float:
    """Current resident memory of this process in MiB (Linux ``/proc``; else 0)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_policy(model: str | None, seed: int, positions: int = 256) -> Any:
    """The policy of one run: ``model`` loaded afresh, or a tiny GPT-2 initialised with
    ``seed`` with a context of ``positions`` (``make_tiny_model``'s 256 by default)."""
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    if model is not None:
        from lmgym.training.model_source import resolve_model

        return CausalLMPolicy.from_pretrained(resolve_model(model))
    tokenizer = make_char_tokenizer()
    tiny = make_tiny_model(len(tokenizer), n_positions=positions, seed=seed)
    return CausalLMPolicy(tiny, tokenizer)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (agent, task, seed) and return its curve, wall time and memory.

    Runs in a worker process (or in this one with ``workers=0``) with one torch thread.
    """
    import gymnasium as gym
    import torch
    from transformers.utils import logging as hf_logging

    from lmgym.agents import ALGORITHMS
    from lmgym.policy.engines import choose_rollout_engine
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
    context = policy.context_length
    if job.get("model") is None and context is not None and env.seq_len > context:
        # A task longer than the tiny model (the Gymnasium games as text): the same
        # model with as many positions as the task needs (build.tiny_positions).
        torch.manual_seed(seed)
        policy = bench_policy(None, seed, positions=env.seq_len)
    choose_rollout_engine(
        policy, job.get("rollout_engine", "lmgym"), job.get("vllm_kv_cache_gib", 2.0)
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
