"""DeepGEMM's own Hopper FP8 GEMM kernels as an anchor measured in the same run as cutegen's.

DeepGEMM (deepseek-ai/DeepGEMM, MIT) compiles its kernels at run time from CUDA C++ headers. This
module compiles its dense 1D2D kernel (`sm90_fp8_gemm_1d2d_impl`: 1x128 activation scales, 128x128
weight scales, bf16 D) ahead of time with nvcc, from a DeepGEMM checkout and a CUTLASS checkout the
user names, one cubin per benchmark shape in the configuration DeepGEMM's own heuristic picks
(`choose_config`), and launches those cubins through cuda-python beside cutegen's kernels:

    cutegen deepgemm-build --deepgemm ~/DeepGEMM --cutlass ~/cutlass -o build/deepgemm   # CPU, nvcc
    cutegen bench --op fp8_gemm_nt --deepgemm build/deepgemm                              # the GPU

Nothing of DeepGEMM is part of cutegen: the generated source only includes DeepGEMM's header from
the given checkout and instantiates its kernel template; the folder written holds the user's own
build of it (cubins, their sources, `deepgemm.json`). The bench checks each DeepGEMM result against
cutegen's on the same operands before timing it (the two kernels promote in the same order, so
they agree to the bit).

Building needs nvcc with sm_90a support (CUDA 12.8 or newer) and no GPU; launching needs only
cuda-python, torch and a Hopper GPU (this module never imports the CuTe DSL).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from cutegen.runtime.params import ceil_div

CONFIG_FILE = "deepgemm.json"
# How reports and printouts name this anchor.
IN_RUN_LABEL = "DeepGEMM in this run"
# The kernel's header inside a DeepGEMM checkout, and a header every CUTLASS checkout has.
KERNEL_HEADER = "deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"
CUTLASS_HEADER = "include/cute/tensor.hpp"
KERNEL_SYMBOL = "sm90_fp8_gemm_1d2d_impl"

# DeepGEMM's SM90 constants (its heuristic and kernel): shared memory per block, the most stages,
# the TMA warpgroup, the 128-wide K block, the block sizes it considers.
SMEM_CAPACITY = 232448
MAX_STAGES = 16
TMA_THREADS = 128
BLOCK_K = 128
BLOCK_N_STEP = 16
BLOCK_N_MAX_1D2D = 192
L1_BYTES_PER_CYCLE_PER_SM = 128
WGMMA_M = 64

def _align(x: int, a: int) -> int:
    return ceil_div(x, a) * a


def swizzle_bytes(block: int, elem_bytes: int) -> int:
    """The largest TMA swizzle (128, 64, 32 or 16 bytes) that divides a row of `block` elements."""
    for mode in (128, 64, 32, 16):
        if block * elem_bytes % mode == 0:
            return mode
    raise ValueError(f"no swizzle divides {block} x {elem_bytes} bytes")


@dataclasses.dataclass(frozen=True)
class DeepGemmConfig:
    """One DeepGEMM 1D2D kernel instantiation for one (M, N, K): its tile, cluster and pipeline."""

    m: int
    n: int
    k: int
    block_m: int
    block_n: int
    cluster_m: int
    cluster_n: int
    stages: int
    smem_bytes: int

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def multicast_on_a(self) -> bool:
        """DeepGEMM multicasts A when the cluster spans N (two N tiles of one M tile)."""
        return self.cluster_n > 1

    @property
    def math_threads(self) -> int:
        return 128 if self.block_m <= 64 else 256

    @property
    def threads(self) -> int:
        return TMA_THREADS + self.math_threads

    @property
    def swizzle_d(self) -> int:
        return swizzle_bytes(self.block_n, 2)

    @property
    def name(self) -> str:
        """Total and one-to-one over the fields that change the cubin or its launch."""
        return (f"deepgemm_1d2d_{self.m}x{self.n}x{self.k}_{self.block_m}x{self.block_n}"
                f"_c{self.cluster_m}x{self.cluster_n}_s{self.stages}")

    def describe(self) -> str:
        mc = f"multicast {'A' if self.multicast_on_a else 'B'}" if self.cluster_size > 1 else "no multicast"
        return f"{self.block_m}x{self.block_n}, cluster {self.cluster_m}x{self.cluster_n} ({mc}), {self.stages} stages"


def pipeline(m: int, n: int, k: int, block_m: int, block_n: int) -> tuple[int, int]:
    """(stages, dynamic shared memory) of a DeepGEMM 1D2D tile: the whole bf16 D tile, the
    per-tile SFB row(s) and the barriers besides the stages of A, B and SFA."""
    smem_d = _align(block_m * block_n * 2, 1024)
    barriers = MAX_STAGES * 8 * 2
    sfb_rows = 1 if BLOCK_K % block_n == 0 else 2
    smem_sfb = _align(ceil_div(k, BLOCK_K) * 4 * sfb_rows, 8)
    fixed = smem_d + barriers + smem_sfb
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + _align(block_m * 4, 128)
    stages = min((SMEM_CAPACITY - fixed) // per_stage, MAX_STAGES)
    return stages, fixed + stages * per_stage


def candidates(m: int, n: int, k: int, sms: int) -> list[DeepGemmConfig]:
    """The tiles DeepGEMM's SM90 heuristic considers for a dense bf16-output 1D2D GEMM."""
    block_ms = [64, 128, 256] + ([16] if m <= 16 else []) + ([32] if m <= 32 else [])
    out = []
    for cluster_m in (1, 2):
        for cluster_n in (1, 2):
            if cluster_m * cluster_n > 2 or sms % (cluster_m * cluster_n):
                continue
            for block_m in block_ms:
                for block_n in range(BLOCK_N_STEP, BLOCK_N_MAX_1D2D + 1, BLOCK_N_STEP):
                    # The kernel's unrolled SFB choice needs these (its own static assertion).
                    spill = block_n - BLOCK_K
                    if block_n > BLOCK_K and block_n % spill and BLOCK_K % spill:
                        continue
                    if block_m > 128 and block_n > 128:  # registers
                        continue
                    stages, smem = pipeline(m, n, k, block_m, block_n)
                    if stages < 3 or (block_m * block_n < 128 * 192 and stages < 4):
                        continue
                    out.append(DeepGemmConfig(m, n, k, block_m, block_n, cluster_m, cluster_n, stages, smem))
    return out


def modelled_cycles(c: DeepGemmConfig, sms: int) -> int:
    """DeepGEMM's SM90 cost model: L1 and L2 bytes over their per-cycle bandwidths, divided by the
    wave efficiency; clusters are never chosen for a single wave."""
    blocks = ceil_div(c.m, c.block_m) * ceil_div(c.n, c.block_n)
    waves = ceil_div(blocks, sms)
    if c.cluster_size > 1 and waves <= 1:
        return 2**63 - 1
    l2_per_cycle = int(min(64.0 * sms, 8e6 / 1.3e3))
    l1_per_cycle = L1_BYTES_PER_CYCLE_PER_SM * sms
    l2_ab = c.k * (c.block_m // c.cluster_n + c.block_n // c.cluster_m)
    l1_ab = c.k * (c.block_m + c.block_n)
    l1_tc = c.k * (max(WGMMA_M, c.block_m) + c.block_n) + c.block_m * c.block_n * 2
    cd = c.block_m * c.block_n * 2
    l2_cycles = (l2_ab + cd) * blocks // l2_per_cycle
    l1_cycles = (l1_ab + l1_tc + cd) * blocks // l1_per_cycle
    return int(max(l1_cycles, l2_cycles) / (blocks / (waves * sms)))


def choose_config(m: int, n: int, k: int, sms: int = 132) -> DeepGemmConfig:
    """The configuration DeepGEMM's SM90 heuristic picks (the first of the cheapest, in its order)."""
    cands = candidates(m, n, k, sms)
    if not cands:
        raise ValueError(f"DeepGEMM's heuristic has no 1D2D tile for {m}x{n}x{k}")
    return min(cands, key=lambda c: modelled_cycles(c, sms))  # min keeps the first of equals


def kernel_source(c: DeepGemmConfig, sms: int = 132) -> str:
    """A translation unit instantiating DeepGEMM's kernel for `c` on a GPU of `sms` SMs (N and K
    compiled in, as DeepGEMM's default `compiled_dims` does; M at run time)."""
    return f"""// Generated by cutegen deepgemm-build: DeepGEMM's sm90_fp8_gemm_1d2d_impl for {c.m}x{c.n}x{c.k}.
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>
using namespace deep_gemm;
static void instantiate() {{
    auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<
        cute::UMMA::Major::K, 0, {c.n}, {c.k}, 1,
        {c.block_m}, {c.block_n}, {BLOCK_K}, 128, 128, {c.swizzle_d},
        {c.stages}, {TMA_THREADS}, {c.math_threads},
        {c.cluster_size}, {str(c.multicast_on_a).lower()},
        {sms}, GemmType::Normal, cutlass::bfloat16_t,
        epilogue::transform::EpilogueIdentity>);
    (void)ptr;
}}
"""


class DeepGemmBuildError(RuntimeError):
    """A build that cannot start: missing checkouts, nvcc or cuobjdump."""


class DeepGemmCompileError(DeepGemmBuildError):
    """nvcc rejected a generated kernel source."""


def check_sources(deepgemm: Path, cutlass: Path) -> None:
    if not (deepgemm / KERNEL_HEADER).is_file():
        raise DeepGemmBuildError(f"--deepgemm {deepgemm}: no {KERNEL_HEADER} (expected a DeepGEMM checkout)")
    if not (cutlass / CUTLASS_HEADER).is_file():
        raise DeepGemmBuildError(f"--cutlass {cutlass}: no {CUTLASS_HEADER} (expected a CUTLASS checkout)")


def nvcc_command(nvcc: str, source: Path, cubin: Path, deepgemm: Path, cutlass: Path) -> list[str]:
    """DeepGEMM's own JIT flags (C++20, sm_90a, -O3, its register-usage level)."""
    return [
        nvcc, str(source), "-cubin", "-o", str(cubin), "-std=c++20", "--gpu-architecture=sm_90a", "-O3",
        "--diag-suppress=39,161,174,177,186,940", "--ptxas-options=--register-usage-level=10",
        "--expt-relaxed-constexpr", "--expt-extended-lambda",
        f"-I{deepgemm / 'deep_gemm' / 'include'}", f"-I{cutlass / 'include'}",
    ]


def _entry_name(cubin: Path) -> str:
    from cutegen.gen.sass import find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        raise DeepGemmBuildError("cuobjdump not found (pip install 'cutegen[gen]')")
    elf = subprocess.run([str(tool), "-elf", str(cubin)], capture_output=True, text=True, check=True).stdout
    names = sorted(set(re.findall(r"\.text\.(_Z\S*" + KERNEL_SYMBOL + r"\S*)", elf)))
    if len(names) != 1:
        raise DeepGemmBuildError(f"{cubin}: expected one {KERNEL_SYMBOL} entry, found {names}")
    return names[0]


def build(
    shapes: Iterable[tuple[int, int, int]], deepgemm: Path, cutlass: Path, out_dir: Path,
    nvcc: str | None = None, jobs: int = 2, sms: int = 132,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Compile DeepGEMM's kernel for each shape into `out_dir` and write its `deepgemm.json`."""
    deepgemm, cutlass, out_dir = Path(deepgemm).expanduser(), Path(cutlass).expanduser(), Path(out_dir)
    check_sources(deepgemm, cutlass)
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise DeepGemmBuildError("nvcc not found: put CUDA 12.8 or newer on PATH, or pass --nvcc")
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = list(dict.fromkeys(choose_config(m, n, k, sms) for m, n, k in shapes))

    def one(c: DeepGemmConfig) -> dict:
        source, cubin = out_dir / f"{c.name}.cu", out_dir / f"{c.name}.cubin"
        source.write_text(kernel_source(c, sms))
        proc = subprocess.run(nvcc_command(nvcc, source, cubin, deepgemm, cutlass), capture_output=True, text=True)
        if proc.returncode != 0:
            raise DeepGemmCompileError(f"nvcc failed for {c.name}:\n{proc.stderr[-3000:]}")
        if progress:
            progress(f"{c.name}: {c.describe()}")
        return {**dataclasses.asdict(c), "name": c.name, "cubin": cubin.name, "entry": _entry_name(cubin),
                "threads": c.threads, "swizzle_d": c.swizzle_d, "sms": sms}

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        entries = list(pool.map(one, configs))
    meta = {"kernels": entries, "deepgemm": _describe_checkout(deepgemm), "cutlass": _describe_checkout(cutlass),
            "nvcc": subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]}
    tmp = out_dir / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, out_dir / CONFIG_FILE)
    return entries


def _describe_checkout(path: Path) -> str:
    """The checkout's commit (and its date) when it is a git work tree, else its path."""
    proc = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    return f"commit {proc.stdout.strip()}" if proc.returncode == 0 and proc.stdout.strip() else str(path)


# ---- launching (the GPU machine: cuda-python and torch, no CuTe DSL) ----------------------------


class DeepGemmAnchor:
    """The kernels of a `deepgemm-build` folder, looked up by shape and launched on torch tensors."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        path = self.folder / CONFIG_FILE
        try:
            meta = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise FileNotFoundError(f"--deepgemm {self.folder}: cannot read {CONFIG_FILE} ({exc}); "
                                    "make it with `cutegen deepgemm-build`") from exc
        self.meta = meta
        self.by_shape = {(e["m"], e["n"], e["k"]): e for e in meta["kernels"]}
        self._functions: dict[str, Any] = {}

    def describe(self) -> str:
        return f"DeepGEMM {self.meta.get('deepgemm')}, CUTLASS {self.meta.get('cutlass')}, {self.meta.get('nvcc')}"

    def config(self, m: int, n: int, k: int) -> dict | None:
        return self.by_shape.get((m, n, k))

    def _function(self, e: dict) -> Any:
        from cutegen.runtime.driver import check, cu, ensure_context

        fn = self._functions.get(e["name"])
        if fn is None:
            ensure_context(0)
            module = check(cu.cuModuleLoadData((self.folder / e["cubin"]).read_bytes()), "cuModuleLoadData")
            fn = check(cu.cuModuleGetFunction(module, e["entry"].encode()), "cuModuleGetFunction")
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(fn, attr, e["smem_bytes"]), "cuFuncSetAttribute")
            self._functions[e["name"]] = fn
        return fn

    def launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, d: Any) -> Callable[[], None]:
        """A call computing D = A·Bᵀ with DeepGEMM's kernel: A e4m3 [M, K], SFA fp32 MN-major and
        TMA-aligned, B e4m3 [N, K], SFB fp32 [⌈N/128⌉, ⌈K/128⌉] K-major, D bf16 [M, N]
        (all contiguous, as DeepGEMM takes them), with its own tensor maps."""
        import ctypes

        import torch

        from cutegen.runtime.driver import check, cu
        from cutegen.runtime.params import TmaArgs
        from cutegen.runtime.tma import encode_tiled

        m, k = a.shape
        n = b.shape[0]
        e = self.config(m, n, k)
        if e is None:
            raise KeyError(f"no DeepGEMM kernel built for {m}x{n}x{k} in {self.folder}")
        if sfa.stride(0) != 1 or sfa.stride(1) != _align(m, 4) or not sfb.is_contiguous():
            raise ValueError("DeepGEMM takes SFA MN-major TMA-aligned and SFB contiguous")
        fn = self._function(e)
        bm, bn, sd = e["block_m"], e["block_n"], e["swizzle_d"]
        swizzle = {16: "none", 32: "32B", 64: "64B", 128: "128B"}
        rows_sfa = _align(m, 4)
        maps = [  # DeepGEMM's host code: L2 promotion 256B, K-major boxes of one 128-byte row
            TmaArgs("e4m3", 2, a.data_ptr(), (k, m), (k,), (BLOCK_K, bm), (1, 1), swizzle="128B", l2_promotion="256B"),
            TmaArgs("e4m3", 2, b.data_ptr(), (k, n), (k,), (BLOCK_K, bn), (1, 1), swizzle="128B", l2_promotion="256B"),
            TmaArgs("bf16", 2, d.data_ptr(), (n, m), (2 * n,), (sd // 2, bm), (1, 1), swizzle=swizzle[sd], l2_promotion="256B"),
            TmaArgs("f32", 2, sfa.data_ptr(), (rows_sfa, ceil_div(k, BLOCK_K)), (4 * rows_sfa,), (bm, 1), (1, 1), l2_promotion="256B"),
        ]
        storage = [ctypes.c_uint64(sfb.data_ptr()), ctypes.c_uint64(0), ctypes.c_uint32(m), ctypes.c_uint32(n),
                   ctypes.c_uint32(k)] + [ctypes.create_string_buffer(encode_tiled(t), 128) for t in maps]
        pointers = (ctypes.c_void_p * len(storage))(*[ctypes.addressof(s) for s in storage])

        def launch() -> None:
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = e["sms"], 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = e["threads"], 1, 1
            config.sharedMemBytes = e["smem_bytes"]
            config.hStream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
            cluster = cu.CUlaunchAttribute()
            cluster.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            cluster.value.clusterDim.x = e["cluster_m"] * e["cluster_n"]
            cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1
            config.attrs = [cluster]
            config.numAttrs = 1
            check(cu.cuLaunchKernelEx(config, fn, ctypes.addressof(pointers), 0), "cuLaunchKernelEx")

        launch.keep_alive = (storage, pointers)  # type: ignore[attr-defined]
        return launch
