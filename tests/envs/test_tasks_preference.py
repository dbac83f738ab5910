"""The Preference task: a Bradley–Terry reward model trained locally, saved with
``save_pretrained``, reloaded, and used by the env inside ``step``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from lmgym.char_tokenizer import DEFAULT_CHARS
from lmgym.envs import SequenceClassifierReward
from lmgym.envs.tasks.preference import (
    SETTINGS_FILE,
    PreferenceRMConfig,
    WinRateReward,
    bradley_terry_loss,
    load_preference_reward,
    make_preference_pairs,
    make_preference_vector,
    preference_accuracy,
    random_completions,
    train_preference_reward_model,
    vowel_count,
)

EOS = 1


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return train_preference_reward_model(tmp_path_factory.mktemp("rm") / "preference_rm")


def test_bradley_terry_loss_closed_form():
    chosen, rejected = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def test_pairs_follow_the_hidden_rule():
    assert vowel_count("banana split") == 4
    pairs = make_preference_pairs(200, seed=5)
    assert len(pairs) == 200
    assert all(vowel_count(chosen) > vowel_count(rejected) for _, chosen, rejected in pairs)
    assert make_preference_pairs(200, seed=5) == pairs


def test_reward_model_ranks_held_out_pairs_well_above_chance(rm_path):
    # Saved with save_pretrained: loadable by the plain transformers API.
    model = AutoModelForSequenceClassification.from_pretrained(rm_path)
    assert model.config.num_labels == 1
    reward = load_preference_reward(rm_path)
    assert isinstance(reward, SequenceClassifierReward)
    held_out = make_preference_pairs(300, seed=1234)  # a seed no training pair used
    assert preference_accuracy(reward, held_out) >= 0.8
    # Also on plain uniform random text, the kind a fresh policy writes.
    generator = torch.Generator().manual_seed(7)
    texts = random_completions(600, 8, DEFAULT_CHARS, generator)
    uniform = [
        ("write:", *((a, b) if vowel_count(a) > vowel_count(b) else (b, a)))
        for a, b in zip(texts[::2], texts[1::2], strict=True)
        if vowel_count(a) != vowel_count(b)
    ]
    assert len(uniform) > 100
    assert preference_accuracy(reward, uniform) >= 0.8
    recorded = json.loads((rm_path / SETTINGS_FILE).read_text())
    assert recorded["held_out_accuracy"] >= 0.8


def test_a_trained_model_is_reused_and_a_foreign_directory_is_refused(rm_path, tmp_path):
    stamp = (rm_path / SETTINGS_FILE).stat().st_mtime_ns
    assert train_preference_reward_model(rm_path) == rm_path
    assert (rm_path / SETTINGS_FILE).stat().st_mtime_ns == stamp  # not retrained
    with pytest.raises(FileExistsError, match="holds no reward model trained with these settings"):
        train_preference_reward_model(rm_path, PreferenceRMConfig(seed=1))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        train_preference_reward_model(tmp_path)


def test_env_scores_completions_with_the_reward_model_inside_step(rm_path):
    env = make_preference_vector(num_envs=3, reward_model_path=rm_path)
    assert isinstance(env.reward_model, WinRateReward)
    env.reset(seed=0)
    completions = ["aeiouaei", "zzzzzzzz", "bcdfgaei"]
    seqs = [env.tokenizer(c, add_special_tokens=False)["input_ids"] for c in completions]
    for t in range(8):
        _, reward, _, truncated, _ = env.step(torch.tensor([s[t] for s in seqs]))
    assert truncated.all()
    vowels, consonants, some = reward.tolist()
    assert vowels > 0.9 > 0.4 > consonants  # win rate against the data's completions
    assert consonants < some < vowels

    raw = make_preference_vector(num_envs=3, reward_model_path=rm_path, score="logit")
    assert isinstance(raw.reward_model, SequenceClassifierReward)
    prompts = [raw.prompt_table.texts[i] for i in raw.reset(seed=0)[1]["prompt_index"].tolist()]
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    for t in range(8):
        _, logits, *_ = raw.step(torch.tensor([s[t] for s in seqs]))
    torch.testing.assert_close(logits, raw.reward_model.score_texts(texts))
