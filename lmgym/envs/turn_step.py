"""The turn logic of a multi-turn ``TokenVectorEnv``: start episodes, answer ended turns.

``TokenVectorEnv`` keeps a ``TurnStepper`` when it is built with a responder
(``lmgym.envs.turns``). Each ``step``, once the policy's tokens are written, the
stepper takes the rows whose action was a stop id (a policy turn just ended), calls
the responder once for all of them, and returns the new buffer columns, responder
states, turn rewards and episode ends. Like the rest of ``step`` it is pure: it
builds new tensors and a new tuple of states and writes nothing, so the env commits
them together with everything else, or not at all.

Per ended row: the responder says ``done`` -> ``terminated`` (its ``truncated``
-> ``truncated``); otherwise its observation is rendered to ids once
(``lmgym.envs.turn_render``, tokenized no further than the row's remaining budget)
and written right after the stop token, unless the episode has had ``max_turns``
policy turns or the row's remaining budget cannot hold the observation plus one
more policy token: then it is ``truncated`` and nothing is written. A row whose
concurrent responder call ran past ``responder_timeout`` under
``on_responder_timeout="penalty"`` is ``truncated`` too, with no turn reward
(``lmgym.envs.turn_calls`` calls the responder).

A live row whose current policy turn reaches ``max_turn_tokens`` tokens without a
stop id is ``truncated`` there, as one that reaches the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.envs.prompts import PromptTable, RowColumns
from lmgym.envs.rewards import to_float
from lmgym.envs.text import completion_texts
from lmgym.envs.turn_calls import Answers, OnTimeout, ResponderCaller, call_failed
from lmgym.envs.turn_render import ObservationRenderer, pad_ids
from lmgym.envs.turns import (
    EpisodeStart,
    Responder,
    ResponderError,
    TurnInput,
    TurnOutput,
    responder_name,
)


class TurnStep(NamedTuple):
    """What answering the ended turns changes.

    Attributes:
        changes: new ``[N, S]`` ``ids``, ``mask`` and ``[N]`` ``length``, ``turn``,
            ``turn_start`` for the env's rows (``{}`` when no turn ended).
        states: the ``N`` responder states.
        rewards: ``[N] float32`` the turn rewards (0 where no turn ended).
        terminated: ``[N] bool`` the responder ended the episode.
        truncated: ``[N] bool`` cut at ``max_turns``, for want of budget, at
            ``max_turn_tokens``, by the responder (``TurnOutput.truncated``) or
            after a late call (``responder_timeout``).
    """

    changes: dict[str, Tensor]
    states: tuple[Any, ...]
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor


class TurnStepper:
    """Calls a responder for a ``TokenVectorEnv`` and appends its observations.

    Args:
        responder: The env's responder.
        tokenizer: The env's tokenizer.
        prompt_table: The env's prompt table (prompts and columns for the responder).
        max_turns: The most policy turns per episode, or ``None``.
        max_new_tokens: ``L``, the budget of the completion region.
        prompt_width: ``Lp``.
        pad_token_id: The env's pad id.
        hidden_stop_ids: ``[S] int64`` stop ids left out of a turn's text.
        max_turn_tokens: The most tokens of one policy turn, or ``None``.
        responder_timeout: Seconds per concurrent responder call, or ``None``.
        on_responder_timeout: ``"penalty"`` or ``"raise"`` (``lmgym.envs.turn_calls``).

    Raises:
        TypeError: ``responder`` is not a ``Responder``.
        ValueError: a bad role, or a timeout for a responder that is not concurrent.
    """

    def __init__(
        self,
        responder: Responder,
        tokenizer: PreTrainedTokenizerBase,
        prompt_table: PromptTable,
        *,
        max_turns: int | None,
        max_new_tokens: int,
        prompt_width: int,
        pad_token_id: int,
        hidden_stop_ids: Tensor,
        max_turn_tokens: int | None = None,
        responder_timeout: float | None = None,
        on_responder_timeout: OnTimeout = "penalty",
    ) -> None:
        if not isinstance(responder, Responder):
            raise TypeError(
                f"responder: expected a Responder (a role and the methods start and "
                f"respond, lmgym.envs.turns), got {type(responder).__name__}"
            )
        self.name = responder_name(responder)
        if responder.role not in ("user", "tool"):
            raise ValueError(
                f"responder {self.name!r}: role={responder.role!r}; use 'user' (a game, "
                "feedback) or 'tool' (a tool's result)"
            )
        self.responder = responder
        self.tokenizer = tokenizer
        self.table = prompt_table
        self.max_turns = max_turns
        self.budget = max_new_tokens
        self.prompt_width = prompt_width
        self.pad_token_id = pad_token_id
        self.hidden_stop_ids = hidden_stop_ids
        self.renderer = ObservationRenderer(tokenizer, responder.role, self.name)
        self.max_turn_tokens = max_turn_tokens
        self.caller = ResponderCaller(
            responder, self.name, timeout=responder_timeout, on_timeout=on_responder_timeout
        )

    def _columns(self, index: list[int]) -> Mapping[str, Sequence[Any]]:
        return RowColumns(self.table.columns, index) if self.table.columns else {}

    # ------------------------------------------------------------------ start
    def start(self, states: tuple[Any, ...], rows: Tensor, prompt_index: Tensor) -> tuple[Any, ...]:
        """``states`` with new episodes' states on ``rows`` (``[k] int64``), from
        ``responder.start``; ``prompt_index`` is ``[k] int64``, the rows' new prompts.

        Raises:
            ResponderError: ``start`` raised or gave other than ``k`` states.
        """
        index = prompt_index.tolist()
        episodes = EpisodeStart(
            prompts=[self.table.prompts[i] for i in index],
            prompt_index=prompt_index,
            columns=self._columns(index),  # type: ignore[arg-type]
        )
        row_list = rows.tolist()
        try:
            new = self.caller.start(episodes)
        except Exception as err:
            raise call_failed(self.name, "start", err, f"starting env rows {row_list}") from err
        if len(new) != len(row_list):
            raise ResponderError(
                f"responder {self.name!r}: start() gave {len(new)} states for "
                f"{len(row_list)} episodes (env rows {row_list}); return one per episode"
            )
        out = list(states)
        for r, s in zip(row_list, new, strict=True):
            out[r] = s
        return tuple(out)

    # ---------------------------------------------------------------- respond
    def respond(self, rows_state: Any, states: tuple[Any, ...], ended: Tensor) -> TurnStep:
        """Answer the rows whose policy turn just ended, waiting for every call.

        Args:
            rows_state: The env's rows after this step's tokens (``ids``, ``mask``,
                ``length``, ``turn``, ``turn_start``, ``prompt_index``, ``done``,
                ``waiting``).
            states: The ``N`` responder states before this step.
            ended: ``[N] bool`` rows whose action this step was a stop id.

        Raises:
            ResponderError: the responder raised or answered unusably (see
                ``lmgym.envs.turns.ResponderError``).
        """
        rows = ended.nonzero().squeeze(1)
        if rows.numel() == 0:
            return self.answered(rows_state, states, ended, rows, None)
        answers = self.caller.respond(self.turn_input(rows_state, states, rows), rows.tolist())
        return self.answered(rows_state, states, ended, rows, answers)

    def turn_input(self, rows_state: Any, states: tuple[Any, ...], rows: Tensor) -> TurnInput:
        """The ``TurnInput`` of ``rows`` (``[k] int64``), whose policy turn has ended:
        their last turn's ids and text, their prompts and states. A parked row's is
        the same on every step until it is answered (nothing of it changes)."""
        row_list = rows.tolist()
        turn_ids, turn_length = self._turn_ids(rows_state, rows)
        index = rows_state.prompt_index[rows].tolist()
        return TurnInput(
            rows=rows,
            prompts=[self.table.prompts[i] for i in index],
            prompt_index=rows_state.prompt_index[rows],
            columns=self._columns(index),  # type: ignore[arg-type]
            turn_texts=completion_texts(
                self.tokenizer,
                turn_ids,
                torch.arange(turn_ids.shape[1], device=rows.device) < turn_length[:, None],
                self.hidden_stop_ids,
            ),
            turn_ids=[turn_ids[j, :t] for j, t in enumerate(turn_length.tolist())],
            turn_index=rows_state.turn[rows] + 1,  # a new tensor: no aliasing of the env's
            states=[states[r] for r in row_list],
        )

    def answered(
        self,
        rows_state: Any,
        states: tuple[Any, ...],
        ended: Tensor,
        rows: Tensor,
        answers: Answers | None,
    ) -> TurnStep:
        """What ``answers`` to ``rows`` (``[k] int64``, whose turns ended this step or
        earlier: parked rows) change, and the live rows cut at ``max_turn_tokens``
        this step (``ended``, ``[N] bool``, the rows whose turn ended this step, are
        not). ``answers`` ``None``: no row is answered this step.

        Raises:
            ResponderError: an answer is unusable.
        """
        zeros = torch.zeros(ended.numel(), device=ended.device)
        false = torch.zeros_like(ended)
        capped = self._capped(rows_state, ended)
        if answers is None:
            return TurnStep({}, states, zeros, false, capped)
        row_list = rows.tolist()
        turn_ids, turn_length = self._turn_ids(rows_state, rows)
        turn_index = rows_state.turn[rows] + 1
        prompts = [self.table.prompts[i] for i in rows_state.prompt_index[rows].tolist()]
        answer = answers.output
        rewards, done, cut = self._checked(answer, row_list, rows.device)
        late = torch.tensor(answers.timed_out, dtype=torch.bool, device=rows.device)
        over = done | cut | late  # the episode ends here whatever else holds
        stop_ids = turn_ids.gather(1, (turn_length - 1)[:, None])[:, 0].tolist()
        under_limit = (
            torch.ones_like(done) if self.max_turns is None else turn_index < self.max_turns
        )
        # An observation may take what the budget leaves after it for one policy token.
        caps = (self.budget - rows_state.length[rows] - 1).tolist()
        # Only rows that may go on are rendered: a finished row's observation is unused.
        shown = (~over & under_limit).nonzero().squeeze(1).tolist()
        rendered = self.renderer.render(
            [answer.observations[j] for j in shown],
            [prompts[j] for j in shown],
            [stop_ids[j] for j in shown],
            [row_list[j] for j in shown],
            [caps[j] for j in shown],
        )
        observation_ids: list[list[int]] = [[] for _ in row_list]
        fits = torch.zeros_like(done)
        for j, ids in zip(shown, rendered, strict=True):
            if ids is not None:  # None: more than the row's budget can hold
                observation_ids[j], fits[j] = ids, True
        size = torch.tensor([len(o) for o in observation_ids], device=rows.device)
        go_on = ~over & under_limit & fits
        changes = self._appended(rows_state, rows, observation_ids, torch.where(go_on, size, 0))
        changes["turn"] = rows_state.turn.index_put((rows,), turn_index)
        new_states = list(states)
        for r, s, is_late in zip(row_list, answer.states, answers.timed_out, strict=True):
            if not is_late:
                new_states[r] = s
        terminated = done & ~cut & ~late
        return TurnStep(
            changes,
            tuple(new_states),
            zeros.index_put((rows,), torch.where(late, 0.0, rewards)),
            false.index_put((rows,), terminated),
            capped | false.index_put((rows,), ~terminated & ~go_on),
        )

    def _capped(self, rows_state: Any, ended: Tensor) -> Tensor:
        """``[N] bool`` live rows whose policy turn reached ``max_turn_tokens`` tokens
        this step without ending (all ``False`` without a cap). A parked row's turn has
        ended: it is never cut."""
        if self.max_turn_tokens is None:
            return torch.zeros_like(ended)
        turn_length = rows_state.length - rows_state.turn_start
        live = ~rows_state.done & ~rows_state.waiting & ~ended
        return live & (turn_length >= self.max_turn_tokens)

    def _turn_ids(self, rows_state: Any, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The ended turns' ids, left-aligned: ``[k, W] int64`` and ``[k]`` lengths."""
        start = rows_state.turn_start[rows]
        turn_length = rows_state.length[rows] - start
        width = int(turn_length.max())
        columns = self.prompt_width + start[:, None] + torch.arange(width, device=rows.device)
        ids = rows_state.ids[rows].gather(1, columns.clamp(max=rows_state.ids.shape[1] - 1))
        return ids, turn_length

    def _appended(
        self, rows_state: Any, rows: Tensor, observation_ids: list[list[int]], count: Tensor
    ) -> dict[str, Tensor]:
        """New ``ids``, ``mask``, ``length`` and ``turn_start`` with the first
        ``count[j]`` (``[k] int64``) observation ids written after row ``rows[j]``'s
        last token."""
        padded = pad_ids(observation_ids, self.pad_token_id, rows.device)  # [k, M]
        length = rows_state.length[rows]
        width = rows_state.ids.shape[1]
        offset = (
            torch.arange(width, device=rows.device)[None, :] - (self.prompt_width + length)[:, None]
        )
        inside = (offset >= 0) & (offset < count[:, None])  # [k, S]
        values = padded.gather(1, offset.clamp(0, padded.shape[1] - 1))
        new_length = length + count
        return {
            "ids": rows_state.ids.index_put(
                (rows,), torch.where(inside, values, rows_state.ids[rows])
            ),
            "mask": rows_state.mask.index_put((rows,), rows_state.mask[rows] | inside),
            "length": rows_state.length.index_put((rows,), new_length),
            "turn_start": rows_state.turn_start.index_put((rows,), new_length),
        }

    def _checked(
        self, answer: TurnOutput, row_list: list[int], device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The answer's ``[k] float32`` rewards, ``[k] bool`` done and ``[k] bool``
        truncated, after checking (its shape checked by ``check_answer_shape``) that
        it answers every row with a finite reward and bools."""
        where = f"responder {self.name!r}: respond()"
        rewards = []
        for j, value in enumerate(answer.rewards):
            try:  # the reward models' rule: a real number (a string "1" is not one)
                rewards.append(to_float(value))
            except TypeError:
                rewards.append(float("nan"))
            if not np.isfinite(rewards[-1]):
                raise ResponderError(
                    f"{where} gave env row {row_list[j]} the reward {value!r}; a turn "
                    "reward must be a finite number"
                )
        cut = [False] * len(row_list) if answer.truncated is None else answer.truncated
        flags = {"done": answer.done, "truncated": cut}
        checked: dict[str, list[bool]] = {}
        for field, values in flags.items():
            checked[field] = []
            for j, value in enumerate(values):
                if isinstance(value, Tensor) and value.numel() == 1:
                    value = value.item()
                if not isinstance(value, bool | np.bool_):
                    raise ResponderError(
                        f"{where} gave env row {row_list[j]} {field}={value!r}; expected a bool"
                    )
                checked[field].append(bool(value))
        return (
            torch.tensor(rewards, dtype=torch.float32, device=device),
            torch.tensor(checked["done"], dtype=torch.bool, device=device),
            torch.tensor(checked["truncated"], dtype=torch.bool, device=device),
        )
