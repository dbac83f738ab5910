"""Peak memory of lmgym's teacher-forced log-prob pass against a naive full-vocabulary one.

lmgym: ``lmgym.policy.logprobs.token_logprobs(hidden, weight, None, targets, ...)``,
which applies the LM head to chunks of positions and, with gradients, recomputes
each chunk in the backward pass (no ``[B, L, V]`` tensor is ever held). Naive:
``F.log_softmax(hidden @ weight.T, -1).gather(-1, targets)`` (entropy, where asked,
``-(p * log p).sum(-1)`` from the same log-softmax), float32.

Shapes (issue 7): ``B = 16, L = 256, V = 32000``, hidden width ``H = --hidden``
(768), float32, CPU; one ``[B, L, V]`` float32 tensor is 500 MiB. Cases, each for
both sides: (1) no grad, log-probs (the old/reference pass); (2) no grad, log-probs
+ entropy; (3) forward + ``backward`` of ``logprobs.sum()`` with ``hidden`` and
``weight`` requiring grad (the ``[V, H]`` weight gradient is allocated on both
sides); (4) the same with ``+ entropy.sum()`` (what lmgym's update runs).

Peak memory on CPU: every measurement runs in a fresh subprocess with
``MALLOC_MMAP_THRESHOLD_=65536``, so glibc serves every allocation of 64 KiB or more
with ``mmap`` and returns it on free (the resident set then tracks live tensors).
The worker runs the pass once on tiny shapes (library initialisation), builds the
inputs, resets the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``),
records ``VmRSS``, runs the pass and reads ``VmHWM``: peak = ``VmHWM - VmRSS``, the
memory the pass needed on top of its inputs. Linux only. Median over ``--repeats``
processes.

    .venv/bin/python benchmarks/memory.py --out benchmarks/results/memory.md
    .venv/bin/python benchmarks/memory.py --quick      # smoke run, < 60 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness as h
import torch
import torch.nn.functional as F

B, L, V = 16, 256, 32000
TARGET = 0.5  # lmgym peak / naive peak
CASES = {  # number -> (name, grad, entropy)
    1: ("no grad, log-probs", False, False),
    2: ("no grad, log-probs + entropy", False, True),
    3: ("grad + backward, log-probs", True, False),
    4: ("grad + backward, log-probs + entropy", True, True),
}
SIDES = ("lmgym", "naive")
MIB = 1 << 20


def worker(side: str, case: int, hidden_size: int, threads: int) -> dict[str, float]:
    """Run one pass in this (fresh) process; return its peak extra memory and seconds."""
    from lmgym.policy.logprobs import token_logprobs

    torch.set_num_threads(threads)
    _, grad, entropy = CASES[case]

    def run(hid: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> None:
        if side == "lmgym":
            lp, ent = token_logprobs(hid, w, None, targets, 1.0, with_entropy=entropy)
        else:
            log_p = F.log_softmax(F.linear(hid, w).float(), dim=-1)
            lp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            ent = -(log_p.exp() * log_p).sum(-1) if entropy else None
        if grad:
            (lp.sum() + (ent.sum() if entropy else 0.0)).backward()

    def inputs(b: int, length: int, v: int, hsz: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        hid = torch.randn(b, length, hsz, generator=gen).requires_grad_(grad)
        w = (torch.randn(v, hsz, generator=gen) * hsz**-0.5).requires_grad_(grad)
        return hid, w, torch.randint(0, v, (b, length), generator=gen)

    with torch.set_grad_enabled(grad):  # initialise MKL, autograd, checkpointing
        run(*inputs(2, 8, 64, 16))
    tensors = inputs(B, L, V, hidden_size)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
    baseline = h.status_kib("VmRSS")
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        run(*tensors)
    seconds = time.perf_counter() - start
    return {"peak_mib": (h.status_kib("VmHWM") - baseline) / 1024, "seconds": seconds}


def measure(side: str, case: int, args: argparse.Namespace) -> float:
    """Peak MiB of one pass, measured in a fresh subprocess."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--worker", f"{side}:{case}",
           f"--hidden={args.hidden}", f"--threads={args.threads}"]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker {side}:{case} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def report(
    rows: dict[int, dict[str, list[float]]], args: argparse.Namespace, command: str, wall: float
) -> str:
    from lmgym.policy.logprobs import DEFAULT_CHUNK_ELEMENTS

    chunk = max(1, DEFAULT_CHUNK_ELEMENTS // (B * V))
    lines = h.header(
        "Teacher-forced log-prob pass: peak memory, lmgym vs naive log_softmax",
        f"torch threads = {args.threads}",
        ["torch", "lmgym"],
        command,
        note=f" (total {wall:.0f} s)",
    )
    lines += [
        f"- shapes: hidden [B={B}, L={L}, H={args.hidden}], LM head [V={V}, H={args.hidden}], "
        f"float32, CPU; one [B, L, V] float32 tensor = {B * L * V * 4 / MIB:.0f} MiB; lmgym's "
        f"chunk = {chunk} positions ({B * chunk * V * 4 / MIB:.0f} MiB of logits)",
        "- lmgym: `lmgym.policy.logprobs.token_logprobs` (chunked head, per-chunk recomputation "
        "in backward); naive: `F.log_softmax(hidden @ W.T, -1).gather(...)` (entropy from the "
        "same log-softmax)",
        "- peak = VmHWM - VmRSS after building the inputs, in a fresh subprocess per "
        f"measurement, with `MALLOC_MMAP_THRESHOLD_=65536`; median of {args.repeats} processes "
        "('spread' = largest max-min of either side). Grad cases include the [V, H] weight "
        "gradient and the [B, L, H] hidden gradient on both sides.",
        "",
    ]
    table, verdicts = [], []
    for case, runs in rows.items():
        lm, naive = (statistics.median(runs[s]) for s in SIDES)
        spread = max(max(runs[s]) - min(runs[s]) for s in SIDES)
        name = CASES[case][0]
        table.append(f"{name} | {lm:,.0f} | {naive:,.0f} | {lm / naive:.2f}x | <= {TARGET:g}x "
                     f"| {spread:.0f}")  # fmt: skip
        verdicts.append(f"- {name}: lmgym uses {lm / naive:.2f}x the naive peak (target <= "
                        f"{TARGET:g}x) -> {h.verdict(lm / naive <= TARGET)}")  # fmt: skip
    lines += h.table(
        "case | lmgym peak (MiB) | naive peak (MiB) | ratio | target | spread (MiB)", table
    )
    return "\n".join([*lines, "", "## Target", "", *verdicts]) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run (< 60 s)")
    p.add_argument("--hidden", type=int, help="hidden width H (default 768, --quick 128)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--repeats", type=int, help="processes per cell (default 2, --quick 1)")
    p.add_argument("--cases", help="comma list of case numbers (default 1,2,3,4, --quick 1,4)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    h.fill_defaults(args, dict(hidden=768, repeats=2, cases="1,2,3,4"),
                    dict(hidden=128, repeats=1, cases="1,4"))  # fmt: skip
    if args.worker:
        side, case = args.worker.split(":")
        print(json.dumps(worker(side, int(case), args.hidden, args.threads)))
        return
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("memory.py measures peak RSS through /proc (Linux only)")
    cases = [int(c) for c in h.csv(args.cases, [str(c) for c in CASES], "--cases", p)]
    command = h.command_line("memory.py", argv)
    start = time.perf_counter()
    rows: dict[int, dict[str, list[float]]] = {}
    for case in cases:
        rows[case] = {s: [] for s in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:
                rows[case][side].append(measure(side, case, args))
        lm, naive = (statistics.median(rows[case][s]) for s in SIDES)
        print(f"{CASES[case][0]}: lmgym {lm:,.0f} MiB, naive {naive:,.0f} MiB", flush=True)
    text = report(rows, args, command, time.perf_counter() - start)
    print("\n" + text)
    h.write_report(text, args.out)


if __name__ == "__main__":
    main()
