"""Continuous batching: next-step-autoreset rollouts against episode-synchronous ones.

Completion tokens/s of ``ContinuousCollector`` over ``TokenVectorEnv(...,
autoreset=True)`` (a finished row takes the next prompt while the others go on)
against ``collect`` over the same env with ``autoreset=False`` (every row waits for
the batch's longest), with bimodal completion lengths. Both sides in one process,
alternated (ABBA) after a warm-up; medians; each row in ``--processes`` fresh
processes, reporting the median of their ratios.

Lengths. A tiny GPT-2 gets an untimed fine-tune (``workloads.fine_tune_bimodal``)
so that *short* prompts (16 lowercase letters) are answered with 2 characters + EOS
and *long* ones (16 digits / punctuation marks) never stop before 128 tokens; the 64
prompts (32 of each, unseen in training) are served shuffled, at temperature 1.
``--compile-decode``: lmgym decodes with ``CausalLMPolicy(compile_decode=True)`` on
both sides (compiled while priming).

Equal work. Same model, policy, prompts, 64 rows (``--group-size`` G: 64/G prompts
x G), budget and sampler; the envs differ only in ``autoreset``. A timed sample is
``--calls`` calls of 64 completed episodes per side: ``collect(env, policy,
seed=...)`` vs ``collector.collect(num_groups=64 / G)``; the collector carries
in-flight episodes over between calls, as in training, after ``--prime`` untimed
calls. Tokens/s = completion tokens *produced* in the sample (counted by the env:
a live row's completion grew; padding and the ignored actions of finished or
restarting rows never count) / seconds. Asserted: on the synchronous side that
equals the returned ``batch.lengths.sum()``; on the continuous side the collector's
``tokens_generated``. The continuous side returns whole episodes partly made in
earlier calls, in waves, so returned tokens per call swing; the ratio from
returned tokens over all samples is reported as a cross-check.

Profile (first process, untimed): ``--profile-calls`` calls per side under
``torch.profiler`` (``harness.profile_phases``), plus notes from a wrapper on the
public ``policy.act`` (its inputs and returned state only): KV-cache columns
attention reads per step, rows restarted.

    .venv/bin/python benchmarks/continuous.py --out benchmarks/results/continuous.md
    .venv/bin/python benchmarks/continuous.py --quick   # smoke run, < 1 min
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import torch
import workloads as w
from torch import Tensor

from lmgym import CausalLMPolicy, ContinuousCollector, collect

NUM_THREADS, NUM_ENVS, PROMPT_TOKENS, NEW_TOKENS = 2, 64, 16, 128
SHORT_UNDER = 8  # "stopped within a few tokens": length < 8
TARGET = 2.0  # continuous / synchronous, completion tokens/s (issue 18)
FINETUNE_STEPS = {"small": 200, "large": 120}  # models: workloads.SIZES, 160 positions


@dataclass
class Sample:
    """One timed sample of one side: ``--calls`` consecutive calls."""

    seconds: float
    produced: int  # completion tokens written into live rows during the sample
    returned: int  # completion tokens of the episodes the calls returned
    steps: int  # env steps
    lengths: Tensor  # [episodes] completion lengths of the returned episodes
    short: Tensor  # [episodes] bool: the episode's prompt is of the short kind


def rate(samples: list[Sample], key: str = "produced") -> float:
    """Tokens (``produced`` or ``returned``) per second over all samples."""
    return sum(getattr(s, key) for s in samples) / sum(s.seconds for s in samples)


def median_rate(samples: list[Sample]) -> float:
    """The median over samples of tokens produced per second: the headline figure."""
    return statistics.median(s.produced / s.seconds for s in samples)


@dataclass
class Run:
    """One process's measurement of one model: both sides' samples, the load, and (first
    process only) the profile and its notes."""

    sync: list[Sample]
    cont: list[Sample]
    other_load: float
    profile: dict[str, h.Phases] = field(default_factory=dict)
    notes: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return median_rate(self.cont) / median_rate(self.sync)


@contextlib.contextmanager
def noting(policy: CausalLMPolicy, notes: dict[str, list[float]]) -> Iterator[None]:
    """Wrap the public ``policy.act`` (an instance attribute; removed after) to note the
    cache columns attention reads after each step and the rows of each restart."""
    act = policy.act

    def act_noted(obs: dict, state: Any = None, episode_starts: Any = None, **kw: Any) -> Any:
        if state is not None and episode_starts is not None and bool(episode_starts.any()):
            mask = obs["attention_mask"][episode_starts.to(obs["attention_mask"].device)]
            notes["restarted rows"].append(mask.shape[0])
        out = act(obs, state, episode_starts, **kw)
        notes["cache columns read"].append(out[2].cache.layers[0].keys.shape[-2])
        return out

    policy.act = act_noted  # type: ignore[method-assign]
    try:
        yield
    finally:
        del policy.act


def bench(path: Path, args: argparse.Namespace, process: int) -> Run:
    """Load the fine-tuned policy, build both envs, prime the collector, alternate."""
    policy = CausalLMPolicy.from_pretrained(path, temperature=1.0, top_k=None, top_p=None,
                                            compile_decode=args.compile_decode)  # fmt: skip
    prompts, is_short = w.bimodal_prompts(NUM_ENVS // 2, PROMPT_TOKENS)
    g = args.group_size
    kwargs = dict(num_prompts=NUM_ENVS // g, group_size=g, max_new_tokens=NEW_TOKENS)
    envs = {
        side: w.CountingEnv(policy.tokenizer, prompts, w.ZeroReward(), autoreset=side == "continuous",
                          prompt_order="shuffle", **kwargs)
        for side in ("synchronous", "continuous")
    }  # fmt: skip
    collector = ContinuousCollector(envs["continuous"], policy, seed=0)
    for _ in range(args.prime):
        collector.collect(NUM_ENVS // g)
    w.check_compiled(policy, args.compile_decode)
    seeds = iter(range(1, 1_000_000))
    calls: dict[str, Callable[[], Any]] = {
        "synchronous": lambda: collect(envs["synchronous"], policy, seed=next(seeds)),
        "continuous": lambda: collector.collect(NUM_ENVS // g),
    }
    kept: dict[str, list[Sample]] = {"synchronous": [], "continuous": []}

    def run(side: str) -> float:
        env, counted = envs[side], collector.tokens_generated
        written, steps = int(env.written), env.steps
        start = time.perf_counter()
        batches = [calls[side]() for _ in range(args.calls)]
        seconds = time.perf_counter() - start
        lengths = torch.cat([b.lengths for b in batches])
        assert lengths.numel() == args.calls * NUM_ENVS, f"{side}: {lengths.numel()} episodes"
        assert bool((lengths >= 1).all()) and bool((lengths <= NEW_TOKENS).all())
        short = is_short[torch.cat([b.prompt_index for b in batches])]
        produced = int(env.written) - written
        sample = Sample(seconds, produced, int(lengths.sum()), env.steps - steps, lengths, short)
        if side == "synchronous":  # every row is returned: nothing carried over
            assert produced == sample.returned, (produced, sample.returned)
        else:
            assert produced == collector.tokens_generated - counted, "collector miscounts"
        kept[side].append(sample)
        return seconds

    meter = h.CpuMeter()
    h.alternate(lambda: run("continuous"), lambda: run("synchronous"), args.warmup, args.repeats)
    w.check_compiled(policy, args.compile_decode)
    sync, cont = (kept[side][args.warmup :] for side in ("synchronous", "continuous"))
    result = Run(sync, cont, meter.other_load())
    for side, call in calls.items() if args.profile_calls > 0 and process == 0 else ():
        notes: dict[str, list[float]] = defaultdict(list)
        steps = envs[side].steps
        with noting(policy, notes):
            phases = h.profile_phases(call, args.profile_calls)
        result.profile[side] = phases
        result.notes[side] = {
            "env steps per call": (envs[side].steps - steps) / args.profile_calls,
            "restarts per call": len(notes.get("restarted rows", [])) / args.profile_calls,
            **{f"{k} (mean)": statistics.mean(v) for k, v in notes.items() if v},
        }
    return result


def length_row(name: str, side: str, samples: list[Sample]) -> str:
    n = torch.cat([s.lengths for s in samples]).float()
    short = torch.cat([s.short for s in samples])
    pct = lambda x: f"{float(x.float().mean()):.1%}"  # noqa: E731
    ns, nl = n[short], n[~short]
    return (
        f"{name} | {side} | {n.numel()} | {float(n.mean()):.1f} | {pct(n < SHORT_UNDER)} "
        f"| {pct(n == NEW_TOKENS)} | {pct(short)} | {float(ns.mean()):.2f}, "
        f"{pct(ns < SHORT_UNDER)} | {float(nl.mean()):.1f}, {pct(nl == NEW_TOKENS)} "
        f"| {rate(samples) / rate(samples, 'returned'):.3f}"
    )


def main_row(r: h.Runs[Run], g: int) -> str:
    sides = r.pooled("sync"), r.pooled("cont")
    steps = [NUM_ENVS * sum(s.steps for s in x) / sum(s.lengths.numel() for s in x)
             for x in sides]  # fmt: skip
    ms = [1000 * sum(s.seconds for s in x) / sum(s.steps for s in x) for x in sides]
    returned = rate(sides[1], "returned") / rate(sides[0], "returned")
    return (
        f"{r.name} | {NUM_ENVS} ({NUM_ENVS // g} x {g}) | {median_rate(sides[0]):,.0f} "
        f"| {median_rate(sides[1]):,.0f} | {r.ratio:.2f}x | {returned:.2f}x "
        f"| {steps[0]:.1f} / {steps[1]:.1f} | {ms[0]:.2f} / {ms[1]:.2f} | {len(sides[0])} "
        f"| {h.load_cell(r.other_load)}"
    )


def report(
    results: list[h.Runs[Run]], finetunes: list[str], args: argparse.Namespace, command: str,
    wall: float,
) -> list[str]:  # fmt: skip
    ft = "; ".join(f"{r.name}: {f}" for r, f in zip(results, finetunes, strict=True))
    g = args.group_size
    lines = h.header(
        "Continuous batching: next-step autoreset vs episode-synchronous rollouts",
        f"torch threads = {args.threads}",
        ["torch", "transformers", "gymnasium", "lmgym"],
        command,
        note=f" (total {wall:.0f} s, incl. fine-tunes, priming, profiling, waiting for idle CPUs)",
        compile_decode=args.compile_decode,
    )
    lines += [
        f"- work: {NUM_ENVS} rows, {PROMPT_TOKENS}-token prompts, max_new_tokens = {NEW_TOKENS}"
        f", temperature 1, compile_decode = {args.compile_decode}; a sample is {args.calls} calls of {NUM_ENVS} completed episodes per "
        f"side, after {args.prime} untimed collector calls; fine-tune: {ft}.",
        f"- method: alternated (ABBA) after {args.warmup} warm-up pair(s), {args.repeats} "
        "samples per side and process; tok/s = completion tokens produced during a sample / "
        "its seconds, median; ratio = continuous / synchronous (median of the per-process "
        f"ratios over {args.processes} fresh process(es), listed below); 'from returned' = "
        "the same from the returned episodes' lengths over all samples. Details: the "
        "script's docstring.",
        "",
        *h.table(
            "model | rows (prompts x G) | synchronous tok/s | continuous tok/s | ratio | ratio "
            f"from returned | env steps per {NUM_ENVS} episodes (sync / cont) | ms per env step "
            "(sync / cont) | samples | other CPU load",
            [main_row(r, g) for r in results],
            left=2,
        ),
        *h.ratios_block(results),
        "",
        *h.table(
            "model | side | episodes | mean length | < 8 tokens | at 128 | short-kind share "
            "| short kind: mean, < 8 | long kind: mean, at 128 | produced / returned",
            [
                length_row(r.name, side, r.pooled("sync" if side == "synchronous" else "cont"))
                for r in results
                for side in ("synchronous", "continuous")
            ],
            left=2,
        ),
        *h.targets_section(
            f"Target (continuous >= {TARGET:g}x synchronous tokens/s)",
            [
                h.target_line(f"{r.name}, G={g}", r.ratio, TARGET, "continuous vs synchronous")
                for r in results
            ],
            results,
        ),
    ]
    columns = {f"{r.name}, {side}": p for r in results for side, p in r.runs[0].profile.items()}
    notes = {f"{r.name}, {side}": n for r in results for side, n in r.runs[0].notes.items()}
    note = f"{args.profile_calls} profiled calls per side; italics: notes."
    return lines + h.phase_section("Where the time goes", note, columns, notes)


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run (< 1 min)")
    p.add_argument("--group-size", type=int, default=1, help=f"G, divides {NUM_ENVS} (1)")
    p.add_argument("--calls", type=int, default=2, help=f"calls of {NUM_ENVS} episodes per sample")
    p.add_argument("--prime", type=int, help="untimed collector calls first (4)")
    p.add_argument("--finetune-steps", type=int, help="override the per-model default")
    p.add_argument("--profile-calls", type=int, help="profiled calls per side (4)")
    h.add_common(p, NUM_THREADS, list(w.SIZES), 1, "9", "3, --quick 1", compile_decode=True)
    args = p.parse_args(argv)
    h.fill_defaults(
        args,
        dict(models="small,large", repeats=9, prime=4, profile_calls=4, processes=3),
        dict(models="small", repeats=2, prime=2, profile_calls=2, processes=1, finetune_steps=60),
    )
    if NUM_ENVS % args.group_size:
        p.error(f"--group-size {args.group_size}: must divide {NUM_ENVS}")
    h.quiet_worker(args.threads)
    t0 = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, t0)
    results, finetunes = [], []
    for m in h.csv(args.models, list(w.SIZES), "--models", p):
        steps = args.finetune_steps or FINETUNE_STEPS[m]
        print(f"{w.SIZES[m][0]}: fine-tune ({steps} steps)", flush=True)
        model, tok = w.tiny_gpt2(m, n_positions=160)
        finetunes.append(w.fine_tune_bimodal(model, tok, steps, PROMPT_TOKENS, NEW_TOKENS))
        with tempfile.TemporaryDirectory() as tmp:
            CausalLMPolicy(model, tok).save_pretrained(tmp)
            work = functools.partial(bench, Path(tmp), args)
            results.append(h.run_row(w.SIZES[m][0], work, args.processes, args.threads, deadline))
    command = h.command_line("continuous.py", argv)
    h.finish(report(results, finetunes, args, command, time.perf_counter() - t0), args.out)


if __name__ == "__main__":
    main()
