"""A responder's observations as the token ids a multi-turn env appends.

Each observation is rendered once, when it is appended; the history before it is
never re-rendered nor re-tokenized.

- Token ids (a sequence of ints, a 1-D tensor or array) are appended as given,
  after checking each is in the vocabulary. Any id may be used, special tokens
  included: the environment's tokens are state, not actions.
- Text for a row whose prompt is a chat conversation is rendered through the
  tokenizer's chat template as a ``role`` message (``"user"`` or ``"tool"``)
  followed by the next assistant header, so that the buffer reads exactly as
  ``apply_chat_template(conversation, add_generation_prompt=True)`` of the whole
  conversation would. The policy's turn ended with a stop id; whatever the template
  writes after an assistant message beyond that stop token (ChatML's ``"\\n"`` after
  ``<|im_end|>``) is put in front of the observation. A turn that ended with a stop
  id the template does not close assistant messages with (a ``</s>`` where the
  template writes ``<|im_end|>``) gets the template's whole closing text first, so
  the conversation stays well formed.
- Text for a row whose prompt is plain text is tokenized as it is, without special
  tokens (``tokenizer(text, add_special_tokens=False)``): the env adds no separator,
  so put any you want (a newline, ``"Answer:"``) in the text.

Bounded by the budget. Each row says how many ids it can still take (``caps``); an
observation longer than that is not rendered, and ``render`` answers ``None`` for
it (the env truncates the episode). The bound is applied *before* tokenizing: a
text longer than ``(cap + 1) * M`` characters, ``M`` the longest token's text in
the vocabulary, is tokenized only that far (a token covers at most ``M``
characters, so that prefix alone already holds more than ``cap`` tokens), and a
list of ids longer than ``cap`` is not looked at. A 16 MB observation against a
24-token budget costs what a 24-token one does. (A tokenizer whose normalizer
deletes characters, e.g. one that drops whitespace, can make that prefix
shorter than ``cap + 1`` tokens; the text is then tokenized in full.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.envs.prompts import is_chat
from lmgym.envs.turns import ObservationRole, ResponderError
from lmgym.types import Prompt

# The placeholder conversation the chat template is rendered around: any text works,
# it only locates where an assistant message ends.
_USER_PROBE = "lmgym-user-probe"
_ASSISTANT_PROBE = "lmgym-assistant-probe"


class ObservationRenderer:
    """Turns observations (text or ids) into the ids a multi-turn env appends.

    Args:
        tokenizer: The env's tokenizer.
        role: The chat role text observations are spoken in (``Responder.role``).
        responder_name: Names the responder in errors.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, role: ObservationRole, responder_name: str
    ) -> None:
        self.tokenizer = tokenizer
        self.role = role
        self.responder_name = responder_name
        self.vocab_size = len(tokenizer)
        self._closers: dict[int, str] = {}
        self._context: str | None = None
        self._longest_token: int | None = None

    @property
    def longest_token(self) -> int:
        """``M``: the most characters one token's text has (the vocabulary's longest
        entry, at least 1), computed once."""
        if self._longest_token is None:
            vocab = self.tokenizer.get_vocab()
            self._longest_token = max([1, *(len(t) for t in vocab)])
        return self._longest_token

    def render(
        self,
        observations: Sequence[str | Sequence[int] | Tensor | np.ndarray | None],
        prompts: Sequence[Prompt],
        stop_ids: Sequence[int],
        rows: Sequence[int],
        caps: Sequence[int] | None = None,
    ) -> list[list[int] | None]:
        """The ids of ``k`` observations; the texts are tokenized in one batched call.

        Args:
            observations: Per row, text or token ids (``None`` is refused: the row goes on).
            prompts: The rows' prompts (a chat prompt makes text a chat turn).
            stop_ids: The id that ended each row's policy turn.
            rows: The env rows, for errors.
            caps: Per row, the most ids it can take (may be below 0); ``None``: no cap.

        Returns:
            Per row, its ids, or ``None`` where they would be more than its cap (the
            observation is then tokenized no further than needed to know it).

        Raises:
            ResponderError: ``None``, an id outside the vocabulary, or neither text nor ids.
        """
        out: list[list[int] | None] = []
        texts: list[str] = []
        text_at: list[int] = []
        limits = [None] * len(rows) if caps is None else [int(c) for c in caps]
        cut: list[bool] = []
        for observation, prompt, stop_id, row, cap in zip(
            observations, prompts, stop_ids, rows, limits, strict=True
        ):
            if isinstance(observation, str):
                # At most (cap + 1) * M characters are needed to know a text overflows cap.
                longest = None if cap is None else max(cap + 1, 0) * self.longest_token
                shortened = longest is not None and len(observation) > longest
                if shortened:
                    observation = observation[:longest]
                text_at.append(len(out))
                cut.append(shortened)
                texts.append(
                    self._chat_turn(observation, stop_id) if is_chat(prompt) else observation
                )
                out.append([])
            else:
                out.append(self._ids(observation, row, cap))
        if texts:
            encoded = self._encode(texts)
            for j, ids, shortened in zip(text_at, encoded, cut, strict=True):
                cap = limits[j]
                if shortened and cap is not None and len(ids) <= cap:
                    # A normalizer deleted characters: only the whole text can tell.
                    full = observations[j]
                    assert isinstance(full, str)
                    ids = self._encode(
                        [self._chat_turn(full, stop_ids[j]) if is_chat(prompts[j]) else full]
                    )[0]
                out[j] = None if cap is not None and len(ids) > cap else list(ids)
        return out

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return list(self.tokenizer(texts, add_special_tokens=False)["input_ids"])

    def _ids(self, observation: object, row: int, cap: int | None = None) -> list[int] | None:
        """The ids of one observation given as ids, checked; ``None`` if more than
        ``cap`` (they are then not checked: the row cannot take them anyway)."""
        where = f"responder {self.responder_name!r}: the observation for env row {row}"
        if observation is None:
            raise ResponderError(
                f"{where} is None but its episode is not over; return the text or token "
                "ids the environment says next, or done=True to end the episode"
            )
        if isinstance(observation, Tensor | np.ndarray):
            if observation.ndim != 1:
                raise ResponderError(
                    f"{where} has shape {tuple(observation.shape)}; token ids must be 1-D"
                )
            if cap is not None and observation.shape[0] > cap:
                return None
            observation = observation.tolist()
        if not isinstance(observation, Sequence) or isinstance(observation, bytes):
            raise ResponderError(
                f"{where} is a {type(observation).__name__}; return a string (rendered by "
                "the env) or a sequence of token ids"
            )
        if cap is not None and len(observation) > cap:
            return None
        ids = list(observation)
        for i in ids:
            if (
                not isinstance(i, int | np.integer)
                or isinstance(i, bool)
                or not 0 <= i < self.vocab_size
            ):
                raise ResponderError(
                    f"{where} holds {i!r}, not a token id in [0, {self.vocab_size}); token "
                    "ids are appended as given, so each must be in the tokenizer's vocabulary"
                )
        return [int(i) for i in ids]

    def _chat_turn(self, text: str, stop_id: int) -> str:
        """The chat template's text for ``text`` as a ``role`` message, from the end
        of the policy's stop token through the next assistant header."""
        context = self._context_text()
        full = self._apply([*self._probe_messages(), {"role": self.role, "content": text}], True)
        if not full.startswith(context):
            raise ResponderError(
                f"responder {self.responder_name!r}: the chat template renders earlier "
                f"messages differently once a {self.role!r} message follows, so a "
                "turn cannot be appended without re-rendering the history; use a "
                "template that renders each message on its own, or return token ids"
            )
        return self._closer(stop_id) + full[len(context) :]

    def _probe_messages(self) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": _USER_PROBE},
            {"role": "assistant", "content": _ASSISTANT_PROBE},
        ]

    def _context_text(self) -> str:
        if self._context is None:
            self._context = self._apply(self._probe_messages(), False)
        return self._context

    def _closer(self, stop_id: int) -> str:
        """What the template writes after an assistant message, less the stop token's
        text that the policy already wrote (all of it if the template does not close
        assistant messages with that token)."""
        if stop_id not in self._closers:
            context = self._context_text()
            closer = context[context.rindex(_ASSISTANT_PROBE) + len(_ASSISTANT_PROBE) :]
            stop_text = self.tokenizer.decode([stop_id], skip_special_tokens=False)
            if stop_text and closer.startswith(stop_text):
                closer = closer[len(stop_text) :]
            self._closers[stop_id] = closer
        return self._closers[stop_id]

    def _apply(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            text: Any = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as err:
            raise ResponderError(
                f"responder {self.responder_name!r}: the tokenizer's chat template cannot "
                f"render a {self.role!r} message after an assistant message ({err}); set "
                "the responder's role to one the template knows, or return token ids"
            ) from err
        return str(text)


def pad_ids(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> Tensor:
    """``k`` id lists as a right-padded ``[k, max(1, longest)] int64`` tensor."""
    width = max([1, *(len(r) for r in rows)])
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for j, r in enumerate(rows):
        if r:
            out[j, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)
