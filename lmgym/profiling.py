"""Named phases for ``torch.profiler``, and their times read back from a profile.

The rollout and update mark their phases with ``torch.profiler.record_function``
labels, so a profile shows where a step goes without wrapping lmgym's methods:

======================  ==========================================================
label                   phase
======================  ==========================================================
``lmgym.collect``       ``lmgym.rollout.collect`` / ``ContinuousCollector.collect``
``lmgym.act``           ``CausalLMPolicy.act`` (its own time: masks, positions, copies)
``lmgym.prefill``       ``act`` builds a fresh KV cache from the text
``lmgym.decode``        ``act`` feeds each row its one new token
``lmgym.restart``       ``act`` packs new text into the others' decode step: new
                        episodes' prompts and, in a multi-turn env, a row's ended
                        turn and the environment's observation (one packed step
                        may carry both, so one label covers both)
``lmgym.trunk``         the model's trunk forward (``hidden_states``), in any phase
``lmgym.lm_head``       the LM head on the last hidden states (``act``)
``lmgym.sample``        temperature/top-k/top-p and the draw (``act``)
``lmgym.teacher_forced``  the learner's trunk pass (``sequence_hidden``)
``lmgym.logprobs``      LM head, log-softmax and entropy of the teacher-forced pass
``lmgym.env_step``      ``TokenVectorEnv.step``
``lmgym.env_reset``     ``TokenVectorEnv.reset``
``lmgym.reward``        the reward model call inside the env
``lmgym.prepare``       ``Agent.prepare``: lp_old, lp_ref, V_old, rewards, advantages
``lmgym.loss``          ``Agent.micro_batch_loss`` (its own time: ratios, KL, aggregation)
``lmgym.backward``      the backward pass of a micro-batch's loss
``lmgym.optimizer``     gradient sync, norm, clipping and the optimizer step
``lmgym.metrics``       the update's metrics
``lmgym.comm``          a ``torch.distributed`` collective (data parallel)
======================  ==========================================================

Labels nest (``lmgym.trunk`` sits inside ``lmgym.decode``, itself inside
``lmgym.act``; ``lmgym.reward`` inside ``lmgym.env_step``). ``phase_times`` reports each label's time *exclusive* of the
lmgym labels nested in it, keyed by its path, e.g. ``"lmgym.decode/lmgym.trunk"``.

A label costs about 6 µs when entered with ``record_function``; ``phase`` enters it
only while a profiler runs, so unprofiled code pays a flag check (~0.1 µs).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.profiler import record_function

PREFIX = "lmgym."
COLLECT = "lmgym.collect"
ACT = "lmgym.act"
PREFILL = "lmgym.prefill"
DECODE = "lmgym.decode"
RESTART = "lmgym.restart"
TRUNK = "lmgym.trunk"
LM_HEAD = "lmgym.lm_head"
SAMPLE = "lmgym.sample"
TEACHER_FORCED = "lmgym.teacher_forced"
LOGPROBS = "lmgym.logprobs"
ENV_STEP = "lmgym.env_step"
ENV_RESET = "lmgym.env_reset"
REWARD = "lmgym.reward"
PREPARE = "lmgym.prepare"
LOSS = "lmgym.loss"
BACKWARD = "lmgym.backward"
OPTIMIZER = "lmgym.optimizer"
METRICS = "lmgym.metrics"
COMM = "lmgym.comm"

_OFF = contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """``with phase(DECODE): ...``: a ``record_function`` label while a profiler runs.

    Args:
        name: the label, one of this module's constants.

    Returns:
        A context manager: ``record_function(name)`` when a profiler is enabled,
        otherwise a shared no-op.
    """
    return record_function(name) if torch.autograd._profiler_enabled() else _OFF


@dataclass(frozen=True)
class PhaseTime:
    """One label path's time in a profile.

    Attributes:
        seconds: wall time inside the label minus the time inside the lmgym labels
            nested in it (exclusive), summed over its occurrences.
        calls: how many times the label was entered at this path.
    """

    seconds: float
    calls: int


def phase_times(events: Iterable[Any], prefix: str = PREFIX) -> dict[str, PhaseTime]:
    """Exclusive time per label path from a CPU profile.

    Args:
        events: the profile's function events, ``prof.events()`` of a finished
            ``torch.profiler.profile`` (each with ``name``, ``time_range`` and
            ``cpu_parent``).
        prefix: labels to report; other events (aten ops) count toward their
            nearest labelled ancestor.

    Returns:
        ``{path: PhaseTime}``, the path being the labels from the outermost to this
        one joined by ``/`` (e.g. ``"lmgym.restart/lmgym.trunk"``).
    """
    labelled = [e for e in events if e.name.startswith(prefix)]
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    path_of: dict[int, str] = {}

    def nearest_labelled_parent(event: Any) -> Any:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(prefix):
            parent = parent.cpu_parent
        return parent

    def path(event: Any) -> str:
        key = id(event)
        if key not in path_of:
            parent = nearest_labelled_parent(event)
            path_of[key] = event.name if parent is None else f"{path(parent)}/{event.name}"
        return path_of[key]

    for event in labelled:
        elapsed = event.time_range.elapsed_us() * 1e-6
        own = path(event)
        seconds[own] = seconds.get(own, 0.0) + elapsed
        calls[own] = calls.get(own, 0) + 1
        parent = nearest_labelled_parent(event)
        if parent is not None:
            seconds[path(parent)] = seconds.get(path(parent), 0.0) - elapsed
    return {key: PhaseTime(seconds[key], calls[key]) for key in calls}


F = TypeVar("F", bound=Callable[..., Any])


def labelled(name: str) -> Callable[[F], F]:
    """Decorator: run the function inside ``phase(name)``.

    Args:
        name: the label, one of this module's constants.

    Returns:
        A decorator that keeps the function's signature and docstring.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
