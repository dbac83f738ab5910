"""PositiveContinuation: continue a movie review so that it reads positive (the
RL4LMs IMDB task, with a built-in set of review openings; an optional extra).

Prompts: the opening of a movie review, made from templates over invented titles
and genres (no data is downloaded), e.g. ``"I had low expectations for Midnight
Harbor, and"``; as a chat prompt (when the tokenizer has a chat template, or
``chat=True``) the user asks ``"Continue this movie review: <opening>"``, as plain
text (``chat=False``, or no template) the opening itself is the prompt.
``openings="mixed"`` (the default) draws from neutral and negative-leaning
templates alike, ``"negative"`` (the harder level: SmolLM2-135M-Instruct's
sampled base score falls from 0.34 to 0.23) only from the negative ones,
``"neutral"`` only from the others.

Reward: VADER's compound sentiment score of the completion's text alone (the
prompt is not scored), ``R = compound(y)``, from the ``vaderSentiment`` package
(``pip install 'lmgym[sentiment]'``; its lexicon ships inside it, nothing is
downloaded). Range ``[-1, 1]``; an empty completion scores 0. Bandit mode is the
meaningful one. Random-policy baseline: 0.0 (random characters carry no
sentiment). Solved: ``R >= 0.8``.

Run it with a KL penalty to the reference model (e.g. ``GRPO(policy, env,
frozen_copy(policy), beta=0.05)``): the sentiment score alone is maximised by a
string of positive words ("great great wonderful love"), and the KL term is what
keeps the continuation fluent and on topic, as in RL4LMs. Report the KL next to
the reward.

Without ``vaderSentiment`` the task is listed as unavailable by ``lmgym tasks``
and making it raises an ``ImportError`` that names the install command.
``split`` holds out ``eval_fraction`` of ``dataset_size`` distinct openings drawn
under ``data_seed``. Default budget: 48 tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.rewards import FunctionReward
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt, distinct_draws
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.extras import require
from lmgym.types import Prompt

SOLVED_THRESHOLD = 0.8
DEFAULT_MAX_NEW_TOKENS = 48
Openings = Literal["mixed", "neutral", "negative"]
NEUTRAL_TEMPLATES = (
    "I watched {title} last weekend, and",
    "{title} is a {genre} film that",
    "When I first heard about {title}, I",
    "The plot of {title} follows a family who",
    "As a fan of {genre} movies, I went into {title} expecting",
    "I rented {title} on a rainy night and",
    "The acting in {title} is",
    "After two hours of {title}, I",
    "The ending of {title}",
    "My sister recommended {title}, a {genre} film, and",
)
NEGATIVE_TEMPLATES = (
    "I had low expectations for {title}, and",
    "The first half of {title} is painfully slow, but",
    "My friends told me {title} was overrated, so",
    "I almost walked out of {title} after the first scene, but",
    "Critics hated {title}, and honestly",
    "The trailer for {title} made it look like a boring {genre} film, and",
    "I was bored during the opening of {title}, yet",
    "The script of {title} has a few clumsy lines, and",
    "On paper, {title} is just another tired {genre} film, and",
    "I did not expect much from a {genre} film like {title}, and",
)
TITLES = (
    "Midnight Harbor", "The Last Orchard", "Paper Lanterns", "Iron Valley", "The Quiet Hour",
    "Northern Lights", "A Glass of Rain", "The Clockmaker", "Silver Creek", "Broken Compass",
    "The Long Summer", "Velvet Streets", "Echoes of June", "The Salt Road", "Harvest Moon",
    "The Lighthouse Keeper", "Crimson Sky", "Ten Small Doors", "The Winter Guest", "Low Tide",
)  # fmt: skip
GENRES = ("drama", "comedy", "thriller", "science fiction", "horror", "romance", "western", "war")
QUESTION = "Continue this movie review: {opening}"


def vader_analyzer() -> Any:
    """VADER's ``SentimentIntensityAnalyzer`` from the ``vaderSentiment`` package.

    Raises:
        ImportError: the package is not installed (the message says how to fix it).
    """
    vader = require(
        "vaderSentiment.vaderSentiment",
        "sentiment",
        "lmgym/PositiveContinuation-v0's reward (VADER)",
    )
    return vader.SentimentIntensityAnalyzer()


class VaderSentiment:
    """``R_i = compound(completion_i)``: VADER's compound score in ``[-1, 1]``, batched
    over rows (VADER scores one string at a time; it is a lexicon, a few microseconds
    per short text).
    """

    def __init__(self) -> None:
        self.analyzer = vader_analyzer()
        self.__name__ = "vader_compound"

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        return [float(self.analyzer.polarity_scores(c)["compound"]) for c in completions]


def review_openings(
    openings: Openings = "mixed", dataset_size: int = 300, data_seed: int = 0
) -> list[str]:
    """``dataset_size`` distinct review openings drawn under ``data_seed``.

    Raises:
        ValueError: an unknown ``openings`` or a ``dataset_size`` out of range.
    """
    templates = {
        "mixed": NEUTRAL_TEMPLATES + NEGATIVE_TEMPLATES,
        "neutral": NEUTRAL_TEMPLATES,
        "negative": NEGATIVE_TEMPLATES,
    }.get(openings)
    if templates is None:
        raise ValueError(f"openings={openings!r}: must be 'mixed', 'neutral' or 'negative'")

    def draw(rng: random.Random) -> str:
        return rng.choice(templates).format(title=rng.choice(TITLES), genre=rng.choice(GENRES))

    distinct = len({t.format(title=x, genre=g) for t in templates for x in TITLES for g in GENRES})
    return distinct_draws(draw, dataset_size, distinct, data_seed, "dataset_size")


@dataclass(frozen=True, kw_only=True)
class PositiveContinuationParams(ChatSplit):
    """PositiveContinuation's parameters (and ``ChatSplit``'s: ``chat`` asks to
    continue the review in a chat prompt, ``False`` gives the opening itself;
    ``data_seed`` also seeds the openings).

    Attributes:
        openings: ``"mixed"``, ``"neutral"`` or ``"negative"`` (harder) templates.
        dataset_size: distinct openings drawn (before the split).
    """

    openings: Openings = "mixed"
    dataset_size: int = 300


@task_factory(PositiveContinuationParams)
def make_positive_continuation_vector(
    options: EnvOptions, params: PositiveContinuationParams
) -> TokenVectorEnv:
    """``lmgym/PositiveContinuation-v0`` as a native vector env (VADER compound reward;
    parameters: ``PositiveContinuationParams``); token budget 48 by default.

    Raises:
        ImportError: ``vaderSentiment`` is not installed.
    """
    reward = FunctionReward(VaderSentiment(), name="vader_compound")  # fails first if missing
    texts = review_openings(params.openings, params.dataset_size, params.data_seed)
    chat = params.wants_chat(options.tokenizer)
    prompts = [chat_prompt(QUESTION.format(opening=t)) if chat else t for t in texts]
    pairs = [(prompt, text) for prompt, text in zip(prompts, texts, strict=True)]
    kept = [prompt for prompt, _ in params.select(pairs)]
    return build_env(options, kept, reward, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


make_positive_continuation = single_env_factory(make_positive_continuation_vector)
