"""Text generation as a token-level MDP: a native, batched Gymnasium ``VectorEnv``.

State = prompt plus the tokens so far; action = next token id; an episode ends at
a stop id (``terminated``) or after ``max_new_tokens`` (``truncated``). The reward
model runs inside ``step``.

Buffer layout. Row ``i`` of the observation is a fixed-width ``[Lp + L]`` buffer:
columns ``[0, Lp)`` hold the prompt, left-padded; columns ``[Lp, Lp + L)`` the
completion, right-padded. ``attention_mask`` marks real tokens. The observation is
the whole text, so the env is Markov; a policy's KV cache is only an optimisation.

Groups. ``reset`` draws ``num_prompts`` prompts and repeats each ``group_size``
times (``num_envs = num_prompts * group_size``). Every drawn prompt instance gets a
fresh ``group_id`` from a counter; groups are never inferred from prompt text, so
two draws of the same prompt are two groups.

Reset semantics (``metadata["autoreset_mode"]``):

- ``autoreset=False`` -> ``AutoresetMode.DISABLED``: episode-synchronous batches,
  the usual LM rollout. A finished row ignores its actions, stays padded, returns
  reward 0, and keeps reporting ``terminated``/``truncated`` (the flags are
  sticky) until ``reset()`` starts a new batch, or
  ``reset(options={"reset_mask": mask})`` restarts only the masked rows.
- ``autoreset=True`` -> ``AutoresetMode.NEXT_STEP`` (continuous batching): the
  step after a row finishes, that row's action is ignored and it is refilled with
  the next prompt slot while the other rows go on. Prompt slots are handed out in
  order, ``group_size`` per prompt, so every group still gets exactly
  ``group_size`` completions, possibly spread over several refills. The flags are
  True only on the step an episode ends.

In both modes ``reset(options={"reset_mask": mask})`` restarts exactly the masked
rows at once (the SB3 adapter uses it to give SB3 its same-step autoreset).

Rewards (docs/algorithms.md#rewards):

- ``reward_mode="bandit"``: the reward model scores each completion once, at its
  last step; every other step's reward is 0.
- ``reward_mode="per_token"``: a reward every step. ``per_token_form="potential"``
  calls the (sequence) reward model on every prefix and returns
  ``r_t = R(x, y_<=t) - R(x, y_<t)``, so rewards telescope to
  ``R(x, y) - Phi_0`` with ``Phi_0 = 0`` (the sum equals the bandit score) or, with
  ``center_potential=True``, ``Phi_0 = R(x, empty)``. ``per_token_form="dense"``
  takes the reward model's output on each prefix as ``r_t`` directly.
- ``unfinished`` (a completion cut at ``max_new_tokens`` without a stop id):
  ``"score"`` (default; the reward model scores the cut-off text as it is, like
  TRL's default), ``"penalty"`` (the episode return is exactly
  ``unfinished_penalty``), or ``"mask"`` (scored, but ``info["valid"]`` and
  ``RolloutBatch.valid`` are False so agents drop the row from the loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.envs.prompts import build_prompt_table
from lmgym.envs.rewards import call_reward
from lmgym.profiling import ENV_RESET, ENV_STEP, REWARD, labelled, phase
from lmgym.types import PromptSource, RewardInput, RewardModel

RewardMode = Literal["bandit", "per_token"]
PerTokenForm = Literal["potential", "dense"]
Unfinished = Literal["score", "penalty", "mask"]
PromptOrder = Literal["shuffle", "sequential"]


def _check_choice(field: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{field}={value!r} is not one of {list(choices)}")


class TokenVectorEnv(VectorEnv):
    """Batched token-level text-generation env; state lives in torch tensors on ``device``.

    Args:
        tokenizer: Tokenises prompts and decodes completions for reward functions.
            Its ``len()`` is the vocabulary (the action space).
        prompts: A ``PromptSource`` (any indexable of strings, e.g. a list).
        reward: A ``RewardModel``: ``RewardInput -> [N]`` floats.
        num_prompts: ``P``, prompts drawn per reset.
        group_size: ``G``, completions per prompt (``num_envs = P * G``).
        max_new_tokens: ``L``, the token budget of a completion.
        max_prompt_length: Width of the prompt region; default the longest prompt.
        reward_mode: ``"bandit"`` or ``"per_token"``.
        per_token_form: ``"potential"`` or ``"dense"`` (per-token mode only).
        center_potential: Potential form only: subtract ``R(x, empty)`` (see module doc).
        unfinished: ``"score"``, ``"penalty"`` or ``"mask"``.
        unfinished_penalty: Episode return of a cut-off completion under ``"penalty"``.
        stop_token_ids: Ids that end an episode; default the tokenizer's EOS id.
        autoreset: ``False`` episode-synchronous, ``True`` next-step autoreset.
        prompt_order: ``"shuffle"`` (a fresh permutation per pass over the prompts,
            reproducible under ``reset(seed=...)``) or ``"sequential"``.
        device: Where the state tensors live.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED, "render_modes": []}

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompts: PromptSource,
        reward: RewardModel,
        *,
        num_prompts: int = 1,
        group_size: int = 1,
        max_new_tokens: int = 32,
        max_prompt_length: int | None = None,
        reward_mode: RewardMode = "bandit",
        per_token_form: PerTokenForm = "potential",
        center_potential: bool = False,
        unfinished: Unfinished = "score",
        unfinished_penalty: float = -1.0,
        stop_token_ids: Sequence[int] | None = None,
        autoreset: bool = False,
        prompt_order: PromptOrder = "shuffle",
        device: torch.device | str = "cpu",
    ) -> None:
        _check_choice("reward_mode", reward_mode, ("bandit", "per_token"))
        _check_choice("per_token_form", per_token_form, ("potential", "dense"))
        _check_choice("unfinished", unfinished, ("score", "penalty", "mask"))
        _check_choice("prompt_order", prompt_order, ("shuffle", "sequential"))
        for field, value in (("num_prompts", num_prompts), ("group_size", group_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}={value!r}: must be a positive integer")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be a positive integer")
        if not callable(reward):
            raise TypeError(
                f"reward: expected a RewardModel (a callable RewardInput -> floats), "
                f"got {type(reward).__name__}; wrap a plain function with FunctionReward"
            )
        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.reward_model = reward
        self.num_prompts, self.group_size = num_prompts, group_size
        self.num_envs = num_prompts * group_size
        self.max_new_tokens = max_new_tokens
        self.reward_mode, self.per_token_form = reward_mode, per_token_form
        self.center_potential = center_potential
        self.unfinished, self.unfinished_penalty = unfinished, float(unfinished_penalty)
        self.autoreset = autoreset
        self.prompt_order = prompt_order
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": AutoresetMode.NEXT_STEP if autoreset else AutoresetMode.DISABLED,
        }

        self.vocab_size = len(tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if stop_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    "stop_token_ids: the tokenizer has no eos_token_id; pass stop_token_ids"
                )
            stop_token_ids = [tokenizer.eos_token_id]
        stop = torch.as_tensor(list(stop_token_ids), dtype=torch.long)
        if stop.numel() == 0 or bool(((stop < 0) | (stop >= self.vocab_size)).any()):
            raise ValueError(
                f"stop_token_ids={stop.tolist()}: need at least one id, each in "
                f"[0, {self.vocab_size})"
            )
        self.stop_token_ids = stop.to(self.device)

        self.prompt_table = build_prompt_table(prompts, tokenizer, max_prompt_length, self.device)
        self.prompt_width = self.prompt_table.width
        self.seq_len = self.prompt_width + max_new_tokens

        self.single_observation_space = spaces.Dict(
            {
                "input_ids": spaces.MultiDiscrete(np.full((self.seq_len,), self.vocab_size)),
                "attention_mask": spaces.MultiBinary(self.seq_len),
            }
        )
        self.single_action_space = spaces.Discrete(self.vocab_size)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        self._rng = torch.Generator()
        self._rng.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self._restart_stream()
        self._columns = torch.arange(self.seq_len, device=self.device)
        self._started = False

    # ----------------------------------------------------------------- prompts
    def _restart_stream(self) -> None:
        """Reset the prompt order, the slot counter and the group-id counter."""
        self._order = torch.empty(0, dtype=torch.long)
        self._cursor = 0
        self._next_slot = 0
        self._group_prompt = torch.empty(0, dtype=torch.long)  # prompt of group _group_base + k
        self._group_base = 0

    def get_state(self) -> dict[str, Any]:
        """The prompt stream's state, for checkpoints: ``set_state`` makes the env draw
        the same prompts and group ids from here on.

        Covers the stream's RNG, the current pass order and cursor, and the slot and
        group counters. Rows in flight are not part of it: an episode-synchronous
        rollout resets every row anyway; an autoreset env restored with ``set_state``
        starts fresh rows on its next ``reset()``.

        Returns:
            A dict of CPU tensors and ints (``torch.save``-able).
        """
        return {
            "rng": self._rng.get_state(),
            "order": self._order.clone(),
            "cursor": self._cursor,
            "next_slot": self._next_slot,
            "group_prompt": self._group_prompt.clone(),
            "group_base": self._group_base,
            "num_source_prompts": len(self.prompt_table),
            "group_size": self.group_size,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a prompt stream saved with ``get_state``.

        Raises:
            ValueError: the state comes from an env over a different number of prompts
                or with a different ``group_size`` (its indices would be wrong here).
        """
        for key, mine in (
            ("num_source_prompts", len(self.prompt_table)),
            ("group_size", self.group_size),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"set_state: the saved prompt stream has {key}={state[key]}, this env "
                    f"has {mine}; build the env with the same prompts and group_size"
                )
        self._rng.set_state(state["rng"].cpu())
        self._order = state["order"].cpu().clone()
        self._cursor = int(state["cursor"])
        self._next_slot = int(state["next_slot"])
        self._group_prompt = state["group_prompt"].cpu().clone()
        self._group_base = int(state["group_base"])

    def _draw_prompts(self, k: int) -> Tensor:
        """``[k]`` prompt indices, continuing the current pass over the source."""
        out = []
        n = len(self.prompt_table)
        while k > 0:
            if self._cursor == len(self._order):
                if self.prompt_order == "shuffle":
                    self._order = torch.randperm(n, generator=self._rng)
                else:
                    self._order = torch.arange(n)
                self._cursor = 0
            take = min(k, len(self._order) - self._cursor)
            out.append(self._order[self._cursor : self._cursor + take])
            self._cursor += take
            k -= take
        return torch.cat(out)

    def _take_slots(self, k: int) -> tuple[Tensor, Tensor]:
        """Hand out the next ``k`` prompt slots.

        Returns:
            ``(group_ids [k] int64, prompt_index [k] int64)`` on CPU.
        """
        slots = self._next_slot + torch.arange(k)
        self._next_slot += k
        group_ids = slots // self.group_size
        drawn = self._group_base + len(self._group_prompt)
        missing = int(group_ids[-1]) + 1 - drawn
        if missing > 0:
            self._group_prompt = torch.cat([self._group_prompt, self._draw_prompts(missing)])
        prompt_index = self._group_prompt[group_ids - self._group_base]
        # Forget groups no future slot can belong to.
        first_open = self._next_slot // self.group_size
        self._group_prompt = self._group_prompt[first_open - self._group_base :]
        self._group_base = first_open
        return group_ids, prompt_index

    def _fill_rows(self, rows: Tensor) -> None:
        """Start a new episode on ``rows`` (``[k] int64`` on device) with fresh prompt slots."""
        group_ids, prompt_index = self._take_slots(rows.numel())
        group_ids, prompt_index = group_ids.to(self.device), prompt_index.to(self.device)
        table = self.prompt_table
        k = rows.numel()
        completion_pad = torch.full(
            (k, self.max_new_tokens), self.pad_token_id, dtype=torch.long, device=self.device
        )
        new_ids = torch.cat([table.ids[prompt_index], completion_pad], dim=1)
        new_mask = torch.cat(
            [table.mask[prompt_index], torch.zeros_like(completion_pad, dtype=torch.bool)], dim=1
        )

        def put(t: Tensor, values: Tensor) -> Tensor:
            return t.index_put((rows,), values)

        self._ids = put(self._ids, new_ids)
        self._mask = put(self._mask, new_mask)
        self._length = put(self._length, torch.zeros(k, dtype=torch.long, device=self.device))
        false = torch.zeros(k, dtype=torch.bool, device=self.device)
        self._done = put(self._done, false)
        self._terminated = put(self._terminated, false)
        self._truncated = put(self._truncated, false)
        self._needs_reset = put(self._needs_reset, false)
        self._valid = put(self._valid, ~false)
        self._return = put(self._return, torch.zeros(k, device=self.device))
        self._group_ids = put(self._group_ids, group_ids)
        self._prompt_index = put(self._prompt_index, prompt_index)
        self._prompt_length = put(self._prompt_length, table.lengths[prompt_index])
        potential = torch.zeros(k, device=self.device)
        if (
            self.reward_mode == "per_token"
            and self.per_token_form == "potential"
            and self.center_potential
        ):
            potential = self._score(rows, self._ids, self._mask, self._done[rows])
        self._potential = put(self._potential, potential)

    # ------------------------------------------------------------------- reset
    @labelled(ENV_RESET)
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Start new episodes.

        Args:
            seed: Reseeds the prompt stream; the same seed gives the same prompts,
                group ids and order.
            options: ``{"reset_mask": [num_envs] bool}`` restarts only those rows
                (either autoreset mode); otherwise every row restarts.

        Returns:
            ``(obs, info)``; ``obs = {"input_ids": [N, Lp+L] int64,
            "attention_mask": [N, Lp+L] bool}``, ``info`` holds ``[N]`` tensors
            ``group_id``, ``prompt_index``, ``prompt_length``, ``length``, ``valid``.
        """
        if seed is not None:
            if not isinstance(seed, int | np.integer):
                raise TypeError(f"seed: expected one int for the whole batch, got {seed!r}")
            self._rng.manual_seed(int(seed))
            self._restart_stream()
        reset_mask = (options or {}).get("reset_mask")
        if reset_mask is None or not self._started:
            n, s, dev = self.num_envs, self.seq_len, self.device
            self._ids = torch.full((n, s), self.pad_token_id, dtype=torch.long, device=dev)
            self._mask = torch.zeros((n, s), dtype=torch.bool, device=dev)
            self._length = torch.zeros(n, dtype=torch.long, device=dev)
            self._done = torch.zeros(n, dtype=torch.bool, device=dev)
            self._terminated, self._truncated = self._done.clone(), self._done.clone()
            self._needs_reset, self._valid = self._done.clone(), ~self._done
            self._return = torch.zeros(n, device=dev)
            self._potential = torch.zeros(n, device=dev)
            self._group_ids = torch.zeros(n, dtype=torch.long, device=dev)
            self._prompt_index = torch.zeros(n, dtype=torch.long, device=dev)
            self._prompt_length = torch.zeros(n, dtype=torch.long, device=dev)
            rows = torch.arange(n, device=dev)
        else:
            mask = torch.as_tensor(reset_mask, dtype=torch.bool, device=self.device)
            if mask.shape != (self.num_envs,):
                raise ValueError(
                    f"options['reset_mask']: expected shape ({self.num_envs},), got {tuple(mask.shape)}"
                )
            rows = mask.nonzero().squeeze(1)
        if rows.numel() > 0:
            self._fill_rows(rows)
        self._started = True
        return self._obs(), self._info()

    # -------------------------------------------------------------------- step
    @labelled(ENV_STEP)
    def step(
        self, actions: Tensor | np.ndarray | Sequence[int]
    ) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """Append one token per row, score, and report the episode ends.

        Args:
            actions: ``[N]`` integer token ids. Ignored for rows whose episode is over
                (and for rows being autoreset this step).

        Returns:
            ``(obs, rewards [N] float32, terminated [N] bool, truncated [N] bool, info)``.

        Raises:
            ValueError: wrong shape/dtype, or an id outside ``[0, vocab_size)`` in a
                live row.
            RewardError: the reward model's output is unusable; the env state is
                left as it was before this call.
        """
        if not self._started:
            raise RuntimeError("step() called before reset(); call env.reset(seed=...) first")
        actions = self._check_actions(actions)
        active = ~self._done
        write = (self._columns[None, :] == (self.prompt_width + self._length)[:, None]) & active[
            :, None
        ]
        ids = torch.where(write, actions[:, None], self._ids)
        mask = self._mask | write
        length = self._length + active
        if len(self.stop_token_ids) == 1:  # the usual single EOS: == is cheaper than isin
            stop = active & (actions == self.stop_token_ids)
        else:
            stop = active & torch.isin(actions, self.stop_token_ids)
        truncated = active & ~stop & (length >= self.max_new_tokens)
        finished = stop | truncated

        rewards, potential, valid = self._rewards(ids, mask, active, finished, truncated)

        # Nothing above wrote to the env's state: a failing reward model leaves it intact.
        self._ids, self._mask, self._length = ids, mask, length
        self._potential, self._valid = potential, valid
        self._return = self._return + rewards
        if self.autoreset:
            rows = self._needs_reset.nonzero().squeeze(1)
            self._needs_reset = finished
            self._done = finished
            if rows.numel() > 0:
                self._fill_rows(rows)
            terminated_out, truncated_out = stop, truncated
        else:
            self._done = self._done | finished
            self._terminated = self._terminated | stop
            self._truncated = self._truncated | truncated
            terminated_out, truncated_out = self._terminated, self._truncated
        return self._obs(), rewards, terminated_out, truncated_out, self._info()

    def _check_actions(self, actions: Tensor | np.ndarray | Sequence[int]) -> Tensor:
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"actions: expected shape ({self.num_envs},), one token id per env, "
                f"got {tuple(actions.shape)}"
            )
        if actions.dtype.is_floating_point or actions.dtype == torch.bool:
            raise ValueError(f"actions: expected integer token ids, got dtype {actions.dtype}")
        actions = actions.long()
        low, high = torch.aminmax(actions)
        if int(low) >= 0 and int(high) < self.vocab_size:
            return actions  # the common case, checked in one pass
        bad = ~self._done & ((actions < 0) | (actions >= self.vocab_size))
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"actions[{row}]={int(actions[row])} is outside the vocabulary [0, "
                f"{self.vocab_size}); sample only the first vocab_size={self.vocab_size} ids "
                "(mask the extra rows of a model whose embedding is larger than its tokenizer)"
            )
        return actions

    # ----------------------------------------------------------------- rewards
    def _score(self, rows: Tensor, ids: Tensor, mask: Tensor, finished: Tensor) -> Tensor:
        """Run the reward model on ``rows`` of the given buffer: ``[k] float32``.

        ``finished`` (``[k] bool``) tells the reward model which rows have ended.
        """
        lp = self.prompt_width
        prompt_index = self._prompt_index[rows]
        texts = self.prompt_table.texts
        batch = RewardInput(
            prompt_ids=ids[rows, :lp],
            prompt_mask=mask[rows, :lp],
            completion_ids=ids[rows, lp:],
            completion_mask=mask[rows, lp:],
            prompts=[texts[i] for i in prompt_index.tolist()],
            prompt_index=prompt_index,
            finished=finished,
            decode=lambda t: self.tokenizer.batch_decode(t.tolist(), skip_special_tokens=True),
        )
        with phase(REWARD):
            return call_reward(self.reward_model, batch)

    def _rewards(
        self,
        ids: Tensor,
        mask: Tensor,
        active: Tensor,
        finished: Tensor,
        truncated: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rewards of this step, the new potentials and the new validity flags (all ``[N]``)."""
        rewards = torch.zeros(self.num_envs, device=self.device)
        potential = self._potential
        if self.reward_mode == "bandit":
            # A cut-off completion under "penalty" is never shown to the reward model.
            to_score = finished & ~truncated if self.unfinished == "penalty" else finished
            rows = to_score.nonzero().squeeze(1)
            if rows.numel() > 0:
                scores = self._score(rows, ids, mask, finished[rows])
                rewards = rewards.index_put((rows,), scores)
        else:
            rows = active.nonzero().squeeze(1)
            if rows.numel() > 0:
                scores = self._score(rows, ids, mask, finished[rows])
                if self.per_token_form == "potential":
                    step_rewards = scores - potential[rows]
                    potential = potential.index_put((rows,), scores)
                else:
                    step_rewards = scores
                rewards = rewards.index_put((rows,), step_rewards)
        if self.unfinished == "penalty":
            # The episode return of a cut-off completion is exactly the penalty.
            rewards = torch.where(truncated, self.unfinished_penalty - self._return, rewards)
        valid = self._valid & ~truncated if self.unfinished == "mask" else self._valid
        return rewards, potential, valid

    # ------------------------------------------------------------------ views
    def _obs(self) -> dict[str, Tensor]:
        return {"input_ids": self._ids, "attention_mask": self._mask}

    def _info(self) -> dict[str, Tensor]:
        return {
            "group_id": self._group_ids,
            "prompt_index": self._prompt_index,
            "prompt_length": self._prompt_length,
            "length": self._length,
            "valid": self._valid,
        }

    def decode_completions(self, completion_ids: Tensor) -> list[str]:
        """Decode ``[B, L]`` completion ids to strings (special tokens skipped)."""
        return self.tokenizer.batch_decode(completion_ids.tolist(), skip_special_tokens=True)
