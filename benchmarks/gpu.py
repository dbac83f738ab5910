# ruff: noqa: E402  (T0 is taken before the imports: the time budget includes them)
"""GPU throughput of lmgym: rollout and GRPO iteration in bf16 on a ~100M-parameter GPT-2.

Runs unattended, in a few minutes, with no network access. Model: GPT-2 from a config,
14 layers x 768, 12 heads, context 320, no dropout, SDPA attention, bf16 on the device;
lmgym's 49-id character tokenizer: ~99M non-embedding parameters. Phases, in order:

1. **Matmul peak.** ``torch.mm`` of square bf16 matrices (4096, 8192, 16384), timing
   windows of 10 products after a warm-up, the device synchronized around each; the
   best window is the device's *measured peak* (TFLOP/s, ``2 n^3`` per product).
2. **Rollout, batch 256** (and last, **batch 1024** if the budget allows). Completion
   tokens/s of ``collect`` against ``model.generate(do_sample=True)`` as in
   ``rollout.py`` (``workloads.RolloutVsGenerate``): 64-token prompts, exactly 256 new
   tokens per row (EOS forbidden, asserted); ABBA after one warm-up each.
3. **GRPO iteration.** Seconds per iteration of ``lmgym.agents.GRPO`` in bf16 (weights
   and AdamW state), 32 prompts x 8 completions, 64-token prompts, exactly 128 new
   tokens, beta 0, one epoch, one minibatch, a token-level reward: ``agent.collect()``
   and ``agent.train_on_batch(batch)``, each timed with the device synchronized.

Model FLOPs. One token at a position attending to ``k`` tokens costs
``2 (N + V d) + 4 n_layer d k`` (``N`` non-embedding parameters, ``V d`` the LM head,
the last term ``QK^T`` and ``AV``). A rollout feeds ``Lp + L - 1`` positions per row;
the update runs forward and backward over ``Lp + L``: 3x the forward. Fraction of
peak = model TFLOP/s / measured matmul peak; padding the kernels may do is not counted.

Robustness (``harness.run_section``). Each phase has a slice of ``--time-budget``
(240 s from start-up), is stopped by ``SIGALRM`` shortly after and says how it ended;
the Markdown is rewritten after every phase; a watchdog ends the process 60 s after
the budget. ``--compile-decode``: lmgym decodes with ``CausalLMPolicy(compile_decode=True)``
(CUDA graphs; compiled in each phase's warm-up; ``generate`` unchanged). Without CUDA,
``--device cuda`` (the default) prints a message and exits 0::

    python benchmarks/gpu.py --out benchmarks/results/gpu.md
    python benchmarks/gpu.py --device cpu --smoke --out /tmp/gpu.md   # CPU smoke run
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import copy
import faulthandler
import functools
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import harness as h
import torch
import workloads as w

WATCHDOG_GRACE_S = 60.0  # the process is ended this long after the time budget


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; ``FULL`` on a GPU, ``SMOKE`` for the CPU test."""

    n_layer: int
    n_embd: int
    n_head: int
    matmul_sizes: tuple[int, ...]
    matmul_windows: int  # timing windows per size, each of ``matmul_per_window`` products
    matmul_per_window: int
    rollout_batches: tuple[int, ...]  # the first is the main row; the rest run last
    prompt_tokens: int
    rollout_new_tokens: int
    rollout_max_pairs: int  # timed (lmgym, generate) pairs per batch size, at most
    grpo_prompts: int
    grpo_group: int
    grpo_new_tokens: int
    grpo_max_iters: int

    @property
    def context(self) -> int:
        """The longest prompt + completion, rounded up to a multiple of 64."""
        need = self.prompt_tokens + max(self.rollout_new_tokens, self.grpo_new_tokens)
        return -(-need // 64) * 64


FULL = Sizes(14, 768, 12, (4096, 8192, 16384), 10, 10, (256, 1024), 64, 256, 6, 32, 8, 128, 10)
SMOKE = Sizes(2, 64, 4, (128, 256), 3, 2, (8, 16), 8, 16, 2, 4, 2, 8, 2)


def fmt(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None or x != x else format(x, spec)


@dataclass
class Context:
    """What the phases share."""

    sizes: Sizes
    device: torch.device
    model: Any = None
    tok: Any = None
    params: tuple[int, int] = (0, 0)  # non-embedding parameters, vocabulary
    peak: float | None = None  # measured bf16 matmul TFLOP/s
    compile_decode: bool = False  # lmgym's CausalLMPolicy(compile_decode=...)

    def flops(self, rows: int, positions: int) -> float:
        """Forward FLOPs of ``rows`` sequences of ``positions`` tokens, causal attention."""
        (n, vocab), s = self.params, self.sizes
        dense = 2.0 * (n + vocab * s.n_embd) * positions
        return rows * (dense + 4.0 * s.n_layer * s.n_embd * positions * (positions + 1) / 2)

    def cells(self, work: float, seconds: list[float], tokens: float) -> str:
        """``s (min-max) | tok/s | TFLOP/s | fraction of peak`` from the median seconds."""
        sec = statistics.median(seconds) if seconds else None
        tf = work / sec / 1e12 if sec else None
        frac = f"{tf / self.peak:.1%}" if tf and self.peak else "n/a"
        rate = fmt(tokens / sec if sec else None, ",.0f")
        return f"{h.spread(seconds)} | {rate} | {fmt(tf)} | {frac}"

    def memory(self) -> str:
        if self.device.type != "cuda":
            return "Peak device memory: n/a (CPU)."
        return f"Peak device memory in this phase: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB."


def phase_matmul(ctx: Context, phase: h.Section, deadline: float) -> None:
    s, rows = ctx.sizes, []
    head = "n (n x n @ n x n) | windows x products | TFLOP/s median | TFLOP/s best"
    for n in s.matmul_sizes:
        if time.perf_counter() > deadline:
            phase.body.append(f"Sizes from n = {n} on skipped: the phase's time ran out.")
            break
        tflops = w.matmul_tflops(n, s.matmul_per_window, s.matmul_windows, ctx.device)
        ctx.peak = max([ctx.peak or 0.0, *tflops])
        rows.append([n, f"{len(tflops)} x {s.matmul_per_window}",
                     f"{statistics.median(tflops):.4g}", f"{max(tflops):.4g}"])  # fmt: skip
        peak = f"Measured peak (best window, all sizes): {fmt(ctx.peak, '.4g')} TFLOP/s."
        phase.body = [*h.table(head, rows), "", peak]


def phase_model(ctx: Context, phase: h.Section, deadline: float) -> None:
    from lmgym import make_tiny_lm

    s = ctx.sizes
    model, ctx.tok = make_tiny_lm(
        n_layer=s.n_layer, n_embd=s.n_embd, n_head=s.n_head, n_positions=s.context
    )
    ctx.model = model.to(device=ctx.device, dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    w.forbid_token(ctx.model, ctx.tok.eos_token_id)
    ctx.params = (total - embeddings, len(ctx.tok))
    attn = getattr(model.config, "_attn_implementation", "?")
    phase.body = [
        f"GPT-2 from config: {s.n_layer} layers x {s.n_embd} wide, {s.n_head} heads, context "
        f"{s.context}, vocabulary {len(ctx.tok)} (character tokenizer), attention `{attn}`, "
        f"bf16 on `{ctx.device}`: {total / 1e6:.2f}M parameters, "
        f"{ctx.params[0] / 1e6:.2f}M non-embedding (N in the FLOP formula)."
    ]


def phase_rollout(ctx: Context, phase: h.Section, deadline: float, batch: int) -> None:
    """``collect`` vs ``model.generate`` at ``batch`` rows, alternated (module docstring)."""
    lp, new = ctx.sizes.prompt_tokens, ctx.sizes.rollout_new_tokens
    sides = w.RolloutVsGenerate(ctx.model, ctx.tok, batch, lp, new, ctx.device, ctx.compile_decode)
    runs = {"lmgym `collect`": sides.lmgym, "`model.generate`": sides.generate}
    times: dict[str, list[float]] = {k: [] for k in runs}

    def step(i: int) -> None:  # A B, then B A, ...
        for k in list(runs)[:: 1 if i % 2 == 0 else -1]:
            times[k].append(runs[k]())

    def show(warm: bool) -> None:
        flops = ctx.flops(batch, lp + new - 1)
        flag, n = (" (warm-up only)", 0) if warm else ("", len(times["`model.generate`"]))
        rows = [f"{k}{flag} | {ctx.cells(flops, t, batch * new)} | {n}" for k, t in times.items()]
        lm, gen = (statistics.median(t) for t in times.values())
        phase.body = [
            *h.table(
                "side | s / rollout, median [IQR] (min-max) | completion tok/s | model "
                "TFLOP/s | fraction of peak | timed runs",
                rows,
            ),
            "",
            f"B = {batch}, {lp}-token prompts, exactly {new} new tokens per row ({flops / 1e12:.3g} "
            f"TFLOP per rollout). Ratio lmgym / generate (tok/s): **{gen / lm:.2f}x**. "
            f"{ctx.memory()}",
        ]

    h.warm_then_time(phase, step, times, ctx.sizes.rollout_max_pairs, deadline, show)


def phase_iteration(ctx: Context, phase: h.Section, deadline: float) -> None:
    """GRPO iterations in bf16 on a copy of the model (the rollout phases keep theirs)."""
    s, dev = ctx.sizes, ctx.device
    p, g, lp, new = s.grpo_prompts, s.grpo_group, s.prompt_tokens, s.grpo_new_tokens
    agent = w.grpo_agent(copy.deepcopy(ctx.model), ctx.tok, p, g, new, lp, dev,
                         ctx.compile_decode, learning_rate=1e-6, beta=0.0)  # fmt: skip
    times: dict[str, list[float]] = {"iteration": [], "collect": [], "train_on_batch": []}
    rollout, update = ctx.flops(p * g, lp + new - 1), 3.0 * ctx.flops(p * g, lp + new)
    work = {  # model FLOPs, tokens (completion tokens; sequence tokens for the update)
        "iteration": (rollout + update, p * g * new),
        "collect": (rollout, p * g * new),
        "train_on_batch": (update, p * g * (lp + new)),
    }

    def step(_: int) -> None:
        collect_s, (batch, _) = w.timed(agent.collect, dev)
        assert bool((batch.lengths == new).all()), "lmgym: a row stopped early"
        w.check_compiled(agent.policy, ctx.compile_decode)
        update_s, _ = w.timed(lambda: agent.train_on_batch(batch), dev)
        for key, sec in zip(times, (collect_s + update_s, collect_s, update_s), strict=True):
            times[key].append(sec)

    def show(warm: bool) -> None:
        flag = " (warm-up only)" if warm else ""
        rows = [f"`{k}`{flag} | {ctx.cells(f, times[k], n)}" for k, (f, n) in work.items()]
        phase.body = [
            *h.table(
                "part | s, median [IQR] (min-max) | tok/s | model TFLOP/s | fraction of peak", rows
            ),
            "",
            f"{p} prompts x {g} completions, {lp}-token prompts, exactly {new} new tokens per "
            "row, beta 0, one epoch, one minibatch, AdamW lr 1e-6, bf16 weights and optimizer "
            f"state; {0 if warm else len(times['collect'])} timed iterations after one warm-up. "
            "tok/s: completion tokens (sequence tokens for `train_on_batch`). Model work: "
            f"{rollout / 1e12:.3g} TFLOP rollout + {update / 1e12:.3g} TFLOP update. "
            f"{ctx.memory()}",
        ]

    h.warm_then_time(phase, step, times, s.grpo_max_iters, deadline, show)


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__, quick=None)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: tests the script on CPU")
    p.add_argument("--time-budget", type=float, default=240.0, metavar="SECONDS",
                   help="whole-run budget from start-up (240); phases that do not fit are cut "
                   "short or skipped; the process is ended 60 s after it in any case")  # fmt: skip
    h.add_common(p, compile_decode=True, wait_idle=False)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"benchmarks/gpu.py: --device {args.device} but CUDA is not available (torch "
            f"{torch.__version__}); nothing to do. Use --device cpu --smoke to test the script on CPU."
        )
        return 0
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    b = args.time_budget
    watchdog_s = b + WATCHDOG_GRACE_S - (time.perf_counter() - T0)
    faulthandler.dump_traceback_later(max(1.0, watchdog_s), exit=True)
    h.quiet_worker(torch.get_num_threads())
    sizes = SMOKE if args.smoke else FULL
    mode = "smoke sizes: a test of the script, not a measurement" if args.smoke else "full sizes"
    head = h.header(
        "lmgym GPU throughput: rollout and GRPO iteration, bf16",
        f"torch threads = {torch.get_num_threads()}",
        ["torch", "transformers", "lmgym"],
        h.command_line("gpu.py", argv),
        note=f" ({mode}; time budget {b:.0f} s)",
        device=h.device_text(device),
        compile_decode=args.compile_decode,
    )
    head += [
        "- method: phases in order, each in a time slice; device synchronized around every "
        "timed call; medians. FLOP formula, equal work (EOS never sampled, asserted) and "
        "details: the docstring of `benchmarks/gpu.py`.",
        "",
    ]
    ctx = Context(sizes, device, compile_decode=args.compile_decode)
    report = h.SectionedReport(head, args.out)
    print("\n".join(head), flush=True)

    def run(title: str, fn: Callable[..., None], slice_s: float) -> str:
        phase = h.on_device(functools.partial(fn, ctx), device)
        needs_model = fn not in (phase_matmul, phase_model) and ctx.model is None
        skip = "no model (the model phase did not complete)" if needs_model else ""
        return h.run_section(report, title, phase, slice_s, max(5.0, 0.05 * b), T0 + b, skip)

    first, *rest = sizes.rollout_batches
    rollout = f"lmgym collect vs model.generate ({sizes.prompt_tokens} + {sizes.rollout_new_tokens} tokens)"
    grpo = f"{sizes.grpo_prompts} x {sizes.grpo_group}, {sizes.grpo_new_tokens} new tokens"
    plan = [
        ("Matmul peak (bf16)", phase_matmul, min(30.0, 0.12 * b)),
        ("Model", phase_model, 0.15 * b),
        (f"Rollout, B = {first}: {rollout}", functools.partial(phase_rollout, batch=first), 0.28 * b),
        (f"GRPO iteration ({grpo})", phase_iteration, 0.28 * b),
        *[(f"Rollout, B = {n}: {rollout}", functools.partial(phase_rollout, batch=n), b) for n in rest],
    ]  # fmt: skip
    outcomes = [run(*step) for step in plan]
    head.insert(-1, f"- run time: {time.perf_counter() - T0:.0f} s in all (budget {b:.0f} s)")
    print("\n" + "=" * 80 + "\n" + report.write(finished=True), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 1 if "failed" in outcomes or ctx.model is None else 0


if __name__ == "__main__":
    sys.exit(main())
