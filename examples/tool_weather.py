"""Tools in the model's format: a typed Python function as a tool, its calls parsed
from the policy's text, run with a time and memory limit, answered as tool messages.

Run ``python examples/tool_weather.py``. It

1. declares a tool as a typed function and prints how a model without tool support
   in its chat template is told about it (the default format), and how a call is
   parsed and run, including one that breaks the time limit;
2. plays one ``lmgym/Weather-v0`` episode with a scripted policy: a call with a
   wrong city (the tool says why), a good call, and the answer (the tool's tokens in
   ``[...]``);
3. trains a tiny GPT-2 from scratch to call the tool and answer with what it said
   (GRPO; the vocabulary and shaping of ``tests/multi_turn/test_tools_learning.py``).
"""

from __future__ import annotations

import time

import torch

from lmgym import CausalLMPolicy, make_tiny_model
from lmgym.agents import GRPO
from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.tasks.multi_turn.tools import (
    Tool,
    ToolRunner,
    answer_call,
    default_tool_prompt,
    tool_table,
)
from lmgym.envs.tasks.multi_turn.weather import make_weather_vector


def wait(seconds: float) -> str:
    """Wait, then say done.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "done"


def tools_demo() -> list[str]:
    """Declare, parse and run; returns the observations the policy would hear."""
    tools = tool_table([Tool(wait)])
    print("the default format's system message:\n" + default_tool_prompt(list(tools.values())))
    runner = ToolRunner({"wait": wait}, time_limit=0.5)
    heard = []
    for turn in (
        '<tool_call>{"name": "wait", "arguments": {"seconds": 0}}</tool_call>',
        '<tool_call>{"name": "wait", "arguments": {"seconds": "a while"}}</tool_call>',
        "wait: 3",  # the one-line form; longer than the time limit
    ):
        outcome = answer_call(turn, tools, runner)
        assert outcome is not None
        heard.append(outcome.observation)
        print(f"{turn!r}\n  -> {outcome.observation!r}")
    runner.close()
    return heard


def show(tokenizer, ids: torch.Tensor, mask: torch.Tensor, policy_mask: torch.Tensor) -> str:
    """A row's completion region as text, the environment's tokens in ``[...]``."""
    out, run, mine_run = [], [], None
    for token, mine in zip(ids[mask].tolist(), policy_mask[mask].tolist(), strict=True):
        if mine != mine_run and run:
            text = tokenizer.decode(run)
            out.append(text if mine_run else f"[{text}]")
            run = []
        run.append(token)
        mine_run = mine
    if run:
        text = tokenizer.decode(run)
        out.append(text if mine_run else f"[{text}]")
    return "".join(out)


def scripted_episode() -> tuple[float, str]:
    """One Weather episode: a wrong city, the right one, then the answer heard."""
    env = make_weather_vector(num_envs=1, group_size=1, autoreset=False, max_new_tokens=96)
    tok = env.tokenizer
    obs, info = env.reset(seed=0)
    city = env.prompt_table.columns["city"][int(info["prompt_index"][0])]
    total = 0.0

    def turn(text: str) -> None:
        nonlocal obs, total
        for token in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            obs, reward, *_ = env.step(torch.tensor([token]))
            total += float(reward[0])

    turn("weather: atlantis")
    turn(f"weather: {city}")
    region = obs["input_ids"][0, env.prompt_width :]
    text = tok.decode(region[obs["attention_mask"][0, env.prompt_width :].bool()])
    heard = text.rsplit("<eos>", 1)[1].removesuffix("<unk>")
    turn(f"answer: {heard}")
    region = slice(env.prompt_width, None)
    shown = show(
        tok,
        obs["input_ids"][0, region],
        obs["attention_mask"][0, region].bool(),
        obs["policy_mask"][0, region],
    )
    return total, shown


def train(iterations: int = 150, seed: int = 0) -> list[dict[str, float]]:
    """GRPO on Weather with a vocabulary in which the call is one token."""
    torch.manual_seed(seed)
    tok = make_char_tokenizer("abcd")
    tok.add_tokens(["weather: oslo"])
    env = make_weather_vector(
        num_envs=64, group_size=8, tokenizer=tok, cities=("oslo",), conditions=tuple("abcd"),
        call_bonus=0.5, describe_tools=False, max_new_tokens=16,
    )  # fmt: skip
    policy = CausalLMPolicy(make_tiny_model(len(tok), seed=seed), tok)
    history = GRPO(policy, env, seed=seed).learn(iterations)
    for row in history[:: max(1, iterations // 6)]:
        print(f"iteration {int(row['iteration']):3d}  mean return {row['reward_mean']:.3f}")
    return history


def main(iterations: int = 150) -> tuple[list[str], float, list[dict[str, float]]]:
    heard = tools_demo()
    total, shown = scripted_episode()
    print(
        f"\na scripted Weather episode (return {total:g}), the tool's tokens in [...]:\n{shown}\n"
    )
    print("training (return = 0.5 for calling + 1 for the right answer):")
    return heard, total, train(iterations)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
