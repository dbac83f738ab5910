"""Length-bucketed updates: ``train_on_batch`` with ``bucket_by_length=True`` against False.

Update time only (``agent.train_on_batch(batch)``, no rollout) on one fixed
bimodal batch, as continuous batching produces: 64 rows (8 prompts x 8
completions, 16-token prompts, ``max_new_tokens=128``) where every other row of
each group stops after 3 tokens (2 characters + EOS, ``terminated``) and the rest
run to 128 (``truncated``). The batch is built by hand (random characters, random
scores, sampler log-probs < 0), so its lengths are exact and both sides get the
very same ``RolloutBatch``.

Sides: two ``GRPO`` agents (one epoch, one minibatch, ``micro_batch_size`` 8 by
default, so 8 micro-batches per update; beta 0) over copies of the same tiny GPT-2,
differing only in ``bucket_by_length``. Padded (False): each micro-batch takes rows
in shuffled order and its teacher-forced pass runs over all 128 completion columns.
Bucketed (True): a minibatch's rows are sorted by length into micro-batches, each
pass trimmed to its own longest completion; the whole-minibatch normalisers keep the
loss unchanged.

Equal work, asserted in every process before timing: from identical weights, one
update of each side gives the same gradient (every parameter within ``1e-6``; the
largest difference is reported). Then both sides alternate (ABBA) after a warm-up;
each row runs in ``--processes`` fresh processes and reports the median of the
per-process ratios padded / bucketed seconds (> 1: bucketing is faster).

    .venv/bin/python benchmarks/update.py --wait-idle 600 --out benchmarks/results/update.md
    .venv/bin/python benchmarks/update.py --quick   # smoke run
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import statistics
import sys
import time
from dataclasses import dataclass

import harness as h
import torch
import workloads as w

from lmgym import CausalLMPolicy, RolloutBatch, TokenVectorEnv
from lmgym.agents import GRPO
from lmgym.char_tokenizer import DEFAULT_CHARS

NUM_THREADS, PROMPTS, GROUP, PROMPT_TOKENS, NEW_TOKENS, SHORT = 2, 8, 8, 16, 128, 3
TARGET = 1.5  # padded / bucketed seconds per update
GRAD_TOLERANCE = 1e-6


def bimodal_batch(tok: object, seed: int = 0) -> RolloutBatch:
    """``PROMPTS x GROUP`` rows, one shared prompt per group; even rows stop after
    ``SHORT`` tokens (the last one EOS), odd rows run to ``NEW_TOKENS``."""
    gen = torch.Generator().manual_seed(seed)
    chars = torch.tensor(tok.convert_tokens_to_ids(list(DEFAULT_CHARS)))  # type: ignore[attr-defined]
    rows, cols = PROMPTS * GROUP, torch.arange(NEW_TOKENS)
    group_ids = torch.arange(rows) // GROUP
    prompts = chars[torch.randint(len(chars), (PROMPTS, PROMPT_TOKENS), generator=gen)]
    short = torch.arange(rows) % 2 == 0
    lengths = torch.where(short, SHORT, NEW_TOKENS)
    mask = cols < lengths[:, None]  # [B, L] bool
    ids = chars[torch.randint(len(chars), (rows, NEW_TOKENS), generator=gen)]
    ids[short, SHORT - 1] = tok.eos_token_id  # type: ignore[attr-defined]
    last = cols == (lengths - 1)[:, None]
    scores = torch.rand(rows, generator=gen)
    values = dict(
        prompt_ids=prompts[group_ids],
        prompt_mask=torch.ones(rows, PROMPT_TOKENS, dtype=torch.bool),
        completion_ids=ids.masked_fill(~mask, tok.pad_token_id),  # type: ignore[attr-defined]
        completion_mask=mask,
        sampler_logprobs=-4.0 * torch.rand(rows, NEW_TOKENS, generator=gen) * mask,
        rewards=scores[:, None] * last,
        dones=last,
        group_ids=group_ids,
        prompt_index=group_ids,
        lengths=lengths,
        terminated=short,
        truncated=~short,
        valid=torch.ones(rows, dtype=torch.bool),
    )
    # Per-row statistics the update does not read (e.g. ``special_mass``): zeros.
    # Fields with a default (``policy_mask``: a single-turn batch's is its completion
    # mask) keep it.
    rest = {
        f.name: torch.zeros(rows)
        for f in dataclasses.fields(RolloutBatch)
        if f.default is dataclasses.MISSING
    }
    return RolloutBatch(**{**rest, **values})


@dataclass
class Row(h.Comparison):
    """``a`` = padded, ``b`` = bucketed median seconds per update; ``ratio`` = a / b."""

    grad_diff: float = 0.0  # largest |gradient difference| over parameters and processes


def bench(model: str, args: argparse.Namespace, _: int) -> Row:
    start = time.perf_counter()
    name = w.SIZES[model][0]
    lm, tok = w.tiny_gpt2(model, n_positions=160)
    batch = bimodal_batch(tok)
    # The agents need an env of the batch's shape; it is never stepped.
    env = TokenVectorEnv(tok, ["ab"], w.ZeroReward(), num_prompts=PROMPTS, group_size=GROUP,
                         max_new_tokens=NEW_TOKENS)  # fmt: skip
    agents = {
        bucket: GRPO(CausalLMPolicy(copy.deepcopy(lm), tok), env, learning_rate=1e-4, seed=0,
                     micro_batch_size=args.micro_batch_size, bucket_by_length=bucket,
                     **h.ONE_STEP)
        for bucket in (False, True)
    }  # fmt: skip
    for agent in agents.values():  # one update each from identical weights
        agent.train_on_batch(batch)
    params = [[p for g in a.optimizer.param_groups for p in g["params"]] for a in agents.values()]
    diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(*params, strict=True))
    assert diff <= GRAD_TOLERANCE, f"{name}: bucketed and padded gradients differ by {diff:.2e}"

    def update(bucket: bool) -> float:
        start = time.perf_counter()
        agents[bucket].train_on_batch(batch)
        return time.perf_counter() - start

    meter = h.CpuMeter()
    padded, bucketed = h.alternate(
        lambda: update(False), lambda: update(True), args.warmup, args.repeats
    )
    seconds = statistics.median(padded), statistics.median(bucketed)
    load = meter.other_load()
    return Row(name, *seconds, args.repeats, load, time.perf_counter() - start, grad_diff=diff)


def report(rows: list[Row], args: argparse.Namespace, command: str, wall: float) -> list[str]:
    micro = -(-PROMPTS * GROUP // args.micro_batch_size)
    lines = h.header("Length-bucketed updates: bucket_by_length=True vs False",
                     f"torch threads = {args.threads}", ["torch", "transformers", "lmgym"], command,
                     note=f" (total {wall:.0f} s)")  # fmt: skip
    lines += [
        f"- work: `GRPO.train_on_batch` on one hand-built batch of {PROMPTS} prompts x {GROUP} "
        f"completions, {PROMPT_TOKENS}-token prompts, max_new_tokens = {NEW_TOKENS}; half the "
        f"rows of every group {SHORT} tokens long, half {NEW_TOKENS}; one epoch, one minibatch, "
        f"micro_batch_size = {args.micro_batch_size} ({micro} micro-batches), beta 0",
        f"- method: alternated (ABBA) after {args.warmup} warm-up pair(s), {args.repeats} timed "
        f"updates per side in each of {args.processes} fresh process(es); seconds = medians "
        "over processes; ratio = padded / bucketed seconds (> 1: bucketing faster), the median "
        "of the per-process ratios. Gradients of one update from identical weights compared "
        f"first (asserted <= {GRAD_TOLERANCE:g}).",
        "",
        *h.table(
            "model | padded s/update | bucketed s/update | ratio | target | max abs gradient "
            "difference | other CPU load",
            [f"{r.name} | {r.a:.3f} | {r.b:.3f} | {r.ratio:.2f}x | >= {TARGET:g}x "
             f"| {r.grad_diff:.1e} | {h.load_cell(r.other_load)}" for r in rows],
        ),
        *h.ratios_block(rows),
        *h.targets_section(
            "Target",
            [h.target_line(r.name, r.ratio, TARGET, "bucketed vs padded") for r in rows],
            rows,
        ),
    ]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run: small model, 2 repeats, 1 process")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per micro-batch (8)")
    h.add_common(p, NUM_THREADS, list(w.SIZES), 1, "7, --quick 2", "3, --quick 1")
    args = p.parse_args(argv)
    h.fill_defaults(args, dict(models="small,large", repeats=7, processes=3),
                    dict(models="small", repeats=2, processes=1))  # fmt: skip
    if "bucket_by_length" not in {f.name for f in dataclasses.fields(GRPO.config_class)}:
        sys.exit("update.py: this lmgym's AgentConfig has no bucket_by_length field yet")
    h.quiet_worker(args.threads)
    t0 = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, t0)
    rows = []
    for m in h.csv(args.models, list(w.SIZES), "--models", p):
        work = functools.partial(bench, m, args)
        runs = h.in_processes(work, args.processes, args.threads, deadline, w.SIZES[m][0])
        row = Row(**vars(h.pool(runs)), grad_diff=max(r.grad_diff for r in runs))
        rows.append(row if len(runs) > 1 else runs[0])
        print(f"{rows[-1].name}: {rows[-1].ratio:.2f}x (grad diff {row.grad_diff:.1e})", flush=True)
    command = h.command_line("update.py", argv)
    h.finish(report(rows, args, command, time.perf_counter() - t0), args.out)


if __name__ == "__main__":
    main()
