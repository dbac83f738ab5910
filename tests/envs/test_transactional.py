"""A failing reward leaves the env exactly as it was, in every mode: retrying the
failed ``step`` or ``reset`` gives what a run that never failed gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from testkit import assert_same, snapshot

from lmgym.envs import FunctionReward, RewardError

EOS = 1

MODES = [
    {"reward_mode": "bandit"},
    {"reward_mode": "per_token", "per_token_form": "potential", "center_potential": False},
    {"reward_mode": "per_token", "per_token_form": "potential", "center_potential": True},
    {"reward_mode": "per_token", "per_token_form": "dense"},
]


def env_state(env) -> dict[str, Any]:
    skip = {"tokenizer", "reward_model", "prompt_table", "metadata"}
    state = {k: snapshot(v) for k, v in vars(env).items() if k not in skip and "space" not in k}
    state["stream"] = snapshot(env.get_state())
    return state


def scored(prompts: list[str], completions: list[str]) -> list[float]:
    # Depends on the prompt, so a refilled row's empty-completion potential is not 0.
    return [
        c.count("a") + 0.5 * len(p) + 0.25 * len(c)
        for p, c in zip(prompts, completions, strict=True)
    ]


def script(ids) -> list[tuple]:
    """Resets and steps that end rows at different times, refill rows and start new
    passes over the (shuffled) prompts."""
    a, b = ids("a")[0], ids("b")[0]
    t = torch.tensor
    return [
        ("reset", {"seed": 3}),
        ("step", t([a, EOS, b, a])),
        ("step", t([EOS, a, a, b])),
        ("step", t([b, a, EOS, a])),
        ("reset", {"options": {"reset_mask": t([True, False, False, True])}}),
        ("step", t([a, b, EOS, EOS])),
        ("step", t([a, a, a, a])),
        ("step", t([EOS, EOS, b, a])),
        ("reset", {}),
        ("step", t([a, EOS, a, b])),
        ("step", t([b, b, EOS, a])),
    ]


def run(env, op: tuple) -> Any:
    kind, arg = op
    out = env.reset(**arg) if kind == "reset" else env.step(arg)
    return snapshot(out)


@pytest.mark.parametrize("autoreset", [False, True])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(str(v) for v in m.values()))
def test_a_failing_reward_leaves_step_and_reset_retryable_in_every_mode(
    make_env, ids, mode, autoreset
):
    kw = dict(prompts=["ab", "xyz", "q"], num_prompts=2, group_size=2, max_new_tokens=3, **mode)
    calls = {"n": 0}

    def counted(prompts, completions):
        calls["n"] += 1
        return scored(prompts, completions)

    reference = make_env(reward=FunctionReward(counted), autoreset=autoreset, **kw)
    expected = []
    for op in script(ids):
        expected.append((run(reference, op), env_state(reference)))
    total = calls["n"]
    assert total >= 5

    for fail_at in range(1, total + 1):
        seen = {"n": 0}

        def flaky(prompts, completions, fail_at=fail_at, seen=seen):
            seen["n"] += 1
            if seen["n"] == fail_at:
                raise RuntimeError("reward server timed out")
            return scored(prompts, completions)

        env = make_env(reward=FunctionReward(flaky, name="flaky"), autoreset=autoreset, **kw)
        before = env_state(env)
        failed = 0
        for i, op in enumerate(script(ids)):
            where = f"fail_at={fail_at}, op {i} {op[0]}"
            try:
                out = run(env, op)
            except RewardError as err:
                assert "reward server timed out" in str(err)
                failed += 1
                assert_same(env_state(env), before, f"{where}: state after the failure")
                out = run(env, op)  # the retry
            assert_same(out, expected[i][0], f"{where}: returned values")
            before = env_state(env)
            assert_same(before, expected[i][1], f"{where}: state")
        assert failed == 1
