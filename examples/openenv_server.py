"""Serve an lmgym task as an OpenEnv environment, so that TRL (or any OpenEnv
client) trains on it (``pip install 'lmgym[openenv]'``).

Run ``python examples/openenv_server.py`` to start ``lmgym/FrozenLake-v0`` on a
local port and play one episode over it with ``LmgymEnvClient`` (an
``openenv.core.EnvClient``: one WebSocket session per client), the calls a TRL
``rollout_func`` makes: ``reset`` shows the task's prompt, each ``step`` sends one
turn (``LmgymAction(message=...)``) and gets the task's answer, the turn's reward
and ``done``. ``python examples/openenv_server.py --serve --port 8000`` serves
until interrupted, for a trainer on this or another machine::

    from lmgym.integrations.openenv_models import LmgymAction, LmgymEnvClient

    async with LmgymEnvClient(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(seed=3)          # result.observation.text: the prompt
        result = await env.step(LmgymAction(message=completion))
        # result.reward, result.done, result.observation.text: the next observation

Any registered multi-turn task serves the same way, with its options:
``create_lmgym_app("lmgym/TextArena-GuessTheNumber-v0", num_games=64)``.
"""

from __future__ import annotations

import argparse
import asyncio

from lmgym.integrations.openenv_local import LocalServer
from lmgym.integrations.openenv_models import LmgymAction, LmgymEnvClient
from lmgym.integrations.openenv_server import create_lmgym_app, serve

TASK = "lmgym/FrozenLake-v0"
PATH = ["right", "right", "down", "down", "down", "right"]


async def play(url: str) -> float:
    """One FrozenLake episode over OpenEnv; returns its return."""
    total = 0.0
    async with LmgymEnvClient(base_url=url) as env:
        result = await env.reset(seed=0)
        print(f"prompt:\n{result.observation.text}")
        for move in PATH:
            result = await env.step(LmgymAction(message=move))
            total += result.reward or 0.0
            print(f"> {move}: reward {result.reward}, done {result.done}")
            print(result.observation.text)
            if result.done:
                break
    return total


def main() -> float:
    """Serve the task locally and play one episode; returns its return (1.0)."""
    with LocalServer(create_lmgym_app(TASK, split="all")) as url:
        total = asyncio.run(play(url))
    print(f"return: {total}")
    return total


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="serve until interrupted")
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.serve:
        serve(args.task, host=args.host, port=args.port)
    else:
        main()
