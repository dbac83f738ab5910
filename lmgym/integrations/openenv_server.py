"""Serve an lmgym multi-turn task as an OpenEnv environment (``pip install
'lmgym[openenv]'``), so that any OpenEnv client (TRL's ``rollout_func`` among
them) trains on it.

Each WebSocket session is one ``LmgymEnvironment``: ``reset(seed=..., prompt_index=...)``
starts an episode on one of the task's prompts (``prompt_index`` if given, else
``seed`` modulo the number of prompts, else a random one) and shows it;
``step(LmgymAction(message=turn))`` hands the turn to the task's responder (exactly
as the lmgym env would, one row) and returns its answer, the turn's reward and
``done``. The episode also ends at the task's ``max_turns`` (``truncated``). The
task is built once per server (``gymnasium.make_vec(task, num_envs=1, **kwargs)``)
and its responder shared by the sessions: responders are functional over their
per-episode states, so sessions do not see each other.

What is served is the task's *text* game: the responder's turn rewards. A task
whose env also scores the whole episode with a reward model (``reward=`` of
``register_responder_env``) is refused: that score needs the token env.

Run one::

    app = create_lmgym_app("lmgym/FrozenLake-v0", max_concurrent_envs=64)
    uvicorn.run(app, host="127.0.0.1", port=8000)     # or: serve(...)
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

import gymnasium as gym
import torch

from lmgym.extras import require
from lmgym.integrations.openenv_models import LmgymAction, LmgymObservation, LmgymState

require("openenv.core", "openenv", "lmgym.integrations.openenv_server")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402

from lmgym.envs.prompts import source_columns  # noqa: E402
from lmgym.envs.turns import EpisodeStart, Responder, TurnInput, TurnOutput  # noqa: E402


class ServedTask:
    """The parts of one lmgym task a server needs: responder, prompts, turn limit.

    Args:
        task: a registered multi-turn task id (``"lmgym/FrozenLake-v0"``).
        kwargs: for ``gymnasium.make_vec(task, num_envs=1, **kwargs)``.

    Raises:
        ValueError: the task is not multi-turn, or scores episodes with a reward model.
    """

    def __init__(self, task: str, **kwargs: Any) -> None:
        env = gym.make_vec(task, num_envs=1, **kwargs)
        inner: Any = getattr(env, "unwrapped", env)
        responder = getattr(inner, "responder", None)
        if responder is None:
            raise ValueError(
                f"task={task!r} is not a multi-turn task (it has no responder); serve one "
                "whose env has a responder, e.g. lmgym/FrozenLake-v0 or lmgym/GuessNumber-v0"
            )
        if getattr(inner, "reward_model", None) is not None:
            raise ValueError(
                f"task={task!r} scores whole episodes with a reward model, which needs the "
                "token env; the OpenEnv server serves the responder's turn rewards only"
            )
        self.task = task
        self.responder: Responder = responder
        self.prompts = inner.prompt_source
        self.columns = dict(source_columns(self.prompts))
        self.max_turns: int | None = inner.max_turns
        env.close()

    def episode(self, index: int) -> EpisodeStart:
        """The ``EpisodeStart`` of one episode on prompt ``index``."""
        return EpisodeStart(
            prompts=[self.prompts[index]],
            prompt_index=torch.tensor([index]),
            columns={name: [values[index]] for name, values in self.columns.items()},
        )


async def _awaited(result: Any) -> Any:
    return await result


def prompt_text(prompt: Any) -> str:
    """A prompt as text: itself, or a chat prompt's message contents, one a line."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return str(prompt)


class LmgymEnvironment(Environment):
    """One OpenEnv session over a ``ServedTask`` (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self, served: ServedTask) -> None:
        super().__init__()
        self.served = served
        self._state = LmgymState(episode_id=str(uuid4()), task=served.task)
        self._row: Any = None  # the responder's state for this episode
        self._index = -1
        self._done = True
        # An async responder's calls run on this session's own event loop, the same
        # one every time (a client it keeps open stays bound to the loop it opened on).
        self._loop: asyncio.AbstractEventLoop | None = None

    def _resolved(self, result: Any) -> Any:
        """``result``, awaited on the session's loop if it is awaitable."""
        if not inspect.isawaitable(result):
            return result
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_awaited(result))

    def close(self) -> None:
        """Close the session's event loop, if it made one."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        prompt_index: int | None = None,
        **kwargs: Any,
    ) -> LmgymObservation:
        """Start an episode (see the module docstring).

        Raises:
            ValueError: ``prompt_index`` outside the task's prompts.
        """
        n = len(self.served.prompts)
        if prompt_index is None:
            prompt_index = seed % n if seed is not None else random.randrange(n)
        if not 0 <= prompt_index < n:
            raise ValueError(f"prompt_index={prompt_index}: the task has prompts 0..{n - 1}")
        episode = self.served.episode(prompt_index)
        (self._row,) = list(self._resolved(self.served.responder.start(episode)))
        self._index, self._done = prompt_index, False
        self._state = LmgymState(
            episode_id=episode_id or str(uuid4()), task=self.served.task, prompt_index=prompt_index
        )
        prompt = self.served.prompts[prompt_index]
        return LmgymObservation(text=prompt_text(prompt), prompt=prompt, reward=0.0)

    def step(self, action: LmgymAction, **kwargs: Any) -> LmgymObservation:  # type: ignore[override]
        """Hand one turn to the responder; its answer, reward and ``done``.

        Raises:
            RuntimeError: no episode is running (``reset`` first, or it is over).
            ValueError: the responder answered with token ids (only text travels).
        """
        if self._done:
            raise RuntimeError("no episode is running: call reset() first (or again)")
        turn = self._state.step_count + 1
        episode = self.served.episode(self._index)
        turns = TurnInput(
            rows=torch.tensor([0]),
            prompts=episode.prompts,
            prompt_index=episode.prompt_index,
            columns=episode.columns,
            turn_texts=[action.message],
            turn_ids=[torch.zeros(0, dtype=torch.long)],
            turn_index=torch.tensor([turn]),
            states=[self._row],
        )
        answer: TurnOutput = self._resolved(self.served.responder.respond(turns))
        text = answer.observations[0]
        if text is not None and not isinstance(text, str):
            raise ValueError(
                f"task {self.served.task}: the responder answered with token ids; the OpenEnv "
                "server carries text observations only"
            )
        truncated = bool(answer.truncated[0]) if answer.truncated is not None else False
        done = bool(answer.done[0]) or truncated
        limit = self.served.max_turns
        if not done and limit is not None and turn >= limit:
            done = truncated = True
        self._row, self._done = answer.states[0], done
        self._state.step_count = turn
        return LmgymObservation(
            text="" if done else (text or ""),  # as the env: no observation after the end
            turn=turn,
            truncated=truncated,
            done=done,
            reward=float(answer.rewards[0]),
        )

    @property
    def state(self) -> LmgymState:
        """The session's state (task, prompt index, turns taken)."""
        return self._state


def create_lmgym_app(task: str, *, max_concurrent_envs: int = 64, **kwargs: Any) -> Any:
    """A FastAPI app serving ``task`` as an OpenEnv environment (HTTP and ``/ws``).

    Args:
        task: a registered multi-turn task id.
        max_concurrent_envs: WebSocket sessions the server holds at once.
        kwargs: task options, for ``gymnasium.make_vec(task, num_envs=1, **kwargs)``.
    """
    served = ServedTask(task, **kwargs)
    name = task.split("/")[-1]
    return create_app(
        lambda: LmgymEnvironment(served),
        LmgymAction,
        LmgymObservation,
        env_name=name,
        max_concurrent_envs=max_concurrent_envs,
    )


def serve(task: str, *, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> None:
    """Serve ``task`` with uvicorn until interrupted (``kwargs``: ``create_lmgym_app``'s)."""
    import uvicorn

    uvicorn.run(create_lmgym_app(task, **kwargs), host=host, port=port)


__all__ = ["LmgymEnvironment", "ServedTask", "create_lmgym_app", "prompt_text", "serve"]
