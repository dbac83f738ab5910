"""``RolloutEngine`` on a stub trunk: its KV-slot bookkeeping, group prefill and packed
restarts checked against a teacher-forced pass of the same trunk, with no model.

The stub is one attention layer that reads the cache through transformers'
``DynamicCache`` API (``update``, ``get_seq_length``) and honours the engine's masks
and packed inputs the way a transformers trunk does, so a slip in a slot column, a
position or a mask shows up as a log-prob that differs from teacher forcing.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lmgym.policy.kv_engine import PolicyState, RolloutEngine
from lmgym.policy.kv_slots import is_slot_cache
from lmgym.policy.sampling import SamplingSettings
from lmgym.policy.value import frozen_copy

VOCAB, HIDDEN, PAD = 11, 16, 0


class StubTrunk(nn.Module):
    """One causal attention layer with learned positions: ``[B, S]`` -> ``[B, S, H]``."""

    mask_always = False
    compiles = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(64, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.passes: list[int] = []  # inputs of each cached pass (the engine's)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    def hidden_states(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor,
        cache: DynamicCache | None = None,
        packed: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        if cache is not None:
            self.passes.append(input_ids.shape[0])
        x = self.embed(input_ids) + self.position(position_ids)  # [B, S, H]
        q, k, v = (t[:, None] for t in self.qkv(x).chunk(3, dim=-1))  # [B, 1, S, H]
        past = 0 if cache is None else cache.get_seq_length()
        keys, values = (k, v) if cache is None else cache.update(k, v, 0)  # [N, 1, C, H]
        n, s, width = keys.shape[0], input_ids.shape[1], keys.shape[2]
        causal = torch.arange(width) <= past + torch.arange(s)[:, None]  # [S, C]
        allowed = causal.expand(n, s, width)
        if attention_mask is not None:
            allowed = allowed & attention_mask.reshape(n, -1)[:, None, :width].bool()
        out = attend(q[:n], keys, values, allowed)
        if packed is not None:  # T more one-token queries, each over its own row
            rows, row_allowed, *_ = packed  # (RowRuns, the grouping, unused here)
            cols = row_allowed.shape[1]
            extra = attend(
                q[n:], keys[rows, :, :cols], values[rows, :, :cols], row_allowed[:, None]
            )
            out = torch.cat([out, extra])
        return x + self.out(out)

    def compiled_hidden_states(self, *args: object) -> Tensor | None:
        return None


def attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """``[B, 1, S, H]`` queries over ``[B, 1, C, H]`` keys where ``allowed [B, S, C]``."""
    scores = (q @ k.transpose(-1, -2))[:, 0] * HIDDEN**-0.5
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return scores.softmax(-1) @ v[:, 0]


class StubHead:
    refused_mask = None

    def __init__(self) -> None:
        self.linear = nn.Linear(HIDDEN, VOCAB)

    def next_token_logits(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden).float()


def make_engine() -> tuple[RolloutEngine, StubTrunk]:
    trunk = StubTrunk()
    return RolloutEngine(trunk, StubHead(), SamplingSettings()), trunk


def teacher_forced(engine: RolloutEngine, text: list[int], action: int) -> float:
    """The log-prob of ``action`` after ``text``, from one uncached pass of the trunk."""
    ids = torch.tensor([text])
    with torch.no_grad():
        hidden = engine.trunk.hidden_states(ids, None, torch.arange(len(text))[None])
        logits = engine.head.next_token_logits(hidden[:, -1])
    return float(logits.log_softmax(-1)[0, action])


class Rows:
    """An env-like buffer: each row's prompt left-padded to ``width``, then its
    completion; ``texts`` holds each row's real tokens."""

    def __init__(self, prompts: list[list[int]], width: int = 6, budget: int = 8) -> None:
        self.width = width
        self.ids = torch.full((len(prompts), width + budget), PAD)
        self.mask = torch.zeros_like(self.ids, dtype=torch.bool)
        self.texts: list[list[int]] = [[] for _ in prompts]
        for row, prompt in enumerate(prompts):
            self.reset(row, prompt)

    def reset(self, row: int, prompt: list[int]) -> None:
        self.ids[row], self.mask[row] = PAD, False
        self.ids[row, self.width - len(prompt) : self.width] = torch.tensor(prompt)
        self.mask[row, self.width - len(prompt) : self.width] = True
        self.texts[row] = list(prompt)

    def append(self, row: int, token: int) -> None:
        col = self.width + len(self.texts[row]) - int(self.mask[row, : self.width].sum())
        self.ids[row, col], self.mask[row, col] = token, True
        self.texts[row].append(token)

    def obs(self) -> dict[str, Tensor]:
        return {"input_ids": self.ids.clone(), "attention_mask": self.mask.clone()}


def step_and_check(
    engine: RolloutEngine,
    rows: Rows,
    state: PolicyState | None,
    live: list[int],
    seed: int,
    **act: Tensor,
) -> PolicyState:
    """One ``act``: each ``live`` row's sampler log-prob equals teacher forcing on its
    text, and the row appends its action. (A row that stopped is fed its last token
    again, masked out: what it samples is never used.)"""
    actions, logprobs, state = engine.act(
        rows.obs(), state, generator=torch.Generator().manual_seed(seed), **act
    )
    for row in live:
        expected = teacher_forced(engine, rows.texts[row], int(actions[row]))
        assert abs(float(logprobs[row]) - expected) < 1e-5, (row, rows.texts[row])
        rows.append(row, int(actions[row]))
    return state


def test_cached_steps_equal_teacher_forcing_and_fill_one_slot_column_per_step():
    engine, trunk = make_engine()
    rows = Rows([[3, 4], [5, 6, 7, 8], [9], [2, 3, 4]])
    state = step_and_check(engine, rows, None, live=[0, 1, 2, 3], seed=0)
    assert is_slot_cache(state.cache) and state.cols is None
    assert state.cache_mask.sum(1).tolist() == [2, 4, 1, 3]  # the prompts' real tokens
    assert state.positions.tolist() == [2, 4, 1, 3]
    for step in range(1, 5):
        live = [1, 2, 3] if step > 1 else [0, 1, 2, 3]  # row 0 stops after 2 tokens
        state = step_and_check(engine, rows, state, live, seed=step)
    # Every cache holds its row's real tokens: all of the stopped row's, the others'
    # but the action just appended.
    fed = [len(rows.texts[0])] + [len(t) - 1 for t in rows.texts[1:]]
    assert state.cache_mask.sum(1).tolist() == fed
    assert trunk.passes == [4, 4, 4, 4, 4]


def test_a_group_prefills_once_and_its_rows_then_sample_their_own_tokens():
    engine, trunk = make_engine()
    rows = Rows([[3, 4, 5]] * 3 + [[6, 7]] * 2)
    groups = torch.tensor([0, 0, 0, 1, 1])
    state = step_and_check(engine, rows, None, [0, 1, 2, 3, 4], seed=0, group_ids=groups)
    assert trunk.passes == [2]  # one prefill row per group
    for step in range(1, 4):
        state = step_and_check(engine, rows, state, [0, 1, 2, 3, 4], seed=step)
    assert len({tuple(t) for t in rows.texts[:3]}) > 1  # the copies drew independently


def test_restarted_rows_are_packed_into_the_decode_step_of_the_others():
    engine, trunk = make_engine()
    rows = Rows([[3, 4], [5, 6, 7], [9, 2], [4]])
    state = None
    for step in range(3):
        state = step_and_check(engine, rows, state, [0, 1, 2, 3], seed=step)
    rows.reset(1, [8, 7, 6, 5])
    rows.reset(3, [2, 2])
    starts = torch.tensor([False, True, False, True])
    del trunk.passes[:]
    state = step_and_check(engine, rows, state, [0, 1, 2, 3], seed=3, episode_starts=starts)
    assert trunk.passes == [4 + 6]  # 4 rows' new tokens + the 6 tokens of new text
    # The restarted rows' text sits in their own first 6 slot columns (where the env
    # shows it), their old columns masked out; each row now writes its own column.
    assert state.cols is not None and state.cols.tolist() == [9, 6, 9, 6]
    assert state.cache_mask[1].nonzero().squeeze(1).tolist() == [2, 3, 4, 5]
    assert state.cache_mask[3].nonzero().squeeze(1).tolist() == [4, 5]
    assert state.positions.tolist() == [len(t) - 1 for t in rows.texts]
    for step in range(4, 7):
        state = step_and_check(engine, rows, state, [0, 1, 2, 3], seed=step)


def test_the_policy_delegates_to_its_engine_and_a_copy_gets_its_own(make_env, policy):
    """``act`` and the sampling fields go through the policy's engine; a setting is
    a new checked record; a frozen copy's engine drives the copy, not the original."""
    assert policy.engine.trunk is policy.trunk and policy.engine.head is policy
    before = policy.sampling
    policy.top_k = 3
    assert policy.sampling == SamplingSettings(before.temperature, 3, before.top_p)
    assert before.top_k is None  # the old record is untouched
    with pytest.raises(ValueError, match="temperature=-1: must be a finite number >= 0"):
        policy.temperature = -1
    assert policy.sampling.top_k == 3  # a refused value changes nothing
    policy.top_k = None
    ref = frozen_copy(policy)
    assert ref.engine.head is ref and ref.engine.trunk is ref.trunk
    assert ref.trunk.model is ref.model and ref.model is not policy.model
    env = make_env(prompts=["ab"], num_prompts=1, group_size=2, max_new_tokens=3)
    obs, _ = env.reset(seed=0)
    noted = []
    policy.act = lambda *a, **k: noted.append(1) or policy.engine.act(*a, **k)
    policy.act(obs)
    del policy.act  # a wrapper set on one policy comes off again
    assert noted == [1] and policy.act(obs)[0].shape == (2,)
