"""Cases shared by the data-parallel worker and its test (imported by both)."""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.tensor import DTensor

from lmgym.agents import ALGORITHMS, GSPO
from lmgym.agents.aggregation import AGGREGATION_MODES
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.parallel import trainable_modules
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

ROWS, GROUP = 12, 4
SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 1.0, 0.0, 0.7, 0.7, 0.7, 0.7]  # group 3 is flat
MASKED = [9, 10]  # rows of the last group (rank 1's): fewer valid tokens there

VARIANTS: dict[str, tuple[str, dict, dict]] = {
    # name: (algorithm, agent config overrides, policy keyword arguments)
    # Several micro-batches (3 on rank 0, 2 on rank 1): all but the last under no_sync.
    "grpo-micro-batches": ("grpo", {"micro_batch_size": 3}, {}),
    "grpo-gradient-checkpointing": ("grpo", {}, {"gradient_checkpointing": True}),
    # Only the adapter trains: DDP reduces the adapter's parameters alone.
    "grpo-lora": ("grpo", {}, {"lora": True}),
    "ppo-separate-critic": ("ppo", {"value_model": "separate"}, {}),
    # One update in value pretraining (the policy frozen), then the measured one with
    # everything trainable: the DDP wrapper is rebuilt over the new parameter set.
    "vapo-after-warmup": ("vapo", {"value_warmup_iterations": 1}, {}),
    # FSDP2: the update through sharded replicas, gradients reduce-scattered and summed.
    "grpo-fsdp": ("grpo", {"data_parallel": "fsdp"}, {}),
    "grpo-fsdp-micro-batches": ("grpo", {"data_parallel": "fsdp", "micro_batch_size": 3}, {}),
    "ppo-fsdp": ("ppo", {"data_parallel": "fsdp"}, {}),
    "ppo-separate-critic-fsdp": ("ppo", {"data_parallel": "fsdp", "value_model": "separate"}, {}),
    "vapo-after-warmup-fsdp": ("vapo", {"data_parallel": "fsdp", "value_warmup_iterations": 1}, {}),
    "grpo-lora-fsdp": ("grpo", {"data_parallel": "fsdp"}, {"lora": True}),
    "grpo-gradient-checkpointing-fsdp": (
        "grpo",
        {"data_parallel": "fsdp"},
        {"gradient_checkpointing": True},
    ),
    # Two real optimizer steps: the sharded AdamW state and the full weights gathered back.
    "grpo-fsdp-step": ("grpo", {"data_parallel": "fsdp"}, {}),
    "ppo-fsdp-step": ("ppo", {"data_parallel": "fsdp"}, {}),
}

CASES: list[tuple[str, str]] = [
    (name, aggregation)
    for name, agent_class in ALGORITHMS.items()
    for aggregation in (
        ["seq-mean-token-mean"] if issubclass(agent_class, GSPO) else AGGREGATION_MODES
    )
] + [(variant, "token-mean") for variant in VARIANTS]


def make_agent(case: tuple[str, str]):
    name, aggregation = case
    name, overrides, policy_kwargs = VARIANTS.get(name, (name, {}, {}))
    tokenizer = make_char_tokenizer()
    if policy_kwargs.pop("lora", False):
        from peft import LoraConfig

        torch.manual_seed(0)  # the adapter's initialisation: the same in every process
        policy_kwargs["peft_config"] = LoraConfig(
            r=4, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights="gaussian"
        )
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer, **policy_kwargs)
    env = make_target_string_vector(
        tokenizer=tokenizer, num_envs=ROWS, group_size=GROUP, max_new_tokens=6
    )
    agent_class = ALGORITHMS[name]
    # One epoch, one minibatch: the single process's shuffled minibatches have no
    # two-rank counterpart; a batch-wide statistic (whitening) everywhere it applies.
    config = {
        "loss_aggregation": aggregation,
        "max_grad_norm": None,
        "entropy_coef": 0.01,
        "num_minibatches": 1,
        "update_epochs": 1,
        "whiten_advantages": True,
        **overrides,
    }
    return agent_class(policy, env, **config)


def full_batch(agent) -> RolloutBatch:
    batch = collect(agent.env, agent.policy, seed=3)
    rewards = batch.dones.float() * torch.tensor(SCORES)[:, None]
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[MASKED] = False
    return dataclasses.replace(batch, rewards=rewards, valid=valid)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gradient_of(agent, batch: RolloutBatch, case: tuple[str, str]) -> dict:
    """One update's gradient (``"grad"``: gathered when sharded) and metrics; for a
    ``-step`` case, two real optimizer steps and then every trainable module's weights
    as the agent holds them outside the update (``"grad"`` then holds those)."""
    if case[0].endswith("-step"):
        metrics = agent.train_on_batch(batch)
        agent.train_on_batch(batch)
        modules = trainable_modules(agent.policy, agent.critic).values()
        weights = [p for m in modules for p in m.parameters()]
        assert not any(isinstance(p, DTensor) for p in weights)  # ordinary full tensors
        return {"grad": torch.cat([p.detach().flatten() for p in weights]), "metrics": metrics}
    agent.optimizer.step = lambda *a, **k: None
    if case[0].startswith("vapo-after-warmup"):  # a value-pretraining update, then the measured one
        agent.train_on_batch(batch)
        agent.iteration = agent.config.value_warmup_iterations
    metrics = agent.train_on_batch(batch)
    params = [p for g in agent.optimizer.param_groups for p in g["params"]]
    grad = torch.cat([_full(p.grad).flatten() for p in params if p.grad is not None])
    return {"grad": grad, "metrics": metrics}
