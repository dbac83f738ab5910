"""Prompt sources and prompt tables.

A prompt source is any finite indexable collection of prompts
(``lmgym.types.PromptSource``): a plain list, or one of

- ``RecordPrompts(records, field="prompt")``: a list of dicts; the other fields
  become columns;
- ``JsonlPrompts(path, field="prompt")``: one JSON object per line; the other
  fields become columns (and stay available in ``records``);
- ``DatasetColumn(dataset, column)``: a column of a Hugging Face
  ``datasets.Dataset``; its other columns become columns (``datasets`` is optional:
  lmgym never imports it, it only reads the object you pass);
- ``PromptSubset(source, indices)``: a view, as made by ``split_prompts`` (a
  deterministic train/eval split under a seed) and ``shuffle_prompts`` (a
  deterministic permutation under a seed); it keeps the source's columns.

A prompt is a string or a chat conversation, a list of messages
``[{"role": "user", "content": "..."}]``. Columns (``source.columns``, ``{name:
one value per prompt}``) reach reward models as ``RewardInput.columns`` and as
keyword arguments of a ``FunctionReward`` function (e.g. a reference ``answer``).

The env itself draws prompts in a fresh random order on every pass, reproducible
under ``reset(seed=...)``; ``shuffle_prompts`` is for fixing an order up front
(e.g. with ``prompt_order="sequential"``).

``build_prompt_table`` tokenises a source once into a left-padded tensor:

- a plain-text prompt gets the special tokens the tokenizer puts *before* text
  (BOS for Llama-style tokenizers, nothing for GPT-2's), exactly as
  ``tokenizer(text)`` would, and never those it puts after (an EOS would end the
  text before the completion starts);
- a chat prompt is rendered with the tokenizer's chat template
  (``apply_chat_template(..., add_generation_prompt=True, tokenize=False)``) and
  tokenised without adding special tokens, as ``apply_chat_template(...,
  tokenize=True)`` does: the template already holds the BOS it wants.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.types import Prompt, PromptSource


def is_chat(prompt: object) -> bool:
    """Whether ``prompt`` is a chat conversation (a non-string sequence of mappings)."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str | bytes)
        and len(prompt) > 0
        and all(isinstance(message, Mapping) for message in prompt)
    )


def prompt_problem(prompt: object) -> str | None:
    """Why ``prompt`` is not a usable prompt, or ``None`` if it is one.

    A prompt is a string, or a non-empty list of messages, each a mapping with a
    string ``"role"`` and a ``"content"``.
    """
    if isinstance(prompt, str):
        return None
    if not is_chat(prompt):
        return (
            f"expected a string or a list of chat messages "
            f"([{{'role': 'user', 'content': ...}}]), got {type(prompt).__name__}"
        )
    for i, message in enumerate(prompt):
        if not isinstance(message.get("role"), str) or "content" not in message:
            return (
                f"message {i} ({dict(message)!r}) needs a string 'role' and a 'content' "
                "(e.g. {'role': 'user', 'content': '...'})"
            )
    return None


def _check_columns(columns: Mapping[str, Sequence[Any]], n: int) -> None:
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(
                f"columns[{name!r}] has {len(values)} values for {n} prompts; give every "
                "prompt one value"
            )


class RecordPrompts:
    """Prompts from a list of records (dicts), one per prompt; the other fields are columns.

    Args:
        records: e.g. ``[{"prompt": "2+3=", "answer": "5"}, ...]``.
        field: the key holding the prompt (a string or a list of chat messages).

    Attributes:
        records: the records, in order.
        columns: ``{name: [value per prompt]}`` for every key but ``field``.

    Raises:
        ValueError: a record that is not a dict, lacks ``field``, holds no usable
            prompt there, or has other keys than the first record (every record needs
            the same fields: use ``null``/``None`` for a missing value). The message
            names the record.
    """

    def __init__(
        self,
        records: Sequence[Mapping[str, Any]],
        field: str = "prompt",
        *,
        where: Callable[[int], str] | None = None,
    ) -> None:
        where = where or (lambda i: f"records[{i}]")
        self.field = field
        self.records: list[dict[str, Any]] = []
        names: list[str] | None = None
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise ValueError(
                    f"{where(i)}: expected a JSON object with a {field!r} field, "
                    f"got {type(record).__name__}"
                )
            if field not in record:
                raise ValueError(
                    f"{where(i)}: no field {field!r} (keys: {sorted(record)}); pass "
                    "field=<the key that holds the prompt>"
                )
            problem = prompt_problem(record[field])
            if problem is not None:
                raise ValueError(f"{where(i)}: field {field!r}: {problem}")
            keys = [key for key in record if key != field]
            if names is None:
                names = keys
            elif set(keys) != set(names):
                missing = sorted(set(names) - set(keys))
                extra = sorted(set(keys) - set(names))
                raise ValueError(
                    f"{where(i)}: fields differ from the first record's ("
                    + (f"missing {missing}" if missing else f"extra {extra}")
                    + "); every record needs the same fields (use null for a missing value)"
                )
            self.records.append(dict(record))
        self._prompts: list[Prompt] = [record[field] for record in self.records]
        self.columns: dict[str, list[Any]] = {
            name: [record[name] for record in self.records] for name in names or []
        }

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self._prompts[index]

    def __repr__(self) -> str:
        return f"RecordPrompts(field={self.field!r}, columns={list(self.columns)}, n={len(self)})"


MAX_LINE_BYTES = 1 << 20
"""JsonlPrompts' default bound on one line (1 MiB, far above any real prompt)."""


class JsonlPrompts(RecordPrompts):
    """Prompts read from a JSON Lines file, one object per line; the other fields are
    columns (``columns``, ``RewardInput.columns``).

    Args:
        path: the ``.jsonl`` file. Blank lines are skipped.
        field: the key holding the prompt (a string or a list of chat messages).
        max_line_bytes: a longer line is refused before it is parsed or tokenised
            (a hostile or corrupt file cannot cost minutes and gigabytes first).

    Attributes:
        records: every line's object, in file order (prompt ``i`` is ``records[i][field]``).
        columns: ``{name: [value per prompt]}`` for every key but ``field``.

    Raises:
        ValueError: a line longer than ``max_line_bytes``, not UTF-8, not JSON, nested
            too deeply to parse, not a JSON object, without ``field``, holding no
            usable prompt there, or with other keys than the first line; the message
            gives the file and line number.
    """

    def __init__(
        self, path: str | Path, field: str = "prompt", max_line_bytes: int = MAX_LINE_BYTES
    ) -> None:
        self.path = Path(path)
        records: list[Any] = []
        line_numbers: list[int] = []
        with self.path.open("rb") as f:
            line_number = 0
            while raw := f.readline(max_line_bytes + 1):
                line_number += 1
                where = f"{self.path}:{line_number}"
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    raise ValueError(
                        f"{where}: line longer than max_line_bytes={max_line_bytes}; refused "
                        "before parsing (raise max_line_bytes if such prompts are intended)"
                    )
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{where}: not UTF-8 ({err.reason} at byte {err.start})"
                    ) from None
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where}: not valid JSON ({err})") from err
                except RecursionError:
                    raise ValueError(f"{where}: JSON nested too deeply to parse") from None
                line_numbers.append(line_number)
        super().__init__(records, field, where=lambda i: f"{self.path}:{line_numbers[i]}")

    def __repr__(self) -> str:
        return f"JsonlPrompts({str(self.path)!r}, field={self.field!r}, n={len(self)})"


class _LazyColumns(Mapping[str, Sequence[Any]]):
    """``{name: values}`` read from ``read(name)`` on first access, then kept."""

    def __init__(self, names: Sequence[str], read: Callable[[str], Sequence[Any]]) -> None:
        self._names, self._read, self._cache = list(names), read, {}

    def __getitem__(self, name: str) -> Sequence[Any]:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._cache:
            self._cache[name] = self._read(name)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class DatasetColumn:
    """One prompt column of a Hugging Face ``datasets.Dataset`` as a prompt source; its
    other columns are columns (read on first use).

    The prompt column is read once at construction. ``datasets`` is an optional
    dependency: lmgym never imports it; any object with ``column_names`` and
    column indexing (``dataset[column]``) works.

    Args:
        dataset: a ``datasets.Dataset`` (one split, not a ``DatasetDict``).
        column: the column holding the prompts (strings or chat message lists).

    Attributes:
        dataset: the dataset.
        columns: ``{name: values}`` of every other column, read when first used.

    Raises:
        TypeError: a ``DatasetDict``, a streaming ``IterableDataset`` or another object.
        ValueError: an unknown column or a value that is not a prompt (the row is named).
    """

    def __init__(self, dataset: Any, column: str) -> None:
        names = getattr(dataset, "column_names", None)
        if isinstance(names, dict):
            raise TypeError(
                f"dataset: got a {type(dataset).__name__} of splits {sorted(names)}; pick one "
                "split, e.g. DatasetColumn(dataset['train'], column)"
            )
        if names is None:
            raise TypeError(
                f"dataset: expected a datasets.Dataset, got {type(dataset).__name__}; "
                "for a plain list of strings pass the list itself"
            )
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"dataset: a {type(dataset).__name__} has no length (a streaming dataset?); "
                "materialise it first, e.g. datasets.Dataset.from_list(list(ds.take(n)))"
            )
        if column not in names:
            raise ValueError(f"column={column!r} is not a column of the dataset {list(names)}")
        values = list(dataset[column])
        for row, value in enumerate(values):
            problem = prompt_problem(value)
            if problem is not None:
                raise ValueError(f"dataset[{column!r}][{row}]: {problem}")
        self.dataset = dataset
        self.column = column
        self._prompts: list[Prompt] = values
        self.columns: Mapping[str, Sequence[Any]] = _LazyColumns(
            [name for name in names if name != column], lambda name: list(dataset[name])
        )

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self._prompts[index]

    def __repr__(self) -> str:
        return f"DatasetColumn(column={self.column!r}, n={len(self)})"


class _Indexed(Sequence[Any]):
    """``values[indices[0]], values[indices[1]], ...`` without copying."""

    def __init__(self, values: Sequence[Any], indices: Sequence[int]) -> None:
        self._values, self._indices = values, indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        return self._values[self._indices[index]]


class PromptSubset:
    """The prompts ``source[indices[0]], source[indices[1]], ...``.

    Attributes:
        source: the underlying prompt source.
        indices: positions in ``source``; prompt ``i`` of the subset is
            ``source[indices[i]]`` (use it to map a ``prompt_index`` back).
        columns: the source's columns, seen through ``indices``.
    """

    def __init__(self, source: PromptSource, indices: Sequence[int]) -> None:
        n = len(source)
        self.indices = [int(i) for i in indices]
        for i in self.indices:
            if not 0 <= i < n:
                raise IndexError(f"indices: {i} is outside the prompt source [0, {n})")
        self.source = source
        parent = source_columns(source)
        self.columns: Mapping[str, Sequence[Any]] = _LazyColumns(
            list(parent), lambda name: _Indexed(parent[name], self.indices)
        )

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Prompt:
        return self.source[self.indices[index]]

    def __repr__(self) -> str:
        return f"PromptSubset(n={len(self)} of {len(self.source)})"


def source_columns(source: PromptSource) -> Mapping[str, Sequence[Any]]:
    """A prompt source's columns (``source.columns``), ``{}`` when it has none."""
    columns = getattr(source, "columns", None)
    if columns is None:
        return {}
    if not isinstance(columns, Mapping):
        raise TypeError(
            f"prompts: {type(source).__name__}.columns is {type(columns).__name__}; expected "
            "a mapping {name: one value per prompt}"
        )
    return columns


def _permutation(n: int, seed: int) -> list[int]:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(n, generator=generator).tolist()


def shuffle_prompts(source: PromptSource, seed: int) -> PromptSubset:
    """The prompts in a random order that depends only on ``seed`` and ``len(source)``."""
    return PromptSubset(source, _permutation(len(source), seed))


def split_prompts(
    source: PromptSource, eval_fraction: float, seed: int
) -> tuple[PromptSubset, PromptSubset]:
    """Split a prompt source into disjoint train and eval parts, deterministically.

    ``round(eval_fraction * n)`` prompts, chosen by a permutation seeded with
    ``seed``, go to eval; the rest to train. Each part keeps source order, and
    together they cover every prompt exactly once. The split depends only on
    ``seed`` and ``len(source)`` (not on the text), so duplicated prompt strings
    may land on both sides: deduplicate first if that matters.

    Args:
        source: any prompt source.
        eval_fraction: share of prompts held out, in ``(0, 1)``.
        seed: the split's seed.

    Returns:
        ``(train, eval)`` subsets.

    Raises:
        ValueError: ``eval_fraction`` outside ``(0, 1)``, or a split that would
            leave one side empty.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction!r}: must be in (0, 1)")
    n = len(source)
    num_eval = round(eval_fraction * n)
    if not 0 < num_eval < n:
        raise ValueError(
            f"eval_fraction={eval_fraction} of {n} prompts leaves "
            f"{'no eval' if num_eval == 0 else 'no train'} prompts; "
            "use more prompts or another eval_fraction"
        )
    order = _permutation(n, seed)
    return PromptSubset(source, sorted(order[num_eval:])), PromptSubset(
        source, sorted(order[:num_eval])
    )


@dataclass(frozen=True)
class PromptTable:
    """Every prompt of a source, tokenised once and left-padded to ``width``.

    Attributes:
        prompts: the prompts as given by the source, in source order (strings or chat
            message lists).
        texts: the text of each prompt: a plain prompt itself, a chat prompt as its
            chat template renders it.
        ids: ``[num_prompts, width] int64`` left-padded token ids.
        mask: ``[num_prompts, width] bool`` True on real tokens.
        lengths: ``[num_prompts] int64`` tokens per prompt.
        columns: the source's columns, ``{name: one value per prompt}``.
    """

    prompts: list[Prompt]
    texts: list[str]
    ids: Tensor
    mask: Tensor
    lengths: Tensor
    columns: Mapping[str, Sequence[Any]] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def __len__(self) -> int:
        return len(self.texts)


class RowColumns(Mapping[str, list[Any]]):
    """The columns of a prompt table for some rows, ``{name: [value per row]}``; a column
    is gathered only when read (what ``RewardInput.columns`` holds in an env).

    Args:
        columns: ``{name: one value per prompt}``.
        prompt_index: each row's prompt.
    """

    def __init__(self, columns: Mapping[str, Sequence[Any]], prompt_index: Sequence[int]) -> None:
        self._columns, self._index, self._cache = columns, prompt_index, {}

    def __getitem__(self, name: str) -> list[Any]:
        if name not in self._cache:
            values = self._columns[name]
            self._cache[name] = [values[i] for i in self._index]
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


def special_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids ``tokenizer(text)`` puts before the text's own tokens (e.g. ``[bos]``).

    Found by encoding a probe with and without special tokens; ``[]`` for a tokenizer
    that adds nothing (GPT-2, the character tokenizer) or only appends.
    """
    probe = "a"
    with_special = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start : start + len(plain)] == plain:
            return with_special[:start]
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and with_special[:1] == [bos] else []


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, Any]]) -> str:
    """A chat prompt as text, ready for the assistant's reply: the tokenizer's chat
    template with ``add_generation_prompt=True``.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "prompts: a chat prompt (a list of messages) needs a tokenizer with a "
            "chat_template; set tokenizer.chat_template, or pass plain-text prompts"
        )
    return tokenizer.apply_chat_template(
        [dict(message) for message in messages], add_generation_prompt=True, tokenize=False
    )


def build_prompt_table(
    prompts: PromptSource,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    device: torch.device,
) -> PromptTable:
    """Tokenise ``prompts`` (plain text with the tokenizer's leading special tokens, chat
    prompts through the chat template: see the module docstring) and left-pad them.

    Args:
        max_prompt_length: Width of the prompt region; ``None`` uses the longest
            prompt. A longer prompt is an error, never silently cut.

    Raises:
        ValueError: empty source, a value that is not a prompt, a chat prompt without a
            chat template, a prompt that tokenises to nothing, one longer than
            ``max_prompt_length``, or a column whose length is not the source's.
    """
    if len(prompts) == 0:
        raise ValueError("prompts: the prompt source is empty; pass at least one prompt")
    given = [prompts[i] for i in range(len(prompts))]
    for i, prompt in enumerate(given):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ValueError(f"prompts[{i}]: {problem}")
    columns = source_columns(prompts)
    _check_columns(columns, len(given))
    chat = [i for i, prompt in enumerate(given) if not isinstance(prompt, str)]
    texts = [p if isinstance(p, str) else render_chat(tokenizer, p) for p in given]
    encoded = [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    prefix = special_prefix(tokenizer)
    if prefix:
        chat_rows = set(chat)
        encoded = [ids if i in chat_rows else prefix + ids for i, ids in enumerate(encoded)]
    lengths = [len(ids) for ids in encoded]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(
                f"prompts[{i}] ({texts[i]!r}) tokenises to zero tokens; the policy needs at "
                "least one token to condition on: give every prompt some text"
            )
    width = max(lengths) if max_prompt_length is None else max_prompt_length
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[longest] > width:
        raise ValueError(
            f"prompts[{longest}] is {lengths[longest]} tokens, longer than "
            f"max_prompt_length={width}; raise max_prompt_length or shorten the prompt "
            "(prompts are never truncated silently)"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.bool)
    for i, row in enumerate(encoded):  # once per prompt at construction, not a hot path
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = True
    return PromptTable(
        prompts=given,
        texts=texts,
        ids=ids.to(device),
        mask=mask.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device),
        columns=columns,
    )
