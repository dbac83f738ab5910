"""Multi-turn test helpers: a scripted, deterministic responder, an env factory and a
one-thread fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lmgym.envs import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput


def echo_reply(text: str, turn: int) -> str | list[int]:
    """The observation after a turn: ``"+"`` then the turn's text."""
    return "+" + text


def length_reward(text: str, turn: int) -> float:
    """A turn's reward: its text's length plus a tenth of its index (tells turns apart)."""
    return len(text) + 0.1 * turn


@dataclass
class Scripted:
    """A deterministic responder: replies ``reply(turn_text, turn_index)``, rewards
    ``reward(turn_text, turn_index)`` and ends the episode after ``done_at`` turns.

    Its state is ``(prompt, turns answered)``, so a test can see that a row's state
    follows the row. ``calls`` logs every call: ``("start", prompts)`` and
    ``("respond", TurnInput)``.

    ``fail`` makes call number ``fail_at`` (1-based, counting start and respond calls
    together) fail: ``"raise"``, ``"count"`` (one answer too few), ``"nan"`` (a NaN
    reward), ``"text"`` (the reward ``"1"``, a string), ``"none"`` (a ``None`` observation for a row that goes on) or
    ``"vocab"`` (an id outside the vocabulary). ``fail_at=None``: every call fails.
    """

    role: str = "user"
    done_at: int = 2
    reply: Callable[[str, int], str | list[int]] = echo_reply
    reward: Callable[[str, int], float] = length_reward
    fail: str | None = None
    fail_at: int | None = None
    name: str = "scripted"
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def _failing(self) -> bool:
        return self.fail is not None and (self.fail_at is None or len(self.calls) == self.fail_at)

    def start(self, episodes: EpisodeStart) -> list[Any]:
        self.calls.append(("start", list(episodes.prompts)))
        states = [(p, 0) for p in episodes.prompts]
        if self._failing():
            if self.fail == "raise":
                raise RuntimeError("game server down")
            if self.fail == "count":
                return states[:-1]
        return states

    def respond(self, turns: TurnInput) -> TurnOutput:
        self.calls.append(("respond", turns))
        for (prompt, answered), p, t in zip(
            turns.states, turns.prompts, turns.turn_index.tolist(), strict=True
        ):
            assert prompt == p and answered + 1 == t, "the state does not follow its row"
        texts = turns.turn_texts
        turn = turns.turn_index.tolist()
        observations: list[Any] = [self.reply(x, n) for x, n in zip(texts, turn, strict=True)]
        rewards = [self.reward(x, n) for x, n in zip(texts, turn, strict=True)]
        done = [n >= self.done_at for n in turn]
        states = [(p, n) for (p, _), n in zip(turns.states, turn, strict=True)]
        if self._failing():
            if self.fail == "raise":
                raise RuntimeError("game server down")
            if self.fail == "count":
                observations = observations[:-1]
            if self.fail == "nan":
                rewards[-1] = float("nan")
            if self.fail == "text":  # float("1") would take it; a reward model may not
                rewards[-1] = "1"
            if self.fail in ("none", "vocab"):
                done = [False] * len(done)
                observations[-1] = None if self.fail == "none" else [10**6]
        return TurnOutput(observations, rewards, done, states)

    def responded(self) -> list[TurnInput]:
        return [arg for kind, arg in self.calls if kind == "respond"]

    def started(self) -> list[list[Any]]:
        return [arg for kind, arg in self.calls if kind == "start"]


@pytest.fixture
def scripted() -> type[Scripted]:
    """The ``Scripted`` responder class."""
    return Scripted


@pytest.fixture
def make_turn_env(tokenizer) -> Callable[..., TokenVectorEnv]:
    """A multi-turn env over the character tokenizer; keywords override the defaults
    (``reward=None``, ``max_new_tokens=16``, a ``Scripted()`` responder)."""

    def factory(
        prompts: Sequence[Any] = ("ab", "xyz"), reward=None, responder=None, **kwargs
    ) -> TokenVectorEnv:
        kwargs.setdefault("max_new_tokens", 16)
        return TokenVectorEnv(
            kwargs.pop("tokenizer", tokenizer),
            list(prompts),
            reward,
            responder=responder if responder is not None else Scripted(),
            **kwargs,
        )

    return factory


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The packaged SmolLM2-135M-Instruct tokenizer (ChatML, ``<|im_end|>`` ends a turn);
    skipped where the packaged model has not been converted into the cache."""
    from transformers import AutoTokenizer

    from lmgym.policy.packaged import PACKAGED_MODELS, cache_root

    model = PACKAGED_MODELS["smollm2-135m-instruct"]
    path = cache_root() / f"{model.name}-{model.version}"
    if not path.is_dir():
        pytest.skip("smollm2-135m-instruct is not converted in the cache")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run on one torch thread (tiny models and SB3's MLP gain nothing from more), then
    restore the count the test started with."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
