"""Real-model multi-turn cost (issue 39 item 5): one GRPO + LoRA iteration on GuessNumber
against a single-turn chat task of equal token count, time and memory side by side.

Model and agent: the packaged ``smollm2-135m-instruct`` (float32, CPU), LoRA r 16 on
q/k/v/o (``benchmarks/real_model.py``'s settings), GRPO with one optimizer step per
batch, learning rate 1e-4, beta 0, 4 prompts x 8 episodes per iteration.
``--micro-batch-size`` splits every side's update into micro-batches of rows of
similar length (``bucket_by_length``, on by default), each trimmed to its longest
row: the update's answer to a ragged batch. ``--max-turn-tokens`` caps a GuessNumber
turn (a turn is one number; a rambling turn truncates its episode instead of holding
the batch).

- **multi-turn**: ``lmgym/GuessNumber-v0`` with chat turns, a 96-token budget for the
  policy's turns and the user turns the chat template renders, 6 turns at most
  (``real_model.py``'s ``guess`` setting, whose first run took 110 s and 8.2 GB of
  peak RSS per iteration).
- **single-turn**: the same chat prompts, one completion of exactly ``L`` tokens (the
  model's stop ids get probability 0 on this side's own copy of the model), ``L`` =
  the mean completion-region length (policy and environment tokens) of the
  multi-turn side's warm-up batches, rounded: equal tokens per row on average, the
  single-turn side padded to no more than its rows' length. Reward: the share of
  digits in the completion (any varying reward; the cost does not depend on it).

Each iteration is ``agent.collect()`` then ``agent.train_on_batch(batch)``, each timed;
the sides alternate (A B B A ...) after a warm-up iteration each. Memory: the kernel's
peak-RSS counter is reset before each phase (``/proc/self/clear_refs``), and the
phase's peak is ``VmHWM - VmRSS`` at its start (glibc's mmap threshold is lowered so
freed buffers go back to the system). Then one
``collect`` per side under ``torch.profiler`` says where the time goes (lmgym's labels).

    .venv/bin/python benchmarks/multi_turn_cost.py --out benchmarks/results/multi_turn_cost.md
    .venv/bin/python benchmarks/multi_turn_cost.py --quick     # smoke run (tiny model)
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h  # the repository root on sys.path
import torch
import workloads as w

import lmgym  # noqa: F401  (registers the tasks)
from lmgym import FunctionReward, TokenVectorEnv
from lmgym.agents import GRPO
from lmgym.policy import CausalLMPolicy

MODEL = "smollm2-135m-instruct"
TASK = "lmgym/GuessNumber-v0"


@dataclass
class Side:
    """One side's agent and what was measured of it."""

    name: str
    agent: Any
    seconds: dict[str, list[float]] = field(
        default_factory=lambda: {"collect": [], "train_on_batch": []}
    )
    peak_mib: dict[str, list[float]] = field(
        default_factory=lambda: {"collect": [], "train_on_batch": []}
    )
    tokens: list[float] = field(default_factory=list)  # mean completion-region tokens per row
    policy_tokens: list[float] = field(default_factory=list)
    width: list[int] = field(default_factory=list)  # padded completion width of the batch

    def iteration(self, record: bool = True) -> float:
        """One collect + train_on_batch; returns its seconds."""
        batch, collect_s, collect_peak = measured(lambda: self.agent.collect()[0])
        _, train_s, train_peak = measured(lambda: self.agent.train_on_batch(batch))
        if record:
            for key, s, p in (("collect", collect_s, collect_peak), ("train_on_batch", train_s, train_peak)):  # fmt: skip
                self.seconds[key].append(s)
                self.peak_mib[key].append(p)
            self.tokens.append(float(batch.lengths.float().mean()))
            self.policy_tokens.append(float(batch.policy_mask.sum(1).float().mean()))
            self.width.append(int(batch.completion_ids.shape[1]))
        return collect_s + train_s


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 64 * 1024


def release_freed_buffers() -> None:
    """Allocate buffers of 64 KiB and more with mmap, so a freed one leaves RSS at once
    (glibc's default threshold grows up to 32 MiB and keeps such buffers in the heap,
    which would hide a phase's peak under the RSS the previous phase left)."""
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def measured(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(fn(), seconds, peak MiB above the resident memory at the start)``."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
    base = h.status_kib("VmRSS")
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    return out, seconds, (h.status_kib("VmHWM") - base) / 1024


def load_policy(quick: bool, forbid_stops: bool) -> CausalLMPolicy:
    """``workloads.lora_chat_policy``, its stop ids given probability 0 if ``forbid_stops``."""
    policy = w.lora_chat_policy(quick)
    if forbid_stops:
        w.forbid_token(policy.model.get_base_model(), *policy.stop_token_ids)
    return policy


def digit_share(prompts: list[Any], completions: list[str]) -> list[float]:
    """The share of digits in each completion."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def build(args: Any) -> tuple[list[Side], Callable[[str, int], Side]]:
    """The multi-turn sides (episode-synchronous and continuous), and a maker of a
    single-turn side of completions of a given length."""
    config = {
        **h.ONE_STEP,
        "learning_rate": 1e-4,
        "beta": 0.0,
        "seed": 0,
        "micro_batch_size": args.micro_batch_size,  # length buckets (bucket_by_length)
    }
    multi = []
    for name, autoreset in (("multi-turn", False), ("multi-turn, continuous", True)):
        policy = load_policy(args.quick, forbid_stops=False)
        env = w.guess_number_env(policy, args, autoreset=autoreset)
        multi.append(Side(name, GRPO(policy, env, **config)))
    prompts = multi[0].agent.env.prompt_source  # the GuessNumber chat prompts (train split)

    def single(name: str, length: int, whole_batch: bool = False) -> Side:
        policy = load_policy(args.quick, forbid_stops=True)
        single_env = TokenVectorEnv(
            policy.tokenizer,
            prompts,
            FunctionReward(digit_share),
            num_prompts=args.prompts,
            group_size=args.group,
            max_new_tokens=length,
            stop_token_ids=policy.stop_token_ids,
        )
        # whole_batch: the update in one pass, the fastest for rows of one length.
        overrides = {"micro_batch_size": None} if whole_batch else {}
        return Side(name, GRPO(policy, single_env, **{**config, **overrides}))

    return multi, single


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(args: Any, sides: list[Side], profiles: dict[str, h.Phases], total: float) -> list[str]:
    head = h.header(
        "Real-model multi-turn cost: GuessNumber against single-turn tasks of equal tokens and width",
        f"torch threads = {torch.get_num_threads()}",
        ["torch", "transformers", "peft", "lmgym"],
        h.command_line("multi_turn_cost.py"),
        note=f" (total {total:.0f} s)",
    )
    single = sides[2]
    rows = []
    for s in sides:
        it = [a + b for a, b in zip(s.seconds["collect"], s.seconds["train_on_batch"], strict=True)]
        rows.append([
            s.name, f"{med(s.tokens):.1f}", f"{med(s.policy_tokens):.1f}", f"{med(s.width):.0f}",
            h.spread(it), h.spread(s.seconds["collect"]), h.spread(s.seconds["train_on_batch"]),
            f"{max(s.peak_mib['collect']):.0f}", f"{max(s.peak_mib['train_on_batch']):.0f}",
        ])  # fmt: skip

    def it_med(s: Side) -> float:
        return med(
            [a + b for a, b in zip(s.seconds["collect"], s.seconds["train_on_batch"], strict=True)]
        )

    def peak(s: Side) -> float:
        return max(max(s.peak_mib["collect"]), max(s.peak_mib["train_on_batch"]))

    ratios = [
        f"- {m.name} / {s.name}: **{it_med(m) / it_med(s):.2f}x** time per iteration, "
        f"**{peak(m) / peak(s):.2f}x** peak memory (target <= 1.5x each: "
        f"{h.verdict(it_med(m) / it_med(s) <= 1.5)} / {h.verdict(peak(m) / peak(s) <= 1.5)})"
        for m in sides[:2]
        for s in sides[2:]
    ]
    work = (
        f"- work: `{MODEL if not args.quick else 'tiny Llama (smoke)'}` + LoRA r 16, float32; "
        f"GRPO, one optimizer step per batch, lr 1e-4, beta 0, micro-batches of "
        f"{args.micro_batch_size or 'the whole batch'} rows sorted by length (every side but the whole-batch one); "
        f"{args.prompts} prompts x {args.group} episodes; multi-turn: `{TASK}` chat, budget "
        f"{args.budget} tokens, {args.turns} turns at most, "
        f"{args.max_turn_tokens or 'no cap on the'} tokens a turn, "
        "episode-synchronous (`collect`) or continuous "
        "(`autoreset=True`, `ContinuousCollector`); single-turn: the same prompts, "
        "completions of exactly L tokens (stop ids forbidden): *equal tokens*, L = "
        f"{single.agent.env.max_new_tokens}, the multi-turn warm-up's mean completion-region "
        f"length; *equal width*, L = {sides[3].agent.env.max_new_tokens}, its longest row "
        "(a multi-turn batch is ragged: its rows run and are padded to the longest)"
    )
    if len(sides) > 4:
        work += (
            "; *whole-batch update*: equal tokens with the update in one pass (rows of "
            "one length gain nothing from length buckets)"
        )
    method = (
        f"- method: {args.warmup} warm-up iteration(s) per side, then {args.repeats} timed "
        "iterations per side alternated (A B B A ...), medians; memory = peak RSS above "
        "the resident memory at the phase's start (`clear_refs`), max over iterations"
    )
    lines = [
        *head, work, method, "",
        *h.table(
            "side | completion-region tokens per row | policy tokens per row | padded width "
            "| s / iteration, median [IQR] (min-max) | collect s | train_on_batch s "
            "| collect peak MiB | train peak MiB",
            rows,
        ),
        "",
        *ratios,
    ]  # fmt: skip
    lines += h.phase_section(
        "Where a collect's time goes", "One `collect` per side under the profiler.", profiles
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    w.add_guess_number_options(p)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help="rows per forward/backward of the update, every side (none: the whole batch)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.budget, args.repeats = 2, 4, 48, 2
    start = time.perf_counter()
    h.quiet_worker(args.threads)
    release_freed_buffers()
    torch.manual_seed(0)
    multi, make_single = build(args)
    for side in multi:
        for _ in range(args.warmup):
            side.iteration(record=False)
    # L: the mean and the longest completion-region length of two more (untimed) batches.
    batches = [multi[0].agent.collect()[0] for _ in range(2)]
    mean = statistics.mean(float(b.lengths.float().mean()) for b in batches)
    longest = max(int(b.lengths.max()) for b in batches)
    sides = [*multi, make_single("single-turn, equal tokens", max(1, round(mean)))]
    sides.append(make_single("single-turn, equal width", longest))
    if args.micro_batch_size:  # the baseline at its own best: no micro-batches
        name = "single-turn, equal tokens, whole-batch update"
        sides.append(make_single(name, max(1, round(mean)), whole_batch=True))
    for side in sides[2:]:
        for _ in range(args.warmup):
            side.iteration(record=False)
    for i in range(args.repeats):
        for side in sides if i % 2 == 0 else sides[::-1]:
            side.iteration()
            last = {k: round(v[-1], 1) for k, v in side.seconds.items()}
            print(f"{side.name}: {last} s", flush=True)
    profiles = {s.name: h.profile_phases(lambda s=s: s.agent.collect(), 1) for s in sides}
    lines = report(args, sides, profiles, time.perf_counter() - start)
    h.finish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
