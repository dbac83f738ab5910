"""Weather: a tool task. The answer is only known to a tool the policy must call.

An episode: the prompt asks for today's weather in a city (``"what is the weather
in oslo today?"``) and declares one tool, a typed Python function::

    def weather(city: str, today: dict) -> str:
        \"\"\"The weather in a city today.

        Args:
            city: The city's name, e.g. "oslo".
            today: (filled in by the environment) the condition in each city.
        \"\"\"

(``today`` is injected by the environment, hidden from the schema the policy
sees.) Each episode draws its own weather, so the prompt alone cannot tell it. In
each turn the policy either

- calls the tool, in the model's format (``tools``): ``<tool_call>{"name":
  "weather", "arguments": {"city": "oslo"}}</tool_call>`` or, one line,
  ``weather: oslo``; the environment (role ``"tool"``) answers with the condition
  (``"rain"``) or an error (``"error: ValueError: unknown city 'x'"``,
  ``"error: malformed tool call: ..."``), and the episode goes on; or
- answers: ``answer: rain``, ``<answer>rain</answer>``, or a turn with no call at
  all (its whole text), which ends the episode.

Reward, on the answering turn: ``R = 1`` when the answer names the episode's
condition and no other (a word starting with it, case-insensitive: ``rain``,
``"Rainy."``, ``"it is raining"``), else 0. A call that cannot run (it does not
parse, names no tool, has wrong arguments, or the tool fails or runs out of time
or memory) costs ``error_cost`` (default 0); the first call that returns earns
``call_bonus`` (default 0; a shaping term for training from scratch). Range
``[-error_cost * (max_turns - 1), 1 + call_bonus]``; ``[0, 1]`` at the defaults.
Solved: ``R >= 0.9``. An observation-blind policy (one that calls the tool and
ignores the result) scores ``1/len(conditions)`` at best.

Which weather: the prompt source has ``num_games`` records, record ``i`` asking
about ``cities[i % len(cities)]`` with first condition
``conditions[(i // len(cities)) % len(conditions)]``; as in ``EchoTurn`` the
``j``-th episode of a record in one ``start`` call hears the condition ``j``
places on (``spread=True``), so a group of episodes sees different weather. The
other cities' weather follows (city ``k`` has the condition ``k`` places on).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt
from lmgym.envs.tasks.multi_turn._common import (
    Reply,
    check_num_games,
    column,
    reply_each,
    split_records,
)
from lmgym.envs.tasks.multi_turn.tools import (
    Tool,
    ToolRunner,
    answer_call,
    plain_tool_text,
    tool_messages,
)
from lmgym.envs.tasks.multi_turn.tools.runner import DEFAULT_MEMORY_LIMIT_MB, DEFAULT_TIME_LIMIT
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

SOLVED_THRESHOLD = 0.9
DEFAULT_MAX_TURNS = 3
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_CITIES = ("oslo", "rome", "lima", "cairo")
DEFAULT_CONDITIONS = ("sun", "rain", "snow", "fog")
_ANSWER = re.compile(r"<answer>(?P<tag>.*?)</answer>|\banswer:(?P<line>[^\n]*)", re.I | re.S)
_WORD = re.compile(r"[a-z]+")


def weather(city: str, today: dict) -> str:
    """The weather in a city today.

    Args:
        city: The city's name, e.g. "oslo".
        today: (filled in by the environment) the condition in each city.
    """
    key = city.strip().lower()
    if key not in today:
        raise ValueError(f"unknown city {city!r}")  # short: it must fit the budget
    return str(today[key])


def weather_tool(name: str = "weather") -> Tool:
    """``weather`` as a tool called ``name``, ``today`` injected."""
    return Tool(weather, name=name, injected=("today",))


def answer_text(text: str) -> str:
    """The answer in a turn with no call: its ``answer:`` / ``<answer>`` part, else
    the whole turn."""
    match = _ANSWER.search(text)
    if match is None:
        return text
    return match.group("tag") if match.group("tag") is not None else match.group("line")


def names_condition(answer: str, condition: str, conditions: Sequence[str]) -> bool:
    """Whether ``answer`` has a word starting with ``condition`` and none starting
    with another of ``conditions`` (case-insensitive)."""
    words = _WORD.findall(answer.lower())

    def said(c: str) -> bool:
        return any(w.startswith(c.lower()) for w in words)

    return said(condition) and not any(said(c) for c in conditions if c != condition)


@dataclass(frozen=True)
class WeatherState:
    """An episode's world: the city asked about, today's condition in every city,
    and whether a call has returned yet."""

    city: str
    today: tuple[tuple[str, str], ...]
    called: bool = False

    @property
    def condition(self) -> str:
        """The condition in the city asked about."""
        return dict(self.today)[self.city]


def _check_words(name: str, words: Sequence[str], least: int) -> tuple[str, ...]:
    words = tuple(words)
    if (
        len(words) < least
        or len({w.lower() for w in words}) != len(words)
        or not all(isinstance(w, str) and w.isalpha() for w in words)
    ):
        raise ValueError(
            f"{name}={words!r}: need at least {least} distinct words of letters, e.g. {DEFAULT_CITIES[:2]}"
        )
    return words


@dataclass(frozen=True, kw_only=True)
class WeatherWorld:
    """What the Weather responder is configured with (the task takes each as a
    parameter).

    Attributes:
        cities, conditions: the world (distinct words of letters; at least one
            city and two conditions).
        tool_name: the name the policy calls the tool by.
        call_bonus: reward of the first call that returns, once an episode.
        error_cost: subtracted for each call that cannot run.
        time_limit, memory_limit_mb: each call's bounds (``ToolRunner``: seconds,
            default 2; MiB it may add, default 256, 0: none).
        spread: the episodes of a record in one ``start`` call hear different
            weather (module docstring).
    """

    cities: Sequence[str] = DEFAULT_CITIES
    conditions: Sequence[str] = DEFAULT_CONDITIONS
    tool_name: str = "weather"
    call_bonus: float = 0.0
    error_cost: float = 0.0
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    spread: bool = True

    def world(self) -> dict[str, Any]:
        """This record's ``WeatherWorld`` fields, e.g. to build a ``Weather`` from
        a subclass's instance."""
        return {f.name: getattr(self, f.name) for f in fields(WeatherWorld)}


@dataclass(frozen=True, kw_only=True)
class Weather(WeatherWorld):
    """The responder: runs the weather tool, scores the final answer. Its settings
    are ``WeatherWorld``'s and:

    Args:
        city_column, condition_column: the prompt-source columns read at ``start``.

    Attributes:
        tools: the one tool, by name.
        runner: runs its calls within ``time_limit`` and ``memory_limit_mb``.
    """

    city_column: str = "city"
    condition_column: str = "condition"
    role: Literal["tool"] = "tool"
    runner: ToolRunner = field(init=False, repr=False, compare=False)
    tools: dict[str, Tool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cities", _check_words("cities", self.cities, 1))
        object.__setattr__(self, "conditions", _check_words("conditions", self.conditions, 2))
        tool = weather_tool(self.tool_name)
        object.__setattr__(self, "tools", {tool.name: tool})
        object.__setattr__(
            self, "runner", ToolRunner({tool.name: tool.fn}, self.time_limit, self.memory_limit_mb)
        )

    def start(self, episodes: EpisodeStart) -> list[WeatherState]:
        """Each new episode's world (module docstring).

        Raises:
            KeyError: a missing column.
            ValueError: a city or condition that is not one of the responder's.
        """
        cities = column(episodes.columns, self.city_column, "Weather")
        firsts = column(episodes.columns, self.condition_column, "Weather")
        seen: dict[int, int] = {}
        out = []
        for j, (city, first, game) in enumerate(
            zip(cities, firsts, episodes.prompt_index.tolist(), strict=True)
        ):
            if city not in self.cities or first not in self.conditions:
                raise ValueError(
                    f"Weather: row {j}: city {city!r} / condition {first!r} is not one of "
                    f"{self.cities} / {self.conditions}"
                )
            shift = seen.get(game, 0) if self.spread else 0
            seen[game] = seen.get(game, 0) + 1
            base = self.conditions.index(first) + shift
            n = len(self.conditions)
            offset = self.cities.index(city)
            today = tuple(
                (c, self.conditions[(base + k - offset) % n]) for k, c in enumerate(self.cities)
            )
            out.append(WeatherState(city, today))
        return out

    def reply(self, text: str, state: WeatherState) -> Reply:
        """The answer to one turn."""
        outcome = answer_call(text, self.tools, self.runner, injected={"today": dict(state.today)})
        if outcome is None:
            right = names_condition(answer_text(text), state.condition, self.conditions)
            return Reply(None, float(right), True, state)
        if not outcome.ok:
            return Reply(outcome.observation, -self.error_cost, False, state)
        bonus = 0.0 if state.called else self.call_bonus
        return Reply(outcome.observation, bonus, False, WeatherState(state.city, state.today, True))

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's turn (module docstring)."""
        return reply_each(self.reply, turns)


def weather_records(
    responder: Weather,
    num_games: int,
    *,
    chat: bool,
    tokenizer: Any = None,
    describe_tools: bool = True,
) -> list[dict[str, Any]]:
    """``num_games`` records ``{"prompt", "city", "condition"}`` (module docstring);
    a chat prompt declares the tool through ``tool_messages``, a plain one with
    ``plain_tool_text`` (``describe_tools=False``: the bare question, for a model
    trained from scratch, which cannot read the description anyway).

    Raises:
        ValueError: ``num_games < 2``.
    """
    check_num_games(num_games)
    tools = list(responder.tools.values())
    records = []
    for i in range(num_games):
        city = responder.cities[i % len(responder.cities)]
        first = responder.conditions[(i // len(responder.cities)) % len(responder.conditions)]
        if chat:
            ask = (
                f"What is the weather in {city.title()} today? Call the {responder.tool_name} "
                "tool, then answer with the weather in one word."
            )
            prompt: Any = tool_messages(chat_prompt(ask, chat=True), tools, tokenizer)
        elif not describe_tools:
            prompt = chat_prompt(f"what is the weather in {city} today?", chat=False)
        else:
            prompt = chat_prompt(
                f"what is the weather in {city} today? {plain_tool_text(tools)}. then answer: word.",
                chat=False,
            )
        records.append({"prompt": prompt, "city": city, "condition": first})
    return records


@dataclass(frozen=True, kw_only=True)
class WeatherParams(ChatSplit, WeatherWorld):
    """Weather's parameters: ``WeatherWorld``'s (the responder's), ``ChatSplit``'s
    (``chat`` gives chat prompts that declare the tool in the model's format) and:

    Attributes:
        num_games: records before the split.
        describe_tools: a plain-text prompt declares the tool (``False``: the bare
            question, a shorter prompt for a model trained from scratch; a chat
            prompt always declares it).
    """

    num_games: int = 64
    describe_tools: bool = True


@task_factory(WeatherParams, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, max_turns=DEFAULT_MAX_TURNS)
def make_weather_vector(options: EnvOptions, params: WeatherParams) -> TokenVectorEnv:
    """``lmgym/Weather-v0`` as a native vector env (parameters: ``WeatherParams``).

    Env options:
        max_turns: policy turns per episode (default 3).
        max_new_tokens: token budget for the turns and the tool's answers (default
            64; raise it for a chat model's JSON calls).
    """
    responder = Weather(**params.world())
    records = weather_records(
        responder,
        params.num_games,
        chat=params.wants_chat(options.tokenizer),
        tokenizer=options.tokenizer,
        describe_tools=params.describe_tools,
    )
    source = split_records(records, params)
    return build_env(
        options, source, None, responder=responder, max_new_tokens=DEFAULT_MAX_NEW_TOKENS
    )


make_weather = single_env_factory(make_weather_vector)

__all__ = [
    "Weather",
    "WeatherState",
    "answer_text",
    "make_weather",
    "make_weather_vector",
    "names_condition",
    "weather",
    "weather_records",
    "weather_tool",
]
