"""The LM workloads the benchmark scripts share: models, prompts, envs, rewards, sides.

- **Models.** Tiny GPT-2s from a config (``tiny_gpt2``: the ``small`` 2-layer/128-wide
  and ``large`` 6-layer/256-wide models of ``SIZES``), and an output bias that makes
  a token unsampleable (``forbid_token``: every row then runs to the token budget on
  both sides, equal work).
- **Prompts and envs.** Prompts of an exact token length, a reward that costs nothing
  (``ZeroReward``), a token-level reward that depends on the text (``ShareOf``), the
  fixed-length env of rollout-vs-generate, an env that counts the tokens it writes
  (``CountingEnv``) and the GRPO agent of the iteration benchmarks (``grpo_agent``).
- **Sides.** ``collect`` against ``model.generate`` at exactly the same work
  (``RolloutVsGenerate``), with a device-synchronised timer (``timed``); a device's
  measured bf16 matmul peak (``matmul_tflops``).
- **Bimodal lengths.** Prompts of two kinds and a fine-tune that answers one kind with
  2 characters + EOS and never stops on the other (``bimodal_prompts``,
  ``fine_tune_bimodal``), for continuous batching.

Importing ``harness`` first puts the repository root on ``sys.path``.
"""

from __future__ import annotations

import string
import time
from collections.abc import Callable
from typing import Any

import harness as h  # also puts the repository root on sys.path
import numpy as np
import torch
from torch import Tensor, nn

from lmgym import TokenVectorEnv
from lmgym.char_tokenizer import DEFAULT_CHARS

SIZES = {"small": ("GPT-2 2L/128d", 2, 128), "large": ("GPT-2 6L/256d", 6, 256)}
"""name -> (label, layers, width); 4 heads."""


def tiny_gpt2(size: str, n_positions: int, **kwargs: Any) -> tuple[nn.Module, Any]:
    """``(model, character tokenizer)``: the GPT-2 of ``SIZES[size]`` from a config."""
    _, layers, width = SIZES[size]
    from lmgym import make_tiny_lm

    return make_tiny_lm(n_layer=layers, n_embd=width, n_head=4, n_positions=n_positions, **kwargs)


def forbid_token(model: nn.Module, *token_ids: int) -> None:
    """Give the output layer a bias of ``-1e9`` on each of ``token_ids`` (probability
    exactly 0).

    The new ``[V, H]`` head shares the old (tied) weight, so every other logit is
    unchanged; the bias takes the weight's dtype and device.
    """
    old = model.get_output_embeddings()
    w = old.weight
    head = nn.Linear(old.in_features, old.out_features, bias=True, device=w.device, dtype=w.dtype)
    head.weight = w
    with torch.no_grad():
        head.bias.zero_()
        head.bias[list(token_ids)] = -1e9
    model.set_output_embeddings(head)


def check_compiled(policy: Any, requested: bool) -> None:
    """With ``--compile-decode``, fail rather than time an eager fallback (the policy
    turns ``compile_decode`` off, with a warning the workers silence, when compiling
    fails)."""
    if requested and not policy.compile_decode:
        raise RuntimeError(
            "--compile-decode: torch.compile of the decode step failed and the policy fell "
            "back to eager decoding; run without --compile-decode, or fix the compile"
        )


# ------------------------------------------------------------- prompts, envs, rewards
class ZeroReward:
    """A trivial reward model: 0 for every row, ``[N] float32`` on the completions' device."""

    name = "zero"

    def __call__(self, batch: Any) -> Tensor:
        return torch.zeros(batch.completion_ids.shape[0], device=batch.completion_ids.device)


class ShareOf:
    """Reward: the share of one token among a row's completion tokens, ``[N] float32``
    on the completions' device (no decoding to text)."""

    name = "share_of"

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, batch: Any) -> Tensor:
        mask = batch.completion_mask
        hits = ((batch.completion_ids == self.token_id) & mask).sum(1).float()
        return hits / mask.sum(1).clamp(min=1).float()


def make_prompts(tokenizer: Any, n: int, length: int, seed: int = 0) -> list[str]:
    """``n`` random strings over the character tokenizer's characters, each exactly
    ``length`` tokens."""
    rng = np.random.default_rng(seed)
    prompts = ["".join(rng.choice(list(DEFAULT_CHARS), size=length)) for _ in range(n)]
    for p in prompts:
        assert len(tokenizer(p, add_special_tokens=False)["input_ids"]) == length
    return prompts


def fixed_length_env(
    tokenizer: Any,
    n: int,
    prompt_tokens: int,
    new_tokens: int,
    device: str | torch.device = "cpu",
    prompts: list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    group_size: int = 1,
) -> Any:
    """``n`` rows, ``n / group_size`` exact-length prompts each repeated ``group_size``
    times (served in order; random characters unless ``prompts`` are given), EOS the
    only stop id unless ``stop_token_ids`` are given, a zero reward: the env side of
    rollout-vs-generate."""
    distinct = n // group_size
    env = TokenVectorEnv(
        tokenizer,
        prompts if prompts is not None else make_prompts(tokenizer, distinct, prompt_tokens),
        ZeroReward(),
        num_prompts=distinct,
        group_size=group_size,
        max_new_tokens=new_tokens,
        stop_token_ids=stop_token_ids or [tokenizer.eos_token_id],
        prompt_order="sequential",
        device=device,
    )
    assert env.prompt_width == prompt_tokens
    return env


class CountingEnv(TokenVectorEnv):
    """``TokenVectorEnv`` that counts its steps and the completion tokens it writes
    (a row's length grew by one on a step). Both sides use it alike."""

    steps = 0
    written = 0
    _last: Tensor | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        self._last = info["length"].clone()
        return obs, info

    def step(self, actions: Tensor) -> Any:
        out = super().step(actions)
        length = out[4]["length"]
        self.written = self.written + (length == self._last + 1).sum()  # a 0-dim tensor
        self._last = length.clone()
        self.steps += 1
        return out


def grpo_agent(
    model: nn.Module,
    tok: Any,
    num_prompts: int,
    group_size: int,
    new_tokens: int,
    prompt_tokens: int = 16,
    device: str | torch.device = "cpu",
    compile_decode: bool = False,
    **config: Any,
) -> Any:
    """GRPO on ``model`` (EOS should be forbidden: every row runs to ``new_tokens``):
    random ``prompt_tokens``-token prompts (64 of them, or ``num_prompts`` if more),
    reward the share of ``e`` in the completion, ``config`` for the agent."""
    from lmgym import CausalLMPolicy
    from lmgym.agents import GRPO

    env = TokenVectorEnv(
        tok,
        make_prompts(tok, max(64, num_prompts), prompt_tokens, seed=1),
        ShareOf(tok.convert_tokens_to_ids("e")),
        num_prompts=num_prompts,
        group_size=group_size,
        max_new_tokens=new_tokens,
        device=device,
    )
    policy = CausalLMPolicy(model, tok, compile_decode=compile_decode)
    return GRPO(policy, env, **{**h.ONE_STEP, **config})


def grpo_on_gpt2(
    layers: int, width: int, num_prompts: int, group_size: int, new_tokens: int, **config: Any
) -> Any:
    """``grpo_agent`` on a fresh GPT-2 of ``layers`` x ``width`` (6 heads, 96 positions,
    seed 0) with EOS forbidden: the same agent in every process."""
    from lmgym import make_tiny_lm

    model, tok = make_tiny_lm(n_layer=layers, n_embd=width, n_head=6, n_positions=96)
    forbid_token(model, tok.eos_token_id)
    return grpo_agent(model, tok, num_prompts, group_size, new_tokens, **config)


GRPO_OPTIONS = ("layers", "width", "prompts", "group", "new_tokens", "warmup", "iters")
"""The options of ``add_grpo_options``, forwarded to worker processes."""


def add_grpo_options(
    p: Any, prompts: int, group: int, iters: int, quick_iters: int, new_tokens: int = 32
) -> None:
    """The ``grpo_on_gpt2`` workload's options: ``--layers``/``--width`` (6 x 384; with
    ``--quick`` 2 x 96), ``--prompts``, ``--group``, ``--new-tokens`` (``new_tokens``),
    ``--warmup`` (2; ``--quick`` 1), ``--iters`` (``iters``; ``--quick`` ``quick_iters``)."""
    p.add_argument("--layers", type=int, help="GPT-2 layers (6, --quick 2)")
    p.add_argument("--width", type=int, help="GPT-2 width (384, --quick 96)")
    p.add_argument("--prompts", type=int, default=prompts, help=f"prompts per update ({prompts})")
    p.add_argument("--group", type=int, default=group, help=f"completions per prompt ({group})")
    p.add_argument(
        "--new-tokens", type=int, default=new_tokens, help=f"tokens per completion ({new_tokens})"
    )
    p.add_argument("--warmup", type=int, help="untimed updates first (2, --quick 1)")
    p.add_argument("--iters", type=int, help=f"timed updates ({iters}, --quick {quick_iters})")
    p.set_defaults(grpo_defaults=(dict(layers=6, width=384, warmup=2, iters=iters),
                                  dict(layers=2, width=96, warmup=1, iters=quick_iters)))  # fmt: skip


# ---------------------------------------------------------------------------- sides
def timed(fn: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[float, Any]:
    """``(seconds, fn())`` with a CUDA device synchronised before and after."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def timed_step(agent: Any, device: torch.device | str = "cpu") -> tuple[float, int, Any]:
    """``(seconds, completion tokens generated, metrics)`` of one ``agent.step()``
    (collect + update), timed as ``timed``."""
    before = agent.tokens_generated
    seconds, metrics = timed(agent.step, device)
    return seconds, agent.tokens_generated - before, metrics


def matmul_tflops(n: int, per_window: int, windows: int, device: torch.device) -> list[float]:
    """TFLOP/s (``2 n^3`` per product) of each of ``windows`` timing windows of
    ``per_window`` ``n x n`` bf16 products, after one untimed window: the best is the
    device's measured matmul peak."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)

    def products() -> None:
        for _ in range(per_window):
            torch.mm(a, b, out=c)

    products()
    flops = 2.0 * n**3 * per_window
    return [flops / timed(products, device)[0] / 1e12 for _ in range(windows)]


class RolloutVsGenerate:
    """lmgym's ``collect`` and transformers' ``model.generate(do_sample=True)`` on the
    same model and exact-length prompts, each making exactly ``new_tokens`` per row
    (asserted; ``model`` must have its stop ids forbidden by ``forbid_token``: they are
    the env's stop ids and ``generate``'s ``eos_token_id``; EOS alone unless the model's
    generation config lists more), full-vocabulary sampling at temperature 1. ``prompts``:
    text prompts of exactly ``prompt_tokens`` tokens (default: random characters).
    ``group_size`` G: ``batch / G`` distinct prompts, each sampled G times (the RL
    workload): the env's groups on lmgym's side (one shared prefill per group),
    ``num_return_sequences=G`` on ``generate``'s (which expands the prompts first).

    ``lmgym()`` and ``generate()`` each run once with a fresh seed and return seconds
    (the device synchronised around the call).
    """

    def __init__(
        self,
        model: nn.Module,
        tok: Any,
        batch: int,
        prompt_tokens: int,
        new_tokens: int,
        device: torch.device | str = "cpu",
        compile_decode: bool = False,
        prompts: list[str] | None = None,
        group_size: int = 1,
    ) -> None:
        from lmgym import CausalLMPolicy

        self.model, self.tok, self.device = model, tok, device
        self.group_size = group_size
        self.batch, self.prompt_tokens, self.new_tokens = batch, prompt_tokens, new_tokens
        self.policy = CausalLMPolicy(model, tok, compile_decode=compile_decode)
        self.compile_decode = compile_decode
        self.stop_ids = list(self.policy.stop_token_ids)
        self.env = fixed_length_env(
            tok, batch, prompt_tokens, new_tokens, device, prompts, self.stop_ids, group_size
        )
        self.ids = self.env.prompt_table.ids.clone()  # [B / G, Lp] the prompts, unpadded
        self.mask = self.env.prompt_table.mask.long()
        assert bool(self.mask.all())
        self.seeds = iter(range(1_000_000))

    def lmgym(self) -> float:
        from lmgym import collect

        seed = next(self.seeds)
        seconds, out = timed(lambda: collect(self.env, self.policy, seed=seed), self.device)
        assert out.completion_ids.shape == (self.batch, self.new_tokens)
        assert bool((out.lengths == self.new_tokens).all()), "lmgym: a row stopped early"
        assert bool(out.truncated.all()) and not bool(out.terminated.any())
        assert torch.equal(out.prompt_ids, self.ids.repeat_interleave(self.group_size, 0))
        check_compiled(self.policy, self.compile_decode)
        return seconds

    def generate(self) -> float:
        torch.manual_seed(next(self.seeds))
        seconds, out = timed(self._generate, self.device)
        completion = out[:, self.prompt_tokens :]
        assert out.shape[0] == self.batch
        assert completion.shape[1] == self.new_tokens, f"generate: shape {tuple(out.shape)}"
        stops = torch.tensor(self.stop_ids, device=completion.device)
        assert not bool(torch.isin(completion, stops).any()), "generate: a row stopped"
        return seconds

    def _generate(self) -> Tensor:
        """transformers' sampling with the rollout's settings (no top-k / top-p)."""
        with torch.no_grad():
            return self.model.generate(
                input_ids=self.ids,
                attention_mask=self.mask,
                do_sample=True,
                max_new_tokens=self.new_tokens,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=self.stop_ids,
                pad_token_id=self.tok.pad_token_id,
                num_return_sequences=self.group_size,
            )


# ------------------------------------------------------------------- bimodal lengths
SHORT_ALPHABET, LONG_ALPHABET = string.ascii_lowercase, string.digits + " +-*=:.,?!"
SHORT_CHARS = 2  # a short completion: 2 characters, then EOS


def char_ids(tok: Any, chars: str) -> Tensor:
    """``[len(chars)] int64`` token ids of single characters."""
    return torch.tensor(tok.convert_tokens_to_ids(list(chars)), dtype=torch.long)


def bimodal_prompts(per_kind: int, length: int, seed: int = 1) -> tuple[list[str], Tensor]:
    """``(prompts, is_short [2 per_kind] bool)``: ``length`` characters of the short kind
    (lowercase letters) and of the long kind (digits / punctuation), interleaved."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [SHORT_ALPHABET, LONG_ALPHABET] * per_kind
    picks = [torch.randint(len(a), (length,), generator=gen).tolist() for a in kinds]
    prompts = ["".join(a[j] for j in p) for a, p in zip(kinds, picks, strict=True)]
    return prompts, torch.tensor([a == SHORT_ALPHABET for a in kinds])


def fine_tune_bimodal(
    model: Any, tok: Any, steps: int, prompt_tokens: int, new_tokens: int, seed: int = 0,
    batch: int = 32, lr: float = 2e-3,
) -> str:  # fmt: skip
    """Teach the two kinds: short prompts get ``SHORT_CHARS`` characters + EOS, long ones
    ``new_tokens`` characters. Loss = mean token cross-entropy of the short completions +
    that of the long ones + that of the column where a short one ends (AdamW, lr
    decaying linearly to 0, ``batch`` sequences per step, half of each kind).

    Returns:
        A summary: losses, stop probabilities, seconds.
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    every, short_set = char_ids(tok, DEFAULT_CHARS), char_ids(tok, SHORT_ALPHABET)
    long_set = char_ids(tok, LONG_ALPHABET)
    b, half, p, n = batch, batch // 2, prompt_tokens, new_tokens
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / steps)
    for _ in range(steps):
        ids = every[torch.randint(len(every), (b, p + n), generator=gen)]
        ids[:half, :p] = short_set[torch.randint(len(short_set), (half, p), generator=gen)]
        ids[half:, :p] = long_set[torch.randint(len(long_set), (half, p), generator=gen)]
        ids[:half, p + SHORT_CHARS] = tok.eos_token_id
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:half, p + SHORT_CHARS + 1 :] = False
        ids = ids.masked_fill(~mask, tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, p - 1 : -1]
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), ids[:, p:].reshape(-1), reduction="none"
        ).view(b, n)
        target = mask[:, p:]
        short_loss = (nll[:half] * target[:half]).sum() / target[:half].sum()
        long_loss = nll[half:].mean()
        loss = short_loss + long_loss + nll[:, SHORT_CHARS].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    probs = logits.detach().float().softmax(-1)[:, :, tok.eos_token_id]  # the last batch's
    return (
        f"{steps} steps, {time.perf_counter() - start:.0f} s, losses {float(short_loss):.3f} "
        f"(short) / {float(long_loss):.3f} (long), short rows' P(EOS) where they should stop "
        f"{float(probs[:half, SHORT_CHARS].mean()):.3f}, long rows' P(EOS) per step "
        f"{float(probs[half:].mean()):.1e} (last training batch)"
    )


def lora_chat_policy(quick: bool = False) -> Any:
    """A fresh LoRA policy (r 16; ``lmgym train``'s alpha and target modules) on the
    packaged ``smollm2-135m-instruct``; ``quick``: on the tests' 13M-parameter Llama
    with SmolLM2's chat tokenizer (a smoke run), built once in the temp dir."""
    import tempfile
    from pathlib import Path

    from peft import LoraConfig

    from lmgym.policy import CausalLMPolicy
    from lmgym.training.run import LORA_ALPHA, LORA_TARGETS

    name = "smollm2-135m-instruct"
    if quick:
        import sys

        sys.path.insert(0, str(h.ROOT / "tests" / "policy"))
        import vllm_cases  # the tests' small chat Llama

        path = Path(tempfile.gettempdir()) / "lmgym-bench-small-chat-llama"
        if not (path / "config.json").exists():
            vllm_cases.small_chat_llama(path)
        name = str(path)
    lora = LoraConfig(r=16, lora_alpha=LORA_ALPHA, target_modules=list(LORA_TARGETS))
    return CausalLMPolicy.from_pretrained(name, peft_config=lora)


def add_guess_number_options(p: Any) -> None:
    """``--prompts --group --budget --turns --threads --max-turn-tokens``: GuessNumber on
    the real model as ``real_model.py``'s ``guess`` setting runs it (4 games x 8
    episodes, a 96-token budget for the policy's turns and the rendered user turns, 6
    turns, one thread, no cap on a turn)."""
    p.add_argument("--prompts", type=int, default=4, help="games per iteration (4)")
    p.add_argument("--group", type=int, default=8, help="episodes per game (8)")
    p.add_argument("--budget", type=int, default=96, help="max_new_tokens of an episode (96)")
    p.add_argument("--turns", type=int, default=6, help="max_turns (6)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    p.add_argument(
        "--max-turn-tokens",
        type=int,
        default=None,
        help="the most tokens of one policy turn; a longer turn truncates the episode (none)",
    )


def guess_number_env(policy: Any, args: Any, autoreset: bool = False) -> Any:
    """The training ``lmgym/GuessNumber-v0`` vector env for ``policy`` under
    ``add_guess_number_options``' ``args`` (the unwrapped ``TokenVectorEnv``);
    ``autoreset``: continuous batching."""
    import gymnasium as gym

    import lmgym  # noqa: F401  (registers the tasks)

    return gym.make_vec(
        "lmgym/GuessNumber-v0",
        num_envs=args.prompts * args.group,
        group_size=args.group,
        tokenizer=policy.tokenizer,
        max_new_tokens=args.budget,
        max_turns=args.turns,
        max_turn_tokens=args.max_turn_tokens,
        stop_token_ids=policy.stop_token_ids,
        autoreset=autoreset,
    ).unwrapped
