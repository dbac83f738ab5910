"""A checkpoint changed after it was saved, its manifests recomputed (as anyone who can
write the directory can), is refused in one line that names what does not match and
never recommends the changed value (issue 40).

Before: a changed ``agent_config.json`` made ``--resume`` say ``config.json was
edited ... restore 0.5 in config.json`` (0.5 being the planted value); a NaN planted in
the optimizer state of an embedding row no token uses surfaced after the first step
as ``the weights diverged ... lower learning_rate``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from testkit import edit_agent_config, refused_line, reseal

from lmgym.agents import GRPO
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.persistence import CheckpointError
from lmgym.policy import make_char_tokenizer


def refused_resume_line(checkpoint: Path, train: Callable[..., int], capsys) -> str:
    """Reseal ``checkpoint``, resume its run to 4 iterations, assert the CLI refuses it
    (exit status 2) and return the one stderr line it wrote."""
    reseal(checkpoint)
    return refused_line(
        train, capsys, "--iterations", "4", "--resume", str(checkpoint.parent.parent)
    )


@pytest.fixture
def checkpoint(tmp_path, train) -> Path:
    run = tmp_path / "run"
    assert train("--iterations", "2", "--run-dir", str(run)) == 0
    return run / "checkpoints" / "iter_000002"


def test_a_changed_agent_config_is_refused_without_recommending_the_change(
    checkpoint, train, capsys
):
    saved_rate = edit_agent_config(checkpoint, learning_rate=0.5)["learning_rate"]
    line = refused_resume_line(checkpoint, train, capsys)
    assert line == (
        f"lmgym train: error: checkpoint {checkpoint / 'agent'} is refused: its "
        "agent_config.json does not match the config saved with the agent in agent_state.pt "
        f"(learning_rate is 0.5 in the file, {saved_rate!r} as saved): the file was changed "
        "after the save. Resume from another checkpoint, or put the file back "
        f"(learning_rate: {saved_rate!r})"
    )
    assert "restore 0.5" not in line
    env = make_target_string_vector(num_envs=32, group_size=8, tokenizer=make_char_tokenizer())
    with pytest.raises(CheckpointError, match="does not match the config saved with the agent"):
        GRPO.load(checkpoint / "agent", env)


def test_a_changed_algorithm_is_not_recommended_as_the_fix(checkpoint, train, capsys):
    """The algorithm is compared with config.json before the checkpoint loads: the line
    used to say 'config.json was edited; restore "algo": "ppo"', 'ppo' being planted."""
    edit_agent_config(checkpoint, algorithm="ppo")
    run = checkpoint.parent.parent
    line = refused_resume_line(checkpoint, train, capsys)
    assert line == (
        f"lmgym train: error: {run / 'config.json'} says algo 'grpo', but checkpoint "
        f"{checkpoint.name}'s agent/agent_config.json says 'ppo': one of the two files was "
        "changed after the checkpoint was written (edited by hand, or damaged). If you edited "
        'config.json, set "algo" back to "ppo" there; if not, the checkpoint was changed: '
        "resume from another checkpoint. To train with --algo grpo, start a new run"
    )
    assert "restore" not in line


def test_a_changed_config_of_a_checkpoint_without_its_copy_is_not_recommended(
    checkpoint, train, capsys
):
    """A checkpoint written before agent_state.pt held the config (nothing to check the
    file against on load): the comparison with config.json names both sides."""
    state_file = checkpoint / "agent" / "agent_state.pt"
    state = torch.load(state_file, weights_only=True)
    del state["agent_config"]  # as an older lmgym wrote it
    torch.save(state, state_file)
    saved_rate = edit_agent_config(checkpoint, learning_rate=0.5)["learning_rate"]
    run = checkpoint.parent.parent
    line = refused_resume_line(checkpoint, train, capsys)
    assert line == (
        f"lmgym train: error: {run / 'config.json'} and checkpoint {checkpoint.name} disagree: "
        f"agent field learning_rate is {saved_rate!r} in config.json, 0.5 in the checkpoint's "
        "agent/agent_config.json; one of them was changed after the checkpoint was written "
        f"(edited by hand, or damaged). If you edited config.json, put {0.5!r} back there to "
        "resume; if not, the checkpoint was changed: resume from another checkpoint. To "
        f"train with config.json's settings, start a new run (lmgym train --config "
        f"{run / 'config.json'} --run-dir NEW_DIR)"
    )


def test_a_nan_in_the_optimizer_state_of_an_unused_row_is_named_not_the_learning_rate(
    checkpoint, train, capsys
):
    state_file = checkpoint / "agent" / "agent_state.pt"
    state = torch.load(state_file, weights_only=True)
    moments = state["optimizer"]["state"][0]["exp_avg"]  # the token embedding's
    unused = make_char_tokenizer().unk_token_id  # never in a prompt, never sampled
    moments[unused, 3] = float("nan")
    torch.save(state, state_file)
    line = refused_resume_line(checkpoint, train, capsys)
    assert line == (
        f"lmgym train: error: checkpoint {checkpoint / 'agent'} is refused: agent_state.pt "
        f"holds a NaN in the optimizer state, optimizer['state'][0]['exp_avg'] (first at row "
        f"{unused}); training never saves one, so the file is damaged or was changed after the "
        "save. Resume from an earlier checkpoint"
    )
    assert "learning_rate" not in line


@pytest.mark.parametrize(("rank", "extra"), [(8, 0), (4, 3)], ids=["rank", "input width"])
def test_a_lora_adapter_whose_shape_was_changed_is_one_line(tmp_path, train, capsys, rank, extra):
    pytest.importorskip("peft")
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    assert train("--iterations", "2", "--lora-r", "4", "--run-dir", str(run)) == 0
    checkpoint = run / "checkpoints" / "iter_000002"
    policy = checkpoint / "agent" / "policy"
    weights = load_file(policy / "adapter_model.safetensors")
    name = sorted(k for k in weights if "lora_A" in k)[0]
    width = weights[name].shape[1]
    weights[name] = torch.zeros(rank, width + extra)
    save_file(weights, policy / "adapter_model.safetensors", metadata={"format": "pt"})
    line = refused_resume_line(checkpoint, train, capsys)
    assert line.startswith(
        f"lmgym train: error: LoRA checkpoint {policy}: its adapter weights do not fit its "
        f"adapter (base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight is "
        f"[{rank}, {width + extra}] in adapter_model.safetensors, but adapter_config.json and "
        f"the base model make it [4, {width}]); "
    ), line
    assert line.endswith(
        "resume from another checkpoint, or restore both files from the same save"
    ), line
