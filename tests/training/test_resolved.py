"""One resolved run record (issue 40, item 2): the user's ``TrainConfig`` is frozen and
never rewritten; the values a run derives from it (the prompt task's id, absolute
prompt paths, typed env arguments, chosen threads, the run directory) are computed
once into a ``ResolvedRun`` that the trainer, the checkpoints and ``config.json`` read."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from lmgym.agents import GRPOConfig
from lmgym.training import TrainConfig, Trainer
from lmgym.training.resolved import resolve
from lmgym.training.resume import FixedOnResumeError
from lmgym.training.user_code import prompt_task_id

SMALL = {
    "iterations": 1, "num_prompts": 2, "group_size": 2, "eval_prompts": 2, "eval_samples": 2,
    "samples": 0, "sample_every": 0, "log_interval": 0, "no_progress": True, "save_every": 1,
}  # fmt: skip


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    """A prompt file and a reward module in the current directory."""
    (tmp_path / "score_mod.py").write_text(
        "def exact(prompts, completions, **columns):\n    return [0.0] * len(completions)\n"
    )
    lines = [json.dumps({"prompt": f"q{i}:"}) + "\n" for i in range(20)]
    (tmp_path / "data.jsonl").write_text("".join(lines))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("score_mod", None)
    gym.registry.pop("prompts/data-v0", None)


def test_a_train_config_cannot_be_rewritten():
    config = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.iterations = 3  # type: ignore[misc]


def test_resolve_derives_each_value_and_leaves_the_users_config_as_it_was(data):
    config = TrainConfig(
        prompts="data.jsonl", reward="score_mod:exact", threads=0,
        env_kwargs={"max_new_tokens": "3"}, early_stop=True, stop_threshold=0.5,
    )  # fmt: skip
    before = copy.deepcopy(config)
    record = resolve(config, GRPOConfig())
    assert config == before
    path = str(data / "data.jsonl")
    assert record.env_id == record.config.task == prompt_task_id(path) == "prompts/data-v0"
    assert record.config.prompts == path
    assert record.config.env_kwargs == {"max_new_tokens": 3}
    assert record.config.threads >= 1
    (note,) = record.notes
    assert note.startswith(f"threads: {record.config.threads} (")
    assert note.endswith("; --threads 0 chose)")
    assert record.stop_threshold == 0.5
    assert record.imports["prompts"]["path"] == path
    assert record.imports["modules"] == {"score_mod": "reward"}


def test_config_json_saves_the_record_the_trainer_read_and_a_resume_reads_it_back(data):
    run_dir = data / "run"
    config = TrainConfig(
        prompts="data.jsonl", reward="score_mod:exact", threads=0, run_dir=str(run_dir),
        env_kwargs={"max_new_tokens": "2"}, **SMALL,
    )  # fmt: skip
    before = copy.deepcopy(config)
    trainer = Trainer(config, out=lambda line: None)
    trainer.run()
    assert config == before
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["run"] == json.loads(json.dumps(dataclasses.asdict(trainer.config)))
    assert saved["run"]["prompts"] == str(data / "data.jsonl")
    assert saved["run"]["env_kwargs"] == {"max_new_tokens": 2}
    assert saved["imports"] == trainer.resolved.imports
    lines: list[str] = []
    resumed = Trainer.resume(run_dir, changes={"iterations": 2}, out=lines.append)
    assert resumed.config == dataclasses.replace(trainer.config, iterations=2)
    assert lines[0] == f"importing the code named in {run_dir}/config.json: reward score_mod:exact"
    assert resumed.run().iteration == 2


def test_a_resume_compares_env_arguments_as_the_task_types_them(data):
    run_dir = data / "run"
    config = TrainConfig(run_dir=str(run_dir), env_kwargs={"max_new_tokens": 2}, **SMALL)
    Trainer(config, out=lambda line: None).run()
    same = Trainer.resume(run_dir, changes={"env_kwargs": {"max_new_tokens": "2"}})
    assert same.config.env_kwargs == {"max_new_tokens": 2}
    with pytest.raises(FixedOnResumeError, match=r"^env_kwargs=\{'max_new_tokens': 3\} differs"):
        Trainer.resume(run_dir, changes={"env_kwargs": {"max_new_tokens": "3"}})


def test_a_default_run_directory_is_recorded_once_created(data):
    config = TrainConfig(env_kwargs={"max_new_tokens": 2}, **SMALL)
    trainer = Trainer(config, out=lambda line: None)
    assert trainer.config.run_dir is None
    result = trainer.run()
    assert config.run_dir is None
    assert trainer.config.run_dir == str(result.run_dir)
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["run"]["run_dir"] == str(result.run_dir)
