"""Training settings users expect from TRL: mixed precision, activation checkpointing,
learning-rate schedules with warmup, weight decay, and a policy given by its path."""

from __future__ import annotations

import math

import pytest
import torch

from lmgym.agents import GRPO, PPO
from lmgym.envs import FunctionReward
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model, save_tiny
from lmgym.policy.value import ValueHead
from lmgym.rollout import collect


def tiny_policy(tokenizer, **settings) -> CausalLMPolicy:
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer, **settings)


def teacher_forced(policy: CausalLMPolicy, batch) -> torch.Tensor:
    ids, mask = batch.input_ids()
    with torch.no_grad():
        return policy.logprobs(ids, mask, batch.max_new_tokens, with_entropy=False)[0]


def flat(policy: CausalLMPolicy) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in policy.model.parameters()])


# ------------------------------------------------------------ mixed precision
def test_bf16_autocast_runs_rollout_and_update_on_cpu(make_env, tokenizer):
    policy = tiny_policy(tokenizer, autocast_dtype="bfloat16")
    assert policy.autocast_dtype is torch.bfloat16
    dtypes: set[torch.dtype] = set()
    fc = policy.model.transformer.h[0].mlp.c_fc
    fc.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))

    env = make_env(num_prompts=2, group_size=4, max_new_tokens=6)
    batch = collect(env, policy, seed=0)
    assert dtypes == {torch.bfloat16}  # the sampler ran under autocast
    # The sampler and the learner agree up to bf16 rounding.
    gap = (teacher_forced(policy, batch) - batch.sampler_logprobs) * batch.completion_mask
    assert gap.abs().max() < 0.1

    before = flat(policy)
    metrics = GRPO(policy, env, learning_rate=1e-2).learn(1)[0]
    assert math.isfinite(metrics["policy_loss"]) and math.isfinite(metrics["grad_norm"])
    assert all(p.dtype is torch.float32 for p in policy.model.parameters())  # fp32 master weights
    assert not torch.equal(flat(policy), before)
    metrics = PPO(tiny_policy(tokenizer, autocast_dtype="bf16"), env).learn(1)[0]
    assert math.isfinite(metrics["value_loss"])


def test_the_value_head_takes_bf16_hidden_states():
    head = ValueHead(8, init="normal")
    hidden = torch.randn(2, 3, 8)
    values = head(hidden.bfloat16())
    assert values.dtype is torch.float32 and values.shape == (2, 3)
    torch.testing.assert_close(values, head(hidden), atol=0.05, rtol=0.05)


def test_fp16_autocast_needs_cuda_and_says_so(make_env, tokenizer):
    policy = tiny_policy(tokenizer, autocast_dtype=torch.float16)
    env = make_env(num_prompts=2, group_size=2)
    message = "autocast_dtype=float16 needs a CUDA device, the policy is on cpu; use autocast_dtype='bfloat16'"
    with pytest.raises(ValueError, match=message):
        GRPO(policy, env)
    with pytest.raises(ValueError, match=message):
        collect(env, policy, seed=0)


def test_an_unknown_autocast_dtype_is_an_error(tokenizer):
    with pytest.raises(ValueError, match=r"autocast_dtype='half' is not one of \['bfloat16'"):
        tiny_policy(tokenizer, autocast_dtype="half")
    with pytest.raises(ValueError, match="autocast_dtype=torch.int8: must be torch.bfloat16"):
        tiny_policy(tokenizer, autocast_dtype=torch.int8)


# ------------------------------------------------------- activation checkpointing
def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_gradient(make_env, tokenizer):
    plain = tiny_policy(tokenizer)
    checkpointed = tiny_policy(tokenizer, gradient_checkpointing=True)
    assert checkpointed.gradient_checkpointing and not plain.gradient_checkpointing
    env = make_env(prompts=["ab", "hello"], num_prompts=2, group_size=3, max_new_tokens=6)
    batch = collect(env, plain, seed=0)
    ids, mask = batch.input_ids()

    calls = []
    # A pre-hook: the recomputation stops once it has what the backward needs, which
    # may be before the MLP returns.
    checkpointed.model.transformer.h[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    grads = []
    for policy in (plain, checkpointed):
        logprobs, _ = policy.logprobs(ids, mask, batch.max_new_tokens)
        (logprobs * batch.completion_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters()]))
        if policy is checkpointed:
            # One forward, then the same layer again in the backward pass.
            assert len(calls) == 2
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
    # The model stayed in eval mode: no dropout came on.
    assert not any(m.training for m in checkpointed.model.modules())


def test_gradient_checkpointing_survives_agent_save_and_load(make_env, tokenizer, tmp_path):
    policy = tiny_policy(tokenizer, gradient_checkpointing=True, autocast_dtype="bfloat16")
    agent = GRPO(policy, make_env(num_prompts=2, group_size=2))
    agent.learn(1)
    loaded = GRPO.load(agent.save(tmp_path / "ckpt"), make_env(num_prompts=2, group_size=2))
    assert loaded.policy.gradient_checkpointing
    assert loaded.policy.autocast_dtype is torch.bfloat16


# ------------------------------------------------------------ learning-rate schedule
def lr_trace(agent) -> list[float]:
    """The learning rate each optimizer step of ``agent`` uses, appended as it steps."""
    trace: list[float] = []
    agent.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: trace.append(opt.param_groups[0]["lr"])
    )
    return trace


LR = 1e-2


def code_sum(prompts: list[str], completions: list[str]) -> list[float]:
    """A reward two random completions all but never share: a flat group has a zero
    gradient, and its optimizer step is skipped (no learning rate to trace)."""
    return [float(sum(map(ord, c))) for c in completions]


def schedule_env(make_env):
    # 4 rows, 1 epoch of 2 minibatches: 2 steps per iteration
    return make_env(num_prompts=2, group_size=2, reward=FunctionReward(code_sum))


def schedule_agent(make_env, tokenizer, **config) -> GRPO:
    env = schedule_env(make_env)
    return GRPO(
        tiny_policy(tokenizer), env, learning_rate=LR, update_epochs=1, num_minibatches=2, **config
    )


def test_linear_schedule_warms_up_then_decays_per_optimizer_step(make_env, tokenizer):
    agent = schedule_agent(make_env, tokenizer, lr_scheduler_type="linear", warmup_steps=2)
    trace = lr_trace(agent)
    agent.learn(3)  # the schedule spans this call: 3 iterations x 2 steps
    expected = [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    assert trace == pytest.approx([LR * f for f in expected], abs=1e-12)


def test_cosine_schedule_follows_the_cosine_after_warmup(make_env, tokenizer):
    agent = schedule_agent(
        make_env, tokenizer, lr_scheduler_type="cosine", warmup_ratio=0.3, schedule_iterations=3
    )
    trace = lr_trace(agent)
    agent.learn(3)
    # ceil(0.3 * 6) = 2 warmup steps, then 0.5 * (1 + cos(pi * (k - 2) / 4)).
    expected = [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * (k - 2) / 4)) for k in range(2, 6)]
    assert trace == pytest.approx([LR * f for f in expected], abs=1e-12)


def test_the_default_schedule_keeps_the_learning_rate(make_env, tokenizer):
    agent = schedule_agent(make_env, tokenizer)
    trace = lr_trace(agent)
    agent.learn(2)
    assert trace == [LR] * 4


def test_the_schedule_and_its_position_survive_save_and_load(make_env, tokenizer, tmp_path):
    settings = {"lr_scheduler_type": "linear", "warmup_steps": 2, "schedule_iterations": 3}
    straight = schedule_agent(make_env, tokenizer, **settings)
    straight.learn(3)

    resumed = schedule_agent(make_env, tokenizer, **settings)
    resumed.learn(2)
    path = resumed.save(tmp_path / "ckpt")
    loaded = GRPO.load(path, schedule_env(make_env))
    trace = lr_trace(loaded)
    loaded.learn(1)
    assert trace == pytest.approx([LR * 0.5, LR * 0.25], abs=1e-12)
    assert torch.equal(flat(loaded.policy), flat(straight.policy))


def test_a_schedule_sized_by_learn_keeps_its_length_after_load(make_env, tokenizer, tmp_path):
    agent = schedule_agent(make_env, tokenizer, lr_scheduler_type="linear")
    agent.learn(1)  # fixes the schedule at 2 steps: lr 1, then 0.5
    loaded = GRPO.load(agent.save(tmp_path / "ckpt"), schedule_env(make_env))
    trace = lr_trace(loaded)
    loaded.learn(1)  # past the end of the schedule: lr 0 (a new 4-step one would give 0.5, 0.25)
    assert trace == [0.0, 0.0]


def test_a_decaying_schedule_without_a_length_fails_outside_learn(make_env, tokenizer):
    agent = schedule_agent(make_env, tokenizer, lr_scheduler_type="cosine")
    batch = collect(agent.env, agent.policy, seed=0)
    with pytest.raises(ValueError, match="needs the schedule's length: set schedule_iterations"):
        agent.train_on_batch(batch)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"warmup_steps": 3},
            "lr_scheduler_type='constant' has no warmup; use 'constant_with_warmup'",
        ),
        (
            {"lr_scheduler_type": "linear", "warmup_steps": 2, "warmup_ratio": 0.1},
            "warmup_steps=2 and warmup_ratio=0.1: set one of them",
        ),
        (
            {"warmup_ratio": 1.0, "lr_scheduler_type": "linear"},
            r"warmup_ratio=1.0: must be in \[0, 1\)",
        ),
        ({"lr_scheduler_type": "plateau"}, "lr_scheduler_type='plateau' is not one of"),
        ({"schedule_iterations": 0}, "schedule_iterations=0: must be > 0"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1: must be >= 0"),
    ],
)
def test_bad_schedule_settings_name_the_field(make_env, tokenizer, config, message):
    with pytest.raises(ValueError, match=message):
        schedule_agent(make_env, tokenizer, **config)


# ------------------------------------------------------------------ weight decay
def test_weight_decay_applies_to_matrices_not_to_biases_or_norms(make_env, tokenizer):
    agent = schedule_agent(make_env, tokenizer, weight_decay=0.1)
    decayed, plain = agent.optimizer.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in agent.policy.model.named_parameters()}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    plain_names = {names[id(p)] for p in plain["params"]}
    assert "transformer.wte.weight" in decayed_names
    assert "transformer.h.0.attn.c_attn.weight" in decayed_names
    assert {"transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.bias"} <= plain_names
    assert all(p.ndim >= 2 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    # No decay: one group, as before.
    assert len(schedule_agent(make_env, tokenizer).optimizer.param_groups) == 1


# ------------------------------------------------------------ policy from a path
def test_an_agent_loads_its_policy_from_a_directory(make_env, tmp_path):
    path = save_tiny(tmp_path / "tiny")
    env = make_env(num_prompts=2, group_size=2)  # the same characters as the saved tokenizer
    agent = GRPO(str(path), env, beta=0.1)
    assert isinstance(agent.policy, CausalLMPolicy)
    assert agent.ref_policy is not None and agent.ref_policy is not agent.policy
    assert all(not p.requires_grad for p in agent.ref_policy.model.parameters())
    assert torch.equal(flat(agent.ref_policy), flat(agent.policy))
    agent.learn(1)
    assert GRPO(path, env).policy.vocab_size == len(env.tokenizer)  # a Path works too


def test_an_agent_rejects_a_policy_path_whose_tokenizer_differs_from_the_env(make_env, tmp_path):
    path = save_tiny(tmp_path / "tiny")
    env = make_env(num_prompts=2, group_size=2, tokenizer=make_char_tokenizer("abcxyz"))
    with pytest.raises(ValueError, match=r"its tokenizer \(\d+ ids\) differs from the env's"):
        GRPO(str(path), env)
