"""Resume planning: which run and checkpoint ``--resume PATH`` names, what may change, and
what the resumed run's configs are. Plain functions; ``plan_resume`` returns a
``ResumePlan`` the ``Trainer`` executes (under the run's lock it chooses and loads the
checkpoint, then ``check_checkpoint_agrees`` compares it with ``config.json``).

The rules, each written here once:

- the fields of ``FIXED_ON_RESUME`` and the whole agent config cannot change
  (``FixedOnResumeError`` names the field);
- an asynchronous run's checkpoints resume on the synchronous path (one process or
  data parallel): the actors' prompt streams and rows in flight are not saved;
- ``config.json`` and the checkpoint disagreeing (its ``algo``, agent settings or
  fixed run settings: one of them edited by hand or damaged) is refused, naming
  both values and files and the way out for either cause, and so is a run directory
  whose ``config.json`` is missing or a checkpoint set aside in ``abandoned/``;
- a prompt file must still have the SHA-256 the run recorded;
- a decaying learning-rate schedule cannot be lengthened (``check_schedule_length``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmgym.agents.base import Agent
from lmgym.agents.config import AgentConfig, config_from_dict, restore_types
from lmgym.persistence.manifest import CheckpointError
from lmgym.training.checkpoint import CheckpointManager, checkpoint_iteration, is_checkpoint
from lmgym.training.resolved import ResolvedFields, ResolvedRun
from lmgym.training.run import FIXED_ON_RESUME, RunDirectory, RunDirectoryError, TrainConfig

ASYNC_RESUME = (
    "{run} was trained by asynchronous actors and learners; it resumes on the synchronous "
    "path (its checkpoint lacks the actors' prompt streams and rows in flight, docs/async.md)"
)
"""The line a resumed asynchronous run prints."""


class FixedOnResumeError(ValueError):
    """A resume would change a field of ``FIXED_ON_RESUME`` or of the agent config.

    Attributes:
        field, value, old: the field, the value asked for and the run's.
        KEPT: what a resumed run keeps (the end of the message).
    """

    RUN_KEPT = (
        "a resumed run keeps its algorithm, task, model and its settings (dtype, LoRA, "
        "checkpointing), batch shape, temperature and env arguments (start a new run to "
        "change them)"
    )
    AGENT_KEPT = "a resumed run keeps its agent config (start a new run to change it)"

    def __init__(self, field: str, value: Any, old: Any, *, agent: bool = False) -> None:
        self.field, self.value, self.old = field, value, old
        self.KEPT = self.AGENT_KEPT if agent else self.RUN_KEPT
        super().__init__(f"{field}={value!r} differs from the run's {old!r}; {self.KEPT}")


class ConfigEditedError(ValueError):
    """A run's ``config.json`` and its checkpoint disagree: one of them was changed
    after the checkpoint was written (the message says which file holds which value)."""


def agent_config_from_dict(algo: str, values: dict[str, Any]) -> AgentConfig:
    """``ALGORITHMS[algo]``'s config from a saved or parsed ``{field: value}``."""
    from lmgym.agents import ALGORITHMS

    return config_from_dict(ALGORITHMS[algo].config_class, values)


def _abandoned_error(path: Path) -> RunDirectoryError | None:
    """The way forward for a checkpoint a resume set aside (``RUN/abandoned/NNN/...``)."""
    branch = path.parent.parent
    if branch.parent.name != RunDirectory.ABANDONED:
        return None
    run = branch.parent.parent
    return RunDirectoryError(
        f"{path} is a checkpoint that a resume from an earlier one set aside in {branch} "
        f"(nothing is deleted); lmgym resumes only from {run / RunDirectory.CHECKPOINTS}: to "
        f"continue that branch, copy it back (cp -r {path} {run / RunDirectory.CHECKPOINTS}/) "
        f"and pass --resume {run / RunDirectory.CHECKPOINTS / path.name} (its rows are in "
        f"{branch}), or start a new run from its model with --model {path / 'agent' / 'policy'}"
    )


def _missing_config_error(path: Path) -> FileNotFoundError | None:
    """The way forward for a directory with checkpoints but no readable ``config.json``."""
    run = RunDirectory(path)
    if not run.checkpoints.is_dir() or not CheckpointManager(run.checkpoints).checkpoints():
        return None
    what = "is missing" if not run.config_path.exists() else "is not one lmgym wrote (unreadable)"
    latest = CheckpointManager(run.checkpoints).checkpoints()[-1]
    return FileNotFoundError(
        f"{run.config_path} {what}, though {run.checkpoints} holds checkpoints: a resume reads "
        f"the run's settings from it; restore it (e.g. from a backup or the command that "
        f"started the run), or start a new run from a checkpoint's model with --model "
        f"{latest / 'agent' / 'policy'}"
    )


def find_run(path: str | Path) -> RunDirectory:
    """The run directory ``path`` names: a run directory, or a checkpoint inside one
    (``RUN/checkpoints/iter_NNNNNN``).

    Raises:
        RunDirectoryError: a symbolic link, a checkpoint that is not inside a run's
            ``checkpoints/`` (one set aside in ``abandoned/`` says how to continue it).
        FileNotFoundError: not an lmgym run directory (one with checkpoints but no
            ``config.json`` says so).
    """
    path = Path(path)
    if is_checkpoint(path):
        if path.is_symlink():
            raise RunDirectoryError(
                f"checkpoint {path} is a symbolic link; pass the real checkpoint directory"
            )
        abandoned = _abandoned_error(path)
        if abandoned is not None:
            raise abandoned
        if path.parent.name != RunDirectory.CHECKPOINTS or checkpoint_iteration(path.name) is None:
            raise RunDirectoryError(
                f"{path} is not a checkpoint inside a run directory (expected "
                "RUN/checkpoints/iter_NNNNNN); evaluate it with lmgym eval --model instead"
            )
        path = path.parent.parent
    try:
        return RunDirectory.open(path)
    except FileNotFoundError:
        missing = _missing_config_error(path) if not path.is_symlink() else None
        if missing is not None:
            raise missing from None
        raise


def find_checkpoint(path: str | Path) -> tuple[RunDirectory, Path]:
    """``(run, checkpoint)`` for a run directory (its latest checkpoint) or a checkpoint.

    Raises:
        FileNotFoundError: neither, or a run without checkpoints.
        CheckpointError: the run's ``checkpoints/latest`` names something else than
            one of its checkpoints.
    """
    path = Path(path)
    run = find_run(path)
    if is_checkpoint(path):
        return run, path
    latest = CheckpointManager(run.checkpoints).latest()
    if latest is None:
        raise FileNotFoundError(f"run directory {run.path} has no checkpoint to resume from")
    return run, latest


CHANGED = "changed after the checkpoint was written (edited by hand, or damaged)"
"""Why ``config.json`` and a checkpoint disagree. Neither side can be told to be the
intact one (anyone who can write a checkpoint can recompute its manifests), so no
message offers the checkpoint's value as the one to adopt without saying when it is."""
OTHERWISE = "if not, the checkpoint was changed: resume from another checkpoint"


def saved_values(path: str | Path) -> tuple[RunDirectory, dict[str, Any]]:
    """``(run, config.json)`` of the run ``path`` names, its ``algo`` checked against the
    algorithm its checkpoints hold (an edited ``algo`` is named, not reported as unknown
    agent fields).

    Raises:
        ConfigEditedError: ``config.json``'s ``algo`` and the checkpoint's differ.
        RunDirectoryError, FileNotFoundError: as ``find_run``.
    """
    run = find_run(path)
    saved = run.read_config()
    checkpoint = Path(path) if is_checkpoint(path) else CheckpointManager(run.checkpoints).latest()
    if checkpoint is not None:
        try:
            trained = CheckpointManager.algorithm(checkpoint)
        except (OSError, ValueError):
            trained = None  # an unreadable checkpoint: verified, and named, under the lock
        if trained is not None and trained != saved.get("algo"):
            raise ConfigEditedError(
                f"{run.config_path} says algo {saved.get('algo')!r}, but checkpoint "
                f"{checkpoint.name}'s agent/agent_config.json says {trained!r}: one of the two "
                f'files was {CHANGED}. If you edited config.json, set "algo" back to '
                f'"{trained}" there; {OTHERWISE}. To train with --algo {saved.get("algo")}, '
                "start a new run"
            )
    return run, saved


def fixed_fields(config: TrainConfig) -> dict[str, Any]:
    """The ``FIXED_ON_RESUME`` fields of ``config`` as JSON values (saved with every
    checkpoint, so a resume sees edits of ``config.json``)."""
    values = {name: getattr(config, name) for name in FIXED_ON_RESUME}
    return json.loads(json.dumps(values))


@dataclass
class ResumePlan(ResolvedFields):
    """What a resume will do.

    Attributes:
        run: the run directory.
        checkpoint: the checkpoint named, or ``None`` for the latest (chosen under the
            lock when the run starts).
        resolved: the resumed run's record (``resolve`` of the saved values and the
            changes): its ``config`` and ``agent_config``.
        saved_threads: the ``threads`` the run was trained with.
    """

    run: RunDirectory
    checkpoint: Path | None
    resolved: ResolvedRun
    saved_threads: int | None


def _check_changes(
    saved: dict[str, Any], changes: dict[str, Any], agent_changes: dict[str, Any]
) -> None:
    """Raise ``FixedOnResumeError`` for a change of a fixed run field or an agent field."""
    defaults = TrainConfig()  # the values of fields added after the run was written
    for name in FIXED_ON_RESUME:
        old = saved["run"].get(name, getattr(defaults, name))
        if name in changes and changes[name] != old:
            raise FixedOnResumeError(name, changes[name], old)
    from lmgym.agents import ALGORITHMS

    agent_class = ALGORITHMS[saved["algo"]].config_class
    old_agent = restore_types(agent_class, saved["agent"])
    for name, value in restore_types(agent_class, agent_changes).items():
        if value != old_agent.get(name):
            raise FixedOnResumeError(name, value, old_agent.get(name), agent=True)


def plan_resume(
    path: str | Path,
    changes: dict[str, Any] | None = None,
    agent_changes: dict[str, Any] | None = None,
    out: Callable[[str], None] = print,
) -> ResumePlan:
    """Plan continuing the run ``path`` names (a run directory or one of its checkpoints):
    check the changes, then resolve the run's record (``resolve``), which imports the
    user code named in ``config.json`` again after a line saying which.

    Args:
        path: the run directory (resume from its latest checkpoint) or a checkpoint.
        changes: ``TrainConfig`` fields to change, e.g. ``{"iterations": 200}``.
        agent_changes: agent config values asked for (each must equal the run's).
        out: where the lines before the import go (user code imported, async).

    Raises:
        FixedOnResumeError: a change touches a field a resumed run keeps.
        ConfigEditedError: ``config.json``'s ``algo`` was edited.
        ValueError: the prompt file changed, an env argument is wrong, or what
            ``resolve`` refuses.
    """
    from lmgym.training.resolved import resolve
    from lmgym.training.user_code import absolute_path, check_prompt_file, user_code_specs

    path = Path(path)
    run, saved = saved_values(path)
    changed = check_prompt_file(saved.get("imports"), "resume")
    if changed is not None:
        raise ValueError(
            f"{changed}; a resumed run must train on the same prompts: restore the file, "
            "or start a new run on the new one"
        )
    notes = []
    specs = user_code_specs(saved["run"])
    if specs:
        notes.append(
            f"importing the code named in {run.config_path}: "
            + ", ".join(f"{role} {spec}" for role, spec in specs)
        )
    if "async" in saved.get("launch", {}):
        notes.append(ASYNC_RESUME.format(run=run.path))
    changes = dict(changes or {})
    changes.pop("run_dir", None)
    if changes.get("prompts") is not None:
        changes["prompts"] = absolute_path(changes["prompts"])
    # The env arguments compare as the task's factory types them (resolve, below).
    _check_changes(
        saved, {k: v for k, v in changes.items() if k != "env_kwargs"}, agent_changes or {}
    )
    for line in notes:
        out(line)
    config = config_from_dict(TrainConfig, {**saved["run"], **changes, "run_dir": str(run.path)})
    resolved = resolve(config, agent_config_from_dict(saved["algo"], saved["agent"]))
    if "env_kwargs" in changes:
        _check_changes(saved, {"env_kwargs": resolved.config.env_kwargs}, {})
    return ResumePlan(
        run=run,
        checkpoint=path if is_checkpoint(path) else None,
        resolved=resolved,
        saved_threads=saved["run"].get("threads"),
    )


def check_checkpoint_agrees(
    plan: ResumePlan, checkpoint: Path, agent: Agent, trainer_state: dict[str, Any]
) -> None:
    """Refuse a resume whose ``config.json`` and ``checkpoint`` disagree: one of them
    was changed after the checkpoint was written (``config.json`` edited by hand, or the
    checkpoint's files edited or damaged, their manifests recomputed).

    The checkpoint holds the agent config it trained with and (since this check)
    the fixed run fields: a value of ``config.json`` that differs would otherwise be
    silently ignored (the checkpoint's wins) or contradict the checkpoint.

    Raises:
        ConfigEditedError: naming the first field that differs, both values and the
            file of each, and the way out for either cause (the checkpoint's value is
            offered only as the fix of an edited ``config.json``).
    """
    written = plan.run.read_config()
    trained = dataclasses.asdict(agent.config)
    listed = dataclasses.asdict(plan.agent_config)
    pairs = [("agent", k, listed.get(k), v) for k, v in trained.items()]
    pairs += [("run", k, written["run"].get(k), v) for k, v in trainer_state.get("run", {}).items()]
    for section, name, edited, value in pairs:
        if json.loads(json.dumps(edited)) != json.loads(json.dumps(value)):
            source = "agent/agent_config.json" if section == "agent" else "trainer_state.pt"
            raise ConfigEditedError(
                f"{plan.run.config_path} and checkpoint {checkpoint.name} disagree: {section} "
                f"field {name} is {edited!r} in config.json, {value!r} in the checkpoint's "
                f"{source}; one of them was {CHANGED}. If you edited config.json, put "
                f"{value!r} back there to resume; {OTHERWISE}. To train with config.json's "
                f"settings, start a new run (lmgym train --config {plan.run.config_path} "
                "--run-dir NEW_DIR)"
            )


def check_schedule_length(agent: Agent, iterations: int) -> None:
    """Refuse to train a resumed agent past the end of its decaying learning-rate schedule.

    A schedule's length is fixed when the run starts (``schedule_iterations``, else the
    run's first ``iterations``) and a checkpoint restores it as it was: past its end a
    linear schedule stays at 0 and a cosine one climbs back up.

    Raises:
        ValueError: ``iterations`` exceeds the schedule; the message gives its length.
    """
    from lmgym.agents.optim import NEEDS_LENGTH, steps_per_iteration

    steps = agent.lr_schedule.total_steps
    kind = agent.config.lr_scheduler_type
    if agent.lr_schedule.scheduler is None or steps is None or kind not in NEEDS_LENGTH:
        return
    span = steps // steps_per_iteration(agent.config)
    if iterations > span:
        raise ValueError(
            f"iterations={iterations}: the run's {kind} learning-rate schedule spans {span} "
            f"iterations (fixed when the run started) and a resume cannot lengthen it; resume "
            f"with --iterations {span} or fewer, or start a new run (with --schedule-iterations "
            "N to plan a longer one)"
        )


def checkpoint_error(run: RunDirectory, checkpoint: Path, exc: Exception) -> CheckpointError:
    """``exc`` with the run's other checkpoints named as a way out."""
    others = [p.name for p in CheckpointManager(run.checkpoints).checkpoints()]
    others = [name for name in others if name != checkpoint.name]
    hint = (
        f"; other checkpoints in this run: {', '.join(others)} (pass one to --resume, "
        f"e.g. --resume {run.checkpoints / others[-1]})"
        if others
        else ""
    )
    return CheckpointError(f"{exc}{hint}")


def choose_checkpoint(run: RunDirectory, named: Path | None, world_size: int) -> Path:
    """The checkpoint to resume from, verified: ``named``, else the run's latest (with
    the run's lock held).

    Raises:
        FileNotFoundError: the run has no checkpoint.
        CheckpointError: it fails verification (naming the run's other checkpoints),
            or was written by another number of processes.
    """
    checkpoint = named or CheckpointManager(run.checkpoints).latest()
    if checkpoint is None:
        raise FileNotFoundError(
            f"run directory {run.path} has no checkpoint to resume from (it stopped before "
            f"its first one); start it again with --run-dir {run.path} --overwrite"
        )
    try:
        CheckpointManager.verify(checkpoint)
    except CheckpointError as exc:
        raise checkpoint_error(run, checkpoint, exc) from None
    CheckpointManager.check_world_size(checkpoint, world_size)
    return checkpoint


def rewind_history(
    run: RunDirectory, checkpoint: Path, iteration: int, out: Callable[[str], None]
) -> None:
    """Set the run's history and checkpoints after ``iteration`` aside (``RunDirectory.rewind``)
    and point ``latest`` at ``checkpoint`` (with the run's lock held)."""
    manager = CheckpointManager(run.checkpoints)
    later = [p for p in manager.checkpoints() if (checkpoint_iteration(p.name) or 0) > iteration]
    branch = run.rewind(iteration, later)
    if branch is not None:
        out(
            f"the history after iteration {iteration} (rows, samples, evaluations"
            f"{', checkpoints ' + ', '.join(p.name for p in later) if later else ''}) "
            f"was moved to {branch}; nothing was deleted"
        )
    manager.point_latest_at(checkpoint)
