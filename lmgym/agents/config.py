"""Agent configuration: one dataclass per algorithm, validated at construction.

Every field's docstring (the string literal under it) is its help text; the
command line turns them into ``--help``. The base ``AgentConfig`` holds the update
mechanics every agent shares; each algorithm's subclass sets its documented
defaults and adds its own fields.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from lmgym.agents.aggregation import AGGREGATION_MODES

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["reward", "loss"]


@dataclass
class AgentConfig:
    """Update mechanics shared by every agent."""

    learning_rate: float = 1e-3
    """AdamW learning rate; 1e-3 suits the tiny demo models, pretrained LMs want ~1e-6."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    update_epochs: int = 1
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Optimizer steps per epoch; each takes a set of whole rows."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a minibatch); None: the whole minibatch."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None disables clipping."""
    gamma: float = 1.0
    """Discount factor (1 in RLHF, §6.3.2)."""
    loss_aggregation: Aggregation = "token-mean"
    """How per-token losses become a scalar: seq-mean-token-mean, token-mean or seq-mean-token-sum-norm."""
    beta: float = 0.0
    """KL coefficient to the reference policy; 0 loads no reference model."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator used in the loss (k1, k2 or k3); the reward placement always uses k1."""
    kl_placement: KLPlacement = "loss"
    """Where the KL term goes: subtracted from the rewards (classic RLHF) or added to the loss."""
    recompute_old_logprobs: bool = True
    """Recompute lp_old on the learner before updating; False takes the sampler's log-probs as lp_old."""
    tis_cap: float | None = None
    """Truncated importance sampling cap C on exp(lp_old - lp_s); None disables TIS."""
    whiten_advantages: bool = False
    """Normalise advantages to zero mean, unit std over real tokens."""
    entropy_coef: float = 0.0
    """Bonus on the mean token entropy (subtracted from the loss)."""
    overlong_cache: int | None = None
    """DAPO overlong shaping window L_cache in tokens; None disables it."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and draw more until the batch is full."""
    max_resample: int = 4
    """Dynamic sampling: extra rollout batches drawn at most per iteration."""
    seed: int = 0
    """Seed of the sampler, minibatch shuffling and the env's prompt stream."""


ConfigT = TypeVar("ConfigT", bound=AgentConfig)


def field_help(config_class: type[AgentConfig]) -> dict[str, str]:
    """Field name -> help text, read from the docstrings under each field."""
    helps: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                helps[node.target.id] = nxt.value.value.strip()
    return helps


def build_config(
    config_class: type[ConfigT], config: ConfigT | None, overrides: dict[str, Any]
) -> ConfigT:
    """``config`` (or the class defaults) with ``overrides`` applied; unknown names are errors."""
    if config is not None and not isinstance(config, config_class):
        raise TypeError(f"config: expected {config_class.__name__}, got {type(config).__name__}")
    known = {f.name for f in fields(config_class)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(
            f"unknown {config_class.__name__} field(s) {unknown}; valid fields: {sorted(known)}"
        )
    base = config if config is not None else config_class()
    return dataclasses.replace(base, **overrides)


def check_common(config: AgentConfig) -> None:
    """Validate the shared fields; raise ``ValueError`` naming the field and the fix."""

    def positive(name: str, allow_none: bool = False) -> None:
        value = getattr(config, name)
        if value is None and allow_none:
            return
        if value is None or value <= 0:
            raise ValueError(f"{name}={value!r}: must be > 0")

    positive("learning_rate")
    positive("update_epochs")
    positive("num_minibatches")
    positive("micro_batch_size", allow_none=True)
    positive("max_grad_norm", allow_none=True)
    positive("tis_cap", allow_none=True)
    positive("overlong_cache", allow_none=True)
    if not 0.0 <= config.gamma <= 1.0:
        raise ValueError(f"gamma={config.gamma}: must be in [0, 1]")
    if config.beta < 0:
        raise ValueError(f"beta={config.beta}: must be >= 0 (0 disables the KL term)")
    if config.loss_aggregation not in AGGREGATION_MODES:
        raise ValueError(
            f"loss_aggregation={config.loss_aggregation!r} is not one of {list(AGGREGATION_MODES)}"
        )
    if config.kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"kl_estimator={config.kl_estimator!r} is not one of ['k1', 'k2', 'k3']")
    if config.kl_placement not in ("reward", "loss"):
        raise ValueError(f"kl_placement={config.kl_placement!r} is not one of ['reward', 'loss']")
    if config.max_resample < 0:
        raise ValueError(f"max_resample={config.max_resample}: must be >= 0")
