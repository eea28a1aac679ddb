"""GPU tier: examples/c_launcher, linked against the real libcuda, runs exported BF16 and FP8 GEMMs
correctly.

Exports the bf16_gemm_nt and fp8_gemm_nt kernels of the build folder ($CUTEGEN_BUILD_DIR or
./build) with `cutegen export`, builds examples/c_launcher with its Makefile (a C compiler, cuda.h,
libcuda) and runs every exported kernel of each program on a few shapes. Each program compares its
results with an exact CPU reference and exits 0 only if all match. Needs no CUDA toolkit: cuda.h may come from
$CUTEGEN_CUDA_INCLUDE, $CUDA_HOME/include, /usr/local/cuda/include or pip's nvidia packages.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLE = REPO / "examples" / "c_launcher"
SHAPES = [(1000, 1536, 2048), (1, 256, 64), (333, 200, 136)]
# FP8: ragged M and N (N a multiple of 8, not of any tile); K = 576 and 16 end in a partial scale block.
FP8_SHAPES = [(1000, 1536, 2048), (1, 264, 128), (333, 200, 384), (100, 7168, 576), (64, 200, 16)]


def cuda_include() -> Path | None:
    candidates = [os.environ.get("CUTEGEN_CUDA_INCLUDE", "")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "include"))
    candidates.append("/usr/local/cuda/include")
    try:
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13/include", "cu12/include", "cuda_runtime/include", "cuda_nvcc/include"):
                candidates.append(os.path.join(base, sub))
    except ImportError:
        pass
    candidates += glob.glob(str(REPO / ".venv/lib/python3*/site-packages/nvidia/cu1*/include"))
    for c in candidates:
        if c and (Path(c) / "cuda.h").is_file():
            return Path(c)
    return None


def libcuda_path() -> str | None:
    """The libcuda this process loads (the driver's), by path: a libcuda.so symlink may not exist."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libcuda.so" in os.path.basename(path) and os.path.isfile(path):
                return path
    return None


def test_c_launcher_runs_exported_bf16_and_fp8_gemms(tmp_path):
    pytest.importorskip("jinja2", reason="cutegen export needs jinja2")
    cc = shutil.which("gcc") or shutil.which("cc")
    make = shutil.which("make")
    if cc is None or make is None:
        pytest.skip("a C compiler and make are needed")
    inc = cuda_include()
    if inc is None:
        pytest.skip("no cuda.h found (set CUTEGEN_CUDA_INCLUDE to a folder with cuda.h)")
    lib = libcuda_path()
    if lib is None:
        pytest.skip("libcuda.so.1 cannot be loaded")

    from cutegen.gen.cli import main
    from cutegen.runtime.catalogue import resolve_build_dir

    export = tmp_path / "export"
    rc = main(["export", "_gemm_bf16_", "_fp8gemm_", "--arch", "sm_90a", "-o", str(export),
               "--build-dir", str(resolve_build_dir())])
    assert rc == 0, "cutegen export failed"
    out = tmp_path / "bin"
    proc = subprocess.run(
        [make, "-C", str(EXAMPLE), f"EXPORT_DIR={export}", f"CUDA_INCLUDE={inc}", f"CUDA_LIBS={lib}",
         f"OUT={out}", f"CC={cc}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for program, shapes in (("c_launcher", SHAPES), ("c_launcher_fp8", FP8_SHAPES)):
        for m, n, k in shapes:
            run = subprocess.run([str(out / program), str(export), "all", str(m), str(n), str(k)],
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, f"{program} {m}x{n}x{k}:\n{run.stdout}\n{run.stderr}"
            assert "PASS" in run.stdout and "FAIL" not in run.stdout
