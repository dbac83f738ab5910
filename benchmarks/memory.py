"""Peak memory of lmgym's teacher-forced log-prob pass against a naive full-vocabulary one.

lmgym: ``lmgym.policy.logprobs.token_logprobs(hidden, weight, None, targets, ...)``,
which applies the LM head to chunks of positions and, with gradients, recomputes
each chunk in the backward pass (so no ``[B, L, V]`` tensor is ever held).
Naive: ``F.log_softmax(hidden @ weight.T, -1).gather(-1, targets)`` (plus, for the
entropy cases, ``-(p * log p).sum(-1)`` from the same log-softmax), float32.

Shapes (issue 7): ``B = 16, L = 256``, vocabulary ``V = 32000``, hidden width
``H = --hidden`` (default 768), float32, CPU. One full ``[B, L, V]`` float32 tensor
is 16 * 256 * 32000 * 4 B = 500 MiB.

Cases, each for both sides:

1. no grad, log-probs only (the old/reference log-prob pass);
2. no grad, log-probs + entropy;
3. grad: forward + ``backward`` of ``logprobs.sum()``, with ``hidden`` and ``weight``
   requiring grad (the ``[V, H]`` weight gradient is allocated on both sides);
4. grad: forward + backward of ``logprobs.sum() + entropy.sum()`` (what lmgym's
   update runs).

How peak memory is measured on CPU: every measurement runs in a fresh Python
subprocess, with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc serves every
allocation of 64 KiB or more with ``mmap`` and returns it to the OS on free (the
process's resident set then tracks live tensor memory instead of allocator
caching). The worker first runs the same pass on tiny shapes (library
initialisation), builds the inputs, then resets the kernel's peak-RSS counter
(``echo 5 > /proc/self/clear_refs``), records ``VmRSS`` as the baseline, runs the
pass once and reads ``VmHWM``. Peak = ``VmHWM - baseline``: the extra memory the
pass needed on top of its inputs. Linux only. The median over ``--repeats`` fresh
processes is reported (the values agree to a few MiB).

Run from the repository root::

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
from dataclasses import dataclass
from pathlib import Path

# Make ``import _common`` (this directory) work however the script is started.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import command_line, machine_line, utc_now, versions_line, write_report  # noqa: E402

B, L, V = 16, 256, 32000
TARGET = 0.5  # lmgym peak / naive peak
CASES = {
    1: ("no grad, log-probs", False, False),
    2: ("no grad, log-probs + entropy", False, True),
    3: ("grad + backward, log-probs", True, False),
    4: ("grad + backward, log-probs + entropy", True, True),
}
SIDES = ("lmgym", "naive")
MIB = 1 << 20


# ---------------------------------------------------------------------------- worker
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(side: str, case: int, hidden_size: int, threads: int) -> dict[str, float]:
    """Run one pass in this (fresh) process and return its peak extra memory."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lmgym.policy.logprobs import token_logprobs

    torch.set_num_threads(threads)
    _, grad, entropy = CASES[case]

    def run(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> None:
        if side == "lmgym":
            lp, ent = token_logprobs(h, w, None, targets, 1.0, with_entropy=entropy)
        else:
            log_p = F.log_softmax(F.linear(h, w).float(), dim=-1)
            lp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            ent = -(log_p.exp() * log_p).sum(-1) if entropy else None
        if grad:
            loss = lp.sum() + (ent.sum() if entropy else 0.0)
            loss.backward()

    def inputs(b: int, length: int, v: int, hsz: int) -> tuple:
        gen = torch.Generator().manual_seed(0)
        h = torch.randn(b, length, hsz, generator=gen).requires_grad_(grad)
        w = (torch.randn(v, hsz, generator=gen) * hsz**-0.5).requires_grad_(grad)
        targets = torch.randint(0, v, (b, length), generator=gen)
        return h, w, targets

    # Library initialisation (MKL, autograd engine, checkpointing) on tiny shapes.
    with torch.set_grad_enabled(grad):
        run(*inputs(2, 8, 64, 16))
    h, w, targets = inputs(B, L, V, hidden_size)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    baseline = _status_kib("VmRSS")
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        run(h, w, targets)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    return {"peak_mib": (peak - baseline) / 1024, "seconds": seconds}


# ---------------------------------------------------------------------------- driver
@dataclass
class Row:
    case: int
    lmgym_mib: float
    naive_mib: float
    spread_mib: float

    @property
    def ratio(self) -> float:
        return self.lmgym_mib / self.naive_mib


def measure(side: str, case: int, hidden_size: int, threads: int) -> dict[str, float]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(threads)}
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        f"{side}:{case}",
        "--hidden",
        str(hidden_size),
        "--threads",
        str(threads),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker {side}:{case} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows: list[Row], args: argparse.Namespace, wall: float, command: str) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lmgym.policy.logprobs import DEFAULT_CHUNK_ELEMENTS

    chunk = max(1, DEFAULT_CHUNK_ELEMENTS // (B * V))
    full = B * L * V * 4 / MIB
    lines = [
        "# Teacher-forced log-prob pass: peak memory, lmgym vs naive log_softmax",
        "",
        f"- date: {utc_now()}",
        machine_line(f"torch threads = {args.threads}"),
        versions_line(["torch", "lmgym"]),
        f"- command: `{command}` (total {wall:.0f} s)",
        f"- shapes: hidden [B={B}, L={L}, H={args.hidden}], LM head [V={V}, H={args.hidden}], "
        f"float32, CPU; one [B, L, V] float32 tensor = {full:.0f} MiB; lmgym's chunk = "
        f"{chunk} positions ({B * chunk * V * 4 / MIB:.0f} MiB of logits)",
        "- lmgym: `lmgym.policy.logprobs.token_logprobs` (chunked head, per-chunk "
        "recomputation in backward); naive: `F.log_softmax(hidden @ W.T, -1).gather(...)` "
        "(entropy from the same log-softmax)",
        "- peak = VmHWM - VmRSS after building the inputs, in a fresh subprocess per "
        "measurement, with `MALLOC_MMAP_THRESHOLD_=65536` so freed tensors go back to the "
        f"OS; median of {args.repeats} processes ('spread' = largest max-min of either "
        "side). Grad cases include the [V, H] weight gradient and the [B, L, H] hidden "
        "gradient on both sides.",
        "",
        "| case | lmgym peak (MiB) | naive peak (MiB) | ratio | target | spread (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {CASES[r.case][0]} | {r.lmgym_mib:,.0f} | {r.naive_mib:,.0f} | {r.ratio:.2f}x "
            f"| <= {TARGET:g}x | {r.spread_mib:.0f} |"
        )
    lines += ["", "## Target", ""]
    for r in rows:
        met = r.ratio <= TARGET
        lines.append(
            f"- {CASES[r.case][0]}: lmgym uses {r.ratio:.2f}x the naive peak "
            f"(target <= {TARGET:g}x) -> {'MET' if met else 'NOT MET'}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 60 s)")
    parser.add_argument("--out", type=Path, help="write the results table (markdown) here")
    parser.add_argument("--hidden", type=int, default=None, help="hidden width H (default 768)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="processes per cell (2)")
    parser.add_argument("--cases", default=None, help="comma list of case numbers (1,2,3,4)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.hidden = 128 if args.hidden is None else args.hidden
        args.repeats = 1 if args.repeats is None else args.repeats
        args.cases = "1,4" if args.cases is None else args.cases
    args.hidden = 768 if args.hidden is None else args.hidden
    args.repeats = 2 if args.repeats is None else args.repeats
    args.cases = "1,2,3,4" if args.cases is None else args.cases

    if args.worker:
        side, case = args.worker.split(":")
        print(json.dumps(worker(side, int(case), args.hidden, args.threads)))
        return
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("memory.py measures peak RSS through /proc (Linux only)")

    cases = [int(c) for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            parser.error(f"--cases: unknown case {c}; choose from {list(CASES)}")
    command = command_line("memory.py", sys.argv[1:])
    start = time.perf_counter()
    rows = []
    for c in cases:
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:
                runs[side].append(measure(side, c, args.hidden, args.threads))
        med = {s: {"peak_mib": statistics.median(r["peak_mib"] for r in runs[s])} for s in SIDES}
        spread = max(
            max(r["peak_mib"] for r in runs[s]) - min(r["peak_mib"] for r in runs[s]) for s in SIDES
        )
        row = Row(
            c,
            med["lmgym"]["peak_mib"],
            med["naive"]["peak_mib"],
            spread,
        )
        rows.append(row)
        print(
            f"{CASES[c][0]}: lmgym {row.lmgym_mib:,.0f} MiB, naive {row.naive_mib:,.0f} MiB, "
            f"ratio {row.ratio:.2f}x",
            flush=True,
        )
    text = report(rows, args, time.perf_counter() - start, command)
    print()
    print(text)
    write_report(text, args.out)


if __name__ == "__main__":
    main()
