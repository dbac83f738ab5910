"""The compiled decode step: its attention, its read width, its guard shortcut, its fallback.

The rollout equality tests (sampler log-probs equal teacher forcing) run in every
decode mode through the ``decode`` fixture (tests/policy/conftest.py).
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from lmgym.policy import CausalLMPolicy, compiled_decode, make_tiny_lm, make_tiny_model, save_tiny
from lmgym.policy.compiled_decode import row_runs, slot_attention
from lmgym.rollout import ContinuousCollector, collect


def teacher_forced_gap(policy, batch) -> float:
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, _ = policy.logprobs(ids, mask, batch.max_new_tokens)
    return ((lp - batch.sampler_logprobs) * batch.completion_mask).abs().max().item()


@pytest.fixture
def step_calls(monkeypatch) -> list[tuple[str, tuple[torch.Size, ...] | None]]:
    """Run the step uncompiled and record every call: ``("plain", shapes)`` or
    ``("packed", None)``."""
    calls: list[tuple[str, tuple[torch.Size, ...] | None]] = []

    def recording(mode, packed=False):
        def step(trunk, input_ids, attention_mask, position_ids, cache, cache_kwarg, packed):
            # A packed step's inputs change with the restarted rows' text.
            kind = "plain" if packed is None else "packed"
            widths = {layer.key_slots.shape for layer in cache.layers}
            shapes = (input_ids.shape, attention_mask.shape, position_ids.shape, *widths)
            calls.append((kind, shapes if packed is None else None))
            return compiled_decode._step(
                trunk, input_ids, attention_mask, position_ids, cache, cache_kwarg, packed
            )

        return step

    monkeypatch.setattr(compiled_decode, "compile_step", recording)
    return calls


@pytest.mark.parametrize("seq_len", [1, 3])
def test_slot_attention_equals_sdpa_with_grouped_heads_and_a_mask(seq_len):
    gen = torch.Generator().manual_seed(0)
    n, heads, kv_heads, cols, dim = 3, 4, 2, 7, 8
    query = torch.randn(n, heads, seq_len, dim, generator=gen)
    key = torch.randn(n, kv_heads, cols, dim, generator=gen)
    value = torch.randn(n, kv_heads, cols, dim, generator=gen)
    mask = torch.rand(n, 1, seq_len, cols, generator=gen) > 0.4
    mask[..., 0] = True  # every query reads at least one column
    out, weights = slot_attention(None, query, key, value, mask, scaling=0.3)
    # Query head h reads key/value head h // 2 (transformers' repeat_kv order).
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(2, dim=1),
        value.repeat_interleave(2, dim=1),
        attn_mask=mask,
        scale=0.3,
    )
    assert weights is None
    assert out.shape == (n, seq_len, heads, dim)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_slot_attention_reads_only_the_columns_its_mask_covers():
    # The compiled step hands over the whole slot buffers and a mask as wide as the
    # columns in use: what lies beyond (here NaN) is never read.
    gen = torch.Generator().manual_seed(1)
    n, heads, width, capacity, dim = 3, 2, 5, 9, 4
    query = torch.randn(n, heads, 1, dim, generator=gen)
    key = torch.randn(n, heads, capacity, dim, generator=gen)
    value = torch.randn(n, heads, capacity, dim, generator=gen)
    key[:, :, width:] = value[:, :, width:] = float("nan")
    mask = torch.rand(n, 1, 1, width, generator=gen) > 0.3
    mask[..., 0] = True
    out, _ = slot_attention(None, query, key, value, mask, scaling=0.5)
    expected, _ = slot_attention(
        None, query, key[:, :, :width], value[:, :, :width], mask, scaling=0.5
    )
    assert out.shape == (n, 1, heads, dim) and bool(out.isfinite().all())
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("grouped", [True, False], ids=["by row (eager)", "per query (compiled)"])
def test_packed_queries_read_their_own_rows_as_sdpa_does(grouped):
    # Packed one-token queries (appended text) after N rows' own: runs of one row, a
    # row appearing in two runs, a row with one query; each reads its row's columns
    # where allowed, exactly as one SDPA call per query over that row would.
    gen = torch.Generator().manual_seed(2)
    n, heads, kv_heads, cols, dim = 3, 4, 2, 6, 8
    rows = torch.tensor([0, 0, 0, 2, 1, 1, 2])
    t = rows.shape[0]
    query = torch.randn(n + t, heads, 1, dim, generator=gen)
    key = torch.randn(n, kv_heads, cols, dim, generator=gen)
    value = torch.randn(n, kv_heads, cols, dim, generator=gen)
    mask = torch.rand(n, 1, 1, cols, generator=gen) > 0.3
    allowed = torch.rand(t, cols, generator=gen) > 0.4
    mask[..., 0] = allowed[:, 0] = True
    packed = (rows, allowed, row_runs(rows)) if grouped else (rows, allowed)
    out, _ = slot_attention(None, query, key, value, mask, scaling=0.3, lmgym_packed=packed)
    assert out.shape == (n + t, 1, heads, dim)
    for i in range(t):
        expected = torch.nn.functional.scaled_dot_product_attention(
            query[n + i : n + i + 1],
            key[rows[i : i + 1]].repeat_interleave(2, dim=1),
            value[rows[i : i + 1]].repeat_interleave(2, dim=1),
            attn_mask=allowed[i].view(1, 1, 1, cols),
            scale=0.3,
        )
        torch.testing.assert_close(out[n + i], expected.transpose(1, 2)[0], atol=1e-6, rtol=1e-5)


def test_row_runs_group_consecutive_queries_of_one_row():
    runs = row_runs(torch.tensor([0, 0, 0, 2, 1, 1, 2]))
    assert runs.rows.tolist() == [0, 2, 1, 2] and runs.longest == 3
    assert runs.run_of.tolist() == [0, 0, 0, 1, 2, 2, 3]
    assert runs.within.tolist() == [0, 1, 2, 0, 0, 1, 0]


def test_slot_attention_refuses_what_it_does_not_apply():
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="lmgym_slots attention does not apply"):
        slot_attention(None, q, k, k, None, sliding_window=2)
    with pytest.raises(NotImplementedError, match="does not apply dropout"):
        slot_attention(None, q, k, k, None, dropout=0.1)


def test_every_decode_step_reads_the_columns_in_use(
    make_env, make_eos_policy, tokenizer, step_calls
):
    # Rows stop at different steps (synchronous) and restart at different steps
    # (continuous): the step takes the same slot buffers every time and a mask as
    # wide as the columns in use, one more each step (on CPU the compiled graph's
    # width is symbolic: one graph serves every step; steps that pack restarted
    # rows' text have a dynamic-shape graph of their own).
    policy = make_eos_policy(tokenizer, compile_decode=True)
    env = make_env(prompts=["ab", "hello there", "x"], num_prompts=3, group_size=2)
    batch = collect(env, policy, seed=0)
    steps = int(batch.lengths.max()) - 1  # every step after the prefill
    assert batch.lengths.min() < batch.lengths.max()
    capacity = env.prompt_width + env.max_new_tokens + 1  # a spare column: width < capacity
    n, first = env.num_envs, env.prompt_width + 1
    assert step_calls == [
        ("plain", ((n, 1), (n, 1, 1, first + k), (n, 1), (n, 4, capacity, 16)))
        for k in range(steps)
    ]
    step_calls.clear()
    env = make_env(
        prompts=["ab", "hello there", "x"],
        num_prompts=3,
        group_size=2,
        max_new_tokens=8,
        autoreset=True,
    )
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(3):
        assert teacher_forced_gap(policy, collector.collect(num_groups=3)) < 1e-4
    plain = [shapes for kind, shapes in step_calls if kind == "plain"]
    assert len(plain) >= 3 and len({(s[0], s[2], s[3]) for s in plain}) == 1
    assert len(step_calls) - len(plain) >= 3  # packed restarts
    assert len(set(collector._state.cols.tolist())) > 1  # rows restarted at different steps


def test_a_failed_compile_warns_once_and_decodes_eagerly(
    make_env, make_eos_policy, tokenizer, monkeypatch
):
    attempts = []

    def failing(mode, packed=False):
        attempts.append(mode)
        raise RuntimeError("no C++ compiler\nsecond line")

    monkeypatch.setattr(compiled_decode, "compile_step", failing)
    policy = make_eos_policy(tokenizer, compile_decode=True)
    env = make_env(prompts=["ab", "hello there", "x"], num_prompts=3, group_size=2)
    message = (
        r"compile_decode: torch.compile of the decode step failed \(RuntimeError: no C\+\+ "
        r"compiler\); decoding eagerly from now on"
    )
    with pytest.warns(RuntimeWarning, match=message):
        batch = collect(env, policy, seed=0)
    assert attempts == [None]  # tried once, on the CPU's default mode
    assert not policy.compile_decode
    assert teacher_forced_gap(policy, batch) < 1e-4
    assert policy.model.config._attn_implementation != "lmgym_slots"  # restored
    collect(env, policy, seed=1)
    assert len(attempts) == 1


def test_compiled_decode_is_off_by_default_and_kept_by_from_pretrained(
    make_env, policy, tmp_path, step_calls
):
    assert not policy.compile_decode
    collect(make_env(), policy, seed=0)
    assert step_calls == []
    path = save_tiny(tmp_path / "tiny", make_tiny_lm(n_layer=1))
    loaded = CausalLMPolicy.from_pretrained(path, compile_decode=True)
    assert loaded.compile_decode and loaded.settings()["compile_decode"] is True
    assert not CausalLMPolicy.from_pretrained(path).settings()["compile_decode"]


@pytest.mark.slow
@torch._dynamo.config.patch(recompile_limit=64)  # other tests compiled the step already
def test_a_few_graphs_serve_every_step_of_synchronous_and_continuous_rollouts(
    make_env, make_eos_policy, tokenizer, monkeypatch
):
    from torch._dynamo.utils import counters

    # The count must be this test's own. Dynamo keeps its graphs, and the sizes it has
    # turned dynamic, per code object (sizes by file, line and name), so another test's
    # graph of the same model could serve these 5 rows and nothing would compile here
    # (it did, after the compiled tests of test_architectures, test_real_model and
    # test_rollout_turns in one process). A renamed copy of the step starts as in a new
    # process; inductor's kernels on disk are still shared.
    step = compiled_decode._step
    copy = types.FunctionType(
        step.__code__.replace(co_name="_step_counted", co_qualname="_step_counted"),
        step.__globals__,
        argdefs=step.__defaults__,
        closure=step.__closure__,
    )
    monkeypatch.setattr(compiled_decode, "_step", copy)
    monkeypatch.setattr(compiled_decode, "_compiled", {})
    prompts = ["ab", "hello there", "x", "q", "xyz"]
    policy = make_eos_policy(tokenizer, compile_decode=True)
    graphs = counters["stats"]["unique_graphs"]
    batch = collect(make_env(prompts=prompts, num_prompts=5, max_new_tokens=10), policy, seed=0)
    assert batch.lengths.min() < batch.lengths.max()
    assert teacher_forced_gap(policy, batch) < 1e-4
    assert counters["stats"]["unique_graphs"] - graphs == 1  # every synchronous step
    env = make_env(prompts=prompts, num_prompts=5, max_new_tokens=10, autoreset=True)
    collector = ContinuousCollector(env, policy, seed=0)
    for _ in range(8):
        assert teacher_forced_gap(policy, collector.collect(num_groups=5)) < 1e-4
    # Packed restarts: one dynamic-shape graph, plus specialisations for a size of 1
    # (one restarted token, or one-column text), each compiled when the draws first
    # make that shape (8 rounds meet them all on this seed).
    compiled = counters["stats"]["unique_graphs"] - graphs
    assert 2 <= compiled <= 4
    for _ in range(4):
        assert teacher_forced_gap(policy, collector.collect(num_groups=5)) < 1e-4
    assert counters["stats"]["unique_graphs"] - graphs == compiled  # no more compiles
    assert policy.compile_decode


@pytest.mark.slow
@torch._dynamo.config.patch(recompile_limit=64)  # other tests compiled the step already
def test_a_rollouts_later_steps_skip_full_guards_yet_run_their_own_graph(
    make_env, tokenizer, monkeypatch
):
    # Two trunks with the same shapes but 1 and 2 layers decode one env in turns
    # (6 rows: a shape no other test compiles). Each rollout's first step evaluates
    # dynamo's guards in full, the later steps only those that tell the graphs apart:
    # each policy must still run its own graph (the other's would drop or miss a
    # layer), match teacher forcing, and sample what it samples with full guards.
    from torch._dynamo import eval_frame

    shortcut: list[bool] = []
    real = compiled_decode._only_differentiating_guards

    @contextlib.contextmanager
    def spy(on: bool):
        with real(on):  # dynamo's stance inside: full guards or only the differentiating
            shortcut.append(eval_frame._stance.skip_guard_eval_unsafe)
            yield

    monkeypatch.setattr(compiled_decode, "_only_differentiating_guards", spy)
    policies = [
        CausalLMPolicy(
            make_tiny_model(len(tokenizer), n_layer=layers, seed=layers),
            tokenizer,
            compile_decode=True,
        )
        for layers in (1, 2)
    ]
    prompts = ["ab", "hello there", "x", "q", "xyz", "mn"]
    env = make_env(prompts=prompts, num_prompts=6, max_new_tokens=6)
    for seed in range(2):
        for policy in policies:
            shortcut.clear()
            batch = collect(env, policy, seed=seed)
            assert shortcut == [False] + [True] * (int(batch.lengths.max()) - 2)
            assert teacher_forced_gap(policy, batch) < 1e-4
            policy.trunk.compiled_decode.skip_guards = False
            full = collect(env, policy, seed=seed)
            policy.trunk.compiled_decode.skip_guards = True
            assert torch.equal(full.completion_ids, batch.completion_ids)
            assert torch.equal(full.sampler_logprobs, batch.sampler_logprobs)
            assert policy.compile_decode


def test_a_step_that_needs_a_new_graph_under_the_shortcut_reruns_with_every_guard(
    make_env, make_eos_policy, tokenizer, monkeypatch
):
    # Under the guard shortcut dynamo refuses to compile, before running anything;
    # the step then runs again with full guards, and compiling stays on.
    from torch._dynamo import eval_frame

    refused = []

    def strict(mode, packed=False):
        def step(*args):
            if eval_frame._stance.skip_guard_eval_unsafe and not refused:
                refused.append(True)
                raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance.")
            return compiled_decode._step(*args)

        return step

    monkeypatch.setattr(compiled_decode, "compile_step", strict)
    policy = make_eos_policy(tokenizer, compile_decode=True)
    env = make_env(prompts=["ab", "hello there", "x"], num_prompts=3, group_size=2)
    batch = collect(env, policy, seed=0)
    assert refused == [True] and policy.compile_decode
    assert teacher_forced_gap(policy, batch) < 1e-4
