"""The policy never samples a special token other than EOS unless allowed; the mask is
the same in sampling and teacher forcing, and the mass it removes is recorded."""

from __future__ import annotations

import math

import pytest
import torch
from testkit import biased_head_policy

from lmgym.envs import FunctionReward
from lmgym.policy import CausalLMPolicy
from lmgym.policy.logprobs import token_logprobs
from lmgym.policy.sampling import sample_tokens, special_mass
from lmgym.rollout import ContinuousCollector, collect

PAD, EOS, UNK = 0, 1, 2


def special_loving_policy(tokenizer, **kwargs) -> CausalLMPolicy:
    """A tiny policy whose head strongly prefers <pad> and <unk>."""
    return biased_head_policy(tokenizer, {PAD: 4.0, UNK: 4.0, EOS: 1.0}, seed=0, **kwargs)


def expected_special_mass(policy, batch, refused: list[int]) -> torch.Tensor:
    """Mean over each row's steps of the unmasked probability of ``refused``: ``[B]``."""
    ids, mask = batch.input_ids()
    with torch.no_grad():
        hidden = policy.sequence_hidden(ids, mask, batch.max_new_tokens)
        probs = policy.next_token_logits(hidden).softmax(-1)  # [B, L, V], untempered
    per_step = probs[..., refused].sum(-1) * batch.completion_mask
    return per_step.sum(1) / batch.lengths


def test_the_policy_never_samples_a_masked_special_token(make_env, tokenizer):
    palindrome = FunctionReward(lambda p, c: [float(x == x[::-1]) for x in c])
    env = make_env(prompts=["ab", "xyz"], num_prompts=2, group_size=8, max_new_tokens=8,
                   reward=palindrome)  # fmt: skip
    policy = special_loving_policy(tokenizer)
    batch = collect(env, policy, seed=0)
    real = batch.completion_ids[batch.completion_mask]
    assert not torch.isin(real, torch.tensor([PAD, UNK])).any()
    assert policy.masked_token_ids == [PAD, UNK] and policy.num_masked_tokens == 2
    assert batch.terminated.any()  # EOS, a special token too, stays available
    # The mask removed most of the probability, and the batch says how much.
    torch.testing.assert_close(batch.special_mass, expected_special_mass(policy, batch, [0, 2]))
    assert batch.special_mass.min() > 0.5
    # Teacher forcing uses the same mask: the sampler log-probs are reproduced.
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, entropy = policy.logprobs(ids, mask, batch.max_new_tokens)
    assert torch.isfinite(lp).all() and torch.isfinite(entropy).all()
    diff = ((lp * batch.completion_mask) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4


def test_special_mass_in_continuous_batches(make_env, tokenizer):
    env = make_env(prompts=["ab", "xyz", "q"], num_prompts=2, group_size=2, max_new_tokens=6,
                   autoreset=True)  # fmt: skip
    policy = special_loving_policy(tokenizer)
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(2):
        batch = collector.collect(num_groups=2)
        expected = expected_special_mass(policy, batch, [PAD, UNK])
        torch.testing.assert_close(batch.special_mass, expected)


def test_allowing_all_special_tokens_turns_the_mask_off(make_env, tokenizer):
    policy = special_loving_policy(tokenizer, allowed_special_tokens="all")
    assert policy.masked_token_ids == [] and policy.num_masked_tokens == 0
    env = make_env(num_prompts=2, group_size=4, allowed_special_tokens="all")
    batch = collect(env, policy, seed=0)
    assert torch.isin(batch.completion_ids[batch.completion_mask], torch.tensor([PAD, UNK])).any()
    assert torch.equal(batch.special_mass, torch.zeros(8))


def test_an_allowed_special_token_is_sampled(make_env, tokenizer):
    policy = special_loving_policy(tokenizer, allowed_special_tokens=["<unk>"])
    assert policy.masked_token_ids == [PAD]
    env = make_env(num_prompts=2, group_size=4, allowed_special_tokens=[UNK])
    real = collect(env, policy, seed=0).completion_ids
    assert (real == UNK).any()


def test_the_policy_samples_by_the_envs_token_rules(make_env, tokenizer):
    """The env's rules replace the policy's own: the two cannot disagree."""
    policy = special_loving_policy(tokenizer)
    # The env ends episodes on <unk>: the policy keeps it samplable, and rows end there.
    env = make_env(num_prompts=2, group_size=4, stop_token_ids=[EOS, UNK])
    batch = collect(env, policy, seed=0)
    assert policy.token_rules is env.token_rules and policy.masked_token_ids == [PAD]
    last = batch.completion_ids.gather(1, (batch.lengths - 1)[:, None])[:, 0]
    assert UNK in last[batch.terminated].tolist()
    assert not (batch.completion_ids[batch.completion_mask] == PAD).any()
    # A policy allowed every special token samples none the env refuses.
    permissive = special_loving_policy(tokenizer, allowed_special_tokens="all")
    assert permissive.masked_token_ids == []
    batch = collect(make_env(num_prompts=2, group_size=4), permissive, seed=0)
    assert permissive.masked_token_ids == [PAD, UNK]
    assert not torch.isin(
        batch.completion_ids[batch.completion_mask], torch.tensor([PAD, UNK])
    ).any()
    # Teacher forcing uses the env's mask too: the sampler log-probs are reproduced.
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, _ = permissive.logprobs(ids, mask, batch.max_new_tokens)
    assert ((lp * batch.completion_mask) - batch.sampler_logprobs).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match=r"allowed_special_tokens: 'b' is not a special token"):
        special_loving_policy(tokenizer, allowed_special_tokens=["b"])


def test_allowing_specials_on_the_env_alone_lets_the_policy_sample_them(make_env, tokenizer):
    policy = special_loving_policy(tokenizer)
    batch = collect(make_env(num_prompts=2, group_size=4, allowed_special_tokens="all"), policy)
    assert policy.masked_token_ids == [] and policy.refused_mask is None
    assert torch.isin(batch.completion_ids[batch.completion_mask], torch.tensor([PAD, UNK])).any()


# ------------------------------------------------------------------ the pieces
def test_masked_sampling_and_its_logprob_and_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    refused = torch.tensor([False, True, False])
    actions, lp = sample_tokens(
        logits.expand(400, 3), refused=refused, generator=torch.Generator().manual_seed(0)
    )
    assert set(actions.tolist()) == {0, 2}
    expected = {0: math.log(0.5 / 0.7), 2: math.log(0.2 / 0.7)}
    for a, value in zip(actions.tolist(), lp.tolist(), strict=True):
        assert value == pytest.approx(expected[a], abs=1e-6)
    assert special_mass(logits, refused, 1.0).item() == pytest.approx(0.3, abs=1e-6)
    # At temperature 2: softmax(log p / 2) is proportional to sqrt(p).
    root = torch.tensor([0.5, 0.3, 0.2]).sqrt()
    assert special_mass(logits, refused, 2.0).item() == pytest.approx(
        (root[1] / root.sum()).item(), abs=1e-6
    )


def test_teacher_forced_mask_renormalises_and_keeps_padding_finite():
    torch.manual_seed(0)
    hidden = torch.randn(2, 3, 4)
    weight = torch.randn(5, 4)
    refused = torch.tensor([True, False, False, True, False])
    targets = torch.tensor([[1, 2, 0], [4, 4, 1]])  # 0: a (refused) pad target
    lp, entropy = token_logprobs(hidden, weight, None, targets, refused=refused)
    logits = (hidden @ weight.T).masked_fill(refused, float("-inf"))
    logp = logits.log_softmax(-1)
    expected = logp.gather(-1, targets[..., None])[..., 0]
    expected[0, 2] = 0.0
    torch.testing.assert_close(lp, expected)
    p = logp.exp()
    torch.testing.assert_close(entropy, -(p * logp.masked_fill(refused, 0.0)).sum(-1))
