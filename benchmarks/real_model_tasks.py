"""Base-model scores of the chat tasks: SmolLM2-135M-Instruct on each task's eval split.

For every *setting* (a task and its options: the default difficulty and the harder
levels) the packaged ``smollm2-135m-instruct`` (float32, untrained) answers every
prompt of the task's held-out ``split="eval"`` once greedily and once at
temperature 1 (no top-k/top-p), stopping on its end of turn
(``policy.stop_token_ids``), at the task's default token budget. The score is the
mean episode return; for Instructions also each constraint's mean. Everything is
seeded (prompt order and sampler: ``evaluate_policy(..., seed=0)``), so a rerun
gives the same figures on the same machine.

Each setting's figures go to ``benchmarks/results/real_model_tasks.json`` as soon as
they are measured (a setting already there is skipped: the run resumes), and the
markdown table ``benchmarks/results/real_model_tasks.md`` is rewritten from it.
The figures of the default settings are the ``base_score`` of each task's
``TaskInfo`` (``lmgym tasks``) and of ``docs/tasks.md``.

    .venv/bin/python benchmarks/real_model_tasks.py                 # every setting
    .venv/bin/python benchmarks/real_model_tasks.py arithmetic      # settings by name prefix
    .venv/bin/python benchmarks/real_model_tasks.py --list
    .venv/bin/python benchmarks/real_model_tasks.py --report        # rewrite the .md only

On this 2-core machine use one thread (``--threads 1``, the default): other
processes share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.envs import reward_component_means
from lmgym.policy import CausalLMPolicy
from lmgym.training.evaluation import evaluate_policy, make_eval_env

MODEL = "smollm2-135m-instruct"
RESULTS = Path(__file__).parent / "results"
JSON_PATH = RESULTS / "real_model_tasks.json"
MD_PATH = RESULTS / "real_model_tasks.md"
MAX_PROMPTS = 128


@dataclass(frozen=True)
class Setting:
    """One task at one difficulty.

    Attributes:
        name: short name (``arithmetic``, ``arithmetic-exact``, ...).
        task: the registered id.
        options: the task options (``{}``: its defaults).
        default: whether these are the task's default options.
    """

    name: str
    task: str
    options: dict[str, Any] = field(default_factory=dict)
    default: bool = False


SETTINGS = [
    Setting("arithmetic", "lmgym/ChatArithmetic-v0", {}, default=True),
    Setting("arithmetic-first", "lmgym/ChatArithmetic-v0", {"answer": "first_number"}),
    Setting("arithmetic-exact", "lmgym/ChatArithmetic-v0", {"answer": "exact"}),
    Setting("arithmetic-2digit", "lmgym/ChatArithmetic-v0", {"digits": 2}),
    Setting("instructions", "lmgym/Instructions-v0", {}, default=True),
    Setting("instructions-strict", "lmgym/Instructions-v0", {"strict": True}),
    Setting("instructions-no-example", "lmgym/Instructions-v0", {"examples": 0}),
    Setting("continuation", "lmgym/PositiveContinuation-v0", {}, default=True),
    Setting("continuation-negative", "lmgym/PositiveContinuation-v0", {"openings": "negative"}),
]


def measure(policy: CausalLMPolicy, setting: Setting) -> dict[str, Any]:
    """The setting's eval-split scores, greedy and at temperature 1."""
    probe, _ = make_eval_env(setting.task, policy.tokenizer, 1, 1, env_kwargs=setting.options)
    num_prompts = min(len(probe.prompt_table), MAX_PROMPTS)
    out: dict[str, Any] = {
        "setting": setting.name,
        "task": setting.task,
        "options": setting.options,
        "default": setting.default,
        "num_prompts": num_prompts,
        "max_new_tokens": probe.max_new_tokens,
    }
    for label, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        policy.temperature = temperature
        env, split = make_eval_env(
            setting.task,
            policy.tokenizer,
            num_prompts,
            1,
            env_kwargs={**setting.options, "stop_token_ids": policy.stop_token_ids},
        )
        reward_component_means(env)  # start the component statistics from zero
        start = time.perf_counter()
        result = evaluate_policy(policy, env, num_prompts, seed=0, split=split)
        out[label] = {
            "reward_mean": round(result.reward_mean, 4),
            "reward_std": round(result.reward_std, 4),
            "completion_length": round(result.completion_length, 2),
            "components": {k: round(v, 4) for k, v in reward_component_means(env).items()},
            "seconds": round(time.perf_counter() - start, 1),
            "samples": [list(s) for s in result.samples[:4]],
        }
        print(
            f"{setting.name:24s} {label:7s} {result.summary()}  ({out[label]['seconds']} s)",
            flush=True,
        )
    return out


def load(path: Path = JSON_PATH) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else {}


def save(name: str, figures: dict[str, Any], path: Path = JSON_PATH) -> dict[str, dict[str, Any]]:
    """Add one setting's figures to the results file (re-read first, so that two runs
    measuring different settings keep each other's); returns every result."""
    results = {**load(path), name: figures}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return results


def _short(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def report(results: dict[str, dict[str, Any]]) -> str:
    """The markdown results file."""
    lines = [
        "# Chat tasks: base scores of SmolLM2-135M-Instruct",
        "",
        "Made by `benchmarks/real_model_tasks.py` (its docstring says how). The packaged",
        f"`{MODEL}` (Q4_1 weights dequantized to float32, untrained) answers every prompt",
        'of each task\'s held-out `split="eval"` (at most 128) once greedily and once at',
        "temperature 1, stopping on `<|im_end|>`, at the task's default token budget,",
        "seed 0. Score = mean episode return. **Bold**: a task's default difficulty, the",
        "figures in `lmgym tasks` and `docs/tasks.md`; the defaults were chosen so that",
        "the sampled score sits between 0.1 and 0.7 (a group-relative method needs",
        "groups whose completions differ in reward).",
        "",
        "| setting | task | options | prompts | tokens | greedy | T=1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in SETTINGS:
        r = results.get(setting.name)
        if r is None:
            continue
        options = ", ".join(f"{k}={v!r}" for k, v in r["options"].items()) or "(defaults)"
        greedy, sampled = r["greedy"]["reward_mean"], r["sampled"]["reward_mean"]
        cells = [f"{greedy:.3f}", f"{sampled:.3f}"]
        if r["default"]:
            cells = [f"**{c}**" for c in cells]
        lines.append(
            f"| {setting.name} | `{r['task']}` | {options} | {r['num_prompts']} | "
            f"{r['max_new_tokens']} | {cells[0]} | {cells[1]} |"
        )
    components = [(name, r) for name, r in results.items() if r["greedy"].get("components")]
    if components:
        lines += [
            "",
            "Instructions, each rule's share met (greedy / T=1), over every completion",
            "scored: the evaluation rolls out whole batches of 32 prompts, so 128 for the",
            "100 eval prompts (28 of them twice); the means above count each prompt once.",
            "",
            "| setting | "
            + " | ".join(
                k.removeprefix("reward/") for k in components[0][1]["greedy"]["components"]
            )
            + " |",
            "|---|" + "---|" * len(components[0][1]["greedy"]["components"]),
        ]
        for name, r in components:
            g, s = r["greedy"]["components"], r["sampled"]["components"]
            lines.append(f"| {name} | " + " | ".join(f"{g[k]:.2f} / {s[k]:.2f}" for k in g) + " |")
    lines += ["", "Completions (the first prompts, greedy then T=1):", ""]
    for setting in SETTINGS:
        r = results.get(setting.name)
        if r is None:
            continue
        lines.append(f"- **{setting.name}**")
        for label in ("greedy", "sampled"):
            for prompt, completion, score in r[label]["samples"][:2]:
                lines.append(
                    f"  - {label}: `{_short(prompt, 60)}` -> `{_short(completion)}` ({score:.2f})"
                )
    seconds = sum(r[k]["seconds"] for r in results.values() for k in ("greedy", "sampled"))
    lines += [
        "",
        f"Measured on {platform.machine()} CPU, torch {torch.__version__}, one thread, "
        f"{seconds / 60:.0f} min of generation in all (the machine was shared).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="*", help="setting names or prefixes (default: all)")
    parser.add_argument("--list", action="store_true", help="list the settings and exit")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown file")
    parser.add_argument("--redo", action="store_true", help="measure settings already measured")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if args.list:
        for s in SETTINGS:
            print(f"{s.name:24s} {s.task} {s.options or '(defaults)'}")
        return 0
    results = load()
    if not args.report:
        torch.set_num_threads(args.threads)
        chosen = [
            s
            for s in SETTINGS
            if not args.settings or any(s.name.startswith(p) for p in args.settings)
        ]
        policy = CausalLMPolicy.from_pretrained(MODEL)
        for setting in chosen:
            if setting.name in results and not args.redo:
                print(f"{setting.name}: measured already (--redo measures again)")
                continue
            results = save(setting.name, measure(policy, setting))
            MD_PATH.write_text(report(results))
    MD_PATH.write_text(report(load()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
