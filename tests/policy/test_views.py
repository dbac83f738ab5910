"""A policy or critic computing with other modules (``on_model``, ``on_modules``): what
data-parallel FSDP hands the loss instead of swapping the agent's own modules."""

from __future__ import annotations

import copy

import pytest
import torch

from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.policy.value import Critic
from lmgym.policy.views import live_view


@pytest.fixture
def policy() -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)


@pytest.fixture
def batch(policy) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, policy.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids, dtype=torch.bool)


def test_a_policy_on_another_model_runs_that_model_and_leaves_the_policy_alone(policy, batch):
    ids, attn = batch
    before = policy.logprobs(ids, attn, 3)[0]
    replica = copy.deepcopy(policy.model)
    view = policy.on_model(replica)
    assert isinstance(view, CausalLMPolicy) and view.model is replica
    assert [name for name, _ in view.named_children()] == ["model"]
    assert view.trunk.model is replica and policy.trunk.model is policy.model
    torch.testing.assert_close(view.logprobs(ids, attn, 3)[0], before, rtol=0, atol=0)
    with torch.no_grad():
        for p in replica.parameters():
            p.add_(0.1)
    assert not torch.equal(view.logprobs(ids, attn, 3)[0], before)  # the replica runs
    torch.testing.assert_close(policy.logprobs(ids, attn, 3)[0], before, rtol=0, atol=0)


def test_a_view_reads_the_policy_s_settings_live(policy, batch):
    """A setting changed after the view was made (the temperature) is the view's too."""
    ids, attn = batch
    view = policy.on_model(copy.deepcopy(policy.model))
    policy.temperature = 0.5
    assert view.temperature == 0.5
    torch.testing.assert_close(
        view.logprobs(ids, attn, 3)[0], policy.logprobs(ids, attn, 3)[0], rtol=0, atol=0
    )


def test_a_critic_on_other_modules_computes_with_them(policy, batch):
    ids, attn = batch
    critic = Critic(policy, shared=False, init="normal")
    trunk = critic.trunk_policy.on_model(copy.deepcopy(critic.trunk_policy.model))
    view = critic.on_modules(trunk, copy.deepcopy(critic.head))
    assert view.trunk_policy is trunk and view.head is not critic.head and not view.shared
    torch.testing.assert_close(view.values(ids, attn, 3), critic.values(ids, attn, 3))
    with torch.no_grad():
        view.head.linear.bias.add_(1.0)
    torch.testing.assert_close(view.values(ids, attn, 3), critic.values(ids, attn, 3) + 1.0)


def test_a_view_of_a_child_the_origin_lacks_is_refused(policy):
    with pytest.raises(ValueError, match="CausalLMPolicy has no child module 'head'"):
        live_view(policy, head=torch.nn.Linear(1, 1))
