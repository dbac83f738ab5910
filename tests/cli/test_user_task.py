"""Your own task, reward, prompt file and model through `lmgym train / eval / --resume`, as a
user would run them: a module of your own on PYTHONPATH, a JSONL prompt file with a
reference-answer column, a model directory saved locally.

Which tests need what (the env side of issue 14 lands separately):

- ``test_a_task_from_your_module_*`` and the LoRA tests use only what lmgym's envs
  already offer (a task registered with ``gymnasium.register`` whose vector factory
  takes the run's ``tokenizer``).
- ``test_prompts_and_reward_*`` need ``register_reward_env`` tasks to accept the
  run's ``tokenizer`` in ``gymnasium.make_vec`` and JSONL fields to reach the reward
  as keyword arguments (``answer=[...]``).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from lmgym.cli import main
from lmgym.training.logger import read_progress

QUIET = [
    "--no-progress",
    "--log-interval", "0",
    "--eval-prompts", "2",
    "--eval-samples", "2",
    "--samples", "2",
    "--sample-every", "0",
    "--num-prompts", "2",
    "--group-size", "4",
]  # fmt: skip

SUMS = [("1+1=", "2"), ("2+3=", "5"), ("4+4=", "8"), ("3+3=", "6"), ("0+7=", "7")]

# A task module as a user writes it today: a reward over RewardInput that looks the
# reference answer up by prompt index, registered with gymnasium.register.
TASK_MODULE = """
import gymnasium as gym
import torch

from lmgym.envs.token_env import TokenVectorEnv

PROMPTS = {prompts!r}
ANSWERS = {answers!r}


def exact_answer(batch):
    answers = [ANSWERS[i] for i in batch.prompt_index.tolist()]
    return torch.tensor([float(c.strip() == a) for c, a in zip(batch.completions, answers)])


def make_sums(num_envs=1, group_size=1, tokenizer=None, device="cpu", max_new_tokens=3,
              autoreset=False):
    return TokenVectorEnv(tokenizer, PROMPTS, exact_answer, num_prompts=num_envs // group_size,
                          group_size=group_size, max_new_tokens=max_new_tokens,
                          autoreset=autoreset, device=device)


gym.register(id="sums/Sums-v0", vector_entry_point=make_sums)
"""

# The reward of a prompt file: the `answer` column arrives as a keyword argument.
REWARD_MODULE = """
def exact_answer(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""


def train(*args: str) -> int:
    return main(["train", *QUIET, *args])


def forget(module: str, env_id: str) -> None:
    """Drop a module and its task, as a new process would not have them."""
    sys.modules.pop(module, None)
    gym.registry.pop(env_id, None)


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> Path:
    """A directory on sys.path with the user's modules and prompt file."""
    (tmp_path / "my_sums.py").write_text(
        TASK_MODULE.format(prompts=[p for p, _ in SUMS], answers=[a for _, a in SUMS])
    )
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARD_MODULE))
    (tmp_path / "sums.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in SUMS)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    forget("my_sums", "sums/Sums-v0")
    forget("my_rewards", "prompts/sums-v0")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from lmgym.policy import save_tiny

    return save_tiny(tmp_path_factory.mktemp("model") / "tiny")


# ------------------------------------------------------------ module:Id
def test_a_task_from_your_module_trains_evaluates_and_resumes(
    user_dir, tiny_model, tmp_path, capsys
):
    run = tmp_path / "run"
    task = "my_sums:sums/Sums-v0"
    args = ["--task", task, "--model", str(tiny_model), "--save-every", "1"]
    assert train(*args, "--iterations", "2", "--run-dir", str(run)) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["run"]["task"] == task
    assert saved["imports"] == {"modules": {"my_sums": "task"}, "prompts": None}

    forget("my_sums", "sums/Sums-v0")  # eval imports the module again
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--num-prompts", "2", "-k", "2"]) == 0
    assert f"on {task} (split training prompts (no held-out split)): 2 prompts x 2 samples" in (
        capsys.readouterr().out
    )

    forget("my_sums", "sums/Sums-v0")  # and so does the resume, saying so first
    assert train("--resume", str(run), "--iterations", "3") == 0
    out = capsys.readouterr().out
    assert f"importing the code named in {run}/config.json: task {task}" in out
    assert [row["iteration"] for row in read_progress(run / "progress.csv")] == [1, 2, 3]


def test_a_resumed_user_task_run_equals_an_uninterrupted_one(user_dir, tiny_model, tmp_path):
    args = ["--task", "my_sums:sums/Sums-v0", "--model", str(tiny_model)]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert train(*args, "--iterations", "3", "--run-dir", str(whole)) == 0
    assert train(*args, "--iterations", "2", "--run-dir", str(split)) == 0
    forget("my_sums", "sums/Sums-v0")
    assert train("--resume", str(split), "--iterations", "3") == 0

    def rows(run: Path) -> list[dict[str, float]]:
        return [
            {k: v for k, v in row.items() if not k.startswith("time/")}
            for row in read_progress(run / "progress.csv")
        ]

    assert rows(split) == rows(whole)


def test_a_module_that_does_not_register_the_task_is_named(user_dir, tmp_path, capsys):
    (user_dir / "empty_module.py").write_text("x = 1\n")
    assert train("--task", "empty_module:sums/Nope-v0", "--run-dir", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "lmgym train: error: unknown task 'empty_module:sums/Nope-v0' after importing "
        "'empty_module' (does it register 'sums/Nope-v0'?); registered: lmgym/Arithmetic-v0, "
    )
    assert train("--task", "no_such_module:X-v0", "--run-dir", str(tmp_path / "r")) == 2
    assert capsys.readouterr().err.startswith(
        "lmgym train: error: task 'no_such_module:X-v0': cannot import module 'no_such_module' "
        "(No module named 'no_such_module'); put it on PYTHONPATH or run lmgym from its directory"
    )
    assert not (tmp_path / "r").exists()


def test_run_directory_name_of_a_module_task(tmp_path):
    from lmgym.training.run import default_run_dir

    path = default_run_dir("grpo", "my_sums:sums/Sums-v0", root=tmp_path)
    assert path.name.startswith("grpo-Sums-") and ":" not in path.name


# ------------------------------------------------------ --prompts / --reward
def test_prompts_and_reward_train_evaluate_and_resume(user_dir, tiny_model, tmp_path, capsys):
    run = tmp_path / "run"
    prompts = user_dir / "sums.jsonl"
    args = ["--prompts", str(prompts), "--reward", "my_rewards:exact_answer"]
    args += ["--model", str(tiny_model), "--env", "max_new_tokens=3", "--save-every", "1"]
    assert train(*args, "--iterations", "2", "--run-dir", str(run)) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["run"]["task"] == "prompts/sums-v0"
    assert saved["run"]["prompts"] == str(prompts)
    assert saved["imports"]["modules"] == {"my_rewards": "reward"}
    assert saved["imports"]["prompts"]["path"] == str(prompts)
    assert len(saved["imports"]["prompts"]["sha256"]) == 64

    forget("my_rewards", "prompts/sums-v0")
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--num-prompts", "2", "-k", "2"]) == 0
    assert "on prompts/sums-v0 (split eval): 2 prompts x 2 samples" in capsys.readouterr().out

    forget("my_rewards", "prompts/sums-v0")
    assert train("--resume", str(run), "--iterations", "3") == 0
    assert (
        f"importing the code named in {run}/config.json: reward my_rewards:exact_answer"
        in capsys.readouterr().out
    )
    assert len(read_progress(run / "progress.csv")) == 3


def test_prompts_and_reward_see_the_answer_column(user_dir, tiny_model, tmp_path):
    """The reward is right exactly when the completion is the row's own answer."""
    from lmgym.policy import CausalLMPolicy
    from lmgym.rollout import collect
    from lmgym.training.user_code import register_prompt_task

    env_id = register_prompt_task(user_dir / "sums.jsonl", "my_rewards:exact_answer")
    policy = CausalLMPolicy.from_pretrained(tiny_model)
    env = gym.make_vec(
        env_id, num_envs=len(SUMS), group_size=1, max_new_tokens=3, tokenizer=policy.tokenizer
    )
    batch = collect(env, policy, seed=0)
    completions = env.decode_completions(batch.completion_ids)
    answers = [SUMS[i][1] for i in batch.prompt_index.tolist()]
    expected = [float(c.strip() == a) for c, a in zip(completions, answers, strict=True)]
    assert batch.scores.tolist() == expected


def test_a_changed_prompt_file_stops_a_resume_and_is_noted_by_eval(
    user_dir, tiny_model, tmp_path, capsys
):
    run = tmp_path / "run"
    prompts = user_dir / "sums.jsonl"
    args = ["--prompts", str(prompts), "--reward", "my_rewards:exact_answer"]
    assert train(*args, "--model", str(tiny_model), "--iterations", "1", "--run-dir", str(run)) == 0
    with prompts.open("a") as f:
        f.write(json.dumps({"prompt": "9+0=", "answer": "9"}) + "\n")
    capsys.readouterr()
    assert train("--resume", str(run), "--iterations", "2") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmgym train: error: the run's prompt file {prompts} changed since ")
    assert err.endswith(
        "a resumed run must train on the same prompts: restore the file, or start a new run on "
        "the new one\n"
    )
    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "2"]) == 0
    assert "lmgym eval: note: the run's prompt file" in capsys.readouterr().err
    prompts.unlink()
    assert train("--resume", str(run), "--iterations", "2") == 2
    assert capsys.readouterr().err == (
        f"lmgym train: error: the run's prompt file {prompts} is missing; restore it to resume "
        "the run\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--prompts", "sums.jsonl"],
            "prompts='sums.jsonl' needs reward too: a prompt-file task is --prompts FILE.jsonl "
            "--reward module:function",
        ),
        (
            ["--reward", "my_rewards:exact_answer"],
            "reward='my_rewards:exact_answer' needs prompts too: a prompt-file task is "
            "--prompts FILE.jsonl --reward module:function",
        ),
        (
            ["--prompts", "nope.jsonl", "--reward", "my_rewards:exact_answer"],
            "prompts '{dir}/nope.jsonl': no such file (a JSON Lines prompt file)",
        ),
        (
            ["--prompts", "sums.jsonl", "--reward", "my_rewards:missing"],
            "reward 'my_rewards:missing': module 'my_rewards' ({dir}/my_rewards.py) has no "
            "attribute 'missing'",
        ),
        (
            ["--prompts", "sums.jsonl", "--reward", "my_rewards:exact_answer", "--task",
             "lmgym/Sort-v0"],
            "task='lmgym/Sort-v0' and prompts='{dir}/sums.jsonl' both name the run's task; pass "
            "one (--prompts builds the task from the file and --reward)",
        ),
    ],
)  # fmt: skip
def test_prompt_task_mistakes_are_one_line(user_dir, monkeypatch, capsys, args, message):
    monkeypatch.chdir(user_dir)
    assert train(*args, "--run-dir", str(user_dir / "r")) == 2
    assert capsys.readouterr().err == f"lmgym train: error: {message.format(dir=user_dir)}\n"
    assert not (user_dir / "r").exists()


# ------------------------------------------------------------------- LoRA
def teacher_forced(policy, ids: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        return policy.logprobs(ids, mask, ids.shape[1] - 2, with_entropy=False)[0]


def test_a_lora_run_reloads_its_adapter_exactly_and_resumes(tmp_path, tiny_llama):
    pytest.importorskip("peft")
    from lmgym.agents import GRPOConfig
    from lmgym.policy import CausalLMPolicy
    from lmgym.policy.value import AdapterDisabledReference
    from lmgym.training import TrainConfig, Trainer

    model = tiny_llama
    settings = dict(
        task="lmgym/TargetString-v0", model=str(model), lora_r=4, lora_alpha=8.0,
        num_prompts=2, group_size=4, eval_prompts=2, eval_samples=2, samples=0,
        sample_every=0, log_interval=0, no_progress=True, save_merged=True,
    )  # fmt: skip
    agent_config = GRPOConfig(learning_rate=2e-3, beta=0.05)
    run = tmp_path / "run"
    result = Trainer(
        TrainConfig(**settings, iterations=2, run_dir=str(run)), agent_config, out=lambda s: None
    ).run()
    agent = result.agent
    assert agent.policy.is_peft
    assert isinstance(agent.ref_policy, AdapterDisabledReference)  # no second model
    trainable = {n for n, p in agent.policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    policy_dir = result.checkpoint / "agent" / "policy"
    assert (policy_dir / "adapter_config.json").is_file()
    assert json.loads((policy_dir / "adapter_config.json").read_text())["r"] == 4

    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    reloaded = CausalLMPolicy.from_pretrained(policy_dir)
    assert torch.equal(teacher_forced(reloaded, ids), teacher_forced(agent.policy, ids))

    # The merged export is a plain transformers model with the same outputs.
    assert (result.merged / "config.json").is_file()
    assert not (result.merged / "adapter_config.json").exists()
    merged = CausalLMPolicy.from_pretrained(result.merged)
    assert torch.allclose(teacher_forced(merged, ids), teacher_forced(agent.policy, ids), atol=1e-5)

    resumed = Trainer.resume(run, changes={"iterations": 3}, out=lambda s: None).run()
    assert resumed.agent.policy.is_peft
    assert isinstance(resumed.agent.ref_policy, AdapterDisabledReference)
    whole = Trainer(
        TrainConfig(**settings, iterations=3, run_dir=str(tmp_path / "whole")),
        agent_config,
        out=lambda s: None,
    ).run()
    assert [m["reward_mean"] for m in resumed.history] == [whole.history[-1]["reward_mean"]]
    assert torch.equal(
        teacher_forced(resumed.agent.policy, ids), teacher_forced(whole.agent.policy, ids)
    )


def test_lora_from_the_command_line(tmp_path, capsys, tiny_llama):
    pytest.importorskip("peft")
    model = tiny_llama
    run = tmp_path / "run"
    args = ["--model", str(model), "--lora-r", "4", "--lora-target-modules", "q_proj", "v_proj"]
    assert train(*args, "--iterations", "1", "--run-dir", str(run)) == 0
    saved = json.loads((run / "config.json").read_text())["run"]
    assert (saved["lora_r"], saved["lora_target_modules"]) == (4, ["q_proj", "v_proj"])
    adapter = run / "checkpoints" / "iter_000001" / "agent" / "policy" / "adapter_config.json"
    assert sorted(json.loads(adapter.read_text())["target_modules"]) == ["q_proj", "v_proj"]
    capsys.readouterr()
    assert train("--resume", str(run), "--lora-r", "8") == 2
    assert capsys.readouterr().err.startswith(
        "lmgym train: error: --resume: --lora-r 8 differs from the run's 4; a resumed run keeps "
        "its algorithm, task, model and its settings (dtype, LoRA, checkpointing)"
    )
    assert main(["eval", "--run", str(run), "--num-prompts", "1", "-k", "2"]) == 0
    # An adapter directory is a --model, as for GRPO("path", env): the adapter trains on.
    adapter_dir = adapter.parent
    assert (
        main(
            [
                "eval",
                "--model",
                str(adapter_dir),
                "--task",
                "lmgym/TargetString-v0",
                "--num-prompts",
                "1",
                "-k",
                "2",
            ]
        )
        == 0
    )
    more = tmp_path / "more"
    assert train("--model", str(adapter_dir), "--iterations", "1", "--run-dir", str(more)) == 0
    assert (
        more / "checkpoints" / "iter_000001" / "agent" / "policy" / "adapter_config.json"
    ).is_file()


# ------------------------------------------------------------------ bench
def test_bench_on_your_model_and_your_task(user_dir, tiny_model, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench"
    task = "my_sums:sums/Sums-v0"
    args = ["bench", "--model", str(tiny_model), "--tasks", f"{task},lmgym/TargetString-v0"]
    args += ["--agents", "grpo", "--seeds", "0", "--iterations", "2", "--workers", "0"]
    args += ["--num-prompts", "2", "--group-size", "2", "--learning-rate", "1e-4"]
    assert main([*args, "--out", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert f"the model {tiny_model} with its tokenizer, loaded afresh for every run" in readme
    assert f"## {task}\n\nA task of your own (no solved threshold stated)." in readme
    assert (  # the pretrained defaults (PRETRAINED_DEFAULTS), the rate replaced
        "Each agent runs its documented defaults but for what is named: grpo with "
        "learning_rate=0.0001, beta=0, update_epochs=1, num_minibatches=1." in readme
    )
    assert f"--model {tiny_model}" in readme and "--learning-rate 0.0001" in readme
    assert (out / "Sums.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["task"] for r in results["runs"]) == ["lmgym/TargetString-v0", task]
    pretrained = {"learning_rate": 1e-4, "beta": 0.0, "update_epochs": 1, "num_minibatches": 1}
    assert all(r["overrides"] == pretrained for r in results["runs"])


# ------------------------------------------------------------- user_code
def test_a_reward_spec_becomes_a_reward_model(user_dir):
    from lmgym.envs import FunctionReward
    from lmgym.training.user_code import load_reward

    (user_dir / "reward_kinds.py").write_text(
        "from lmgym.envs import FunctionReward\n"
        "def batched(prompts, completions):\n    return [0.0] * len(prompts)\n"
        "per_row = FunctionReward(lambda p, c: 1.0, batched=False)\n"
        "class Model:\n    def __call__(self, batch):\n        return [0.0]\n"
        "threshold = 0.5\n"
    )
    reward = load_reward("reward_kinds:batched")
    assert isinstance(reward, FunctionReward) and reward.batched and reward.name == "batched"
    import reward_kinds

    assert load_reward("reward_kinds:per_row") is reward_kinds.per_row  # a RewardModel as is
    assert isinstance(load_reward("reward_kinds:Model"), reward_kinds.Model)  # instantiated
    with pytest.raises(ValueError, match=r"reward 'reward_kinds:threshold': float is not callable"):
        load_reward("reward_kinds:threshold")
    with pytest.raises(ValueError, match=r"reward 'reward_kinds': expected 'package.module:name'"):
        load_reward("reward_kinds")
    sys.modules.pop("reward_kinds", None)


@pytest.mark.parametrize(
    ("path", "task_id"),
    [("data/sums.jsonl", "prompts/sums-v0"), ("my data (v2).jsonl", "prompts/my_data_v2_-v0")],
)
def test_a_prompt_file_names_its_task(path, task_id):
    from lmgym.training.user_code import prompt_task_id

    assert prompt_task_id(path) == task_id
    namespace, name, version = gym.envs.registration.parse_env_id(task_id)
    assert (namespace, version) == ("prompts", 0)


def test_the_prompt_field_is_configurable(user_dir):
    from lmgym.envs.prompts import JsonlPrompts
    from lmgym.training.user_code import register_prompt_task

    (user_dir / "questions.jsonl").write_text(json.dumps({"question": "1+1=", "answer": "2"}))
    env_id = register_prompt_task(
        user_dir / "questions.jsonl", "my_rewards:exact_answer", prompt_field="question"
    )
    assert env_id == "prompts/questions-v0"
    with pytest.raises(ValueError, match="no field 'prompt'"):
        JsonlPrompts(user_dir / "questions.jsonl")  # the default field is not there
    gym.registry.pop(env_id)
