"""Checkpoints: manifests, atomic writes, corruption detected, prompt-stream state, pass@k."""

from __future__ import annotations

import pytest
import torch

from lmgym.agents import GRPO, PPO
from lmgym.cli import main
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.persistence import manifest as manifest_module
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.training import CheckpointError, CheckpointManager, pass_at_k


def fresh_agent(agent_class=GRPO, **config):
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_target_string_vector(num_envs=8, group_size=4, tokenizer=tokenizer)
    return agent_class(policy, env, **config)


def fresh_env():
    return make_target_string_vector(num_envs=8, group_size=4, tokenizer=make_char_tokenizer())


def test_truncated_weights_fail_to_load_with_a_clear_message(tmp_path):
    agent = fresh_agent()
    agent.learn(1)
    path = CheckpointManager(tmp_path).save(agent)
    weights = path / "agent" / "policy" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:100])
    expected = (
        f"checkpoint {path / 'agent'} is incomplete or corrupted: file policy/model.safetensors "
        f"has 100 bytes, expected {size}"
    )
    with pytest.raises(CheckpointError, match=expected):
        CheckpointManager.load(path, fresh_env())
    with pytest.raises(CheckpointError, match=expected):
        GRPO.load(path / "agent", fresh_env())


def test_a_changed_byte_and_a_missing_file_are_caught(tmp_path):
    agent = fresh_agent()
    path = CheckpointManager(tmp_path).save(agent)
    state = path / "trainer_state.pt"
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match="file trainer_state.pt has the right size but the wrong SHA-256"
    ):
        CheckpointManager.load(path, fresh_env())
    (path / "agent" / "agent_config.json").unlink()
    with pytest.raises(CheckpointError, match="file agent_config.json is missing"):
        manifest_module.verify_manifest(path / "agent")


def test_resume_from_a_truncated_checkpoint_names_the_earlier_ones(tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--no-progress", "--log-interval", "0", "--eval-prompts", "2", "--eval-samples", "2"]
    assert (
        main(["train", "--iterations", "4", "--save-every", "2", "--run-dir", str(run), *flags])
        == 0
    )
    weights = run / "checkpoints" / "iter_000004" / "agent" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--iterations", "6", *flags]) == 2
    err = capsys.readouterr().err
    assert "is incomplete or corrupted: file policy/model.safetensors has 100 bytes" in err
    assert f"--resume {run / 'checkpoints' / 'iter_000002'}" in err


def test_a_crash_mid_write_leaves_no_checkpoint_under_a_final_name(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    agent = fresh_agent()
    agent.learn(1)
    first = manager.save(agent)
    agent.learn(1)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("lmgym.persistence.atomic.write_manifest", crash)
    with pytest.raises(OSError, match="disk full"):
        manager.save(agent)
    assert [p.name for p in manager.checkpoints()] == ["iter_000001"]
    assert manager.latest() == first
    loaded, _ = CheckpointManager.load(first, fresh_env())
    assert loaded.iteration == 1


def test_old_checkpoints_are_pruned_and_latest_tracks_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    agent = fresh_agent()
    for _ in range(3):
        agent.learn(1)
        manager.save(agent)
    assert [p.name for p in manager.checkpoints()] == ["iter_000002", "iter_000003"]
    assert manager.latest().name == "iter_000003"


def test_agent_checkpoint_restores_the_prompt_stream(tmp_path):
    from lmgym.envs.tasks.strings import make_reverse_vector

    def reverse_env():
        return make_reverse_vector(num_envs=8, group_size=2, tokenizer=make_char_tokenizer())

    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    agent = PPO(policy, reverse_env(), num_minibatches=2)
    agent.learn(2)
    agent.save(tmp_path / "ckpt")
    continued = [agent.collect()[0] for _ in range(3)]
    loaded = PPO.load(tmp_path / "ckpt", reverse_env())
    resumed = [loaded.collect()[0] for _ in range(3)]
    for a, b in zip(continued, resumed, strict=True):
        assert torch.equal(a.prompt_index, b.prompt_index)
        assert torch.equal(a.group_ids, b.group_ids)
        assert torch.equal(a.completion_ids, b.completion_ids)


def test_env_state_round_trip_draws_the_same_prompts(tokenizer):
    from lmgym.envs.tasks.strings import make_reverse_vector

    env = make_reverse_vector(num_envs=6, group_size=2, tokenizer=tokenizer)
    env.reset(seed=3)
    for _ in range(5):  # cross a pass boundary of the shuffled order
        env.reset()
    state = env.get_state()
    _, info = env.reset()
    expected = (info["prompt_index"].clone(), info["group_id"].clone())
    other = make_reverse_vector(num_envs=6, group_size=2, tokenizer=tokenizer)
    other.set_state(state)
    _, info = other.reset()
    assert torch.equal(info["prompt_index"], expected[0])
    assert torch.equal(info["group_id"], expected[1])


def test_env_state_from_another_batch_shape_is_refused(tokenizer):
    env = make_target_string_vector(num_envs=8, group_size=4, tokenizer=tokenizer)
    env.reset(seed=0)
    other = make_target_string_vector(num_envs=8, group_size=2, tokenizer=tokenizer)
    with pytest.raises(
        ValueError, match="the saved prompt stream has group_size=4, this env has 2"
    ):
        other.set_state(env.get_state())


def test_evaluation_does_not_move_the_training_stream(tmp_path):
    from lmgym.training import evaluate_policy, make_eval_env

    a, b = fresh_agent(), fresh_agent()
    a.learn(1)
    b.learn(1)
    env, _ = make_eval_env("lmgym/TargetString-v0", a.policy.tokenizer, 4, 2)
    evaluate_policy(a.policy, env, 4, seed=1)
    assert a.learn(1)[0]["reward_mean"] == b.learn(1)[0]["reward_mean"]
    first = collect(env, a.policy, seed=5)
    assert first.batch_size == 8


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(4, 0, 1, 0.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0), (5, 2, 2, 0.7), (5, 5, 3, 1.0)],
)
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="need 0 <= c <= n and 1 <= k <= n, got n=2, c=3, k=1"):
        pass_at_k(2, 3, 1)


def test_eval_reads_a_directory_written_by_agent_save(tmp_path, capsys):
    agent = fresh_agent()
    agent.save(tmp_path / "ckpt")
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "ckpt"),
                "--task",
                "lmgym/TargetString-v0",
                "--num-prompts",
                "2",
                "-k",
                "2",
            ]
        )
        == 0
    )
    assert "on lmgym/TargetString-v0" in capsys.readouterr().out


def test_trainer_api_restores_callback_state_on_resume(tmp_path):
    from lmgym.training import TrainConfig, Trainer, TrainingCallback

    class Counter(TrainingCallback):
        state_key = "counter"

        def __init__(self):
            self.calls = 0

        def __call__(self, agent, metrics):
            self.calls += 1

        def state_dict(self):
            return {"calls": self.calls}

        def load_state_dict(self, state):
            self.calls = state["calls"]

    quiet = {"no_progress": True, "log_interval": 0, "sample_every": 0, "eval_prompts": 2}
    config = TrainConfig(iterations=2, run_dir=str(tmp_path / "run"), eval_samples=2, **quiet)
    first = Counter()
    result = Trainer(config, callbacks=[first], out=lambda line: None).run()
    assert first.calls == 2 and result.iteration == 2
    second = Counter()
    resumed = Trainer.resume(
        tmp_path / "run", changes={"iterations": 4}, callbacks=[second], out=lambda line: None
    ).run()
    assert second.calls == 4 and resumed.iteration == 4 and len(resumed.history) == 2
