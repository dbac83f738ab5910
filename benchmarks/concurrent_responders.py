"""Concurrent responders (issue 39, item 1): a slow environment on 1 row in 8.

A multi-turn env whose responder takes 200 ms to answer 1 row in 8 (env rows 0, 8,
16, ...; a remote game server, a sandboxed tool) and no time for the others. Two
sides, the same env, the same action stream, in one process, alternated (ABBA):

- **synchronous**: the responder as every responder was called before issue 39,
  once per step, batched: it answers its rows one after another, so a step where
  ``s`` slow rows end a turn waits ``s x 200 ms``;
- **concurrent**: the same responder with ``thread_safe = True``: the env calls it
  once per row, all rows at once (``lmgym.envs.turn_calls``), so such a step waits
  200 ms whatever ``s``.

No model: the actions are a seeded script (turns of a fixed length, or of random
lengths), so a step costs only the env and the responder and the ratio is the
env's; a policy's decode time would add the same seconds to both sides and lower
it. Both sides must return exactly the same rewards and ends (checked).
Throughput = policy tokens written per second of ``step`` calls; ratio =
concurrent / synchronous.

Workloads (each a table row):

- ``aligned``, 64 rows: every turn is 3 tokens and a stop id, so all rows end
  their turns on the same steps (a one-word-move game, episode-synchronous or
  continuous alike): 8 slow rows per such step;
- ``ragged``, 64 rows: turns of 1 to 11 tokens (uniform, seeded) and next-step
  autoreset (continuous mode): the slow rows end turns on different steps;
- ``aligned``, 8 rows: one slow row, so never two slow calls in one step.

The env's step still waits for the slowest call it makes: parking the rows that
wait for their environment while the others decode needs the collector
(``lmgym/rollout.py``), a follow-up; this measures what the env alone does.

    .venv/bin/python benchmarks/concurrent_responders.py
    .venv/bin/python benchmarks/concurrent_responders.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import harness
import torch

from lmgym.envs import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput
from lmgym.policy import make_char_tokenizer

LATENCY = 0.2  # seconds a slow row's answer takes
SLOW_EVERY = 8  # 1 row in 8 is slow
TARGET = 3.0
DEFAULT_OUT = Path(__file__).parent / "results" / "concurrent_responders.md"


@dataclass
class SlowEnvironment:
    """Answers every turn with ``"ok"``; env rows ``0, 8, 16, ...`` take ``LATENCY``
    seconds each; the episode ends after 3 turns. ``thread_safe`` picks the side."""

    thread_safe: bool
    role: str = "user"

    def start(self, episodes: EpisodeStart) -> list[int]:
        return [0] * len(episodes.prompts)

    def respond(self, turns: TurnInput) -> TurnOutput:
        for row in turns.rows.tolist():  # one after another, as a plain client would
            if row % SLOW_EVERY == 0:
                time.sleep(LATENCY)
        k = len(turns.turn_texts)
        turn = turns.turn_index.tolist()
        return TurnOutput(
            ["ok"] * k,
            [float(len(t)) for t in turns.turn_texts],
            [n >= 3 for n in turn],
            [s + 1 for s in turns.states],
        )


@dataclass(frozen=True)
class Workload:
    name: str
    rows: int
    ragged: bool
    steps: int


def actions(workload: Workload, eos: int, seed: int = 0) -> torch.Tensor:
    """``[steps, rows]`` token ids: turns of 3 letters (aligned) or 1-11 (ragged),
    each followed by the stop id."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(workload.steps, workload.rows, dtype=torch.long)
    for row in range(workload.rows):
        stream: list[int] = []
        while len(stream) < workload.steps:
            n = int(torch.randint(1, 12, (1,), generator=generator)) if workload.ragged else 3
            stream += torch.randint(5, 20, (n,), generator=generator).tolist() + [eos]
        out[:, row] = torch.tensor(stream[: workload.steps])
    return out


def make_env(workload: Workload, thread_safe: bool) -> TokenVectorEnv:
    return TokenVectorEnv(
        make_char_tokenizer(),
        ["play:"] * workload.rows,
        None,
        num_prompts=workload.rows,
        max_new_tokens=128,
        autoreset=True,
        responder=SlowEnvironment(thread_safe=thread_safe),
    )


@dataclass
class Side:
    seconds: float
    tokens: int
    record: list[torch.Tensor]


def run_side(workload: Workload, thread_safe: bool) -> Side:
    """One pass of ``workload`` on a fresh env: seconds in ``step``, policy tokens
    written, and every step's rewards and ends (to check both sides agree)."""
    env = make_env(workload, thread_safe)
    script = actions(workload, env.tokenizer.eos_token_id)
    env.reset(seed=0)
    seconds, tokens, record = 0.0, 0, []
    for step_actions in script:
        live = ~env._rows.done  # rows that write this step (a refilled row does not)
        start = time.perf_counter()
        _, rewards, terminated, truncated, _ = env.step(step_actions)
        seconds += time.perf_counter() - start
        tokens += int(live.sum())
        record += [rewards, terminated, truncated]
    return Side(seconds, tokens, record)


def measure(workload: Workload, repeats: int) -> dict[str, float]:
    sync: list[Side] = []
    conc: list[Side] = []

    def timed(side: list[Side], thread_safe: bool) -> float:
        side.append(run_side(workload, thread_safe))
        return side[-1].seconds

    meter = harness.CpuMeter()
    harness.alternate(lambda: timed(sync, False), lambda: timed(conc, True), 0, repeats + 1)
    sync, conc = sync[1:], conc[1:]  # the first pair warms up (threads, caches)
    for a, b in zip(sync, conc, strict=True):
        same = all(torch.equal(x, y) for x, y in zip(a.record, b.record, strict=True))
        if not same or a.tokens != b.tokens:
            raise SystemExit(f"{workload.name}: the two sides disagree: not the same episodes")
    sync_tps = sorted(s.tokens / s.seconds for s in sync)[len(sync) // 2]
    conc_tps = sorted(s.tokens / s.seconds for s in conc)[len(conc) // 2]
    return {
        "sync": sync_tps,
        "conc": conc_tps,
        "ratio": conc_tps / sync_tps,
        "tokens": float(sync[0].tokens),
        "sync_s": sorted(s.seconds for s in sync)[len(sync) // 2],
        "conc_s": sorted(s.seconds for s in conc)[len(conc) // 2],
        "load": meter.other_load(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps, one repeat")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per side (ABBA)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    steps = 12 if args.quick else 40
    repeats = 1 if args.quick else args.repeats
    workloads = [
        Workload("aligned", 64, False, steps),
        Workload("ragged", 64, True, steps + steps // 2),
        Workload("aligned", 8, False, steps),
    ]
    rows = []
    results = []
    for workload in workloads:
        r = measure(workload, repeats)
        results.append((workload, r))
        rows.append(
            [
                workload.name,
                workload.rows,
                workload.steps,
                int(r["tokens"]),
                f"{r['sync_s']:.2f}",
                f"{r['conc_s']:.2f}",
                f"{r['sync']:,.0f}",
                f"{r['conc']:,.0f}",
                f"{r['ratio']:.2f}x",
                harness.load_cell(r["load"]),
            ]
        )
        print(workload, r, flush=True)
    lines = harness.header(
        "Concurrent responders: 200 ms on 1 row in 8, synchronous vs concurrent",
        f"torch threads = {torch.get_num_threads()}",
        ["torch", "gymnasium", "lmgym"],
        harness.command_line("concurrent_responders.py"),
    )
    lines += [
        f"- work: a responder that sleeps {LATENCY * 1000:.0f} ms per call on env rows 0, 8, "
        f"16, ... and answers the others at once; episodes of 3 turns, next-step autoreset, "
        f"char tokenizer, budget 128; a seeded action script, no model",
        f"- method: {repeats} timed pass(es) per side after 1 untimed pair, alternated "
        "(ABBA), each on a fresh env; "
        "tok/s = policy tokens written / seconds inside env.step, median over passes; "
        "ratio = concurrent / synchronous; both sides checked to return the same rewards "
        "and ends step by step. Details: the script's docstring.",
        "",
        *harness.table(
            "workload | rows | steps | policy tokens | synchronous s | concurrent s "
            "| synchronous tok/s | concurrent tok/s | ratio | other CPU load",
            rows,
        ),
        "",
        f"## Target (concurrent >= {TARGET:g}x synchronous)",
        "",
    ]
    lines += harness.noisy_warning([r["load"] for _, r in results])
    for workload, r in results:
        lines.append(
            harness.target_line(
                f"{workload.name}, {workload.rows} rows",
                r["ratio"],
                TARGET,
                "concurrent vs synchronous",
            )
        )
    lines += [
        "",
        "Reading: the env's step waits for the slowest call it makes. Where several slow "
        "rows end a turn on the same step (aligned turns) their calls overlap and the "
        "step costs one latency instead of one per slow row; where they end on different "
        "steps (ragged turns) fewer overlap; with one slow row per step (8 rows) there is "
        "nothing to overlap and the ratio is 1. Beating that needs the collector to park "
        "the rows that wait for their environment and keep decoding the others "
        "(`lmgym/rollout.py`, a follow-up to issue 39).",
    ]
    harness.finish(lines, args.out)


if __name__ == "__main__":
    main()
