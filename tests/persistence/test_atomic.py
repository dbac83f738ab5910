"""``atomic_directory`` only replaces directories; ``recover_leftovers`` only cleans
up after processes that are gone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lmgym.persistence import atomic_directory, recover_leftovers

GONE = 4_194_305
"""Above Linux's largest possible PID (2**22): never a running process."""


def test_a_file_in_place_of_the_directory_is_refused_and_kept(tmp_path):
    notes = tmp_path / "saved"
    notes.write_text("keep me")
    refused = pytest.raises(FileExistsError, match=rf"^{notes} is a file, not a directory; save to")
    with refused, atomic_directory(notes) as tmp:
        (tmp / "a").write_text("x")
    assert notes.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]


def test_a_link_in_place_of_the_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    refused = pytest.raises(FileExistsError, match="is a symbolic link, not a directory")
    with refused, atomic_directory(tmp_path / "link"):
        pass
    assert (tmp_path / "link").is_symlink()


def test_agent_save_onto_an_existing_file_is_a_clear_error(tmp_path):
    from lmgym.agents import GRPO
    from lmgym.envs.tasks.target_string import make_target_string_vector
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    agent = GRPO(policy, make_target_string_vector(num_envs=4, group_size=2, tokenizer=tokenizer))
    target = tmp_path / "agent.pt"
    target.write_bytes(b"not an agent")
    with pytest.raises(FileExistsError, match=r"agent\.pt is a file, not a directory"):
        agent.save(target)
    assert target.read_bytes() == b"not an agent"


def test_leftovers_of_a_running_process_are_left_alone(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".iter_000002.tmp-{sleeper.pid}").mkdir()
        (tmp_path / f".latest.tmp-{sleeper.pid}").write_text("iter_000002")
        (tmp_path / f".iter_000003.tmp-{GONE}").mkdir()
        (tmp_path / f".latest.tmp-{os.getpid()}").write_text("mine, from a failed write")
        assert recover_leftovers(tmp_path) == [
            f"removed .iter_000003.tmp-{GONE}",
            f"removed .latest.tmp-{os.getpid()}",
        ]
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            f".iter_000002.tmp-{sleeper.pid}",
            f".latest.tmp-{sleeper.pid}",
        ]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert recover_leftovers(tmp_path) == [
        f"removed .iter_000002.tmp-{sleeper.pid}",
        f"removed .latest.tmp-{sleeper.pid}",
    ]
