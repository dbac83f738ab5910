"""CausalLMPolicy: KV-cached sampling equals teacher forcing; loading; sampling filters."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.activations import NewGELUActivation

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TokenVectorEnv
from lmgym.policy import CausalLMPolicy, make_tiny_lm, make_tiny_model, save_tiny
from lmgym.policy.activations import fuse_gelu
from lmgym.policy.kv_slots import slots_capacity, slots_filled
from lmgym.policy.logprobs import token_logprobs
from lmgym.policy.sampling import filter_logits, sample_tokens
from lmgym.rollout import ContinuousCollector, collect


def restarting_env(make_env, max_new_tokens: int, **options):
    """The restart tests' env: prompts of 2, 5 and 3 characters, one row each, rows
    restarting as they end (``autoreset``), with ``options``."""
    return make_env(
        prompts=["ab", "hello", "xyz"],
        num_prompts=3,
        max_new_tokens=max_new_tokens,
        autoreset=True,
        **options,
    )


def assert_as_fresh(policy, obs, sampled, seed: int) -> None:
    """``sampled``, an ``act`` call's ``(actions [N], log-probs [N], ...)`` with its cache
    and a generator seeded ``seed``, is what a fresh prefill of ``obs`` samples under
    the same seed."""
    fresh = policy.act(obs, None, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(sampled[0], fresh[0])
    torch.testing.assert_close(sampled[1], fresh[1], atol=1e-5, rtol=1e-5)


def teacher_forced(policy, batch):
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, _ = policy.logprobs(ids, mask, batch.max_new_tokens)
    return lp * batch.completion_mask


def test_cached_sampler_logprobs_equal_teacher_forced(make_env, make_eos_policy, tokenizer, decode):
    policy = make_eos_policy(tokenizer, compile_decode=decode)
    env = make_env(
        prompts=["ab", "hello there", "x"], num_prompts=3, group_size=4, max_new_tokens=12
    )
    batch = collect(env, policy, seed=0)
    assert batch.lengths.min() < batch.lengths.max()  # ragged: rows stopped at different steps
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4
    assert policy.compile_decode == decode  # no fallback to eager


def test_unpadded_prompts_run_maskless_until_a_row_finishes(make_env, make_eos_policy, tokenizer):
    # Equal-length prompts: the cache starts with no padding, so the model gets no
    # attention mask; once a row stops, its next columns are masked and the mask
    # must come back. Both phases must match teacher forcing.
    policy = make_eos_policy(tokenizer)
    env = make_env(prompts=["abc", "xyz"], num_prompts=2, group_size=4, max_new_tokens=12)
    obs, _ = env.reset(seed=0)
    actions, logprobs, state = policy.act(obs)
    assert not state.padded
    # act runs under inference mode but hands back plain tensors.
    assert not actions.is_inference() and not logprobs.is_inference()
    batch = collect(env, policy, seed=0)
    assert batch.lengths.min() < batch.lengths.max()
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4


def trunk_rows(policy, monkeypatch) -> list[int]:
    """The number of rows of every trunk pass ``policy`` makes from now on."""
    rows: list[int] = []
    forward = policy.trunk.hidden_states

    def spy(input_ids, *args, **kwargs):
        rows.append(input_ids.shape[0])
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(policy.trunk, "hidden_states", spy)
    return rows


def test_group_shared_prompt_pass_matches_the_plain_pass_with_gradients(
    make_env, tokenizer, monkeypatch
):
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=1), tokenizer)
    policy.model.train()
    env = make_env(prompts=["ab", "hello", "xyz"], num_prompts=3, group_size=3, max_new_tokens=6)
    batch = collect(env, policy, seed=0)
    ids, mask = batch.input_ids()
    length = batch.max_new_tokens
    params = [q for q in policy.parameters() if q.requires_grad]
    rows = trunk_rows(policy, monkeypatch)

    shared_lp, _ = policy.logprobs(ids, mask, length, group_ids=batch.group_ids)
    assert rows == [3, 9]  # the 3 groups' prompts once, then the 9 completions
    plain_lp, _ = policy.logprobs(ids, mask, length)
    assert rows[2:] == [9]  # group_ids=None: one plain pass
    m = batch.completion_mask
    assert (shared_lp - plain_lp)[m].abs().max().item() < 1e-5
    shared_grads = torch.autograd.grad((shared_lp * m).sum(), params)
    plain_grads = torch.autograd.grad((plain_lp * m).sum(), params)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_teacher_forced_group_ids_must_name_rows_with_one_prompt(make_env, policy):
    env = make_env(prompts=["ab", "xyz"], num_prompts=2, group_size=2)
    batch = collect(env, policy, seed=0)
    ids, mask = batch.input_ids()
    wrong = torch.zeros_like(batch.group_ids)  # both prompts in one group
    with pytest.raises(ValueError, match=r"group_ids: rows 0 and 2 share group id 0 but not"):
        policy.logprobs(ids, mask, batch.max_new_tokens, group_ids=wrong)


def test_group_prefill_samples_what_a_plain_prefill_samples(make_env, policy, monkeypatch):
    env = make_env(prompts=["ab", "hello", "xyz"], num_prompts=3, group_size=4)
    obs, info = env.reset(seed=0)
    rows = trunk_rows(policy, monkeypatch)
    gen = torch.Generator().manual_seed(5)
    shared = policy.act(obs, generator=gen, group_ids=info["group_id"])
    assert rows == [3]  # one prefill row per group
    plain = policy.act(obs, generator=torch.Generator().manual_seed(5))
    assert rows[1:] == [12]
    assert torch.equal(shared[0], plain[0])
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=1e-5)
    # And the copied caches go on to sample the same next step.
    obs, *_ = env.step(shared[0])
    after = [
        policy.act(obs, s[2], generator=torch.Generator().manual_seed(6)) for s in (shared, plain)
    ]
    assert torch.equal(after[0][0], after[1][0])
    torch.testing.assert_close(after[0][1], after[1][1], atol=1e-5, rtol=1e-5)
    # collect() passes the env's group ids: its first trunk pass is the groups' prompts.
    del rows[:]
    collect(env, policy, seed=0)
    assert rows[0] == 3


def test_prefill_group_ids_on_rows_with_their_own_completions_are_refused(make_env, policy):
    env = make_env(prompts=["ab"], num_prompts=1, group_size=4)
    obs, info = env.reset(seed=0)
    actions, _, _ = policy.act(obs, generator=torch.Generator().manual_seed(0))
    obs, *_ = env.step(actions)
    assert len(set(actions.tolist())) > 1  # the group's rows now differ
    with pytest.raises(ValueError, match=r"group_ids: rows 0 and \d share group id"):
        policy.act(obs, None, group_ids=info["group_id"])  # a mid-episode rebuild


def test_eos_keeps_logprob_and_mask_when_pad_equals_eos(make_env, make_eos_policy):
    tokenizer = make_char_tokenizer(pad_equals_eos=True)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    policy = make_eos_policy(tokenizer)
    env = make_env(
        prompts=["ab", "cd"], num_prompts=2, group_size=4, max_new_tokens=10, tokenizer=tokenizer
    )
    batch = collect(env, policy, seed=0)
    ended = batch.terminated.nonzero().squeeze(1)
    assert ended.numel() > 0
    last = batch.lengths[ended] - 1
    assert (batch.completion_ids[ended, last] == tokenizer.eos_token_id).all()
    assert batch.completion_mask[ended, last].all()
    assert (batch.sampler_logprobs[ended, last] < 0).all()  # a real log-prob, not masked to 0
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4


def test_continuous_batching_logprobs_equal_teacher_forced(
    make_env, make_eos_policy, tokenizer, decode
):
    policy = make_eos_policy(tokenizer, compile_decode=decode)
    env = make_env(
        prompts=["ab", "xyz", "q"], num_prompts=2, group_size=3, max_new_tokens=8, autoreset=True
    )
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(2):
        batch = collector.collect(num_groups=3)
        assert batch.batch_size == 9
        _, counts = torch.unique(batch.group_ids, return_counts=True)
        assert (counts == 3).all()
        diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
        assert diff < 1e-4
    assert policy.compile_decode == decode


def test_continuous_collector_keeps_its_cache_until_the_weights_change(
    make_env, make_eos_policy, tokenizer, monkeypatch
):
    policy = make_eos_policy(tokenizer)
    env = make_env(
        prompts=["ab", "xyz"], num_prompts=2, group_size=2, max_new_tokens=8, autoreset=True
    )
    collector = ContinuousCollector(env, policy, seed=0)
    prefills = []
    original = policy.engine._prefill
    monkeypatch.setattr(policy.engine, "_prefill", lambda *a: prefills.append(1) or original(*a))
    collector.collect(num_groups=2)
    assert len(prefills) == 1
    batch = collector.collect(num_groups=2)  # same weights: the in-flight cache is reused
    assert len(prefills) == 1
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4
    with torch.no_grad():
        next(policy.parameters()).mul_(1.01)  # an optimizer step would do the same
    collector.collect(num_groups=2)
    assert len(prefills) == 2


def test_group_samples_are_drawn_independently(make_env, policy):
    env = make_env(prompts=["ab"], num_prompts=1, group_size=16, max_new_tokens=4)
    batch = collect(env, policy, seed=0)
    # A sampler that drew once per prompt and copied it would give 1 distinct row.
    assert len({tuple(r) for r in batch.completion_ids.tolist()}) > 12
    assert len(set(batch.completion_ids[:, 0].tolist())) > 5


def test_from_pretrained_round_trips_a_local_directory(tmp_path):
    path = save_tiny(tmp_path / "tiny", make_tiny_lm(n_layer=1, seed=3))
    loaded = CausalLMPolicy.from_pretrained(path)
    tokenizer = make_char_tokenizer()
    reference = make_tiny_model(
        len(tokenizer),
        n_layer=1,
        seed=3,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    assert loaded.tokenizer.get_vocab() == tokenizer.get_vocab()
    ids = torch.tensor([tokenizer("hello", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, reference(ids).logits)
    assert isinstance(AutoModelForCausalLM.from_pretrained(path), type(reference))


def test_from_pretrained_passes_the_class_settings_and_names_an_unknown_one(tmp_path):
    path = save_tiny(tmp_path / "tiny", make_tiny_lm(n_layer=1))
    loaded = CausalLMPolicy.from_pretrained(path, temperature=0.5, top_k=3, top_p=0.9)
    assert (loaded.temperature, loaded.top_k, loaded.top_p) == (0.5, 3, 0.9)
    with pytest.raises(TypeError, match=r"from_pretrained: unknown setting\(s\) \['temprature'\]"):
        CausalLMPolicy.from_pretrained(path, temprature=0.5)


@pytest.mark.parametrize("chunk_size", [2, None])  # several chunks (recomputed) / one chunk
def test_chunked_logprobs_match_a_full_log_softmax_with_gradient(chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    targets = torch.randint(0, 11, (3, 7))
    full = (hidden @ weight.T / 0.7).log_softmax(-1)
    expected = full.gather(-1, targets[..., None]).squeeze(-1)
    expected_entropy = -(full.exp() * full).sum(-1)
    lp, ent = token_logprobs(hidden, weight, None, targets, temperature=0.7, chunk_size=chunk_size)
    torch.testing.assert_close(lp, expected)
    torch.testing.assert_close(ent, expected_entropy)
    g_chunked = torch.autograd.grad(lp.sum() + ent.sum(), (hidden, weight))
    g_full = torch.autograd.grad(expected.sum() + expected_entropy.sum(), (hidden, weight))
    for a, b in zip(g_chunked, g_full, strict=True):
        torch.testing.assert_close(a, b)


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept_k = torch.isfinite(filter_logits(logits, 1.0, top_k=2, top_p=None))
    assert kept_k.tolist() == [[True, True, False, False]]
    # Mass before the 3rd id is 0.8 >= 0.7: dropped; before the 2nd it is 0.5 < 0.7: kept.
    kept_p = torch.isfinite(filter_logits(logits, 1.0, top_k=None, top_p=0.7))
    assert kept_p.tolist() == [[True, True, False, False]]
    gen = torch.Generator().manual_seed(0)
    actions, lp = sample_tokens(logits.expand(500, 4), top_p=0.7, generator=gen)
    assert set(actions.tolist()) == {0, 1}
    expected = {0: math.log(0.5 / 0.8), 1: math.log(0.3 / 0.8)}
    for a, value in zip(actions.tolist(), lp.tolist(), strict=True):
        assert value == pytest.approx(expected[a], abs=1e-6)


def test_temperature_scales_the_sampler_logprob():
    logits = torch.tensor([[2.0, 0.0]])
    actions, lp = sample_tokens(
        logits.expand(50, 2), temperature=2.0, generator=torch.Generator().manual_seed(1)
    )
    probs = torch.tensor([1.0, 0.0]).softmax(0)  # softmax(logits / 2)
    assert set(actions.tolist()) == {0, 1}
    torch.testing.assert_close(lp, probs[actions].log())


# ------------------------------------------------------------------ bad input
def test_tokenizer_larger_than_model_vocabulary_is_rejected(tokenizer):
    model = make_tiny_model(len(tokenizer) - 5)
    with pytest.raises(ValueError, match=r"tokenizer has \d+ ids but the model's output layer has"):
        CausalLMPolicy(model, tokenizer)


def test_model_with_larger_embedding_never_samples_extra_ids(make_env, tokenizer):
    model = make_tiny_model(len(tokenizer) + 20)
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tokenizer) :] = 0
        model.get_output_embeddings().weight[len(tokenizer) :, 0] = 1e4  # would dominate
    policy = CausalLMPolicy(model, tokenizer)
    batch = collect(make_env(num_prompts=2, group_size=4), policy, seed=0)
    assert (batch.completion_ids < len(tokenizer)).all()


def test_env_with_another_tokenizer_is_rejected(make_env, policy):
    other = make_char_tokenizer("abcxyz")
    env = make_env(tokenizer=other)
    with pytest.raises(ValueError, match="build the env with the policy's tokenizer"):
        collect(env, policy)


def test_prompt_plus_budget_longer_than_context_is_rejected(tokenizer):
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), n_positions=16), tokenizer)
    env = TokenVectorEnv(tokenizer, ["hello world"], lambda b: [0.0] * len(b), max_new_tokens=8)
    with pytest.raises(ValueError, match=r"11 \+ 8 = 19 exceeds the model's context of 16"):
        collect(env, policy)


def test_bad_sampling_settings(tokenizer):
    model = make_tiny_model(len(tokenizer))
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"temperature={bad}: must be a finite number >= 0"):
            CausalLMPolicy(model, tokenizer, temperature=bad)
    with pytest.raises(TypeError, match="temperature=True: expected a number"):
        CausalLMPolicy(model, tokenizer, temperature=True)
    for bad in (1.5, 0.0, float("nan")):
        with pytest.raises(ValueError, match=rf"top_p={bad}: must be in \(0, 1\]"):
            CausalLMPolicy(model, tokenizer, top_p=bad)
    with pytest.raises(ValueError, match="top_k=-1"):
        CausalLMPolicy(model, tokenizer, top_k=-1)


def test_greedy_sampling_takes_the_argmax_with_its_untempered_logprob():
    logits = torch.tensor([[0.1, 2.0, 1.0, 3.0], [5.0, 1.0, 0.0, 4.0]])
    refused = torch.tensor([False, False, False, True])
    actions, lp = sample_tokens(logits, temperature=0.0, top_k=2, top_p=0.5)
    assert actions.tolist() == [3, 0]
    torch.testing.assert_close(lp, logits.log_softmax(-1)[[0, 1], [3, 0]])
    actions, lp = sample_tokens(logits, temperature=0.0, refused=refused)
    assert actions.tolist() == [1, 0]
    masked = logits.masked_fill(refused, float("-inf")).log_softmax(-1)
    torch.testing.assert_close(lp, masked[[0, 1], [1, 0]])


def test_greedy_policy_is_deterministic_and_matches_teacher_forcing(make_env, tokenizer):
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer, temperature=0)
    env = make_env(prompts=["ab", "xyz"], num_prompts=2, group_size=4, max_new_tokens=6)
    batch = collect(env, policy, seed=0)
    rows = batch.completion_ids.view(2, 4, -1)
    assert (rows == rows[:, :1]).all()  # every row of a group decodes the same
    # Teacher forcing at temperature 0 scores the untempered model, as the sampler did.
    diff = (teacher_forced(policy, batch) - batch.sampler_logprobs).abs().max().item()
    assert diff < 1e-4
    ids, mask = batch.input_ids()
    with torch.no_grad():
        hidden = policy.sequence_hidden(ids, mask, batch.max_new_tokens)
        logits = policy.next_token_logits(hidden)
    logits[..., policy.masked_token_ids] = float("-inf")
    greedy = logits.argmax(-1).masked_fill(~batch.completion_mask, tokenizer.pad_token_id)
    assert torch.equal(batch.completion_ids, greedy)


def test_restarting_some_rows_keeps_the_others_cache_and_matches_a_fresh_prefill(
    make_env, policy, ids
):
    env = restarting_env(make_env, max_new_tokens=6, prompt_order="sequential")
    obs, _ = env.reset(seed=0)
    _, _, state = policy.act(obs)
    obs, *_ = env.step(torch.tensor(ids("aaa")))
    _, _, state = policy.act(obs, state)
    obs, *_ = env.step(torch.tensor([ids("b")[0], 1, ids("c")[0]]))  # row 1 ends (EOS)
    _, _, state = policy.act(obs, state)
    obs, *_ = env.step(torch.tensor(ids("ddd")))  # row 1 restarts on "ab"; others go on
    starts = torch.tensor([False, True, False])
    assert state.cols is None  # no restart yet: every row writes the same column
    kept_columns = slots_filled(state.cache)

    cached = policy.act(
        obs, state, episode_starts=starts, generator=torch.Generator().manual_seed(3)
    )
    assert_as_fresh(policy, obs, cached, seed=3)
    # The restarted row was prefilled alone into its own first slots and writes its
    # next token after them; the others wrote one more column, and their earlier
    # columns are untouched.
    new_state = cached[2]
    new_mask = new_state.cache_mask
    width = env.prompt_width
    assert new_state.cols.tolist() == [kept_columns + 1, width, kept_columns + 1]
    assert slots_filled(new_state.cache) == kept_columns + 1
    assert not new_mask[:, kept_columns + 1 :].any()
    assert new_mask[1, :width].equal(obs["attention_mask"][1, :width])
    assert not new_mask[1, width:].any()
    assert new_mask[[0, 2], :kept_columns].equal(state.cache_mask[[0, 2], :kept_columns])


def test_restarted_rows_text_is_packed_into_the_decode_step(make_env, policy, ids, monkeypatch):
    # Continuous batching: the restarted rows' prompts are fed in the same forward
    # as the other rows' new tokens (one-token inputs after the N rows'), not in a
    # prefill of their own.
    env = restarting_env(make_env, max_new_tokens=2)
    a = torch.tensor(ids("aaa"))
    obs, _ = env.reset(seed=0)
    _, _, state = policy.act(obs)
    obs, *_ = env.step(a)
    _, _, state = policy.act(obs, state)
    obs, _, terminated, truncated, _ = env.step(a)  # every row ends (max_new_tokens)
    _, _, state = policy.act(obs, state)
    obs, *_ = env.step(a)  # next-step autoreset: every row shows a new prompt
    starts = terminated | truncated
    assert starts.all()
    shapes = []
    original = policy.trunk.hidden_states

    def counting(input_ids, *args, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return original(input_ids, *args, **kwargs)

    monkeypatch.setattr(policy.trunk, "hidden_states", counting)
    gen = torch.Generator().manual_seed(0)
    cached = policy.act(obs, state, episode_starts=starts, generator=gen)
    real = int(obs["attention_mask"].sum())
    assert shapes == [(3 + real, 1)]  # one forward: 3 rows' tokens + the prompts' tokens
    monkeypatch.undo()
    assert_as_fresh(policy, obs, cached, seed=0)


# A wide prompt region (max_prompt_length=12 for prompts of <= 5 tokens): restarted
# rows' text is wider than their prompt, and the longest in-flight row changes often.
@pytest.mark.parametrize("max_prompt_length", [None, 12])
def test_many_restarts_change_no_output_and_stay_within_the_observation(
    make_env, policy, max_prompt_length
):
    env = restarting_env(make_env, max_new_tokens=3, max_prompt_length=max_prompt_length)
    obs, _ = env.reset(seed=0)
    state, restarts, shrank = None, 0, False
    starts = restarting = torch.zeros(3, dtype=torch.bool)
    for _ in range(40):
        before = None if state is None else slots_filled(state.cache)
        gen = torch.Generator().manual_seed(1)
        actions, logprobs, state = policy.act(obs, state, episode_starts=starts, generator=gen)
        assert_as_fresh(policy, obs, (actions, logprobs), seed=1)
        # Rows reuse their own first columns: nothing outgrows the observation.
        assert slots_capacity(state.cache) == obs["input_ids"].shape[1]
        restarts += int(starts.sum())
        shrank |= before is not None and slots_filled(state.cache) < before
        obs, _, terminated, truncated, _ = env.step(actions)
        # Next-step autoreset: rows that end now are reset by the next step.
        starts, restarting = restarting, terminated | truncated
    assert restarts > 10 and shrank  # the width in use follows the longest row down


@pytest.mark.parametrize("restart_row", [None, 1])
def test_observations_wider_than_the_first_one_grow_the_slots(policy, ids, restart_row):
    # A caller (not an env) may hand act() ever wider observations: the slots sized
    # from the first one must grow, with or without per-row columns, and change
    # nothing. Each new observation is the last one plus the sampled tokens.
    text = torch.tensor([ids("abcd"), ids("wxyz")])
    state = None
    for step in range(6):
        obs = {"input_ids": text, "attention_mask": torch.ones_like(text, dtype=torch.bool)}
        starts = None
        if restart_row is not None and step == 2:  # that row starts over from a new text
            starts = torch.tensor([i == restart_row for i in range(2)])
        gen = torch.Generator().manual_seed(step)
        actions, logprobs, state = policy.act(obs, state, episode_starts=starts, generator=gen)
        assert_as_fresh(policy, obs, (actions, logprobs), seed=step)
        text = torch.cat([text, actions[:, None]], dim=1)
    assert slots_capacity(state.cache) >= text.shape[1] - 1 > 5  # grew past the first width
    assert (state.cols is None) == (restart_row is None)


def test_fused_gelu_matches_the_composed_one_in_values_and_gradients(tokenizer, tmp_path):
    composed = make_tiny_model(len(tokenizer), seed=2)
    fused = make_tiny_model(len(tokenizer), seed=2)
    assert fuse_gelu(fused) == composed.config.n_layer  # one MLP activation per block
    assert fuse_gelu(fused) == 0  # nothing left to replace
    x = torch.randint(0, len(tokenizer), (3, 7))
    out = [m(input_ids=x).logits for m in (composed, fused)]
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)
    for logits in out:
        logits.logsumexp(-1).sum().backward()
    for (name, a), b in zip(composed.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)
    # The policy fuses by default and can be told not to; the saved config is untouched.
    kept = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer, fused_activations=False)
    assert any(type(m) is NewGELUActivation for m in kept.model.modules())
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer)
    assert not any(type(m) is NewGELUActivation for m in policy.model.modules())
    assert not any(m.training for m in policy.model.modules())  # the new modules stay in eval
    policy.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.activation_function == "gelu_new"


def test_slot_caches_refuse_the_row_edits_of_generate(make_env, policy):
    # transformers' beam search and cropping edit a cache's keys in place; on slots
    # that would leave the buffers and their views out of step, so it must fail loudly.
    obs, _ = make_env().reset(seed=0)
    _, _, state = policy.act(obs)
    with pytest.raises(NotImplementedError, match="SlotLayer is lmgym's rollout cache"):
        state.cache.reorder_cache(torch.arange(obs["input_ids"].shape[0]))
    with pytest.raises(NotImplementedError, match="use a DynamicCache"):
        state.cache.crop(1)


def test_a_nan_weight_in_a_row_no_token_uses_is_refused_as_a_damaged_model(tokenizer):
    """Not as diverged training: the NaN came with the model, before any update."""
    model = make_tiny_model(len(tokenizer) + 3, seed=0)  # 3 padded rows no id reaches
    with torch.no_grad():
        model.get_input_embeddings().weight[len(tokenizer) + 1, 2] = float("nan")
    name = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    message = (
        f"model: {name} holds 1 NaN/inf value(s) (first at row {len(tokenizer) + 1}) before "
        "any training; the model's weight file is damaged or was badly converted"
    )
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CausalLMPolicy(model, tokenizer)
