"""A weight made NaN by the optimizer's own state is not blamed on the learning rate
(issue 40): AdamW moves a row whose gradient is 0 (an embedding row no token uses)
by its moments, so a NaN planted there made the step's weights NaN, and the error
said 'the weights diverged ... lower learning_rate'."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmgym.agents.config import AgentConfig
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.optim import LearningRateSchedule, sync_check_step
from lmgym.agents.records import MicroBatchLoss
from lmgym.distributed import DataParallelGroup


def part() -> tuple[torch.Tensor, MicroBatchLoss]:
    one = torch.zeros(1, 1)
    terms = {"policy_loss": torch.tensor(0.5)}
    return torch.tensor([0]), MicroBatchLoss(one.sum(), terms, one, None, None, one, one)


def step(weight: nn.Parameter, optimizer: torch.optim.Optimizer) -> None:
    weight.grad = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])  # row 1: unused
    config = AgentConfig(learning_rate=1e-3)
    schedule = LearningRateSchedule(optimizer, config)
    sync_check_step([part()], optimizer, schedule, DataParallelGroup(), config, "iteration 3")


def test_a_nan_in_the_optimizer_state_of_an_unused_row_is_named_not_the_learning_rate():
    weight = nn.Parameter(torch.zeros(3, 2))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    step(weight, optimizer)  # builds the moments
    optimizer.state[weight]["exp_avg"][1, 0] = float("nan")  # as a damaged state would be
    with pytest.raises(NonFiniteUpdateError) as caught:
        step(weight, optimizer)
    assert str(caught.value) == (
        "parameters are non-finite after the optimizer step at iteration 3: the optimizer "
        "state exp_avg of parameter 0 (first NaN at row 1) holds NaN, which no finite gradient "
        "puts there (the gradients were checked finite), so the state was loaded or set "
        "damaged; the learning rate is not the cause. Resume from an earlier checkpoint, or "
        "reset the optimizer"
    )


def test_a_diverging_step_with_finite_state_still_names_the_learning_rate():
    weight = nn.Parameter(torch.full((3, 2), -3e38))  # near float32's largest
    optimizer = torch.optim.SGD([weight], lr=1e38)  # one step overflows it
    with pytest.raises(
        NonFiniteUpdateError, match=r"\(learning_rate=0.001\): the weights diverged"
    ):
        step(weight, optimizer)
    assert not bool(torch.isfinite(weight).all())


def test_a_large_finite_weight_in_an_unused_row_is_not_called_diverged():
    """Its square overflows the float32 norm of the weights; no weight is non-finite.
    (Before: 'the weights diverged ... lower learning_rate' on the first step of a
    model with 1e30 in an embedding row no token uses.)"""
    weight = nn.Parameter(torch.zeros(3, 2))
    with torch.no_grad():
        weight[1] = 1e30
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    step(weight, optimizer)
    step(weight, optimizer)
    assert bool(torch.isfinite(weight).all()) and weight[1, 0].item() == pytest.approx(
        1e30, rel=1e-3
    )


def test_nan_probabilities_before_any_update_blame_the_model_not_the_learning_rate():
    from lmgym.agents import GRPO
    from lmgym.envs.tasks.target_string import make_target_string_vector
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    tokenizer = make_char_tokenizer()
    model = make_tiny_model(len(tokenizer), seed=0)
    with torch.no_grad():  # finite, so the policy takes it; its logits overflow
        model.get_input_embeddings().weight[tokenizer.convert_tokens_to_ids("a")] = 3e38
    policy = CausalLMPolicy(model, tokenizer)
    env = make_target_string_vector(tokenizer=tokenizer, num_envs=8, group_size=4)
    agent = GRPO(policy, env, learning_rate=1e-3)
    with pytest.raises(NonFiniteUpdateError) as caught:
        agent.learn(1)
    assert str(caught.value) == (
        "the policy's next-token probabilities are NaN/inf in the rollout of iteration 1: no "
        "update has run yet, so the model as loaded gives NaN/inf logits (an extreme or "
        "damaged weight, not the learning rate); load an intact model"
    )


# ------------------------------------------- a NaN in the batch, where the loss does not look
def batch_and_agent(agent_class, **config):
    """A fresh agent and a batch of its env with varied bandit rewards (non-zero advantages)."""
    import dataclasses

    from lmgym.envs.tasks.target_string import make_target_string_vector
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
    from lmgym.rollout import collect

    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_target_string_vector(tokenizer=tokenizer, num_envs=8, group_size=4, max_new_tokens=6)
    batch = collect(env, policy, seed=3)
    rewards = batch.dones.float() * torch.arange(8.0)[:, None]
    agent = agent_class(policy, env, num_minibatches=1, update_epochs=1, **config)
    return agent, dataclasses.replace(batch, rewards=rewards)


def planted(batch, field: str, where: str):
    """``batch`` with a NaN in ``field`` at a position of kind ``where``, and that position."""
    import dataclasses

    values = getattr(batch, field).clone()
    changes = {}
    if where == "dropped row":  # unfinished="mask" drops such a row from the loss
        valid = batch.valid.clone()
        valid[1] = False
        changes["valid"] = valid
        row, token = 1, 0
    else:  # padding after a completion that ended early
        row, token = (int(i) for i in (~batch.policy_mask).nonzero()[0])
    values[row, token] = float("nan")
    return dataclasses.replace(batch, **{field: values}, **changes), (row, token)


@pytest.mark.parametrize(
    ("agent_name", "field", "where", "config"),
    [
        ("GRPO", "rewards", "dropped row", {}),  # zeroed its group's advantages, silently
        ("GRPO", "rewards", "padding", {}),  # zeroed every advantage, silently
        ("PPO", "rewards", "dropped row", {}),  # 'advantages is nan ... Lower learning_rate'
        ("GRPO", "sampler_logprobs", "dropped row", {"tis_cap": 2.0}),  # 'grad_norm is nan'
    ],
)
def test_a_nan_in_a_part_of_the_batch_the_loss_drops_is_named_not_the_learning_rate(
    agent_name, field, where, config
):
    import lmgym.agents

    agent, batch = batch_and_agent(getattr(lmgym.agents, agent_name), **config)
    batch, (row, token) = planted(batch, field, where)
    before = [p.detach().clone() for p in agent.policy.model.parameters()]
    with pytest.raises(NonFiniteUpdateError) as caught:
        agent.train_on_batch(batch)
    kind = (
        "a row the loss drops, valid=False"
        if where == "dropped row"
        else "a position the loss does not use: padding or an observation token"
    )
    assert str(caught.value) == (
        f"rollout batch: {field} is nan at row {row}, token {token} ({kind}) at iteration 1: "
        "an env never puts one there, so the batch was built or changed outside it; the "
        "learning rate is not the cause. Give every entry a finite value, 0 where the loss "
        "does not use it (a dropped row's score still enters its group's baseline, and "
        "NaN * 0 is NaN)"
    )
    for p, q in zip(agent.policy.model.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_non_finite_advantages_from_a_finite_batch_name_the_critic():
    """The critic's values are the one input of PPO's advantages the batch does not hold:
    non-finite ones are the critic's (the learning rate is a possible cause there)."""
    from lmgym.agents import PPO

    agent, batch = batch_and_agent(PPO)
    with torch.no_grad():
        for weight in agent.critic.head.parameters():
            weight.fill_(float("nan"))
    with pytest.raises(NonFiniteUpdateError) as caught:
        agent.train_on_batch(batch)
    message = str(caught.value)
    assert message.startswith("advantages is nan at row 0, token 0 at iteration 1, computed ")
    assert (
        "from a finite batch: the critic's value estimates are non-finite (first at row 0); "
        "the critic diverged (its learning rate too high) or was loaded damaged. Resume from "
        "the last checkpoint with a lower learning_rate"
    ) in message


@pytest.mark.parametrize("agent_name", ["GRPO", "RLOO"])
def test_a_value_outside_the_mask_does_not_reach_a_row_score(agent_name):
    """A row's score sums its rewards with ``torch.where`` over the policy tokens, not a
    product with the mask (NaN * 0 is NaN), so such a value cannot reach the advantages."""
    import lmgym.agents

    agent, batch = batch_and_agent(getattr(lmgym.agents, agent_name))
    nan_batch, _ = planted(batch, "rewards", "padding")
    mask = batch.policy_mask
    clean, _ = agent.advantages(batch, batch.rewards, mask, None)
    poisoned, _ = agent.advantages(nan_batch, nan_batch.rewards, mask, None)
    assert clean.abs().max() > 0
    torch.testing.assert_close(poisoned, clean)
