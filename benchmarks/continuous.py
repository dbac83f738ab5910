"""Continuous batching: next-step-autoreset rollouts against episode-synchronous ones.

Completion tokens/s of ``ContinuousCollector`` over ``TokenVectorEnv(...,
autoreset=True)`` (a finished row takes the next prompt while the others go on)
against ``collect`` over the same env with ``autoreset=False`` (every row waits for
the batch's longest), with bimodal completion lengths. Both sides in one process,
alternated (ABBA) after a warm-up; medians; each row in ``--processes`` fresh
processes, reporting the median of their ratios.

Lengths. A tiny GPT-2 gets an untimed fine-tune (fixed seeds) so that *short*
prompts (16 lowercase letters) are answered with 2 characters + EOS and *long*
prompts (16 digits / punctuation marks) never stop before ``max_new_tokens=128``;
the 64 benchmark prompts (32 of each, unseen in training) are served shuffled.
Sampling is at temperature 1, so the lengths each side produced are reported.

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
import string
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import torch
from torch import Tensor

from lmgym import CausalLMPolicy, ContinuousCollector, TokenVectorEnv, collect, make_tiny_lm
from lmgym.char_tokenizer import DEFAULT_CHARS

NUM_THREADS, NUM_ENVS, PROMPT_TOKENS, NEW_TOKENS = 2, 64, 16, 128
SHORT_CHARS = 2  # a short completion: 2 characters, then EOS
PROMPTS_PER_KIND = 32
SHORT_ALPHABET, LONG_ALPHABET = string.ascii_lowercase, string.digits + " +-*=:.,?!"
SHORT_UNDER = 8  # "stopped within a few tokens": length < 8
TARGET = 1.5  # continuous / synchronous, completion tokens/s
FT_BATCH, FT_LR = 32, 2e-3  # fine-tune: sequences per step (half of each kind), peak lr
MODELS = {"small": ("GPT-2 2L/128d", 2, 128, 200), "large": ("GPT-2 6L/256d", 6, 256, 120)}
"""name -> (label, layers, width, fine-tune steps); 4 heads, 160 positions."""


class CountingEnv(TokenVectorEnv):
    """``TokenVectorEnv`` that counts its steps and the completion tokens it writes
    (a row's length grew by one on a step). Both sides use it alike."""

    steps = 0
    written = 0
    _last: Tensor | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        self._last = info["length"].clone()
        return obs, info

    def step(self, actions: Tensor) -> Any:
        out = super().step(actions)
        length = out[4]["length"]
        self.written = self.written + (length == self._last + 1).sum()  # a 0-dim tensor
        self._last = length.clone()
        self.steps += 1
        return out


def char_ids(tok: Any, chars: str) -> Tensor:
    return torch.tensor(tok.convert_tokens_to_ids(list(chars)), dtype=torch.long)


def make_prompts(seed: int = 1) -> tuple[list[str], Tensor]:
    """``(prompts, is_short [64] bool)``: the two kinds interleaved."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [SHORT_ALPHABET, LONG_ALPHABET] * PROMPTS_PER_KIND
    picks = [torch.randint(len(a), (PROMPT_TOKENS,), generator=gen).tolist() for a in kinds]
    prompts = ["".join(a[j] for j in p) for a, p in zip(kinds, picks, strict=True)]
    return prompts, torch.tensor([a == SHORT_ALPHABET for a in kinds])


def fine_tune(model: Any, tok: Any, steps: int, seed: int = 0) -> str:
    """Teach the two kinds: loss = mean token cross-entropy of the short completions +
    that of the long ones + that of the column where a short one ends (AdamW, lr
    decaying linearly to 0). Returns a summary: losses, stop probabilities, seconds."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    every, short_set = char_ids(tok, DEFAULT_CHARS), char_ids(tok, SHORT_ALPHABET)
    long_set = char_ids(tok, LONG_ALPHABET)
    b, half, p, n = FT_BATCH, FT_BATCH // 2, PROMPT_TOKENS, NEW_TOKENS
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=FT_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / steps)
    for _ in range(steps):
        ids = every[torch.randint(len(every), (b, p + n), generator=gen)]
        ids[:half, :p] = short_set[torch.randint(len(short_set), (half, p), generator=gen)]
        ids[half:, :p] = long_set[torch.randint(len(long_set), (half, p), generator=gen)]
        ids[:half, p + SHORT_CHARS] = tok.eos_token_id
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:half, p + SHORT_CHARS + 1 :] = False
        ids = ids.masked_fill(~mask, tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, p - 1 : -1]
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), ids[:, p:].reshape(-1), reduction="none"
        ).view(b, n)
        target = mask[:, p:]
        short_loss = (nll[:half] * target[:half]).sum() / target[:half].sum()
        long_loss = nll[half:].mean()
        loss = short_loss + long_loss + nll[:, SHORT_CHARS].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    probs = logits.detach().float().softmax(-1)[:, :, tok.eos_token_id]  # the last batch's
    return (
        f"{steps} steps, {time.perf_counter() - start:.0f} s, losses {float(short_loss):.3f} "
        f"(short) / {float(long_loss):.3f} (long), short rows' P(EOS) where they should stop "
        f"{float(probs[:half, SHORT_CHARS].mean()):.3f}, long rows' P(EOS) per step "
        f"{float(probs[half:].mean()):.1e} (last training batch)"
    )


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
class Result:
    """One results row: a model, both sides' samples, the load and the setup figures."""

    name: str
    sync: list[Sample]
    cont: list[Sample]
    other_load: float
    finetune: str
    profile: dict[str, h.Phases] = field(default_factory=dict)
    notes: dict[str, dict[str, float]] = field(default_factory=dict)
    process_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        if self.process_ratios:
            return statistics.median(self.process_ratios)
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


def bench(name: str, path: Path, finetune: str, args: argparse.Namespace, process: int) -> Result:
    """Load the fine-tuned policy, build both envs, prime the collector, alternate."""
    policy = CausalLMPolicy.from_pretrained(
        path, temperature=1.0, top_k=None, top_p=None, compile_decode=args.compile_decode
    )
    prompts, is_short = make_prompts()
    g = args.group_size
    kwargs = dict(num_prompts=NUM_ENVS // g, group_size=g, max_new_tokens=NEW_TOKENS)
    envs = {
        side: CountingEnv(policy.tokenizer, prompts, h.ZeroReward(), autoreset=side == "continuous",
                          prompt_order="shuffle", **kwargs)
        for side in ("synchronous", "continuous")
    }  # fmt: skip
    collector = ContinuousCollector(envs["continuous"], policy, seed=0)
    for _ in range(args.prime):
        collector.collect(NUM_ENVS // g)
    seeds = iter(range(1, 1_000_000))
    calls: dict[str, Callable[[], Any]] = {
        "synchronous": lambda: collect(envs["synchronous"], policy, seed=next(seeds)),
        "continuous": lambda: collector.collect(NUM_ENVS // g),
    }
    kept: dict[str, list[Sample]] = {"synchronous": [], "continuous": []}
    keep = [False]

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
        if keep[0]:
            kept[side].append(sample)
        return seconds

    for _ in range(args.warmup):
        run("continuous")
        run("synchronous")
    keep[0] = True
    meter = h.CpuMeter()
    h.alternate(lambda: run("continuous"), lambda: run("synchronous"), 0, args.repeats)
    result = Result(name, kept["synchronous"], kept["continuous"], meter.other_load(), finetune)
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


def main_row(r: Result, g: int) -> str:
    steps = [NUM_ENVS * sum(s.steps for s in x) / sum(s.lengths.numel() for s in x)
             for x in (r.sync, r.cont)]  # fmt: skip
    ms = [1000 * sum(s.seconds for s in x) / sum(s.steps for s in x) for x in (r.sync, r.cont)]
    returned = rate(r.cont, "returned") / rate(r.sync, "returned")
    return (
        f"{r.name} | {NUM_ENVS} ({NUM_ENVS // g} x {g}) | {median_rate(r.sync):,.0f} "
        f"| {median_rate(r.cont):,.0f} | {r.ratio:.2f}x | {returned:.2f}x "
        f"| {steps[0]:.1f} / {steps[1]:.1f} | {ms[0]:.2f} / {ms[1]:.2f} | {len(r.sync)} "
        f"| {h.load_cell(r.other_load)}"
    )


def report(results: list[Result], args: argparse.Namespace, command: str, wall: float) -> str:
    ft = "; ".join(f"{r.name}: {r.finetune}" for r in results)
    g = args.group_size
    lines = h.header(
        "Continuous batching: next-step autoreset vs episode-synchronous rollouts",
        f"torch threads = {args.threads}",
        ["torch", "transformers", "gymnasium", "lmgym"],
        command,
        note=f" (total {wall:.0f} s, incl. fine-tunes, priming, profiling, waiting for idle CPUs)",
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
                length_row(r.name, side, r.sync if side == "synchronous" else r.cont)
                for r in results
                for side in ("synchronous", "continuous")
            ],
            left=2,
        ),
        "",
        f"## Target (continuous >= {TARGET:g}x synchronous tokens/s)",
        "",
        *[f"- {r.name}, G={g}: {r.ratio:.2f}x -> {h.verdict(r.ratio >= TARGET)}" for r in results],
        *h.noisy_warning([r.other_load for r in results]),
    ]
    columns = {f"{r.name}, {side}": p for r in results for side, p in r.profile.items()}
    notes = {f"{r.name}, {side}": n for r in results for side, n in r.notes.items()}
    if columns:
        note = f"{args.profile_calls} profiled calls per side. {h.PHASE_NOTE} Italics: notes."
        lines += ["", "## Where the time goes", "", note, "", *h.phase_table(columns, notes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run (< 1 min)")
    p.add_argument("--threads", type=int, default=NUM_THREADS, help="torch threads (2)")
    p.add_argument("--models", help="comma list of: small, large (default both)")
    p.add_argument("--group-size", type=int, default=1, help=f"G, divides {NUM_ENVS} (1)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up pairs (1)")
    p.add_argument("--repeats", type=int, help="timed samples per side (9)")
    p.add_argument("--calls", type=int, default=2, help=f"calls of {NUM_ENVS} episodes per sample")
    p.add_argument("--prime", type=int, help="untimed collector calls first (4)")
    p.add_argument("--finetune-steps", type=int, help="override the per-model default")
    p.add_argument("--profile-calls", type=int, help="profiled calls per side (4)")
    p.add_argument("--processes", type=int, help="fresh processes per row (3, --quick 1)")
    p.add_argument(
        "--compile-decode", action="store_true", help="both sides with compile_decode=True"
    )
    h.add_wait_idle(p)
    args = p.parse_args(argv)
    h.fill_defaults(
        args,
        dict(models="small,large", repeats=9, prime=4, profile_calls=4, processes=3),
        dict(models="small", repeats=2, prime=2, profile_calls=2, processes=1, finetune_steps=60),
    )
    if NUM_ENVS % args.group_size or args.processes < 1:
        p.error(f"--group-size must divide {NUM_ENVS}; --processes must be >= 1")
    h.quiet_worker(args.threads)
    t0 = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, t0)
    command = h.command_line("continuous.py", argv)
    results = []
    for m in h.csv(args.models, list(MODELS), "--models", p):
        name, layers, width, default_steps = MODELS[m]
        steps = args.finetune_steps or default_steps
        print(f"{name}: fine-tune ({steps} steps)", flush=True)
        model, tok = make_tiny_lm(n_layer=layers, n_embd=width, n_head=4, n_positions=160)
        finetune = fine_tune(model, tok, steps)
        with tempfile.TemporaryDirectory() as tmp:
            CausalLMPolicy(model, tok).save_pretrained(tmp)
            work = functools.partial(bench, name, Path(tmp), finetune, args)
            runs = h.in_processes(work, args.processes, args.threads, deadline, name)
        result = runs[0]
        if len(runs) > 1:
            result.sync = [s for r in runs for s in r.sync]
            result.cont = [s for r in runs for s in r.cont]
            result.other_load = max(r.other_load for r in runs)
            result.process_ratios = tuple(r.ratio for r in runs)
        results.append(result)
        print(f"  ratio {result.ratio:.2f}x, other CPU load {result.other_load:.0%}", flush=True)
    text = report(results, args, command, time.perf_counter() - t0)
    print("\n" + text)
    h.write_report(text, args.out)


if __name__ == "__main__":
    main()
