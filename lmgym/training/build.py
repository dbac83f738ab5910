"""What a training run is built from, as functions of its config: the policy, the
training env, the frozen KL reference, the evaluation env and the ``--callback`` objects.

Nothing here writes to disk or talks to other processes: the ``Trainer`` decides
where (device, shard) and when (fresh run, resume, rank) each piece is built.
"""

from __future__ import annotations

import inspect
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from lmgym.agents.base import Agent, Callback
from lmgym.agents.callbacks import CALLBACK_PROTOCOL
from lmgym.agents.config import AgentConfig
from lmgym.envs.registration import batch_arguments
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.training.callbacks import check_callback
from lmgym.training.evaluation import make_eval_env
from lmgym.training.model_source import resolve_model
from lmgym.training.run import TrainConfig
from lmgym.training.user_code import import_object

TINY_POSITIONS = 256
"""The built-in tiny GPT-2's context (``make_tiny_model``'s default) for a task that
fits in it; a longer task gets a longer one (``tiny_positions``)."""


def check_algo(algo: str, given: str = "algo") -> None:
    """Raise ``ValueError`` listing the valid names if ``algo`` is unknown; ``given``
    names where it came from (``"--algo"``, ``"algo (in run.toml)"``)."""
    from lmgym.agents import ALGORITHMS

    if algo not in ALGORITHMS:
        raise ValueError(f"unknown {given} {algo!r}; valid: {', '.join(sorted(ALGORITHMS))}")


def load_policy(
    model: str | None,
    temperature: float = 1.0,
    device: torch.device | str = "cpu",
    *,
    peft_config: Any = None,
    autocast_dtype: str | None = None,
    gradient_checkpointing: bool = False,
    tiny_positions: int = TINY_POSITIONS,
) -> CausalLMPolicy:
    """The policy for ``model`` (hub name or directory); ``None``: the tiny GPT-2, built
    locally and round-tripped through ``save_pretrained`` / ``from_pretrained``.

    Args:
        peft_config, autocast_dtype, gradient_checkpointing: as
            ``CausalLMPolicy.from_pretrained`` (``TrainConfig.peft_config()``, ...).
        tiny_positions: the tiny GPT-2's context (``tiny_positions``); ignored for a
            ``model``.

    Raises:
        ModelNotFoundError: a missing directory, or a hub name while offline and not
            cached (``resolve_model``); one line saying what to pass instead.
    """
    from lmgym.policy import make_tiny_lm, save_tiny

    settings = {
        "device": device,
        "temperature": temperature,
        "peft_config": peft_config,
        "autocast_dtype": autocast_dtype,
        "gradient_checkpointing": gradient_checkpointing,
    }
    if model is not None:
        return CausalLMPolicy.from_pretrained(resolve_model(model), **settings)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny(f"{tmp}/tiny-gpt2", make_tiny_lm(n_positions=tiny_positions))
        return CausalLMPolicy.from_pretrained(path, **settings)


def tiny_positions(config: TrainConfig, env_id: str, env: TokenVectorEnv | None = None) -> int:
    """The context of the built-in tiny GPT-2 for a run: ``TINY_POSITIONS``, or, for a
    task whose prompt plus budget is longer (the Gymnasium games as text: FrozenLake
    needs 475 positions, Taxi 1758), the longer ``seq_len`` of its training and
    evaluation envs, so that every built-in task trains with the demo
    model. A task that fits keeps exactly the model it always had (same size, same
    seed, same weights); the evaluation env is built only for one that does not.

    Args:
        config: the run's config (task options, evaluation size).
        env_id: the task's registered id.
        env: the run's training env over the tiny model's tokenizer, if at hand;
            otherwise one is built (unsharded, on the CPU) to measure.
    """
    from lmgym.policy import make_char_tokenizer

    tokenizer = make_char_tokenizer()
    if env is None:
        env = make_train_env(config, tokenizer, env_id, device="cpu")
    if env.seq_len <= TINY_POSITIONS:
        return TINY_POSITIONS
    eval_env, _ = eval_env_for(config, env_id, tokenizer, "cpu")
    return max(env.seq_len, eval_env.seq_len)


def checkpoint_positions(checkpoint: Path) -> int:
    """The context a checkpoint's tiny GPT-2 was built with (``n_positions`` of its
    policy's ``config.json``; ``TINY_POSITIONS`` when it records none)."""
    saved = json.loads((checkpoint / "agent" / "policy" / "config.json").read_text())
    return int(saved.get("n_positions", TINY_POSITIONS))


def policy_for(
    config: TrainConfig,
    device: str | None = None,
    model: str | None = None,
    positions: int = TINY_POSITIONS,
) -> CausalLMPolicy:
    """The run's initial policy: ``config.model`` with its LoRA, dtype and checkpointing.

    Args:
        device: where (default ``config.device``; a data-parallel rank's own GPU).
        model: load this directory instead of ``config.model`` (the tiny GPT-2 saved
            before the process group started: ``save_pretrained`` writes nothing on
            ranks other than 0 once one has).
        positions: the tiny GPT-2's context, when it is the model (``tiny_positions``).
    """
    policy = load_policy(
        model or config.model,
        config.temperature,
        device or config.device,
        peft_config=config.peft_config(),
        autocast_dtype=config.autocast_dtype,
        gradient_checkpointing=config.gradient_checkpointing,
        tiny_positions=positions,
    )
    config.mark_base_storage(policy)
    config.use_rollout_engine(policy)
    return policy


def reference_for(
    config: TrainConfig,
    beta: float,
    *,
    policy: CausalLMPolicy | None = None,
    checkpoint: Path | None = None,
    device: str | None = None,
    model: str | None = None,
) -> CausalLMPolicy | None:
    """The frozen KL reference (``None`` when ``beta`` is 0).

    Args:
        policy: a fresh run's initial policy: the reference is ``frozen_copy`` of it
            (a PEFT policy's is the same model with its adapter disabled, no copy).
        checkpoint: a resume's checkpoint. When its policy is a PEFT adapter
            ``CheckpointManager.load`` builds the adapter-off view from the loaded
            policy (``None`` here); otherwise the initial model is loaded again.
        device, model: as ``policy_for``.
    """
    if beta <= 0:
        return None
    from lmgym.policy.adapters import is_adapter_dir
    from lmgym.policy.value import frozen_copy

    if policy is not None:
        return frozen_copy(policy)
    if checkpoint is not None and is_adapter_dir(checkpoint / "agent" / "policy"):
        return None
    # The reference is the initial model, not the checkpoint's: rebuild it (the tiny
    # GPT-2 with the context the checkpoint's was built with).
    initial = load_policy(
        model or config.model,
        config.temperature,
        device or config.device,
        autocast_dtype=config.autocast_dtype,
        tiny_positions=TINY_POSITIONS if checkpoint is None else checkpoint_positions(checkpoint),
    )
    return frozen_copy(initial)


def make_train_env(
    config: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    env_id: str | None = None,
    *,
    device: str | None = None,
    shard: tuple[int, int] = (0, 1),
) -> TokenVectorEnv:
    """The run's training env: ``gymnasium.make_vec(task, ...)`` with the policy's tokenizer.

    Args:
        env_id: the task's registered id (``prepare_task``); default ``config.task``.
        device: where (default ``config.device``).
        shard: ``(rank, world_size)`` of a data-parallel run: this rank's share of the
            prompt stream, ``config.num_prompts`` prompts per reset.
    """
    kwargs = dict(config.env_kwargs)
    if shard != (0, 1):
        kwargs["shard"] = shard
    task = env_id or config.task
    env = gym.make_vec(
        task,
        **batch_arguments(task, config.num_prompts, config.group_size),
        tokenizer=tokenizer,
        device=device or config.device,
        **kwargs,
    )
    if not isinstance(env, TokenVectorEnv):
        raise TypeError(
            f"task {config.task!r}: make_vec returned {type(env).__name__}, not an lmgym "
            "TokenVectorEnv"
        )
    return env


def build_agent(
    config: TrainConfig,
    agent_config: AgentConfig,
    env_id: str,
    device: str,
    shard: tuple[int, int] = (0, 1),
    process_group: Any = None,
    model: str | None = None,
) -> tuple[Agent, dict[str, Any]]:
    """A fresh run's agent: its policy, training env (this rank's ``shard``) and reference.

    The global torch RNG is seeded with the agent's seed before the policy (a LoRA
    adapter's initial weights) and again before the agent (a critic head's).

    Args:
        process_group: the learners' group of an asynchronous run (``Role``).
        model: as ``policy_for``.

    Returns:
        ``(agent, env_kwargs)``: the env arguments its env was built with, which the run
        records (``config.env_kwargs`` with a chat model's stop ids).
    """
    from lmgym.agents import ALGORITHMS
    from lmgym.training.env_args import with_policy_stop_ids

    torch.manual_seed(agent_config.seed)
    policy = policy_for(config, device, model)
    config = replace(config, env_kwargs=with_policy_stop_ids(env_id, config.env_kwargs, policy))
    env = make_train_env(config, policy.tokenizer, env_id, device=device, shard=shard)
    context = policy.context_length
    if config.model is None and model is None and context is not None and env.seq_len > context:
        # The tiny demo model, too short for this task: the same model, longer.
        torch.manual_seed(agent_config.seed)
        policy = policy_for(config, device, positions=tiny_positions(config, env_id, env))
    torch.manual_seed(agent_config.seed)
    reference = reference_for(config, agent_config.beta, policy=policy)
    agent = ALGORITHMS[config.algo](
        policy, env, reference, config=agent_config, process_group=process_group
    )
    return agent, config.env_kwargs


def eval_env_for(
    config: TrainConfig, env_id: str, tokenizer: PreTrainedTokenizerBase, device: str
) -> tuple[TokenVectorEnv, str]:
    """The run's evaluation env and which prompts it holds (``make_eval_env``)."""
    return make_eval_env(
        env_id,
        tokenizer,
        config.eval_prompts,
        config.eval_samples,
        env_kwargs=config.env_kwargs,
        device=device,
    )


def _takes_agent_and_metrics(target: Any) -> bool:
    """Whether ``target(agent, metrics)`` binds (``True`` when its signature is unknown)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None, {})
    except TypeError:
        return False
    return True


def load_callback(spec: str) -> Callback:
    """Import a user callback from ``'package.module:name'``; a class is instantiated.

    Raises:
        ValueError: it cannot be imported, is not callable, cannot be called as
            ``callback(agent, metrics)`` (e.g. ``os:system``), or is a Stable-Baselines3
            ``BaseCallback`` (the message states lmgym's callback protocol).
    """
    where = f"callback {spec!r}"
    target = import_object(spec, "callback")
    try:
        check_callback(target, where)
        if isinstance(target, type):
            target = target()
        check_callback(target, where)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if not _takes_agent_and_metrics(target):
        shown = f"{getattr(target, '__name__', type(target).__name__)}{inspect.signature(target)}"
        raise ValueError(
            f"{where}: {shown} cannot be called as (agent, metrics); {CALLBACK_PROTOCOL}"
        )
    return target
