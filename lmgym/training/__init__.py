"""Training runs around the agents: run directories, logging, checkpoints, callbacks,
and evaluation (mean reward, pass@k, length). The agent benchmark is ``lmgym.bench``.

What ``lmgym train`` / ``eval`` do, as a library:

- ``Trainer(TrainConfig(...), agent_config).run()``: one training run with a run
  directory (``config.json``, ``progress.csv``, TensorBoard events, ``samples.jsonl``,
  ``checkpoints/``); ``Trainer.resume(run_dir)`` continues one.
- ``CheckpointManager``: atomic, manifest-verified checkpoints (written and read by
  ``lmgym.persistence``: nothing is unpickled).
- ``EarlyStopAtThreshold``, ``PeriodicEval``, ``SamplePrinter``, ``MetricsLogger``,
  ``CheckpointCallback``: callbacks for ``Agent.learn``.
- ``evaluate_policy``: mean reward, pass@k and mean length on a task's eval prompts.
- ``resolve_task`` (``"module:Id"`` tasks) and ``register_prompt_task`` (a JSONL prompt
  file and a reward as a task): the user's own tasks, as ``lmgym train`` takes them.

Names are imported lazily, so importing one part does not import the others (torch,
transformers, Stable-Baselines3).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointError": "lmgym.persistence.manifest",
    "verify_manifest": "lmgym.persistence.manifest",
    "write_manifest": "lmgym.persistence.manifest",
    "CheckpointManager": "lmgym.training.checkpoint",
    "TrainingCallback": "lmgym.training.callbacks",
    "EarlyStopAtThreshold": "lmgym.training.callbacks",
    "PeriodicEval": "lmgym.training.callbacks",
    "SamplePrinter": "lmgym.training.callbacks",
    "MetricsLogger": "lmgym.training.callbacks",
    "CheckpointCallback": "lmgym.training.callbacks",
    "EvalResult": "lmgym.training.evaluation",
    "evaluate_policy": "lmgym.training.evaluation",
    "make_eval_env": "lmgym.training.evaluation",
    "pass_at_k": "lmgym.training.evaluation",
    "make_logger": "lmgym.training.logger",
    "RunDirectory": "lmgym.training.run",
    "TrainConfig": "lmgym.training.run",
    "Trainer": "lmgym.training.trainer",
    "TrainResult": "lmgym.training.trainer",
    "resolve_task": "lmgym.training.user_code",
    "register_prompt_task": "lmgym.training.user_code",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmgym.training' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
