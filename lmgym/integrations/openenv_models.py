"""The wire types of an lmgym task served as an OpenEnv environment, and the
client that speaks them (``pip install 'lmgym[openenv]'``).

An episode is text both ways: ``reset`` shows the task's prompt, each ``step``
sends one policy turn as ``LmgymAction(message=...)`` and gets the responder's
answer, the turn's reward and whether the episode is over. ``LmgymEnvClient`` is an
``openenv.core.EnvClient`` for these types (async, one WebSocket session a client;
``.sync()`` for a blocking one), the client a TRL ``rollout_func`` calls.
"""

from __future__ import annotations

from typing import Any

from lmgym.extras import require

require("openenv.core", "openenv", "lmgym.integrations.openenv_models")

from openenv.core import EnvClient  # noqa: E402
from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402


class LmgymAction(Action):
    """One policy turn."""

    message: str = Field(..., description="the policy's turn, as text")


class LmgymObservation(Observation):
    """What the task says: the prompt after ``reset``, the responder's answer after a
    ``step`` (``""`` once the episode is over). ``done``/``reward`` as OpenEnv's."""

    text: str = Field(default="", description="the prompt, or the responder's answer")
    prompt: Any = Field(default=None, description="the prompt as the task holds it")
    turn: int = Field(default=0, description="policy turns taken so far")
    truncated: bool = Field(default=False, description="cut off (a time limit), not ended")


class LmgymState(State):
    """The session's state: the task, the prompt index and the turns so far."""

    task: str = ""
    prompt_index: int = -1


class LmgymEnvClient(EnvClient[LmgymAction, LmgymObservation, LmgymState]):
    """An ``EnvClient`` for an lmgym task served by ``openenv_server``::

    async with LmgymEnvClient(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(seed=3)
        result = await env.step(LmgymAction(message="right"))
    """

    def _step_payload(self, action: LmgymAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[LmgymObservation]:
        data = dict(payload.get("observation", {}))
        observation = LmgymObservation(
            **data, done=payload.get("done", False), reward=payload.get("reward")
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: dict[str, Any]) -> LmgymState:
        return LmgymState(**payload)


__all__ = ["LmgymAction", "LmgymEnvClient", "LmgymObservation", "LmgymState"]
