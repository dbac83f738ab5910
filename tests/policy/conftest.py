"""The decode modes a rollout test can run under (``decode`` fixture)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from lmgym.policy import compiled_decode

DECODE_MODES = [
    "eager",
    # The compiled step's fixed-shape path (every slot column read, the
    # lmgym_slots attention), run uncompiled: its logic, without a compile.
    "fixed_shape",
    pytest.param("compiled", marks=pytest.mark.slow),
]


@pytest.fixture(params=DECODE_MODES)
def decode(request, monkeypatch) -> Iterator[bool]:
    """``compile_decode`` for the policy under test; in ``fixed_shape`` mode the step
    that ``torch.compile`` would compile runs as plain Python. In both compiled modes
    a fallback to eager decoding fails the test instead of passing as eager."""
    if request.param == "fixed_shape":
        monkeypatch.setattr(
            compiled_decode, "compile_step", lambda mode, packed=False: compiled_decode._step
        )
    # dynamo keeps at most recompile_limit graphs per function; a test session
    # compiles the step for many models and shapes (a process rarely does).
    with torch._dynamo.config.patch(recompile_limit=64), warnings.catch_warnings():
        if request.param != "eager":
            warnings.filterwarnings("error", "compile_decode: torch.compile of the decode step")
        yield request.param != "eager"
