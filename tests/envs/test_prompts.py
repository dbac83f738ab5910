"""Prompt sources: JSONL files, dataset columns, deterministic splits and shuffles."""

from __future__ import annotations

import json

import pytest
import torch

from lmgym.envs import DatasetColumn, JsonlPrompts, PromptSubset, shuffle_prompts, split_prompts


def write_jsonl(path, lines: list[str]):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_prompts_keep_their_records(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            json.dumps({"prompt": "2+2=", "answer": "4"}),
            "",
            json.dumps({"prompt": "3+3=", "answer": "6"}),
        ],
    )
    source = JsonlPrompts(path)
    assert len(source) == 2 and [source[0], source[1]] == ["2+2=", "3+3="]
    assert source.records[1]["answer"] == "6"
    assert JsonlPrompts(path, field="answer")[0] == "4"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"p.jsonl:2: not valid JSON"),
        ('["a"]', r"p.jsonl:2: expected a JSON object with a 'prompt' field, got list"),
        ('{"text": "a"}', r"p.jsonl:2: no field 'prompt' \(keys: \['text'\]\); pass field="),
        ('{"prompt": 3}', r"p.jsonl:2: field 'prompt' is int, expected a string"),
    ],
)
def test_bad_jsonl_lines_name_the_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "ok"}', line])
    with pytest.raises(ValueError, match=message):
        JsonlPrompts(path)


def test_an_env_runs_on_a_jsonl_source(tmp_path, make_env):
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in ("ab", "xyz")])
    env = make_env(prompts=JsonlPrompts(path), num_prompts=2, prompt_order="sequential")
    _, info = env.reset(seed=0)
    assert env.prompt_table.texts == ["ab", "xyz"] and info["prompt_index"].tolist() == [0, 1]


class FakeDataset:
    """Duck-typed stand-in for ``datasets.Dataset`` (so this runs without ``datasets``)."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.column_names = list(columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, key):
        return self.columns[key]


def test_dataset_column_by_duck_typing():
    source = DatasetColumn(FakeDataset({"question": ["a?", "b?"], "id": [1, 2]}), "question")
    assert len(source) == 2 and source[1] == "b?"
    with pytest.raises(
        ValueError, match=r"column='q' is not a column of the dataset \['question', 'id'\]"
    ):
        DatasetColumn(FakeDataset({"question": ["a?"], "id": [1]}), "q")
    with pytest.raises(ValueError, match=r"dataset\['id'\]\[0\] is int, expected a string"):
        DatasetColumn(FakeDataset({"id": [1]}), "id")
    with pytest.raises(TypeError, match="for a plain list of strings pass the list itself"):
        DatasetColumn(["a", "b"], "text")


def test_dataset_column_of_a_real_dataset(make_env):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["ab", "xyz", "q"], "label": [0, 1, 0]})
    source = DatasetColumn(ds, "text")
    assert [source[i] for i in range(len(source))] == ["ab", "xyz", "q"]
    env = make_env(prompts=source, num_prompts=3)
    assert sorted(env.prompt_table.texts) == ["ab", "q", "xyz"]
    splits = datasets.DatasetDict({"train": ds})
    with pytest.raises(
        TypeError, match=r"pick one split, e.g. DatasetColumn\(dataset\['train'\], column\)"
    ):
        DatasetColumn(splits, "text")


def test_split_is_deterministic_disjoint_and_complete():
    prompts = [f"p{i}" for i in range(20)]
    train, held_out = split_prompts(prompts, eval_fraction=0.25, seed=7)
    assert (len(train), len(held_out)) == (15, 5)
    assert sorted(train.indices + held_out.indices) == list(range(20))
    assert train.indices == sorted(train.indices)  # source order kept
    assert [train[i] for i in range(len(train))] == [prompts[i] for i in train.indices]
    again = split_prompts(prompts, eval_fraction=0.25, seed=7)
    assert (again[0].indices, again[1].indices) == (train.indices, held_out.indices)
    assert split_prompts(prompts, eval_fraction=0.25, seed=8)[1].indices != held_out.indices


def test_split_errors_name_the_field():
    with pytest.raises(ValueError, match=r"eval_fraction=1.0: must be in \(0, 1\)"):
        split_prompts(["a", "b"], eval_fraction=1.0, seed=0)
    with pytest.raises(ValueError, match="eval_fraction=0.1 of 3 prompts leaves no eval prompts"):
        split_prompts(["a", "b", "c"], eval_fraction=0.1, seed=0)


def test_shuffle_is_a_seeded_permutation(make_env):
    prompts = [f"p{i}" for i in range(10)]
    shuffled = shuffle_prompts(prompts, seed=3)
    assert sorted(shuffled.indices) == list(range(10))
    assert shuffled.indices == shuffle_prompts(prompts, seed=3).indices
    generator = torch.Generator()
    generator.manual_seed(3)
    assert shuffled.indices == torch.randperm(10, generator=generator).tolist()
    env = make_env(prompts=shuffled, num_prompts=10, prompt_order="sequential")
    assert env.prompt_table.texts == [prompts[i] for i in shuffled.indices]
    with pytest.raises(IndexError, match=r"indices: 10 is outside the prompt source \[0, 10\)"):
        PromptSubset(prompts, [10])
