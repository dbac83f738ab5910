"""Reward-model adapters and the validation every reward output goes through.

A reward model is any callable ``RewardInput -> [N] floats`` (``lmgym.types.RewardModel``).
The adapters cover the usual sources:

- ``FunctionReward``: a plain Python function over decoded prompt/completion strings,
  batched or per-sample, sync or ``async``, returning floats or tensors; it also gets
  the prompt source's columns it names as keyword arguments (a reference ``answer``);
- ``TokenScoreReward``: a per-token scorer ``RewardInput -> [N, T]``; the completion's
  reward is the sum of its token scores, so the env's per-token potential form hands
  back exactly each token's score;
- ``SequenceClassifierReward``: a transformers ``AutoModelForSequenceClassification``
  (re-tokenises the text with its own tokenizer, so it need not share the policy's);
- ``TokenModuleReward``: any torch module over token ids;
- ``CombinedReward``: a weighted sum of reward models whose components are kept
  apart for logging (``last_components``, ``pop_component_means``).

Errors. Anything unusable becomes a ``RewardError`` that names the reward (its
``name``) and, where one row is at fault, the row with its prompt and completion:
a function that raises, returns the wrong number of values or the wrong shape
(``[N]`` or ``[N, 1]``, never flattened from another shape), NaN/inf, a complex
number, or something that is not a number. A returned tensor is detached: the env
never holds a reward model's autograd graph. ``TokenVectorEnv.step`` computes every reward before it
commits any state, so after a ``RewardError`` the env is exactly as it was and the
same step can be retried.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lmgym.types import RewardInput, RewardModel


class RewardError(ValueError):
    """A reward model failed or returned something lmgym cannot use.

    Raised for a reward function that raises, a wrong number of values, a value
    that is not a real number, or NaN/inf. The message names the reward model and,
    where one row is at fault, the row (with its prompt and completion).
    """


def reward_name(reward: object) -> str:
    """A readable name for error messages and per-reward logs."""
    name = getattr(reward, "name", None)
    if isinstance(name, str):
        return name
    return getattr(reward, "__qualname__", type(reward).__qualname__)


def _row_text(batch: RewardInput, row: int) -> str:
    return f"prompt={batch.prompts[row]!r}, completion={batch.completions[row]!r}"


def _is_complex(value: Any) -> bool:
    """Whether ``value`` is a complex number, or a tensor or array of complex dtype."""
    if isinstance(value, Tensor):
        return value.is_complex()
    if isinstance(value, np.ndarray):
        return bool(np.iscomplexobj(value))
    return isinstance(value, complex | np.complexfloating)


def to_float(value: Any) -> float:
    """One reward value as a float; ``TypeError`` for anything but a real number (a
    complex one included: its imaginary part would be dropped)."""
    if _is_complex(value):
        raise TypeError(f"{value!r} ({type(value).__name__}) is complex, not a real number")
    if isinstance(value, Real | np.number):  # bool is an int, so it counts
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value.reshape(-1)[0].item())
    if isinstance(value, np.ndarray) and value.size == 1:
        return float(value.reshape(-1)[0])
    raise TypeError(f"{value!r} ({type(value).__name__}) is not a real number")


def _first_non_number(values: Sequence[Any]) -> int | None:
    """Index of the first element that is not a real number, or ``None``."""
    for i, value in enumerate(values):
        try:
            to_float(value)
        except TypeError:
            return i
    return None


def validate_rewards(
    values: Tensor | Sequence[float], batch: RewardInput, reward: RewardModel
) -> Tensor:
    """Convert a reward output to ``[N] float32`` and reject anything unusable.

    Args:
        values: the reward model's output: ``[N]`` (or ``[N, 1]``) real numbers.
        batch: the input it was computed on (``N`` rows).
        reward: the reward model, for the error message.

    Returns:
        ``[N] float32`` on the completions' device, detached from any autograd graph.

    Raises:
        RewardError: another shape than ``[N]`` / ``[N, 1]`` (named with the expected
            one), a complex value, a value that is not a real number, or NaN/inf;
            the message names the reward model and the offending row.
    """
    name = reward_name(reward)
    n = batch.completion_ids.shape[0]
    complex_row = _complex_row(values)
    if complex_row is not None:
        where = (
            "" if complex_row < 0 else f" for row {complex_row} ({_row_text(batch, complex_row)})"
        )
        raise RewardError(
            f"reward {name!r} returned complex values{where}; rewards must be real numbers "
            "(return the real part, or abs(), explicitly)"
        )
    if isinstance(values, str | bytes):
        raise RewardError(
            f"reward {name!r} returned {type(values).__name__} that is not a sequence of "
            "numbers; return one float per completion"
        )
    plain = values
    if isinstance(values, list | tuple):  # a graph is not a reward: each tensor detached
        plain = [v.detach() if isinstance(v, Tensor) else v for v in values]
    try:
        scores = torch.as_tensor(plain, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        where = ""
        if isinstance(values, list | tuple):
            row = _first_non_number(values)
            if row is not None:
                where = f"; row {row} is {values[row]!r}"
        raise RewardError(
            f"reward {name!r} returned {type(values).__name__} that is not a sequence of "
            f"numbers ({err}){where}; return one float per completion"
        ) from err
    # A tensor that requires grad keeps its autograd graph (and the reward model's
    # activations) alive for as long as the env holds the rewards: detached here.
    scores = scores.detach().to(batch.completion_ids.device)
    column = scores.dim() <= 1 or (scores.dim() == 2 and scores.shape[1] == 1)
    if column and scores.numel() != n:
        raise RewardError(
            f"reward {name!r} returned {scores.numel()} values for {n} completions; "
            "return exactly one float per completion, in input order"
        )
    if not column:
        raise RewardError(
            f"reward {name!r} returned shape {list(scores.shape)} for {n} completions; "
            f"return shape [{n}] (or [{n}, 1]): exactly one float per completion, in input "
            "order"
        )
    scores = scores.reshape(-1)
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise RewardError(
            f"reward {name!r} returned {scores[row].item()} for row {row} "
            f"({_row_text(batch, row)}); "
            "rewards must be finite: map failures to a finite penalty instead"
        )
    return scores


def _complex_row(values: Any) -> int | None:
    """The first row of a reward output holding a complex number (-1: the output as a
    whole is complex, no row named), or ``None``."""
    if isinstance(values, Tensor | np.ndarray):
        if not _is_complex(values):
            return None
        flat = values.reshape(-1)
        imaginary = flat.imag != 0
        hit = imaginary.nonzero()[0] if isinstance(flat, np.ndarray) else imaginary.nonzero()
        return int(hit[0]) if len(hit) and values.ndim == 1 else -1
    if isinstance(values, list | tuple):
        return next((row for row, value in enumerate(values) if _is_complex(value)), None)
    return -1 if _is_complex(values) else None  # one complex scalar for the whole batch


def call_reward(reward: RewardModel, batch: RewardInput) -> Tensor:
    """Call ``reward`` on ``batch`` and validate the output: ``[N] float32``.

    An exception raised by the reward model becomes a ``RewardError`` naming it
    (a ``RewardError`` passes through unchanged).
    """
    try:
        values = reward(batch)
    except RewardError:
        raise
    except Exception as err:
        raise RewardError(
            f"reward {reward_name(reward)!r} raised {type(err).__name__}: {err} "
            f"on a batch of {len(batch)} completions; fix the reward or catch the "
            "failure and return a finite penalty"
        ) from err
    return validate_rewards(values, batch, reward)


# ----------------------------------------------------------------- functions
def _run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Run an awaitable (a coroutine) to completion from synchronous code.

    Inside a running event loop (a notebook, an async server) ``asyncio.run`` is
    not allowed, so the coroutine then runs on a fresh loop in a worker thread.
    """

    async def wrapper() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrapper())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrapper()).result()


@dataclass(frozen=True)
class ColumnParameters:
    """Which prompt-source columns a reward function takes as keyword arguments.

    Attributes:
        named: its parameters after the first two (prompts and completions), by name.
        required: those of ``named`` without a default.
        takes_all: it has ``**kwargs``: every column is passed.
        text: the names of its first two parameters (never column names).
    """

    named: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    takes_all: bool = False
    text: tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> ColumnParameters:
        """Read ``fn``'s signature; a callable without one takes no columns."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return cls()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        text = [p for p in params if p.kind in kinds][:2]
        rest = [
            p
            for p in params
            if p not in text
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        return cls(
            named=tuple(p.name for p in rest),
            required=tuple(p.name for p in rest if p.default is p.empty),
            takes_all=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
            text=tuple(p.name for p in text),
        )

    def select(self, columns: Mapping[str, Sequence[Any]]) -> list[str]:
        """The column names to pass, in order: the named ones present, then (with
        ``**kwargs``) every other column."""
        names = [name for name in self.named if name in columns]
        if self.takes_all:
            names += [n for n in columns if n not in names and n not in self.text]
        return names


class FunctionReward:
    """Wrap a Python function over decoded strings as a reward model.

    Columns. The function may take per-prompt fields of the prompt source (its
    ``columns``: a JSONL file's other fields, a dataset's other columns) as keyword
    arguments after the first two: ``fn(prompts, completions, answer)`` gets
    ``answer=[one value per row]`` when batched, ``fn(prompt, completion, answer)``
    gets the row's value per sample; ``**kwargs`` gets every column. A parameter
    with a default is passed only if the column exists; one without is required
    (the env checks ``required_columns`` when it is built).

    Args:
        fn: ``fn(prompts: list, completions: list[str], **columns) -> [N] floats``
            when ``batched`` (default), else ``fn(prompt, completion: str, **columns)
            -> float`` called once per row. Prompts are as the source gives them
            (strings, or message lists for chat prompts). It may return floats, a list
            of floats, a tensor or a numpy array, and may be an ``async def`` function
            (per-sample async functions run concurrently with ``asyncio.gather``).
        batched: Whether ``fn`` takes whole lists.
        name: Name used in errors and logs (default: the function's name).

    Attributes:
        required_columns: the columns ``fn`` cannot do without.

    Raises (when called):
        RewardError: ``fn`` raised (per-sample: names the row, its prompt and
            completion), returned something that is not a real number, or needs a
            column the batch does not have.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        batched: bool = True,
        name: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.batched = batched
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.column_parameters = ColumnParameters.of(fn)
        self.required_columns = self.column_parameters.required

    def _columns(self, batch: RewardInput) -> dict[str, list[Any]]:
        """The column keyword arguments for ``fn``: ``{name: [value per row]}``."""
        missing = [c for c in self.required_columns if c not in batch.columns]
        if missing:
            raise RewardError(
                f"reward {self.name!r} takes {missing[0]!r}, which is not a column of the "
                f"prompt source (its columns: {sorted(batch.columns)}); give every prompt "
                f"a {missing[0]!r} field (JsonlPrompts and RecordPrompts keep every field "
                "but the prompt) or give the parameter a default"
            )
        return {
            name: list(batch.columns[name]) for name in self.column_parameters.select(batch.columns)
        }

    def _raised(self, err: Exception, batch: RewardInput, row: int | None) -> RewardError:
        where = (
            f"on row {row} ({_row_text(batch, row)})"
            if row is not None
            else f"on a batch of {len(batch)} completions"
        )
        return RewardError(
            f"reward {self.name!r} raised {type(err).__name__}: {err} {where}; fix the "
            "function or catch the failure and return a finite penalty"
        )

    def __call__(self, batch: RewardInput) -> Tensor | Sequence[float]:
        prompts, completions = list(batch.prompts), list(batch.completions)
        columns = self._columns(batch)
        if self.batched:
            try:
                out = self.fn(prompts, completions, **columns)
                if inspect.isawaitable(out):
                    out = _run_awaitable(out)
            except RewardError:
                raise
            except Exception as err:
                raise self._raised(err, batch, None) from err
            return out
        values = self._per_sample(prompts, completions, columns, batch)
        floats = []
        for row, value in enumerate(values):
            try:
                floats.append(to_float(value))
            except TypeError as err:
                raise RewardError(
                    f"reward {self.name!r} returned {value!r} for row {row} "
                    f"({_row_text(batch, row)}), which is not a real number; "
                    "return one float per completion"
                ) from err
        return torch.tensor(floats, dtype=torch.float32)

    def _per_sample(
        self,
        prompts: list[Any],
        completions: list[str],
        columns: dict[str, list[Any]],
        batch: RewardInput,
    ) -> list[Any]:
        values: list[Any] = []
        pending: dict[int, Awaitable[Any]] = {}
        for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            try:
                value = self.fn(prompt, completion, **{k: v[row] for k, v in columns.items()})
            except Exception as err:
                for awaitable in pending.values():  # never awaited: close to avoid a warning
                    close = getattr(awaitable, "close", None)
                    if close is not None:
                        close()
                raise self._raised(err, batch, row) from err
            if inspect.isawaitable(value):
                pending[row] = value
            values.append(value)
        if pending:

            async def gather() -> list[Any]:
                return await asyncio.gather(*pending.values(), return_exceptions=True)

            for row, result in zip(pending, _run_awaitable(gather()), strict=True):
                if isinstance(result, Exception):
                    raise self._raised(result, batch, row) from result
                values[row] = result
        return values


class TokenScoreReward:
    """A per-token scorer as a reward model.

    ``fn(batch) -> [N, T]`` scores every completion token (``T`` = the batch's
    completion width); the completion's reward is
    ``R = sum_t completion_mask[:, t] * s[:, t]``. With the env's
    ``reward_mode="per_token"`` (potential form) step ``t`` then receives exactly
    ``s_t``, provided appending a token does not change earlier tokens' scores (a
    causal scorer); in bandit mode the completion gets the sum.

    Args:
        fn: ``RewardInput -> [N, T] float`` tensor of per-token scores.
        name: Name used in errors and logs (default: the function's name).
    """

    def __init__(self, fn: Callable[[RewardInput], Tensor], name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, batch: RewardInput) -> Tensor:
        try:
            out = self.fn(batch)
        except RewardError:
            raise
        except Exception as err:
            raise RewardError(
                f"reward {self.name!r} raised {type(err).__name__}: {err} on a batch of "
                f"{len(batch)} completions; fix the scorer or return a finite penalty"
            ) from err
        mask = batch.completion_mask
        if not isinstance(out, Tensor) or out.shape != mask.shape:
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise RewardError(
                f"reward {self.name!r} returned {shape}; a per-token scorer must return a "
                f"tensor of shape {tuple(mask.shape)} ([N, T]: one score per completion token)"
            )
        if out.is_complex():
            raise RewardError(
                f"reward {self.name!r} returned complex token scores; scores must be real "
                "numbers (return the real part, or abs(), explicitly)"
            )
        scores = torch.where(mask, out.detach().float(), 0.0)
        bad = ~torch.isfinite(scores)
        if bool(bad.any()):
            row, col = (int(x) for x in bad.nonzero()[0])
            raise RewardError(
                f"reward {self.name!r} returned {scores[row, col].item()} for row {row}, token "
                f"{col} ({_row_text(batch, row)}); token scores must be finite"
            )
        return scores.sum(dim=1)


# ------------------------------------------------------------------- models
class SequenceClassifierReward:
    """Score prompt + completion with a transformers sequence-classification model.

    The text is re-tokenised with ``tokenizer`` (the reward model's own), so the
    reward model may use another vocabulary than the policy. The score is logit
    ``label_index`` of the model's output.

    Args:
        model: e.g. ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)``.
        tokenizer: The reward model's tokenizer; needs a pad token.
        label_index: Which output logit is the reward.
        max_length: Truncation length of the re-tokenised text (the model's limit).
        name: Name used in errors and logs.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        label_index: int = 0,
        max_length: int | None = None,
        name: str = "sequence_classifier",
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "tokenizer: the reward model's tokenizer has no pad token; "
                "set tokenizer.pad_token (e.g. to its eos token)"
            )
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.label_index = label_index
        self.max_length = max_length
        self.name = name

    @torch.no_grad()
    def score_texts(self, texts: Sequence[str]) -> Tensor:
        """``[N] float32`` scores of whole texts (prompt and completion already joined)."""
        enc = self.tokenizer(
            list(texts),
            return_tensors="pt",
            padding=True,
            truncation=self.max_length is not None,
            max_length=self.max_length,
        )
        device = next(self.model.parameters()).device
        out = self.model(**{k: v.to(device) for k, v in enc.items()})
        return out.logits[:, self.label_index].float()

    def __call__(self, batch: RewardInput) -> Tensor:
        texts = [p + c for p, c in zip(batch.prompt_texts, batch.completions, strict=True)]
        return self.score_texts(texts)


class TokenModuleReward:
    """Any torch module over token ids as a reward model.

    The module is called as ``module(input_ids [N, S] int64, attention_mask [N, S] bool)``
    on prompt and completion joined (left-padded prompt, right-padded completion:
    padding may sit inside the row, the mask says where) and must return ``[N]``
    (or ``[N, 1]``) scores.
    """

    def __init__(
        self, module: torch.nn.Module | Callable[[Tensor, Tensor], Tensor], name: str | None = None
    ):
        self.module = module
        self.name = name or type(module).__name__

    @torch.no_grad()
    def __call__(self, batch: RewardInput) -> Tensor:
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
        return self.module(ids, mask)  # its shape is checked, not flattened (validate_rewards)


# ----------------------------------------------------------------- combined
class CombinedReward:
    """A weighted sum of reward models, ``R = sum_k w_k * R_k``, components logged apart.

    Logging design: the env's ``step`` returns only the total (agents never read
    ``info``), so the components live on this object:

    - ``last_components``: ``{name: [N] float32}``, each component's unweighted
      values from the most recent call (its rows are that call's rows);
    - ``pop_component_means()``: the mean of each unweighted component over every
      *finished* completion scored since the previous pop, then reset. In bandit
      mode each completion is scored once, when it ends, so this is the per-batch
      mean of each component; in per-token mode only the final (whole-completion)
      score of each row is counted, never a prefix's. A learn loop calls it once
      per iteration and logs ``reward/<name>`` (``lmgym.envs.reward_component_means``
      does it for any env, returning ``{}`` when the reward is not combined).
      A completion the env never scores (``unfinished="penalty"``) is not counted.

    Args:
        terms: ``[(reward_model, weight), ...]``; component names (``reward.name``)
            must be distinct.
        name: Name of the total in errors and logs.

    Raises (when called):
        RewardError: a component raised or returned unusable values; the message
            names that component. The statistics are left as they were.
    """

    def __init__(self, terms: Sequence[tuple[RewardModel, float]], name: str = "combined") -> None:
        terms = list(terms)
        if not terms:
            raise ValueError("terms: pass at least one (reward, weight) pair")
        names: list[str] = []
        for i, term in enumerate(terms):
            if not (isinstance(term, tuple) and len(term) == 2):
                raise TypeError(f"terms[{i}]: expected a (reward, weight) pair, got {term!r}")
            reward, weight = term
            if not callable(reward):
                raise TypeError(
                    f"terms[{i}]: {type(reward).__name__} is not a reward model; wrap a plain "
                    "function with FunctionReward"
                )
            if not isinstance(weight, Real) or not math.isfinite(float(weight)):
                raise ValueError(f"terms[{i}]: weight={weight!r} must be a finite number")
            component = reward_name(reward)
            if component in names:
                raise ValueError(
                    f"terms[{i}]: two components are named {component!r}; give each a distinct "
                    "name (e.g. FunctionReward(fn, name='...')) so they can be logged apart"
                )
            names.append(component)
        self.rewards = [reward for reward, _ in terms]
        self.weights = [float(weight) for _, weight in terms]
        # The columns any component needs, so the env can check them when it is built.
        self.required_columns = tuple(
            dict.fromkeys(c for r in self.rewards for c in getattr(r, "required_columns", ()))
        )
        self.component_names = names
        self.name = name
        self.last_components: dict[str, Tensor] = {}
        self._sums = dict.fromkeys(names, 0.0)
        self._count = 0

    def __call__(self, batch: RewardInput) -> Tensor:
        components = {
            component: call_reward(reward, batch)
            for component, reward in zip(self.component_names, self.rewards, strict=True)
        }
        total = torch.zeros(len(batch), device=batch.completion_ids.device)
        for weight, values in zip(self.weights, components.values(), strict=True):
            total = total + weight * values
        # Commit statistics only once every component has succeeded.
        self.last_components = components
        finished = batch.finished.to(total.device)
        self._count += int(finished.sum())
        for component, values in components.items():
            self._sums[component] += float(values[finished].sum())
        return total

    def pop_component_means(self) -> dict[str, float]:
        """Mean of each component over finished completions since the last pop; resets.

        Returns:
            ``{name: mean}``; empty if no completion finished since the last pop.
        """
        means = (
            {name: total / self._count for name, total in self._sums.items()} if self._count else {}
        )
        self._sums = dict.fromkeys(self.component_names, 0.0)
        self._count = 0
        return means


def reward_component_means(env_or_reward: object) -> dict[str, float]:
    """``pop_component_means()`` of an env's reward model (or of a reward model).

    Returns ``{"reward/<name>": mean}`` for a ``CombinedReward`` (see its docstring),
    ``{}`` for any other reward model.
    """
    reward = getattr(env_or_reward, "reward_model", env_or_reward)
    pop = getattr(reward, "pop_component_means", None)
    if pop is None:
        return {}
    return {f"reward/{name}": value for name, value in pop().items()}
