"""Any OpenEnv environment server as an lmgym multi-turn task (``pip install 'lmgym[openenv]'``).

Run ``python examples/openenv_client.py``. The script starts an OpenEnv server on
127.0.0.1 with openenv-core's own server tools (``create_app``: HTTP and WebSocket),
serving a small environment defined here (guess a digit, told higher or lower;
each step takes 0.3 s, as a real server might), and turns it into an lmgym env
with ``openenv_env(url, ...)``: one prompt per seed (the server's first
observation under that seed), one live WebSocket session per row, and every
policy turn one ``step`` of that row's session. The responder is ``async``, so the
env steps the rows' sessions at the same time: four rows take about one server
step a turn, not four. A scripted policy (guess 1, 2, 3, ...) plays every row to
the end; the script prints the returns and the seconds per turn.

For a server elsewhere: ``openenv_env("http://host:8000", seeds=range(64),
action=lambda text: {"code": text}, tokenizer=policy.tokenizer, num_envs=64,
responder_timeout=30)``, then train on it like on any task.
"""

from __future__ import annotations

import random
import time

import torch
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from lmgym.integrations.openenv_client import openenv_env
from lmgym.integrations.openenv_local import LocalServer

STEP_SECONDS = 0.3


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str = ""


class GuessDigit(Environment):
    """Guess a digit 1-9 drawn from the seed: -0.1 a wrong guess, 1 the right one."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self._state = 0, State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=f"game {seed}: guess my digit, 1-9.", reward=0.0)

    def step(self, action: GuessAction, **kwargs) -> GuessObservation:  # type: ignore[override]
        time.sleep(STEP_SECONDS)  # a slow server
        self._state.step_count += 1
        guess = int(action.message) if action.message.strip().isdigit() else -1
        if guess == self.secret:
            return GuessObservation(text="right.", done=True, reward=1.0)
        return GuessObservation(text="higher." if guess < self.secret else "lower.", reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


def main(rows: int = 4) -> list[float]:
    """Play ``rows`` games on a local server; returns the episodes' returns."""
    app = create_app(GuessDigit, GuessAction, GuessObservation, max_concurrent_envs=4 * rows)
    with LocalServer(app) as url:
        env = openenv_env(
            url,
            seeds=range(rows),
            num_envs=rows,
            group_size=1,
            autoreset=False,
            max_new_tokens=128,
            max_turns=9,
        )
        tok = env.tokenizer
        obs, _ = env.reset(seed=0)
        returns = torch.zeros(rows)
        done = torch.zeros(rows, dtype=torch.bool)
        for digit in range(1, 10):
            began = time.monotonic()
            for token in tok(str(digit), add_special_tokens=False)["input_ids"] + [
                tok.eos_token_id
            ]:
                obs, reward, terminated, truncated, _ = env.step(torch.tensor([token] * rows))
                returns += reward
                done |= terminated | truncated
            print(f"turn {digit}: {time.monotonic() - began:.2f} s for {rows} rows")
            if bool(done.all()):
                break
        row = int(returns.argmin())  # the longest game
        text = tok.decode(obs["input_ids"][row][obs["attention_mask"][row].bool()])
        print(f"row {row}'s episode: {text}")
    print(f"returns: {returns.tolist()}")
    return returns.tolist()


if __name__ == "__main__":
    main()
