"""Benchmarks run in resumable *parts*: one JSON record per part, a part whose record
exists is skipped, and a report is rendered from the records alone.

``real_model.py`` and ``multi_turn.py`` are such benchmarks; this module is what they
share: the atomic record write, reading the records back, the rolling mean of their
curves, the held-out evaluation (greedy and sampled), the learning-curve PNGs, the
report's closing sections and the command line (``parts...``, ``--all``, ``--list``,
``--report``, ``--force``, ``--max-minutes``, ``--iterations``, ``--threads``,
``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from lmgym.training.evaluation import evaluate_policy


def write_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON to ``path`` through a temporary file and a rename, so an
    interrupted part leaves no half-written record (and is run again next time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every part's record in ``out``, by file name."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def rolling(values: list[float], width: int = 10) -> list[float]:
    """Mean of each value and the ``width - 1`` before it (fewer at the start)."""
    windows = (values[max(0, i - width + 1) : i + 1] for i in range(len(values)))
    return [sum(w) / len(w) for w in windows]


def train(
    agent: Any, name: str, iterations: int, max_minutes: float, show: Callable[[dict], str]
) -> tuple[list[dict[str, float]], float]:
    """``agent.learn`` for ``iterations`` or until ``max_minutes`` have passed, whichever
    ends first, printing ``show(metrics)`` every 10 iterations.

    Returns:
        ``(history, train_seconds)``: every iteration's metrics (``wall_seconds``
        added), and the wall time of the training.
    """
    history: list[dict[str, float]] = []
    deadline = time.monotonic() + 60 * max_minutes
    start = time.perf_counter()

    def until_deadline(_agent: Any, metrics: dict[str, float]) -> bool:
        metrics["wall_seconds"] = time.perf_counter() - start
        history.append(dict(metrics))
        if len(history) % 10 == 0:
            print(f"[{name}] it {len(history)} {show(metrics)}", flush=True)
        return time.monotonic() < deadline

    agent.learn(iterations, callback=until_deadline)
    return history, time.perf_counter() - start


def run_fields(history: list[dict[str, Any]], train_seconds: float) -> dict[str, Any]:
    """The fields every part's record has about its training run."""
    return {
        "threads": torch.get_num_threads(),
        "load_average_end": os.getloadavg()[0],  # the machine's other load inflates s/it
        "iterations": len(history),
        "train_seconds": train_seconds,
        "seconds_per_iteration": train_seconds / max(len(history), 1),
        "history": [{k: v for k, v in m.items() if isinstance(v, int | float)} for m in history],
    }


@contextlib.contextmanager
def temperature(policy: Any, value: float) -> Iterator[None]:
    """Sample at ``value`` inside the block (0: greedy), then restore the policy's."""
    saved, policy.temperature = policy.temperature, value
    try:
        yield
    finally:
        policy.temperature = saved


def held_out(
    policy: Any,
    make_env: Callable[[int], tuple[Any, str]],
    prompts: int,
    seed: int,
    samples: int,
    keep: int,
) -> dict[str, Any]:
    """Held-out reward: greedy (1 completion per prompt) and sampled at temperature 1
    (``samples`` per prompt), each on ``make_env(completions per prompt)``'s
    ``(env, split)`` with the same ``seed``, keeping ``keep`` samples of each."""
    out: dict[str, Any] = {}
    for label, temp, per_prompt in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        env, split = make_env(per_prompt)
        start = time.perf_counter()
        with temperature(policy, temp):
            result = evaluate_policy(policy, env, prompts, seed=seed)
        out[label] = {
            "reward": result.reward_mean,
            "length": result.completion_length,
            "split": split,
            "seconds": time.perf_counter() - start,
            "samples": [list(s) for s in result.samples[:keep]],
        }
    return out


def plot_curves(
    records: list[dict[str, Any]],
    out: Path,
    group_of: Callable[[dict[str, Any]], str],
    label_of: Callable[[dict[str, Any]], str],
    style: Callable[[Any, str], None],
) -> list[str]:
    """One PNG per group of records (``<group>.png``): the training reward, rolling mean
    of 10, one line per record; ``style(ax, group)`` adds the axes' labels, title and any
    reference lines. Returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for group in sorted({group_of(r) for r in records}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in (r for r in records if group_of(r) == group):
            rewards = [m["reward_mean"] for m in r["history"]]
            ax.plot(range(1, len(rewards) + 1), rolling(rewards), label=label_of(r))
        style(ax, group)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{group}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        names.append(name)
    return names


def closing_sections(
    records: list[dict[str, Any]],
    pictures: list[str],
    name_of: Callable[[dict[str, Any]], str],
    sample_text: Callable[[str, str], str],
) -> list[str]:
    """The report's end: the PNGs, the commands that made the parts (each once) and
    two held-out greedy samples of each part after training (``sample_text(prompt,
    completion)``)."""
    lines = [line for name in pictures for line in (f"![{name}]({name})", "")]
    lines += ["## Commands (one process per part; `--report` wrote this file)", ""]
    commands = dict.fromkeys((r["date"], r["command"]) for r in records)
    lines += [f"- {date}: `{command}`" for date, command in commands]
    lines += ["", "## Samples (held-out, greedy, after training)", ""]
    for r in records:
        lines.append(f"- **{name_of(r)}**:")
        for prompt, completion, reward in r["after"]["greedy"]["samples"][:2]:
            lines.append(f"  - {sample_text(prompt, completion)} ({reward:.2f})")
    return [*lines, ""]


def write_report(
    out: Path,
    lines: list[str],
    records: list[dict[str, Any]],
    pictures: Callable[[], list[str]],
    name_of: Callable[[dict[str, Any]], str],
    sample_text: Callable[[str, str], str],
) -> str:
    """Write ``out/README.md`` and return its text: ``lines``, then, once a part has a
    record, the ``closing_sections`` (``pictures()`` draws the PNGs and names them)."""
    if records:
        lines = [*lines, *closing_sections(records, pictures(), name_of, sample_text)]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


def missing(parts: Mapping[str, Any], out: Path) -> list[str]:
    """The names of the parts that have no record in ``out`` yet."""
    return sorted(set(parts) - {p.stem for p in out.glob("*.json")})


def main(
    doc: str,
    parts: Mapping[str, Any],
    run_part: Callable[[Any, argparse.Namespace], dict[str, Any]],
    report: Callable[[Path], str],
    *,
    out: Path,
    max_minutes: float,
    iterations: int,
    threads: int,
    describe: Callable[[Any], str] = lambda part: "",
) -> None:
    """The command line of a parts benchmark: run the named parts (or ``--all`` not yet
    run; ``--force`` reruns), then render the report; ``--list`` shows what is done."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", help="part names (--list shows them)")
    parser.add_argument("--all", action="store_true", help="every part not yet run")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--report", action="store_true", help="render README.md from the parts")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--max-minutes", type=float, default=max_minutes)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--force", action="store_true", help="rerun parts that have results")
    args = parser.parse_args()
    if args.list:
        for name, part in parts.items():
            done = (args.out / f"{name}.json").exists()
            print(f"{name:32s} {'done' if done else '-':5s} {describe(part)}")
        return
    unknown = [p for p in args.parts if p not in parts]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; --list shows them")
    torch.set_num_threads(args.threads)
    todo = list(parts) if args.all else args.parts
    for name in todo:
        path = args.out / f"{name}.json"
        if path.exists() and not args.force:
            print(f"[{name}] done already ({path}); --force reruns it")
            continue
        write_atomic(path, run_part(parts[name], args))
    if args.report or todo:
        print(report(args.out))
