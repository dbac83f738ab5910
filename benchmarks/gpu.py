"""GPU throughput of lmgym: rollout and GRPO iteration in bf16 on a ~100M-parameter GPT-2.

Runs unattended, in a few minutes, with no network access (the model is built from
a config, the tokenizer is lmgym's character tokenizer). Phases, in order:

1. **Matmul peak.** ``torch.mm`` of square bf16 matrices (4096, 8192, 16384), 10
   timing windows of 10 products each after a warm-up, timed with CUDA events. The
   best window over all sizes is the device's *measured peak* (TFLOP/s,
   ``2 n^3`` FLOPs per product); every fraction of peak below divides by it.
2. **Rollout, batch 256.** Completion tokens/s of ``lmgym.rollout.collect`` against
   transformers' ``model.generate(do_sample=True)`` on the same model, the same
   256 prompts of exactly 64 tokens, exactly 256 new tokens per row. Equal work as
   in ``benchmarks/rollout.py``: the output layer gets a bias of ``-1e9`` on the EOS
   id (every other logit unchanged), so EOS is never sampled and both sides make
   exactly 256 tokens on every row (asserted); full-vocabulary sampling at
   temperature 1 on both (``top_k=0`` for ``generate``). The two sides alternate
   (ABBA) after one warm-up run each, as long as the phase's time allows.
3. **GRPO iteration.** Seconds per ``agent.step()`` (collect + one update) of
   ``lmgym.agents.GRPO`` with bf16 weights and bf16 AdamW states, 32 prompts x 8
   completions, 64-token prompts, exactly 128 new tokens per row (EOS forbidden as
   above), beta 0, one epoch, one minibatch, a token-level reward (share of ``e``
   in the completion). The time of ``collect`` and ``train_on_batch`` inside each
   step is reported too (instance-level timers that synchronize the device).
4. **Rollout, batch 1024** (as 2), if the time budget allows.

Model: GPT-2 (``transformers.GPT2Config``) 14 layers x 768 wide, 12 heads, context
320, no dropout, ``attn_implementation="sdpa"``, bf16 weights on the device; with the
49-id character tokenizer that is ~99M non-embedding parameters (printed).

Model FLOPs (stated in the output as well). A forward pass over one token at a
position that attends to ``k`` tokens (itself included) costs
``2 * (N + V * d) + 4 * n_layer * d * k`` FLOPs, with ``N`` the non-embedding
parameters, ``V * d`` the LM head (tied to the embedding, but a real matmul) and
the last term ``QK^T`` and ``AV``. A rollout of ``B`` rows, prompt ``Lp`` and ``L``
new tokens feeds ``Lp + L - 1`` positions per row (the last sampled token is never
fed), on either side. The update runs forward and backward over all ``Lp + L``
positions: 3x the forward FLOPs. Iteration FLOPs = rollout forward + 3 x update
forward. Achieved TFLOP/s = FLOPs / wall seconds; fraction of peak = that / the
measured matmul peak. Padding or masked-out work the kernels may do is not counted.

Robustness. Every phase gets a time slice of ``--time-budget`` (default 240 s,
counted from the start of the script) and is stopped by ``SIGALRM`` shortly after
its slice ends; a phase that fails or runs out of time is reported as such, with
whatever it measured, and the next one runs. Phases that no longer fit are
skipped and say so. The results are printed to stdout and, with ``--out``, the
Markdown file is rewritten after every phase. A watchdog ends the process 60 s
after the budget whatever happens (``faulthandler``; the output written so far
stays).

Run from the repository root on a machine with a CUDA GPU::

    python benchmarks/gpu.py --out benchmarks/results/gpu.md
    python benchmarks/gpu.py --device cpu --smoke --out /tmp/gpu.md   # CPU smoke run, < 1 min

Without CUDA, ``--device cuda`` (the default) prints a message and exits 0.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the time budget counts from here, imports included

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

# Make ``import lmgym`` and ``import _lm`` work when the package is not installed (run
# from a checkout); both are imported inside the phases, after the CUDA check.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WATCHDOG_GRACE_S = 60.0  # the process is ended this long after the time budget
MIN_PHASE_S = 8.0  # a phase with less time than this left is skipped
REWARD_CHAR = "e"


# ------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; ``FULL`` on a GPU, ``SMOKE`` for the CPU test."""

    n_layer: int
    n_embd: int
    n_head: int
    matmul_sizes: tuple[int, ...]
    matmul_windows: int  # timing windows per size
    matmul_per_window: int  # products per window
    rollout_batches: tuple[int, ...]  # first: the main row; the rest run last, if time allows
    prompt_tokens: int
    rollout_new_tokens: int
    rollout_max_pairs: int  # timed (lmgym, generate) pairs per batch size, at most
    grpo_prompts: int
    grpo_group: int
    grpo_new_tokens: int
    grpo_max_iters: int  # timed iterations, at most

    @property
    def context(self) -> int:
        """Model context: the longest prompt + completion, rounded up to a multiple of 64."""
        need = self.prompt_tokens + max(self.rollout_new_tokens, self.grpo_new_tokens)
        return -(-need // 64) * 64


FULL = Sizes(
    n_layer=14,
    n_embd=768,
    n_head=12,
    matmul_sizes=(4096, 8192, 16384),
    matmul_windows=10,
    matmul_per_window=10,
    rollout_batches=(256, 1024),
    prompt_tokens=64,
    rollout_new_tokens=256,
    rollout_max_pairs=6,
    grpo_prompts=32,
    grpo_group=8,
    grpo_new_tokens=128,
    grpo_max_iters=10,
)
SMOKE = Sizes(
    n_layer=2,
    n_embd=64,
    n_head=4,
    matmul_sizes=(128, 256),
    matmul_windows=3,
    matmul_per_window=2,
    rollout_batches=(8, 16),
    prompt_tokens=8,
    rollout_new_tokens=16,
    rollout_max_pairs=2,
    grpo_prompts=4,
    grpo_group=2,
    grpo_new_tokens=8,
    grpo_max_iters=2,
)


# ------------------------------------------------------------------------- time limits
class PhaseTimeout(BaseException):
    """Raised by the ``SIGALRM`` handler when a phase overruns its slice.

    A ``BaseException`` so that library code's ``except Exception`` cannot swallow it.
    """


def _on_alarm(signum: int, frame: object) -> None:
    raise PhaseTimeout()


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """``(seconds, fn())``, with the device synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


# ----------------------------------------------------------------------------- report
@dataclass
class Phase:
    """One section of the report. ``render`` builds its Markdown lines from whatever
    the phase has measured so far, so an interrupted phase still reports."""

    title: str
    status: str = "started, not finished (the run ended during this phase)"
    seconds: float = 0.0
    render: Callable[[], list[str]] | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        took = "" if self.status.startswith(("skipped", "started")) else f" ({self.seconds:.1f} s)"
        out = [f"## {self.title}", "", f"Status: {self.status}{took}.", ""]
        if self.render is not None:
            try:
                body = self.render()
            except Exception as err:  # a report must never crash the run
                body = [f"(could not render the results: {type(err).__name__}: {err})"]
            if body:
                out += [*body, ""]
        for note in self.notes:
            out += [note, ""]
        return out


@dataclass
class Report:
    """The whole Markdown report; rewritten to ``out`` after every phase."""

    header: list[str]
    out: Path | None
    phases: list[Phase] = field(default_factory=list)
    finished: bool = False

    def text(self) -> str:
        lines = list(self.header)
        if not self.finished:
            lines += ["**Partial: the run has not finished (or did not finish).**", ""]
        for p in self.phases:
            lines += p.lines()
        return "\n".join(lines).rstrip() + "\n"

    def write(self) -> None:
        if self.out is None:
            return
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.out.with_name(self.out.name + ".tmp")
            tmp.write_text(self.text())
            tmp.replace(self.out)
        except OSError as err:
            print(f"could not write {self.out}: {err}", flush=True)


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None or x != x else format(x, spec)


def pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def spread(xs: list[float]) -> str:
    """``median (min-max)`` of seconds."""
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def mem_gib(device: torch.device) -> str:
    """Peak allocated device memory since the phase started, e.g. ``"12.3 GiB"``."""
    if device.type != "cuda":
        return "n/a (CPU)"
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"


# ------------------------------------------------------------------------------ model
@dataclass(frozen=True)
class ModelInfo:
    """Shape and parameter counts of the benchmark model."""

    n_layer: int
    n_embd: int
    vocab: int  # ids the LM head computes (the tokenizer's)
    total_params: int
    non_embedding_params: int  # total minus token and position embeddings

    def forward_flops(self, rows: int, positions: int) -> float:
        """Forward FLOPs of ``rows`` sequences fed ``positions`` tokens each, causally.

        Position ``p`` (0-based) attends to ``p + 1`` tokens; see the module docstring
        for the per-token formula.
        """
        dense = 2.0 * (self.non_embedding_params + self.vocab * self.n_embd) * positions
        attention = 4.0 * self.n_layer * self.n_embd * positions * (positions + 1) / 2
        return rows * (dense + attention)


def build_model(
    sizes: Sizes, device: torch.device, dtype: torch.dtype
) -> tuple[nn.Module, Any, ModelInfo]:
    """GPT-2 from config on ``device`` in ``dtype``, EOS forbidden, and the char tokenizer."""
    from _lm import forbid_token

    from lmgym import make_tiny_lm

    model, tok = make_tiny_lm(
        n_layer=sizes.n_layer, n_embd=sizes.n_embd, n_head=sizes.n_head, n_positions=sizes.context
    )
    model = model.to(device=device, dtype=dtype)
    embeddings = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    forbid_token(model, tok.eos_token_id)
    info = ModelInfo(sizes.n_layer, sizes.n_embd, len(tok), total, total - embeddings)
    return model, tok, info


class CharShareReward:
    """Share of one token id among a completion's real tokens: ``[N] float32``, on device.

    Token-level, so the env never decodes text.
    """

    name = "char_share"

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, batch: Any) -> Tensor:
        ids, mask = batch.completion_ids, batch.completion_mask  # [N, T] int64, [N, T] bool
        hits = ((ids == self.token_id) & mask).sum(1).float()
        return hits / mask.sum(1).clamp(min=1).float()


# ------------------------------------------------------------------------------ phases
@dataclass
class Context:
    """What every phase shares."""

    sizes: Sizes
    device: torch.device
    dtype: torch.dtype
    model: nn.Module | None = None
    tok: Any = None
    info: ModelInfo | None = None
    peak_tflops: float | None = None  # measured matmul peak


def phase_matmul(ctx: Context, phase: Phase, deadline: float) -> None:
    """Measure the device's bf16 matmul peak; sets ``ctx.peak_tflops``."""
    s = ctx.sizes
    rows: list[tuple[int, list[float]]] = []  # (n, TFLOP/s of each window)

    def render() -> list[str]:
        out = [
            "| n (n x n @ n x n) | windows x products | TFLOP/s median | TFLOP/s best |",
            "|---:|---|---:|---:|",
        ]
        for n, tf in rows:
            if tf:
                out.append(
                    f"| {n} | {len(tf)} x {s.matmul_per_window} | {statistics.median(tf):.4g} "
                    f"| {max(tf):.4g} |"
                )
        out += [
            "",
            f"Measured peak (best window, all sizes): {fmt(ctx.peak_tflops, '.4g')} TFLOP/s.",
        ]
        return out

    phase.render = render
    cuda = ctx.device.type == "cuda"
    for n in s.matmul_sizes:
        if time.perf_counter() > deadline:
            phase.notes.append(f"Sizes from n = {n} on skipped: the phase's time ran out.")
            break
        a = torch.randn(n, n, device=ctx.device, dtype=ctx.dtype)
        b = torch.randn(n, n, device=ctx.device, dtype=ctx.dtype)
        c = torch.empty(n, n, device=ctx.device, dtype=ctx.dtype)
        for _ in range(3):
            torch.mm(a, b, out=c)
        sync(ctx.device)
        tflops: list[float] = []
        rows.append((n, tflops))
        for _ in range(s.matmul_windows):
            if cuda:
                start_ev = torch.cuda.Event(enable_timing=True)
                end_ev = torch.cuda.Event(enable_timing=True)
                start_ev.record()
                for _ in range(s.matmul_per_window):
                    torch.mm(a, b, out=c)
                end_ev.record()
                end_ev.synchronize()
                seconds = start_ev.elapsed_time(end_ev) / 1000.0
            else:
                start = time.perf_counter()
                for _ in range(s.matmul_per_window):
                    torch.mm(a, b, out=c)
                seconds = time.perf_counter() - start
            tflops.append(2.0 * n**3 * s.matmul_per_window / seconds / 1e12)
            ctx.peak_tflops = max(ctx.peak_tflops or 0.0, tflops[-1])
        del a, b, c


def phase_build(ctx: Context, phase: Phase, deadline: float) -> None:
    """Build the model (sets ``ctx.model``, ``ctx.tok``, ``ctx.info``)."""

    def render() -> list[str]:
        if ctx.info is None:
            return []
        i = ctx.info
        attn = getattr(ctx.model.config, "_attn_implementation", "?") if ctx.model else "?"
        return [
            f"GPT-2 from config: {ctx.sizes.n_layer} layers x {ctx.sizes.n_embd} wide, "
            f"{ctx.sizes.n_head} heads, context {ctx.sizes.context}, vocabulary {i.vocab} "
            f"(lmgym character tokenizer), attention `{attn}`, {ctx.dtype} weights on "
            f"`{ctx.device}`: {i.total_params / 1e6:.2f}M parameters, "
            f"{i.non_embedding_params / 1e6:.2f}M non-embedding (N in the FLOP formula).",
        ]

    phase.render = render
    ctx.model, ctx.tok, ctx.info = build_model(ctx.sizes, ctx.device, ctx.dtype)
    sync(ctx.device)


@dataclass
class Pairs:
    """Wall seconds of two alternated sides (warm-up runs kept apart)."""

    warmup: dict[str, list[float]] = field(default_factory=lambda: {"lmgym": [], "generate": []})
    timed: dict[str, list[float]] = field(default_factory=lambda: {"lmgym": [], "generate": []})

    def seconds(self, side: str) -> tuple[float | None, bool]:
        """``(median seconds, from warm-up only)``."""
        if self.timed[side]:
            return statistics.median(self.timed[side]), False
        if self.warmup[side]:
            return statistics.median(self.warmup[side]), True
        return None, False


def phase_rollout(ctx: Context, phase: Phase, deadline: float, batch: int) -> None:
    """``collect`` vs ``model.generate`` at ``batch`` rows (see the module docstring)."""
    from _lm import check_exact, fixed_length_env, generate_exact

    from lmgym import CausalLMPolicy, collect

    s, model, tok, info, dev = ctx.sizes, ctx.model, ctx.tok, ctx.info, ctx.device
    assert model is not None and info is not None
    lp, new = s.prompt_tokens, s.rollout_new_tokens
    tokens = batch * new
    flops = info.forward_flops(batch, lp + new - 1)
    pairs = Pairs()

    def render() -> list[str]:
        out = [
            "| side | s / rollout, median (min-max) | completion tok/s | model TFLOP/s "
            "| fraction of peak | timed runs |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        rates = {}
        for side, name in (("lmgym", "lmgym `collect`"), ("generate", "`model.generate`")):
            sec, warm_only = pairs.seconds(side)
            runs = pairs.timed[side] or pairs.warmup[side]
            flag = " (warm-up only)" if warm_only else ""
            rate = tokens / sec if sec else None
            rates[side] = rate
            tf = flops / sec / 1e12 if sec else None
            frac = tf / ctx.peak_tflops if tf and ctx.peak_tflops else None
            out.append(
                f"| {name}{flag} | {spread(runs)} | {fmt(rate, ',.0f')} | {fmt(tf, '.3g')} "
                f"| {pct(frac)} | {len(pairs.timed[side])} |"
            )
        ratio = rates["lmgym"] / rates["generate"] if rates["lmgym"] and rates["generate"] else None
        out += [
            "",
            f"B = {batch} rows, {lp}-token prompts, exactly {new} new tokens per row "
            f"({tokens:,} completion tokens, {flops / 1e12:.3g} TFLOP of model work per "
            f"rollout). Ratio lmgym / generate (tok/s): **{fmt(ratio)}x**. Peak device "
            f"memory in this phase: {mem_gib(dev)}.",
        ]
        return out

    phase.render = render
    policy = CausalLMPolicy(model, tok)
    env = fixed_length_env(tok, batch, lp, new, device=dev)
    input_ids = env.prompt_table.ids.clone()  # [B, Lp] int64: the prompts the env serves
    attention_mask = env.prompt_table.mask.long()  # [B, Lp], all ones (no padding)
    assert bool(attention_mask.all())
    seeds = iter(range(1_000_000))

    def run_lmgym() -> float:
        seed = next(seeds)
        seconds, out = wall(lambda: collect(env, policy, seed=seed), dev)
        assert out.completion_ids.shape == (batch, new)
        assert bool((out.lengths == new).all()), "lmgym: a row stopped early"
        assert torch.equal(out.prompt_ids, input_ids)
        return seconds

    def run_generate() -> float:
        torch.manual_seed(next(seeds))

        def gen() -> Tensor:
            return generate_exact(model, input_ids, attention_mask, new, tok)

        seconds, out = wall(gen, dev)
        assert out.shape[0] == batch
        check_exact(out, lp, new, tok)
        return seconds

    sides = {"lmgym": run_lmgym, "generate": run_generate}
    for side, fn in sides.items():  # warm-up
        pairs.warmup[side].append(fn())
    pair_s = sum(pairs.warmup[k][0] for k in sides)
    for i in range(s.rollout_max_pairs):
        if time.perf_counter() + pair_s > deadline:
            phase.notes.append(
                f"Stopped after {i} timed pairs (at most {s.rollout_max_pairs}): the next "
                "pair would not fit in the phase's time."
            )
            break
        order = ("lmgym", "generate") if i % 2 == 0 else ("generate", "lmgym")
        for side in order:
            pairs.timed[side].append(sides[side]())


def phase_iteration(ctx: Context, phase: Phase, deadline: float) -> None:
    """GRPO ``agent.step()`` in the model's dtype on its own copy of the model."""
    from _lm import make_prompts

    from lmgym import CausalLMPolicy, TokenVectorEnv
    from lmgym.agents import GRPO

    s, tok, info, dev = ctx.sizes, ctx.tok, ctx.info, ctx.device
    assert ctx.model is not None and info is not None
    p, g, lp, new = s.grpo_prompts, s.grpo_group, s.prompt_tokens, s.grpo_new_tokens
    rows = p * g
    tokens = rows * new
    rollout_flops = info.forward_flops(rows, lp + new - 1)
    update_flops = 3.0 * info.forward_flops(rows, lp + new)
    steps: list[float] = []
    warm: list[float] = []
    parts: dict[str, list[float]] = {"collect": [], "train_on_batch": []}
    timing = {"on": False}

    def render() -> list[str]:
        series, flag = (steps, "") if steps else (warm, " (warm-up only)")
        sec = statistics.median(series) if series else None
        tf = (rollout_flops + update_flops) / sec / 1e12 if sec else None
        frac = tf / ctx.peak_tflops if tf and ctx.peak_tflops else None
        n = len(steps)  # the parts of the timed steps (not timed during the warm-up)
        col_s, upd_s = parts["collect"][:n], parts["train_on_batch"][:n]
        col = statistics.median(col_s) if col_s else None
        upd = statistics.median(upd_s) if upd_s else None
        upd_tf = update_flops / upd / 1e12 if upd else None
        upd_frac = upd_tf / ctx.peak_tflops if upd_tf and ctx.peak_tflops else None
        col_tf = rollout_flops / col / 1e12 if col else None
        col_frac = col_tf / ctx.peak_tflops if col_tf and ctx.peak_tflops else None
        return [
            "| part | s / iteration, median (min-max) | tok/s | model TFLOP/s "
            "| fraction of peak | timed iterations |",
            "|---|---:|---:|---:|---:|---:|",
            f"| `agent.step()`{flag} | {spread(series)} | {fmt(tokens / sec if sec else None, ',.0f')} "
            f"| {fmt(tf, '.3g')} | {pct(frac)} | {len(steps)} |",
            f"| of which `collect` | {spread(col_s)} "
            f"| {fmt(tokens / col if col else None, ',.0f')} | {fmt(col_tf, '.3g')} | {pct(col_frac)} | |",
            f"| of which `train_on_batch` | {spread(upd_s)} "
            f"| {fmt(rows * (lp + new) / upd if upd else None, ',.0f')} | {fmt(upd_tf, '.3g')} "
            f"| {pct(upd_frac)} | |",
            "",
            f"GRPO, {p} prompts x {g} completions ({rows} rows), {lp}-token prompts, exactly "
            f"{new} new tokens per row ({tokens:,} completion tokens per iteration), beta 0, "
            f"one epoch, one minibatch, AdamW lr 1e-6, {ctx.dtype} weights and optimizer "
            "state. tok/s: completion tokens for `agent.step()` and `collect`, sequence "
            f"tokens ({rows} x {lp + new}) for `train_on_batch`. Model work per iteration: "
            f"{rollout_flops / 1e12:.3g} TFLOP rollout + {update_flops / 1e12:.3g} TFLOP "
            f"update. Peak device memory in this phase: {mem_gib(dev)}.",
        ]

    phase.render = render
    # Its own copy: training must not change the model the rollout phases sample from.
    model = copy.deepcopy(ctx.model)
    policy = CausalLMPolicy(model, tok)
    reward_id = tok.convert_tokens_to_ids(REWARD_CHAR)
    env = TokenVectorEnv(
        tok,
        make_prompts(tok, max(64, p), lp, seed=1),
        CharShareReward(reward_id),
        num_prompts=p,
        group_size=g,
        max_new_tokens=new,
        device=dev,
    )
    agent = GRPO(policy, env, learning_rate=1e-6, beta=0.0, seed=0)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seconds, out = wall(lambda: fn(*args, **kwargs), dev)
            if timing["on"]:
                parts[name].append(seconds)
            return out

        return wrapper

    agent.collect = timed("collect", agent.collect)  # type: ignore[method-assign]
    agent.train_on_batch = timed("train_on_batch", agent.train_on_batch)  # type: ignore[method-assign]

    def one_step() -> float:
        before = agent.tokens_generated
        seconds, metrics = wall(agent.step, dev)
        made = agent.tokens_generated - before
        assert made == tokens, f"lmgym generated {made} tokens, expected {tokens}"
        assert metrics["completion_length"] == new
        return seconds

    warm.append(one_step())
    timing["on"] = True
    for i in range(s.grpo_max_iters):
        if time.perf_counter() + warm[0] > deadline:
            phase.notes.append(
                f"Stopped after {i} timed iterations (at most {s.grpo_max_iters}): the next "
                "would not fit in the phase's time."
            )
            break
        steps.append(one_step())


# -------------------------------------------------------------------------------- run
def run_phase(
    report: Report,
    title: str,
    fn: Callable[[Phase, float], None],
    slice_s: float,
    budget_end: float,
    device: torch.device,
    grace_s: float,
) -> str:
    """Run one phase in its time slice; record its outcome; rewrite the report.

    The phase's soft deadline (``now + slice_s``, at most ``budget_end``) is passed
    to ``fn``, which should not start work it cannot finish by then; ``SIGALRM``
    interrupts it ``grace_s`` later.

    Returns:
        ``"done"``, ``"skipped"`` (no time left), ``"interrupted"`` (over its slice)
        or ``"failed"`` (an exception; its traceback goes into the report).
    """
    phase = Phase(title)
    report.phases.append(phase)
    now = time.perf_counter()
    left = budget_end - now
    if left < MIN_PHASE_S:
        phase.status = f"skipped: {left:.1f} s of the time budget left (< {MIN_PHASE_S:.0f} s)"
        print(f"\n[{title}] {phase.status}", flush=True)
        report.write()
        return "skipped"
    deadline = now + min(slice_s, left)
    print(f"\n[{title}] starting, {deadline - now:.0f} s slice", flush=True)
    report.write()  # a run ended during this phase still shows which one it was
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    outcome = "failed"
    alarm = hasattr(signal, "setitimer")
    try:
        try:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, max(1.0, deadline - now + grace_s))
            fn(phase, deadline)
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        phase.status = outcome = "done"
    except PhaseTimeout:
        outcome = "interrupted"
        phase.status = (
            f"interrupted: over its time slice ({deadline - now:.0f} s + {grace_s:.0f} s grace); "
            "figures below are what it measured before"
        )
    except Exception as err:
        phase.status = f"failed: {type(err).__name__}: {str(err)[:500]}"
        tail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
        phase.notes.append("```\n" + tail.rstrip()[-3000:] + "\n```")
        traceback.print_exc()
    phase.seconds = time.perf_counter() - now
    try:
        sync(device)
    except Exception as err:  # a broken CUDA context: later phases will say so too
        phase.notes.append(f"Device synchronize after the phase failed: {err}")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print("\n".join(phase.lines()), flush=True)
    report.write()
    return outcome


def header(args: argparse.Namespace, device: torch.device, sizes: Sizes) -> list[str]:
    import transformers

    import lmgym

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        machine = (
            f"{torch.cuda.get_device_name(device)}, {props.total_memory / 2**30:.0f} GiB, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}, "
            f"{os.cpu_count()} CPU cores"
        )
    else:
        machine = f"CPU only ({os.cpu_count()} cores, {platform.machine()})"
    exe = os.path.relpath(sys.executable)
    exe = sys.executable if exe.startswith("..") else exe
    command = shlex.join([exe, "benchmarks/gpu.py", *sys.argv[1:]])
    mode = "smoke sizes: a test of the script, not a measurement" if args.smoke else "full sizes"
    return [
        "# lmgym GPU throughput: rollout and GRPO iteration, bf16",
        "",
        f"- date: {now}",
        f"- device: {machine}",
        f"- python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, lmgym {lmgym.__version__}",
        f"- command: `{command}` ({mode}; time budget {args.time_budget:.0f} s)",
        "- method: phases in order (matmul peak, model build, rollout at the first batch "
        "size, GRPO iteration, rollout at the other batch sizes), each in a time slice; "
        "device synchronized around every timed call; rollout sides alternated ABBA after "
        "one warm-up each; medians. Model FLOPs per forward token at a position attending "
        "to k tokens: 2 (N + V d) + 4 n_layer d k (N = non-embedding parameters, V d = LM "
        "head, last term = attention); a rollout feeds Lp + L - 1 positions per row; the "
        "update = 3x the forward over Lp + L positions; fraction of peak = model TFLOP/s "
        "/ the measured bf16 matmul peak. Equal work: EOS gets a -1e9 output bias, so "
        "every row makes exactly the stated number of tokens on both sides (asserted). "
        "Details: the docstring of `benchmarks/gpu.py`.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model and sizes: tests the script on CPU"
    )
    parser.add_argument(
        "--out", type=Path, help="write the Markdown results here (after each phase)"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=240.0,
        metavar="SECONDS",
        help="whole-run budget counted from start-up (default 240); phases that do not fit "
        "are cut short or skipped, and the process is ended 60 s after it in any case",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"benchmarks/gpu.py: --device {args.device} but CUDA is not available "
            f"(torch {torch.__version__}); nothing to do. Use --device cpu --smoke to test "
            "the script on CPU.",
            flush=True,
        )
        return 0
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    faulthandler.dump_traceback_later(
        max(1.0, args.time_budget + WATCHDOG_GRACE_S - (time.perf_counter() - T0)), exit=True
    )
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _on_alarm)

    import transformers

    transformers.logging.set_verbosity_error()
    sizes = SMOKE if args.smoke else FULL
    ctx = Context(sizes, device, torch.bfloat16)
    budget_end = T0 + args.time_budget
    report = Report(header(args, device, sizes), args.out)
    print("\n".join(report.header), flush=True)
    report.write()

    b = args.time_budget
    grace = max(5.0, 0.05 * b)
    plan: list[tuple[str, Callable[[Phase, float], None], float]] = [
        ("Matmul peak (bf16)", lambda ph, d: phase_matmul(ctx, ph, d), min(30.0, 0.12 * b)),
        ("Model", lambda ph, d: phase_build(ctx, ph, d), 0.15 * b),
    ]
    first, *rest = sizes.rollout_batches

    def rollout(batch: int) -> Callable[[Phase, float], None]:
        return lambda ph, d: phase_rollout(ctx, ph, d, batch)

    def title(batch: int) -> str:
        return (
            f"Rollout, B = {batch}: lmgym collect vs model.generate "
            f"({sizes.prompt_tokens} + {sizes.rollout_new_tokens} tokens)"
        )

    plan.append((title(first), rollout(first), 0.28 * b))
    plan.append(
        (
            f"GRPO iteration ({sizes.grpo_prompts} x {sizes.grpo_group}, "
            f"{sizes.grpo_new_tokens} new tokens)",
            lambda ph, d: phase_iteration(ctx, ph, d),
            0.28 * b,
        )
    )
    for batch in rest:
        plan.append((title(batch), rollout(batch), b))  # whatever is left

    failed = False
    for name, fn, slice_s in plan:
        needs_model = name != "Matmul peak (bf16)" and name != "Model"
        if needs_model and ctx.model is None:
            phase = Phase(name, status="skipped: no model (the model phase did not complete)")
            report.phases.append(phase)
            print(f"\n[{name}] {phase.status}", flush=True)
            failed = True
            continue
        outcome = run_phase(report, name, fn, slice_s, budget_end, device, grace)
        failed = failed or outcome == "failed"
    report.finished = True
    total = time.perf_counter() - T0
    report.header.insert(-1, f"- run time: {total:.0f} s in all (budget {args.time_budget:.0f} s)")
    report.write()
    print("\n" + "=" * 80 + "\n" + report.text(), flush=True)
    if args.out is not None:
        print(f"wrote {args.out}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
