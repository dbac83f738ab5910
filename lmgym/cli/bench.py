"""``lmgym bench``: train agents x tasks x seeds with equal budgets (``lmgym.bench``).

Its flags are ``BenchSpec``'s fields: the bench's own (``--agents``, ``--tasks``,
``--seeds`` as comma lists, ``--iterations``, ``--learning-rate``, ``--workers``) and
the ones a run config has too, which take ``TrainConfig``'s flags, defaults and help
(``_RUN_FIELDS``). What a command line sets replaces the spec's value, of
``BenchSpec()`` or of the ``--quick`` smoke spec.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmgym.cli.common import error, quiet_transformers
from lmgym.cli.flags import flag_dataclass, given_fields, make_parser

# BenchSpec's fields that are TrainConfig's too: their flags are TrainConfig's.
_RUN_FIELDS = (
    "model",
    "lora_r",
    "num_prompts",
    "group_size",
    "max_time",
    "prompts",
    "reward",
    "prompt_field",
    "eval_prompts",
    "eval_samples",
    "rollout_engine",
    "vllm_kv_cache_gib",
)
_BENCH_FIELDS = ("agents", "tasks", "seeds", "iterations", "learning_rate", "workers")


def _run_notes() -> dict[str, str]:
    """What the run-config fields mean for a bench, said after ``TrainConfig``'s help."""
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS

    return {
        "model": "Bench: loaded afresh for every run, trained with the pretrained defaults and "
        "evaluated on held-out prompts before and after (the tiny GPT-2 is initialised with "
        "each run's seed).",
        "group_size": f"Bench: with --model, {PRETRAINED_DEFAULTS.group_size} (the pretrained "
        "default).",
        "max_time": "Bench: every run's training.",
        "prompts": "Bench: the task prompts/<file stem>-v0 (alone, or beside the --tasks you "
        "name), a tenth of its rows held out for evaluation.",
    }


def _bench_parser() -> argparse.ArgumentParser:
    """The ``lmgym bench`` argument parser."""
    from lmgym.bench.spec import DEFAULT_OUT, BenchSpec
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS
    from lmgym.training.run import TrainConfig

    learning_rates = (
        f"With --model: {PRETRAINED_DEFAULTS.learning_rate_lora:g} with --lora-r, "
        f"{PRETRAINED_DEFAULTS.learning_rate_full:g} without."
    )
    parser = make_parser(
        [
            flag_dataclass(
                BenchSpec,
                only=_BENCH_FIELDS,
                comma=("agents", "tasks", "seeds"),
                notes={"learning_rate": learning_rates, "workers": "--quick: 0."},
                group="the bench",
            ),
            flag_dataclass(
                TrainConfig,
                only=_RUN_FIELDS,
                notes=_run_notes(),
                group="every run (as lmgym train)",
            ),
        ],
        prog="lmgym bench",
        description="Train agents x tasks x seeds with equal budgets; write a Markdown table "
        "and PNG learning curves.",
    )
    parser.add_argument(
        "--eval",
        dest="evaluate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="evaluate the base model and every trained model on the held-out prompts, "
        "greedy and sampled (default: with --model)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace results already in --out (without it, a rerun of the same command "
        "continues an unfinished bench there)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: TargetString, grpo and rloo, one seed, 6 iterations, in this process",
    )
    return parser


def _spec_changes(args: argparse.Namespace, given: set[str]) -> dict[str, Any]:
    """The ``BenchSpec`` fields the command line sets, as the spec takes them."""
    from lmgym.agents import ALGORITHMS
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS

    changes = {
        name: getattr(args, name) for name in (*_BENCH_FIELDS, *_RUN_FIELDS) if name in given
    }
    if changes.get("agents") == ("all",):
        changes["agents"] = sorted(ALGORITHMS)
    if "group_size" not in given and args.model is not None:
        changes["group_size"] = PRETRAINED_DEFAULTS.group_size
    changes["evaluate"] = args.model is not None if args.evaluate is None else args.evaluate
    return changes


def bench(argv: Sequence[str]) -> int:
    """``lmgym bench``: the agent benchmark."""
    from lmgym.bench.run import BenchOutputExistsError, BenchSpec, run_bench
    from lmgym.bench.spec import register_user_task

    parser = _bench_parser()
    args = parser.parse_args(list(argv))
    changes = _spec_changes(args, given_fields(parser, argv))
    quiet_transformers()
    try:
        if args.prompts is not None or args.reward is not None:
            if args.prompts is not None:
                changes["prompts"] = str(Path(args.prompts).expanduser().resolve())
            task = register_user_task(changes.get("prompts"), args.reward, args.prompt_field)
            changes["tasks"] = [*(changes.get("tasks") or ()), task]
        spec = (BenchSpec.quick() if args.quick else BenchSpec()).replace(**changes)
        summary = run_bench(spec, args.out, overwrite=args.overwrite)
    except (BenchOutputExistsError, FileNotFoundError, ValueError) as exc:
        return error("bench", str(exc))
    print(summary)
    return 0
