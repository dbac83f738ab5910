"""Ragged decode attention: what reading each row's own cache columns would save.

Continuous batching (``continuous.py``) keeps every row's KV columns from 0, so a
decode step's attention reads, for every row, as many columns as the longest
in-flight row holds (``filled``, ~123-142 in that benchmark) while a row holds ~78
real ones on average (its long episodes' ages are about uniform). This script
times one eager decode step of the trunk (``CausalLMPolicy.hidden_states`` over
``kv_slots`` with per-row columns, as after restarts) on such a cache, four ways:

- ``dense``: what lmgym does: attention reads ``[0, filled)`` with the per-row mask
  (transformers' SDPA attention).
- ``ideal``: every row exactly ``mean`` columns long, no column masked: the cost of a
  ragged kernel that reads each row's own columns at dense efficiency (a lower
  bound: no real ragged kernel does better).
- ``buckets``: rows sorted by length, attention per contiguous quarter of the rows
  over that quarter's longest row (``rows bucketed by age``, and optimistic: the
  cost of keeping the rows sorted, a copy of a restarted row's cache, is left out).
- ``flex``: ``torch.compile(flex_attention)`` with a ``BlockMask`` of each row's
  column blocks (``--block-size``), registered with transformers'
  ``AttentionInterface`` (torch's block-sparse attention kernel).

Lengths: 64 rows; row ``i`` holds a 16-token prompt and a completion of a uniform
random age in 1..128 (seeded), the longest set to ``--filled`` - 1. ``buckets`` and
``flex`` must give ``dense``'s hidden states (asserted, ``1e-4``). Variants are timed
round-robin after a warm-up, medians; each model in ``--processes`` fresh processes
(the median of their medians). The model is an untrained tiny GPT-2 of
``workloads.SIZES`` (timing does not depend on the weights).

    .venv/bin/python benchmarks/ragged.py --wait-idle 60 --out benchmarks/results/ragged.md
    .venv/bin/python benchmarks/ragged.py --quick   # smoke run
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import harness as h
import torch
import workloads as w
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.nn.functional import scaled_dot_product_attention as sdpa
from transformers import AttentionInterface, DynamicCache

from lmgym import CausalLMPolicy
from lmgym.policy.kv_slots import set_step, to_slots

NUM_THREADS, ROWS, PROMPT_TOKENS, NEW_TOKENS, BUCKETS = 2, 64, 16, 128, 4
VARIANTS = ("dense", "ideal", "buckets", "flex")
TOLERANCE = 1e-4
PLAN: dict[str, object] = {}  # the attention plan of the step being run


def bucket_attention(module: object, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor, scaling: float | None = None,
                     **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """Per contiguous row range ``(start, end, width)`` of ``PLAN["buckets"]``: SDPA over
    the range's first ``width`` columns. Returns ``[N, 1, H, D]``."""
    outs = [
        sdpa(
            query[a:b],
            key[a:b, :, :n],
            value[a:b, :, :n],
            attention_mask[a:b, ..., :n],
            scale=scaling,
        )
        for a, b, n in PLAN["buckets"]  # type: ignore[attr-defined]
    ]
    return torch.cat(outs).transpose(1, 2), None


def flex_ragged(module: object, query: Tensor, key: Tensor, value: Tensor,
                attention_mask: Tensor, scaling: float | None = None,
                **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """Compiled ``flex_attention`` over the whole slot buffers with ``PLAN["block_mask"]``."""
    flex = PLAN["flex"]
    out = flex(query, key, value, block_mask=PLAN["block_mask"], scale=scaling)  # type: ignore[operator]
    return out.transpose(1, 2), None


AttentionInterface.register("bench_buckets", bucket_attention)
AttentionInterface.register("bench_flex", flex_ragged)


def block_mask(cache_mask: Tensor, cols: Tensor, block: int) -> BlockMask:
    """Row ``i`` reads the blocks up to its newest column ``cols[i]``, and inside them
    the columns ``cache_mask[i]`` allows."""
    n, capacity = cache_mask.shape
    blocks = -(-capacity // block)
    padded = torch.nn.functional.pad(cache_mask, (0, blocks * block - capacity))

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return padded[b, kv]

    counts = (cols // block + 1).to(torch.int32)[:, None, None]
    indices = torch.arange(blocks, dtype=torch.int32).expand(n, 1, 1, blocks)
    return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(1, capacity))  # fmt: skip


def slot_cache(policy: CausalLMPolicy, width: int, capacity: int) -> DynamicCache:
    """``ROWS`` rows of ``width`` random tokens prefilled, moved into ``capacity`` slots."""
    cache = DynamicCache(config=policy.model.config)
    ids = torch.randint(0, 20, (ROWS, width))
    policy.hidden_states(ids, None, torch.arange(width).expand(ROWS, -1), cache)
    to_slots(cache, capacity)
    return cache


@dataclass
class Run:
    """One process: median ms per trunk step of each variant."""

    ms: dict[str, float]
    mean_columns: float
    other_load: float
    max_diff: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:  # dense / ideal: the most a ragged read could gain
        return self.ms["dense"] / self.ms["ideal"]


def bench(model: str, args: argparse.Namespace, _: int) -> Run:
    torch.manual_seed(0)
    lm, tok = w.tiny_gpt2(model, n_positions=NEW_TOKENS + PROMPT_TOKENS + 8)
    policy = CausalLMPolicy(lm, tok)
    trunk_config = lm.base_model.config
    capacity = args.filled + 1
    cols = (PROMPT_TOKENS + torch.randint(0, NEW_TOKENS, (ROWS,))).clamp(max=args.filled - 1)
    cols[-1] = args.filled - 1  # cols[i]: row i's newest column; sorted for the buckets
    cols = cols.sort().values
    mask = torch.arange(capacity)[None] <= cols[:, None]
    mean = round(float(cols.float().mean()) + 1)
    tokens = torch.randint(0, 20, (ROWS, 1))
    quarter = ROWS // BUCKETS
    PLAN["buckets"] = [(a, a + quarter, int(cols[a + quarter - 1]) + 1)
                       for a in range(0, ROWS, quarter)]  # fmt: skip
    PLAN["flex"] = torch.compile(flex_attention, dynamic=False)
    with torch.inference_mode():
        cache = slot_cache(policy, args.filled, capacity)
        ideal_cache = slot_cache(policy, mean, capacity)
        ideal_cols = torch.full((ROWS,), mean - 1)
        ideal_mask = torch.ones(ROWS, mean, dtype=torch.bool)  # every column real

        def step(variant: str) -> Tensor:
            if variant == "ideal":
                set_step(ideal_cache, ideal_cols, mean)
                return policy.hidden_states(tokens, ideal_mask, ideal_cols[:, None], ideal_cache)
            if variant == "flex":
                PLAN["block_mask"] = block_mask(mask, cols, args.block_size)
            set_step(cache, cols, args.filled, read_all=variant == "flex")
            previous = trunk_config._attn_implementation
            if variant != "dense":
                trunk_config._attn_implementation = f"bench_{variant}"
            # The custom attentions take the [N, 1, 1, W] mask as it is (transformers
            # builds masks only for the attention kinds it knows).
            given = mask[:, : args.filled]
            given = given if variant == "dense" else given[:, None, None]
            try:
                return policy.hidden_states(tokens, given, cols[:, None], cache)
            finally:
                trunk_config._attn_implementation = previous

        reference = step("dense")
        diffs = {v: float((step(v) - reference).abs().max()) for v in ("buckets", "flex")}
        for variant, diff in diffs.items():
            assert diff <= TOLERANCE, f"{variant}: hidden states differ from dense by {diff:.1e}"

        def timed(variant: str) -> float:
            start = time.perf_counter()
            step(variant)
            return time.perf_counter() - start

        meter = h.CpuMeter()
        for _ in range(args.warmup):
            for v in VARIANTS:
                timed(v)
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for i in range(args.repeats):
            for v in VARIANTS[:: 1 if i % 2 == 0 else -1]:
                seconds[v].append(timed(v))
    ms = {v: statistics.median(s) * 1e3 for v, s in seconds.items()}
    return Run(ms, float(cols.float().mean()) + 1, meter.other_load(), diffs)


def report(
    rows: list[h.Runs[Run]], args: argparse.Namespace, command: str, wall: float
) -> list[str]:
    lines = h.header("Ragged decode attention: each row's own cache columns vs the longest row's",
                     f"torch threads = {args.threads}", ["torch", "transformers", "lmgym"], command,
                     note=f" (total {wall:.0f} s)")  # fmt: skip
    lines += [
        f"- work: one eager trunk step (`hidden_states`) of {ROWS} rows with per-row KV "
        f"columns; {args.filled} columns in use (the longest row), rows "
        f"{rows[0].runs[0].mean_columns:.1f} columns long on average; flex block size "
        f"{args.block_size}; {BUCKETS} buckets",
        f"- method: variants round-robin after {args.warmup} warm-up round(s), {args.repeats} "
        f"timed rounds, in each of {args.processes} fresh process(es); ms = median of the "
        "per-process medians; 'ideal saving' = dense - ideal. Details: the script's docstring.",
        "",
        *h.table(
            "model | dense ms | ideal ms | buckets ms | flex ms | ideal saving ms (share of "
            "dense) | max abs diff (buckets / flex) | other CPU load",
            [_row(r) for r in rows],
        ),
        "",
        "Per process, dense / ideal ms (the most a ragged read could speed up this step):",
        *h.ratios_block(rows)[1:],
    ]
    return lines


def _row(r: h.Runs[Run]) -> str:
    ms = {v: statistics.median(run.ms[v] for run in r.runs) for v in VARIANTS}
    diff = {v: max(run.max_diff[v] for run in r.runs) for v in ("buckets", "flex")}
    saving = ms["dense"] - ms["ideal"]
    cells = " | ".join(f"{ms[v]:.2f}" for v in VARIANTS)
    return (f"{r.name} | {cells} | {saving:.2f} ({saving / ms['dense']:.0%}) | "
            f"{diff['buckets']:.1e} / {diff['flex']:.1e} | {h.load_cell(r.other_load)}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run: small model, 3 rounds, 1 process")
    p.add_argument(
        "--filled", type=int, default=142, help="columns in use, the longest row's (142)"
    )
    p.add_argument("--block-size", type=int, default=32, help="flex attention's KV block (32)")
    h.add_common(p, NUM_THREADS, list(w.SIZES), 3, "31, --quick 3", "3, --quick 1")
    args = p.parse_args(argv)
    h.fill_defaults(args, dict(models="small,large", repeats=31, processes=3),
                    dict(models="small", repeats=3, processes=1))  # fmt: skip
    if not PROMPT_TOKENS < args.filled <= PROMPT_TOKENS + NEW_TOKENS:
        p.error(
            f"--filled {args.filled}: must be in ({PROMPT_TOKENS}, {PROMPT_TOKENS + NEW_TOKENS}]"
        )
    h.quiet_worker(args.threads)
    t0 = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, t0)
    rows = []
    for m in h.csv(args.models, list(w.SIZES), "--models", p):
        work: Callable[[int], Run] = functools.partial(bench, m, args)
        rows.append(h.run_row(w.SIZES[m][0], work, args.processes, args.threads, deadline))
    command = h.command_line("ragged.py", argv)
    h.finish(report(rows, args, command, time.perf_counter() - t0), args.out)


if __name__ == "__main__":
    main()
