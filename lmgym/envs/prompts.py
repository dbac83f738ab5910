"""Prompt sources and prompt tables.

A prompt source is any finite indexable collection of strings
(``lmgym.types.PromptSource``): a plain list, or one of

- ``JsonlPrompts(path, field="prompt")``: one JSON object per line; the other
  fields stay available in ``records`` (e.g. a reference answer a reward looks up
  through ``RewardInput.prompt_index``);
- ``DatasetColumn(dataset, column)``: a column of a Hugging Face
  ``datasets.Dataset`` (``datasets`` is optional: lmgym never imports it, it only
  reads the object you pass);
- ``PromptSubset(source, indices)``: a view, as made by ``split_prompts`` (a
  deterministic train/eval split under a seed) and ``shuffle_prompts`` (a
  deterministic permutation under a seed).

The env itself draws prompts in a fresh random order on every pass, reproducible
under ``reset(seed=...)``; ``shuffle_prompts`` is for fixing an order up front
(e.g. with ``prompt_order="sequential"``).

``build_prompt_table`` tokenises a source once into a left-padded tensor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.types import PromptSource


class JsonlPrompts:
    """Prompts read from a JSON Lines file, one object per line.

    Args:
        path: the ``.jsonl`` file. Blank lines are skipped.
        field: the key holding the prompt string.

    Attributes:
        records: every line's object, in file order (prompt ``i`` is ``records[i][field]``).

    Raises:
        ValueError: a line that is not a JSON object, lacks ``field``, or whose
            ``field`` is not a string; the message gives the file and line number.
    """

    def __init__(self, path: str | Path, field: str = "prompt") -> None:
        self.path = Path(path)
        self.field = field
        self.records: list[dict[str, Any]] = []
        with self.path.open(encoding="utf-8") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{self.path}:{line_number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where}: not valid JSON ({err})") from err
                if not isinstance(record, dict):
                    raise ValueError(
                        f"{where}: expected a JSON object with a {field!r} field, "
                        f"got {type(record).__name__}"
                    )
                if field not in record:
                    raise ValueError(
                        f"{where}: no field {field!r} (keys: {sorted(record)}); pass "
                        "field=<the key that holds the prompt>"
                    )
                if not isinstance(record[field], str):
                    raise ValueError(
                        f"{where}: field {field!r} is {type(record[field]).__name__}, "
                        "expected a string"
                    )
                self.records.append(record)
        self._texts = [record[field] for record in self.records]

    def __len__(self) -> int:
        return len(self._texts)

    def __getitem__(self, index: int) -> str:
        return self._texts[index]

    def __repr__(self) -> str:
        return f"JsonlPrompts({str(self.path)!r}, field={self.field!r}, n={len(self)})"


class DatasetColumn:
    """One string column of a Hugging Face ``datasets.Dataset`` as a prompt source.

    The column is read once at construction. ``datasets`` is an optional
    dependency: lmgym never imports it; any object with ``column_names`` and
    column indexing (``dataset[column]``) works.

    Args:
        dataset: a ``datasets.Dataset`` (one split, not a ``DatasetDict``).
        column: the column holding the prompts.

    Attributes:
        dataset: the dataset, so a reward can read row ``prompt_index`` of other columns.

    Raises:
        TypeError: a ``DatasetDict``, a streaming ``IterableDataset`` or another object.
        ValueError: an unknown column or a non-string value (the row is named).
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
            if not isinstance(value, str):
                raise ValueError(
                    f"dataset[{column!r}][{row}] is {type(value).__name__}, expected a string"
                )
        self.dataset = dataset
        self.column = column
        self._texts: list[str] = values

    def __len__(self) -> int:
        return len(self._texts)

    def __getitem__(self, index: int) -> str:
        return self._texts[index]

    def __repr__(self) -> str:
        return f"DatasetColumn(column={self.column!r}, n={len(self)})"


class PromptSubset:
    """The prompts ``source[indices[0]], source[indices[1]], ...``.

    Attributes:
        source: the underlying prompt source.
        indices: positions in ``source``; prompt ``i`` of the subset is
            ``source[indices[i]]`` (use it to map a ``prompt_index`` back).
    """

    def __init__(self, source: PromptSource, indices: Sequence[int]) -> None:
        n = len(source)
        self.indices = [int(i) for i in indices]
        for i in self.indices:
            if not 0 <= i < n:
                raise IndexError(f"indices: {i} is outside the prompt source [0, {n})")
        self.source = source

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> str:
        return self.source[self.indices[index]]

    def __repr__(self) -> str:
        return f"PromptSubset(n={len(self)} of {len(self.source)})"


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
        texts: the prompt strings, in source order.
        ids: ``[num_prompts, width] int64`` left-padded token ids.
        mask: ``[num_prompts, width] bool`` True on real tokens.
        lengths: ``[num_prompts] int64`` tokens per prompt.
    """

    texts: list[str]
    ids: Tensor
    mask: Tensor
    lengths: Tensor

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def __len__(self) -> int:
        return len(self.texts)


def build_prompt_table(
    prompts: PromptSource,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    device: torch.device,
) -> PromptTable:
    """Tokenise ``prompts`` without special tokens and left-pad them.

    Args:
        max_prompt_length: Width of the prompt region; ``None`` uses the longest
            prompt. A longer prompt is an error, never silently cut.

    Raises:
        ValueError: empty source, a non-string prompt, a prompt that tokenises to
            nothing, or one longer than ``max_prompt_length``.
    """
    if len(prompts) == 0:
        raise ValueError("prompts: the prompt source is empty; pass at least one prompt")
    texts = [prompts[i] for i in range(len(prompts))]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"prompts[{i}]: expected a string, got {type(text).__name__}")
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
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
        texts=texts,
        ids=ids.to(device),
        mask=mask.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device),
    )
