"""Agent.save where transformers' save_pretrained writes no weights (a rank other than
0 under torch.distributed) refuses, naming the fix, and leaves the last save intact."""

from __future__ import annotations

import pytest

from lmgym.agents import GRPO
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model


def test_a_save_that_writes_no_weights_is_refused_and_keeps_the_last_one(tmp_path, monkeypatch):
    tok = make_char_tokenizer()
    env = make_target_string_vector(num_envs=8, group_size=4, tokenizer=tok)
    agent = GRPO(CausalLMPolicy(make_tiny_model(len(tok), seed=0), tok), env)
    path = tmp_path / "agent"
    agent.save(path)
    before = sorted(p.relative_to(path) for p in path.rglob("*"))

    # What transformers does on rank 1 of a process group: no weight file.
    monkeypatch.setattr(
        type(agent.policy.model), "should_save_on_this_rank", lambda self, main: False
    )
    with pytest.raises(RuntimeError, match="wrote no weights.*Save on rank 0"):
        agent.save(path)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["agent"]  # no temporary left behind
    GRPO.load(path, make_target_string_vector(num_envs=8, group_size=4, tokenizer=tok))
