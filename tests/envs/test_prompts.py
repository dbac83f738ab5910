"""Prompt sources: JSONL files, dataset columns, deterministic splits and shuffles."""

from __future__ import annotations

import json

import pytest
import torch

from lmgym.envs import (
    DatasetColumn,
    JsonlPrompts,
    PromptSubset,
    RecordPrompts,
    shuffle_prompts,
    split_prompts,
)
from lmgym.envs.prompts import special_prefix


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
        (
            '{"prompt": 3}',
            r"p.jsonl:2: field 'prompt': expected a string or a list of chat messages .*, got int",
        ),
        (
            '{"prompt": [{"content": "hi"}]}',
            r"p.jsonl:2: field 'prompt': message 0 .* needs a string 'role' and a 'content'",
        ),
        ('{"prompt": "ok", "answer": "4"}', r"p.jsonl:2: fields differ .*\(extra \['answer'\]\)"),
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
    with pytest.raises(ValueError, match=r"dataset\['id'\]\[0\]: expected a string .*, got int"):
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


# ---------------------------------------------------------------- columns
def test_record_and_jsonl_sources_keep_the_other_fields_as_columns(tmp_path):
    records = [
        {"prompt": "2+2=", "answer": "4", "id": 7},
        {"prompt": "3+3=", "answer": "6", "id": 8},
    ]
    source = RecordPrompts(records)
    assert [source[0], source[1]] == ["2+2=", "3+3="]
    assert source.columns == {"answer": ["4", "6"], "id": [7, 8]}
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps(r) for r in records])
    assert JsonlPrompts(path).columns == {"answer": ["4", "6"], "id": [7, 8]}
    assert JsonlPrompts(path, field="answer").columns == {"prompt": ["2+2=", "3+3="], "id": [7, 8]}
    with pytest.raises(ValueError, match=r"records\[1\]: fields differ .*\(missing \['answer'\]\)"):
        RecordPrompts([{"prompt": "a", "answer": "1"}, {"prompt": "b"}])


def test_dataset_columns_are_the_other_columns_read_on_first_use():
    class CountingDataset(FakeDataset):
        reads: list[str] = []

        def __getitem__(self, key):
            self.reads.append(key)
            return super().__getitem__(key)

    ds = CountingDataset({"question": ["a?", "b?"], "answer": ["1", "2"], "image": [b"", b""]})
    source = DatasetColumn(ds, "question")
    assert list(source.columns) == ["answer", "image"] and ds.reads == ["question"]
    assert list(source.columns["answer"]) == ["1", "2"] and ds.reads == ["question", "answer"]


def test_a_subset_keeps_the_columns_of_its_rows():
    source = RecordPrompts([{"prompt": f"p{i}", "answer": str(i)} for i in range(10)])
    train, held_out = split_prompts(source, eval_fraction=0.3, seed=1)
    assert list(held_out.columns["answer"]) == [str(i) for i in held_out.indices]
    shuffled = shuffle_prompts(train, seed=2)
    assert [shuffled.columns["answer"][i] for i in range(len(shuffled))] == [
        shuffled[i][1:] for i in range(len(shuffled))
    ]


def test_a_column_of_the_wrong_length_is_an_error(tokenizer):
    from lmgym.envs import FunctionReward, TokenVectorEnv

    class Source(list):
        columns = {"answer": ["1"]}

    with pytest.raises(ValueError, match=r"columns\['answer'\] has 1 values for 2 prompts"):
        TokenVectorEnv(tokenizer, Source(["ab", "cd"]), FunctionReward(lambda p, c: [0.0] * len(c)))


# ---------------------------------------------------------------- chat and BOS
def real_ids(env, row: int) -> list[int]:
    table = env.prompt_table
    return table.ids[row][table.mask[row]].tolist()


def test_plain_prompts_get_bos_as_the_tokenizer_adds_it(make_env, bpe_tokenizer):
    tok = bpe_tokenizer
    env = make_env(prompts=["the cat", "sat on"], tokenizer=tok, prompt_order="sequential")
    assert real_ids(env, 0) == tok("the cat")["input_ids"]
    assert real_ids(env, 0)[0] == tok.bos_token_id and real_ids(env, 0).count(tok.bos_token_id) == 1
    assert special_prefix(tok) == [tok.bos_token_id]


def test_a_tokenizer_without_bos_adds_nothing(make_env, tokenizer, ids):
    assert special_prefix(tokenizer) == []
    env = make_env(prompts=["ab"], tokenizer=tokenizer)
    assert real_ids(env, 0) == ids("ab")


def test_chat_prompts_render_through_the_template_with_one_bos(make_env, bpe_tokenizer):
    tok = bpe_tokenizer
    chat = [{"role": "system", "content": "add"}, {"role": "user", "content": "3+4="}]
    seen = {}

    def record(prompts, completions):
        seen["prompts"] = prompts
        return [0.0] * len(prompts)

    from lmgym.envs import FunctionReward

    env = make_env(
        prompts=[chat, "the cat"],
        tokenizer=tok,
        reward=FunctionReward(record),
        num_prompts=2,
        max_new_tokens=1,
        prompt_order="sequential",
    )
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<s><|im_start|>system\nadd<|im_end|>\n")
    assert rendered.endswith("<|im_start|>assistant\n")
    expected = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    assert real_ids(env, 0) == list(expected["input_ids"])
    assert real_ids(env, 0).count(tok.bos_token_id) == 1
    assert real_ids(env, 1) == tok("the cat")["input_ids"]
    assert env.prompt_table.texts == [rendered, "the cat"]
    assert env.prompt_table.prompts[0] == chat
    env.reset(seed=0)
    env.step([tok.eos_token_id, tok.eos_token_id])
    assert seen["prompts"] == [chat, "the cat"]  # the reward sees the messages, like TRL's


def test_a_chat_prompt_needs_a_chat_template(make_env, tokenizer):
    with pytest.raises(ValueError, match="a chat prompt .* needs a tokenizer with a chat_template"):
        make_env(prompts=[[{"role": "user", "content": "hi"}]], tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"prompts\[0\]: expected a string or a list of chat"):
        make_env(prompts=[["hi"]], tokenizer=tokenizer)
