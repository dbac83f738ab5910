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

The env's step still waits for the slowest call it makes. The second table
measures the parked continuous path (``responder_park_after``,
``lmgym.envs.turn_park``): ``ContinuousCollector`` with a tiny GPT-2 over the same
env and responder, rows waiting for their environment parked while the engine
decodes the others, against today's synchronous path (the same collector and
model, the responder called once per step, batched). The model samples (turns of
EOS-biased random lengths: ragged), so the two sides' episodes differ in their
tokens, not in their distribution; throughput = policy tokens sampled (at live
steps: ``ContinuousCollector.tokens_generated``) per second of ``collect``, the
median of the passes after an untimed pair; the tokens of the returned
batches per second are shown too (lower for the parked side over a few calls: it
returns groups in id order, so the fast rows' extra episodes wait in its pool for
a later call):

- ``parked``, 64 rows: 8 slow rows;
- ``parked``, 8 rows: 1 slow row, the case the env alone cannot speed up.

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
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import ContinuousCollector

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


PARK_AFTER = 0.002  # seconds a parking step waits for the calls it starts


def eos_policy(vocab: int, eos: int) -> CausalLMPolicy:
    """A tiny GPT-2 whose head favours EOS (+2 logits): turns of a few tokens."""
    model = make_tiny_model(vocab, seed=3)
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    head.weight = old.weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[eos] = 2.0
    model.set_output_embeddings(head)
    return CausalLMPolicy(model, make_char_tokenizer())


@dataclass
class Collected:
    seconds: float
    sampled: int
    returned: int
    parked_steps: int


def collect_side(rows: int, parked: bool, calls: int, seed: int = 0) -> Collected:
    """``calls`` timed ``collect(num_groups=rows)`` on a fresh env and collector:
    seconds, policy tokens sampled and returned, and the row-steps spent parked."""
    tokenizer = make_char_tokenizer()
    env = TokenVectorEnv(
        tokenizer,
        ["play:"] * rows,
        None,
        num_prompts=rows,
        max_new_tokens=128,
        autoreset=True,
        responder=SlowEnvironment(thread_safe=parked),
        responder_park_after=PARK_AFTER if parked else None,
    )
    policy = eos_policy(len(tokenizer), tokenizer.eos_token_id)
    collector = ContinuousCollector(env, policy, seed=seed)
    parked_steps = 0
    if parked:
        step = env.step

        def counted(actions: torch.Tensor) -> tuple:
            nonlocal parked_steps
            out = step(actions)
            parked_steps += int(out[4]["waiting"].sum())
            return out

        env.step = counted  # type: ignore[method-assign]
    seconds, returned = 0.0, 0
    for _ in range(calls):
        start = time.perf_counter()
        batch = collector.collect(num_groups=rows)
        seconds += time.perf_counter() - start
        returned += int(batch.policy_mask.sum())
    return Collected(seconds, collector.tokens_generated, returned, parked_steps)


def measure_parked(rows: int, calls: int, repeats: int) -> dict[str, float]:
    sync: list[Collected] = []
    park: list[Collected] = []

    def timed(side: list[Collected], parked: bool) -> float:
        side.append(collect_side(rows, parked, calls))
        return side[-1].seconds

    meter = harness.CpuMeter()
    harness.alternate(lambda: timed(sync, False), lambda: timed(park, True), 0, repeats + 1)
    sync, park = sync[1:], park[1:]  # the first pair warms up (threads, kernels)

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    sync_tps = median([c.sampled / c.seconds for c in sync])
    park_tps = median([c.sampled / c.seconds for c in park])
    return {
        "sync": sync_tps,
        "park": park_tps,
        "ratio": park_tps / sync_tps,
        "sync_returned": median([c.returned / c.seconds for c in sync]),
        "park_returned": median([c.returned / c.seconds for c in park]),
        "sync_tokens": median([float(c.sampled) for c in sync]),
        "park_tokens": median([float(c.sampled) for c in park]),
        "sync_s": median([c.seconds for c in sync]),
        "park_s": median([c.seconds for c in park]),
        "parked_steps": median([float(c.parked_steps) for c in park]),
        "load": meter.other_load(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps, one repeat")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per side (ABBA)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: a tiny model's step is fastest on one, and a loaded "
        "machine's contention hurts it least)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    steps = 12 if args.quick else 40
    repeats = 1 if args.quick else args.repeats
    workloads = [
        Workload("aligned", 64, False, steps),
        Workload("ragged", 64, True, steps + steps // 2),
        Workload("aligned", 8, False, steps),
    ]
    calls = 2 if args.quick else 4
    parked_rows = []
    parked_results = []
    for n in (64, 8):
        r = measure_parked(n, calls, repeats)
        parked_results.append((n, r))
        parked_rows.append(
            [
                "parked",
                n,
                calls,
                f"{int(r['sync_tokens'])} / {int(r['park_tokens'])}",
                f"{r['sync_s']:.2f}",
                f"{r['park_s']:.2f}",
                f"{r['sync']:,.0f}",
                f"{r['park']:,.0f}",
                f"{r['ratio']:.2f}x",
                f"{r['sync_returned']:,.0f} / {r['park_returned']:,.0f}",
                int(r["parked_steps"]),
                harness.load_cell(r["load"]),
            ]
        )
        print("parked", n, r, flush=True)
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
        "## Parked rows: continuous collection with a model, synchronous vs parked",
        "",
        f"- work: the same env and responder; `ContinuousCollector` with a tiny GPT-2 "
        f"(EOS +2 logits: ragged turns of a few tokens), {calls} timed "
        "`collect(num_groups=rows)` per pass from a fresh collector; synchronous: the "
        "responder batched, once per step (today's path); parked: `thread_safe = True` "
        f"and `responder_park_after={PARK_AFTER}`, slow rows parked while the engine "
        "decodes the others",
        f"- method: {repeats} timed pass(es) per side after 1 untimed pair, alternated "
        "(ABBA), each on a fresh env and collector, median over passes; "
        "tok/s = policy tokens sampled (live steps) / "
        "seconds inside `collect`; ratio = parked / synchronous; returned tok/s = "
        "tokens of the returned batches / the same seconds; the sides sample different "
        "tokens (a generator vs counter-based draws), so their token counts differ; "
        "'parked row-steps' counts the steps rows spent parked (median pass)",
        "",
        *harness.table(
            "workload | rows | collects | policy tokens sampled (sync / parked) "
            "| synchronous s | parked s | synchronous tok/s | parked tok/s | ratio "
            "| returned tok/s (sync / parked) | parked row-steps | other CPU load",
            parked_rows,
        ),
        "",
        f"## Target (>= {TARGET:g}x synchronous)",
        "",
    ]
    lines += harness.noisy_warning(
        [r["load"] for _, r in results] + [r["load"] for _, r in parked_results]
    )
    for workload, r in results:
        lines.append(
            harness.target_line(
                f"{workload.name}, {workload.rows} rows",
                r["ratio"],
                TARGET,
                "concurrent vs synchronous",
            )
        )
    for n, r in parked_results:
        lines.append(
            harness.target_line(f"parked, {n} rows", r["ratio"], TARGET, "parked vs synchronous")
        )
    lines += [
        "",
        "Reading: the env's step waits for the slowest call it makes. Where several slow "
        "rows end a turn on the same step (aligned turns) their calls overlap and the "
        "step costs one latency instead of one per slow row; where they end on different "
        "steps (ragged turns) fewer overlap; with one slow row per step (8 rows) there is "
        "nothing to overlap and the ratio is 1. Parking (the second table) removes the "
        "wait from the step: a slow row sits out its 200 ms while the engine decodes the "
        "others, so the collector's pace is the model's, not the environment's.",
    ]
    harness.finish(lines, args.out)


if __name__ == "__main__":
    main()
