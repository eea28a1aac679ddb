"""Run every built kernel of the chosen ops once on a small multi-tile problem, for compute-sanitizer.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no \
        python3 tests/gpu/sanitize_kernels.py [--op OP ...] [--pattern S]
    compute-sanitizer --tool synccheck python3 tests/gpu/sanitize_kernels.py --op fp8_gemm_nt --pattern c2x1

(`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: every tensor its own allocation, so that memcheck sees a
read past a small tensor such as SFB, which torch's caching allocator would place inside a larger
block. `--report-api-errors no`: the loader counts a kernel's parameters by calling cuFuncGetParamInfo
until it answers CUDA_ERROR_INVALID_VALUE, and cuda-bindings probes optional driver entry points
at import; the sanitizer would otherwise report those expected API errors beside kernel errors.)
Only kernels that run on the GPU present are run (sm_100a kernels are skipped on Hopper).

Each kernel is forced by name and synchronised, so the sanitizer attributes any error to it; the
problems are small (the sanitizer slows kernels by orders of magnitude) but span several tiles,
several waves of a shrunk grid and ragged edges, which is where out-of-bounds accesses hide. The
script prints one line per kernel and exits non-zero when a launch or a synchronisation fails.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

from cutegen.runtime import (
    bf16_grouped_ops, epilogue_ops, fp8_ops, fused_ops, grouped_ops, k_grouped_ops, ops, quant_ops, sm_budget,
)
from cutegen.runtime.manifest import adds_into_d


def _fp8(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 [rows, cols] and its per-1x128 scales, MN-major and TMA-aligned."""
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    return quant_ops.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned")


def _block_scaled(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 weights with 128x128 block scales (one per group when b has a group mode)."""
    if b.dim() == 2:
        return quant_ops.per_block_quant_fp8(b)
    q, s = zip(*(quant_ops.per_block_quant_fp8(b[g]) for g in range(b.shape[0])))
    return torch.stack(q), torch.stack(s).contiguous()


def run_bf16(name: str) -> None:
    # Each kernel's call: its D type, C where it adds into D, MN-major views where its layout says.
    # K = 520: a last K tile 8 columns deep; split K in 3 splits of 4, 4 and 1 K tiles. M = 296 and 24: a
    # last tile partly and mostly past M (multiples of 8, as an MN-major A's column stride must be).
    schedule = ops.catalogue().manifest(name).schedule
    layout = schedule.get("layout", "nt")
    for m in (296, 24):
        a = torch.randn(m, 520, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(456, 520, device="cuda", dtype=torch.bfloat16)
        if layout in ("tn", "tt"):
            a = a.t().contiguous().t()
        if layout in ("nn", "tn"):
            b = b.t().contiguous().t()
        out = torch.empty(m, 456, device="cuda", dtype=torch.float32 if schedule["c_dtype"] == "f32" else torch.bfloat16)
        c = torch.randn_like(out) if adds_into_d(schedule) else None
        ops.bf16_gemm_nt(a, b, out=out, c=c, kernel=name, k_splits=3 if ("_episk_" in name or "_episkadd_" in name) else None)
        if "_episkw_" in name:
            # Ten SMs: whole waves, then a last wave of a tile or two split three ways.
            sm_budget.set_num_sms(10)
            try:
                ops.bf16_gemm_nt(a, b, out=out, kernel=name, k_splits=3)
            finally:
                sm_budget.set_num_sms(None)


def run_fp8(name: str) -> None:
    # K = 7 blocks: a split-K kernel runs 3 splits of 3, 3 and 1 blocks. N = 1000: a 1x2 cluster of
    # 160-wide tiles has a CTA whose tile starts past the last 128-column SFB block (run with
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that a read past SFB leaves its allocation).
    # M = 300 and 17: tiles whose rows run past M (A's TMA box partly out of bounds). K = 592:
    # the last K block 80 columns deep (its scale block partial, the TMA box past K). K = 4240: 34
    # blocks, so the tile's SFB held in warp registers (32 blocks at a time) moves on a chunk.
    for m, k in ((300, 896), (17, 896), (300, 592), (40, 4240)):
        qb, sb = _block_scaled(torch.randn(1000, k, device="cuda", dtype=torch.bfloat16))
        qa, sa = _fp8(m, k)
        fp8_ops.fp8_gemm_nt(qa, sa, qb, sb, kernel=name, k_splits=3 if "_episk_" in name else None)


def run_wgrad(name: str) -> None:
    # More tiles than one wave of every kernel, so the last wave is tail-split, then fewer tiles
    # than clusters, so the idle clusters take shares of every tile (ragged M and N).
    for m, n, k in ((2200, 2000, 640), (300, 456, 512)):
        qa, sa = _fp8(m, k)
        qb, sb = _fp8(n, k)
        d = torch.randn(m, n, device="cuda")
        fp8_ops.fp8_wgrad_gemm_nt(qa, sa, qb, sb, d, kernel=name)


def run_k_grouped(name: str) -> None:
    sizes = [0, 100, 129, 300, 0]  # empty groups first and last, ragged block counts
    m, n = 296, 456
    x = torch.randn(sum(sizes), m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(sum(sizes), n, device="cuda", dtype=torch.bfloat16)
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    qa, sa = quant_ops.grouped_transposed_quant_fp8(x, sizes_gpu)
    qb, sb = quant_ops.grouped_transposed_quant_fp8(y, sizes_gpu)
    d = torch.randn(len(sizes), m, n, device="cuda")
    k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(qa, sa, qb, sb, d, sizes_gpu, kernel=name)


def run_k_grouped_tn(name: str) -> None:
    # Tokens first (Blackwell's block-scaled kernels): empty groups first and last; the sizes sum
    # past the 8 blocks A holds, so the last group is cut at them; M and N not tile multiples.
    sizes = [0, 256, 128, 384, 512, 0]
    m, n, blocks = 304, 464, 8
    qa = torch.randn(128 * blocks, m, device="cuda").to(torch.float8_e4m3fn)
    qb = torch.randn(128 * blocks, n, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.pow(2.0, torch.randint(-4, 4, (blocks, m), device="cuda").float())
    sb = torch.pow(2.0, torch.randint(-4, 4, (blocks, n), device="cuda").float())
    d = torch.randn(len(sizes), m, n, device="cuda")
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous(qa, sa, qb, sb, d, sizes_gpu, kernel=name)


# The M-grouped GEMMs' K (contiguous and masked; the k-grouped runner has its own): 4 blocks, and 33
# (the SFB a tile holds in warp registers, 32 blocks at a time, moves on a chunk).
M_GROUPED_KS = (512, 4224)


def _contiguous_problems(n: int):
    """Contiguous FP8 problems over three groups, N columns, each K of M_GROUPED_KS:
    (qa, sfa, qb, sfb, m_indices)."""
    align = grouped_ops.contiguous_alignment()
    # An empty group in the middle; 2x1 clusters get a pair of two groups' tiles (no shared B)
    # and a pair of one group's (shared B).
    rows = [align, 0, 3 * align]
    m_indices = torch.cat(
        [torch.full((r,), g, dtype=torch.int32, device="cuda") for g, r in enumerate(rows)]
    )
    m_indices[align - 5 : align] = -1  # padding rows
    for k in M_GROUPED_KS:
        qa, sa = _fp8(int(m_indices.numel()), k)
        qb, sb = _block_scaled(torch.randn(3, n, k, device="cuda", dtype=torch.bfloat16))
        yield qa, sa, qb, sb, m_indices


def run_contiguous(name: str) -> None:
    for operands in _contiguous_problems(456):
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous(*operands, kernel=name)


def _masked_problems(n: int):
    """Masked FP8 problems over three groups (70, 0 and all 192 rows), N columns, each K of
    M_GROUPED_KS: (qa, sfa, qb, sfb, masked_m)."""
    groups, max_m = 3, 192
    masked_m = torch.tensor([70, 0, 192], dtype=torch.int32, device="cuda")
    for k in M_GROUPED_KS:
        a = torch.randn(groups * max_m, k, device="cuda", dtype=torch.bfloat16)
        qa, sa = quant_ops.per_token_quant_fp8(a)
        qa = qa.view(groups, max_m, k)
        sa = fp8_ops.to_mn_major_tma_aligned(sa.view(groups, max_m, k // 128))
        qb, sb = _block_scaled(torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16))
        yield qa, sa, qb, sb, masked_m


def run_masked(name: str) -> None:
    for operands in _masked_problems(456):
        grouped_ops.m_grouped_fp8_gemm_nt_masked(*operands, 96, kernel=name)
        if "_episkw_" in name:
            # Six SMs: whole waves, then a last wave of a few tiles split along K.
            sm_budget.set_num_sms(6)
            try:
                grouped_ops.m_grouped_fp8_gemm_nt_masked(*operands, 96, kernel=name)
            finally:
                sm_budget.set_num_sms(None)


# The SwiGLU kernels' N = 2I: three 256-wide tiles, so a 1x2 cluster's fourth tile lies past N.
SWIGLU_N = 768


def _rounds_scales(name: str) -> bool:
    """A SwiGLU kernel whose output scales are powers of two (`use_ue8m0`)."""
    return ops.catalogue().manifest(name).schedule.get("d_scale", "f32") == "ue8m0"


def run_fp8_swiglu(name: str) -> None:
    for m in (296, 24):  # a last tile partly and mostly past M; K = 528: a partial last K block
        qa, sa = _fp8(m, 528)
        qb, sb = _block_scaled(torch.randn(SWIGLU_N, 528, device="cuda", dtype=torch.bfloat16))
        fused_ops.fp8_gemm_nt_swiglu_quant(qa, sa, qb, sb, use_ue8m0=_rounds_scales(name), kernel=name)


def run_contiguous_swiglu(name: str) -> None:
    for operands in _contiguous_problems(SWIGLU_N):
        fused_ops.m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(*operands, use_ue8m0=_rounds_scales(name), kernel=name)


def run_masked_swiglu(name: str) -> None:
    for operands in _masked_problems(SWIGLU_N):
        fused_ops.m_grouped_fp8_gemm_nt_masked_swiglu_quant(*operands, 96, use_ue8m0=_rounds_scales(name), kernel=name)


def _epilogue_of(name: str) -> tuple[bool, str, bool]:
    """(adds a bias, activation, adds into D) of a bias/activation kernel, from its schedule."""
    schedule = ops.catalogue().manifest(name).schedule
    return (schedule.get("bias", "none") != "none", schedule.get("activation", "none"),
            adds_into_d(schedule))


def run_fp8_epilogue(name: str) -> None:
    # N = 1000: the last tile's columns past N read the last column's bias (a read past the bias
    # would leave its allocation under PYTORCH_NO_CUDA_MEMORY_CACHING=1); M = 296 and 17: tiles past
    # M; K = 592: a partial last K block.
    has_bias, activation, adds = _epilogue_of(name)
    for m in (296, 17):
        qb, sb = _block_scaled(torch.randn(1000, 592, device="cuda", dtype=torch.bfloat16))
        qa, sa = _fp8(m, 592)
        bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16) if has_bias else None
        c = torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) if adds else None
        epilogue_ops.fp8_gemm_nt_epilogue(qa, sa, qb, sb, bias, activation, c=c, kernel=name)


def run_bf16_epilogue(name: str) -> None:
    has_bias, activation, adds = _epilogue_of(name)
    for m in (296, 24):
        a = torch.randn(m, 520, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16) if has_bias else None
        c = torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) if adds else None
        epilogue_ops.bf16_gemm_nt_epilogue(a, b, bias, activation, c=c, kernel=name)


def run_bf16_contiguous(name: str) -> None:
    align = grouped_ops.contiguous_alignment()
    # As run_contiguous; out-of-range groups among the padding rows; N and K no tile multiples.
    rows = [align, 0, 3 * align]
    m_indices = torch.cat(
        [torch.full((r,), g, dtype=torch.int32, device="cuda") for g, r in enumerate(rows)]
    )
    m_indices[align - 5 : align] = torch.tensor([-1, 3, 1000, 2**31 - 1, -7], dtype=torch.int32)
    for k in (200, 1000):
        a = torch.randn(int(m_indices.numel()), k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(3, 456, k, device="cuda", dtype=torch.bfloat16)
        if ops.catalogue().manifest(name).schedule.get("layout", "nt") == "nn":  # MN-major experts
            b = b.transpose(1, 2).contiguous().transpose(1, 2)
        for zero_padding in (True, False):
            bf16_grouped_ops.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, kernel=name, zero_padding=zero_padding)


def run_bf16_masked(name: str) -> None:
    groups, max_m = 3, 192
    masked_m = torch.tensor([70, -3, 2**31 - 1], dtype=torch.int32, device="cuda")
    for k in (200, 1000):
        a = torch.randn(groups, max_m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(groups, 456, k, device="cuda", dtype=torch.bfloat16)
        bf16_grouped_ops.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 96, kernel=name)


def run_bf16_k_grouped(name: str) -> None:
    # Empty groups first and last; a group size past the tokens the operands hold (cut to them).
    sizes = [0, 128, 384, 256, 0]
    m, n = 296, 456
    a = torch.randn(sum(sizes), m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(sum(sizes), n, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(len(sizes), m, n, device="cuda")
    for device_sizes in (sizes, [0, 128, 384, 4096, 2**31 - 1]):
        sizes_gpu = torch.tensor(device_sizes, dtype=torch.int32, device="cuda")
        bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, sizes_gpu, kernel=name)


def run_quant(name: str) -> None:
    manifest = ops.catalogue().manifest(name)
    op, schedule = manifest.op, manifest.schedule
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[schedule["a_dtype"]]
    x = torch.randn(300, 1040, device="cuda", dtype=dtype)  # K: 8 blocks + a ragged one
    if op == "per_token_quant_fp8":
        fmt = "fp32" if schedule["scale"] == "f32" else schedule["scale"]
        for layout in ("k-major", "mn-major-tma-aligned"):
            quant_ops.per_token_quant_fp8(x, scale_format=fmt, scale_layout=layout, kernel=name)
    elif op == "per_token_quant_fp4":
        x = torch.randn(300, 1024 + 32, device="cuda", dtype=dtype)  # K: two 512-column tiles and one group
        for layout in ("k-major", "mn-major-tma-aligned"):
            quant_ops.per_token_quant_fp4(x, scale_layout=layout, kernel=name)
    elif op == "per_block_quant_fp8":
        quant_ops.per_block_quant_fp8(x, kernel=name)
    else:
        sizes = torch.tensor([0, 100, 37, 163], dtype=torch.int32, device="cuda")
        quant_ops.grouped_transposed_quant_fp8(x, sizes, kernel=name)
        # more tiles than two per CTA: the tile-counter path, twice (the counter is reused)
        big = torch.randn(3300, 2048, device="cuda", dtype=dtype)
        sizes = torch.tensor([1000, 0, 129, 2164, 7], dtype=torch.int32, device="cuda")
        for _ in range(2):
            quant_ops.grouped_transposed_quant_fp8(big, sizes, kernel=name)


# The bias/activation epilogues' entry suffixes (`cutegen.runtime.epilogue_ops.entry`).
EPILOGUE_SUFFIXES = ("bias", "bias_silu", "bias_gelu", "silu", "gelu")
RUNNERS: dict[str, Callable[[str], None]] = {
    "bf16_gemm_nt": run_bf16,
    "fp8_gemm_nt": run_fp8,
    "fp8_wgrad_gemm_nt": run_wgrad,
    "k_grouped_fp8_gemm_nt_contiguous": run_k_grouped,
    "k_grouped_fp8_gemm_tn_contiguous": run_k_grouped_tn,
    "m_grouped_fp8_gemm_nt_contiguous": run_contiguous,
    "m_grouped_fp8_gemm_nt_masked": run_masked,
    **{f"fp8_gemm_nt_swiglu_quant{s}": run_fp8_swiglu for s in ("", "_ue8m0")},
    **{f"m_grouped_fp8_gemm_nt_contiguous_swiglu_quant{s}": run_contiguous_swiglu for s in ("", "_ue8m0")},
    **{f"m_grouped_fp8_gemm_nt_masked_swiglu_quant{s}": run_masked_swiglu for s in ("", "_ue8m0")},
    **{f"fp8_gemm_nt_{suffix}": run_fp8_epilogue for suffix in EPILOGUE_SUFFIXES},
    **{f"bf16_gemm_nt_{suffix}": run_bf16_epilogue for suffix in EPILOGUE_SUFFIXES},
    "m_grouped_bf16_gemm_nt_contiguous": run_bf16_contiguous,
    "m_grouped_bf16_gemm_nt_masked": run_bf16_masked,
    "k_grouped_bf16_gemm_tn_contiguous": run_bf16_k_grouped,
    "per_token_quant_fp8": run_quant,
    "per_token_quant_fp4": run_quant,
    "per_block_quant_fp8": run_quant,
    "grouped_transposed_quant_fp8": run_quant,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", action="append", choices=sorted(RUNNERS), help="repeatable; default: all")
    p.add_argument(
        "--pattern", action="append", help="only kernels whose name contains this (repeatable: any of them)"
    )
    args = p.parse_args()
    torch.manual_seed(0)
    failed = 0
    for op in args.op or sorted(RUNNERS):
        for name in ops.runnable_kernels(op):
            if args.pattern and not any(p in name for p in args.pattern):
                continue
            try:
                RUNNERS[op](name)
                torch.cuda.synchronize()
                print(f"ok    {name}", flush=True)
            except Exception as e:  # report and go on: the sanitizer's own log has the details
                failed += 1
                print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                if "CUDA error" in str(e) or "CUDA_ERROR" in str(e):
                    return 1  # the context is gone; later kernels cannot run
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
