"""``lmgym bench``: train agents x tasks x seeds with equal budgets (``lmgym.training.bench``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from lmgym.training.cli_common import add_rollout_engine_flags, error, quiet_transformers
from lmgym.training.flags import FlagType, add_typed_flag


def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _bench_parser() -> argparse.ArgumentParser:
    from lmgym.training.bench import DEFAULT_AGENTS, DEFAULT_OUT, DEFAULT_SEEDS, DEFAULT_TASKS
    from lmgym.training.bench_spec import DEFAULT_GROUP_SIZE, DEFAULT_NUM_PROMPTS

    parser = argparse.ArgumentParser(
        prog="lmgym bench",
        description="Train agents x tasks x seeds with equal budgets; write a Markdown table "
        "and PNG learning curves.",
    )
    parser.add_argument(
        "--agents",
        type=_csv_list,
        default=None,
        help=f"comma list, or all (default: {','.join(DEFAULT_AGENTS)})",
    )
    parser.add_argument(
        "--tasks",
        type=_csv_list,
        default=None,
        help="comma list of task ids, your own as module:TaskId-v0 "
        f"(default: {','.join(DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local directory or hub name of your causal LM, loaded afresh for every run "
        "(default: a tiny GPT-2 initialised with the run's seed)",
    )
    add_typed_flag(
        parser,
        "--learning-rate",
        kind=float,
        default=None,
        help="every agent's learning rate (default: each agent's own, for the tiny GPT-2; a "
        "pretrained model wants far less: docs/cli.md, Pretrained models)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda t: [FlagType("seeds", int)(s) for s in _csv_list(t)],
        default=None,
        help=f"comma list (default: {','.join(map(str, DEFAULT_SEEDS))})",
    )
    add_typed_flag(
        parser,
        "--iterations",
        kind=int,
        default=None,
        help="iterations for every task (default: per task)",
    )
    add_typed_flag(
        parser,
        "--num-prompts",
        kind=int,
        default=DEFAULT_NUM_PROMPTS,
        help=f"prompts per batch (default: {DEFAULT_NUM_PROMPTS}, as lmgym train)",
    )
    add_typed_flag(
        parser,
        "--group-size",
        kind=int,
        default=DEFAULT_GROUP_SIZE,
        help=f"completions per prompt (default: {DEFAULT_GROUP_SIZE}, as lmgym train)",
    )
    add_typed_flag(
        parser,
        "--workers",
        kind=int,
        default=None,
        help="runs at once, each in its own process with one torch thread; 0 runs them in "
        "this process (default: 1; 0 with --quick)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    add_rollout_engine_flags(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: TargetString, grpo and rloo, one seed, 6 iterations, in this process",
    )
    return parser


def bench(argv: Sequence[str]) -> int:
    """``lmgym bench``: the agent benchmark."""
    from lmgym.agents import ALGORITHMS
    from lmgym.training.bench import BenchOutputExistsError, BenchSpec, run_bench

    args = _bench_parser().parse_args(list(argv))
    quiet_transformers()
    agents = sorted(ALGORITHMS) if args.agents == ["all"] else args.agents
    try:
        spec = BenchSpec.quick() if args.quick else BenchSpec()
        spec = spec.replace(
            agents=agents,
            model=args.model,
            learning_rate=args.learning_rate,
            tasks=args.tasks,
            seeds=args.seeds,
            iterations=args.iterations,
            num_prompts=args.num_prompts,
            group_size=args.group_size,
            workers=args.workers,
            rollout_engine=args.rollout_engine,
            vllm_kv_cache_gib=args.vllm_kv_cache_gib,
        )
        summary = run_bench(spec, args.out, overwrite=args.overwrite)
    except (BenchOutputExistsError, FileNotFoundError, ValueError) as exc:
        return error("bench", str(exc))
    print(summary)
    return 0
