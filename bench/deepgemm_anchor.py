"""DeepGEMM's own Hopper FP8 GEMM kernels as an anchor measured in the same run as cutegen's.

DeepGEMM (deepseek-ai/DeepGEMM, MIT) compiles its kernels at run time from CUDA C++ headers. This
module compiles five of its SM90 kernels ahead of time with nvcc, from a DeepGEMM checkout and a
CUTLASS checkout the user names, one cubin per benchmark problem in the configuration DeepGEMM's
own heuristic picks (`choose_config`), and launches those cubins through cuda-python beside
cutegen's kernels (`DeepGemmKernel` lists them):

- the dense 1D2D kernel (`sm90_fp8_gemm_1d2d_impl`: 1x128 activation scales, 128x128 weight
  scales, bf16 D), beside `fp8_gemm_nt`;
- the same kernel over the contiguous grouped layout (`m_indices`), beside
  `m_grouped_fp8_gemm_nt_contiguous`;
- the same kernel over the masked grouped layout (`masked_m`, each group's rows in a buffer of
  max_m), beside `m_grouped_fp8_gemm_nt_masked`;
- the dense 1D1D kernel (`sm90_fp8_gemm_1d1d_impl`: 1x128 scales on both operands, fp32 D
  accumulated in place), beside `fp8_wgrad_gemm_nt`;
- the same kernel over k-grouped operands (each group's tokens in 128-token blocks, one group
  after another, as `grouped_transposed_quant_fp8` writes them), beside
  `k_grouped_fp8_gemm_nt_contiguous`.

    cutegen deepgemm-build --deepgemm ~/DeepGEMM --cutlass ~/cutlass -o build/deepgemm   # CPU, nvcc
    cutegen bench --deepgemm build/deepgemm                                               # the GPU

Nothing of DeepGEMM is part of cutegen: the generated source only includes DeepGEMM's header from
the given checkout and instantiates its kernel template; the folder written holds the user's own
build of it (cubins, their sources, `deepgemm.json`). The bench checks each DeepGEMM result against
cutegen's on the same operands before timing it (the 1D2D kernels promote in the same order as
cutegen's, so they agree to the bit).

Building needs nvcc with sm_90a support (CUDA 12.8 or newer) and no GPU; launching needs only
cuda-python, torch and a Hopper GPU (this module never imports the CuTe DSL).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from cutegen.runtime.params import TmaArgs, align, ceil_div

CONFIG_FILE = "deepgemm.json"
# How reports and printouts name this anchor.
IN_RUN_LABEL = "DeepGEMM in this run"
# The kernels' folder inside a DeepGEMM checkout, and a header every CUTLASS checkout has.
KERNEL_DIR = "deep_gemm/include/deep_gemm/impls"
KERNEL_HEADER = f"{KERNEL_DIR}/sm90_fp8_gemm_1d2d.cuh"
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
# 1D1D with an fp32 D: N blocks start at 24 (and 16) to avoid bank conflicts, and stop at 160
# for registers.
BLOCK_N_START_1D1D_F32 = 24
BLOCK_N_MAX_1D1D = 160
# DeepGEMM's contiguous layout aligns each group to this many rows and tiles M by it.
CONTIGUOUS_ALIGNMENT = 128
# The k-grouped 1D1D kernel: its heuristic's shared memory for tensor maps (four CUtensorMaps),
# the most groups it still multicasts for, and its tokens per group: whole 128-token blocks.
K_GROUPED_TENSOR_MAP_BYTES = 4 * 128
K_GROUPED_MULTICAST_MAX_GROUPS = 4
K_GROUPED_TOKEN_ALIGNMENT = 128
L1_BYTES_PER_CYCLE_PER_SM = 128
WGMMA_M = 64


class DeepGemmKernel(enum.Enum):
    """The DeepGEMM SM90 kernels this anchor builds, each the counterpart of one cutegen op."""

    DENSE_1D2D = "1d2d"
    CONTIGUOUS_1D2D = "contiguous_1d2d"
    MASKED_1D2D = "masked_1d2d"
    WGRAD_1D1D = "1d1d"
    K_GROUPED_1D1D = "k_grouped_1d1d"

    @property
    def op(self) -> str:
        """The cutegen op it is timed beside."""
        return {"1d2d": "fp8_gemm_nt", "contiguous_1d2d": "m_grouped_fp8_gemm_nt_contiguous",
                "masked_1d2d": "m_grouped_fp8_gemm_nt_masked", "1d1d": "fp8_wgrad_gemm_nt",
                "k_grouped_1d1d": "k_grouped_fp8_gemm_nt_contiguous"}[self.value]

    @property
    def is_1d1d(self) -> bool:
        """Scaled 1x128 on both operands, fp32 D accumulated in place (`sm90_fp8_gemm_1d1d_impl`)."""
        return self in (DeepGemmKernel.WGRAD_1D1D, DeepGemmKernel.K_GROUPED_1D1D)

    @property
    def is_grouped(self) -> bool:
        """Several groups in one launch (its configurations and names carry the group count)."""
        return self in (DeepGemmKernel.CONTIGUOUS_1D2D, DeepGemmKernel.MASKED_1D2D, DeepGemmKernel.K_GROUPED_1D1D)

    @property
    def counts_every_group(self) -> bool:
        """Its heuristic counts the tiles of every group, each of the problem's M (the masked layout:
        the expected rows per group; the k-grouped one: every group's tiles)."""
        return self in (DeepGemmKernel.MASKED_1D2D, DeepGemmKernel.K_GROUPED_1D1D)

    @property
    def symbol(self) -> str:
        return "sm90_fp8_gemm_1d1d_impl" if self.is_1d1d else KERNEL_SYMBOL

    @property
    def header(self) -> str:
        return f"{KERNEL_DIR}/{self.symbol.removesuffix('_impl')}.cuh"

    @property
    def gemm_type(self) -> str:
        return {DeepGemmKernel.CONTIGUOUS_1D2D: "MGroupedContiguous", DeepGemmKernel.MASKED_1D2D: "MGroupedMasked",
                DeepGemmKernel.K_GROUPED_1D1D: "KGroupedContiguous"}.get(self, "Normal")

    @property
    def d_bytes(self) -> int:
        """Bytes per element of D: bf16 for 1D2D, fp32 for 1D1D."""
        return 4 if self.is_1d1d else 2

    @property
    def accumulates(self) -> bool:
        """Whether D is read as well as written (the 1D1D kernel reduce-adds into D)."""
        return self.is_1d1d


def swizzle_bytes(block: int, elem_bytes: int) -> int:
    """The largest TMA swizzle (128, 64, 32 or 16 bytes) that divides a row of `block` elements."""
    for mode in (128, 64, 32, 16):
        if block * elem_bytes % mode == 0:
            return mode
    raise ValueError(f"no swizzle divides {block} x {elem_bytes} bytes")


@dataclasses.dataclass(frozen=True)
class DeepGemmConfig:
    """One DeepGEMM kernel instantiation for one problem: its tile, cluster and pipeline. For the
    contiguous layout M is the total row count (every group's rows and padding) over `groups`; for
    the masked one the expected rows per group (DeepGEMM's `expected_m`: its buffers' max_m is a
    run-time value); for the k-grouped one K is the largest group's tokens (DeepGEMM's expected K),
    in 128-token blocks."""

    m: int
    n: int
    k: int
    block_m: int
    block_n: int
    cluster_m: int
    cluster_n: int
    stages: int
    smem_bytes: int
    kernel: DeepGemmKernel = DeepGemmKernel.DENSE_1D2D
    groups: int = 1

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
        """D's TMA swizzle in bytes; 0 (none) for the fp32 D of the 1D1D kernel."""
        return 0 if self.kernel.d_bytes == 4 else swizzle_bytes(self.block_n, self.kernel.d_bytes)

    @property
    def store_block_m(self) -> int:
        """Rows of D per TMA store: the 1D1D kernel stores one warpgroup's 64 rows at a time."""
        return WGMMA_M if self.kernel.is_1d1d else self.block_m

    @property
    def name(self) -> str:
        """Total and one-to-one over the fields that change the cubin or its launch."""
        groups = f"_g{self.groups}" if self.kernel.is_grouped else ""
        return (f"deepgemm_{self.kernel.value}{groups}_{self.m}x{self.n}x{self.k}_{self.block_m}x{self.block_n}"
                f"_c{self.cluster_m}x{self.cluster_n}_s{self.stages}")

    def describe(self) -> str:
        mc = f"multicast {'A' if self.multicast_on_a else 'B'}" if self.cluster_size > 1 else "no multicast"
        return f"{self.block_m}x{self.block_n}, cluster {self.cluster_m}x{self.cluster_n} ({mc}), {self.stages} stages"

    def short(self) -> str:
        """Tile, cluster and stages, as reports print them."""
        return short_config(dataclasses.asdict(self))


def short_config(entry: dict) -> str:
    """A `deepgemm.json` entry's (or a config's fields') tile, cluster and stages, as reports
    print them; folders written before entries carried "config" have the fields only."""
    if entry.get("config"):
        return entry["config"]
    return f"{entry['block_m']}x{entry['block_n']} c{entry['cluster_m']}x{entry['cluster_n']} s{entry['stages']}"


def pipeline(m: int, n: int, k: int, block_m: int, block_n: int,
             kernel: DeepGemmKernel = DeepGemmKernel.DENSE_1D2D) -> tuple[int, int]:
    """(stages, dynamic shared memory) of a DeepGEMM tile: the whole D tile and the barriers
    besides the stages of A, B and SFA; 1D2D adds the per-tile SFB row(s), 1D1D an SFB stage, the
    k-grouped kernel its tensor maps."""
    smem_d = align(block_m * block_n * kernel.d_bytes, 1024)
    barriers = MAX_STAGES * 8 * 2
    tensor_maps = K_GROUPED_TENSOR_MAP_BYTES if kernel is DeepGemmKernel.K_GROUPED_1D1D else 0
    if kernel.is_1d1d:
        smem_sfb, sfb_per_stage = 0, align(block_n * 4, 128)
    else:
        sfb_rows = 1 if BLOCK_K % block_n == 0 else 2
        smem_sfb, sfb_per_stage = align(ceil_div(k, BLOCK_K) * 4 * sfb_rows, 8), 0
    fixed = smem_d + barriers + smem_sfb + tensor_maps
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + align(block_m * 4, 128) + sfb_per_stage
    stages = min((SMEM_CAPACITY - fixed) // per_stage, MAX_STAGES)
    return stages, fixed + stages * per_stage


def _block_ms(m: int, kernel: DeepGemmKernel) -> list[int]:
    if kernel is DeepGemmKernel.CONTIGUOUS_1D2D:
        return [CONTIGUOUS_ALIGNMENT]
    if kernel is DeepGemmKernel.MASKED_1D2D:
        return [64, 128]
    small = ([16] if m <= 16 else []) + ([32] if m <= 32 else [])
    # 256-row tiles only with a bf16 D (registers).
    return [64, 128] + small + ([256] if kernel.d_bytes == 2 else [])


def _block_ns(kernel: DeepGemmKernel) -> list[int]:
    if kernel.is_1d1d:
        return [BLOCK_N_STEP] + list(range(BLOCK_N_START_1D1D_F32, BLOCK_N_MAX_1D1D + 1, BLOCK_N_STEP))
    return list(range(BLOCK_N_STEP, BLOCK_N_MAX_1D2D + 1, BLOCK_N_STEP))


def _sfb_unroll_allows(block_n: int) -> bool:
    """The 1D2D kernel's unrolled SFB choice (its own static assertion)."""
    spill = block_n - BLOCK_K
    return not (block_n > BLOCK_K and block_n % spill and BLOCK_K % spill)


def candidates(m: int, n: int, k: int, sms: int, kernel: DeepGemmKernel = DeepGemmKernel.DENSE_1D2D,
               groups: int = 1) -> list[DeepGemmConfig]:
    """The tiles DeepGEMM's SM90 heuristic considers, in its order (no clusters for more than
    K_GROUPED_MULTICAST_MAX_GROUPS k-grouped groups; the masked layout multicasts only where the
    cluster divides its N tiles)."""
    out = []
    extents = (1,) if kernel is DeepGemmKernel.K_GROUPED_1D1D and groups > K_GROUPED_MULTICAST_MAX_GROUPS else (1, 2)
    for cluster_m in extents:
        for cluster_n in extents:
            if cluster_m * cluster_n > 2 or sms % (cluster_m * cluster_n):
                continue
            for block_m in _block_ms(m, kernel):
                for block_n in _block_ns(kernel):
                    if not kernel.is_1d1d and not _sfb_unroll_allows(block_n):
                        continue
                    if block_m > 128 and block_n > 128:  # registers
                        continue
                    if kernel is DeepGemmKernel.MASKED_1D2D and ceil_div(n, block_n) % (cluster_m * cluster_n):
                        continue
                    stages, smem = pipeline(m, n, k, block_m, block_n, kernel)
                    if stages < 3 or (block_m * block_n < 128 * 192 and stages < 4):
                        continue
                    out.append(DeepGemmConfig(m, n, k, block_m, block_n, cluster_m, cluster_n, stages, smem,
                                              kernel, groups))
    return out


def modelled_cycles(c: DeepGemmConfig, sms: int) -> int:
    """DeepGEMM's SM90 cost model: L1 and L2 bytes over their per-cycle bandwidths, divided by the
    wave efficiency; clusters are never chosen for a single wave. (The contiguous layout counts
    its total rows as one problem, as DeepGEMM does; the masked one every group's tiles of the
    expected rows; the k-grouped one every group's tiles, each with the largest group's K.)"""
    blocks = ceil_div(c.m, c.block_m) * ceil_div(c.n, c.block_n)
    if c.kernel.counts_every_group:
        blocks *= c.groups
    waves = ceil_div(blocks, sms)
    if c.cluster_size > 1 and waves <= 1:
        return 2**63 - 1
    l2_per_cycle = int(min(64.0 * sms, 8e6 / 1.3e3))
    l1_per_cycle = L1_BYTES_PER_CYCLE_PER_SM * sms
    tile_d = c.block_m * c.block_n * c.kernel.d_bytes
    l2_ab = c.k * (c.block_m // c.cluster_n + c.block_n // c.cluster_m)
    l1_ab = c.k * (c.block_m + c.block_n)
    l1_tc = c.k * (max(WGMMA_M, c.block_m) + c.block_n) + tile_d
    cd = tile_d * (2 if c.kernel.accumulates else 1)
    l2_cycles = (l2_ab + cd) * blocks // l2_per_cycle
    l1_cycles = (l1_ab + l1_tc + cd) * blocks // l1_per_cycle
    return int(max(l1_cycles, l2_cycles) / (blocks / (waves * sms)))


def choose_config(m: int, n: int, k: int, sms: int = 132, kernel: DeepGemmKernel = DeepGemmKernel.DENSE_1D2D,
                  groups: int = 1) -> DeepGemmConfig:
    """The configuration DeepGEMM's SM90 heuristic picks (the first of the cheapest, in its order)."""
    cands = candidates(m, n, k, sms, kernel, groups)
    if not cands:
        raise ValueError(f"DeepGEMM's heuristic has no {kernel.value} tile for {m}x{n}x{k}")
    return min(cands, key=lambda c: modelled_cycles(c, sms))  # min keeps the first of equals


@dataclasses.dataclass(frozen=True)
class DeepGemmProblem:
    """One problem to build a DeepGEMM kernel for; for the contiguous layout M is the total rows,
    for the masked layout the expected rows per group."""

    kernel: DeepGemmKernel
    m: int
    n: int
    k: int
    groups: int = 1

    def config(self, sms: int = 132) -> DeepGemmConfig:
        return choose_config(self.m, self.n, self.k, sms, self.kernel, self.groups)


def kernel_source(c: DeepGemmConfig, sms: int = 132) -> str:
    """A translation unit instantiating DeepGEMM's kernel for `c` on a GPU of `sms` SMs (N and K
    compiled in, as DeepGEMM's default `compiled_dims` does; M at run time)."""
    head = f"// Generated by cutegen deepgemm-build: DeepGEMM's {c.kernel.symbol} for {c.name}.\n"
    if c.kernel.is_1d1d:
        # The k-grouped form compiles M and N in and takes K (the groups' sum) at run time, as
        # DeepGEMM's k_grouped_fp8_gemm_nt_contiguous does by default (compiled_dims "mn").
        dims = f"{c.m}, {c.n}, 0" if c.kernel is DeepGemmKernel.K_GROUPED_1D1D else f"0, {c.n}, {c.k}"
        args = (f"{dims}, {c.groups},\n        {c.block_m}, {c.block_n}, {BLOCK_K}, 128, 128,\n"
                f"        {c.stages}, {TMA_THREADS}, {c.math_threads},\n"
                f"        {c.cluster_size}, {str(c.multicast_on_a).lower()},\n"
                f"        {sms}, GemmType::{c.kernel.gemm_type}, float")
    else:
        args = (f"cute::UMMA::Major::K, 0, {c.n}, {c.k}, {c.groups},\n"
                f"        {c.block_m}, {c.block_n}, {BLOCK_K}, 128, 128, {c.swizzle_d},\n"
                f"        {c.stages}, {TMA_THREADS}, {c.math_threads},\n"
                f"        {c.cluster_size}, {str(c.multicast_on_a).lower()},\n"
                f"        {sms}, GemmType::{c.kernel.gemm_type}, cutlass::bfloat16_t,\n"
                f"        epilogue::transform::EpilogueIdentity")
    return head + f"""#include <{c.kernel.header.removeprefix('deep_gemm/include/')}>
using namespace deep_gemm;
static void instantiate() {{
    auto ptr = reinterpret_cast<void*>(&{c.kernel.symbol}<
        {args}>);
    (void)ptr;
}}
"""


class DeepGemmBuildError(RuntimeError):
    """A build that cannot start: missing checkouts or nvcc."""


class DeepGemmCompileError(DeepGemmBuildError):
    """nvcc rejected a generated kernel source."""


def check_sources(deepgemm: Path, cutlass: Path, kernels: Iterable[DeepGemmKernel] = (DeepGemmKernel.DENSE_1D2D,)) -> None:
    for header in sorted({k.header for k in kernels}):
        if not (deepgemm / header).is_file():
            raise DeepGemmBuildError(f"--deepgemm {deepgemm}: no {header} (expected a DeepGEMM checkout)")
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


def compile_error_hint(stderr: str) -> str:
    """A line on the likely cause of an nvcc failure that names no source error, or ""."""
    if "Unsupported .version" in stderr:
        # nvcc's front end (nvvm) emitted a newer PTX ISA than its ptxas reads: e.g. PyPI's
        # nvidia-cuda-nvcc 13.0 beside the nvidia-nvvm 13.5 that an unpinned install resolves.
        return ("the PTX version is newer than this ptxas reads: nvcc's nvvm and ptxas come from "
                "different CUDA releases (installed from PyPI, pin nvidia-nvvm to the version of "
                "nvidia-cuda-nvcc)")
    return ""


def _entry_name(cubin: Path, symbol: str = KERNEL_SYMBOL) -> str:
    """The mangled entry name of `symbol` in `cubin`, read from the ELF section names (`.text.<entry>`)
    in its string table: no disassembler needed where the kernels are built."""
    names = sorted({m.decode() for m in re.findall(rb"\.text\.(_Z[\x21-\x7e]*" + symbol.encode() + rb"[\x21-\x7e]*)\x00",
                                                   cubin.read_bytes())})
    if len(names) != 1:
        raise DeepGemmBuildError(f"{cubin}: expected one {symbol} entry, found {names}")
    return names[0]


def _as_problem(p: DeepGemmProblem | tuple[int, int, int]) -> DeepGemmProblem:
    return p if isinstance(p, DeepGemmProblem) else DeepGemmProblem(DeepGemmKernel.DENSE_1D2D, *p)


def build(
    problems: Iterable[DeepGemmProblem | tuple[int, int, int]], deepgemm: Path, cutlass: Path, out_dir: Path,
    nvcc: str | None = None, jobs: int = 2, sms: int = 132,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Compile DeepGEMM's kernel for each problem (an (M, N, K) tuple is a dense 1D2D one) into
    `out_dir` and write its `deepgemm.json`."""
    deepgemm, cutlass, out_dir = Path(deepgemm).expanduser(), Path(cutlass).expanduser(), Path(out_dir)
    problems = [_as_problem(p) for p in problems]
    check_sources(deepgemm, cutlass, {p.kernel for p in problems})
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise DeepGemmBuildError("nvcc not found: put CUDA 12.8 or newer on PATH, or pass --nvcc")
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = list(dict.fromkeys(p.config(sms) for p in problems))

    def one(c: DeepGemmConfig) -> dict:
        source, cubin = out_dir / f"{c.name}.cu", out_dir / f"{c.name}.cubin"
        source.write_text(kernel_source(c, sms))
        proc = subprocess.run(nvcc_command(nvcc, source, cubin, deepgemm, cutlass), capture_output=True, text=True)
        if proc.returncode != 0:
            hint = compile_error_hint(proc.stderr)
            raise DeepGemmCompileError(
                f"nvcc failed for {c.name}:\n{proc.stderr[-3000:]}" + (f"\nlikely cause: {hint}" if hint else "")
            )
        if progress:
            progress(f"{c.name}: {c.describe()}")
        return {**dataclasses.asdict(c), "kernel": c.kernel.value, "name": c.name, "cubin": cubin.name,
                "entry": _entry_name(cubin, c.kernel.symbol), "threads": c.threads, "swizzle_d": c.swizzle_d,
                "store_block_m": c.store_block_m, "config": c.short(), "sms": sms}

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


# DeepGEMM's host code encodes every tensor map with 256-byte L2 promotion; its fp8 operands are
# K-major boxes of one 128-byte row (128B swizzle), its fp32 scales MN-major, TMA-aligned columns.
def _fp8_k_major_map(t: Any, rows: int, k: int, box_rows: int) -> TmaArgs:
    return TmaArgs("e4m3", 2, t.data_ptr(), (k, rows), (k,), (BLOCK_K, box_rows), (1, 1), swizzle="128B",
                   l2_promotion="256B")


def _scale_map(sf: Any, rows: int, k: int, box_rows: int, groups: int = 1) -> TmaArgs:
    """An MN-major, TMA-aligned scale tensor: columns of align(rows, 4) scales, one per K block (and
    group, the groups' columns one after another)."""
    aligned = align(rows, 4)
    return TmaArgs("f32", 2, sf.data_ptr(), (aligned, ceil_div(k, BLOCK_K) * groups), (4 * aligned,), (box_rows, 1),
                   (1, 1), l2_promotion="256B")


def _key(kernel: str, m: int, n: int, k: int, groups: int) -> tuple:
    return (kernel, m, n, k, groups)


class DeepGemmAnchor:
    """The kernels of a `deepgemm-build` folder, looked up by problem and launched on torch tensors."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        path = self.folder / CONFIG_FILE
        try:
            meta = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise FileNotFoundError(f"--deepgemm {self.folder}: cannot read {CONFIG_FILE} ({exc}); "
                                    "make it with `cutegen deepgemm-build`") from exc
        self.meta = meta
        # Folders written before the grouped and 1D1D kernels hold dense 1D2D entries only.
        self.by_problem = {
            _key(e.get("kernel", DeepGemmKernel.DENSE_1D2D.value), e["m"], e["n"], e["k"], e.get("groups", 1)): e
            for e in meta["kernels"]
        }
        self._functions: dict[str, Any] = {}

    def describe(self) -> str:
        return f"DeepGEMM {self.meta.get('deepgemm')}, CUTLASS {self.meta.get('cutlass')}, {self.meta.get('nvcc')}"

    def config(self, m: int, n: int, k: int, kernel: DeepGemmKernel = DeepGemmKernel.DENSE_1D2D,
               groups: int = 1) -> dict | None:
        return self.by_problem.get(_key(kernel.value, m, n, k, groups))

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

    def _entry(self, m: int, n: int, k: int, kernel: DeepGemmKernel, groups: int = 1) -> dict:
        e = self.config(m, n, k, kernel, groups)
        if e is None:
            what = f"{groups} groups, " if kernel.is_grouped else ""
            raise KeyError(f"no DeepGEMM {kernel.value} kernel built for {what}{m}x{n}x{k} in {self.folder}")
        return e

    def launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, d: Any) -> Callable[[], None]:
        """A call computing D = A·Bᵀ with DeepGEMM's dense 1D2D kernel: A e4m3 [M, K], SFA fp32
        MN-major and TMA-aligned, B e4m3 [N, K], SFB fp32 [⌈N/128⌉, ⌈K/128⌉] K-major, D bf16 [M, N]
        (all contiguous, as DeepGEMM takes them), with its own tensor maps."""
        m, k = a.shape
        n = b.shape[0]
        e = self._entry(m, n, k, DeepGemmKernel.DENSE_1D2D)
        return self._launch_1d2d(e, a, sfa, b, sfb, d, m, n, k, groups=1, m_indices=None)

    def contiguous_launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, m_indices: Any, d: Any) -> Callable[[], None]:
        """The contiguous grouped layout with DeepGEMM's 1D2D kernel: A e4m3 [ΣM, K], B e4m3
        [G, N, K], SFB fp32 [G, ⌈N/128⌉, ⌈K/128⌉], `m_indices` int32 [ΣM] (-1 on padding rows,
        each group aligned to CONTIGUOUS_ALIGNMENT rows), D bf16 [ΣM, N]."""
        m, k = a.shape
        groups, n = b.shape[0], b.shape[1]
        if m % CONTIGUOUS_ALIGNMENT:
            raise ValueError(f"DeepGEMM's contiguous layout needs the total rows ({m}) to be a multiple of "
                             f"{CONTIGUOUS_ALIGNMENT}")
        e = self._entry(m, n, k, DeepGemmKernel.CONTIGUOUS_1D2D, groups)
        return self._launch_1d2d(e, a, sfa, b, sfb, d, m, n, k, groups=groups, m_indices=m_indices)

    def masked_launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, masked_m: Any, d: Any,
                        expected_m: int) -> Callable[[], None]:
        """The masked grouped layout with DeepGEMM's 1D2D kernel: A e4m3 [G, max_m, K], SFA fp32
        [G, max_m, ⌈K/128⌉] MN-major and TMA-aligned (one column of align(max_m, 4) scales per
        group and K block), B e4m3 [G, N, K], SFB fp32 [G, ⌈N/128⌉, ⌈K/128⌉], `masked_m` int32 [G]
        (the real rows of each group), D bf16 [G, max_m, N]; its kernel is the one built for
        `expected_m` rows per group, as DeepGEMM's heuristic chooses it. Rows of D past a group's
        masked_m are not written."""
        groups, max_m, k = a.shape
        n = b.shape[1]
        aligned = align(max_m, 4)
        if sfa.stride(1) != 1 or sfa.stride(2) != aligned or sfa.stride(0) != aligned * sfa.shape[2]:
            raise ValueError("DeepGEMM takes the masked SFA MN-major and TMA-aligned, group after group")
        e = self._entry(expected_m, n, k, DeepGemmKernel.MASKED_1D2D, groups)
        return self._launch_1d2d(e, a, sfa, b, sfb, d, max_m, n, k, groups=groups, m_indices=masked_m,
                                 masked=True)

    def _launch_1d2d(self, e, a, sfa, b, sfb, d, m, n, k, groups, m_indices, masked=False) -> Callable[[], None]:
        """DeepGEMM's 1D2D kernel on these operands: for the masked layout, A, D and SFA hold
        `groups` buffers of `m` rows one after another (its maps span them all) and `m_indices` is
        masked_m."""
        import ctypes

        if not sfb.is_contiguous() or (not masked and (sfa.stride(0) != 1 or sfa.stride(1) != align(m, 4))):
            raise ValueError("DeepGEMM takes SFA MN-major TMA-aligned and SFB contiguous")
        bm, bn, sd = e["block_m"], e["block_n"], e["swizzle_d"]
        swizzle = {16: "none", 32: "32B", 64: "64B", 128: "128B"}
        rows = m * groups if masked else m
        maps = [
            _fp8_k_major_map(a, rows, k, bm),
            _fp8_k_major_map(b, n * groups, k, bn),
            TmaArgs("bf16", 2, d.data_ptr(), (n, rows), (2 * n,), (sd // 2, bm), (1, 1), swizzle=swizzle[sd],
                    l2_promotion="256B"),
            _scale_map(sfa, m, k, bm, groups if masked else 1),
        ]
        grouped = ctypes.c_uint64(m_indices.data_ptr() if m_indices is not None else 0)
        scalars = [ctypes.c_uint64(sfb.data_ptr()), grouped, ctypes.c_uint32(m), ctypes.c_uint32(n), ctypes.c_uint32(k)]
        return self._launch(e, scalars, maps)

    def wgrad_launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, d: Any) -> Callable[[], None]:
        """D += A·Bᵀ with DeepGEMM's dense 1D1D kernel: A e4m3 [M, K], B e4m3 [N, K], SFA [M, ⌈K/128⌉]
        and SFB [N, ⌈K/128⌉] fp32, MN-major and TMA-aligned, D fp32 [M, N] (reduce-added in place)."""
        import ctypes

        m, k = a.shape
        n = b.shape[0]
        e = self._entry(m, n, k, DeepGemmKernel.WGRAD_1D1D)
        for name, sf, rows in (("SFA", sfa, m), ("SFB", sfb, n)):
            if sf.stride(0) != 1 or sf.stride(1) != align(rows, 4):
                raise ValueError(f"DeepGEMM takes {name} MN-major and TMA-aligned")
        bm, bn = e["block_m"], e["block_n"]
        maps = [
            _fp8_k_major_map(a, m, k, bm),
            _fp8_k_major_map(b, n, k, bn),
            _scale_map(sfa, m, k, bm),
            _scale_map(sfb, n, k, bn),
            TmaArgs("f32", 2, d.data_ptr(), (n, m), (4 * n,), (bn, e["store_block_m"]), (1, 1), l2_promotion="256B"),
        ]
        # A and B pointers, the grouped layout and the tensor-map buffer serve the k-grouped form only.
        scalars = [ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(0),
                   ctypes.c_uint32(m), ctypes.c_uint32(n), ctypes.c_uint32(k)]
        return self._launch(e, scalars, maps)

    def k_grouped_launcher(self, a: Any, sfa: Any, b: Any, sfb: Any, d: Any, group_sizes: list[int]) -> Callable[[], None]:
        """D[g] += A_g·B_gᵀ for every group with DeepGEMM's 1D1D kernel over k-grouped operands, laid
        out as `k_grouped_fp8_gemm_nt_contiguous` takes them: A and B flat e4m3, each group's [M, k]
        and [N, k] K-major with its tokens padded to whole 128-token blocks; SFA [S, M] and SFB
        [S, N] fp32, one row per 128-token block of every group in order; D fp32 [G, M, N].
        DeepGEMM takes token counts that are multiples of 128, so each group is given its padded
        count (the padding tokens are in the operands either way; cutegen's kernel multiplies
        them too). `group_sizes` (host ints) are the real counts."""
        import ctypes

        import torch

        groups, m, n = d.shape
        padded = [align(int(t), K_GROUPED_TOKEN_ALIGNMENT) for t in group_sizes]
        if len(padded) != groups:
            raise ValueError(f"{len(padded)} group sizes for a D of {groups} groups")
        if m % 4 or n % 4 or not d.is_contiguous():
            raise ValueError("DeepGEMM takes M and N multiples of 4 and a contiguous D")
        blocks = sum(padded) // K_GROUPED_TOKEN_ALIGNMENT
        if a.numel() < blocks * K_GROUPED_TOKEN_ALIGNMENT * m or b.numel() < blocks * K_GROUPED_TOKEN_ALIGNMENT * n:
            raise ValueError("A or B holds fewer 128-token blocks than the group sizes need")
        e = self._entry(m, n, max(padded), DeepGemmKernel.K_GROUPED_1D1D, groups)
        bm, bn = e["block_m"], e["block_n"]
        # The A and B maps start at the first non-empty group; the kernel rewrites their address
        # and K for each group in its own copies (the tensor-map buffer, two maps per SM).
        first_k = next((t for t in padded if t), K_GROUPED_TOKEN_ALIGNMENT)
        maps = [
            _fp8_k_major_map(a, m, first_k, bm),
            _fp8_k_major_map(b, n, first_k, bn),
            _scale_map(sfa, m, blocks * BLOCK_K, bm),
            _scale_map(sfb, n, blocks * BLOCK_K, bn),
            TmaArgs("f32", 2, d.data_ptr(), (n, m * groups), (4 * n,), (bn, e["store_block_m"]), (1, 1),
                    l2_promotion="256B"),
        ]
        sizes = torch.tensor(padded, dtype=torch.int32, device=d.device)
        tensor_map_buffer = torch.empty(e["sms"] * K_GROUPED_TENSOR_MAP_BYTES, dtype=torch.uint8, device=d.device)
        scalars = [ctypes.c_uint64(a.data_ptr()), ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(sizes.data_ptr()),
                   ctypes.c_uint64(tensor_map_buffer.data_ptr()),
                   ctypes.c_uint32(m), ctypes.c_uint32(n), ctypes.c_uint32(sum(padded))]
        launch = self._launch(e, scalars, maps)
        launch.keep_alive += (sizes, tensor_map_buffer)  # type: ignore[attr-defined]
        return launch

    def _launch(self, e: dict, scalars: list, maps: list) -> Callable[[], None]:
        """A launch of entry `e` with these parameters (scalars first, then the tensor maps) on a
        grid of one CTA per SM, clustered as the entry says."""
        import ctypes

        import torch

        from cutegen.runtime.driver import check, cu
        from cutegen.runtime.tma import encode_tiled

        fn = self._function(e)
        storage = scalars + [ctypes.create_string_buffer(encode_tiled(t), 128) for t in maps]
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
