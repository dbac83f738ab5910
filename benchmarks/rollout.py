"""Side-by-side rollout benchmarks: lmgym against the usual baselines, in one process.

Two comparisons, each run alternately (A, B, B, A, ...) after a warm-up; the script
reports the median of each side and the ratio of medians.

1. ``collect`` vs ``model.generate``: completion tokens/s of
   ``lmgym.rollout.collect(env, policy)`` against transformers' ``model.generate``
   (``do_sample=True``) on the same tiny GPT-2, the same 64 prompts of exactly 16
   tokens, and 64 new tokens per row (``workloads.RolloutVsGenerate``). Each row runs
   in ``--processes`` fresh processes and reports the median of their ratios.
   ``--compile-decode``: lmgym decodes with ``CausalLMPolicy(compile_decode=True)``
   (compiled during the warm-up; ``generate`` unchanged).

   Equal work. The output layer gets a bias of ``-1e9`` on EOS (``workloads.forbid_token``:
   the tied weight is shared, every other logit unchanged), so EOS, the env's stop id
   and ``generate``'s ``eos_token_id``, is never sampled and both sides make exactly 64
   tokens on every row (asserted), with the stop check live on both. Both sample the
   full distribution at temperature 1 (``generate`` gets ``top_k=0``). lmgym also
   returns the sampler log-prob of every token and runs an all-zero reward model;
   that work is counted against it.

2. Native ``TokenVectorEnv`` vs ``gymnasium.vector.SyncVectorEnv`` over the single
   env, ``lmgym/TargetString-v0`` with ``max_new_tokens=64``: env steps/s with
   pre-generated uniform random legal token ids (EOS among them, so episodes end at random).

   Equal work. The native env is built with ``autoreset=True``, the same next-step
   autoreset as ``SyncVectorEnv``; both get the same actions, and the script checks
   (untimed) that both end the same episodes on the same steps with the same rewards.

Run from the repository root::

    .venv/bin/python benchmarks/rollout.py [--quick] [--wait-idle S] [--out benchmarks/results/rollout.md]
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import gymnasium as gym
import harness as h
import numpy as np
import torch
import workloads as w

from lmgym import TokenVectorEnv

NUM_THREADS = 2
BATCH, PROMPT_TOKENS, NEW_TOKENS = 64, 16, 64
ENV_ID = "lmgym/TargetString-v0"
ENV_MAX_NEW_TOKENS = 64
ROLLOUT_TARGET = {False: 1.0, True: 1.5}  # collect / generate tok/s: eager (issue 7), compiled (18)
ENV_TARGET, ENV_TARGET_N = 20.0, 256  # native / SyncVectorEnv at 256 envs, steps/s


def bench_generate(
    size: str, warmup: int, repeats: int, compile_decode: bool, _: int = 0
) -> h.Comparison:
    start = time.perf_counter()
    model, tok = w.tiny_gpt2(size, n_positions=128)
    w.forbid_token(model, tok.eos_token_id)
    sides = w.RolloutVsGenerate(model, tok, BATCH, PROMPT_TOKENS, NEW_TOKENS,
                                compile_decode=compile_decode)  # fmt: skip
    meter = h.CpuMeter()
    ta, tb = h.alternate(sides.lmgym, sides.generate, warmup, repeats)
    tokens = BATCH * NEW_TOKENS
    name = f"rollout, {w.SIZES[size][0]}, B={BATCH}, {PROMPT_TOKENS}+{NEW_TOKENS} tok"
    rates = tokens / statistics.median(ta), tokens / statistics.median(tb)
    return h.Comparison(name, *rates, repeats, meter.other_load(), time.perf_counter() - start)


def make_native(n: int) -> TokenVectorEnv:
    return gym.make_vec(ENV_ID, num_envs=n, max_new_tokens=ENV_MAX_NEW_TOKENS, autoreset=True)


def make_sync(n: int) -> gym.vector.SyncVectorEnv:
    make = lambda: gym.make(ENV_ID, max_new_tokens=ENV_MAX_NEW_TOKENS)  # noqa: E731
    return gym.vector.SyncVectorEnv([make for _ in range(n)])


def check_same_episodes(n: int, steps: int) -> None:
    """Untimed: with the same actions both envs end the same episodes on the same steps."""
    native, sync = make_native(n), make_sync(n)
    legal = native.legal_token_ids.numpy()  # the env refuses <pad>/<unk> actions
    actions = legal[np.random.default_rng(1).integers(0, legal.size, size=(steps, n))]
    native.reset(seed=0)
    sync.reset(seed=0)
    ended = 0
    for a in actions:
        _, r_n, term_n, trunc_n, _ = native.step(torch.as_tensor(a))
        _, r_s, term_s, trunc_s, _ = sync.step(a)
        assert np.array_equal(term_n.numpy(), term_s) and np.array_equal(trunc_n.numpy(), trunc_s)
        assert np.allclose(r_n.numpy(), r_s)
        ended += int(term_s.sum() + trunc_s.sum())
    assert ended > 0
    sync.close()


def bench_env(n: int, steps: int, warmup: int, repeats: int, _: int = 0) -> h.Comparison:
    start = time.perf_counter()
    native, sync = make_native(n), make_sync(n)
    rng = np.random.default_rng(0)
    # Fresh random actions for each call, pre-generated; both sides see the same stream.
    legal = native.legal_token_ids.numpy()  # the env refuses <pad>/<unk> actions
    calls = [legal[rng.integers(0, legal.size, (steps, n))] for _ in range(warmup + repeats)]
    native.reset(seed=0)
    sync.reset(seed=0)
    i_native, i_sync = iter([torch.as_tensor(a) for a in calls]), iter(calls)

    def runner(env: gym.vector.VectorEnv, actions_iter: object) -> float:
        actions = next(actions_iter)  # type: ignore[call-overload]
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        return time.perf_counter() - start

    meter = h.CpuMeter()
    ta, tb = h.alternate(
        lambda: runner(native, i_native), lambda: runner(sync, i_sync), warmup, repeats
    )
    sync.close()
    name = f"env steps, {ENV_ID}, {n} envs, {steps} steps/call"
    rates = n * steps / statistics.median(ta), n * steps / statistics.median(tb)
    return h.Comparison(name, *rates, repeats, meter.other_load(), time.perf_counter() - start)


def step_profile(size: str, calls: int, compile_decode: bool) -> tuple[h.Phases, dict]:
    """``collect``'s labelled phases under ``torch.profiler`` (inductor's per-kernel
    events on), and ms per decode step: ``generate`` and ``collect`` unprofiled
    (alternated), and the profiled trunk's matmuls (``aten::addmm``/``mm``), compiled
    graph kernels (attention, layer norms, GELU, cache writes) and dynamo guard checks."""
    torch._inductor.config.cpp.enable_kernel_profile = True  # before the first compile
    model, tok = w.tiny_gpt2(size, n_positions=128)
    w.forbid_token(model, tok.eos_token_id)
    sides = w.RolloutVsGenerate(model, tok, BATCH, PROMPT_TOKENS, NEW_TOKENS,
                                compile_decode=compile_decode)  # fmt: skip
    ta, tb = h.alternate(sides.lmgym, sides.generate, 1, calls)
    phases, prof = h.profiled(sides.lmgym, calls)
    ms = 1e3 / NEW_TOKENS  # seconds per call -> ms per decode step
    notes = {"generate (unprofiled)": statistics.median(tb) * ms,
             "collect (unprofiled)": statistics.median(ta) * ms,
             "collect (profiled)": phases["wall"][0] * ms}  # fmt: skip
    for e in prof.events():  # the decode step's trunk only (not the prefill's)
        kind = decode_trunk_kind(e)
        if kind:  # self_cpu_time_total is in microseconds
            name = f"decode trunk: {kind} (profiled)"
            notes[name] = notes.get(name, 0.0) + e.self_cpu_time_total / 1e3 / calls / NEW_TOKENS
    return phases, notes


MATMULS = ("aten::addmm", "aten::mm", "aoti_torch_cpu_addmm_out", "aoti_torch_cpu_mm_out")


def decode_trunk_kind(event: Any) -> str | None:
    """A profiler event inside a decode step's trunk: ``"matmuls"`` (BLAS, called
    from Python or from the compiled graph's C++ wrapper), ``"compiled kernels"``
    (inductor's, named ``graph_*`` with kernel profiling on), ``"guard checks"``
    (dynamo's); ``None`` for anything else or elsewhere."""
    kind = ("matmuls" if event.name in MATMULS else
            "compiled kernels" if event.name.startswith("graph_") else
            "guard checks" if event.name == "TorchDynamo Cache Lookup" else None)  # fmt: skip
    parent = event.cpu_parent
    while kind and parent is not None:
        if parent.name == "lmgym.trunk":
            grand = parent.cpu_parent
            return kind if grand is not None and grand.name == "lmgym.decode" else None
        parent = parent.cpu_parent
    return None


def profile_lines(profiles: dict[str, tuple[h.Phases, dict]], calls: int) -> list[str]:
    return [
        "",
        "## Where a rollout step goes",
        "",
        f"One fresh process per model: `collect` and `generate` alternated unprofiled "
        f"({calls} calls each), then {calls} calls of `collect` under `torch.profiler` "
        "with inductor's per-kernel events. " + h.PHASE_NOTE + " Rows in italics: ms per "
        "decode step (medians); the `decode trunk:` rows split the profiled time inside "
        "the decode step's trunk into BLAS matmuls, the compiled graph's own kernels "
        "(attention over the cache, layer norms, GELU, cache writes) and dynamo's guard "
        "checks before each call.",
        "",
        *h.phase_table(
            {k: p for k, (p, _) in profiles.items()}, {k: n for k, (_, n) in profiles.items()}
        ),  # fmt: skip
    ]


def is_rollout(row: h.Comparison) -> bool:
    return row.name.startswith("rollout")


def verdicts(rows: list[h.Comparison], compiled: bool) -> list[str]:
    target = ROLLOUT_TARGET[compiled]
    decode = "compiled decode: issue 18's target" if compiled else "eager decode: issue 7's target"
    out = []
    for r in rows:
        if is_rollout(r):
            out.append(
                f"- rollout >= {target:.1f}x generate ({decode}), {r.name.split(', ')[1]}: "
                f"{r.ratio:.2f}x -> {h.verdict(r.ratio >= target)}"
            )
        elif f", {ENV_TARGET_N} envs" in r.name:
            out.append(
                f"- native env >= {ENV_TARGET:.0f}x SyncVectorEnv at {ENV_TARGET_N} envs: "
                f"{r.ratio:.1f}x -> {h.verdict(r.ratio >= ENV_TARGET)}"
            )
    return out


def markdown(rows: list[h.Comparison], command: str, elapsed: float, compiled: bool) -> list[str]:
    head = ["benchmark", "unit", "lmgym (median)", "baseline", "baseline (median)", "ratio"]
    cells = []
    for r in rows:
        unit, base = ("completion tok/s", "model.generate") if is_rollout(r) else (
            "env steps/s", "SyncVectorEnv")  # fmt: skip
        cells.append([r.name, unit, f"{r.a:,.0f}", base, f"{r.b:,.0f}", f"{r.ratio:.2f}x",
                      r.repeats, h.load_cell(r.other_load)])  # fmt: skip
    threads, modules = (
        f"torch threads = {NUM_THREADS}",
        ["torch", "transformers", "gymnasium", "lmgym"],
    )
    lines = h.header("Rollout benchmarks", threads, modules, command, compile_decode=compiled)
    lines += [
        f"- run time: {sum(r.seconds for r in rows):.0f} s for the rows kept; {elapsed:.0f} s "
        "in all (incl. the episode check and any waiting for idle CPUs / reruns of disturbed "
        "rows)",
        "- method: both sides in one process, alternated (ABBA) after a warm-up; median of the "
        "repeats; ratio = lmgym median / baseline median (> 1: lmgym faster). Rollout rows run "
        "in several fresh processes: their tok/s columns are medians over processes, the "
        "ratio is the median of the per-process ratios (listed below the table), repeats are "
        "summed; 'other CPU load' = share of the machine's CPUs used by other processes while "
        "that row ran (the worst process). Equal work: see the script's docstring.",
        "",
        *h.table(" | ".join([*head, "repeats", "other CPU load"]), cells, left=2),
        *h.ratios_block(rows),
        *h.targets_section("Targets", verdicts(rows, compiled), rows),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "fewer repeats (smoke run)")
    p.add_argument(
        "--processes", type=h.positive_int, default=5, help="fresh processes per rollout row (5)"
    )
    p.add_argument("--profile", type=h.positive_int, metavar="CALLS",
                   help="also profile CALLS rollouts per model")  # fmt: skip
    h.add_common(p, compile_decode=True)
    args = p.parse_args(argv)
    h.quiet_worker(NUM_THREADS)
    t0 = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, t0)
    lm_warmup, lm_repeats, env_warmup, env_repeats, env_steps = (
        (1, 2, 1, 2, 16) if args.quick else (1, 7, 1, 5, 64)
    )
    rows: list[h.Comparison] = []
    for size in ("small", "large"):
        work = functools.partial(bench_generate, size, lm_warmup, lm_repeats, args.compile_decode)
        runs = h.in_processes(work, args.processes, NUM_THREADS, deadline, f"rollout {size}", True)
        rows.append(h.pool(runs))
        spread = ", ".join(f"{x:.2f}x" for x in rows[-1].process_ratios)
        print(f"{rows[-1].name}: {rows[-1].ratio:.2f}x (per process: {spread})", flush=True)
    check_same_episodes(64, 2 * ENV_MAX_NEW_TOKENS)
    for n in (64, ENV_TARGET_N):
        work = functools.partial(bench_env, n, env_steps, env_warmup, env_repeats)
        rows.append(h.in_processes(work, 1, NUM_THREADS, deadline, f"env {n}")[0])
        print(f"{rows[-1].name}: {rows[-1].ratio:.1f}x", flush=True)
    profiles = {}
    for size in ("small", "large") if args.profile else ():
        work = functools.partial(step_profile, size, args.profile, args.compile_decode)
        profiles[w.SIZES[size][0]] = h.in_fresh_process(work, NUM_THREADS)
    command = h.command_line("rollout.py", argv)
    lines = markdown(rows, command, time.perf_counter() - t0, args.compile_decode)
    h.finish(lines + (profile_lines(profiles, args.profile) if profiles else []), args.out)


if __name__ == "__main__":
    main()
