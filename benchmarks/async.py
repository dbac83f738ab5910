"""Asynchronous actor-learner vs the synchronous loop at equal work on this machine.

Both sides train the same GRPO updates (``--prompts`` prompts x ``--group``
completions x ``--new-tokens`` tokens each; EOS is given probability 0, so every
row runs to the budget) on a GPT-2 of ``--layers`` layers: the synchronous
``collect`` + ``train_on_batch`` loop in one process with 2 torch threads, and
``lmgym.asynchronous.run_async`` with 1 actor + 1 learner process (torchrun, gloo)
of 1 thread each at ``--max-staleness``. Reported: generated tokens/s over the
updates after ``--warmup``, the ratio, the synchronous generation/training split,
and the async idle breakdown (learner waiting for rollouts, actor waiting for
weights). The results file also says what one actor and one learner can reach on
this machine (the synchronous loop also runs at 1 thread) and how throughput should
scale with actors on GPUs, from the measured split.

The default workload (4 prompts x 4 completions x 64 tokens) is one where
generation and training cost about the same at 1 thread, the regime the actor-learner
split is for (language-model RL is usually generation-heavier still); at 8 x 4 x 32
training dominates and the learner bounds the async side (`--prompts 8 --new-tokens 32`).

    .venv/bin/python benchmarks/async.py --out benchmarks/results/async.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import harness as h
import workloads as w


def build_agent(args: argparse.Namespace, process_group: Any = None) -> Any:
    """The GRPO agent both sides train (identical in every process)."""
    return w.grpo_on_gpt2(args.layers, args.width, args.prompts, args.group, args.new_tokens,
                          learning_rate=1e-5, tis_cap=2.0, process_group=process_group)  # fmt: skip


def run_sync(args: argparse.Namespace, out: Path) -> None:
    """The synchronous loop, timing generation and training separately."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    agent = build_agent(args)
    for _ in range(args.warmup):
        agent.step()
    generate = train = 0.0
    tokens = 0
    start = time.perf_counter()
    for _ in range(args.iters):
        t0 = time.perf_counter()
        batch, _ = agent.collect()
        t1 = time.perf_counter()
        agent.train_on_batch(batch)
        agent.iteration += 1
        generate, train = generate + t1 - t0, train + time.perf_counter() - t1
        tokens += int(batch.lengths.sum())
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "tokens": tokens,
        "generate_s": generate,
        "train_s": train,
    }
    out.write_text(json.dumps(result))


def run_async_side(args: argparse.Namespace, out: Path) -> None:
    """One torchrun process of the async side; learner 0 writes the result."""
    import torch
    import transformers

    from lmgym.asynchronous import AsyncConfig, run_async

    torch.set_num_threads(1)
    # Each role on a core of its own, as actors and learners own their devices; left
    # unpinned, the scheduler sometimes stacks both processes (and their gloo threads)
    # on one core and the run-to-run spread grows.
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(os.environ["LOCAL_RANK"]) % len(cores)]})
    transformers.logging.set_verbosity_error()
    marks: list[tuple[float, dict[str, float]]] = []

    def mark(agent, metrics):
        marks.append((time.perf_counter(), dict(metrics)))

    config = AsyncConfig(actors=1, learners=1, max_staleness=args.max_staleness)
    run = run_async(
        lambda role: build_agent(args, role.process_group),
        args.warmup + args.iters,
        config,
        callback=mark,
    )
    if not (run.role.is_learner and run.role.index == 0):
        return
    (t0, m0), (t1, m1) = marks[args.warmup - 1], marks[-1]
    window = marks[args.warmup :]
    seconds = t1 - t0
    result = {
        "seconds": seconds,
        "tokens": m1["tokens_generated"] - m0["tokens_generated"],
        "learner_idle_s": sum(m["learner_idle_s"] for _, m in window),
        "update_s": sum(m["update_s"] for _, m in window),
        "actor_idle_s": m1["actor_idle_s"] - m0["actor_idle_s"],
        "staleness_mean": sum(m["staleness_mean"] for _, m in window) / len(window),
        "mixed_version_fraction": sum(m["mixed_version_fraction"] for _, m in window) / len(window),
    }
    out.write_text(json.dumps(result))


def launch(args: argparse.Namespace, sync_out: Path, one_thread_out: Path, async_out: Path) -> None:
    """Run the synchronous loop at 2 and at 1 thread, then the async side, each in
    fresh processes (after waiting for idle CPUs, if asked); add to each result the
    load of processes outside the run, measured around it."""
    deadline = h.deadline_from(args.wait_idle, time.perf_counter())
    flags = h.forwarded(args, *w.GRPO_OPTIONS, "max_staleness")
    sync = [sys.executable, __file__, *flags, "--worker-sync"]
    runs = [
        partial(
            subprocess.run,
            [*sync, str(out), f"--threads={n}"],
            check=True,
            env=h.worker_env(OMP_NUM_THREADS=str(n)),
        )
        for n, out in ((2, sync_out), (1, one_thread_out))
    ]
    runs.append(partial(h.torchrun, 2, [__file__, "--worker-async", str(async_out), *flags]))
    for run, out in zip(runs, (sync_out, one_thread_out, async_out), strict=True):
        if deadline is not None:
            h.wait_until_idle(deadline)
        meter = h.CpuMeter()  # counts the workers it launches as its own
        run()
        result = json.loads(out.read_text())
        result["other_load"] = meter.other_load()
        out.write_text(json.dumps(result))


def gpu_scaling(sync: dict) -> str:
    """Predicted speed-up over the synchronous loop with A actors and one learner."""
    gen, train = sync["generate_s"], sync["train_s"]
    rows = []
    for actors in (1, 2, 4, 8):
        per_update = max(gen / actors, train)
        rows.append(
            f"| {actors} | {(gen + train) / per_update:.2f}x | "
            f"{'learner' if train >= gen / actors else 'actors'} |"
        )
    return "\n".join(rows)


def overlap_bound(sync: dict, one: dict) -> str:
    """What one actor and one learner of 1 thread each can reach on 2 cores.

    They overlap perfectly at best, so an update costs at least
    ``max(generation_1, training_1)`` (1-thread times) against
    ``generation_2 + training_2`` synchronously at 2 threads: the async side gains only
    where 2 threads speed a phase up by less than 2x.
    """
    g2, t2, g1, t1 = sync["generate_s"], sync["train_s"], one["generate_s"], one["train_s"]
    bound = (g2 + t2) / max(g1, t1)
    balanced = g2 / g1 + t2 / t1  # the bound when the workload makes g1 == t1
    return f"""## What this machine allows

The synchronous loop at 1 thread: generation {g1:.2f} s, training {t1:.2f} s over
the same updates, so 2 threads speed generation up {g1 / g2:.2f}x and training
{t1 / t2:.2f}x. One actor and one learner of 1 thread each overlap perfectly at
best: an update costs at least max(generation, training) at 1 thread, so the async
side can reach at most **{bound:.2f}x** here ({"learner" if t1 >= g1 else "actor"}-bound),
and {balanced:.2f}x for any workload that balances the two (1 / speed-up of
generation + 1 / speed-up of training). On 2 cores the async design gains only
what the second thread fails to give each phase; on GPUs, where actor and learner
each own a device, the bound is the one below."""


def ratio(sync: dict, asyn: dict) -> float:
    """Async over synchronous generated tokens per second."""
    return (asyn["tokens"] / asyn["seconds"]) / (sync["tokens"] / sync["seconds"])


def report(
    args: argparse.Namespace, sync: dict, one: dict, asyn: dict, argv: list[str] | None
) -> str:
    tps = [r["tokens"] / r["seconds"] for r in (sync, asyn)]
    gen_share = sync["generate_s"] / (sync["generate_s"] + sync["train_s"])
    threads = "sync: 1 process x 2 threads; async: 1 actor + 1 learner process x 1 thread"
    command = h.command_line("async.py", argv)
    head = "\n".join(h.header("", threads, ["torch", "transformers"], command)[2:])
    return f"""# Asynchronous actor-learner vs the synchronous loop

{head}
- GRPO (TIS cap 2), GPT-2 {args.layers}L/{args.width}d, {args.prompts} prompts x {args.group}
  completions x {args.new_tokens} tokens per update (EOS unsampleable: equal work);
  {args.iters} updates timed after {args.warmup} warm-up; async at
  max_staleness={args.max_staleness}, stale_policy=wait, in-flight weights, KV cache kept.
- CPU load of processes outside the runs: sync {sync["other_load"]:.0%} (2 threads),
  {one["other_load"]:.0%} (1 thread), async {asyn["other_load"]:.0%} (above 10% the
  numbers are disturbed).

| side | tokens / s | s / update |
|---|---|---|
| synchronous, 1 x 2 threads | {tps[0]:.0f} | {sync["seconds"] / args.iters:.3f} |
| async, 1 actor + 1 learner x 1 thread | {tps[1]:.0f} | {asyn["seconds"] / args.iters:.3f} |

Ratio (async / synchronous tokens per second): **{tps[1] / tps[0]:.2f}x**.

Synchronous split: generation {sync["generate_s"]:.2f} s ({gen_share:.0%}), training
{sync["train_s"]:.2f} s over {args.iters} updates.

Async idle breakdown over the timed window ({asyn["seconds"]:.2f} s): the learner
trained {asyn["update_s"]:.2f} s ({asyn["update_s"] / asyn["seconds"]:.0%}) and waited
for rollouts {asyn["learner_idle_s"]:.2f} s ({asyn["learner_idle_s"] / asyn["seconds"]:.0%});
the actor waited for weights {asyn["actor_idle_s"]:.2f} s
({asyn["actor_idle_s"] / asyn["seconds"]:.0%}). Mean version lag of trained tokens
{asyn["staleness_mean"]:.2f}; rows sampled across a weight change
{asyn["mixed_version_fraction"]:.0%}.

{overlap_bound(sync, one)}

## Expected scaling with actors on GPUs

With one learner and A actors (one GPU each), an update costs about
max(generation / A, training) once max_staleness >= 1 lets them overlap, against
generation + training synchronously. From the synchronous split above (CPU
numbers; on a GPU, generation is usually the larger share, since decoding is
memory-bound and sequential while training is one batched pass):

| actors | speed-up over synchronous | bound by |
|---|---|---|
{gpu_scaling(sync)}

Past A = generation / training the learner is the bottleneck: add learners
(data parallel, ranks [0, L)) rather than actors. Weight publishing adds one
transfer of the parameters per update and actor (NCCL point-to-point on GPUs,
~1 ms per 100M bf16 parameters over NVLink); actors keep decoding meanwhile.
"""


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "2 layers x 96, 3 updates")
    p.add_argument("--worker-sync", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--worker-async", type=Path, help=argparse.SUPPRESS)
    w.add_grpo_options(p, prompts=4, group=4, iters=8, quick_iters=3, new_tokens=64)
    p.add_argument("--max-staleness", type=int, default=1, help="the async side's bound (1)")
    p.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, help="fresh runs of both sides (3, --quick 1)")
    h.add_wait_idle(p)
    args = p.parse_args(argv)
    h.fill_defaults(args, *args.grpo_defaults)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.worker_sync is not None:
        run_sync(args, args.worker_sync)
        return
    if args.worker_async is not None:
        run_async_side(args, args.worker_async)
        return
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp, f"{side}.json") for side in ("sync", "one_thread", "async")]
            launch(args, *outs)
            runs.append([json.loads(p.read_text()) for p in outs])
    ratios = [ratio(sync, asyn) for sync, _, asyn in runs]
    median = sorted(range(len(runs)), key=ratios.__getitem__)[len(runs) // 2]
    text = report(args, *runs[median], argv).rstrip("\n")
    if len(runs) > 1:
        listed = ", ".join(f"{r:.2f}x" for r in ratios)
        text += f"\n\nRatios of the {len(runs)} repeats (fresh processes each): {listed}; the"
        text += " report above is the median one."
    h.finish([text], args.out)


if __name__ == "__main__":
    main()
