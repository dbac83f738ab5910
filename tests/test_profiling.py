"""Phase labels: free without a profiler, on every rollout/update phase with one, and
read back as exclusive times per label path."""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from lmgym.profiling import DECODE, PREFILL, TRUNK, phase, phase_times
from lmgym.rollout import ContinuousCollector, collect


def _profiled(fn) -> dict:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return phase_times(prof.events())


def test_phase_is_a_shared_no_op_without_a_profiler():
    assert not torch.autograd._profiler_enabled()
    assert phase(DECODE) is phase(PREFILL)  # one nullcontext, nothing recorded
    with profile(activities=[ProfilerActivity.CPU]):
        assert isinstance(phase(DECODE), record_function)


def test_phase_times_are_exclusive_per_path_and_ignore_other_labels():
    def work() -> None:
        with phase("lmgym.outer"):
            time.sleep(0.03)
            for _ in range(2):
                with phase("lmgym.inner"), record_function("not.ours"):
                    time.sleep(0.02)
        with phase("lmgym.inner"):
            time.sleep(0.01)

    times = _profiled(work)
    assert set(times) == {"lmgym.outer", "lmgym.outer/lmgym.inner", "lmgym.inner"}
    assert times["lmgym.outer"].calls == 1
    assert times["lmgym.outer/lmgym.inner"].calls == 2
    assert times["lmgym.inner"].calls == 1
    # Sleeps are lower bounds; the outer label's own time excludes its two inner ones.
    assert 0.03 <= times["lmgym.outer"].seconds < 0.04 + 0.02
    assert 0.04 <= times["lmgym.outer/lmgym.inner"].seconds < 0.04 + 0.02
    assert 0.01 <= times["lmgym.inner"].seconds < 0.01 + 0.02


def test_a_rollout_and_an_update_show_every_phase(make_env, policy):
    env = make_env(prompts=["ab", "cd"], num_prompts=2, group_size=2, max_new_tokens=3)

    def rollout_and_update() -> None:
        batch = collect(env, policy, seed=0)
        ids, mask = batch.input_ids()
        policy.logprobs(ids, mask, batch.max_new_tokens)

    times = _profiled(rollout_and_update)
    act = "lmgym.collect/lmgym.act"
    expected = {
        "lmgym.collect",
        "lmgym.collect/lmgym.env_reset",
        act,
        f"{act}/lmgym.prefill",
        f"{act}/lmgym.prefill/{TRUNK}",
        f"{act}/lmgym.decode",
        f"{act}/lmgym.decode/{TRUNK}",
        f"{act}/lmgym.lm_head",
        f"{act}/lmgym.sample",
        "lmgym.collect/lmgym.env_step",
        "lmgym.collect/lmgym.env_step/lmgym.reward",
        "lmgym.teacher_forced",
        f"lmgym.teacher_forced/{TRUNK}",
        "lmgym.logprobs",
    }
    assert expected <= set(times), sorted(set(times))
    assert times[f"{act}/lmgym.prefill"].calls == 1
    assert times[f"{act}/lmgym.decode"].calls == times[f"{act}/lmgym.sample"].calls - 1
    assert times["lmgym.collect/lmgym.env_step"].calls == times[f"{act}/lmgym.sample"].calls


def test_continuous_batching_shows_restarts(make_env, make_eos_policy, tokenizer):
    env = make_env(
        prompts=["ab", "cd"], num_prompts=2, group_size=2, max_new_tokens=4, autoreset=True
    )
    collector = ContinuousCollector(env, make_eos_policy(tokenizer), seed=0)
    times = _profiled(lambda: collector.collect(4))
    assert times["lmgym.collect/lmgym.act/lmgym.restart"].calls > 0
    assert "lmgym.collect/lmgym.act/lmgym.restart/lmgym.decode" in times
