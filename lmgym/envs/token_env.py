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

Special tokens. Ordinary tokens and the stop ids are the legal actions; any other
special token (``<pad>``, ``<unk>``, ...) is refused with an error unless listed in
``allowed_special_tokens`` (or ``"all"``). The env holds these rules as one record,
``token_rules``, and a ``CausalLMPolicy`` samples by it (``check_env`` hands it
over). A string reward reads ``RewardInput.completions``, the text of exactly the
actions taken: every real token decoded, allowed special tokens included
(``'<pad>'``), only a final special stop token (``<eos>``) left out
(``lmgym.envs.text``). So ``'<pad>cc<unk>cccc'`` cannot
pass for ``'cccccc'``.

Sharding (data parallelism, docs/distributed.md). ``shard=(rank, world_size)``
makes this env one rank's share of a global prompt stream: with the same seed on
every rank, the global stream is what one env with ``num_prompts * world_size``
prompts per reset would draw, and rank ``r`` takes groups ``[r * P, (r + 1) * P)``
of each global draw (``P = num_prompts``), in both reset modes. ``group_id`` is the
global group index, so ids are unique across ranks (``lmgym.envs.stream``).

Multi-turn episodes (docs/env.md). Built with a
``responder`` (``lmgym.envs.turns``), the env alternates policy turns and the
environment's answers. The completion region ``[Lp, Lp + L)`` then holds policy
turn 1, observation 1, policy turn 2, ... back to back; ``max_new_tokens`` is the
budget of the whole region and ``info["length"]`` counts every token in it. A policy
turn ends at a stop id; the env then calls ``responder.respond`` once for all rows
that just ended a turn (once per row, concurrently, with ``responder_timeout``, for
a concurrent responder: ``lmgym.envs.turn_calls``) and, per row: ``done`` ->
``terminated`` (the responder's ``truncated`` -> ``truncated``); else the
observation, rendered to ids once (``lmgym.envs.turn_render``: a chat turn plus the
next assistant header for a chat prompt, the text as it is for a plain prompt, token
ids as given), is written right after the stop token and the row goes on. The
episode is ``truncated``, with nothing written, after ``max_turns`` policy turns,
when the remaining budget cannot hold the observation plus one policy token, or
when a policy turn reaches ``max_turn_tokens`` without a stop id. The
turn's reward is the reward of the step that ended the turn; a reward model, if
given too, scores the whole region (policy and environment tokens) once at the
episode's end (``reward_mode="bandit"`` only), added to that step's reward. The
observation gains ``policy_mask`` (``[N, Lp + L] bool``, True exactly on the tokens
the policy sampled), also in ``info`` with ``turn`` (``[N] int64``, policy turns
ended so far). Responder states come from ``start`` at every (re)fill and from
``respond``, and are committed with the rest of the step (see Failures). With
``responder_park_after`` (autoreset, a concurrent responder) ``step`` does not wait
for a slow call: the row is parked (``info["waiting"]``; its actions are ignored)
until a later step finds its answer (``lmgym.envs.turn_park``); ``info["episode"]``
then names each row's episode (its prompt-stream slot).

Rendering. ``render_mode="ansi"``: ``render()`` returns each row's current text,
prompt and completion so far (Gymnasium's vector render API: one frame per row).

Failures. ``step`` and ``reset`` build every new value (row buffers, prompt stream,
potentials, responder states) with one reward-model call (and one call of each
responder method they need) and commit them together only after it succeeded: after
a ``RewardError`` or ``ResponderError`` the env is exactly as it was, in every mode,
and the same call can be retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.envs.action_space import TokenActionSpace
from lmgym.envs.options import TURN_OPTIONS, EnvOptions
from lmgym.envs.prompts import RowColumns, build_prompt_table
from lmgym.envs.rewards import call_reward
from lmgym.envs.stream import PromptStream
from lmgym.envs.text import completion_texts, infer_completion_mask
from lmgym.envs.turn_calls import PendingCall
from lmgym.envs.turn_park import ParkedTurns
from lmgym.envs.turn_step import TurnStepper
from lmgym.envs.turns import Responder
from lmgym.profiling import ENV_RESET, ENV_STEP, REWARD, labelled, phase
from lmgym.special_tokens import TokenRules, special_token_ids, token_names
from lmgym.types import PromptSource, RewardInput, RewardModel


class _Option:
    """A ``TokenVectorEnv`` attribute read from its options record: ``env.reward_mode``
    is ``env.options.reward_mode``, so the env holds no second copy to drift.

    A ``live`` option, one the env reads as it steps, may be set (the record is
    replaced, so the value is checked); the others sized the env when it was built.
    """

    def __init__(self, live: bool = False) -> None:
        self.live = live

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, env: TokenVectorEnv | None, owner: type | None = None) -> Any:
        return self if env is None else getattr(env.options, self.name)

    def __set__(self, env: TokenVectorEnv, value: Any) -> None:
        if not self.live:
            raise AttributeError(
                f"{self.name}: the env was built with it; build a new env to change it"
            )
        env.options = replace(env.options, **{self.name: value})


class _Rows(NamedTuple):
    """The env's per-row state. ``step`` and ``reset`` build a new one and commit it
    only once everything (the reward model included) has succeeded.

    Attributes: ``[N, Lp + L]`` ``ids`` (int64), ``mask`` and ``policy`` (bool: the
    tokens the policy sampled); ``[N]`` ``length``, ``group_ids``, ``prompt_index``,
    ``prompt_length``, ``turn`` (policy turns ended), ``turn_start`` (where the
    current policy turn starts in the completion region) and ``episode`` (the
    episode's prompt-stream slot, ``group_id * group_size + j``: the same episode
    whichever row runs it) (int64), ``done``, ``terminated``, ``truncated``,
    ``needs_reset``, ``valid``, ``waiting`` (parked: its responder call is in
    flight, ``lmgym.envs.turn_park``) (bool), ``returns`` (the episode's reward so
    far) and ``potential`` (float32).
    """

    ids: Tensor
    mask: Tensor
    length: Tensor
    done: Tensor
    terminated: Tensor
    truncated: Tensor
    needs_reset: Tensor
    valid: Tensor
    returns: Tensor
    potential: Tensor
    group_ids: Tensor
    prompt_index: Tensor
    prompt_length: Tensor
    policy: Tensor
    turn: Tensor
    turn_start: Tensor
    waiting: Tensor
    episode: Tensor

    @classmethod
    def empty(cls, n: int, width: int, pad_token_id: int, device: torch.device) -> _Rows:
        ids = torch.full((n, width), pad_token_id, dtype=torch.long, device=device)
        false = torch.zeros(n, dtype=torch.bool, device=device)
        zero = torch.zeros(n, dtype=torch.long, device=device)
        zeros = torch.zeros(n, device=device)
        no = torch.zeros_like(ids, dtype=torch.bool)
        return cls(
            ids, no, zero, false, false, false, false,
            ~false, zeros, zeros, zero, zero, zero, no, zero, zero, false, zero,
        )  # fmt: skip

    def put(self, rows: Tensor, **values: Tensor) -> _Rows:
        """A copy with ``values[name]`` written at ``rows`` (``[k] int64``) of each field."""
        return self._replace(
            **{name: getattr(self, name).index_put((rows,), v) for name, v in values.items()}
        )


class TokenVectorEnv(VectorEnv):
    """Batched token-level text-generation env; state lives in torch tensors on ``device``.

    Its options are one ``EnvOptions`` record (``lmgym.envs.options``, where each
    option's default and check is written), kept as ``env.options`` and readable as
    attributes (``env.group_size``, ``env.reward_mode``, ...). Pass the record, its
    fields as keywords, or both (keywords override the record's)::

        TokenVectorEnv(tokenizer, prompts, reward, num_prompts=2, group_size=4)
        TokenVectorEnv(tokenizer, prompts, reward, EnvOptions(num_envs=8, group_size=4))

    Args:
        tokenizer: Tokenises prompts and decodes completions for reward functions.
            Its ``len()`` is the vocabulary (the action space).
        prompts: A ``PromptSource``: any indexable of prompts, each a string or a
            list of chat messages (``lmgym.envs.prompts``); its ``columns``, if any,
            reach the reward model (``RewardInput.columns``).
        reward: A ``RewardModel``: ``RewardInput -> [N]`` floats. With a
            ``responder`` it may be ``None`` (the turn rewards are the only rewards);
            if given, it scores each episode's whole completion region once, at the
            episode's end, added to the last step's reward.
        options: The env options; default ``EnvOptions()``. Its ``tokenizer``, if
            set, must be ``tokenizer``.
        **keywords: ``EnvOptions`` fields, or ``num_prompts`` (``P``, prompts drawn per
            reset: ``num_envs = P * group_size``). ``max_new_tokens`` left ``None``
            is ``DEFAULT_MAX_NEW_TOKENS``; ``stop_token_ids`` left ``None`` is the
            tokenizer's EOS. Special tokens other than the stop ids and
            ``allowed_special_tokens`` are refused as actions (a text that hides a
            chosen token lets a policy game a string reward); ``refused_token_ids``
            and ``legal_token_ids`` list the outcome, and the action space leaves
            refused ids out (``TokenActionSpace``).
        responder: A ``Responder`` (``lmgym.envs.turns``) makes the env multi-turn
            (see the module doc); ``None``: single-turn.

    Attributes:
        token_rules: The stop ids and the allowed and refused special ids
            (``lmgym.special_tokens.TokenRules``), built here once from the options;
            ``CausalLMPolicy.check_env`` hands them to the policy, which samples by them.
        stop_token_ids: ``[S] int64`` on ``device``, the ids that end an episode
            (a policy turn, in a multi-turn env): ``token_rules.stop_ids``.
        responder: The env's responder, or ``None``.
    """

    metadata: dict[str, Any] = {
        "autoreset_mode": AutoresetMode.DISABLED,
        "render_modes": ["ansi"],
        "render_fps": 4,
    }

    # The options, read from ``self.options`` (see ``EnvOptions`` for each); the live
    # ones, read as the env steps, may be set (SB3's ``set_attr``).
    num_envs = _Option()
    num_prompts = _Option()
    group_size = _Option()
    max_new_tokens = _Option()
    reward_mode = _Option(live=True)
    per_token_form = _Option(live=True)
    center_potential = _Option(live=True)
    unfinished = _Option(live=True)
    unfinished_penalty = _Option(live=True)
    allowed_special_tokens = _Option()
    autoreset = _Option()
    prompt_order = _Option(live=True)
    shard = _Option()
    render_mode = _Option(live=True)
    tokenizer = _Option()
    device = _Option()
    max_turns = _Option()
    max_turn_tokens = _Option()
    responder_timeout = _Option()
    on_responder_timeout = _Option()
    responder_park_after = _Option()

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompts: PromptSource,
        reward: RewardModel | None,
        options: EnvOptions | None = None,
        *,
        responder: Responder | None = None,
        **keywords: Any,
    ) -> None:
        if not callable(reward) and not (reward is None and responder is not None):
            raise TypeError(
                f"reward: expected a RewardModel (a callable RewardInput -> floats), "
                f"got {type(reward).__name__}; wrap a plain function with FunctionReward"
                + ("" if responder is None else " (or pass None: the turn rewards only)")
            )
        self.options = (options or EnvOptions()).for_env(tokenizer, keywords)
        self.responder = responder
        self._check_turn_options()
        self.prompt_source = prompts
        self.reward_model = reward
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": AutoresetMode.NEXT_STEP if self.autoreset else AutoresetMode.DISABLED,
        }

        self.vocab_size = len(tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.token_rules = TokenRules.build(
            tokenizer, self.options.stop_token_ids, self.allowed_special_tokens
        )
        stop = torch.tensor(self.token_rules.stop_ids, dtype=torch.long)
        self.stop_token_ids = stop.to(self.device)
        special = special_token_ids(tokenizer)
        # A final stop id that is a special token ends the text instead of being in it.
        self._hidden_stop_ids = stop[torch.isin(stop, torch.tensor(special, dtype=torch.long))]
        self.refused_token_ids = list(self.token_rules.refused_ids)
        refused = torch.zeros(self.vocab_size, dtype=torch.bool)
        refused[self.refused_token_ids] = True
        self.legal_token_ids = (~refused).nonzero().squeeze(1)
        # _illegal[a + 1] for a clamped to [-1, V]: True below 0, at V and on refused ids,
        # so one lookup checks range and special tokens at once.
        true = torch.ones(1, dtype=torch.bool)
        self._illegal = torch.cat([true, refused, true]).to(self.device)

        self.prompt_table = build_prompt_table(
            prompts, tokenizer, self.options.max_prompt_length, self.device
        )
        missing = [
            c for c in getattr(reward, "required_columns", ()) if c not in self.prompt_table.columns
        ]
        if missing:
            raise ValueError(
                f"reward: {getattr(reward, 'name', type(reward).__name__)!r} needs the "
                f"column(s) {missing}, which the prompt source does not have (its columns: "
                f"{sorted(self.prompt_table.columns)}); give every prompt those fields, e.g. "
                'a JSONL line {"prompt": ..., "answer": ...} read with JsonlPrompts'
            )
        self.prompt_width = self.prompt_table.width
        self.seq_len = self.prompt_width + self.max_new_tokens

        observation = {
            "input_ids": spaces.MultiDiscrete(np.full((self.seq_len,), self.vocab_size)),
            "attention_mask": spaces.MultiBinary(self.seq_len),
        }
        self._turns: TurnStepper | None = None
        if responder is not None:
            observation["policy_mask"] = spaces.MultiBinary(self.seq_len)
            self._turns = TurnStepper(
                responder,
                tokenizer,
                self.prompt_table,
                max_turns=self.max_turns,
                max_new_tokens=self.max_new_tokens,
                prompt_width=self.prompt_width,
                pad_token_id=self.pad_token_id,
                hidden_stop_ids=self._hidden_stop_ids.to(self.device),
                max_turn_tokens=self.max_turn_tokens,
                responder_timeout=self.responder_timeout,
                on_responder_timeout=self.on_responder_timeout,
            )
        self._parking = self._parked_turns()
        self.single_observation_space = spaces.Dict(observation)
        self.single_action_space = TokenActionSpace(self.vocab_size, self.refused_token_ids)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        self._stream = self._new_stream(int(torch.randint(0, 2**62, (1,)).item()))
        self._rows: _Rows | None = None
        # The responder's state of each row's episode (multi-turn only), committed with _rows.
        self._turn_states: tuple[Any, ...] = ()
        # The responder calls of the parked rows, by row (parking only), committed with _rows.
        self._calls: dict[int, PendingCall] = {}
        self._columns = torch.arange(self.seq_len, device=self.device)

    def _parked_turns(self) -> ParkedTurns | None:
        """The parking step of ``responder_park_after`` (``None`` when unset), after
        checking the env can park: autoreset, a concurrent responder."""
        if self.responder_park_after is None or self._turns is None:
            return None
        if not self.autoreset:
            raise ValueError(
                f"responder_park_after={self.responder_park_after}: an episode-synchronous "
                "env (autoreset=False) waits for every responder call; parking rows needs "
                "autoreset=True (continuous batching, ContinuousCollector)"
            )
        if not self._turns.caller.concurrent:
            raise ValueError(
                f"responder_park_after={self.responder_park_after}: responder "
                f"{self._turns.name!r} is called once per step on the env's thread, so a "
                "step cannot go on without it; make its respond 'async def' or set "
                "thread_safe = True on it, or leave responder_park_after None"
            )
        return ParkedTurns(self._turns, self.responder_park_after)

    def _check_turn_options(self) -> None:
        if self.responder is None:
            for name, unset in TURN_OPTIONS.items():
                if getattr(self.options, name) != unset:
                    raise ValueError(
                        f"{name}={getattr(self.options, name)}: only a multi-turn env has "
                        f"turns; pass a responder, or leave {name} {unset}"
                    )
            return
        if self.reward_mode != "bandit":
            raise ValueError(
                f"reward_mode={self.reward_mode!r}: a multi-turn env rewards each turn "
                "(the responder) and scores the whole episode once with the reward model, "
                "if any; use reward_mode='bandit'"
            )

    @property
    def _centred(self) -> bool:
        """Whether a row's potential starts at ``R(x, empty)`` (see the module docstring)."""
        return (
            self.reward_mode == "per_token"
            and self.per_token_form == "potential"
            and self.center_potential
        )

    @property
    def _started(self) -> bool:
        return self._rows is not None

    # ----------------------------------------------------------------- prompts
    def get_state(self) -> dict[str, Any]:
        """The prompt stream's state, for checkpoints: ``set_state`` makes the env draw
        the same prompts and group ids from here on.

        Covers the stream's RNG, the current pass order and cursor, the slot and group
        counters, and the shard (a state restores only into the same shard). Rows in flight are not part of it: an episode-synchronous
        rollout resets every row anyway; an autoreset env restored with ``set_state``
        starts fresh rows on its next ``reset()``.

        Returns:
            A dict of CPU tensors and ints (``torch.save``-able).
        """
        stream = self._stream
        return {
            "rng": stream.rng_state.clone(),
            "order": stream.order.clone(),
            "cursor": stream.cursor,
            "next_slot": stream.next_slot,
            "group_prompt": stream.group_prompt.clone(),
            "group_base": stream.group_base,
            "num_source_prompts": len(self.prompt_table),
            "group_size": self.group_size,
            "num_prompts": self.num_prompts,
            "shard": self.shard,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a prompt stream saved with ``get_state``.

        Raises:
            ValueError: the state comes from an env over a different number of prompts,
                with a different ``group_size``, or from another shard (another rank,
                world size or, when sharded, ``num_prompts``): its indices would be
                wrong here.
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
        saved_shard = tuple(int(x) for x in state.get("shard", (0, 1)))
        if saved_shard != self.shard:
            raise ValueError(
                f"set_state: the saved prompt stream is shard (rank, world_size)="
                f"{saved_shard}, this env is {self.shard}; restore each rank's state into "
                "the env of the same rank and world size (resuming on another world size "
                "is not supported)"
            )
        if self.shard[1] > 1 and state.get("num_prompts") != self.num_prompts:
            raise ValueError(
                f"set_state: the saved sharded prompt stream has num_prompts="
                f"{state.get('num_prompts')}, this env has {self.num_prompts}; build the env "
                "with the same num_prompts"
            )
        self._stream = replace(
            self._stream,
            rng_state=state["rng"].cpu().clone(),
            order=state["order"].cpu().clone(),
            cursor=int(state["cursor"]),
            next_slot=int(state["next_slot"]),
            group_prompt=state["group_prompt"].cpu().clone(),
            group_base=int(state["group_base"]),
        )

    def _new_stream(self, seed: int) -> PromptStream:
        return PromptStream.start(
            len(self.prompt_table),
            self.group_size,
            self.prompt_order == "shuffle",
            seed,
            num_prompts=self.num_prompts,
            shard=self.shard,
        )

    def _refilled(
        self, state: _Rows, rows: Tensor, stream: PromptStream, turn_states: tuple[Any, ...]
    ) -> tuple[_Rows, PromptStream, tuple[Any, ...]]:
        """``state`` with a new episode on ``rows`` (``[k] int64`` on device), the
        stream after handing out their prompt slots, and the responder states with the
        new episodes' (multi-turn). Pure: nothing is committed.

        The new rows' potential is 0; the caller sets ``R(x, empty)`` when centring.
        """
        k = rows.numel()
        slots = stream.next_slot + torch.arange(k)
        group_ids, prompt_index, stream = stream.take(k)
        episode = (group_ids * self.group_size + slots % self.group_size).to(self.device)
        group_ids, prompt_index = group_ids.to(self.device), prompt_index.to(self.device)
        table = self.prompt_table
        completion_pad = torch.full(
            (k, self.max_new_tokens), self.pad_token_id, dtype=torch.long, device=self.device
        )
        false = torch.zeros(k, dtype=torch.bool, device=self.device)
        zeros = torch.zeros(k, device=self.device)
        state = state.put(
            rows,
            ids=torch.cat([table.ids[prompt_index], completion_pad], dim=1),
            mask=torch.cat(
                [table.mask[prompt_index], torch.zeros_like(completion_pad, dtype=torch.bool)],
                dim=1,
            ),
            length=torch.zeros(k, dtype=torch.long, device=self.device),
            done=false,
            terminated=false,
            truncated=false,
            needs_reset=false,
            valid=~false,
            returns=zeros,
            potential=zeros,
            group_ids=group_ids,
            prompt_index=prompt_index,
            prompt_length=table.lengths[prompt_index],
            policy=torch.zeros((k, self.seq_len), dtype=torch.bool, device=self.device),
            turn=torch.zeros(k, dtype=torch.long, device=self.device),
            turn_start=torch.zeros(k, dtype=torch.long, device=self.device),
            waiting=false,
            episode=episode,
        )
        if self._turns is not None:
            turn_states = self._turns.start(turn_states, rows, prompt_index)
        return state, stream, turn_states

    # ------------------------------------------------------------------- reset
    @labelled(ENV_RESET)
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Start new episodes.

        Args:
            seed: Reseeds the prompt stream; the same seed gives the same prompts,
                group ids and order (sharded envs: pass the same seed on every rank).
            options: ``{"reset_mask": [num_envs] bool}`` restarts only those rows
                (either autoreset mode); otherwise every row restarts.

        Returns:
            ``(obs, info)``; ``obs = {"input_ids": [N, Lp+L] int64,
            "attention_mask": [N, Lp+L] bool}``, ``info`` holds ``[N]`` tensors
            ``group_id``, ``prompt_index``, ``prompt_length``, ``length``, ``valid``.
            A multi-turn env adds ``policy_mask`` (``[N, Lp+L] bool``) to both and
            ``turn`` (``[N] int64``) to ``info``.

        Raises:
            RewardError: the reward model failed while scoring the new prompts (centred
                potential); the env, prompt stream included, is left as it was.
            ResponderError: the responder's ``start`` failed; likewise.
        """
        if seed is not None and not isinstance(seed, int | np.integer):
            raise TypeError(f"seed: expected one int for the whole batch, got {seed!r}")
        stream = self._stream if seed is None else self._new_stream(int(seed))
        reset_mask = (options or {}).get("reset_mask")
        turn_states = self._turn_states
        calls: dict[int, PendingCall] = {}  # a reset row's call is dropped (it runs on)
        if reset_mask is None or self._rows is None:
            state = _Rows.empty(self.num_envs, self.seq_len, self.pad_token_id, self.device)
            rows = torch.arange(self.num_envs, device=self.device)
            turn_states = (None,) * self.num_envs if self._turns is not None else ()
        else:
            mask = torch.as_tensor(reset_mask, dtype=torch.bool, device=self.device)
            if mask.shape != (self.num_envs,):
                raise ValueError(
                    f"options['reset_mask']: expected shape ({self.num_envs},), got {tuple(mask.shape)}"
                )
            state = self._rows
            rows = mask.nonzero().squeeze(1)
            calls = {row: call for row, call in self._calls.items() if not bool(mask[row])}
        if rows.numel() > 0:
            state, stream, turn_states = self._refilled(state, rows, stream, turn_states)
            if self._centred:
                finished = torch.zeros(rows.numel(), dtype=torch.bool, device=self.device)
                state = state.put(rows, potential=self._score(state, rows, finished))
        # Everything above only built new values: commit them together.
        self._rows, self._stream, self._turn_states = state, stream, turn_states
        self._calls = calls
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
            ValueError: wrong shape/dtype, an id outside ``[0, vocab_size)`` or a
                refused special token in a live row.
            RewardError: the reward model's output is unusable; the env state (prompt
                stream included) is left as it was before this call, so the same
                step can be retried.
            ResponderError: the responder failed or answered unusably (multi-turn);
                likewise.
        """
        if self._rows is None:
            raise RuntimeError("step() called before reset(); call env.reset(seed=...) first")
        actions = self._check_actions(actions)
        old = self._rows
        active = ~old.done & ~old.waiting  # a parked row writes nothing
        write = (self._columns[None, :] == (self.prompt_width + old.length)[:, None]) & active[
            :, None
        ]
        if len(self.stop_token_ids) == 1:  # the usual single EOS: == is cheaper than isin
            stop = active & (actions == self.stop_token_ids)
        else:
            stop = active & torch.isin(actions, self.stop_token_ids)
        length = old.length + active
        truncated = active & ~stop & (length >= self.max_new_tokens)
        state = old._replace(
            ids=torch.where(write, actions[:, None], old.ids),
            mask=old.mask | write,
            policy=old.policy | write,
            length=length,
        )
        # Next-step autoreset: rows that finished last step start their next episode.
        # They are not active, so appending did not touch them.
        stream, refill, turn_states = self._stream, None, self._turn_states
        if self.autoreset:
            refill = old.needs_reset
            rows = refill.nonzero().squeeze(1)
            if rows.numel() > 0:
                state, stream, turn_states = self._refilled(state, rows, stream, turn_states)
            else:
                refill = None
        turn_rewards, calls = None, self._calls
        if self._turns is not None:
            # A stop id ends the policy's turn; the responder says whether it ends the episode.
            if self._parking is None:
                turn = self._turns.respond(state, turn_states, stop)
            else:  # rows whose call is still running are parked
                turn, calls, waiting = self._parking.respond(state, turn_states, stop, calls)
                state = state._replace(waiting=waiting)
            state, turn_states = state._replace(**turn.changes), turn.states
            stop, truncated, turn_rewards = (
                turn.terminated,
                truncated | turn.truncated,
                turn.rewards,
            )
        finished = stop | truncated

        rewards, potential, valid = self._rewards(
            state, old, active, finished, truncated, refill, turn_rewards
        )

        if self.autoreset:
            flags = {"needs_reset": finished, "done": finished}
            terminated_out, truncated_out = stop, truncated
        else:
            terminated_out, truncated_out = old.terminated | stop, old.truncated | truncated
            flags = {
                "done": old.done | finished,
                "terminated": terminated_out,
                "truncated": truncated_out,
            }
        state = state._replace(
            potential=potential, valid=valid, returns=state.returns + rewards, **flags
        )
        # Nothing above wrote to the env: a failing reward model or responder left it intact.
        self._rows, self._stream, self._turn_states = state, stream, turn_states
        self._calls = calls
        return self._obs(), rewards, terminated_out, truncated_out, self._info()

    def _check_actions(self, actions: Tensor | np.ndarray | Sequence[int]) -> Tensor:
        if isinstance(actions, list | tuple) and any(
            isinstance(a, bool | float | np.bool_ | np.floating) for a in actions
        ):
            bad = next(a for a in actions if isinstance(a, bool | float | np.bool_ | np.floating))
            raise ValueError(
                f"actions: expected integer token ids, got {bad!r} ({type(bad).__name__}); "
                "pass ints (a float or bool is not a token id)"
            )
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"actions: expected shape ({self.num_envs},), one token id per env, "
                f"got {tuple(actions.shape)}"
            )
        if (
            actions.dtype.is_floating_point
            or actions.dtype.is_complex
            or actions.dtype == torch.bool
        ):
            raise ValueError(
                f"actions: expected integer token ids, got dtype {actions.dtype}; pass an "
                "integer tensor or array (a float or bool is not a token id)"
            )
        actions = actions.long()
        illegal = self._illegal[(actions + 1).clamp_(0, self.vocab_size + 1)]
        if not bool(illegal.any()):
            return actions  # the common case, checked with one read back
        # Only live rows' actions count: a finished or parked row ignores its action.
        live = ~self._rows.done & ~self._rows.waiting
        bad = live & ((actions < 0) | (actions >= self.vocab_size))
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"actions[{row}]={int(actions[row])} is outside the vocabulary [0, "
                f"{self.vocab_size}); sample only the first vocab_size={self.vocab_size} ids "
                "(mask the extra rows of a model whose embedding is larger than its tokenizer)"
            )
        bad = live & illegal
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            (name,) = token_names(self.tokenizer, [int(actions[row])])
            raise ValueError(
                f"actions[{row}]={int(actions[row])} is the special token {name}, which "
                "this env refuses: only its stop token(s) are legal special tokens by "
                "default, so that a string reward never misses a token the policy chose. "
                "Pass allowed_special_tokens=[...] (or 'all') to the env to make it a "
                "legal action (its text, e.g. '<pad>', is then part of the completion "
                "the reward sees), or keep the policy from choosing it (CausalLMPolicy "
                "masks special tokens by default; SB3VecEnv maps its actions to "
                "env.legal_token_ids)"
            )
        return actions

    # ----------------------------------------------------------------- rewards
    def _score(self, state: _Rows, rows: Tensor, finished: Tensor) -> Tensor:
        """Run the reward model on ``rows`` of ``state``'s buffer: ``[k] float32``.

        ``finished`` (``[k] bool``) tells the reward model which rows have ended.
        """
        lp = self.prompt_width
        prompt_index = state.prompt_index[rows]
        table = self.prompt_table
        index = prompt_index.tolist()
        completion_ids, completion_mask = state.ids[rows, lp:], state.mask[rows, lp:]
        batch = RewardInput(
            prompt_ids=state.ids[rows, :lp],
            prompt_mask=state.mask[rows, :lp],
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            prompts=[table.prompts[i] for i in index],
            prompt_index=prompt_index,
            finished=finished,
            decode=lambda ids: completion_texts(
                self.tokenizer, ids, completion_mask, self._hidden_stop_ids
            ),
            columns=RowColumns(table.columns, index) if table.columns else None,
            prompt_texts=[table.texts[i] for i in index],
        )
        with phase(REWARD):
            return call_reward(self.reward_model, batch)

    def _rewards(
        self,
        state: _Rows,
        old: _Rows,
        active: Tensor,
        finished: Tensor,
        truncated: Tensor,
        refill: Tensor | None,
        turn_rewards: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rewards of this step, the new potentials and the new validity flags (all ``[N]``).

        One reward-model call scores every row that needs it: the rows this step
        scores and, when centring the potential, the rows just refilled (their new
        prompt with an empty completion, ``finished`` False).

        Args:
            state: The rows after this step's tokens and refills.
            old: The rows before this step.
            active: ``[N] bool`` rows that appended a token this step.
            finished: ``[N] bool`` rows whose episode ended this step.
            truncated: ``[N] bool`` rows cut at the budget this step.
            refill: ``[N] bool`` rows refilled this step (autoreset), or ``None``.
            turn_rewards: ``[N] float32`` the responder's rewards for turns ended this
                step (multi-turn), added to the reward model's; ``None`` otherwise.
        """
        if self.reward_mode == "bandit":
            # A cut-off completion under "penalty" is never shown to the reward model.
            to_score = finished & ~truncated if self.unfinished == "penalty" else finished
        else:
            to_score = active
        centre = refill if self._centred else None
        called = to_score if centre is None else to_score | centre
        rows = called.nonzero().squeeze(1)
        scores = torch.zeros(self.num_envs, device=self.device)
        if rows.numel() > 0 and self.reward_model is not None:
            scores = scores.index_put((rows,), self._score(state, rows, finished[rows]))
        potential = state.potential  # refilled rows: 0
        if self.reward_mode == "bandit" or self.per_token_form == "dense":
            rewards = scores  # only the potential form centres, so the call was to_score
        else:
            rewards = torch.where(active, scores - old.potential, 0.0)
            potential = torch.where(active, scores, potential)
            if centre is not None:
                potential = torch.where(centre, scores, potential)
        if turn_rewards is not None:
            rewards = rewards + turn_rewards
        if self.unfinished == "penalty":
            # The episode return of a cut-off completion is exactly the penalty.
            rewards = torch.where(truncated, self.unfinished_penalty - old.returns, rewards)
        valid = state.valid & ~truncated if self.unfinished == "mask" else state.valid
        return rewards, potential, valid

    # ------------------------------------------------------------------ views
    def _obs(self) -> dict[str, Tensor]:
        rows = self._rows
        if self._turns is None:
            return {"input_ids": rows.ids, "attention_mask": rows.mask}
        return {"input_ids": rows.ids, "attention_mask": rows.mask, "policy_mask": rows.policy}

    def _info(self) -> dict[str, Tensor]:
        rows = self._rows
        info = {
            "group_id": rows.group_ids,
            "prompt_index": rows.prompt_index,
            "prompt_length": rows.prompt_length,
            "length": rows.length,
            "valid": rows.valid,
        }
        if self._turns is not None:
            info["policy_mask"] = rows.policy
            info["turn"] = rows.turn
        if self._parking is not None:
            info["waiting"] = rows.waiting
            info["episode"] = rows.episode
        return info

    def decode_completions(
        self, completion_ids: Tensor, completion_mask: Tensor | None = None
    ) -> list[str]:
        """The text of ``[B, L]`` completions, as string rewards see it.

        Every real token is decoded, special tokens included; a final stop token
        that is a special token (``<eos>``) is left out (``lmgym.envs.text``).

        Args:
            completion_ids: ``[B, L] int64`` (e.g. ``RolloutBatch.completion_ids``).
            completion_mask: ``[B, L] bool`` real tokens (``RolloutBatch.completion_mask``);
                default inferred: up to the first stop id, else up to the last non-pad id.
        """
        if completion_mask is None:
            completion_mask = infer_completion_mask(
                completion_ids, self.stop_token_ids, self.pad_token_id
            )
        return completion_texts(
            self.tokenizer, completion_ids, completion_mask.bool(), self._hidden_stop_ids
        )

    def render(self) -> tuple[str, ...] | None:
        """Each row's current text, prompt and completion so far (``render_mode="ansi"``).

        The prompt is its text (a chat prompt as rendered by the chat template), the
        completion as string rewards see it (``decode_completions``).

        Returns:
            ``num_envs`` strings, or ``None`` (with Gymnasium's warning) when the env
            was built without a render mode.
        """
        if self.render_mode is None:
            gym.logger.warn(
                "render() called without a render mode; build the env with "
                'render_mode="ansi", e.g. gym.make_vec(id, render_mode="ansi")'
            )
            return None
        if self._rows is None:
            raise RuntimeError("render() called before reset(); call env.reset(seed=...) first")
        lp = self.prompt_width
        texts = self.prompt_table.texts
        completions = self.decode_completions(self._rows.ids[:, lp:], self._rows.mask[:, lp:])
        return tuple(
            texts[i] + completion
            for i, completion in zip(self._rows.prompt_index.tolist(), completions, strict=True)
        )
