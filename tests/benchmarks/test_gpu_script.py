"""benchmarks/gpu.py runs on a lent GPU for a few minutes, unattended: its CPU smoke
mode is the only place the script can be exercised beforehand, so run it here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testkit import import_script

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_smoke_run_completes_and_reports_every_phase(tmp_path):
    out = tmp_path / "gpu.md"
    script = ROOT / "benchmarks" / "gpu.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--smoke", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = out.read_text()
    for section in ("## Matmul peak", "## Model", "## Rollout", "## GRPO iteration"):
        assert section in report
    assert "failed" not in report.lower()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_benchmark_without_cuda_exits_cleanly(capsys):
    # In this process (the smoke run above is the script's real-process test): main's
    # return value is the script's exit status (``sys.exit(main())``).
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its siblings
    try:
        gpu = import_script(ROOT / "benchmarks" / "gpu.py", "benchmark_gpu")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpu.main(["--device", "cuda"]) == 0
    captured = capsys.readouterr()
    assert "--device cpu --smoke" in captured.out + captured.err
