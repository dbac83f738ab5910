"""Preference: maximise a *learned* reward model (RLHF in miniature).

The pipeline runs locally in seconds:

1. ``make_preference_pairs``: random completions of the task's prompts (each
   with its own vowel rate, so every vowel count occurs), paired; in each pair
   the completion with more vowels (``aeiou``, the hidden rule, ``vowel_count``)
   is *chosen*, the other *rejected* (ties are skipped).
2. ``train_preference_reward_model``: a tiny ``GPT2ForSequenceClassification``
   (``num_labels=1``) trained with the Bradley–Terry loss
   ``-log sigmoid(r(chosen) - r(rejected))``, saved with ``save_pretrained``
   (model and tokenizer) to a directory, by default a cache directory keyed by a
   hash of the settings (``~/.cache/lmgym/preference_rm/<hash>``; ``LMGYM_CACHE``
   or ``XDG_CACHE_HOME`` move it), so it is trained once per machine.
3. ``load_preference_reward``: ``AutoModelForSequenceClassification.from_pretrained``
   wrapped in ``SequenceClassifierReward``; the env scores prompt + completion
   with it inside ``step``.

Reward (default ``score="win_rate"``): the Bradley–Terry probability that the
completion beats a reference completion drawn like the preference data,
``R = (1/M) * sum_j sigmoid(r(x, y) - r_j)``, with ``r_j`` the reward model's
scores of ``M = 256`` such completions fixed at load time; range ``[0, 1]``, about
0.5 for a typical data completion, above 0.9 only for vowel-rich text (six or
more vowels in eight characters). ``score="logit"`` returns the raw score
``r(x, y)`` instead (unbounded). The policy never sees the hidden rule, only the learned
model, so a policy can exploit the model's mistakes (reward hacking); compare
against ``vowel_count`` to see it.

Random-policy baseline (uniform legal token ids, default settings): about 0.38.
Solved: ``R >= 0.9``. Per-token mode (potential form) scores every prefix with the
reward model: meaningful, but one reward-model call per step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    GPT2ForSequenceClassification,
    PreTrainedTokenizerFast,
)

from lmgym.char_tokenizer import DEFAULT_CHARS, make_char_tokenizer
from lmgym.envs.options import EnvOptions
from lmgym.envs.rewards import SequenceClassifierReward
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import TaskParams, build_env, task_factory
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.types import RewardInput

SOLVED_THRESHOLD = 0.9
VOWELS = frozenset("aeiou")
DEFAULT_PROMPTS = ("write:", "say:", "sing:", "hum:")
SETTINGS_FILE = "lmgym_preference.json"
Score = Literal["win_rate", "logit"]


def vowel_count(completion: str) -> int:
    """The hidden rule behind the preferences: how many of ``aeiou`` the text contains."""
    return sum(c in VOWELS for c in completion)


@dataclass(frozen=True)
class PreferenceRMConfig:
    """Everything that determines the trained reward model (its cache key).

    Attributes:
        prompts: prompts the pairs are drawn for.
        chars: characters of the random completions.
        max_completion_length: random completions have 0..this many characters.
        num_pairs: training pairs.
        steps: optimizer steps.
        batch_pairs: pairs per step.
        learning_rate: AdamW learning rate.
        n_layer: GPT-2 layers.
        n_embd: GPT-2 width.
        n_head: GPT-2 attention heads.
        seed: seeds the pairs, the initialisation and the batches.
    """

    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    chars: str = DEFAULT_CHARS
    max_completion_length: int = 8
    num_pairs: int = 4096
    steps: int = 200
    batch_pairs: int = 64
    learning_rate: float = 3e-3
    n_layer: int = 1
    n_embd: int = 32
    n_head: int = 2
    seed: int = 0

    def key(self) -> str:
        """A short hash of the settings: the cache directory's name."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def random_completions(
    count: int, max_length: int, chars: str, generator: torch.Generator
) -> list[str]:
    """``count`` strings of uniform length in ``[0, max_length]`` over uniform ``chars``."""
    lengths = torch.randint(0, max_length + 1, (count,), generator=generator).tolist()
    picks = torch.randint(0, len(chars), (count, max(max_length, 1)), generator=generator)
    return [
        "".join(chars[i] for i in row[:n]) for row, n in zip(picks.tolist(), lengths, strict=True)
    ]


def vowel_rich_completions(
    count: int, max_length: int, chars: str, generator: torch.Generator
) -> list[str]:
    """Like ``random_completions``, but each string draws a vowel rate ``q ~ U(0, 1)`` and
    each character is a vowel with probability ``q`` (else uniform over ``chars``), so
    pairs span every vowel count, not only the few a uniform string has."""
    texts = random_completions(count, max_length, chars, generator)
    rates = torch.rand(count, 1, generator=generator)
    width = max(max_length, 1)
    is_vowel = (torch.rand(count, width, generator=generator) < rates).tolist()
    vowels = torch.randint(0, 5, (count, width), generator=generator).tolist()
    return [
        "".join("aeiou"[v] if flag else c for c, flag, v in zip(text, flags, picks, strict=False))
        for text, flags, picks in zip(texts, is_vowel, vowels, strict=True)
    ]


def make_preference_pairs(
    count: int,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    max_length: int = 8,
    chars: str = DEFAULT_CHARS,
    seed: int = 0,
) -> list[tuple[str, str, str]]:
    """``(prompt, chosen, rejected)`` triples labelled by ``vowel_count`` (ties skipped)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    triples: list[tuple[str, str, str]] = []
    while len(triples) < count:
        n = count - len(triples)
        first = vowel_rich_completions(n, max_length, chars, generator)
        second = vowel_rich_completions(n, max_length, chars, generator)
        which = torch.randint(0, len(prompts), (n,), generator=generator).tolist()
        for p, a, b in zip(which, first, second, strict=True):
            if vowel_count(a) != vowel_count(b):
                chosen, rejected = (a, b) if vowel_count(a) > vowel_count(b) else (b, a)
                triples.append((prompts[p], chosen, rejected))
    return triples


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """``mean(-log sigmoid(r_chosen - r_rejected))`` over ``[P]`` pairs: a scalar."""
    return -F.logsigmoid(chosen_scores - rejected_scores).mean()


def default_cache_dir() -> Path:
    """``$LMGYM_CACHE``, else ``$XDG_CACHE_HOME/lmgym``, else ``~/.cache/lmgym``."""
    if os.environ.get("LMGYM_CACHE"):
        return Path(os.environ["LMGYM_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lmgym"


@contextmanager
def _single_thread() -> Iterator[None]:
    """A tiny model is overhead-bound: extra intra-op threads only add synchronisation
    (and are very slow on a busy machine). Restores the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _rm_tokenizer() -> PreTrainedTokenizerFast:
    # Right padding keeps GPT-2's default position ids aligned with the text, and
    # GPT2ForSequenceClassification pools the last non-pad token.
    tokenizer = make_char_tokenizer()
    tokenizer.padding_side = "right"
    return tokenizer


def train_preference_reward_model(
    path: str | Path | None = None,
    config: PreferenceRMConfig | None = None,
    overwrite: bool = False,
) -> Path:
    """Train the Bradley–Terry reward model and ``save_pretrained`` it (or reuse it).

    Args:
        path: output directory; default ``default_cache_dir()/preference_rm/<config.key()>``.
        config: the settings (default ``PreferenceRMConfig()``).
        overwrite: retrain even if ``path`` already holds a model trained with ``config``.

    Returns:
        The directory, loadable with ``AutoModelForSequenceClassification.from_pretrained``
        and ``AutoTokenizer.from_pretrained``; ``lmgym_preference.json`` in it records
        the settings and the held-out pair accuracy.

    Raises:
        FileExistsError: ``path`` holds something else (not a model trained with ``config``).
    """
    config = config or PreferenceRMConfig()
    path = Path(path) if path is not None else default_cache_dir() / "preference_rm" / config.key()
    settings = path / SETTINGS_FILE
    if path.exists() and not overwrite:
        if settings.exists() and json.loads(settings.read_text())["config"] == json.loads(
            json.dumps(asdict(config))
        ):
            return path
        raise FileExistsError(
            f"path={str(path)!r} exists but holds no reward model trained with these settings; "
            "pass another path, or overwrite=True to replace it"
        )

    tokenizer = _rm_tokenizer()
    longest_prompt = max(len(p) for p in config.prompts)
    model_config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=max(64, longest_prompt + config.max_completion_length),
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    pairs = make_preference_pairs(
        config.num_pairs, config.prompts, config.max_completion_length, config.chars, config.seed
    )
    held_out = make_preference_pairs(
        256, config.prompts, config.max_completion_length, config.chars, config.seed + 1
    )

    def encode(triples: Sequence[tuple[str, str, str]]) -> dict[str, Tensor]:
        texts = [p + c for p, c, _ in triples] + [p + r for p, _, r in triples]
        return dict(tokenizer(texts, return_tensors="pt", padding=True))

    with _single_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GPT2ForSequenceClassification(model_config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        generator = torch.Generator()
        generator.manual_seed(config.seed)
        model.train()
        for _ in range(config.steps):
            rows = torch.randint(0, len(pairs), (config.batch_pairs,), generator=generator)
            scores = model(**encode([pairs[i] for i in rows.tolist()])).logits[:, 0]
            loss = bradley_terry_loss(*scores.split(config.batch_pairs))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            chosen, rejected = model(**encode(held_out)).logits[:, 0].split(len(held_out))
        accuracy = float((chosen > rejected).float().mean())

    # Write to a sibling temp dir, then rename: a concurrent reader never sees half a model.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SETTINGS_FILE).write_text(
        json.dumps({"config": asdict(config), "held_out_accuracy": accuracy}, indent=2)
    )
    if path.exists():
        if not overwrite:  # another process finished the same model first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        shutil.rmtree(path)
    try:
        tmp.rename(path)
    except OSError:  # lost a race to another writer: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_preference_reward(
    path: str | Path, device: torch.device | str = "cpu"
) -> SequenceClassifierReward:
    """Reload a saved reward model (``from_pretrained``) as a ``SequenceClassifierReward``."""
    model = AutoModelForSequenceClassification.from_pretrained(path).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # Truncate at the model's context: a policy with another tokenizer may decode
    # to more characters than the model was trained on.
    max_length = getattr(model.config, "n_positions", None)
    return SequenceClassifierReward(model, tokenizer, max_length=max_length, name="preference_rm")


def preference_accuracy(
    reward: SequenceClassifierReward, triples: Sequence[tuple[str, str, str]]
) -> float:
    """Share of ``(prompt, chosen, rejected)`` triples the reward model ranks correctly."""
    chosen = reward.score_texts([p + c for p, c, _ in triples])
    rejected = reward.score_texts([p + r for p, _, r in triples])
    return float((chosen > rejected).float().mean())


class WinRateReward:
    """Bradley–Terry win probability against reference completions.

    ``R_i = (1/M) * sum_j sigmoid(r_i - r_j)`` with ``r_i`` the reward model's score
    of row ``i`` and ``r_j`` (``[M]``) its scores of reference completions; range
    ``[0, 1]``.

    Args:
        scorer: the reward model.
        reference_scores: ``[M] float32`` scores of the reference completions.
    """

    name = "preference_win_rate"

    def __init__(self, scorer: SequenceClassifierReward, reference_scores: Tensor) -> None:
        self.scorer = scorer
        self.reference_scores = reference_scores

    def __call__(self, batch: RewardInput) -> Tensor:
        scores = self.scorer(batch)
        reference = self.reference_scores.to(scores.device)
        return torch.sigmoid(scores[:, None] - reference[None, :]).mean(dim=1)


def make_preference_reward(
    path: str | Path,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    max_length: int = 8,
    score: Score = "win_rate",
    num_references: int = 256,
    device: torch.device | str = "cpu",
) -> SequenceClassifierReward | WinRateReward:
    """The task's reward: the reloaded model, as raw score or as win rate against
    ``num_references`` completions drawn like the preference data (fixed seed)."""
    if score not in ("win_rate", "logit"):
        raise ValueError(f"score={score!r} is not one of ['win_rate', 'logit']")
    scorer = load_preference_reward(path, device)
    if score == "logit":
        return scorer
    generator = torch.Generator()
    generator.manual_seed(12345)
    completions = vowel_rich_completions(num_references, max_length, DEFAULT_CHARS, generator)
    which = torch.randint(0, len(prompts), (num_references,), generator=generator).tolist()
    references = scorer.score_texts(
        [prompts[p] + c for p, c in zip(which, completions, strict=True)]
    )
    return WinRateReward(scorer, references)


@dataclass(frozen=True, kw_only=True)
class PreferenceParams(TaskParams):
    """Preference's parameters.

    Attributes:
        prompts: the prompts (also those the reward model is trained on).
        reward_model_path: a directory saved by ``train_preference_reward_model``; if it
            does not exist the model is trained into it; default the settings' cache dir.
        score: ``"win_rate"`` (in ``[0, 1]``) or ``"logit"`` (raw score).
    """

    prompts: Sequence[str] = DEFAULT_PROMPTS
    reward_model_path: str | Path | None = None
    score: Score = "win_rate"


@task_factory(PreferenceParams, max_new_tokens=8)
def make_preference_vector(options: EnvOptions, params: PreferenceParams) -> TokenVectorEnv:
    """``lmgym/Preference-v0`` as a native vector env (parameters: ``PreferenceParams``).

    Env options:
        max_new_tokens: token budget (also the reward model's longest training
            completion); default 8.
        tokenizer: the policy's tokenizer (default the built-in character tokenizer);
            the reward model re-tokenises text with its own.
        device: where the env's tensors and the reward model live.
    """
    prompts = tuple(params.prompts)
    max_new_tokens = options.max_new_tokens or 8
    path = Path(params.reward_model_path) if params.reward_model_path is not None else None
    if path is None or not path.exists():
        config = PreferenceRMConfig(prompts=prompts, max_completion_length=max_new_tokens)
        path = train_preference_reward_model(path, config)
    reward = make_preference_reward(
        path, prompts, max_new_tokens, params.score, device=options.device
    )
    return build_env(options, prompts, reward, max_new_tokens=max_new_tokens)


make_preference = single_env_factory(make_preference_vector)
