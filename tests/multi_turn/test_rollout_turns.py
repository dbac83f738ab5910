"""Rollouts of multi-turn episodes with a tiny GPT-2: the policy's KV cache absorbs
each observation in the decode step after the turn ended (no separate prefill, no
history fed again), and the sampler's cached log-probs equal a teacher-forced pass
over the whole interleaved sequence; the ids trained on are exactly the ids sampled
and appended. Eager and compiled decode, synchronous and continuous collection."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import pytest
import torch
from testkit import collected_and_admission, decode_mode, eos_biased_policy, mistral_policy

from lmgym.agents import GRPO
from lmgym.asynchronous.sampler import AdmissionCollector
from lmgym.asynchronous.transport import pack, unpack
from lmgym.envs import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput
from lmgym.policy import CausalLMPolicy, make_tiny_model
from lmgym.rollout import ContinuousCollector, collect
from lmgym.types import RolloutBatch

REPLIES = ("xy", "hello", "z")


@dataclass
class Replies:
    """Answers turn ``k`` with ``REPLIES[(k - 1) % 3]``, rewards it ``k + len(turn)``
    and ends the episode after ``done_at`` turns."""

    done_at: int = 3
    role: str = "user"
    answered: list[TurnInput] = field(default_factory=list)

    def start(self, episodes: EpisodeStart) -> list[Any]:
        return [0] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        self.answered.append(turns)
        index = turns.turn_index.tolist()
        return TurnOutput(
            observations=[REPLIES[(k - 1) % len(REPLIES)] for k in index],
            rewards=[k + len(text) for k, text in zip(index, turns.turn_texts, strict=True)],
            done=[k >= self.done_at for k in index],
            states=index,
        )


def eos_policy(tokenizer, compile_decode: bool = False, bias: float = 2.0) -> CausalLMPolicy:
    """A tiny GPT-2 whose head favours EOS, so turns end after a few tokens."""
    return eos_biased_policy(tokenizer, bias, seed=3, compile_decode=compile_decode)


@pytest.fixture(params=["eager", "fixed_shape", pytest.param("compiled", marks=pytest.mark.slow)])
def decode(request, monkeypatch) -> Iterator[bool]:
    """``compile_decode`` for the policy; ``fixed_shape`` runs the step the compiler
    would compile as plain Python. A fallback to eager fails a compiled test."""
    yield from decode_mode(request, monkeypatch)


def turn_env(tokenizer, responder: Replies | None = None, **kwargs: Any) -> TokenVectorEnv:
    kwargs.setdefault("max_new_tokens", 28)
    return TokenVectorEnv(
        tokenizer,
        ["ab", "hello", "xyz", "q"],
        None,
        responder=responder if responder is not None else Replies(),
        **kwargs,
    )


def logprob_gap(policy: CausalLMPolicy, batch: RolloutBatch) -> float:
    """Largest |sampler - teacher-forced| log-prob over the batch's policy tokens; the
    teacher-forced pass runs once over the whole sequence (every real token)."""
    ids, attn = batch.input_ids()
    with torch.no_grad():
        teacher, _ = policy.logprobs(ids, attn, batch.max_new_tokens)
    gap = (batch.sampler_logprobs - teacher).abs()
    return float(gap[batch.policy_mask].max())


def check_interleaved(batch: RolloutBatch) -> None:
    """Observation tokens are real, not the policy's, and carry no log-prob or reward;
    several turns happened and every episode ends on a policy token."""
    env_tokens = batch.completion_mask & ~batch.policy_mask
    assert env_tokens.any() and bool((batch.policy_mask <= batch.completion_mask).all())
    assert not batch.sampler_logprobs[env_tokens].any()
    assert not batch.rewards[env_tokens].any()
    last = batch.policy_mask.gather(1, (batch.lengths - 1)[:, None])
    assert bool(last.all())
    assert torch.equal(batch.dones, batch.dones & batch.policy_mask)


class Recording:
    """Wraps ``policy.act``: every step's actions and whether the engine ran a prefill."""

    def __init__(self, policy: CausalLMPolicy, monkeypatch) -> None:
        self.actions: list[torch.Tensor] = []
        self.prefills = 0
        self.appends: list[int] = []
        engine = policy.engine
        act, prefill, append = policy.act, engine._prefill, engine._append

        def recorded_act(*args: Any, **kwargs: Any):
            actions, logprobs, state = act(*args, **kwargs)
            self.actions.append(actions.clone())
            return actions, logprobs, state

        def counted_prefill(*args: Any, **kwargs: Any):
            self.prefills += 1
            return prefill(*args, **kwargs)

        def counted_append(ids, mask, last_col, restart, grown, state):
            self.appends.append(int(grown.sum()))
            return append(ids, mask, last_col, restart, grown, state)

        monkeypatch.setattr(policy, "act", recorded_act)
        monkeypatch.setattr(engine, "_prefill", counted_prefill)
        monkeypatch.setattr(engine, "_append", counted_append)


def test_synchronous_rollout_logprobs_equal_teacher_forcing_across_turns(
    tokenizer, decode, monkeypatch
):
    policy = eos_policy(tokenizer, compile_decode=decode)
    responder = Replies()
    env = turn_env(tokenizer, responder, num_prompts=4)
    record = Recording(policy, monkeypatch)
    batch = collect(env, policy, seed=0)
    check_interleaved(batch)
    assert int(batch.policy_mask.sum()) < int(batch.completion_mask.sum())
    assert logprob_gap(policy, batch) < 1e-4
    # One prefill (the prompts); every observation was absorbed in a decode step.
    assert record.prefills == 1 and sum(record.appends) == sum(
        len(t.rows) for t in responder.answered if t.rows.numel()
    ) - int(batch.terminated.sum())
    assert policy.compile_decode == decode  # no fallback to eager


def test_the_ids_trained_on_are_the_ids_sampled_and_appended(tokenizer, monkeypatch):
    policy = eos_policy(tokenizer)
    env = turn_env(tokenizer, num_prompts=2, group_size=2)
    record = Recording(policy, monkeypatch)
    batch = collect(env, policy, seed=1)
    check_interleaved(batch)
    sampled = torch.stack(record.actions, dim=1)  # [N, steps]
    # Row i's policy tokens, in order, are its first T_i sampled actions...
    steps = batch.policy_lengths
    taken = torch.arange(sampled.shape[1])[None, :] < steps[:, None]
    assert torch.equal(batch.completion_ids[batch.policy_mask], sampled[taken])
    # ...and every observation is the reply's ids, appended as they are.
    for row in range(batch.batch_size):
        mask = batch.policy_mask[row, : batch.lengths[row]]
        runs = torch.nonzero(mask[1:] != mask[:-1]).squeeze(1) + 1
        pieces = torch.tensor_split(batch.completion_ids[row, : batch.lengths[row]], runs)
        observations = [p.tolist() for p in pieces[1::2]]
        expected = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in REPLIES]
        assert observations == expected[: len(observations)]
    # The learner's teacher-forced input is the same sequence.
    agent = GRPO(policy, env)
    ids, _ = batch.input_ids()
    assert torch.equal(agent.prepare(batch).ids, ids)


def test_continuous_rollout_logprobs_equal_teacher_forcing_across_turns(
    tokenizer, decode, monkeypatch
):
    policy = eos_policy(tokenizer, compile_decode=decode)
    env = turn_env(tokenizer, num_prompts=2, group_size=2, autoreset=True)
    record = Recording(policy, monkeypatch)
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(3):
        batch = collector.collect(num_groups=2)
        assert batch.batch_size == 4
        check_interleaved(batch)
        assert logprob_gap(policy, batch) < 1e-4
    assert record.prefills == 1 and sum(record.appends) > 0
    assert policy.compile_decode == decode


def test_a_cache_rebuilt_mid_episode_from_interleaved_text_still_matches(tokenizer):
    policy = eos_policy(tokenizer)
    env = turn_env(tokenizer, num_prompts=2, group_size=2, autoreset=True)
    collector = ContinuousCollector(env, policy, seed=2)
    for _ in range(3):
        # A write to the weights (of the same values) makes the next call rebuild the
        # cache from each row's text, turns and observations included.
        with torch.no_grad():
            next(policy.model.parameters()).mul_(1.0)
        batch = collector.collect(num_groups=1)
        check_interleaved(batch)
        assert logprob_gap(policy, batch) < 1e-4


def test_the_loop_bound_of_collect_ends_every_multi_turn_episode(tokenizer):
    # A policy that ends every turn at once: each step takes its token plus a reply.
    policy = eos_policy(tokenizer, bias=50.0)
    env = turn_env(tokenizer, Replies(done_at=100), num_prompts=4, max_new_tokens=20)
    batch = collect(env, policy, seed=0)
    assert bool((batch.terminated | batch.truncated).all())
    assert int(batch.policy_lengths.max()) < env.max_new_tokens
    assert logprob_gap(policy, batch) < 1e-4


def test_the_actors_sampler_gives_collects_batches_and_stamps_only_sampled_tokens(tokenizer):
    def make() -> tuple[CausalLMPolicy, TokenVectorEnv, torch.Generator]:
        env = turn_env(tokenizer, num_prompts=2, group_size=2)
        return eos_policy(tokenizer), env, torch.Generator().manual_seed(5)

    expected, collector = collected_and_admission(make, batches=2, seed=3)
    env = collector.env
    for version, batch in enumerate(expected):
        assert collector.admit(None) == env.num_envs
        while collector.num_live:
            collector.step(version)
        got = collector.take_groups()
        check_interleaved(got.batch)
        for f in fields(batch):
            assert torch.equal(getattr(got.batch, f.name), getattr(batch, f.name)), f.name
        sampled = got.batch.policy_mask
        assert bool((got.versions[sampled] == version).all())
        assert bool((got.versions[~sampled] == -1).all())  # observations were never sampled
        back = unpack(*pack(got), prompt_width=env.prompt_width)
        assert torch.equal(back.batch.policy_mask, sampled)


def test_rows_admitted_while_others_end_turns_keep_matching_teacher_forcing(tokenizer, monkeypatch):
    policy = eos_policy(tokenizer)
    env = turn_env(tokenizer, num_prompts=2, group_size=2)
    append, both = policy.engine._append, []

    def counted(ids, mask, last_col, restart, grown, state):
        both.append(bool(restart.any()) and bool(grown.any()))
        return append(ids, mask, last_col, restart, grown, state)

    monkeypatch.setattr(policy.engine, "_append", counted)
    collector = AdmissionCollector(env, policy, torch.Generator().manual_seed(1), seed=0)
    collector.admit(None)
    batches = []
    for _ in range(120):
        collector.admit(1)  # one row at a time: restarts packed beside appended turns
        collector.step(version=0)
        done = collector.take_groups()
        if done is not None:
            batches.append(done.batch)
        if len(batches) >= 3:
            break
    assert len(batches) >= 3 and any(both)  # a step packed a restart beside a turn's end
    for batch in batches:
        check_interleaved(batch)
        assert logprob_gap(policy, batch) < 1e-4


def rotary_policy(tokenizer, sliding_window: int | None) -> CausalLMPolicy:
    """A tiny Mistral (rotary positions, grouped KV heads), EOS-biased: the absorbed
    observations' positions must follow the row's exactly. A sliding window gives a
    cache kind lmgym does not move into slots (rebuilt from the text instead)."""
    return mistral_policy(tokenizer, sliding_window, eos_bias=2.0)


@pytest.mark.parametrize("sliding_window", [None, 4])
@pytest.mark.parametrize("autoreset", [False, True])
def test_a_rotary_model_absorbs_observations_at_the_right_positions(
    tokenizer, sliding_window, autoreset
):
    policy = rotary_policy(tokenizer, sliding_window)
    env = turn_env(tokenizer, num_prompts=2, group_size=2, autoreset=autoreset)
    if autoreset:
        collector = ContinuousCollector(env, policy, seed=0)
        batches = [collector.collect(num_groups=2) for _ in range(2)]
    else:
        batches = [collect(env, policy, seed=0)]
    for batch in batches:
        check_interleaved(batch)
        assert logprob_gap(policy, batch) < 1e-4


def test_a_model_exactly_as_long_as_the_env_survives_rows_that_end_at_the_budget_early(
    tokenizer, decode
):
    # GuessNumber's rows run into their budget at different steps (their replies
    # differ); a finished row's dummy input must not ask for position seq_len, which a
    # GPT-2 of n_positions = seq_len does not have (IndexError in its position
    # embedding before the fix).
    import gymnasium as gym

    env = gym.make_vec(
        "lmgym/GuessNumber-v0", num_envs=8, group_size=4, tokenizer=tokenizer
    ).unwrapped
    # One layer: the position embedding is what is under test; a second layer would
    # only double the compiled mode's tracing (4 graphs).
    model = make_tiny_model(len(tokenizer), n_layer=1, n_positions=env.seq_len, seed=0)
    policy = CausalLMPolicy(model, tokenizer, compile_decode=decode)
    batch = collect(env, policy, seed=0)
    assert int((batch.lengths == env.max_new_tokens).sum()) >= 2
    assert logprob_gap(policy, batch) < 1e-4
