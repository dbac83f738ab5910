"""A training run's settings (``TrainConfig``) and its directory on disk (``RunDirectory``).

Layout of a run directory::

    config.json          what was run: {"lmgym_run": 1, "algo", "run": TrainConfig, "agent": config}
    progress.csv         one row of metrics per iteration (Stable-Baselines3 CSV logger)
    events.out.tfevents* the same metrics for TensorBoard (when tensorboard is installed)
    samples.jsonl        sampled completions, every ``sample_every`` iterations
    eval.jsonl           periodic evaluations (``eval_every``)
    checkpoints/         iter_000050/ ... (see ``CheckpointManager``), ``latest`` names the newest

``config.json`` doubles as a config file: ``lmgym train --config RUN/config.json``
repeats a run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmgym.agents.config import AgentConfig

DEFAULT_TASK = "lmgym/TargetString-v0"
RUN_MARKER = "lmgym_run"


@dataclass
class TrainConfig:
    """Settings of one training run (everything that is not the agent's own config)."""

    algo: str = "grpo"
    """Algorithm: reinforce, rloo, ppo, grpo, drgrpo, gspo or cispo."""
    task: str = DEFAULT_TASK
    """Registered task id (lmgym tasks lists them)."""
    model: str | None = None
    """Hub name or local directory of a causal LM; None builds a tiny GPT-2 locally."""
    iterations: int = 150
    """Total rollout batches to train on (on --resume: the new total)."""
    num_prompts: int = 4
    """Prompts per batch (P)."""
    group_size: int = 8
    """Completions per prompt (G); a batch has P * G rows."""
    temperature: float = 1.0
    """Sampling temperature."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the task's env factory, e.g. reward_mode=per_token."""
    device: str = "cpu"
    """Torch device, e.g. cpu or cuda."""
    threads: int = 1
    """Torch CPU threads (1 is fastest for tiny models)."""
    run_dir: str | None = None
    """Run directory; None: runs/<algo>-<task>-<date>-<time>."""
    save_every: int = 50
    """Write a checkpoint every N iterations (0: only at the end); one is always written at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep (0 keeps all)."""
    log_interval: int = 50
    """Print the metrics table every N iterations (0: never); CSV/TensorBoard get every iteration."""
    sample_every: int = 50
    """Print and record a few sampled completions every N iterations (0: never)."""
    samples: int = 4
    """Completions printed each time, and at the end."""
    eval_every: int = 0
    """Evaluate on the task's eval prompts every N iterations (0: only before and after)."""
    eval_prompts: int = 32
    """Prompts drawn per evaluation (the eval split's, in a seeded order, repeated if it is smaller)."""
    eval_samples: int = 4
    """Completions per evaluation prompt (the k of pass@k)."""
    early_stop: bool = False
    """Stop once the rolling mean reward reaches stop_threshold."""
    stop_threshold: float | None = None
    """Early-stop threshold; None: the task's solved threshold."""
    stop_window: int = 5
    """Iterations in the rolling mean that early stopping watches."""
    no_progress: bool = False
    """Hide the progress bar."""
    callbacks: list[str] = field(default_factory=list)
    """Custom callbacks, 'package.module:name'; a class is instantiated with no arguments."""

    def check(self) -> None:
        """Raise ``ValueError`` naming the field for values no run can use."""
        for name in ("iterations", "save_every", "keep_checkpoints", "log_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("sample_every", "samples", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("num_prompts", "group_size", "threads", "eval_prompts", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.stop_window < 1:
            raise ValueError(f"stop_window={self.stop_window}: must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature}: must be > 0")


# Fields a resumed run must keep: changing them would not continue the same run.
FIXED_ON_RESUME = (
    "algo",
    "task",
    "model",
    "num_prompts",
    "group_size",
    "temperature",
    "env_kwargs",
)


def default_run_dir(algo: str, task: str, root: str | Path = "runs") -> Path:
    """``runs/<algo>-<TaskName>-<YYYYmmdd-HHMMSS>``, with a suffix if that exists."""
    name = task.split("/")[-1].removesuffix("-v0").replace("/", "-")
    base = Path(root) / f"{algo}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunDirectoryExistsError(FileExistsError):
    """The run directory exists and ``overwrite`` was not given."""


class RunDirectory:
    """A run's directory: paths of its files, and its ``config.json``.

    Args:
        path: the directory.
    """

    CONFIG = "config.json"
    PROGRESS = "progress.csv"
    SAMPLES = "samples.jsonl"
    EVAL = "eval.jsonl"
    CHECKPOINTS = "checkpoints"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    @property
    def config_path(self) -> Path:
        return self.path / self.CONFIG

    @property
    def progress_path(self) -> Path:
        return self.path / self.PROGRESS

    @property
    def samples_path(self) -> Path:
        return self.path / self.SAMPLES

    @property
    def eval_path(self) -> Path:
        return self.path / self.EVAL

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    def is_run(self) -> bool:
        """Whether the directory holds an lmgym run's ``config.json``."""
        try:
            return RUN_MARKER in json.loads(self.config_path.read_text())
        except (OSError, ValueError, TypeError):
            return False

    @classmethod
    def create(cls, path: str | Path, overwrite: bool = False) -> RunDirectory:
        """Make a new, empty run directory.

        Raises:
            RunDirectoryExistsError: ``path`` exists and ``overwrite`` is False, or
                ``overwrite`` is True but ``path`` is a non-empty directory that is not
                an lmgym run (never deleted).
        """
        run = cls(path)
        if run.path.exists():
            if not overwrite:
                raise RunDirectoryExistsError(
                    f"run directory {run.path} already exists; pass --overwrite to replace it "
                    f"or --resume {run.path} to continue it"
                )
            if run.path.is_dir() and any(run.path.iterdir()) and not run.is_run():
                raise RunDirectoryExistsError(
                    f"run directory {run.path} exists and is not an lmgym run (no {cls.CONFIG} "
                    "from lmgym train); refusing to delete it with --overwrite, pick another path"
                )
            if run.path.is_dir():
                shutil.rmtree(run.path)
            else:
                run.path.unlink()
        run.path.mkdir(parents=True)
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDirectory:
        """An existing run directory.

        Raises:
            FileNotFoundError: ``path`` is not an lmgym run directory.
        """
        run = cls(path)
        if not run.is_run():
            raise FileNotFoundError(
                f"{run.path} is not an lmgym run directory (no {cls.CONFIG} written by lmgym train)"
            )
        return run

    def write_config(self, config: TrainConfig, agent_config: AgentConfig) -> None:
        """Write ``config.json`` (atomically: a temporary file, then a rename)."""
        data = {
            RUN_MARKER: 1,
            "algo": config.algo,
            "run": dataclasses.asdict(config),
            "agent": dataclasses.asdict(agent_config),
        }
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.config_path)

    def read_config(self) -> dict[str, Any]:
        """``config.json`` as written by ``write_config``."""
        return json.loads(self.config_path.read_text())

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        """Append one JSON line to ``name`` inside the run directory."""
        with open(self.path / name, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def truncate_jsonl(self, name: str, iteration: int) -> None:
        """Drop records of ``name`` past ``iteration`` (a resumed run recomputes them)."""
        path = self.path / name
        if not path.exists():
            return
        keep = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("iteration", 0) <= iteration
        ]
        path.write_text("".join(line + "\n" for line in keep))
