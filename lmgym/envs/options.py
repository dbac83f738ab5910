"""The env options every task takes, declared once.

``EnvOptions`` is the record of a ``TokenVectorEnv``'s options that a task does not
fix itself: batching (``num_envs``, ``group_size``), the token budget, the turn
limit of a multi-turn env, the reward
mode and its forms, the unfinished-completion policy, stop ids, special tokens,
reset mode, prompt order, sharding, rendering, tokenizer and device. Each option's
default, check and conversion is written here and nowhere else: the env takes the
record (``TokenVectorEnv(tokenizer, prompts, reward, options)``, or its fields as
keywords, which this module turns into the record), ``--env KEY=VALUE`` is typed
from its fields (``OPTION_TYPES``), and every task's factory takes them all
(``lmgym.envs.task_factory``).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.special_tokens import AllowedSpecialTokens
from lmgym.typed_values import literal_choices

RewardMode = Literal["bandit", "per_token"]
PerTokenForm = Literal["potential", "dense"]
Unfinished = Literal["score", "penalty", "mask"]
PromptOrder = Literal["shuffle", "sequential"]
RenderMode = Literal["ansi"]
OnResponderTimeout = Literal["penalty", "raise"]

#: The options only a multi-turn env (built with a responder) takes, and the value
#: that means "not set" for each.
TURN_OPTIONS: dict[str, Any] = {
    "max_turns": None,
    "max_turn_tokens": None,
    "responder_timeout": None,
    "responder_park_after": None,
}

#: The token budget of an env whose options and task leave ``max_new_tokens`` unset.
DEFAULT_MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class EnvOptions:
    """Options every task accepts, in ``gymnasium.make_vec`` and ``gymnasium.make``
    alike, and the record a ``TokenVectorEnv`` keeps as ``env.options``.

    A task may change a default (``ArithmeticProcess`` defaults to
    ``reward_mode="per_token"``); its factory's signature shows the defaults it uses.
    Every value is checked when the record is made (a bad one is a ``ValueError``
    naming the field); ``shard``, ``device`` and ``unfinished_penalty`` are stored
    normalised (``(int, int)``, ``torch.device``, ``float``).

    Attributes:
        num_envs: ``N``, rows: ``num_prompts * group_size`` (``make_vec``'s ``num_envs``).
        group_size: ``G``, completions per prompt.
        max_new_tokens: ``L``, the token budget of a completion; ``None``: the task's
            default (``DEFAULT_MAX_NEW_TOKENS`` for a bare ``TokenVectorEnv``).
        max_prompt_length: Width of the prompt region; ``None``: the longest prompt.
        max_turns: Multi-turn envs (built with a responder) only: the most policy
            turns an episode may have; an episode whose responder has not ended it
            by then is truncated. ``None``: no turn limit (the token budget still
            bounds it).
        max_turn_tokens: Multi-turn envs only: the most tokens one policy turn may
            have; a turn that reaches it without a stop id truncates the episode
            there, as the budget does. ``None``: only the budget bounds a turn.
        responder_timeout: Multi-turn envs with a concurrent responder (``async def
            respond`` or ``thread_safe = True``) only: seconds each per-row call may
            take; ``None``: no limit (``lmgym.envs.turn_calls``).
        on_responder_timeout: What a late call means: ``"penalty"`` ends that row's
            episode as a cut-off one (``truncated``, no turn reward; under
            ``unfinished="penalty"`` its return is exactly ``unfinished_penalty``),
            ``"raise"`` raises ``ResponderTimeout`` naming the rows (the env is left
            as it was).
        responder_park_after: Autoreset multi-turn envs with a concurrent responder
            only: park the rows that wait for their environment (``None``, the
            default: ``step`` waits for every call). A number: ``step`` waits at most
            that many seconds for the calls it starts, then returns; a row whose call
            is still running is *parked* (``info["waiting"]``: its actions are
            ignored, it writes nothing) until a later step finds its answer
            (``lmgym.envs.turn_park``; ``ContinuousCollector`` keeps decoding the
            other rows meanwhile). ``0.005`` suits a responder whose fast answers
            take a few milliseconds.
        reward_mode: ``"bandit"`` (one score at the end) or ``"per_token"``.
        per_token_form: ``"potential"`` (differences of prefix scores) or ``"dense"``
            (the prefix score itself); per-token mode only.
        center_potential: Potential form only: subtract ``R(x, empty)``.
        unfinished: A completion cut at the budget: ``"score"``, ``"penalty"`` or ``"mask"``.
        unfinished_penalty: Episode return of a cut-off completion under ``"penalty"``.
        stop_token_ids: Ids that end a completion; ``None``: the tokenizer's EOS. Pass
            ``stop_ids_for(model, tokenizer)`` (or ``policy.stop_token_ids``) to stop
            on every id of the model's ``generation_config`` too.
        allowed_special_tokens: Special tokens (ids, token strings or ``"all"``) that
            are legal actions besides the stop ids; any other is refused
            (``lmgym.special_tokens``).
        autoreset: ``False`` episode-synchronous, ``True`` next-step autoreset.
        prompt_order: ``"shuffle"`` (a fresh permutation per pass, reproducible under
            ``reset(seed=...)``) or ``"sequential"``.
        shard: ``(rank, world_size)``: this env's share of a prompt stream shared by
            ``world_size`` data-parallel ranks; ``(0, 1)``: all of it.
        render_mode: ``None`` or ``"ansi"``.
        tokenizer: The policy's tokenizer; ``None``: the built-in character tokenizer.
        device: Where the env's tensors (and a task's reward model) live.
    """

    num_envs: int = 1
    group_size: int = 1
    max_new_tokens: int | None = None
    max_prompt_length: int | None = None
    max_turns: int | None = None
    max_turn_tokens: int | None = None
    responder_timeout: float | None = None
    on_responder_timeout: OnResponderTimeout = "penalty"
    responder_park_after: float | None = None
    reward_mode: RewardMode = "bandit"
    per_token_form: PerTokenForm = "potential"
    center_potential: bool = False
    unfinished: Unfinished = "score"
    unfinished_penalty: float = -1.0
    stop_token_ids: Sequence[int] | None = None
    allowed_special_tokens: AllowedSpecialTokens = ()
    autoreset: bool = False
    prompt_order: PromptOrder = "shuffle"
    shard: tuple[int, int] = (0, 1)
    render_mode: RenderMode | None = None
    tokenizer: PreTrainedTokenizerBase | None = field(default=None, repr=False)
    device: torch.device | str = "cpu"

    def __post_init__(self) -> None:
        for name, choices in _LITERAL_CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(
                    f"{name}={value!r} is not one of {[c for c in choices if c is not None]}"
                )
        num_prompts_of(self.num_envs, self.group_size)
        if self.max_new_tokens is not None:
            _check_positive("max_new_tokens", self.max_new_tokens)
        if self.max_turns is not None:
            _check_positive("max_turns", self.max_turns)
        if self.max_turn_tokens is not None:
            _check_positive("max_turn_tokens", self.max_turn_tokens)
        if self.responder_timeout is not None:
            timeout = self.responder_timeout
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, int | float | np.integer | np.floating)
                or not 0 < timeout < float("inf")
            ):
                raise ValueError(
                    f"responder_timeout={timeout!r}: must be a positive number of seconds "
                    "(or None: no limit)"
                )
            object.__setattr__(self, "responder_timeout", float(timeout))
        if self.responder_park_after is not None:
            park = self.responder_park_after
            if (
                isinstance(park, bool)
                or not isinstance(park, int | float | np.integer | np.floating)
                or not 0 <= park < float("inf")
            ):
                raise ValueError(
                    f"responder_park_after={park!r}: must be a number of seconds >= 0 "
                    "(or None: step waits for every responder call)"
                )
            object.__setattr__(self, "responder_park_after", float(park))
        # Frozen: the normalised values are written once, here.
        object.__setattr__(self, "shard", check_shard(self.shard))
        object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "unfinished_penalty", float(self.unfinished_penalty))

    @property
    def num_prompts(self) -> int:
        """``P = num_envs / group_size``, prompts drawn per reset."""
        return self.num_envs // self.group_size

    def text_tokenizer(self) -> PreTrainedTokenizerBase:
        """``tokenizer``, set: a task body's options always carry one (the factory
        fills a ``None`` with the character tokenizer).

        Raises:
            ValueError: it is ``None``.
        """
        if self.tokenizer is None:
            raise ValueError("tokenizer: not set; pass the policy's tokenizer")
        return self.tokenizer

    def stop_ids(self) -> list[int]:
        """The ids that end a completion: ``stop_token_ids``, else the tokenizer's EOS.

        Raises:
            ValueError: neither is set, or an id is outside the tokenizer's vocabulary.
        """
        tokenizer = self.tokenizer or make_char_tokenizer()
        if self.stop_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    "stop_token_ids: the tokenizer has no eos_token_id; pass stop_token_ids"
                )
            return [int(tokenizer.eos_token_id)]
        stop = [int(i) for i in self.stop_token_ids]
        if not stop or any(not 0 <= i < len(tokenizer) for i in stop):
            raise ValueError(
                f"stop_token_ids={stop}: need at least one id, each in [0, {len(tokenizer)})"
            )
        return stop

    def for_env(
        self, tokenizer: PreTrainedTokenizerBase, keywords: Mapping[str, Any]
    ) -> EnvOptions:
        """These options with ``keywords`` applied, complete for an env over ``tokenizer``.

        What ``TokenVectorEnv(tokenizer, prompts, reward, options, **keywords)`` does
        with its arguments. ``keywords`` are ``EnvOptions`` fields or ``num_prompts``,
        the env's count of prompts per reset: ``num_envs = num_prompts * group_size``,
        ``num_prompts`` staying this record's when only ``group_size`` is given. The
        result has ``tokenizer`` set, ``max_new_tokens`` resolved (``None``:
        ``DEFAULT_MAX_NEW_TOKENS``) and ``stop_token_ids`` resolved (``stop_ids``).

        Raises:
            TypeError: an unknown keyword, or both ``num_envs`` and ``num_prompts``.
            ValueError: ``tokenizer`` differs from the record's, or a bad value.
        """
        changes = dict(keywords)
        unknown = sorted(set(changes) - {*ENV_OPTION_NAMES, "num_prompts"})
        if unknown:
            raise TypeError(
                f"TokenVectorEnv() got unknown option(s) {unknown}; the options are "
                f"num_prompts and the fields of EnvOptions: {', '.join(ENV_OPTION_NAMES)}"
            )
        if "num_prompts" in changes and "num_envs" in changes:
            raise TypeError("TokenVectorEnv(): pass num_prompts or num_envs, not both")
        if "num_envs" not in changes:
            changes["num_envs"] = rows_of(
                changes.pop("num_prompts", self.num_prompts),
                changes.get("group_size", self.group_size),
            )
        if self.tokenizer is not None and self.tokenizer is not tokenizer:
            raise ValueError(
                "tokenizer: the options carry a different tokenizer than the env's; pass "
                "the same one (or leave the options' tokenizer None)"
            )
        options = replace(self, tokenizer=tokenizer, **changes)
        budget = options.max_new_tokens
        return replace(
            options,
            max_new_tokens=DEFAULT_MAX_NEW_TOKENS if budget is None else budget,
            stop_token_ids=tuple(options.stop_ids()),
        )


#: The ``EnvOptions`` field names, in declaration order.
ENV_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(EnvOptions))


#: Each ``EnvOptions`` field's type, e.g. ``{"max_new_tokens": int | None, ...}``: what
#: ``--env KEY=VALUE`` converts a value to (``lmgym.training.env_args``).
OPTION_TYPES: dict[str, Any] = typing.get_type_hints(EnvOptions)


#: The fields whose type is a ``Literal``, and the values each allows.
_LITERAL_CHOICES: dict[str, tuple[Any, ...]] = {
    name: (*choices, None) if type(None) in typing.get_args(hint) else choices
    for name, hint in OPTION_TYPES.items()
    if (choices := literal_choices(hint)) is not None
}


def _check_positive(field: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{field}={value!r}: must be a positive integer")
    return int(value)


def rows_of(num_prompts: object, group_size: object) -> int:
    """``num_envs = num_prompts * group_size``, after checking both are positive integers.

    Raises:
        ValueError: either is not, naming it.
    """
    return _check_positive("num_prompts", num_prompts) * _check_positive("group_size", group_size)


def num_prompts_of(num_envs: int, group_size: int) -> int:
    """``num_envs // group_size``, after checking both and that the division is exact."""
    _check_positive("group_size", group_size)
    if not isinstance(num_envs, int) or num_envs < 1 or num_envs % group_size != 0:
        raise ValueError(
            f"num_envs={num_envs} is not a multiple of group_size={group_size}; "
            "num_envs = num_prompts * group_size"
        )
    return num_envs // group_size


def check_shard(shard: object) -> tuple[int, int]:
    """``shard`` as ``(rank, world_size)`` ints, after checking ``0 <= rank < world_size``.

    Raises:
        ValueError: anything else, naming the field.
    """
    if (
        isinstance(shard, Sequence)
        and not isinstance(shard, str)
        and len(shard) == 2
        and all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in shard)
        and 0 <= shard[0] < shard[1]
    ):
        return int(shard[0]), int(shard[1])
    raise ValueError(
        f"shard={shard!r}: expected (rank, world_size) with 0 <= rank < world_size, "
        "e.g. (0, 1) for one process"
    )
