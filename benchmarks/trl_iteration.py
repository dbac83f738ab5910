"""GRPO / RLOO iteration time: lmgym against TRL's ``GRPOTrainer`` / ``RLOOTrainer``.

One iteration = generate a batch of completions, score them, one optimizer step:
lmgym's ``agent.step()`` (collect + update) against one TRL trainer step (the Trainer
loop's own overhead included). Both sides in one process, alternated; each row in
``--processes`` fresh processes, reporting the median of their ratios.

Equal work (issue 7's setting, kept by issue 18):

- Models: GPT-2 from a config (2 layers x 128, 4 heads; 6 layers x 384, 6 heads), a
  character tokenizer of 99 ids (``string.printable`` minus ``\\n\\r\\x0b\\x0c``),
  saved once and loaded by both sides; float32, CPU, no gradient checkpointing, no
  dropout. ``--threads`` torch threads (default ``2,1``).
- Batch: the same 8 prompts of exactly 16 characters, 8 completions each, exactly 32
  new tokens per row (asserted on both sides), temperature 1, no top-k / top-p. Both
  sides stop a row at EOS, so the saved checkpoint (plain GPT-2, nothing patched at
  run time) gives EOS and pad probability 0 (``build_checkpoint``).
- Reward: the same function on both sides (share of ``e`` in the completion).
- Update: beta = 0, one AdamW (0.9, 0.999) step per batch, the same constant learning
  rate, weight decay 0, clipping at 1.0. GRPO: group-std-scaled advantages, token clip
  0.2, per-sequence mean of token means (lmgym ``seq-mean-token-mean`` = TRL
  ``loss_type="grpo"``), one epoch and minibatch, so neither side runs a separate
  old-log-prob pass. RLOO: TRL always runs that extra no-grad pass and a
  sequence-level clipped loss; lmgym's ``RLOO`` (token-mean REINFORCE, leave-one-out
  baseline) reuses the update's forward. lmgym runs GPT-2's tanh-GELU as torch's fused
  kernel (``fused_activations=True``). Each library's implementation, kept.

Alternation. TRL's ``trainer.train()`` owns its loop, so lmgym runs inside it: a
``TrainerCallback`` times each TRL step (end of the previous callback ->
``on_step_end``, the loop's overhead included; ``on_step_begin`` -> ``on_step_end``
too), then one lmgym ``agent.step()``; the first ``--warmup`` pairs are discarded.
Targets: ``MODELS`` (issue 18's). Needs the ``bench`` extra; ``--quick``: a smoke run::

    .venv/bin/python benchmarks/trl_iteration.py --out benchmarks/results/trl_iteration.md
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import string
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import torch
import workloads as w

from lmgym.agents import GRPO, RLOO, Agent
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy, make_tiny_lm

CHARS = "".join(c for c in string.printable if c not in "\n\r\x0b\x0c")
PROMPTS = ["Once upon a time", "The quick brown ", "def reward(x): r", "In the beginning",
           "Q: what is 2+2? ", "Dear diary, tod ", "SELECT * FROM t ", "It was a dark an"]  # fmt: skip
PROMPT_TOKENS, NUM_PROMPTS, GROUP_SIZE, NEW_TOKENS = 16, 8, 8, 32
TOKENS = NUM_PROMPTS * GROUP_SIZE * NEW_TOKENS
LEARNING_RATE = 1e-3
MODELS = {"small": ("GPT-2 2L/128d", 2, 128, 4, 2.5), "large": ("GPT-2 6L/384d", 6, 384, 6, 2.0)}
"""name -> (label, layers, width, heads, issue 18's target TRL / lmgym ratio of median s/it)."""
TARGET_THREADS = 2  # the issues' setting; other thread counts are for information
TRL_NAME = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}


def reward_e(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """Share of 'e' characters in each completion (the same function on both sides)."""
    return [c.count("e") / NEW_TOKENS for c in completions]


def build_checkpoint(path: Path, model: str) -> Path:
    """Save a GPT-2 + char tokenizer whose EOS and pad ids have probability exactly 0."""
    _, layers, width, heads, _ = MODELS[model]
    lm, tok = make_tiny_lm(CHARS, n_layer=layers, n_embd=width, n_head=heads, n_positions=64)
    with torch.no_grad():  # h[..., 0] == 1 after ln_f, so logit_v = wte[v, 0] + (the rest)
        lm.transformer.ln_f.weight[0] = 0.0
        lm.transformer.ln_f.bias[0] = 1.0
        for token_id in (tok.eos_token_id, tok.pad_token_id):
            lm.transformer.wte.weight[token_id, 0] = -1e4  # tied with lm_head
    lm.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_agent(path: Path, algo: str, compile_decode: bool = False) -> Agent:
    policy = CausalLMPolicy.from_pretrained(path, temperature=1.0, top_k=None, top_p=None,
                                            compile_decode=compile_decode)  # fmt: skip
    env = TokenVectorEnv(policy.tokenizer, PROMPTS, FunctionReward(reward_e),
                         num_prompts=NUM_PROMPTS, group_size=GROUP_SIZE, max_new_tokens=NEW_TOKENS)  # fmt: skip
    assert env.prompt_width == PROMPT_TOKENS and bool(env.prompt_table.mask.all())
    agent_class = GRPO if algo == "grpo" else RLOO
    return agent_class(policy, env, learning_rate=LEARNING_RATE, beta=0.0, **h.ONE_STEP)


def make_trainer(path: Path, algo: str, steps: int, out_dir: str, callback: Any) -> Any:
    """A TRL trainer over the same checkpoint, prompts, reward and update settings."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    if algo == "grpo":
        config_class, trainer_class = trl.GRPOConfig, trl.GRPOTrainer
        algo_args = dict(loss_type="grpo", scale_rewards="group", epsilon=0.2)
    else:
        config_class, trainer_class = trl.RLOOConfig, trl.RLOOTrainer
        algo_args = dict(normalize_advantages=False)
    datasets.disable_progress_bars()
    config = config_class(
        output_dir=out_dir, per_device_train_batch_size=NUM_PROMPTS * GROUP_SIZE,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=GROUP_SIZE,
        num_iterations=1, max_completion_length=NEW_TOKENS, temperature=1.0, top_k=0,
        top_p=1.0, beta=0.0, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        mask_truncated_completions=False, max_steps=steps, use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=False, report_to="none", logging_strategy="no",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        shuffle_dataset=False,  # every batch = the 8 prompts, in order, like lmgym's
        seed=0, **algo_args,
    )  # fmt: skip
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[reward_e],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * (steps + 1)}),
        processing_class=AutoTokenizer.from_pretrained(path),
        callbacks=[callback],
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


@dataclass
class Run:
    """One process's timed pairs: seconds per iteration of each side."""

    lm: list[float]
    trl: list[float]  # full cycle
    trl_core: list[float]  # on_step_begin -> on_step_end
    other_load: float

    @property
    def ratio(self) -> float:
        return statistics.median(self.trl) / statistics.median(self.lm)


def alternated_run(path: Path, algo: str, args: argparse.Namespace, _: int = 0) -> Run:
    """Run TRL's trainer and, after each of its steps, one lmgym ``agent.step()``."""
    from transformers import TrainerCallback

    agent = make_agent(path, algo, args.compile_decode)
    run = Run([], [], [], float("nan"))
    state: dict[str, Any] = {"meter": None}

    class Alternate(TrainerCallback):
        def on_train_begin(self, _: Any, st: Any, control: Any, **kwargs: Any) -> None:
            state["mark"] = time.perf_counter()

        def on_step_begin(self, _: Any, st: Any, control: Any, **kwargs: Any) -> None:
            if st.global_step >= args.warmup:  # global_step: the steps done before this one
                state["meter"] = state["meter"] or h.CpuMeter()
            state["begin"] = time.perf_counter()

        def on_step_end(self, _: Any, st: Any, control: Any, **kwargs: Any) -> None:
            end = time.perf_counter()
            logged = state["trainer"]._metrics["train"]  # TRL's own record of the step
            low, high = logged["completions/min_length"][-1], logged["completions/max_length"][-1]
            assert low == high == NEW_TOKENS, f"TRL: completions of {low}-{high} tokens"
            seconds, made, metrics = w.timed_step(agent)
            assert made == TOKENS and metrics["completion_length"] == NEW_TOKENS, made
            if st.global_step > args.warmup:
                run.trl.append(end - state["mark"])
                run.trl_core.append(end - state["begin"])
                run.lm.append(seconds)
            state["mark"] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out_dir:
        state["trainer"] = make_trainer(path, algo, args.warmup + args.iters, out_dir, Alternate())
        state["trainer"].train()
    assert len(run.lm) == len(run.trl) == args.iters
    w.check_compiled(agent.policy, args.compile_decode)
    run.other_load = state["meter"].other_load()
    return run


def profile_lmgym(path: Path, algo: str, iters: int, compile_decode: bool = False) -> h.Phases:
    """Exclusive seconds per labelled phase of lmgym's ``agent.step()`` (after one warm-up)."""
    agent = make_agent(path, algo, compile_decode)
    agent.step()
    phases = h.profile_phases(agent.step, iters)
    w.check_compiled(agent.policy, compile_decode)
    return phases


@dataclass
class Result(h.Runs[Run]):
    """One row: an algorithm, a model and a thread count, over ``runs`` (processes)."""

    algo: str = ""
    model: str = ""
    threads: int = 0
    profile: h.Phases = field(default_factory=dict)


def report(results: list[Result], args: argparse.Namespace, command: str, wall: float) -> list[str]:
    modules = ["torch", "transformers", "trl", "accelerate", "datasets", "lmgym"]
    threads = "torch threads per row in the 'threads' column"
    head = h.header("GRPO / RLOO iteration time: lmgym vs TRL", threads, modules, command,
                    note=f" (total {wall:.0f} s)", compile_decode=args.compile_decode)  # fmt: skip
    rows = []
    for r in results:
        lm, trl = r.pooled("lm"), r.pooled("trl")
        rows.append(
            f"{r.algo.upper()} vs {TRL_NAME[r.algo]} | {MODELS[r.model][0]} | {r.threads} "
            f"| {h.spread(lm)} | {h.spread(trl)} | {statistics.median(r.pooled('trl_core')):.3f} "
            f"| {TOKENS / statistics.mean(lm):,.0f} | {TOKENS / statistics.mean(trl):,.0f} "
            f"| {r.ratio:.2f}x | >= {MODELS[r.model][4]:g}x | {h.load_cell(r.other_load)}"
        )
    lines = [
        *head,
        f"- work per iteration: {NUM_PROMPTS} prompts x {GROUP_SIZE} completions, "
        f"{PROMPT_TOKENS}-token prompts, exactly {NEW_TOKENS} new tokens per row ({TOKENS} "
        "completion tokens, asserted on both sides), temperature 1, no top-k/top-p, beta = 0, "
        f"one AdamW step (lr {LEARNING_RATE:g}, constant), float32",
        f"- method: alternated (TRL step, lmgym step, ...), {args.warmup} warm-up pairs "
        f"discarded, then {args.iters} timed pairs, in each of {args.processes} fresh "
        "process(es). lmgym: `agent.step()`; TRL: end of the previous step's callbacks -> "
        "`on_step_end`. Seconds: median [IQR] (min-max) over all processes' iterations; tok/s "
        "= completion tokens / mean seconds; ratio = TRL median / lmgym median (> 1: lmgym "
        "faster), the median of the per-process ratios. Equal work: the script's docstring.",
        "",
        *h.table(
            "algorithm | model | threads | lmgym s/it | TRL s/it | TRL s/it (step_begin"
            "->end) | lmgym tok/s | TRL tok/s | ratio | target | other CPU load",
            rows,
            left=2,
        ),  # fmt: skip
        *h.ratios_block(results),
    ]
    targets = []
    for r in results:
        info = "" if r.threads == TARGET_THREADS else " (for information: not the issue's setting)"
        targets.append(h.target_line(r.name, r.ratio, MODELS[r.model][4], "lmgym vs TRL") + info)
    title = f"Targets (issue 18's for GRPO, RLOO held to the same; {TARGET_THREADS} torch threads)"
    lines += h.targets_section(title, targets, results)
    columns = {f"{r.algo.upper()} {MODELS[r.model][0]}, {r.threads}T": r.profile
               for r in results if r.profile}  # fmt: skip
    note = f"{args.profile_iters} extra lmgym iterations (`agent.step()`)."
    return lines + h.phase_section("Where lmgym's iteration goes", note, columns)


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run (< 60 s)")
    p.add_argument("--threads", help="comma list of torch thread counts (default 2,1)")
    p.add_argument("--algos", default="grpo,rloo", help="comma list of: grpo, rloo")
    p.add_argument("--iters", type=int, help="timed pairs (default 15)")
    p.add_argument("--profile-iters", type=int, help="profiled lmgym iterations (default 5)")
    p.add_argument("--profile-only", action="store_true", help="lmgym's profile only, no TRL")
    h.add_common(p, None, list(MODELS), processes="3, --quick 1", compile_decode=True)
    p.add_argument("--warmup", type=int, help="warm-up pairs (default 3)")
    args = p.parse_args(argv)
    h.fill_defaults(
        args,
        dict(threads="2,1", models="small,large", warmup=3, iters=15, processes=3, profile_iters=5),
        dict(threads="2", models="small", warmup=1, iters=3, processes=1, profile_iters=2),
    )
    models = h.csv(args.models, list(MODELS), "--models", p)
    algos = h.csv(args.algos, list(TRL_NAME), "--algos", p)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    command = h.command_line("trl_iteration.py", argv)
    start = time.perf_counter()
    deadline = h.deadline_from(args.wait_idle, start)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {m: build_checkpoint(Path(tmp) / m, m) for m in models}
        for n, m, algo in itertools.product(threads, models, algos):
            h.quiet_worker(n)
            name = f"{algo.upper()}, {MODELS[m][0]}, {n} thread(s)"
            print(f"{name}: {args.warmup}+{args.iters} pairs", flush=True)
            runs = []
            if not args.profile_only:
                work = functools.partial(alternated_run, paths[m], algo, args)
                runs = h.run_row(name, work, args.processes, n, deadline).runs
            result = Result(name, runs, algo, m, n)
            if args.profile_iters > 0:
                result.profile = profile_lmgym(paths[m], algo, args.profile_iters,
                                               args.compile_decode)  # fmt: skip
            results.append(result)
    if args.profile_only:
        print("\n".join(h.phase_table({r.name: r.profile for r in results})))
        return
    h.finish(report(results, args, command, time.perf_counter() - start), args.out)


if __name__ == "__main__":
    main()
