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
its records (one dict per run), and ``lmgym.bench.report`` renders records
(``render_markdown``: the ``README.md`` tables; ``render_json``: ``results.json``
with every curve) and writes them with one PNG of learning curves per task
(``write_report``). ``run_bench`` is the two in a row.

On a pretrained model (``model``, optionally ``lora_r``) every agent trains with the
pretrained defaults (``BenchSpec.overrides_for``), and with ``evaluate`` the base
model (once per task and seed, ``run_base_eval``) and each trained model are
evaluated on the task's held-out prompts (``held_out_eval``: greedy, and
``eval_samples`` samples per prompt for pass@k), with the same prompts and sampler
seed, so base and trained are compared on the same draw. Budgets are equal:
``iterations``, ``max_time`` (wall time of ``learn``), or both.

Resumable. ``run_bench`` keeps its state in ``out``: ``bench_spec.json`` (the
spec), ``runs/<task>__<agent>__seed<N>.json`` (one finished run each) and
``base/<task>__seed<N>.json`` (one base evaluation each), every file written
atomically when its run ends. Run again with the same spec, a killed bench skips
what it finished and redoes the rest; another spec in the same ``out`` is refused
(``BenchSpecChangedError``) unless ``overwrite``, which starts over.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import re
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmgym.bench.report import (  # noqa: F401  (re-exported: the report's API)
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
from lmgym.bench.spec import (  # noqa: F401  (re-exported: the spec's API)
    DEFAULT_AGENTS,
    DEFAULT_ITERATIONS,
    DEFAULT_OUT,
    DEFAULT_SEEDS,
    DEFAULT_TASKS,
    TASK_ITERATIONS,
    BenchSpec,
)
from lmgym.persistence.atomic import atomic_write_text


class BenchOutputExistsError(FileExistsError):
    """The output directory already holds results and ``overwrite`` was not given."""


class BenchSpecChangedError(BenchOutputExistsError):
    """The output directory holds runs of another spec and ``overwrite`` was not given."""


SPEC_FILE = "bench_spec.json"
RUNS_DIR = "runs"
BASE_DIR = "base"
EVAL_STREAM = 11
"""Side stream of the held-out evaluations' seed (``evaluation.derived_seed``)."""


def _rss_mib() -> float:
    """Current resident memory of this process in MiB (Linux ``/proc``; else 0)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_policy(model: str | None, seed: int, positions: int = 256, lora_r: int = 0) -> Any:
    """The policy of one run: ``model`` loaded afresh (with a fresh LoRA adapter of rank
    ``lora_r``, ``TrainConfig.peft_config``), or a tiny GPT-2 initialised with ``seed``
    with a context of ``positions`` (``make_tiny_model``'s 256 by default)."""
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    if model is not None:
        from lmgym.training.model_source import resolve_model
        from lmgym.training.run import TrainConfig

        peft_config = TrainConfig(model=model, lora_r=lora_r).peft_config()
        return CausalLMPolicy.from_pretrained(resolve_model(model), peft_config=peft_config)
    tokenizer = make_char_tokenizer()
    tiny = make_tiny_model(len(tokenizer), n_positions=positions, seed=seed)
    return CausalLMPolicy(tiny, tokenizer)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (agent, task, seed) and return its curve, wall time and memory.

    Runs in a worker process (or in this one with ``workers=0``) with one torch thread.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from lmgym.agents import ALGORITHMS

    hf_logging.disable_progress_bar()  # a worker loading the Preference reward model
    torch.set_num_threads(1)
    seed = job["seed"]
    policy, env, env_id = _policy_and_env(job, job.get("lora_r", 0))
    agent = ALGORITHMS[job["agent"]](policy, env, seed=seed, **job["overrides"])  # type: ignore[arg-type]
    callbacks = []
    if job.get("max_time") is not None:
        from lmgym.training.wall_clock import WallClockLimit, parse_duration

        callbacks.append(WallClockLimit(parse_duration(job["max_time"])))
    start_rss = _rss_mib()
    start = time.perf_counter()
    history = agent.learn(job["iterations"], callbacks)
    wall = time.perf_counter() - start
    keys = ("iteration", "tokens_generated", "reward_mean", "completion_length")
    result = {
        **job,
        "history": [{k: m[k] for k in keys} for m in history],
        "wall_s": wall,
        "start_rss_mib": start_rss,
    }
    if job.get("eval") is not None:
        result["trained_eval"] = held_out_eval(policy, env_id, job)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _policy_and_env(job: dict[str, Any], lora_r: int) -> tuple[Any, Any, str]:
    """``(policy, training env, env id)`` of a job, the policy sampling with the job's
    rollout engine: the model (with a fresh LoRA adapter of rank ``lora_r``), or the
    tiny GPT-2 initialised with the job's seed, as long as the task needs."""
    import gymnasium as gym
    import torch

    from lmgym.envs.registration import batch_arguments
    from lmgym.policy.engines import choose_rollout_engine
    from lmgym.training.user_code import resolve_task

    _register_job_task(job)
    seed = job["seed"]
    torch.manual_seed(seed)
    policy = bench_policy(job.get("model"), seed, lora_r=lora_r)
    env_id = resolve_task(job["task"])
    env = gym.make_vec(
        env_id,
        **batch_arguments(env_id, job["num_prompts"], job["group_size"]),
        tokenizer=policy.tokenizer,
        **_env_kwargs(job, env_id, policy),
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
    return policy, env, env_id


def _register_job_task(job: dict[str, Any]) -> None:
    """Register a job's ``--prompts`` task in this process (a spawned worker has not)."""
    if job.get("user_task") is not None:
        from lmgym.bench.spec import register_user_task

        register_user_task(*job["user_task"])


def _env_kwargs(job: dict[str, Any], env_id: str, policy: Any) -> dict[str, Any]:
    """The job's env arguments, with a chat model's stop tokens (``with_policy_stop_ids``)."""
    if job.get("model") is None:
        return dict(job["env_kwargs"])
    from lmgym.training.env_args import with_policy_stop_ids

    return with_policy_stop_ids(env_id, dict(job["env_kwargs"]), policy)


def held_out_eval(policy: Any, env_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """``{"greedy": EvalResult, "sampled": EvalResult}`` (as JSON) of ``policy`` on the
    task's held-out prompts (``make_eval_env``): greedy decoding with one completion
    per prompt, and ``job["eval"]["samples"]`` sampled ones (pass@1 and pass@k where
    the task has a verifier). The seed is a function of the job's seed alone, so the
    base model and every agent's trained model see the same prompts."""
    import dataclasses

    from lmgym.training.evaluation import (
        correct_threshold_for,
        derived_seed,
        evaluate_policy,
        make_eval_env,
    )

    settings = job["eval"]
    seed = derived_seed(job["seed"], 0, EVAL_STREAM)
    threshold = correct_threshold_for(env_id)
    kwargs = _env_kwargs(job, env_id, policy)
    out: dict[str, Any] = {}
    sampling = policy.sampling
    for name, samples in (("greedy", 1), ("sampled", settings["samples"])):
        env, split = make_eval_env(
            env_id, policy.tokenizer, settings["prompts"], samples, env_kwargs=kwargs
        )
        if name == "greedy":
            policy.sampling = dataclasses.replace(sampling, temperature=0.0)
        try:
            result = evaluate_policy(
                policy,
                env,
                settings["prompts"],
                seed=seed,
                correct_threshold=threshold,
                split=split,
            )
        finally:
            policy.sampling = sampling
        out[name] = result.to_json()
    return out


def run_base_eval(job: dict[str, Any]) -> dict[str, Any]:
    """Evaluate the untrained ``model`` of a (task, seed) job (``held_out_eval``)."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    start = time.perf_counter()
    policy, _, env_id = _policy_and_env(job, lora_r=0)
    result = held_out_eval(policy, env_id, job)
    return {
        "task": job["task"],
        "seed": job["seed"],
        "eval": result,
        "wall_s": time.perf_counter() - start,
    }


def _prepare_tasks(spec: BenchSpec) -> None:
    """Build each task's env once here, so a task with a one-off setup (Preference trains
    and caches its reward model) does it once, before the workers start."""
    import gymnasium as gym

    from lmgym.policy import make_char_tokenizer
    from lmgym.training.user_code import resolve_task

    spec.register_user_task()
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


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text)


def run_file(out: str | Path, job: dict[str, Any]) -> Path:
    """Where a finished run's record is kept: ``out/runs/<task>__<agent>__seed<N>.json``."""
    return Path(out) / RUNS_DIR / f"{_slug(job['task'])}__{job['agent']}__seed{job['seed']}.json"


def base_file(out: str | Path, task: str, seed: int) -> Path:
    """Where a base evaluation is kept: ``out/base/<task>__seed<N>.json``."""
    return Path(out) / BASE_DIR / f"{_slug(task)}__seed{seed}.json"


def _map(spec: BenchSpec, function: Callable[[dict[str, Any]], dict[str, Any]], jobs: list) -> Any:
    """``function`` over ``jobs``: in this process (``workers=0``) or in fresh ones."""
    if spec.workers == 0:
        for job in jobs:
            yield function(job)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(spec.workers, maxtasksperchild=1) as pool:
        yield from pool.imap_unordered(function, jobs)


def _base_jobs(spec: BenchSpec) -> list[dict[str, Any]]:
    """One base-evaluation job per (task, seed): the first training job's settings."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for job in spec.jobs():
        seen.setdefault((job["task"], job["seed"]), job)
    return list(seen.values())


class _Saved:
    """What a bench's ``out`` holds already, and how a finished record gets there."""

    def __init__(self, out: str | Path | None) -> None:
        self.out = None if out is None else Path(out)
        self.before = 0.0
        self.start = time.perf_counter()
        if self.out is not None:
            progress = self.out / "progress.json"
            if progress.exists():
                self.before = float(json.loads(progress.read_text()).get("elapsed_s", 0.0))
            for directory in (RUNS_DIR, BASE_DIR):
                (self.out / directory).mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        """Seconds of this attempt plus those of the earlier ones."""
        return self.before + time.perf_counter() - self.start

    def load(self, path: Path | None) -> dict[str, Any] | None:
        """The record at ``path``, if it is there."""
        if path is None or not path.exists():
            return None
        return json.loads(path.read_text())

    def save(self, path: Path | None, record: dict[str, Any]) -> None:
        """Write ``record`` to ``path`` atomically (nothing without ``out``)."""
        if self.out is None or path is None:
            return
        atomic_write_text(path, json.dumps(record) + "\n")
        progress = json.dumps({"elapsed_s": self.elapsed()}) + "\n"
        atomic_write_text(self.out / "progress.json", progress)

    def run_path(self, job: dict[str, Any]) -> Path | None:
        return None if self.out is None else run_file(self.out, job)

    def base_path(self, job: dict[str, Any]) -> Path | None:
        return None if self.out is None else base_file(self.out, job["task"], job["seed"])


def _run_line(result: dict[str, Any], done: int, total: int, window: int) -> str:
    final = final_reward(result["history"], window)
    line = (
        f"[{done}/{total}] {result['agent']} on {result['task']} seed {result['seed']}: final "
        f"reward {final:.3f}, {len(result['history'])} iterations, {result['wall_s']:.1f} s"
    )
    if "trained_eval" in result:
        line += f"; held-out {_eval_text(result['trained_eval'])}"
    return line


def run_jobs(
    spec: BenchSpec,
    log: Callable[[str], None] | None = print,
    out: str | Path | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Run every job of ``spec``; returns ``(results, total wall seconds)``.

    With ``out``, each finished run (and base evaluation) is written there atomically
    as it ends (``run_file``, ``base_file``), and a job whose file is there already is
    read back instead of run: a rerun continues a killed bench. The total then adds
    the seconds of the earlier attempts (``progress.json``).
    """
    say = log if log is not None else (lambda line: None)
    saved = _Saved(out)
    jobs = spec.jobs()
    base_jobs = _base_jobs(spec) if spec.evaluate else []
    base: dict[tuple[str, int], dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    for job in base_jobs:
        if (record := saved.load(saved.base_path(job))) is not None:
            base[(job["task"], job["seed"])] = record
    for job in jobs:
        if (record := saved.load(saved.run_path(job))) is not None:
            results.append(record)
    if results or base:
        say(
            f"bench: resuming in {out}: {len(results)} of {len(jobs)} runs and {len(base)} "
            "base evaluations already done"
        )
    base_todo = [j for j in base_jobs if (j["task"], j["seed"]) not in base]
    for record in _map(spec, run_base_eval, base_todo):
        base[(record["task"], record["seed"])] = record
        saved.save(saved.base_path(record), record)
        say(f"base model on {record['task']} seed {record['seed']}: {_eval_text(record['eval'])}")
    done = {(r["task"], r["agent"], r["seed"]) for r in results}
    todo = [j for j in jobs if (j["task"], j["agent"], j["seed"]) not in done]
    for result in _map(spec, run_job, todo):
        results.append(result)
        saved.save(saved.run_path(result), result)
        say(_run_line(result, len(results), len(jobs), spec.window))
    for result in results:
        if (result["task"], result["seed"]) in base:
            result["base_eval"] = base[(result["task"], result["seed"])]["eval"]
    return results, saved.elapsed()


def _eval_text(evaluation: dict[str, Any]) -> str:
    """``greedy 0.250, sampled 0.203 (pass@4 0.500)``."""
    greedy, sampled = evaluation["greedy"], evaluation["sampled"]
    text = f"greedy {greedy['reward_mean']:.3f}, sampled {sampled['reward_mean']:.3f}"
    if sampled.get("pass_at_k") is not None:
        text += f" (pass@{sampled['samples_per_prompt']} {sampled['pass_at_k']:.3f})"
    return text


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
    prepare_output(spec, out, overwrite)
    _prepare_tasks(spec)
    if log is not None:
        log(
            f"bench: {len(spec.agents)} agents x {len(spec.tasks)} tasks x {len(spec.seeds)} "
            f"seeds = {len(spec.jobs())} runs on {max(spec.workers, 1)} process(es)"
        )
    results, total = run_jobs(spec, log, out)
    return write_report(results, spec, out, total)


def prepare_output(spec: BenchSpec, out: Path, overwrite: bool) -> None:
    """Make ``out`` ready for ``spec``: a fresh directory, one to resume (same spec,
    report not written yet), or, with ``overwrite``, one cleared of earlier runs.

    Raises:
        BenchOutputExistsError: ``out`` holds a finished report (``README.md`` or
            ``results.json``).
        BenchSpecChangedError: ``out`` holds unfinished runs of another spec.
    """
    spec_path = out / SPEC_FILE
    if overwrite:
        for directory in (RUNS_DIR, BASE_DIR):
            shutil.rmtree(out / directory, ignore_errors=True)
        for name in (SPEC_FILE, "progress.json"):
            (out / name).unlink(missing_ok=True)
    elif any((out / name).exists() for name in ("README.md", "results.json")):
        raise BenchOutputExistsError(
            f"bench output {out} already holds results; pass --overwrite to replace them"
        )
    elif spec_path.exists():
        saved = json.loads(spec_path.read_text())
        current = spec.key()
        if saved != current:
            changed = ", ".join(
                f"{k} {saved.get(k)!r} -> {current.get(k)!r}"
                for k in sorted(set(saved) | set(current))
                if saved.get(k) != current.get(k)
            )
            raise BenchSpecChangedError(
                f"bench output {out} holds unfinished runs of another bench ({changed}); "
                "rerun that command to continue it, or pass --overwrite to start over"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(spec_path, json.dumps(spec.key(), indent=1) + "\n")
