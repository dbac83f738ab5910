"""A failed write is an ``OSError`` naming the file, whichever library wrote it."""

from __future__ import annotations

import pytest
import torch

from lmgym.persistence.state import save_state
from lmgym.persistence.write_errors import as_os_error, writing


def test_torch_save_failing_on_a_full_disk_is_an_os_error_naming_the_file(tmp_path, monkeypatch):
    # What torch.save raises when the disk fills mid-write (the fault campaign, a small tmpfs).
    def full(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598\n"
            "frame #0: c10::ThrowEnforceNotMet(...)"
        )

    monkeypatch.setattr(torch, "save", full)
    path = tmp_path / "agent_state.pt"
    with pytest.raises(OSError) as info:
        save_state({"weights": torch.zeros(3)}, path, name="agent state")
    assert str(info.value) == (
        f"writing {path} failed (is the disk full?): [enforce fail at inline_container.cc:672] "
        ". unexpected pos 704 vs 598"
    )


class SafetensorError(Exception):
    """Stands in for safetensors' Rust error class (matched by name)."""


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"),
    ],
)
def test_library_reports_of_a_failed_write_become_os_errors(tmp_path, error):
    converted = as_os_error(error, tmp_path / "policy")
    assert isinstance(converted, OSError)
    assert str(converted).startswith(f"writing {tmp_path / 'policy'} failed (is the disk full?)")


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("expected scalar type Float but found Half"),
        SafetensorError("Error while deserializing header: invalid JSON"),
        ValueError("inline_container"),
    ],
)
def test_other_errors_are_left_as_they_are(tmp_path, error):
    assert as_os_error(error, tmp_path) is None
    with pytest.raises(type(error)), writing(tmp_path):
        raise error
