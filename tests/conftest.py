"""Shared fixtures: a character tokenizer, tiny models, and an env factory with an injectable reward.

Shared plain helpers live in ``tests/testkit/``; this file puts ``tests/`` on
``sys.path`` so that any test module can ``from testkit import ...``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy, make_tiny_model

# Appended, not prepended: only the name ``testkit`` is meant to resolve here.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from testkit import eos_biased_policy  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cases-per-test",
        type=int,
        default=0,
        metavar="K",
        help="run each parametrized test function on at most K of its cases, spread evenly "
        "over its parameter list (first and last included); 0, the default, runs them all. "
        "make test-fast uses it: every test function still runs, the matrices shrink.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    k = config.getoption("--cases-per-test")
    if k < 0:
        raise pytest.UsageError(f"--cases-per-test must be >= 0, got {k}")
    if not k:
        return
    cases: dict[str, list[pytest.Item]] = {}
    for item in items:
        if getattr(item, "callspec", None) is not None:
            cases.setdefault(f"{item.parent.nodeid}::{item.originalname}", []).append(item)
    dropped: set[int] = set()
    for group in cases.values():
        n = len(group)
        if n > k:
            kept = {round(i * (n - 1) / (k - 1)) for i in range(k)} if k > 1 else {0}
            dropped.update(id(item) for i, item in enumerate(group) if i not in kept)
    if dropped:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in dropped])
        items[:] = [item for item in items if id(item) not in dropped]


# Before any fixture: a session-scoped fixture is built before the function-scoped
# _one_thread below runs, and one built with the default thread count trained a
# different model (another summation order) than in a full run, where earlier tests
# had set one thread: tests/agents/test_saturation.py's results depended on the order.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # Tiny models: one thread is several times faster than two (OpenMP overhead
    # dominates [32, 64] matmuls, and a busy second core makes it far worse).
    torch.set_num_threads(1)


@pytest.fixture
def tokenizer():
    return make_char_tokenizer()


@pytest.fixture
def policy(tokenizer) -> CausalLMPolicy:
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)


def count_a(prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
    """Number of 'a' characters in each completion."""
    return [float(c.count("a")) for c in completions]


@pytest.fixture
def make_env(tokenizer) -> Callable[..., TokenVectorEnv]:
    """Build a TokenVectorEnv with sane defaults; any keyword overrides."""

    def factory(prompts: Sequence[str] = ("ab", "xyz"), reward=None, **kwargs) -> TokenVectorEnv:
        kwargs.setdefault("max_new_tokens", 4)
        return TokenVectorEnv(
            kwargs.pop("tokenizer", tokenizer),
            list(prompts),
            reward if reward is not None else FunctionReward(count_a),
            **kwargs,
        )

    return factory


@pytest.fixture
def ids(tokenizer) -> Callable[[str], list[int]]:
    """Token ids of a string under the character tokenizer."""
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture
def eos_policy(tokenizer) -> CausalLMPolicy:
    return eos_biased_policy(tokenizer)


@pytest.fixture
def make_eos_policy() -> Callable[..., CausalLMPolicy]:
    return eos_biased_policy


# ---------------------------------------------------------------- shared torchrun launches
# A torchrun rank pays seconds of imports (torch, transformers) before any work, so every
# module's scenarios of one kind share one launch per session; the tests that read it
# carry the launch's xdist_group, so it runs on one worker, once.
@pytest.fixture(scope="session")
def two_rank_train(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``(directory, the launch, outcome by name)``: every selected module's
    ``two_rank_scenarios`` in one launch of ``testkit.train_ranks`` (2 ranks)."""
    from testkit.train_ranks import shared_launch

    return shared_launch(request.session, tmp_path_factory.mktemp("two-rank-train"))


@pytest.fixture(scope="session")
def async_two_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """One torchrun launch (2 ranks) of every selected module's asynchronous scenarios
    (``testkit.async_launch``)."""
    from testkit.async_launch import launch_two_ranks

    return launch_two_ranks(request, tmp_path_factory)
