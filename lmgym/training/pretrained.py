"""Defaults for a pretrained model: the one record of them, and how a run applies them.

The dataclass defaults of ``TrainConfig`` and the agent configs suit the built-in
tiny GPT-2 trained from scratch (learning rate 1e-3, 16 completions per prompt).
A pretrained model given with ``--model`` wants far smaller steps: at 1e-3 a full
fine-tune of a real model diverges within a few iterations. ``PRETRAINED_DEFAULTS``
is what ``lmgym train --model M`` uses for each setting the user did not give
(on the command line or in ``--config``), and the run says so in one line.

These values are for pretrained models only, measured on SmolLM2-135M-Instruct
(benchmarks/results/real_model/README.md, "Defaults for a pretrained model"): LoRA
at 1e-4 gained 0.42-0.49 held-out on the instruction task in 12-30 iterations; a
full fine-tune at 1e-5 gained 0.49 in 12 iterations, at 2e-6 only 0.21.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PretrainedDefaults:
    """What a run on a pretrained model uses where the user set nothing."""

    learning_rate_lora: float = 1e-4
    """Learning rate when training a LoRA adapter (--lora-r > 0)."""
    learning_rate_full: float = 1e-5
    """Learning rate of a full fine-tune (every weight trains)."""
    temperature: float = 1.0
    """Sampling temperature."""
    group_size: int = 8
    """Completions per prompt."""
    beta: float = 0.0
    """KL penalty to the initial model (0: no reference model is kept)."""
    update_epochs: int = 1
    """Passes over each rollout batch, for every agent (the ratio-bounded agents' own
    default is 4 x 2, made for the tiny model): each pass is a forward and backward of
    the whole model, PPO's 8 steps took 114 s an iteration on Instructions against
    RLOO's 50 s at one, and every other pretrained figure was measured at one."""
    num_minibatches: int = 1
    """Optimizer steps per pass."""

    def values(self, lora: bool) -> dict[str, tuple[str, Any]]:
        """``{field: ("run" | "agent", value)}``: the ``TrainConfig`` and agent config
        fields these defaults set, for a LoRA run or a full fine-tune."""
        rate = self.learning_rate_lora if lora else self.learning_rate_full
        return {
            "learning_rate": ("agent", rate),
            "temperature": ("run", self.temperature),
            "group_size": ("run", self.group_size),
            "beta": ("agent", self.beta),
            "update_epochs": ("agent", self.update_epochs),
            "num_minibatches": ("agent", self.num_minibatches),
        }


PRETRAINED_DEFAULTS = PretrainedDefaults()
"""The record every pretrained run uses (see the module docstring)."""


def apply_pretrained_defaults(
    run: dict[str, Any],
    agent: dict[str, Any],
    given: set[str],
    defaults: PretrainedDefaults = PRETRAINED_DEFAULTS,
) -> str | None:
    """Set the pretrained defaults in ``run`` / ``agent`` (in place) where not ``given``.

    Args:
        run: ``TrainConfig`` values (``model``, ``lora_r``, ...).
        agent: the agent config's values.
        given: the fields the user set (command line or config file).
        defaults: the record to apply.

    Returns:
        The line announcing what was set, or ``None`` (no ``model``: the tiny demo's
        defaults are the right ones; or the user set every one of these fields).
    """
    model = run.get("model")
    if model is None:
        return None
    from lmgym.policy.adapters import is_adapter_dir

    lora = bool(run.get("lora_r")) or is_adapter_dir(model)  # an adapter as --model trains on
    applied = []
    for field, (section, value) in defaults.values(lora).items():
        target = run if section == "run" else agent
        if field in given or field not in target:
            continue
        target[field] = value
        applied.append(f"{field} {value:g}" if isinstance(value, float) else f"{field} {value}")
    if not applied:
        return None
    kind = "LoRA" if lora else "full fine-tune"
    return (
        f"pretrained model defaults ({kind}): {', '.join(applied)} (set the flags to change "
        "them; docs/cli.md, Pretrained models)"
    )


def as_table(defaults: PretrainedDefaults = PRETRAINED_DEFAULTS) -> dict[str, Any]:
    """The record as ``{field: value}`` (docs and tests compare against it)."""
    return dataclasses.asdict(defaults)
