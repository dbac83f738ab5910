"""The user's own code and data in a run: tasks, rewards and prompt files named on the command line.

- ``--task my_module:MyTask-v0`` imports ``my_module`` (which registers the task,
  e.g. with ``register_reward_env``) and then looks ``MyTask-v0`` up, as
  ``gymnasium.make("my_module:MyTask-v0")`` does (``resolve_task``).
- ``--prompts data.jsonl --reward my_module:score`` registers a task built from a
  JSON Lines prompt file and a reward (``register_prompt_task``): a plain
  function becomes ``FunctionReward(score)`` (batched: ``score(prompts,
  completions, **columns) -> floats``), any other callable is used as a
  ``RewardModel``. The task id is ``prompts/<file stem>-v0``. Part of the file is
  held out for evaluation unless ``--no-holdout`` (``lmgym.training.holdout``).
- A run records what it imports (``run_imports``, the ``imports`` section of
  ``config.json``): the modules, and the prompt file's (and a held-out
  ``--eval-prompts-file``'s) absolute path with its SHA-256, so that a resume re-imports the same code and notices a changed file
  (``check_prompt_file``).

Modules are imported by name with the current directory on ``sys.path`` (as
``python -m`` has it), so a ``my_module.py`` next to where ``lmgym`` runs is found.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

from lmgym.training.run import DEFAULT_TASK, TrainConfig

PROMPT_TASK_NAMESPACE = "prompts"


def split_spec(spec: str, what: str) -> tuple[str, str]:
    """``("package.module", "name")`` of ``"package.module:name"``.

    Raises:
        ValueError: not of that form; the message names ``what``.
    """
    module, sep, name = spec.partition(":")
    if not sep or not module or not name or ":" in name:
        raise ValueError(f"{what} {spec!r}: expected 'package.module:name'")
    return module, name


def import_module(module: str, what: str) -> Any:
    """Import ``module`` (the current directory first on ``sys.path``, as ``python -m`` has it).

    Raises:
        ValueError: the import failed; the message names ``what`` and the error.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"{what}: cannot import module {module!r} ({exc}); put it on PYTHONPATH or run "
            "lmgym from its directory"
        ) from None


def import_object(spec: str, what: str) -> Any:
    """The object ``"package.module:name"`` names, imported.

    Raises:
        ValueError: a malformed spec, a failed import or a missing name; the message
            names ``what``.
    """
    module_name, name = split_spec(spec, what)
    module = import_module(module_name, f"{what} {spec!r}")
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(
            f"{what} {spec!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) has "
            f"no attribute {name!r}"
        ) from None


def task_module(task: str) -> str | None:
    """The module a ``"module:Id"`` task names, or ``None`` for a plain id."""
    module, sep, _ = task.partition(":")
    return module if sep else None


def resolve_task(task: str) -> str:
    """The registered Gymnasium id of ``task``; ``"module:Id"`` imports ``module`` first.

    Raises:
        ValueError: the module cannot be imported, or the id is not registered (the
            message lists the registered lmgym tasks).
    """
    import gymnasium as gym

    import lmgym  # noqa: F401  (registers the built-in tasks)

    module, sep, env_id = task.partition(":")
    if sep:
        if not module or not env_id:
            raise ValueError(f"task {task!r}: expected a task id or 'package.module:TaskId-v0'")
        import_module(module, f"task {task!r}")
    else:
        env_id = task
    if sep and env_id not in gym.registry:
        env_id = _namespaced(env_id, task)
    if env_id not in gym.registry:
        registered = sorted(k for k in gym.registry if k.startswith("lmgym/"))
        where = f" after importing {module!r} (does it register {env_id!r}?)" if sep else ""
        raise ValueError(
            f"unknown task {task!r}{where}; registered: {', '.join(registered)}"
            + ("" if sep else "; a task of your own: --task your_module:YourTask-v0")
        )
    return env_id


def _namespaced(env_id: str, task: str) -> str:
    """The registered id ``NAMESPACE/env_id`` when exactly one namespace has ``env_id``
    (``register_reward_env("Sums", ...)`` registers ``lmgym/Sums-v0``, which
    ``module:Sums-v0`` then names); else ``env_id`` unchanged.

    Raises:
        ValueError: several namespaces have it; the message lists them.
    """
    import gymnasium as gym

    found = sorted(k for k in gym.registry if k.rpartition("/")[2] == env_id and "/" in k)
    if len(found) > 1:
        module = task.partition(":")[0]
        raise ValueError(
            f"task {task!r}: {env_id} is registered in several namespaces ({', '.join(found)}); "
            f"name one, e.g. --task {module}:{found[0]}"
        )
    return found[0] if found else env_id


def check_task_factory(env_id: str, task: str | None = None) -> None:
    """Raise ``ValueError`` if the task's vector factory cannot take the run's
    ``tokenizer`` and ``device`` (lmgym builds every env with the policy's tokenizer).
    """
    from lmgym.training.evaluation import factory_accepts

    missing = [name for name in ("tokenizer", "device") if not factory_accepts(env_id, name)]
    if missing:
        raise ValueError(
            f"task {task or env_id!r}: its vector factory takes no {' or '.join(missing)} "
            "argument; lmgym builds the env with the policy's tokenizer on the run's device: "
            "give the factory tokenizer=None and device='cpu' parameters"
        )


def load_reward(spec: str) -> Any:
    """The reward ``"module:name"`` names: a plain function is wrapped in a batched
    ``FunctionReward`` (``fn(prompts, completions, **columns) -> floats``); a class is
    instantiated with no arguments; any other callable is a ``RewardModel`` as is.

    Raises:
        ValueError: the import failed, or the object is not callable.
    """
    from lmgym.envs import FunctionReward

    target = import_object(spec, "reward")
    if inspect.isclass(target):
        target = target()
    if inspect.isfunction(target) or inspect.ismethod(target) or inspect.isbuiltin(target):
        return FunctionReward(target)
    if not callable(target):
        raise ValueError(f"reward {spec!r}: {type(target).__name__} is not callable")
    return target


def prompt_task_id(prompts: str | Path) -> str:
    """``prompts/<file stem>-v0``: the task id of a prompt file."""
    stem = re.sub(r"[^\w.]+", "_", Path(prompts).stem) or "prompts"
    return f"{PROMPT_TASK_NAMESPACE}/{stem}-v0"


def register_prompt_task(
    prompts: str | Path,
    reward: str,
    prompt_field: str = "prompt",
    *,
    holdout: bool = False,
    eval_file: str | Path | None = None,
) -> str:
    """Register the task of a prompt file and a reward; returns its id (``prompt_task_id``).

    Without ``holdout`` or ``eval_file`` the env is ``register_reward_env(id,
    load_reward(reward), JsonlPrompts(prompts, field=prompt_field))``, every row a
    training prompt (``--no-holdout``). With either, its factory takes ``split``
    (``lmgym.training.holdout``): ``"train"`` the rows trained on, ``"eval"`` the
    held-out ones. Its options (``max_new_tokens``, ``reward_mode``, ...) are the run's
    ``env_kwargs``.

    Raises:
        ValueError: a file is missing or malformed (line number named), too small to
            hold out a part, or the reward cannot be imported.
    """
    from lmgym.envs import register_reward_env
    from lmgym.envs.prompts import JsonlPrompts
    from lmgym.training.holdout import prompt_parts, register_split_task

    path = Path(prompts)
    if not path.is_file():
        count = path.name if path.name.isdigit() else None
        hint = f"; the number of prompts per batch is --num-prompts {count}" if count else ""
        raise ValueError(f"prompts {str(prompts)!r}: no such file (a JSON Lines prompt file){hint}")
    source = JsonlPrompts(path, field=prompt_field)
    if len(source) == 0:
        raise ValueError(f"prompts {str(prompts)!r}: the file holds no prompt")
    env_id = prompt_task_id(path)
    if holdout or eval_file is not None:
        parts, split = prompt_parts(path, prompt_field, eval_file)
        return register_split_task(
            env_id,
            load_reward(reward),
            parts,
            f"prompts from {path.name} ({split}), reward {reward}",
        )
    return register_reward_env(
        env_id,
        load_reward(reward),
        source,
        description=f"prompts from {path.name} (no held-out part), reward {reward}",
    )


def absolute_path(path: str) -> str:
    """``path`` with ``~`` expanded, made absolute: how a run records a file it reads,
    so that a resume from another directory finds it."""
    return str(Path(path).expanduser().resolve())


def prepare_task(config: TrainConfig) -> str:
    """Import or register the run's task and return its Gymnasium id (``config`` is
    not changed: ``recorded_task`` gives the task fields the run then records).

    With ``config.prompts`` the task is the prompt file's (``prompt_task_id`` of its
    absolute path); ``task`` may then only be left at its default or name that same id.

    Raises:
        ValueError: ``prompts`` without ``reward`` or the reverse, ``task`` and
            ``prompts`` both given, or anything ``resolve_task`` /
            ``register_prompt_task`` raise.
    """
    if config.prompts is None and config.reward is None:
        if config.eval_prompts_file is not None:
            raise ValueError(
                f"eval_prompts_file={config.eval_prompts_file!r} needs --prompts FILE.jsonl "
                "--reward module:function (it holds out prompts of a prompt-file task; a "
                "built-in task's held-out prompts are its split='eval')"
            )
        return resolve_task(config.task)
    if config.prompts is None or config.reward is None:
        given, missing = ("prompts", "reward") if config.reward is None else ("reward", "prompts")
        raise ValueError(
            f"{given}={getattr(config, given)!r} needs {missing} too: a prompt-file task is "
            "--prompts FILE.jsonl --reward module:function"
        )
    prompts = absolute_path(config.prompts)
    env_id = prompt_task_id(prompts)
    if config.task not in (DEFAULT_TASK, env_id):
        raise ValueError(
            f"task={config.task!r} and prompts={prompts!r} both name the run's task; "
            "pass one (--prompts builds the task from the file and --reward)"
        )
    eval_file = config.eval_prompts_file
    return register_prompt_task(
        prompts,
        config.reward,
        config.prompt_field,
        holdout=config.holdout,
        eval_file=absolute_path(eval_file) if eval_file is not None else None,
    )


def recorded_task(config: TrainConfig, env_id: str) -> dict[str, Any]:
    """The task fields a run records once ``prepare_task`` returned ``env_id``: a
    prompt-file run's ``task`` is its prompt task's id and its files' paths are absolute
    (``absolute_path``); any other run's fields stay as given (``{}``)."""
    if config.prompts is None:
        return {}
    eval_file = config.eval_prompts_file
    return {
        "task": env_id,
        "prompts": absolute_path(config.prompts),
        "eval_prompts_file": absolute_path(eval_file) if eval_file is not None else None,
    }


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_imports(config: TrainConfig) -> dict[str, Any]:
    """What a run imports and reads besides lmgym, for ``config.json``'s ``imports``:
    ``{"modules": {module: role}, "prompts": {"path", "sha256"} | None}``."""
    modules: dict[str, str] = {}
    task = task_module(config.task)
    if task is not None:
        modules[task] = "task"
    if config.reward is not None:
        modules.setdefault(split_spec(config.reward, "reward")[0], "reward")
    for spec in config.callbacks:
        modules.setdefault(spec.partition(":")[0], "callback")
    prompts = None
    if config.prompts is not None:
        prompts = {"path": config.prompts, "sha256": file_sha256(config.prompts)}
    record = {"modules": modules, "prompts": prompts}
    if config.eval_prompts_file is not None:
        path = config.eval_prompts_file
        record["eval_prompts"] = {"path": path, "sha256": file_sha256(path)}
    return record


def user_code_specs(run: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(role, spec)]`` of the user code a run's ``TrainConfig`` (as a dict) imports:
    a ``module:Id`` task, the reward of a prompt file, the callbacks."""
    specs = []
    if task_module(run.get("task") or "") is not None:
        specs.append(("task", run["task"]))
    if run.get("reward"):
        specs.append(("reward", run["reward"]))
    specs += [("callback", spec) for spec in run.get("callbacks") or []]
    return specs


def check_prompt_file(imports: dict[str, Any] | None, action: str) -> str | None:
    """Compare a run's prompt files (``--prompts``, ``--eval-prompts-file``) with the
    SHA-256 each recorded.

    Args:
        imports: the run's ``imports`` record (``None`` or without prompts: nothing to check).
        action: what is being done, for the message (``"resume"``).

    Returns:
        ``None`` when the files are unchanged (or there are none), else a sentence saying
        what changed.

    Raises:
        ValueError: a file is gone.
    """
    for key, what in (("prompts", "prompt file"), ("eval_prompts", "held-out prompt file")):
        record = (imports or {}).get(key)
        if not record:
            continue
        path = Path(record["path"])
        if not path.is_file():
            raise ValueError(f"the run's {what} {path} is missing; restore it to {action} the run")
        now = file_sha256(path)
        if now != record["sha256"]:
            return (
                f"the run's {what} {path} changed since the run started (SHA-256 {now[:12]}..., "
                f"recorded {record['sha256'][:12]}...)"
            )
    return None
