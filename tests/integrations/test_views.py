"""Observation views: exact arrays on hand-built buffers, spaces, purity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.integrations import FullObservation, LastTokensObservation, TokenIdsObservation
from lmgym.integrations.sb3 import TokenEmbeddingExtractor


@pytest.fixture
def env() -> TokenVectorEnv:
    """Prompts "ab" and "c" (width 2, left-padded), budget 3; V = 8 (pad 0, eos 1, a=3..e=7)."""
    tokenizer = make_char_tokenizer("abcde")
    reward = FunctionReward(lambda prompts, completions: [0.0] * len(completions))
    return TokenVectorEnv(
        tokenizer, ["ab", "c"], reward, num_prompts=2, max_new_tokens=3, prompt_order="sequential"
    )


def test_last_tokens_exact_arrays(env):
    obs, _ = env.reset(seed=0)
    # Rows: "ab" | "" and "c" | "".
    view = LastTokensObservation(3)
    np.testing.assert_array_equal(view(env, obs).numpy(), [[8, 3, 4, 0], [8, 8, 5, 0]])
    obs, *_ = env.step(torch.tensor([7, 6]))  # "ab" + "e", "c" + "d"
    np.testing.assert_array_equal(view(env, obs).numpy(), [[3, 4, 7, 1], [8, 5, 6, 1]])
    obs, *_ = env.step(torch.tensor([5, 5]))
    np.testing.assert_array_equal(view(env, obs).numpy(), [[4, 7, 5, 2], [5, 6, 5, 2]])
    np.testing.assert_array_equal(LastTokensObservation(1)(env, obs).numpy(), [[5, 2], [5, 2]])
    as_ids = LastTokensObservation(3, as_ids=True)(env, obs)
    assert as_ids.dtype == torch.float32
    np.testing.assert_array_equal(as_ids.numpy(), [[4, 7, 5, 2], [5, 6, 5, 2]])


def test_views_land_in_their_spaces_and_leave_the_buffer_alone(env):
    obs, _ = env.reset(seed=0)
    before = {k: v.clone() for k, v in obs.items()}
    for view in (
        FullObservation(),
        TokenIdsObservation(),
        LastTokensObservation(2),
        LastTokensObservation(2, as_ids=True),
    ):
        space = view.observation_space(env)
        out = view(env, obs)
        batch = {k: v.numpy() for k, v in out.items()} if isinstance(out, dict) else out.numpy()
        for row in range(env.num_envs):
            single = (
                {k: v[row] for k, v in batch.items()} if isinstance(batch, dict) else batch[row]
            )
            assert space.contains(single), type(view).__name__
    for key in obs:
        assert torch.equal(obs[key], before[key])
    assert LastTokensObservation(2).observation_space(env) == spaces.MultiDiscrete([9, 9, 4])


def test_last_tokens_rejects_a_bad_k():
    with pytest.raises(ValueError, match=r"k=0: must be a positive integer"):
        LastTokensObservation(0)


def test_token_embedding_extractor_shapes_and_column_identity():
    space = spaces.Box(low=0.0, high=np.array([8.0, 8.0, 3.0], dtype=np.float32), dtype=np.float32)
    extractor = TokenEmbeddingExtractor(space, embed_dim=4)
    assert extractor.features_dim == 12 and extractor.embedding.num_embeddings == 9
    with torch.no_grad():
        extractor.column.copy_(torch.randn(3, 4))
        out = extractor(torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 3.0]]))
    assert out.shape == (2, 12)
    # The same id in two columns gives two different features.
    assert not torch.equal(out[0, :4], out[0, 4:8])
    with pytest.raises(TypeError, match="expected a 1-D Box of ids"):
        TokenEmbeddingExtractor(spaces.MultiDiscrete([3, 3]))
