"""Any OpenEnv environment server as an lmgym multi-turn task (``pip install
'lmgym[openenv]'``).

``OpenEnvResponder(base_url)`` is a responder (role ``"user"``) whose episodes are
live sessions on the server: each row holds its own WebSocket session (an
``openenv.core.EnvClient``, ``GenericEnvClient`` by default), ``reset(seed=...)``
with the row's game seed when its episode starts, and every policy turn is one
``step`` of that session. Its ``respond`` is ``async def``, so the env calls it
once per row, all rows at the same time on its event loop (``lmgym.envs.turn_calls``):
a slow server step holds up only its own row, and ``responder_timeout`` bounds each.

Text both ways. ``action(turn_text) -> action`` builds the step's action (default
``{"message": turn_text}``, the field OpenEnv's echo and chat environments read;
``OpenEnvResponder(..., action=lambda text: {"code": text})`` for a coding env);
``observation_text(observation dict) -> str`` reads the answer (default: the
observation's ``text``/``message``/``prompt``/... field if it has one, else the
other fields as JSON). The step's ``reward`` (``None`` reads as 0) is the turn's
reward and ``done`` ends the episode (``terminated``).

Prompts. ``openenv_records(base_url, seeds)`` resets one session per seed and makes
the first observation (after an optional ``intro``) that seed's prompt, column
``seed``; a row's ``start`` resets its own session with the same seed and checks it
shows the same first observation (a server that is not deterministic under its
seed is refused: ``ValueError``, naming the seed). ``openenv_env(base_url, ...)``
builds the whole multi-turn env; ``register_responder_env`` registers one.

States. A row's state is ``OpenEnvState(seed, actions)`` plus its live session,
owned by that state alone. A state without one (copied, or an old state the env
retries after a failed step) is replayed on a new session: ``reset(seed)`` and its
actions again, which is only faithful on a server deterministic under its seed.
Sessions of finished episodes are closed at once; a session whose episode was cut
off (``max_turns``, the budget) is closed on the responder's next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lmgym.extras import require

require("openenv.core", "openenv", "lmgym.integrations.openenv_client")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from lmgym.char_tokenizer import make_char_tokenizer  # noqa: E402
from lmgym.envs.prompts import RecordPrompts  # noqa: E402
from lmgym.envs.tasks.multi_turn._common import column, frame  # noqa: E402
from lmgym.envs.token_env import TokenVectorEnv  # noqa: E402
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput  # noqa: E402
from lmgym.types import Prompt  # noqa: E402

#: Observation fields read as the text, first found first.
TEXT_FIELDS = ("text", "message", "echoed_message", "prompt", "content", "output", "stdout")


def generic_client(base_url: str) -> GenericEnvClient:
    """The default client: ``GenericEnvClient(base_url=base_url)`` (plain dicts)."""
    return GenericEnvClient(base_url=base_url)


def message_action(text: str) -> dict[str, Any]:
    """The default action: ``{"message": text}``."""
    return {"message": text}


def observation_text(observation: Any) -> str:
    """An observation as text: its first ``TEXT_FIELDS`` field that is a string, else
    the observation (a dict) as JSON with sorted keys."""
    if isinstance(observation, dict):
        for name in TEXT_FIELDS:
            if isinstance(observation.get(name), str):
                return observation[name]
        return json.dumps(observation, sort_keys=True, default=str)
    return str(observation)


class LiveSession:
    """A connected client standing at one ``OpenEnvState``; whoever ``take``s it owns
    it. Copied or pickled, it is empty. Dropped untaken, it hands its client to
    ``orphans`` (closed on the responder's next call)."""

    def __init__(self, client: Any = None, orphans: list[Any] | None = None) -> None:
        self._client, self._orphans = client, orphans
        self._lock = threading.Lock()

    def take(self) -> Any:
        """The client (``None`` if taken already)."""
        with self._lock:
            client, self._client = self._client, None
        return client

    def __del__(self) -> None:
        client, orphans = getattr(self, "_client", None), getattr(self, "_orphans", None)
        if client is not None and orphans is not None:
            orphans.append(client)

    def __reduce__(self) -> tuple[type[LiveSession], tuple[()]]:
        return (LiveSession, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> LiveSession:
        return LiveSession()


@dataclass(frozen=True)
class OpenEnvState:
    """One episode on an OpenEnv server.

    Attributes:
        seed: the ``reset(seed=...)`` seed.
        actions: the actions sent so far.
        live: the session standing at this state, if any (not compared).
    """

    seed: int
    actions: tuple[Any, ...] = ()
    live: LiveSession | None = field(default=None, compare=False, repr=False)


class OpenEnvResponder:
    """A responder over an OpenEnv server (see the module docstring).

    Args:
        base_url: the server (``http://127.0.0.1:8000``; ``ws://`` too).
        action: ``turn text -> action`` for ``client.step``.
        observation_text: ``observation -> text`` for the policy.
        column: the prompt-source column of each episode's seed.
        client_factory: ``base_url -> EnvClient`` (default ``GenericEnvClient``).
        check_first: compare each session's first observation with the row's
            ``observation`` column (``openenv_records`` writes it).
    """

    role: Literal["user"] = "user"

    def __init__(
        self,
        base_url: str,
        *,
        action: Callable[[str], Any] = message_action,
        observation_text: Callable[[Any], str] = observation_text,
        column: str = "seed",
        client_factory: Callable[[str], Any] | None = None,
        check_first: bool = True,
    ) -> None:
        self.base_url = base_url
        self.action = action
        self.observation_text = observation_text
        self.column = column
        self.client_factory = client_factory or generic_client
        self.check_first = check_first
        self._orphans: list[Any] = []

    def __repr__(self) -> str:
        return f"OpenEnvResponder({self.base_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_orphans"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._orphans = []

    async def _close_orphans(self) -> None:
        while self._orphans:
            await _close(self._orphans.pop())

    async def session(self, seed: int) -> tuple[Any, str]:
        """A new connected client reset with ``seed``, and its first observation's text."""
        client = self.client_factory(self.base_url)
        await client.connect()
        result = await client.reset(seed=seed)
        return client, self.observation_text(result.observation)

    async def _start_row(self, seed: int, first: str | None, row: int) -> OpenEnvState:
        client, text = await self.session(seed)
        if first is not None and text != first:
            await _close(client)
            raise ValueError(
                f"{self!r}: row {row}: reset(seed={seed}) shows another first observation "
                "than the prompt was made from: the server is not deterministic under its "
                "seed; make it so, or build the env with check_first=False"
            )
        return OpenEnvState(seed, (), LiveSession(client, self._orphans))

    async def start(self, episodes: EpisodeStart) -> list[OpenEnvState]:
        """A live session per episode, reset with the row's seed (all at once).

        Raises:
            KeyError: the prompt source has no ``column`` column.
            ValueError: a seed that is not an integer, or a first observation other
                than the row's ``observation`` column.
        """
        await self._close_orphans()
        seeds = column(episodes.columns, self.column, repr(self))
        firsts: Sequence[Any] = [None] * len(seeds)
        if self.check_first and "observation" in episodes.columns:
            firsts = episodes.columns["observation"]
        for j, seed in enumerate(seeds):
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ValueError(f"{self!r}: row {j}: seed {seed!r} is not an integer")
        rows = [
            self._start_row(int(s), f, j)
            for j, (s, f) in enumerate(zip(seeds, firsts, strict=True))
        ]
        return list(await asyncio.gather(*rows))

    async def _replayed(self, state: OpenEnvState) -> Any:
        client, _ = await self.session(state.seed)
        for action in state.actions:
            await client.step(action)
        return client

    async def respond(self, turns: TurnInput) -> TurnOutput:
        """Step one row's session with its turn (the env calls this per row)."""
        await self._close_orphans()
        (state,) = turns.states
        client = state.live.take() if state.live is not None else None
        if client is None:
            client = await self._replayed(state)
        action = self.action(turns.turn_texts[0])
        result = await client.step(action)
        done = bool(result.done)
        text = None if done else frame(self.observation_text(result.observation), turns.prompts[0])
        if done:
            await _close(client)
        moved = OpenEnvState(
            state.seed,
            (*state.actions, action),
            None if done else LiveSession(client, self._orphans),
        )
        reward = 0.0 if result.reward is None else float(result.reward)
        return TurnOutput([text], [reward], [done], [moved])


async def _close(client: Any) -> None:
    with contextlib.suppress(Exception):  # best effort: a session already gone is closed
        await client.close()


def openenv_records(
    base_url: str,
    seeds: Sequence[int],
    *,
    intro: str = "",
    observation_text: Callable[[Any], str] = observation_text,
    chat: bool = False,
    client_factory: Callable[[str], Any] | None = None,
) -> list[dict[str, Any]]:
    """One record ``{"prompt", "seed", "observation"}`` per seed: the server's first
    observation under that seed (after ``intro`` and a newline, if given).

    Raises:
        ValueError: no seeds.
    """
    if not seeds:
        raise ValueError("seeds: give at least one seed")
    responder = OpenEnvResponder(
        base_url, observation_text=observation_text, client_factory=client_factory
    )

    async def first(seed: int) -> str:
        client, text = await responder.session(seed)
        await _close(client)
        return text

    async def all_first() -> list[str]:
        return list(await asyncio.gather(*(first(int(s)) for s in seeds)))

    records = []
    for seed, text in zip(seeds, asyncio.run(all_first()), strict=True):
        body = f"{intro}\n{text}" if intro else text
        prompt: Prompt = [{"role": "user", "content": body}] if chat else f"{body}\n"
        records.append({"prompt": prompt, "seed": int(seed), "observation": text})
    return records


def openenv_env(
    base_url: str,
    *,
    tokenizer: Any = None,
    seeds: Sequence[int] = tuple(range(8)),
    intro: str = "",
    chat: bool = False,
    action: Callable[[str], Any] = message_action,
    observation_text: Callable[[Any], str] = observation_text,
    client_factory: Callable[[str], Any] | None = None,
    **options: Any,
) -> TokenVectorEnv:
    """The multi-turn env of an OpenEnv server: prompts from ``openenv_records``
    (one per seed), an ``OpenEnvResponder`` answering.

    Args:
        base_url: the server.
        tokenizer: the policy's tokenizer (default: the character tokenizer).
        seeds: one prompt per seed.
        intro, chat: as ``openenv_records``.
        action, observation_text, client_factory: as ``OpenEnvResponder``.
        options: ``EnvOptions`` fields (``num_envs``, ``group_size``,
            ``max_new_tokens``, ``max_turns``, ``responder_timeout``, ...).
    """
    records = openenv_records(
        base_url,
        seeds,
        intro=intro,
        observation_text=observation_text,
        chat=chat,
        client_factory=client_factory,
    )
    responder = OpenEnvResponder(
        base_url, action=action, observation_text=observation_text, client_factory=client_factory
    )
    if tokenizer is None:
        tokenizer = make_char_tokenizer()
    # ignore: Responder declares a sync respond; TokenVectorEnv also awaits an async one.
    return TokenVectorEnv(tokenizer, RecordPrompts(records), None, responder=responder, **options)  # type: ignore[arg-type]


__all__ = [
    "LiveSession",
    "OpenEnvResponder",
    "OpenEnvState",
    "generic_client",
    "message_action",
    "observation_text",
    "openenv_env",
    "openenv_records",
]
