"""What an agent benchmark runs: ``BenchSpec`` and its defaults.

Apart from ``lmgym.training.bench`` (which runs a spec) and
``lmgym.training.bench_report`` (which renders its results), so both can read a
spec without importing each other. Algorithm names are those of the one registry,
``lmgym.agents.ALGORITHMS``; every agent runs at its documented defaults and only
``_COST`` (iterations dearer than most) names agents, so a new agent needs no entry
to be benchmarked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmgym.training.run import TrainConfig
from lmgym.typed_values import check_at_least

DEFAULT_AGENTS: tuple[str, ...] = ("reinforce", "rloo", "ppo", "grpo", "gspo", "cispo")
"""The agents of the committed results (``lmgym bench --agents all`` runs every one of
``lmgym.agents.ALGORITHMS``; the default stays at these six to keep its ~21 minutes)."""
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
_TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
DEFAULT_NUM_PROMPTS: int = _TRAIN_DEFAULTS["num_prompts"]
DEFAULT_GROUP_SIZE: int = _TRAIN_DEFAULTS["group_size"]
"""The bench's batch shape is ``lmgym train``'s (4 prompts x 16 completions): at 4 x 8
the GRPO family kept TargetString on 3 of 5 seeds, at 4 x 16 on 5 of 5."""
# Relative cost of an iteration, to start the longest runs first.
_COST = {"ppo": 3.0, "dual_clip_ppo": 3.0, "vapo": 3.0, "remax": 1.5}


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
        agent_overrides: config overrides per agent (default none: every agent at its
            documented defaults; until issue 26 most critic-free agents ran at 2e-3
            here, and the GRPO family kept TargetString on 2-3 of 5 seeds,
            benchmarks/results/stability_notes.md).
        env_kwargs: extra env factory arguments per task.
        model: a local directory or hub name of a causal LM (``None``: the tiny GPT-2).
        learning_rate: every agent's learning rate (``None``: ``agent_overrides``').
        rollout_engine, vllm_kv_cache_gib: what samples the rollouts (``TrainConfig``'s
            fields of the same names); each run's process starts its own engine.
    """

    agents: tuple[str, ...] = DEFAULT_AGENTS
    tasks: tuple[str, ...] = DEFAULT_TASKS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    iterations: int | None = None
    num_prompts: int = DEFAULT_NUM_PROMPTS
    group_size: int = DEFAULT_GROUP_SIZE
    workers: int = 1
    window: int = 5
    agent_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    model: str | None = None
    learning_rate: float | None = None
    rollout_engine: str = "lmgym"
    vllm_kv_cache_gib: float = 2.0

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
            check_at_least(name, getattr(self, name))
        if self.iterations is not None:
            check_at_least("iterations", self.iterations)
        check_at_least("workers", self.workers, 0)
        engine = {
            "rollout_engine": self.rollout_engine,
            "vllm_kv_cache_gib": self.vllm_kv_cache_gib,
        }
        TrainConfig(**engine).check()  # the run config's own checks of the two fields

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
        if self.rollout_engine != "lmgym":  # jobs at the default keep their old keys
            for job in jobs:
                job["rollout_engine"] = self.rollout_engine
                job["vllm_kv_cache_gib"] = self.vllm_kv_cache_gib
        return sorted(jobs, key=lambda j: -j["iterations"] * _COST.get(j["agent"], 1.0))
