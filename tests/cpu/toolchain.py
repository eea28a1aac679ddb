"""Helpers the CPU tests share for compiling emitted C: where cuda.h is, and the kernel-header check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def cuda_include() -> Path | None:
    """A folder holding cuda.h: a pip-installed NVIDIA package's, else the system toolkit's."""
    try:
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13/include", "cu12/include", "cuda_runtime/include"):
                if (Path(base) / sub / "cuda.h").is_file():
                    return Path(base) / sub
    except ImportError:
        pass
    for p in (Path("/usr/local/cuda/include"),):
        if (p / "cuda.h").is_file():
            return p
    return None


def assert_kernel_header_compiles(build_dir: Path, name: str, tmp_path: Path) -> None:
    """A kernel's kernel.h compiles as C11 with -Wall -Werror and its parameter struct covers the
    parameter blob (the header's _Static_asserts pin every offset)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = cuda_include()
    if cc is None or inc is None:
        pytest.fail("a C compiler and cuda.h (pip package nvidia-cuda-runtime) are needed")
    src = tmp_path / "use.c"
    src.write_text(
        f'#include "{build_dir / name / "kernel.h"}"\n'
        f"int main(void) {{ cutegen_{name}_params p; (void)p; return sizeof(p) >= "
        f"CUTEGEN_{name.upper()}_PARAM_BYTES ? 0 : 1; }}\n"
    )
    exe = tmp_path / "use"
    proc = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run([str(exe)]).returncode == 0
