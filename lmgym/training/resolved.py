"""The resolved run record: a run's settings with every derived value computed once.

``TrainConfig`` is what the user asked for (frozen: nothing writes to it).
``resolve(config, agent_config)`` checks it and the agent config, then computes, once,
what follows from them:

- the task: a ``module:Id`` task imported, a prompt file's task registered (its id
  becomes ``task``, the prompt files' paths absolute so that a resume from another
  directory finds them: ``user_code.recorded_task``);
- the env arguments, typed by the task's factory (``check_env_kwargs``);
- ``threads`` chosen from the machine when it is 0 (``auto_threads``), said in a note;
- the early-stop threshold (``stop_threshold``);
- what the run imports: its modules, its prompt files with their SHA-256
  (``run_imports``).

The record's ``config`` is what the trainer reads, what each checkpoint's fixed
fields are taken from and what ``config.json`` saves (``save``), so a resume reads back
exactly what was checked. A resume resolves once too: ``resume.plan_resume`` checks the
changes against the saved run, resolves the saved values with them, and the
``Trainer`` takes that record as it is. Two values are known only later, and each completes the
record by making a new one (``with_values``): a fresh run's directory once it is
created, and the env arguments the agent was built with (a chat model's stop ids,
``build.build_agent``).

A pretrained model's defaults are not applied here: they fill the settings the user
did not give, which only the command line knows (``lmgym.training.pretrained``), so it
applies them before it builds the ``TrainConfig``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmgym.agents.config import AgentConfig, check_common
from lmgym.training.build import check_algo
from lmgym.training.env_args import check_env_kwargs
from lmgym.training.ranks import launched_ranks
from lmgym.training.run import RunDirectory, TrainConfig
from lmgym.training.threads import auto_threads
from lmgym.training.user_code import check_task_factory, prepare_task, recorded_task, run_imports


@dataclass(frozen=True)
class ResolvedRun:
    """A run's checked settings and the values derived from them (``resolve``).

    Attributes:
        config: the settings the run uses and ``config.json`` saves.
        agent_config: the algorithm's config.
        env_id: the task's registered Gymnasium id.
        imports: what the run imports and reads besides lmgym (``run_imports``).
        stop_threshold: the early-stop threshold, ``None`` without ``early_stop``.
        notes: lines to print once before the run starts (rank 0).
    """

    config: TrainConfig
    agent_config: AgentConfig
    env_id: str
    imports: dict[str, Any]
    stop_threshold: float | None = None
    notes: tuple[str, ...] = ()

    def with_values(self, **changes: Any) -> ResolvedRun:
        """The record with ``config``'s ``changes`` (a value known after ``resolve``)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))

    def save(self, run: RunDirectory, launch: dict[str, Any] | None = None) -> None:
        """Write the run's ``config.json`` from the record (``RunDirectory.write_config``)."""
        run.write_config(self.config, self.agent_config, self.imports, launch)


class ResolvedFields:
    """The record's settings read through a holder's ``resolved`` (the ``Trainer``, a
    ``resume.ResumePlan``), so each reads them the one way."""

    resolved: ResolvedRun

    @property
    def config(self) -> TrainConfig:
        """The run's settings as resolved (``config.json`` saves them)."""
        return self.resolved.config

    @property
    def agent_config(self) -> AgentConfig:
        """The algorithm's config."""
        return self.resolved.agent_config


def stop_threshold(config: TrainConfig, env_id: str) -> float | None:
    """The early-stop threshold: ``stop_threshold``, else the task's solved threshold.

    Raises:
        ValueError: ``early_stop`` on a task with no solved threshold and none given.
    """
    if not config.early_stop:
        return None
    if config.stop_threshold is not None:
        return config.stop_threshold
    from lmgym.envs.registration import TASKS

    info = TASKS.get(env_id)
    if info is None or info.solved_threshold is None:
        raise ValueError(
            f"early_stop: task {config.task!r} states no solved threshold; set stop_threshold"
        )
    return info.solved_threshold


def checked_agent_config(algo: str, agent_config: AgentConfig | None) -> AgentConfig:
    """``agent_config`` (default: the algorithm's documented defaults), its class and
    shared fields checked (``check_common``).

    Raises:
        TypeError: not ``ALGORITHMS[algo].config_class``.
        ValueError: a shared field no run can use, naming it.
    """
    from lmgym.agents import ALGORITHMS

    config_class = ALGORITHMS[algo].config_class
    if agent_config is None:
        agent_config = config_class()
    if type(agent_config) is not config_class:
        raise TypeError(
            f"agent_config: {algo} takes {config_class.__name__}, got {type(agent_config).__name__}"
        )
    # Before any process group: a value one rank alone refuses then ends every rank
    # in one line (lmgym.cli.launch.agree_to_start), not inside a collective.
    check_common(agent_config)
    return agent_config


def resolve(config: TrainConfig, agent_config: AgentConfig | None = None) -> ResolvedRun:
    """Check ``config`` and ``agent_config`` and compute the run's derived values once.

    Raises:
        ValueError, TypeError: a value no run can use (naming the field), an unknown
            algorithm or task, a task factory lmgym cannot build, a wrong env
            argument, ``early_stop`` with no threshold.
    """
    check_algo(config.algo)
    config.check()
    env_id = prepare_task(config)
    check_task_factory(env_id, config.task)
    changes = {**recorded_task(config, env_id)}
    changes["env_kwargs"] = check_env_kwargs(env_id, config.env_kwargs)
    notes = []
    if config.threads == 0:  # chosen once, then recorded in config.json like a number
        changes["threads"], why = auto_threads(processes=launched_ranks())
        notes.append(f"threads: {changes['threads']} ({why}; --threads 0 chose)")
    resolved = dataclasses.replace(config, **changes)
    threshold = stop_threshold(resolved, env_id)  # early_stop needs one: refused before anything
    return ResolvedRun(
        config=resolved,
        agent_config=checked_agent_config(config.algo, agent_config),
        env_id=env_id,
        imports=run_imports(resolved),
        stop_threshold=threshold,
        notes=tuple(notes),
    )
