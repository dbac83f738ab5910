"""What an agent benchmark runs: ``BenchSpec`` and its defaults.

Apart from ``lmgym.bench.run`` (which runs a spec) and
``lmgym.bench.report`` (which renders its results), so both can read a
spec without importing each other. Algorithm names are those of the one registry,
``lmgym.agents.ALGORITHMS``; every agent runs at its documented defaults and only
``_COST`` (iterations dearer than most) names agents, so a new agent needs no entry
to be benchmarked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmgym.training.durations import parse_duration
from lmgym.training.pretrained import PRETRAINED_DEFAULTS
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
MAX_TIME_ITERATIONS = 1_000_000
"""The iteration cap of a run bounded by ``max_time`` alone (never reached: the wall
clock stops it first)."""
DEFAULT_EVAL_PROMPTS: int = _TRAIN_DEFAULTS["eval_prompts"]
DEFAULT_EVAL_SAMPLES: int = _TRAIN_DEFAULTS["eval_samples"]
# Relative cost of an iteration, to start the longest runs first.
_COST = {"ppo": 3.0, "dual_clip_ppo": 3.0, "vapo": 3.0, "remax": 1.5}


@dataclass(frozen=True)
class BenchSpec:
    """What ``run_bench`` runs: each field's docstring is its ``lmgym bench`` flag's help.

    The fields a run config has too (``model``, ``lora_r``, ``num_prompts``,
    ``group_size``, ``max_time``, ``prompts``, ``reward``, ``prompt_field``,
    ``eval_prompts``, ``eval_samples``, ``rollout_engine``, ``vllm_kv_cache_gib``) mean
    what ``TrainConfig``'s do, for every run, and take its defaults; ``lmgym bench``
    gives them ``TrainConfig``'s flags. A ``prompts`` task is benchmarked as
    ``prompts/<file stem>-v0`` (name it in ``tasks``), its held-out rows
    ``lmgym.training.holdout``'s. ``max_time`` is each run's wall-time budget (of
    ``learn``), instead of, or as well as, ``iterations``.

    With ``model``, every agent trains with the pretrained defaults
    (``PRETRAINED_DEFAULTS``: learning rate 1e-4 with LoRA, 1e-5 for a full fine-tune,
    no KL term, one pass over each batch) where ``agent_overrides`` and
    ``learning_rate`` set nothing; their group size (8) is the command line's default
    for ``group_size`` with ``--model`` (here the field is what it says).
    """

    agents: tuple[str, ...] = DEFAULT_AGENTS
    """Algorithm names (lmgym.agents.ALGORITHMS; on the command line, all: every one)."""
    tasks: tuple[str, ...] = DEFAULT_TASKS
    """Task ids, your own as module:TaskId-v0."""
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    """One run per seed (model init, sampler, prompt order)."""
    iterations: int | None = None
    """Iterations for every task; None: per task (TASK_ITERATIONS, else 150), or none with max_time alone."""
    num_prompts: int = DEFAULT_NUM_PROMPTS
    group_size: int = DEFAULT_GROUP_SIZE
    workers: int = 1
    """Runs at once, each in its own process with one torch thread; 0 runs them in this process. 1: concurrent runs share the CPU caches and memory bandwidth and, on the 2-vCPU machine of the committed results, slowed each other about 2x."""
    window: int = 5
    """Iterations in the rolling mean (final reward, solved threshold)."""
    agent_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Config overrides per agent (default none: every agent at its documented defaults; until issue 26 most critic-free agents ran at 2e-3 here, and the GRPO family kept TargetString on 2-3 of 5 seeds, benchmarks/results/stability_notes.md)."""
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra env factory arguments per task."""
    model: str | None = None
    learning_rate: float | None = None
    """Every agent's learning rate; None: each agent's own (agent_overrides'), with a model the pretrained defaults'."""
    rollout_engine: str = _TRAIN_DEFAULTS["rollout_engine"]
    vllm_kv_cache_gib: float = _TRAIN_DEFAULTS["vllm_kv_cache_gib"]
    lora_r: int = _TRAIN_DEFAULTS["lora_r"]
    max_time: str | None = None
    prompts: str | None = None
    reward: str | None = None
    prompt_field: str = _TRAIN_DEFAULTS["prompt_field"]
    evaluate: bool = False
    """Evaluate the base model (once per task and seed) and every trained model on the task's held-out prompts (make_eval_env), greedy and sampled."""
    eval_prompts: int = DEFAULT_EVAL_PROMPTS
    eval_samples: int = DEFAULT_EVAL_SAMPLES

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
        """The iteration budget of ``task`` (with ``max_time`` alone: ``MAX_TIME_ITERATIONS``)."""
        if self.iterations is not None:
            return self.iterations
        if self.max_time is not None:
            return MAX_TIME_ITERATIONS
        return TASK_ITERATIONS.get(task, DEFAULT_ITERATIONS)

    def budget_text(self, task: str) -> str:
        """``150 iterations``, ``8m of wall time``, or both."""
        parts = []
        if self.iterations is not None or self.max_time is None:
            parts.append(f"{self.iterations_for(task)} iterations")
        if self.max_time is not None:
            parts.append(f"{self.max_time} of wall time")
        return " or ".join(parts)

    def register_user_task(self) -> str | None:
        """Register the ``prompts`` / ``reward`` task (in this process); its id, or ``None``."""
        if self.prompts is None and self.reward is None:
            return None
        return register_user_task(self.prompts, self.reward, self.prompt_field)

    def key(self) -> dict[str, Any]:
        """What a resumed bench must share with the one it continues: every field but
        ``workers`` (how many run at once changes no run), as JSON values."""
        import json

        data = dataclasses.asdict(self)
        data.pop("workers")
        return json.loads(json.dumps(data))

    def check(self) -> None:
        """Raise ``ValueError`` naming bad agents/tasks (with the valid ones) or sizes.

        A ``module:Id`` task's module is imported here; ``model`` is resolved
        (``resolve_model``: a missing directory or an unreachable hub name fails now).
        """
        import lmgym  # noqa: F401  (registers the tasks)
        from lmgym.agents import ALGORITHMS
        from lmgym.envs.registration import TASKS
        from lmgym.training.user_code import check_task_factory, resolve_task

        self.register_user_task()
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
        self._check_training()
        engine = {
            "rollout_engine": self.rollout_engine,
            "vllm_kv_cache_gib": self.vllm_kv_cache_gib,
        }
        TrainConfig(**engine).check()  # the run config's own checks of the two fields

    def _check_training(self) -> None:
        """``check``'s part for the budget, LoRA and the held-out evaluation."""
        for name in ("eval_prompts", "eval_samples"):
            check_at_least(name, getattr(self, name))
        if self.max_time is not None:
            parse_duration(self.max_time)
        if self.lora_r < 0:
            raise ValueError(f"lora_r={self.lora_r}: must be >= 0 (0: full fine-tuning)")
        if self.lora_r and self.model is None:
            raise ValueError(
                f"lora_r={self.lora_r} needs --model (LoRA adapts a pretrained model; the "
                "tiny GPT-2 of the default bench trains every weight)"
            )

    def overrides_for(self, agent: str) -> dict[str, Any]:
        """``agent``'s config overrides: with ``model`` the pretrained defaults first
        (``PRETRAINED_DEFAULTS``, the fields its config has), then ``agent_overrides``,
        then ``learning_rate`` replacing its rate when set."""
        overrides: dict[str, Any] = {}
        if self.model is not None:
            from lmgym.agents import ALGORITHMS

            fields = {f.name for f in dataclasses.fields(ALGORITHMS[agent].config_class)}
            for name, (section, value) in PRETRAINED_DEFAULTS.values(self.lora_r > 0).items():
                if section == "agent" and name in fields:
                    overrides[name] = value
        overrides.update(self.agent_overrides.get(agent, {}))
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
        # Jobs at the defaults keep their old keys.
        extra: dict[str, Any] = {}
        if self.rollout_engine != "lmgym":
            extra["rollout_engine"] = self.rollout_engine
            extra["vllm_kv_cache_gib"] = self.vllm_kv_cache_gib
        if self.lora_r:
            extra["lora_r"] = self.lora_r
        if self.max_time is not None:
            extra["max_time"] = self.max_time
        if self.prompts is not None or self.reward is not None:
            extra["user_task"] = [self.prompts, self.reward, self.prompt_field]
        if self.evaluate:
            extra["eval"] = {"prompts": self.eval_prompts, "samples": self.eval_samples}
        for job in jobs:
            job.update(extra)
        return sorted(jobs, key=lambda j: -j["iterations"] * _COST.get(j["agent"], 1.0))


def register_user_task(prompts: str | None, reward: str | None, prompt_field: str) -> str:
    """Register the task of a prompt file and a reward with its held-out split
    (``user_code.prepare_task``, as ``lmgym train --prompts --reward`` does); its id.

    Raises:
        ValueError: one without the other, or what ``prepare_task`` raises.
    """
    from lmgym.training.user_code import prepare_task

    config = TrainConfig(prompts=prompts, reward=reward, prompt_field=prompt_field)
    return prepare_task(config)
