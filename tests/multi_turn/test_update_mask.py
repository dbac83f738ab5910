"""The update counts the policy's tokens only: environment tokens get exactly zero
gradient and count in no normaliser and no metric, for every agent of the registry
and every aggregation.

How it is checked without trusting the code under test: the model is a tiny GPT-2
whose attention output and position embeddings are zero, so the log-prob (and value)
at a column depends only on the token before it. Two hand-made multi-turn batches
have the same policy tokens but different observations (other ids, other lengths,
the same last token): an update that reads only the policy's tokens gives them the
same loss, gradient and metrics; one that puts an observation token in a loss term,
a normaliser or a metric does not (the planted-bug test checks the check).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lmgym.agents import ALGORITHMS, Agent
from lmgym.agents.aggregation import AGGREGATION_MODES
from lmgym.envs import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput
from lmgym.policy import CausalLMPolicy, make_tiny_model
from lmgym.policy.value import frozen_copy
from lmgym.types import RolloutBatch

L = 16
PROMPTS = ["ab", "xyz"]

# Completion regions: P policy tokens (lower case, "." = EOS ends a turn), observations
# in brackets. Batch B's observations have other ids and lengths, the same last token.
ROWS_A = ["abc.[pqr]de.", "a.[ss]bbcd.", "abcde.", "c.[pqr]d.[ss]e."]
ROWS_B = ["abc.[uvwxr]de.", "a.[s]bbcd.", "abcde.", "c.[uvr]d.[tuvwxs]e."]
TURN_REWARDS = [[1.0, 2.0], [0.5, -1.0], [3.0], [0.0, 1.0, 2.0]]


class NoReplies:
    """A responder the update never calls (the batches are hand-made), except ReMax's
    greedy rollouts: it ends every episode at its first turn."""

    role = "user"

    def start(self, episodes: EpisodeStart) -> list[Any]:
        return [None] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        k = turns.rows.numel()
        return TurnOutput([None] * k, [1.0] * k, [True] * k, [None] * k)


def make_env(tokenizer) -> TokenVectorEnv:
    """The env the agents are built for: 2 prompts x 2, multi-turn, budget ``L``."""
    return TokenVectorEnv(
        tokenizer,
        PROMPTS,
        None,
        responder=NoReplies(),
        num_prompts=2,
        group_size=2,
        max_new_tokens=L,
    )


def context_free_policy(tokenizer, model: torch.nn.Module | None = None) -> CausalLMPolicy:
    """A tiny GPT-2 whose hidden state at a column depends on that column's token only.

    The zeroed weights are frozen: their gradients would read the context (the
    attention's output, a position's token) even though their outputs do not.
    ``model``: the tiny GPT-2 to zero (default: ``make_tiny_model`` with seed 4)."""
    if model is None:
        model = make_tiny_model(len(tokenizer), seed=4)
    zeroed = [model.transformer.wpe.weight]
    for block in model.transformer.h:
        zeroed += [block.attn.c_proj.weight, block.attn.c_proj.bias]
    with torch.no_grad():
        for weight in zeroed:
            weight.zero_()
            weight.requires_grad_(False)
    return CausalLMPolicy(model, tokenizer)


def make_batch(tokenizer, rows: list[str]) -> RolloutBatch:
    """4 rows (2 prompts x 2) from the row strings above, padded to ``L``."""

    def tid(ch: str) -> int:
        return tokenizer.eos_token_id if ch == "." else tokenizer.convert_tokens_to_ids(ch)

    ids = torch.full((4, L), tokenizer.pad_token_id)
    policy = torch.zeros(4, L, dtype=torch.bool)
    rewards = torch.zeros(4, L)
    lengths = torch.zeros(4, dtype=torch.long)
    for i, text in enumerate(rows):
        col, in_obs, turn = 0, False, 0
        for ch in text:
            if ch in "[]":
                in_obs = ch == "["
                continue
            ids[i, col], policy[i, col] = tid(ch), not in_obs
            if ch == "." and not in_obs:
                rewards[i, col] = TURN_REWARDS[i][turn]
                turn += 1
            col += 1
        lengths[i] = col
    mask = torch.arange(L)[None, :] < lengths[:, None]
    prompt = torch.tensor([tokenizer.convert_tokens_to_ids(list(p.rjust(3, "a"))) for p in PROMPTS])
    ends = torch.arange(L)[None, :] == (lengths - 1)[:, None]
    return RolloutBatch(
        prompt_ids=prompt.repeat_interleave(2, dim=0),
        prompt_mask=torch.ones(4, 3, dtype=torch.bool),
        completion_ids=ids,
        completion_mask=mask,
        # The sampler's log-probs vary by policy token, the same in both batches.
        sampler_logprobs=torch.where(policy, -1.5 - 0.1 * policy.cumsum(1).float(), 0.0),
        rewards=rewards,
        dones=ends,
        group_ids=torch.tensor([7, 7, 9, 9]),
        prompt_index=torch.tensor([0, 0, 1, 1]),
        lengths=lengths,
        terminated=torch.ones(4, dtype=torch.bool),
        truncated=torch.zeros(4, dtype=torch.bool),
        valid=torch.tensor([True, True, True, False]),
        special_mass=torch.zeros(4),
        policy_mask=policy,
    )


def settings(name: str, aggregation: str) -> dict[str, Any]:
    """Every loss term on: KL (in each agent's placement), entropy, TIS, and two epochs
    of two minibatches so lp_old is recomputed and the ratio moves."""
    extra: dict[str, Any] = {
        "loss_aggregation": aggregation,
        "beta": 0.1,
        "entropy_coef": 0.01,
        "tis_cap": 2.0,
        "max_grad_norm": None,
        "learning_rate": 1e-2,
        "update_epochs": 2,
        "num_minibatches": 2,
        "whiten_advantages": name in ("ppo", "dual_clip_ppo", "vapo", "reinforce_pp"),
    }
    if name == "vapo":
        extra.update(value_warmup_iterations=0, nll_coef=0.5)
    return extra


def cases() -> list[Any]:
    out = []
    for name in ALGORITHMS:
        for aggregation in AGGREGATION_MODES:
            if name == "gspo" and aggregation != "seq-mean-token-mean":
                continue  # GSPO's loss is one term per sequence
            out.append(pytest.param(name, aggregation, id=f"{name}-{aggregation}"))
    return out


class Probe:
    """Keeps the log-probs and entropies of every teacher-forced pass with their
    gradients (``retain_grad``), to read after the update."""

    def __init__(self, policy: CausalLMPolicy, monkeypatch) -> None:
        self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        original = policy.logprobs_from_hidden

        def kept(hidden, input_ids, *args, **kwargs):
            logprobs, entropy = original(hidden, input_ids, *args, **kwargs)
            if logprobs.requires_grad:
                logprobs.retain_grad()
                entropy.retain_grad()
                self.outputs.append((logprobs, entropy))
            return logprobs, entropy

        monkeypatch.setattr(policy, "logprobs_from_hidden", kept)


def update(
    tokenizer, batch: RolloutBatch, name: str, aggregation: str, monkeypatch
) -> tuple[dict[str, float], dict[str, torch.Tensor], Probe]:
    """One update of a fresh agent on ``batch``: its metrics, the gradient of its last
    optimizer step, and what the probe kept."""
    env = make_env(tokenizer)
    policy = context_free_policy(tokenizer)
    agent: Agent = ALGORITHMS[name](
        policy, env, ref_policy=frozen_copy(policy), **settings(name, aggregation)
    )
    probe = Probe(policy, monkeypatch)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same minibatch split for both batches
        metrics = agent.train_on_batch(batch)
    grads = {
        n: p.grad.clone() for n, p in agent.policy.model.named_parameters() if p.grad is not None
    }
    if agent.critic is not None:
        grads.update(
            {
                f"critic.{n}": p.grad.clone()
                for n, p in agent.critic.named_parameters()
                if p.grad is not None
            }
        )
    return metrics, grads, probe


def assert_same_update(a, b) -> None:
    metrics_a, grads_a, _ = a
    metrics_b, grads_b, _ = b
    assert set(metrics_a) == set(metrics_b)
    for key in metrics_a:
        assert math.isclose(metrics_a[key], metrics_b[key], rel_tol=1e-4, abs_tol=1e-6), key
    assert set(grads_a) == set(grads_b) and grads_a
    for key in grads_a:
        torch.testing.assert_close(grads_a[key], grads_b[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize(("name", "aggregation"), cases())
def test_observation_tokens_change_no_loss_gradient_or_metric(
    tokenizer, name, aggregation, monkeypatch
):
    batch_a, batch_b = make_batch(tokenizer, ROWS_A), make_batch(tokenizer, ROWS_B)
    assert not torch.equal(batch_a.completion_mask, batch_b.completion_mask)
    a = update(tokenizer, batch_a, name, aggregation, monkeypatch)
    b = update(tokenizer, batch_b, name, aggregation, monkeypatch)
    assert_same_update(a, b)


def test_observation_tokens_get_exactly_zero_gradient(tokenizer, monkeypatch):
    # Every loss term's gradient at each token, read off the log-probs and entropies of
    # the update's pass: exactly 0 off the loss mask (observation tokens, padding and
    # the masked row), nonzero on it.
    batch = make_batch(tokenizer, ROWS_A)
    env = make_env(tokenizer)
    for name in ALGORITHMS:
        policy = context_free_policy(tokenizer)
        extra = {**settings(name, "token-mean"), "update_epochs": 1, "num_minibatches": 1}
        if name == "gspo":
            extra["loss_aggregation"] = "seq-mean-token-mean"
        agent = ALGORITHMS[name](policy, env, ref_policy=frozen_copy(policy), **extra)
        probe = Probe(policy, monkeypatch)
        masks: list[torch.Tensor] = []
        loss = agent.micro_batch_loss

        def recorded(data, counts, modules, loss=loss, masks=masks):
            masks.append(data.mask)
            return loss(data, counts, modules)

        monkeypatch.setattr(agent, "micro_batch_loss", recorded)
        agent.train_on_batch(batch)
        assert len(probe.outputs) == len(masks) == 1, name
        (logprobs, entropy), mask = probe.outputs[0], masks[0]
        assert not batch.policy_mask.equal(batch.completion_mask)
        assert logprobs.grad[mask].abs().sum() > 0, name
        assert not logprobs.grad[~mask].any(), name
        assert not entropy.grad[~mask].any(), name


def test_a_planted_bug_that_trains_on_observation_tokens_fails_the_check(tokenizer, monkeypatch):
    # The bug: the batch says every completion token is the policy's.
    def planted(rows: list[str]) -> RolloutBatch:
        batch = make_batch(tokenizer, rows)
        fields = {f: getattr(batch, f) for f in RolloutBatch.__dataclass_fields__}
        return RolloutBatch(**{**fields, "policy_mask": batch.completion_mask})

    a = update(tokenizer, planted(ROWS_A), "grpo", "token-mean", monkeypatch)
    b = update(tokenizer, planted(ROWS_B), "grpo", "token-mean", monkeypatch)
    with pytest.raises(AssertionError):
        assert_same_update(a, b)


def test_a_normaliser_that_counts_observation_tokens_fails_the_check(tokenizer, monkeypatch):
    # The bug: token-mean's count also takes in the batch's observation tokens.
    from lmgym.agents import base

    def update_counting_observations(rows: list[str]):
        batch = make_batch(tokenizer, rows)
        observations = int((batch.completion_mask & ~batch.policy_mask).sum())
        honest = base.Counts.of

        def of(mask, group=None):
            counts = honest(mask, group)
            return base.Counts(counts.sequences, counts.tokens + observations, counts.max_len)

        with monkeypatch.context() as patch:
            patch.setattr(base.Counts, "of", of)
            return update(tokenizer, batch, "drgrpo", "token-mean", monkeypatch)

    a = update_counting_observations(ROWS_A)
    b = update_counting_observations(ROWS_B)
    with pytest.raises(AssertionError):
        assert_same_update(a, b)


@pytest.mark.parametrize("autoreset", [False, True])
def test_every_agent_learns_an_iteration_on_a_multi_turn_env(tokenizer, autoreset, make_eos_policy):
    # End to end: collect (synchronous or continuous) -> prepare -> update. Every
    # count is of the policy's tokens: tokens_generated and completion_length.
    from lmgym.rollout import collect

    def policy() -> CausalLMPolicy:  # EOS favoured: turns end within a few tokens
        return context_free_policy(tokenizer, make_eos_policy(tokenizer, 2.0, seed=4).model)

    class Echo(NoReplies):
        def respond(self, turns: TurnInput) -> TurnOutput:
            k = turns.rows.numel()
            done = [t >= 2 for t in turns.turn_index.tolist()]
            return TurnOutput(
                ["ok"] * k, [float(len(t)) for t in turns.turn_texts], done, [None] * k
            )

    for name in ALGORITHMS:
        env = TokenVectorEnv(
            tokenizer, PROMPTS, None, responder=Echo(), num_prompts=2, group_size=2,
            max_new_tokens=L, autoreset=autoreset,
        )  # fmt: skip
        agent = ALGORITHMS[name](policy(), env, max_grad_norm=None)
        metrics = agent.learn(1)[0]
        assert all(math.isfinite(v) for v in metrics.values()), name
        if not autoreset and name != "remax":  # (ReMax also counts its greedy rollouts)
            # The same batch again, from the same seeds, to count its tokens.
            again = TokenVectorEnv(
                tokenizer, PROMPTS, None, responder=Echo(), num_prompts=2, group_size=2,
                max_new_tokens=L,
            )  # fmt: skip
            generator = torch.Generator().manual_seed(0)
            batch = collect(again, policy(), seed=0, generator=generator)
            assert (batch.completion_mask & ~batch.policy_mask).any()  # there were turns
            assert metrics["tokens_generated"] == float(batch.policy_lengths.sum()), name
            assert math.isclose(
                metrics["completion_length"], float(batch.policy_lengths.float().mean())
            ), name
