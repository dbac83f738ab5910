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
import typing
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from lmgym.agents.aggregation import AGGREGATION_MODES, Aggregation
from lmgym.agents.kl import KLEstimator
from lmgym.typed_values import check_value, parse_value

KLPlacement = Literal["reward", "loss"]
LRSchedulerType = Literal[
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
]
LR_SCHEDULER_TYPES: tuple[str, ...] = typing.get_args(LRSchedulerType)
DataParallelMode = Literal["ddp", "fsdp"]


@dataclass
class AgentConfig:
    """Update mechanics shared by every agent."""

    learning_rate: float = 1e-3
    """AdamW learning rate; 1e-3 suits the tiny demo models, pretrained LMs want ~1e-6."""
    weight_decay: float = 0.0
    """AdamW weight decay, on matrices only (linear, embedding, adapter weights), never on biases or norm weights."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    lr_scheduler_type: LRSchedulerType = "constant"
    """Learning-rate schedule (transformers' get_scheduler), stepped once per optimizer step: constant, constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial or inverse_sqrt."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from 0 to learning_rate (constant has none: use constant_with_warmup)."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of the schedule's optimizer steps, instead of warmup_steps."""
    schedule_iterations: int | None = None
    """Iterations a decaying schedule spans (each update_epochs * num_minibatches optimizer steps); None: the first learn() call's."""
    update_epochs: int = 1
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Optimizer steps per epoch; each takes a set of whole rows."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a minibatch); None: the whole minibatch."""
    bucket_by_length: bool = True
    """Sort a minibatch's rows by completion length into micro-batches and trim each one's forward pass to its longest completion (no compute on padding; the loss is unchanged)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None disables clipping."""
    gamma: float = 1.0
    """Discount factor (1 in RLHF, docs/algorithms.md#discount)."""
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
    whiten_min_std: float = 0.0
    """Whitening rescales only when the advantages' std reaches this (in reward units); below it they are centred only. 0 always rescales; the critic agents and REINFORCE++ set 0.1, so a batch without reward spread does not blow critic noise (or one odd completion) up to unit variance."""
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
    skip_nonfinite: bool = False
    """Skip (and count) an optimizer step whose loss or gradient norm is NaN/inf instead of raising."""
    data_parallel: DataParallelMode = "ddp"
    """With several processes: ddp (full gradients and optimizer state on every rank, summed by DDP) or fsdp (FSDP2: parameters, gradients and optimizer state sharded during the update, full weights gathered after each step for rollouts; resumable with the same process count). One process: ignored."""


@dataclass
class MultiStepConfig(AgentConfig):
    """The update schedule of the agents whose loss bounds the policy ratio (PPO's
    token clip, GSPO's sequence clip): several optimizer steps per rollout batch at a
    lower rate. The bound is what makes the later steps, taken on samples of an older
    policy, safe. RLOO and ReMax take it too, under PPO's token clip (as TRL and verl
    train them); REINFORCE, the textbook one-step estimator, has no ratio and keeps one
    step, and CISPO (a subclass) sets its own (measured,
    docs/algorithms.md#update-schedule). Measured (issue 26,
    benchmarks/results/stability_notes.md): at one step of 1e-3 GRPO kept
    LengthControl on 2 of 5 seeds, Dr. GRPO and RLOO on 0; at this schedule all three
    on 5 of 5."""

    learning_rate: float = 3e-4
    """AdamW learning rate (lower than the single-step agents' 1e-3: several steps per batch)."""
    update_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 2
    """Optimizer steps per epoch."""


ConfigT = TypeVar("ConfigT", bound=AgentConfig)
DataclassT = TypeVar("DataclassT")


def restore_types(config_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` read as a config file's: each field of ``config_class`` converted by
    ``parse_value`` (a list given for ``adam_betas`` becomes a tuple, ``"false"`` for a
    boolean ``False``); names that are not fields pass unchanged, for the constructor to
    refuse.

    Raises:
        FieldValueError: a value its field does not take, naming the field.
    """
    hints = typing.get_type_hints(config_class)
    names = {f.name for f in fields(config_class)}
    return {
        name: parse_value(name, value, hints[name]) if name in names else value
        for name, value in values.items()
    }


def config_from_dict(config_class: type[DataclassT], values: dict[str, Any]) -> DataclassT:
    """``config_class`` (an agent's config, ``TrainConfig``, ...) from a saved or parsed
    ``{field: value}``, each value converted as a config file's (``restore_types``): the
    one way a stored config is read back."""
    return config_class(**restore_types(config_class, values))


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
    """``config`` (or the class defaults) with ``overrides`` applied, its shared fields
    checked (``check_common``); unknown names are errors."""
    if config is not None and not isinstance(config, config_class):
        raise TypeError(f"config: expected {config_class.__name__}, got {type(config).__name__}")
    known = {f.name for f in fields(config_class)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(
            f"unknown {config_class.__name__} field(s) {unknown}; valid fields: {sorted(known)}"
        )
    base = config if config is not None else config_class()
    built = dataclasses.replace(base, **overrides)
    check_common(built)
    return built


def check_types(config: Any, choices: bool = True) -> None:
    """``check_value`` (``lmgym.typed_values``) on every field of a config dataclass.

    Strict: a ``bool`` field takes only ``True``/``False`` (never ``"false"``, which
    Python would count as true), an ``int`` no ``bool`` or ``float``, a ``float`` a
    finite number (NaN would, for example, silently switch ``beta``'s KL term off), a
    ``Literal`` one of its values (any string when ``choices`` is False: the agent then
    checks membership itself), ``X | None`` also ``None``.

    Raises:
        FieldValueError: a ``ValueError`` and ``TypeError`` naming the field and the fix.
    """
    hints = typing.get_type_hints(type(config), include_extras=False)
    for item in fields(config):
        check_value(item.name, getattr(config, item.name), hints[item.name], choices)


def check_common(config: AgentConfig) -> None:
    """Validate the shared fields; raise ``ValueError`` naming the field and the fix.

    Every field is first checked against its annotation (``check_types``): strict
    booleans, integers that are not booleans, finite floats, strings for choices
    (whose membership the agent's own checks name; ``Agent`` runs
    ``check_types(config)`` last to catch any choice they do not).
    """
    check_types(config, choices=False)

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
    positive("schedule_iterations", allow_none=True)
    if config.weight_decay < 0:
        raise ValueError(f"weight_decay={config.weight_decay}: must be >= 0")
    _check_schedule(config)
    if not 0.0 <= config.gamma <= 1.0:
        raise ValueError(f"gamma={config.gamma}: must be in [0, 1]")
    if config.beta < 0:
        raise ValueError(f"beta={config.beta}: must be >= 0 (0 disables the KL term)")
    _one_of("loss_aggregation", config.loss_aggregation, AGGREGATION_MODES)
    _one_of("kl_estimator", config.kl_estimator, typing.get_args(KLEstimator))
    _one_of("kl_placement", config.kl_placement, typing.get_args(KLPlacement))
    if config.max_resample < 0:
        raise ValueError(f"max_resample={config.max_resample}: must be >= 0")
    if config.whiten_min_std < 0:
        raise ValueError(
            f"whiten_min_std={config.whiten_min_std}: must be >= 0 (0 always rescales)"
        )


def _one_of(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """``value`` must be one of ``choices`` (the converter's rule and message)."""
    check_value(name, value, Literal[choices])


def _check_schedule(config: AgentConfig) -> None:
    """The learning-rate schedule's fields: a known type, one warmup setting at most."""
    _one_of("lr_scheduler_type", config.lr_scheduler_type, LR_SCHEDULER_TYPES)
    if config.warmup_steps < 0:
        raise ValueError(f"warmup_steps={config.warmup_steps}: must be >= 0")
    if not 0.0 <= config.warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio={config.warmup_ratio}: must be in [0, 1)")
    if config.warmup_steps and config.warmup_ratio:
        raise ValueError(
            f"warmup_steps={config.warmup_steps} and warmup_ratio={config.warmup_ratio}: "
            "set one of them (the other to 0)"
        )
    if config.lr_scheduler_type == "constant" and (config.warmup_steps or config.warmup_ratio):
        raise ValueError(
            "lr_scheduler_type='constant' has no warmup; use 'constant_with_warmup' "
            "(or set warmup_steps=0 and warmup_ratio=0)"
        )


def resolve_models(
    config: AgentConfig, policy: Any, env: Any, ref_policy: Any
) -> tuple[Any, Any, Any]:
    """Check what an agent is built on; load a policy given by name.

    Args:
        config: the agent's config (``beta``).
        policy: a ``CausalLMPolicy``, or a hub name / local directory to load one from
            (on ``env.device``; then with ``beta > 0`` and no reference, the reference
            is ``frozen_copy`` of it).
        env: an lmgym ``TokenVectorEnv``.
        ref_policy: the frozen KL reference, or ``None``.

    Returns:
        ``(policy, env, ref_policy)``.

    Raises:
        TypeError: ``env`` is not a ``TokenVectorEnv``.
        ValueError: ``beta > 0`` without a reference, or a policy that cannot drive
            the env (``check_env``).
    """
    from pathlib import Path

    from lmgym.envs.token_env import TokenVectorEnv
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import frozen_copy

    if not isinstance(env, TokenVectorEnv):
        raise TypeError(
            f"env: expected an lmgym TokenVectorEnv (e.g. gymnasium.make_vec('lmgym/...')), "
            f"got {type(env).__name__}"
        )
    if isinstance(policy, str | Path):
        policy = CausalLMPolicy.for_env(policy, env)
        if config.beta > 0 and ref_policy is None:
            ref_policy = frozen_copy(policy)
    policy.check_env(env)
    if config.beta > 0 and ref_policy is None:
        raise ValueError(
            f"ref_policy: beta={config.beta} needs a frozen reference policy; pass "
            "ref_policy=lmgym.policy.value.frozen_copy(policy) or set beta=0"
        )
    if ref_policy is not None:
        ref_policy.check_env(env)
    return policy, env, ref_policy


def check_complete(config: AgentConfig, num_rows: int) -> None:
    """The checks after the algorithm's own (``Agent.check_config``): any choice field
    they missed (``check_types``), and the batch split (``check_batch_split``)."""
    check_types(config)
    check_batch_split(config, num_rows)


def check_batch_split(config: AgentConfig, num_rows: int) -> None:
    """``num_minibatches`` must divide the batch's ``num_rows`` (minibatches of whole rows)."""
    if num_rows % config.num_minibatches != 0:
        raise ValueError(
            f"num_minibatches={config.num_minibatches} does not divide the batch of "
            f"{num_rows} rows (num_prompts * group_size); pick a divisor of {num_rows}"
        )


def check_group_size(group_size: int, why: str) -> None:
    """An algorithm whose baseline compares completions of one prompt needs ``group_size >= 2``.

    Args:
        group_size: the env's completions per prompt.
        why: what needs the groups, e.g. ``"grpo compares completions of the same prompt"``.
    """
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: {why}; build the env with group_size >= 2")
