"""Reward outputs lmgym cannot use as they are fail with a message naming the reward,
the cause and the fix, and nothing a reward model returns is kept beyond its value
(issue 40): a complex reward used to become its real part without a word, a reward
tensor kept its autograd graph in the env's state, a ``[2, N/2]`` output was
flattened into ``[N]``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from lmgym.envs import FunctionReward, RewardError, TokenScoreReward
from lmgym.envs.rewards import TokenModuleReward

EOS = 1


def step_once(env, rows: int):
    env.reset(seed=0)
    return env.step(torch.full((rows,), EOS, dtype=torch.long))


@pytest.mark.parametrize(
    ("fn", "batched", "where"),
    [
        pytest.param(lambda ps, cs: np.array([1 + 2j, 1.0]), True, " for row 0", id="numpy"),
        pytest.param(
            lambda ps, cs: torch.tensor([1.0, 1 + 2j]), True, " for row 1", id="torch tensor"
        ),
        pytest.param(
            lambda ps, cs: [1.0, np.complex64(1 + 2j)], True, " for row 1", id="list of numpy"
        ),
        pytest.param(lambda p, c: np.complex128(1 + 2j), False, None, id="per sample"),
    ],
)
def test_a_complex_reward_is_refused_not_cut_to_its_real_part(make_env, fn, batched, where):
    env = make_env(num_prompts=2, reward=FunctionReward(fn, batched=batched, name="cplx"))
    if where is None:  # a per-sample function: named as not a real number, row 0
        message = (
            r"reward 'cplx' returned np.complex128\(1\+2j\) for row 0 .*which is not a real number"
        )
    else:
        message = (
            rf"reward 'cplx' returned complex values{where} \(prompt=.*\); rewards must be real "
            r"numbers \(return the real part, or abs\(\), explicitly\)"
        )
    with pytest.raises(RewardError, match=message):
        step_once(env, 2)


@pytest.mark.parametrize(
    "value", [np.complex128(1 + 2j), 1 + 2j, torch.tensor(1 + 2j)], ids=["numpy", "python", "0-d"]
)
def test_a_complex_scalar_returned_for_the_batch_is_refused(make_env, value):
    """A batched function returning one complex scalar: numpy's used to pass as its real
    part with only a ComplexWarning (then fail, or not, on the count)."""
    env = make_env(prompts=["ab"], reward=FunctionReward(lambda ps, cs: value, name="one"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning either: refused before any cast
        with pytest.raises(
            RewardError,
            match=(
                r"^reward 'one' returned complex values; rewards must be real numbers "
                r"\(return the real part, or abs\(\), explicitly\)$"
            ),
        ):
            step_once(env, 1)


def test_a_complex_token_score_is_refused(make_env):
    reward = TokenScoreReward(lambda b: torch.ones(b.completion_mask.shape) * (1 + 2j), name="z")
    env = make_env(num_prompts=1, reward=reward)
    with pytest.raises(RewardError, match="reward 'z' returned complex token scores"):
        step_once(env, 1)


def test_a_reward_tensor_that_requires_grad_is_detached(make_env):
    weight = torch.ones((), requires_grad=True)

    def scored(prompts, completions):
        return weight * torch.tensor([float(len(c)) + 1 for c in completions])

    def scored_tokens(batch):
        return weight * batch.completion_mask.float()

    def scored_one(prompt, completion):
        return weight * (float(len(completion)) + 1)

    def scored_list(prompts, completions):
        return [weight * (float(len(c)) + 1) for c in completions]

    per_sample = FunctionReward(scored_one, batched=False)
    rewards_made = (FunctionReward(scored), FunctionReward(scored_list), per_sample)
    for reward in (*rewards_made, TokenScoreReward(scored_tokens)):
        env = make_env(num_prompts=2, reward=reward)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nor torch's "a tensor with requires_grad=True"
            _, rewards, *_ = step_once(env, 2)
        assert rewards.tolist() == [1.0, 1.0]
        assert not rewards.requires_grad and rewards.grad_fn is None
        assert env.get_state() is not None
        assert not env._rows.returns.requires_grad  # the env keeps no graph either


@pytest.mark.parametrize(
    ("shape", "ok"), [((4,), True), ((4, 1), True), ((2, 2), False), ((1, 4), False)]
)
def test_a_reward_of_another_shape_is_refused_naming_the_expected_one(make_env, shape, ok):
    env = make_env(
        num_prompts=4,
        prompts=["ab", "xyz", "a", "b"],
        reward=FunctionReward(lambda ps, cs: torch.arange(4.0).reshape(shape), name="shaped"),
    )
    if ok:
        assert step_once(env, 4)[1].tolist() == [0.0, 1.0, 2.0, 3.0]
        return
    with pytest.raises(
        RewardError,
        match=(
            rf"reward 'shaped' returned shape \[{shape[0]}, {shape[1]}\] for 4 completions; "
            r"return shape \[4\] \(or \[4, 1\]\): exactly one float per completion"
        ),
    ):
        step_once(env, 4)


def test_a_token_module_reward_of_another_shape_is_refused_not_flattened(make_env):
    reward = TokenModuleReward(lambda ids, mask: torch.zeros(2, ids.shape[0] // 2), name="mod")
    env = make_env(num_prompts=4, prompts=["ab", "xyz", "a", "b"], reward=reward)
    with pytest.raises(
        RewardError, match=r"reward 'mod' returned shape \[2, 2\] for 4 completions"
    ):
        step_once(env, 4)
    fine = TokenModuleReward(lambda ids, mask: torch.ones(ids.shape[0], 1), name="mod")
    env = make_env(num_prompts=4, prompts=["ab", "xyz", "a", "b"], reward=fine)
    assert step_once(env, 4)[1].tolist() == [1.0] * 4
