"""Does SmolLM2 learn to bisect GuessNumber? (issue 39 item 5) A long GRPO + LoRA run
with the bisection measured on every training batch and on held-out games.

Settings: ``benchmarks/real_model.py``'s ``guess`` setting (the packaged
``smollm2-135m-instruct``, float32, LoRA r 16 on q/k/v/o, GRPO with one optimizer step
per batch, learning rate 1e-4, beta 0; ``lmgym/GuessNumber-v0`` in chat turns, secrets
in 1..8, a 96-token budget, 6 turns at most), ``--prompts`` games x ``--group``
episodes per iteration, for ``--iterations`` or ``--max-minutes``.

Bisection, read off each episode's text (``sample_text.episode_texts``: the policy's
turns with the environment's answers in ``[...]``). The feasible range starts at
``[1, 8]``; each ``higher`` / ``lower`` narrows it. A guess is *consistent* when it
lies in the feasible range, *a midpoint* when it is ``floor`` or ``ceil`` of the
range's middle (bisection's choices). Per batch: the share of guesses that are
consistent, the share that are midpoints, the share of episodes solved, and the
mean turns of a solved episode (bisection: at most 4, 2.6 on average over 1..8;
counting up from 1: 4.5). Held out (the task's 16 eval games, the same seed each
time): greedy (1 episode per game) and sampled at temperature 1 (4 per game), before
training, every ``--eval-every`` iterations and at the end.

The record ``<out>/guess_bisect-s<seed>.json`` is rewritten after every iteration, so
an interrupted run keeps what it measured; ``--report`` renders ``<out>/README.md``
and the curves ``<out>/guess_bisect.png``.

    .venv/bin/python benchmarks/guess_bisect.py --iterations 60 --max-minutes 45
    .venv/bin/python benchmarks/guess_bisect.py --report
    .venv/bin/python benchmarks/guess_bisect.py --quick --out /tmp/bisect   # smoke run
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness as h  # the repository root on sys.path
import parts
import torch
import workloads as w

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.agents import GRPO
from lmgym.envs.tasks.multi_turn.guess_number import first_integer
from lmgym.training.evaluation import evaluate_policy, make_eval_env
from lmgym.training.sample_text import episode_texts

TASK = "lmgym/GuessNumber-v0"
LOW, HIGH = 1, 8
EVAL_GAMES, EVAL_SAMPLES, EVAL_SEED = 16, 4, 1234
DEFAULT_OUT = Path(__file__).parent / "results" / "guess_bisect"
_OBSERVATION = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class Bisection:
    """How a set of episodes guessed (see the module docstring)."""

    episodes: int
    guesses: int
    consistent: float  # share of guesses inside the feasible range
    midpoint: float  # share of guesses at the feasible range's middle
    solved: float  # share of episodes ended by a right guess
    turns_solved: float  # mean policy turns of a solved episode (NaN: none solved)


def bisection(texts: list[str], returns: list[float]) -> Bisection:
    """The bisection statistics of episodes printed as ``turn[answer]turn...turn``, with
    their returns (a return above 0 is a solved game: the task pays only a hit)."""
    guesses = consistent = midpoint = 0
    turns_solved = []
    for text, ret in zip(texts, returns, strict=True):
        pieces = _OBSERVATION.split(text)  # turn, answer, turn, answer, ..., turn
        turns, answers = pieces[0::2], pieces[1::2]
        lo, hi = LOW, HIGH
        for k, turn in enumerate(turns):
            guess = first_integer(turn)
            if guess is None:
                continue
            guesses += 1
            consistent += lo <= guess <= hi
            midpoint += guess in ((lo + hi) // 2, (lo + hi + 1) // 2)
            answer = answers[k] if k < len(answers) else ""
            if "higher" in answer:
                lo = max(lo, guess + 1)
            elif "lower" in answer:
                hi = min(hi, guess - 1)
        if ret > 0:
            turns_solved.append(len(turns))
    n = max(guesses, 1)
    return Bisection(
        episodes=len(texts),
        guesses=guesses,
        consistent=consistent / n,
        midpoint=midpoint / n,
        solved=len(turns_solved) / max(len(texts), 1),
        turns_solved=statistics.mean(turns_solved) if turns_solved else float("nan"),
    )


def held_out(policy: Any, budget: int, turns: int, games: int) -> dict[str, Any]:
    """Greedy and sampled play of the eval games: return and bisection."""
    out = {}
    env_kwargs = {
        "max_new_tokens": budget,
        "max_turns": turns,
        "stop_token_ids": policy.stop_token_ids,
    }
    for label, temp, per_game in (("greedy", 0.0, 1), ("sampled", 1.0, EVAL_SAMPLES)):
        env, split = make_eval_env(TASK, policy.tokenizer, games, per_game, env_kwargs=env_kwargs)
        with parts.temperature(policy, temp):
            result = evaluate_policy(
                policy, env, games, seed=EVAL_SEED, num_samples_kept=games * per_game
            )
        texts = [completion for _, completion, _ in result.samples]
        returns = [reward for _, _, reward in result.samples]
        out[label] = {
            "return": result.reward_mean,
            "split": split,
            **vars(bisection(texts, returns)),
            "examples": [list(s) for s in result.samples[:3]],
        }
    return out


def run(args: Any) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    policy = w.lora_chat_policy(args.quick)
    env = w.guess_number_env(policy, args)
    config = {**h.ONE_STEP, "learning_rate": args.lr, "beta": 0.0, "seed": args.seed}
    agent = GRPO(policy, env, **config)
    games = 2 if args.quick else EVAL_GAMES
    path = args.out / f"guess_bisect-s{args.seed}.json"
    record: dict[str, Any] = {
        "command": h.command_line("guess_bisect.py"),
        "source": h.source_line(),
        "date": time.strftime("%Y-%m-%d"),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "report")},
        "agent": "grpo",
        "config": config,
        "evals": [{"iteration": 0, **held_out(policy, args.budget, args.turns, games)}],
        "history": [],
    }
    parts.write_atomic(path, record)
    original = agent.collect
    last: dict[str, Any] = {}

    def collect() -> Any:  # the training batch's bisection, read before the update
        batch, dropped = original()
        returns = batch.rewards.sum(1).tolist()
        last["bisection"] = vars(bisection(episode_texts(env, batch), returns))
        return batch, dropped

    agent.collect = collect
    start, deadline = time.perf_counter(), time.monotonic() + 60 * args.max_minutes

    def callback(_agent: Any, metrics: dict[str, float]) -> bool:
        it = len(record["history"]) + 1
        keep = ("reward_mean", "completion_length", "tokens_generated")
        row = {"iteration": it, "seconds": time.perf_counter() - start}
        row |= {k: metrics[k] for k in keep if k in metrics} | last["bisection"]
        record["history"].append(row)
        going = time.monotonic() < deadline
        if it % args.eval_every == 0 or it == args.iterations or not going:
            record["evals"].append(
                {"iteration": it, **held_out(policy, args.budget, args.turns, games)}
            )
        record["seconds_per_iteration"] = (time.perf_counter() - start) / it
        parts.write_atomic(path, record)
        b = last["bisection"]
        print(
            f"it {it} reward {metrics['reward_mean']:.3f} midpoint {b['midpoint']:.2f} "
            f"consistent {b['consistent']:.2f} turns {b['turns_solved']:.2f} "
            f"{time.perf_counter() - start:.0f}s",
            flush=True,
        )
        return going

    agent.learn(args.iterations, callback=callback)
    if record["evals"][-1]["iteration"] != len(record["history"]):
        record["evals"].append(
            {
                "iteration": len(record["history"]),
                **held_out(policy, args.budget, args.turns, games),
            }
        )
    parts.write_atomic(path, record)
    return record


def rolling_known(values: list[float], width: int = 10) -> list[float]:
    """``parts.rolling`` over the values that are not NaN (NaN where a window has none)."""
    out = []
    for i in range(len(values)):
        known = [v for v in values[max(0, i - width + 1) : i + 1] if v == v]
        out.append(statistics.mean(known) if known else float("nan"))
    return out


def report(out: Path) -> str:
    """``<out>/README.md`` and ``<out>/guess_bisect.png`` from every record in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in parts.load_records(out) if "history" in r]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    lines = ["# Does SmolLM2 learn to bisect GuessNumber? (issue 39 item 5)", ""]
    lines += [(__doc__ or "").split("\n\n")[1].replace("\n", " "), ""]
    lines += [(__doc__ or "").split("\n\n")[2].replace("\n", " "), ""]
    for r in records:
        seed, hist = r["settings"]["seed"], r["history"]
        its = [x["iteration"] for x in hist]
        axes[0].plot(its, parts.rolling([x["reward_mean"] for x in hist]), label=f"seed {seed}")
        axes[1].plot(
            its, parts.rolling([x["midpoint"] for x in hist]), label=f"seed {seed}: midpoint"
        )
        axes[1].plot(
            its,
            parts.rolling([x["consistent"] for x in hist]),
            "--",
            label=f"seed {seed}: consistent",
        )
        axes[2].plot(its, rolling_known([x["turns_solved"] for x in hist]), label=f"seed {seed}")
        s = r["settings"]
        lines += [
            f"## Seed {seed}",
            "",
            f"- command: `{r['command']}`; {r['source'][2:]}; {r['date']}",
            f"- {s['prompts']} games x {s['group']} episodes per iteration, budget {s['budget']} "
            f"tokens, {s['turns']} turns at most, lr {s['lr']:g}; {len(hist)} iterations, "
            f"{r.get('seconds_per_iteration', float('nan')):.1f} s per iteration (1 torch thread; "
            "held-out evaluations included)",
            "",
            "Training batches (sampled at temperature 1, training games), mean over 10-iteration windows:",
            "",
        ]
        rows = []
        for lo in range(0, len(hist), 10):
            w = hist[lo : lo + 10]
            solved_turns = [x["turns_solved"] for x in w if x["turns_solved"] == x["turns_solved"]]
            rows.append([
                f"{w[0]['iteration']}-{w[-1]['iteration']}",
                f"{statistics.mean(x['reward_mean'] for x in w):.3f}",
                f"{statistics.mean(x['solved'] for x in w):.2f}",
                f"{statistics.mean(x['consistent'] for x in w):.2f}",
                f"{statistics.mean(x['midpoint'] for x in w):.2f}",
                f"{statistics.mean(solved_turns):.2f}" if solved_turns else "—",
            ])  # fmt: skip
        lines += h.table(
            "iterations | return | solved | consistent guesses | midpoint guesses | turns when solved",
            rows,
        )
        lines += [
            "",
            f"Held out ({EVAL_GAMES} eval games; greedy: 1 episode each, sampled: {EVAL_SAMPLES} each, seed {EVAL_SEED}):",
            "",
        ]
        rows = []
        for e in r["evals"]:
            for label in ("greedy", "sampled"):
                x = e[label]
                turns = (
                    "—" if x["turns_solved"] != x["turns_solved"] else f"{x['turns_solved']:.2f}"
                )
                rows.append([e["iteration"], label, f"{x['return']:.3f}", f"{x['solved']:.2f}",
                             f"{x['consistent']:.2f}", f"{x['midpoint']:.2f}", turns])  # fmt: skip
        lines += h.table(
            "after iteration | play | return | solved | consistent guesses | midpoint guesses | turns when solved",
            rows,
        )
        last = r["evals"][-1]["greedy"]["examples"]
        lines += [
            "",
            "Greedy episodes after the last iteration (prompt's last message, episode, return):",
            "",
        ]
        lines += [f"- {completion!r} ({reward:.2f})" for _, completion, reward in last]
        lines.append("")
    for ax, title in zip(axes, ("return (rolling 10)", "share of guesses (rolling 10)", "turns when solved (rolling 10)"), strict=True):  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "guess_bisect.png", dpi=90)
    lines += ["![curves](guess_bisect.png)", ""]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    p.set_defaults(out=DEFAULT_OUT)
    p.add_argument("--report", action="store_true", help="render README.md from the records")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--max-minutes", type=float, default=45.0)
    p.add_argument("--eval-every", type=int, default=10)
    w.add_guess_number_options(p)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(args.out))
        return 0
    if args.quick:
        args.prompts, args.group, args.iterations, args.eval_every, args.budget = 2, 4, 2, 1, 48
    h.quiet_worker(args.threads)
    run(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
