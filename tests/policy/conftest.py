"""The decode modes a rollout test can run under (``decode`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testkit import decode_mode

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
    yield from decode_mode(request, monkeypatch)
