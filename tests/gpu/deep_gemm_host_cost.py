"""Host time per call of `cutegen.deep_gemm.fp8_gemm_nt` beside cutegen's native call and the anchors, same process.

Run on a GPU machine: ``python tests/gpu/deep_gemm_host_cost.py [--m 128 --n 3072 --k 4096]``.
The masked row keeps its operands fixed in both columns. Each row issues N calls back to back without synchronising and reports wall µs per call (the
kernels take ~10 µs, so a slower host is what the number shows), with the operands and output
fixed and with them rotating through 1,000 buffers (what an engine's layers do). Anchors:
cuBLAS blockwise FP8 through ``torch.nn.functional.scaled_mm`` and a bf16 ``torch.matmul``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import cutegen.deep_gemm as dg
from cutegen.runtime import fp8_ops, ops, quant_ops

ROTATION = 1000


def per_call_us(calls: list, repeats: int = 3) -> float:
    """Median over ``repeats`` of the wall µs per call of issuing ``calls`` once each."""
    for call in calls[:50]:
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        samples.append((time.perf_counter() - start) / len(calls) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--n", type=int, default=3072)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    m, n, k, calls = args.m, args.n, args.k, args.calls
    if m % 4:
        parser.error("--m must be a multiple of 4 (cuBLAS's SFA layout is then the MN-major one)")
    kb = -(-k // 128)
    qb = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sb = torch.rand(-(-n // 128), kb, device="cuda") + 0.5

    def operands(count: int):
        out = []
        for _ in range(count):
            qa = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            rows = torch.rand(m, kb, device="cuda") + 0.5
            out.append((qa, rows, fp8_ops.to_mn_major_tma_aligned(rows), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        return out

    fixed, rotating = operands(1), operands(ROTATION)
    sb4 = torch.zeros(sb.shape[0], -(-kb // 4) * 4, device="cuda")
    sb4[:, :kb] = sb
    scale_b = sb4.t()
    st = F.ScalingType
    a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    groups = 4
    qa4 = torch.randn(groups, m, k, device="cuda").to(torch.float8_e4m3fn)
    sa4 = fp8_ops.to_mn_major_tma_aligned(torch.rand(groups, m, kb, device="cuda") + 0.5)
    qb4 = torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn)
    sb4 = torch.rand(groups, -(-n // 128), kb, device="cuda") + 0.5
    d4 = torch.empty(groups, m, n, device="cuda", dtype=torch.bfloat16)
    masked4 = torch.full((groups,), m, dtype=torch.int32, device="cuda")

    def series(build):
        return {
            "fixed": per_call_us([build(*fixed[0])] * calls),
            "rotating": per_call_us([build(*rotating[i % ROTATION]) for i in range(calls)]),
        }

    rows = {
        "cutegen fp8_ops.fp8_gemm_nt (MN-major sfa, out=)": series(
            lambda qa, rows, mn, d: lambda: fp8_ops.fp8_gemm_nt(qa, mn, qb, sb, out=d)),
        "deep_gemm.fp8_gemm_nt (MN-major sfa)": series(
            lambda qa, rows, mn, d: lambda: dg.fp8_gemm_nt((qa, mn), (qb, sb), d)),
        "deep_gemm.fp8_gemm_nt (row-major sfa: one transposing copy)": series(
            lambda qa, rows, mn, d: lambda: dg.fp8_gemm_nt((qa, rows), (qb, sb), d)),
        "torch.ops.cutegen.fp8_gemm_nt_out": series(
            lambda qa, rows, mn, d: lambda: torch.ops.cutegen.fp8_gemm_nt_out(qa, mn, qb, sb, d, "", 0)),
        "F.scaled_mm blockwise (cuBLAS)": series(
            # scaled_mm takes SFA with strides (1, M): the MN-major layout itself when M % 4 == 0
            lambda qa, rows, mn, d: lambda: F.scaled_mm(qa, qb.t(), mn, st.BlockWise1x128, scale_b,
                                                        st.BlockWise128x128, output_dtype=torch.bfloat16)),
        "cutegen ops.bf16_gemm_nt (out=)": series(lambda qa, rows, mn, d: lambda: ops.bf16_gemm_nt(a16, b16, out=d)),
        "cutegen quant_ops.per_token_quant_fp8 (x bf16 [M, K])": series(
            lambda qa, rows, mn, d: lambda: quant_ops.per_token_quant_fp8(a16, scale_layout="mn-major-tma-aligned")),
        "deep_gemm.fp8_m_grouped_gemm_nt_masked (4 groups of M rows)": series(
            lambda qa, rows, mn, d: lambda: dg.fp8_m_grouped_gemm_nt_masked((qa4, sa4), (qb4, sb4), d4, masked4, m)),
        "torch.matmul bf16": series(lambda qa, rows, mn, d: lambda: torch.matmul(a16, b16.t())),
        "torch.empty (the floor of a torch call)": series(
            lambda qa, rows, mn, d: lambda: torch.empty(m, n, device="cuda", dtype=torch.bfloat16)),
    }
    print(f"host µs per call, M={m} N={n} K={k}, {calls} calls, {torch.cuda.get_device_name()}")
    print(f"| call | fixed tensors | {ROTATION} rotating buffers |\n| --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['fixed']:.1f} | {r['rotating']:.1f} |")


if __name__ == "__main__":
    main()
