"""GPU tier: examples/new_shape_family/run.py runs the Qwen3-30B-A3B expert GEMMs and they match torch.

Uses the build folder of the GPU tier ($CUTEGEN_BUILD_DIR or ./build): kernels built from the
example's schedule file are used when present, the default ones otherwise (the heuristic chooses).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

RUN = Path(__file__).resolve().parent.parent.parent / "examples" / "new_shape_family" / "run.py"


def test_new_shape_family_run_matches_torch():
    from cutegen.runtime.catalogue import resolve_build_dir

    proc = subprocess.run(
        [sys.executable, str(RUN), "--build-dir", str(resolve_build_dir()), "--tokens", "256", "--experts", "4",
         "--iters", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8/8 results match" in proc.stdout, proc.stdout


MOE = Path(__file__).resolve().parent.parent.parent / "examples" / "torch_moe_layer" / "moe_layer.py"


def test_torch_moe_layer_matches_bf16():
    from cutegen.runtime.catalogue import resolve_build_dir

    proc = subprocess.run(
        [sys.executable, str(MOE), "--build-dir", str(resolve_build_dir()), "--tokens", "1024", "--experts", "8"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and "prefill" in proc.stdout, proc.stdout


MOE_BACKWARD = Path(__file__).resolve().parent.parent.parent / "examples" / "torch_moe_backward" / "moe_backward.py"


def test_torch_moe_backward_matches_autograd():
    from cutegen.runtime.catalogue import resolve_build_dir

    proc = subprocess.run(
        [sys.executable, str(MOE_BACKWARD), "--build-dir", str(resolve_build_dir()), "--tokens", "2048"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and "dW2" in proc.stdout, proc.stdout
