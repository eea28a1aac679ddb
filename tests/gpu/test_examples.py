"""GPU tier: the examples run and match their references: new_shape_family, torch_moe_layer, torch_moe_backward, expert_parallel (one NCCL rank; two where the host has two GPUs).

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


EP_GPU = Path(__file__).resolve().parent.parent.parent / "examples" / "expert_parallel" / "ep_gpu.py"


def test_expert_parallel_layer_on_one_gpu_matches_one_process_and_torch():
    """A process group of one NCCL rank: prefill, and three CUDA-graph decode replays through
    all_to_all and three through DeepEP's calls (the stand-in where deep_ep is not installed)."""
    from cutegen.runtime.catalogue import resolve_build_dir

    proc = subprocess.run([sys.executable, str(EP_GPU), "--build-dir", str(resolve_build_dir())],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checks: OK" in proc.stdout and proc.stdout.count("replay") == 6, proc.stdout


def test_expert_parallel_layer_on_two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs in one host (NCCL over two ranks)")
    from cutegen.runtime.catalogue import resolve_build_dir

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(EP_GPU),
                           "--build-dir", str(resolve_build_dir())], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checks: OK" in proc.stdout and proc.stdout.count("replay") == 12, proc.stdout
