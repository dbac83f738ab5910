import math

import pytest
import torch

from lmgym.agents.advantages import (
    EMABaseline,
    batch_mean_baseline,
    broadcast_to_tokens,
    discounted_returns,
    gae,
    group_mean_std,
    grpo_advantages,
    length_adaptive_lambda,
    process_grpo_advantages,
    reinforce_advantages,
    rloo_advantages,
    whiten,
)

F64 = torch.float64
PAD = 99.0  # garbage at padding positions: it must never reach a result


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, t(expected), rtol=0, atol=1e-7)


# --- returns and REINFORCE -------------------------------------------------------------


def test_discounted_returns_packed_row_with_padding() -> None:
    # Row 0 packs [1, 2, 3] and [4, 5] with padding between and after.
    rewards = t([[1, 2, 3, PAD, 4, 5, PAD], [0, 0, 1, PAD, PAD, PAD, PAD]])
    mask = t([[1, 1, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    dones = t([[0, 0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0, 0]])
    before = rewards.clone()
    returns = discounted_returns(rewards, mask, gamma=0.5, dones=dones)
    close(returns, [[2.75, 3.5, 3, 0, 6.5, 5, 0], [0.25, 0.5, 1, 0, 0, 0, 0]])
    assert torch.equal(rewards, before)


def test_discounted_returns_without_dones_is_one_sequence_per_row() -> None:
    rewards = t([[1, 0, 2, PAD]])
    mask = t([[1, 1, 1, 0]])
    close(discounted_returns(rewards, mask, gamma=1.0), [[3, 2, 2, 0]])


def test_batch_mean_baseline_over_masked_tokens_and_sequences() -> None:
    returns = t([[1, 2, PAD], [3, PAD, PAD]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    assert batch_mean_baseline(returns, mask).item() == pytest.approx(2.0)
    assert batch_mean_baseline(t([1, 2, 6])).item() == pytest.approx(3.0)


def test_ema_baseline_update() -> None:
    baseline = EMABaseline(decay=0.5)
    assert baseline.value == 0.0
    assert baseline.update(2.0) == pytest.approx(1.0)
    assert baseline.update(torch.tensor(4.0)) == pytest.approx(2.5)
    assert baseline.value == pytest.approx(2.5)
    with pytest.raises(ValueError, match="decay"):
        EMABaseline(decay=1.0)


def test_reinforce_advantages_subtract_baseline_on_real_tokens() -> None:
    returns = t([[3, 2, PAD], [1, PAD, PAD]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    close(reinforce_advantages(returns, mask), [[3, 2, 0], [1, 0, 0]])
    close(reinforce_advantages(returns, mask, baseline=2.0), [[1, 0, 0], [-1, 0, 0]])
    close(reinforce_advantages(returns, mask, baseline=t(2.0)), [[1, 0, 0], [-1, 0, 0]])


# --- group statistics, RLOO, GRPO --------------------------------------------------------

# Groups are interleaved and labelled 30, 7, 99: row order and label values are arbitrary.
GROUP_IDS = torch.tensor([30, 7, 30, 7, 99, 30])
GROUP_SCORES = t([1, 5, 2, 7, 4, 6])


def test_group_mean_std_interleaved_non_contiguous_groups() -> None:
    mean, std, size = group_mean_std(GROUP_SCORES, GROUP_IDS)
    # group 30: {1, 2, 6} mean 3, unbiased var 7; group 7: {5, 7}; group 99: {4} alone.
    close(mean, [3, 6, 3, 6, 4, 3])
    close(std, [math.sqrt(7), math.sqrt(2), math.sqrt(7), math.sqrt(2), 0, math.sqrt(7)])
    assert size.tolist() == [3, 2, 3, 2, 1, 3]
    assert size.dtype == torch.int64


def test_rloo_leave_one_out() -> None:
    scores, ids = GROUP_SCORES[[0, 1, 2, 3, 5]], GROUP_IDS[[0, 1, 2, 3, 5]]
    # 1 - (2+6)/2, 5 - 7, 2 - (1+6)/2, 7 - 5, 6 - (1+2)/2
    close(rloo_advantages(scores, ids), [-3, -2, -1.5, 2, 4.5])


def test_rloo_rejects_group_of_one() -> None:
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(GROUP_SCORES, GROUP_IDS)


def test_grpo_group_scale() -> None:
    expected = [-2 / math.sqrt(7), -1 / math.sqrt(2), -1 / math.sqrt(7), 1 / math.sqrt(2)]
    expected += [0.0, 3 / math.sqrt(7)]
    close(grpo_advantages(GROUP_SCORES, GROUP_IDS, eps=0.0), expected)
    # with the default eps = 1e-4 in the denominator
    advantages = grpo_advantages(GROUP_SCORES, GROUP_IDS)
    assert advantages[0].item() == pytest.approx(-2 / (math.sqrt(7) + 1e-4), abs=1e-12)


def test_grpo_batch_and_none_scale() -> None:
    scores, ids = t([0, 1, 2, 3]), torch.tensor([5, 5, 8, 8])
    batch_std = math.sqrt(5 / 3)  # unbiased std of {0, 1, 2, 3}
    half = 0.5 / batch_std
    close(grpo_advantages(scores, ids, scale="batch", eps=0.0), [-half, half, -half, half])
    close(grpo_advantages(scores, ids, scale="none"), [-0.5, 0.5, -0.5, 0.5])
    with pytest.raises(ValueError, match="'group', 'batch', 'none'"):
        grpo_advantages(scores, ids, scale="rank")  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_equal_rewards_give_exact_zeros(scale: str) -> None:
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=torch.float32)
    ids = torch.tensor([3, 3, 3, 1, 1, 1])
    advantages = grpo_advantages(scores, ids, scale=scale)  # type: ignore[arg-type]
    assert torch.equal(advantages, torch.zeros(6))
    same = grpo_advantages(torch.full((4,), 0.3), torch.zeros(4, dtype=torch.int64), scale)  # type: ignore[arg-type]
    assert torch.equal(same, torch.zeros(4))


def test_dr_grpo_is_rloo_times_group_factor() -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(12, generator=generator, dtype=F64)
    ids = torch.tensor([4, 9, 2, 4, 9, 2, 4, 9, 2, 4, 9, 2])  # G = 4, interleaved
    drgrpo = grpo_advantages(scores, ids, scale="none")
    torch.testing.assert_close(drgrpo, (4 - 1) / 4 * rloo_advantages(scores, ids))


def test_process_grpo_advantages() -> None:
    # Rows 0 and 2 form group 4: step rewards {1, 1, 0, 1}, mean 0.75, unbiased std 0.5,
    # so 1 -> 0.5 and 0 -> -1.5. Row 1 is group 7: {3, 5} -> -1/sqrt(2), +1/sqrt(2).
    step_rewards = t([[0, 1, 0, 1, PAD], [3, 5, 0, 0, 0], [0, 0, 1, 0, 0]])
    step_mask = t([[0, 1, 0, 1, 1], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0]])
    mask = t([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    ids = torch.tensor([4, 7, 4])
    advantages = process_grpo_advantages(step_rewards, step_mask, ids, mask, eps=0.0)
    r = 1 / math.sqrt(2)
    close(advantages, [[1.0, 1.0, 0.5, 0.5, 0], [0, r, 0, 0, 0], [-1.0, 0.5, 0.5, 0, 0]])


# --- GAE -----------------------------------------------------------------------------------


def test_gae_closed_form() -> None:
    rewards = t([[0, 0, 1, PAD, PAD]])
    values = t([[0.5, 0.6, 0.7, PAD, PAD]])
    mask = t([[1, 1, 1, 0, 0]])
    # delta = [0.9*0.6 - 0.5, 0.9*0.7 - 0.6, 1 - 0.7] = [0.04, 0.03, 0.3]
    # A_1 = 0.03 + 0.72*0.3, A_0 = 0.04 + 0.72*0.246
    expected_advantages = [[0.21712, 0.246, 0.3, 0, 0]]
    expected_returns = [[0.71712, 0.846, 1.0, 0, 0]]
    for done_at_end in (1.0, 0.0):  # the end of a row is a boundary either way
        dones = t([[0, 0, done_at_end, 0, 0]])
        advantages, returns = gae(rewards, values, dones, mask, gamma=0.9, lam=0.8)
        close(advantages, expected_advantages)
        close(returns, expected_returns)


def test_gae_gamma_lambda_one_is_returns_minus_values() -> None:
    generator = torch.Generator().manual_seed(1)
    rewards = torch.randn(3, 6, generator=generator, dtype=F64)
    values = torch.randn(3, 6, generator=generator, dtype=F64)
    mask = t([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]])
    dones = t([[0, 1, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0]])
    advantages, returns = gae(rewards, values, dones, mask, gamma=1.0, lam=1.0)
    expected = (discounted_returns(rewards, mask, 1.0, dones) - values) * mask
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, discounted_returns(rewards, mask, 1.0, dones))


# Each row packs sequences ("seq", length) with padding ("pad", length) between them; the
# last sequence of a row may or may not carry done (truncated, or left-padded rows).
LAYOUTS = [
    ([("seq", 3), ("pad", 2), ("seq", 4), ("pad", 1), ("seq", 2)], True),
    ([("seq", 5), ("seq", 4), ("pad", 3)], False),
    ([("pad", 2), ("seq", 10)], False),
    ([("seq", 1), ("pad", 1), ("seq", 1), ("seq", 6), ("pad", 3)], True),
]


def reference_gae(rewards, values, gamma, lam):
    """Textbook GAE per sequence, from the layouts: V and A are 0 after a sequence's end."""
    advantages = [[0.0] * 12 for _ in LAYOUTS]
    for row, (layout, _) in enumerate(LAYOUTS):
        start = 0
        for kind, length in layout:
            if kind == "seq":
                positions = list(range(start, start + length))
                next_value, next_advantage = 0.0, 0.0
                for position in reversed(positions):
                    delta = rewards[row][position] + gamma * next_value - values[row][position]
                    next_advantage = delta + gamma * lam * next_advantage
                    next_value = values[row][position]
                    advantages[row][position] = next_advantage
            start += length
    return advantages


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3), (0.9, 0.0)])
def test_gae_matches_reference_loop_on_packed_rows(gamma: float, lam: float) -> None:
    generator = torch.Generator().manual_seed(2)
    rewards = torch.randn(4, 12, generator=generator, dtype=F64)
    values = torch.randn(4, 12, generator=generator, dtype=F64)
    mask = torch.zeros(4, 12, dtype=torch.bool)
    dones = torch.zeros(4, 12)
    for row, (layout, last_done) in enumerate(LAYOUTS):
        start = 0
        sequences = [(s, n) for s, n in layout]
        for index, (kind, length) in enumerate(sequences):
            if kind == "seq":
                mask[row, start : start + length] = True
                is_last = all(k == "pad" for k, _ in sequences[index + 1 :])
                dones[row, start + length - 1] = 0.0 if is_last and not last_done else 1.0
            start += length
    # Garbage in the padding: it must not leak into any real token.
    rewards = torch.where(mask, rewards, 1e6)
    values = torch.where(mask, values, -1e6)
    advantages, returns = gae(rewards, values, dones, mask, gamma, lam)
    expected = t(reference_gae(rewards.tolist(), values.tolist(), gamma, lam))
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0))


def test_gae_per_row_lambda_equals_each_row_with_its_own_scalar() -> None:
    generator = torch.Generator().manual_seed(3)
    rewards = torch.randn(3, 5, generator=generator, dtype=F64)
    values = torch.randn(3, 5, generator=generator, dtype=F64)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    dones = t([[0, 0, 0, 0, 1], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0]])
    lams = [0.95, 0.0, 0.5]
    advantages, returns = gae(rewards, values, dones, mask, 0.9, torch.tensor(lams))
    for row, lam in enumerate(lams):
        one = slice(row, row + 1)
        expected = gae(rewards[one], values[one], dones[one], mask[one], 0.9, lam)
        torch.testing.assert_close(advantages[one], expected[0])
        torch.testing.assert_close(returns[one], expected[1])


def test_gae_per_row_lambda_hand_values() -> None:
    # Row 0 as in test_gae_closed_form (lam 0.8); row 1: lam 0 is one-step TD.
    rewards = t([[0, 0, 1], [0, 0, 1]])
    values = t([[0.5, 0.6, 0.7], [0.5, 0.6, 0.7]])
    mask, dones = t([[1, 1, 1], [1, 1, 1]]), t([[0, 0, 1], [0, 0, 1]])
    advantages, _ = gae(rewards, values, dones, mask, 0.9, torch.tensor([0.8, 0.0]))
    close(advantages, [[0.21712, 0.246, 0.3], [0.04, 0.03, 0.3]])


def test_gae_rejects_a_lambda_tensor_of_the_wrong_shape() -> None:
    rewards = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"lam: expected a float or one λ per row, shape \(2,\)"):
        gae(rewards, rewards, rewards, rewards, 1.0, torch.tensor([0.9, 0.9, 0.9]))


def test_length_adaptive_lambda_hand_values() -> None:
    # 1 - 1/(0.05 * T): T=100 -> 0.8, T=1000 -> 0.98, T=20 -> 0; T=10 -> -1, clamped to 0.
    lam = length_adaptive_lambda(torch.tensor([100, 1000, 20, 10]), alpha=0.05)
    torch.testing.assert_close(lam, torch.tensor([0.8, 0.98, 0.0, 0.0]))
    assert lam.dtype == torch.float32


def test_gae_outputs_are_detached() -> None:
    values = t([[0.5, 0.2]]).requires_grad_()
    advantages, returns = gae(t([[0, 1]]), values, t([[0, 1]]), t([[1, 1]]), 1.0, 1.0)
    assert not advantages.requires_grad and not returns.requires_grad


# --- broadcast and whitening -------------------------------------------------------------


def test_broadcast_to_tokens() -> None:
    mask = torch.tensor([[True, True, False], [True, False, False]])
    close(broadcast_to_tokens(t([2, -1]), mask), [[2, 2, 0], [-1, 0, 0]])


def test_whiten_over_masked_tokens() -> None:
    x = t([[2, 4, PAD], [6, PAD, PAD]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # mean 4, unbiased std 2
    close(whiten(x, mask, eps=0.0), [[-1, 0, 0], [1, 0, 0]])
    close(whiten(x, mask, eps=0.0, shift_mean=False), [[3, 4, 0], [5, 0, 0]])


def test_whiten_centres_without_rescaling_below_min_std() -> None:
    # Critic noise on a batch where every completion earned the same reward: mean 1,
    # unbiased std 0.02. Rescaled, it would become [-1, 0, 1] (unit variance).
    x = t([[0.98, 1.0, PAD], [1.02, PAD, PAD]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    close(whiten(x, mask, eps=0.0, min_std=0.1), [[-0.02, 0, 0], [0.02, 0, 0]])
    close(whiten(x, mask, eps=0.0, min_std=0.019), [[-1, 0, 0], [1, 0, 0]])  # above: rescaled
    close(whiten(x, mask, eps=0.0, min_std=0.1, shift_mean=False), [[0.98, 1, 0], [1.02, 0, 0]])
