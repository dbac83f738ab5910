"""The learners' control record: named fields, carried whole (issue 27 §4)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lmgym.asynchronous.control import FIELDS, Control, broadcast_control


def test_the_record_round_trips_with_every_field_named():
    topology = SimpleNamespace(
        config=SimpleNamespace(learners=1), weights_device=torch.device("cpu")
    )
    sent = Control(**{name: i + 1 for i, name in enumerate(FIELDS)})
    assert broadcast_control(sent, topology) == sent
    assert FIELDS[:2] == ["stop", "update"] and "tokens_received" in FIELDS
    assert broadcast_control(None, topology) == Control()
