"""Side-by-side rollout benchmarks: lmgym against the usual baselines, in one process.

Two comparisons, each run alternately (A, B, B, A, ...) after a warm-up, several
times; the script reports the median of each side and the ratio of medians.

1. ``collect`` vs ``model.generate``: completion tokens/s of
   ``lmgym.rollout.collect(env, policy)`` against transformers' ``model.generate``
   (``do_sample=True``) on the same tiny GPT-2, the same 64 prompts of exactly 16
   tokens, and 64 new tokens per row.

   Equal work. Both sides must generate exactly 64 tokens on every row, with the
   stop check live on both. The model's output layer is replaced by a linear head
   that shares GPT-2's tied weight and adds a bias of 0 everywhere except
   ``-1e9`` on the EOS id, so EOS has probability exactly 0 (``exp`` underflows)
   under either sampler. The env stops on EOS (its default ``stop_token_ids``) and
   ``generate`` gets ``eos_token_id=EOS``; neither ever fires, and the script
   asserts that every row of both sides holds 64 non-EOS tokens. Both sample from
   the full distribution at temperature 1 (``generate`` gets ``top_k=0``, which
   disables its default top-k of 50). lmgym additionally returns the sampler
   log-prob of every token and runs the (trivial, all-zero) reward model; that
   work is counted against lmgym.

2. Native ``TokenVectorEnv`` vs ``gymnasium.vector.SyncVectorEnv`` over the single
   env, ``lmgym/TargetString-v0`` with ``max_new_tokens=64``: env steps/s
   (``num_envs`` x vector steps per second) with pre-generated uniform random
   token ids (no policy; EOS is among them, so episodes end at random).

   Equal work. ``SyncVectorEnv`` autoresets a finished sub-env on the next step
   (``AutoresetMode.NEXT_STEP``); the native env is built with ``autoreset=True``,
   which has the same next-step semantics. Both get the same action stream, and
   the script checks (untimed) that both report identical per-step
   ``terminated``/``truncated`` flags, i.e. that they play the same episodes.

Noise. With 2 torch threads on 2 cores, any other busy process slows a side by
up to 50x (the intra-op threads wait for each other), so every row reports the
share of the CPUs other processes used while it ran and is flagged above 10%.
On a shared machine pass ``--wait-idle SECONDS``: each row then waits for an idle
machine first and is rerun if disturbed, for at most that long in all.

Run from the repository root::

    .venv/bin/python benchmarks/rollout.py [--quick] [--wait-idle S] [--out benchmarks/results/rollout.md]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import transformers

# Make ``import lmgym`` (the repository root) and ``import _common`` (this directory)
# work when the package is not installed (run from a checkout).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402  # noqa: E402
    NOISY,
    CpuMeter,
    add_wait_idle_argument,
    alternate,
    command_line,
    deadline_from,
    in_fresh_process,
    machine_line,
    quiet_worker,
    run_undisturbed,
    utc_now,
    versions_line,
    write_report,
)
from _lm import check_exact, fixed_length_env, forbid_token, generate_exact  # noqa: E402

from lmgym import (  # noqa: E402
    CausalLMPolicy,
    TokenVectorEnv,
    collect,
    make_tiny_lm,
)

NUM_THREADS = 2
BATCH = 64
PROMPT_TOKENS = 16
NEW_TOKENS = 64
ENV_ID = "lmgym/TargetString-v0"
ENV_MAX_NEW_TOKENS = 64
ROLLOUT_TARGET = 1.0  # lmgym collect / generate, tokens/s
ENV_TARGET = 20.0  # native / SyncVectorEnv at 256 envs, steps/s
ENV_TARGET_N = 256


@dataclass
class Row:
    """One line of the results table."""

    name: str
    unit: str
    lmgym: float
    baseline: float
    baseline_name: str
    repeats: int
    other_load: float
    seconds: float = 0.0  # wall time of the run that was kept (set by ``measure``)
    # Per-process ratios when the row was measured in several fresh processes.
    process_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        if self.process_ratios:
            return statistics.median(self.process_ratios)
        return self.lmgym / self.baseline


def combine(rows: list[Row]) -> Row:
    """One row from the same benchmark run in several processes: medians, and the
    median of the per-process ratios."""
    first = rows[0]
    return Row(
        name=first.name,
        unit=first.unit,
        lmgym=statistics.median(r.lmgym for r in rows),
        baseline=statistics.median(r.baseline for r in rows),
        baseline_name=first.baseline_name,
        repeats=sum(r.repeats for r in rows),
        other_load=max(r.other_load for r in rows),
        seconds=sum(r.seconds for r in rows),
        process_ratios=tuple(r.ratio for r in rows),
    )


# ---------------------------------------------------------------- rollout vs generate
def bench_generate(n_layer: int, n_embd: int, warmup: int, repeats: int) -> Row:
    model, tok = make_tiny_lm(n_layer=n_layer, n_embd=n_embd, n_head=4, n_positions=128)
    forbid_token(model, tok.eos_token_id)
    policy = CausalLMPolicy(model, tok)
    env = fixed_length_env(tok, BATCH, PROMPT_TOKENS, NEW_TOKENS)
    # The very prompts the env serves (sequential order: rows 0..63), no padding.
    input_ids = env.prompt_table.ids.clone()
    attention_mask = env.prompt_table.mask.long()
    assert bool(attention_mask.all())
    seeds = iter(range(10_000))

    def run_lmgym() -> float:
        seed = next(seeds)
        start = time.perf_counter()
        batch = collect(env, policy, seed=seed)
        elapsed = time.perf_counter() - start
        assert batch.completion_ids.shape == (BATCH, NEW_TOKENS)
        assert bool((batch.lengths == NEW_TOKENS).all()), "lmgym: a row stopped early"
        assert bool(batch.truncated.all()) and not bool(batch.terminated.any())
        assert torch.equal(batch.prompt_ids, input_ids)
        return elapsed

    def run_generate() -> float:
        torch.manual_seed(next(seeds))
        start = time.perf_counter()
        out = generate_exact(model, input_ids, attention_mask, NEW_TOKENS, tok)
        elapsed = time.perf_counter() - start
        assert out.shape[0] == BATCH
        check_exact(out, PROMPT_TOKENS, NEW_TOKENS, tok)
        return elapsed

    meter = CpuMeter()
    ta, tb = alternate(run_lmgym, run_generate, warmup, repeats)
    tokens = BATCH * NEW_TOKENS
    return Row(
        name=f"rollout, GPT-2 {n_layer}L/{n_embd}d, B={BATCH}, {PROMPT_TOKENS}+{NEW_TOKENS} tok",
        unit="completion tok/s",
        lmgym=tokens / statistics.median(ta),
        baseline=tokens / statistics.median(tb),
        baseline_name="model.generate",
        repeats=repeats,
        other_load=meter.other_load(),
    )


# ------------------------------------------------------------- native vs SyncVectorEnv
def make_native(n: int) -> TokenVectorEnv:
    return gym.make_vec(ENV_ID, num_envs=n, max_new_tokens=ENV_MAX_NEW_TOKENS, autoreset=True)


def make_sync(n: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID, max_new_tokens=ENV_MAX_NEW_TOKENS) for _ in range(n)]
    )


def check_same_episodes(n: int, steps: int) -> None:
    """Untimed: with the same actions both envs end the same episodes on the same steps."""
    native, sync = make_native(n), make_sync(n)
    vocab = native.single_action_space.n
    actions = np.random.default_rng(1).integers(0, vocab, size=(steps, n))
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


def bench_env(n: int, steps: int, warmup: int, repeats: int) -> Row:
    native, sync = make_native(n), make_sync(n)
    vocab = native.single_action_space.n
    rng = np.random.default_rng(0)
    # Fresh random actions for each call, pre-generated; both sides see the same stream.
    calls = warmup + repeats
    np_actions = [rng.integers(0, vocab, size=(steps, n)) for _ in range(calls)]
    torch_actions = [torch.as_tensor(a) for a in np_actions]
    native.reset(seed=0)
    sync.reset(seed=0)
    i_native, i_sync = iter(torch_actions), iter(np_actions)

    def run_native() -> float:
        actions = next(i_native)
        start = time.perf_counter()
        for a in actions:
            native.step(a)
        return time.perf_counter() - start

    def run_sync() -> float:
        actions = next(i_sync)
        start = time.perf_counter()
        for a in actions:
            sync.step(a)
        return time.perf_counter() - start

    meter = CpuMeter()
    ta, tb = alternate(run_native, run_sync, warmup, repeats)
    sync.close()
    return Row(
        name=f"env steps, {ENV_ID}, {n} envs, {steps} steps/call",
        unit="env steps/s",
        lmgym=n * steps / statistics.median(ta),
        baseline=n * steps / statistics.median(tb),
        baseline_name="SyncVectorEnv",
        repeats=repeats,
        other_load=meter.other_load(),
    )


# ----------------------------------------------------------------------------- report
def measure(bench: Callable[[], Row], deadline: float | None) -> Row:
    """Run one benchmark row; with a ``deadline``, wait for idle CPUs first and rerun
    a row that other processes disturbed, until the deadline passes."""

    def run() -> Row:
        start = time.perf_counter()
        row = bench()
        row.seconds = time.perf_counter() - start
        return row

    return run_undisturbed(run, lambda row: row.other_load, deadline, label=lambda row: row.name)


def table(rows: list[Row]) -> str:
    lines = [
        "| benchmark | unit | lmgym (median) | baseline | baseline (median) | ratio | repeats "
        "| other CPU load |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        flag = " (noisy)" if r.other_load > NOISY else ""
        lines.append(
            f"| {r.name} | {r.unit} | {r.lmgym:,.0f} | {r.baseline_name} | {r.baseline:,.0f} "
            f"| {r.ratio:.2f}x | {r.repeats} | {r.other_load:.0%}{flag} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        if r.baseline_name == "model.generate":
            met = r.ratio >= ROLLOUT_TARGET
            out.append(
                f"- rollout >= {ROLLOUT_TARGET:.1f}x generate, {r.name.split(', ')[1]}: "
                f"{r.ratio:.2f}x -> {'MET' if met else 'NOT MET'}"
            )
        elif f", {ENV_TARGET_N} envs" in r.name:
            met = r.ratio >= ENV_TARGET
            out.append(
                f"- native env >= {ENV_TARGET:.0f}x SyncVectorEnv at {ENV_TARGET_N} envs: "
                f"{r.ratio:.1f}x -> {'MET' if met else 'NOT MET'}"
            )
    if any(r.other_load > NOISY for r in rows):
        out.append(
            f"- WARNING: other processes used more than {NOISY:.0%} of the CPUs during a "
            "benchmark (column 'other CPU load'); those figures are unreliable, rerun on "
            "an idle machine"
        )
    return out


def markdown(rows: list[Row], command: str, elapsed: float) -> str:
    return "\n".join(
        [
            "# Rollout benchmarks",
            "",
            f"- date: {utc_now()}",
            machine_line(f"torch threads = {torch.get_num_threads()}"),
            versions_line(["torch", "transformers", "gymnasium", "lmgym"]),
            f"- command: `{command}`",
            f"- run time: {sum(r.seconds for r in rows):.0f} s for the rows kept; "
            f"{elapsed:.0f} s in all (incl. model builds, the episode check, and any "
            "waiting for idle CPUs / reruns of disturbed rows)",
            "- method: both sides in one process, alternated (ABBA) after a warm-up; "
            "median of the repeats; ratio = lmgym median / baseline median (> 1: lmgym "
            "faster). Rollout rows are measured in several fresh processes (absolute "
            "speed moves by up to 30% between processes, for both sides at once): their "
            "tok/s columns are medians over processes, the ratio is the median of the "
            "per-process ratios (listed below the table), repeats are summed; 'other CPU "
            "load' = share of the machine's CPUs used by other processes while that row "
            "ran (the worst process)",
            "",
            table(rows),
            "",
            *[
                f"- {r.name}: per-process ratios "
                + ", ".join(f"{x:.2f}x" for x in r.process_ratios)
                for r in rows
                if r.process_ratios
            ],
            "",
            "Equal work: every rollout row makes exactly 64 tokens per row on both sides "
            "(EOS, the env's stop id and generate's eos_token_id, gets a -1e9 output "
            "bias so it is never sampled; asserted), full-vocabulary sampling at "
            "temperature 1 on both (top_k=0 for generate); lmgym also returns sampler "
            "log-probs and runs an all-zero reward model. The prompts are unpadded, so "
            "both drop the all-ones attention mask (lmgym passes none while no cache "
            "column is masked). Env rows: the "
            "same pre-generated random actions, native env with autoreset=True (next-step "
            "autoreset, as SyncVectorEnv), checked to end the same episodes on the same "
            "steps.",
            "",
            "## Targets",
            "",
            *verdicts(rows),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument(
        "--processes",
        type=int,
        default=5,
        help="fresh processes per rollout row; the row reports the median ratio (default 5)",
    )
    parser.add_argument("--out", type=Path, help="write a Markdown results file here")
    add_wait_idle_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(NUM_THREADS)
    # generate() drops an all-ones attention mask, and GPT-2 then warns whenever a
    # sampled token equals the pad id; harmless here (no prompt is padded).
    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()

    if args.quick:
        lm_warmup, lm_repeats, env_warmup, env_repeats, env_steps = 1, 2, 1, 2, 16
    else:
        lm_warmup, lm_repeats, env_warmup, env_repeats, env_steps = 1, 7, 1, 5, 64
    deadline = deadline_from(args.wait_idle, t0)
    worker_init = functools.partial(quiet_worker, NUM_THREADS)

    rows = []
    for n_layer, n_embd in ((2, 128), (6, 256)):
        bench = functools.partial(bench_generate, n_layer, n_embd, lm_warmup, lm_repeats)
        per_process = [
            measure(functools.partial(in_fresh_process, bench, worker_init), deadline)
            for _ in range(args.processes)
        ]
        rows.append(combine(per_process))
        spread = ", ".join(f"{r:.2f}x" for r in rows[-1].process_ratios)
        print(f"{rows[-1].name}: {rows[-1].ratio:.2f}x (per process: {spread})", flush=True)
    check_same_episodes(64, 2 * ENV_MAX_NEW_TOKENS)
    for n in (64, ENV_TARGET_N):
        bench = functools.partial(bench_env, n, env_steps, env_warmup, env_repeats)
        rows.append(measure(bench, deadline))
        print(f"{rows[-1].name}: {rows[-1].ratio:.1f}x", flush=True)

    elapsed = time.perf_counter() - t0
    print()
    print(table(rows))
    print()
    print("\n".join(verdicts(rows)))
    print(f"\ntotal {elapsed:.0f} s")
    if args.out is not None:
        command = command_line("rollout.py", sys.argv[1:])
        write_report(markdown(rows, command, elapsed), args.out)


if __name__ == "__main__":
    main()
