import pytest
import torch

from lmgym.agents.aggregation import aggregate, aggregate_sequences

F64 = torch.float64
MODES = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


@pytest.mark.parametrize("mode", MODES)
def test_sum_over_any_row_split_equals_full_batch(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=generator, dtype=F64)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    counts = {"num_sequences": 6, "num_tokens": int(mask.sum()), "max_len": 7}
    full = aggregate(loss, mask, mode, **counts)  # type: ignore[arg-type]
    splits = [[0, 3], [1], [2, 4, 5]]
    parts = [aggregate(loss[rows], mask[rows], mode, **counts) for rows in splits]  # type: ignore[arg-type]
    torch.testing.assert_close(sum(parts), full)


def test_aggregate_values() -> None:
    loss = t([[1.0, 3.0, 100.0], [2.0, 100.0, 100.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    counts = {"num_sequences": 2, "num_tokens": 3, "max_len": 4}
    # per-sequence: (2 + 2)/2; per-token: 6/3; fixed length: 6/(2*4)
    assert aggregate(loss, mask, "seq-mean-token-mean", **counts).item() == pytest.approx(2.0)
    assert aggregate(loss, mask, "token-mean", **counts).item() == pytest.approx(2.0)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", **counts).item() == pytest.approx(0.75)


# docs/algorithms.md#aggregation worked example: lengths 2 and 4, per-token loss -A*lp with A = 1, so the gradient
# of the aggregate w.r.t. each log-prob is minus that token's weight in the mode.
WORKED_MASK = t([[1, 1, 0, 0], [1, 1, 1, 1]])
WORKED_WEIGHTS = {
    # 1/(B*T_i): short-sequence tokens weigh twice as much
    "seq-mean-token-mean": [[1 / 4, 1 / 4, 0, 0], [1 / 8, 1 / 8, 1 / 8, 1 / 8]],
    # 1/sum(mask) = 1/6 for every token
    "token-mean": [[1 / 6, 1 / 6, 0, 0], [1 / 6, 1 / 6, 1 / 6, 1 / 6]],
    # 1/(B*L_max) with L_max = 8 (the run's cap, not the batch's longest row)
    "seq-mean-token-sum-norm": [[1 / 16, 1 / 16, 0, 0], [1 / 16, 1 / 16, 1 / 16, 1 / 16]],
}


@pytest.mark.parametrize("mode", MODES)
def test_worked_per_token_gradients(mode: str) -> None:
    logprobs = t([[-0.5, -1.0, 0.0, 0.0], [-0.2, -0.3, -0.4, -0.6]]).requires_grad_()
    loss = -1.0 * logprobs
    total = aggregate(loss, WORKED_MASK, mode, num_sequences=2, num_tokens=6, max_len=8)  # type: ignore[arg-type]
    total.backward()
    expected = -t(WORKED_WEIGHTS[mode])
    torch.testing.assert_close(logprobs.grad, expected)


def test_aggregate_sequences_split_invariant() -> None:
    loss_seq = t([1.0, -2.0, 4.0, 0.5])
    assert aggregate_sequences(loss_seq, 4).item() == pytest.approx(0.875)
    parts = aggregate_sequences(loss_seq[:1], 4) + aggregate_sequences(loss_seq[1:], 4)
    assert parts.item() == pytest.approx(0.875)


def test_aggregate_rejects_unknown_mode_and_bad_counts() -> None:
    loss, mask = t([[1.0]]), t([[1.0]])
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "sum", num_sequences=1, num_tokens=1, max_len=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        aggregate(loss, mask, "token-mean", num_sequences=1, num_tokens=0, max_len=1)
    with pytest.raises(ValueError, match="positive"):
        aggregate_sequences(t([1.0]), 0)
