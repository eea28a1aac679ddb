"""`cutegen bench`: time the built kernels on the GPU beside their anchors measured in the same run.

Needs torch with CUDA and a build folder; never the CuTe DSL. Method: fresh random inputs, warm-up,
then each timed call runs alone with the L2 flushed (a 256 MiB write) before it and a ~100 µs GPU
spin between the flush and the call, so that the host's launch work (tens of µs through Python)
is done before the GPU reaches the call. Two timers (`cutegen bench --timer`):

* ``kernel`` (the default): the summed durations of the call's GPU kernels and copies as CUPTI
  records them (``torch.profiler``), the way DeepGEMM's own benchmark (``bench_kineto``) timed
  the DeepGEMM numbers this project compares against;
* ``event``: CUDA events recorded around the call, which also count the GPU's launch of the first
  kernel and its retirement of the last (~2-3 µs: what a one-element fill measures, NOTES N18).

The median over the calls is reported; host time per call is reported separately. Ratios within
one run are what to compare: absolute times drift.

What runs between the timed calls is a choice too (`cutegen bench --conditions`, `cutegen.bench.conditions`):
``cutegen`` (the default) is the method above; ``deepgemm`` reproduces the conditions of DeepGEMM's
own benchmark (``bench_kineto``), under which the DeepGEMM numbers this project compares against
were measured: an 8 GB memset before every call, 30 calls after 30 untimed ones, and the mean. The
memset flushes the L2 too, but mainly it takes ~2.5 ms, in which a power-limited GPU recovers
between calls (DeepGEMM's comment: "some (literal) chill time"), so that the kernels run at higher
clocks than back to back.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

from cutegen.bench.deepgemm_anchor import CONTIGUOUS_ALIGNMENT, IN_RUN_LABEL, short_config
from cutegen.bench.report import GEMM_OPS, shape_columns, short_kernel
from cutegen.bench.timing import conditions, fresh_allocations, host_overhead_us, time_cuda, timer
from cutegen.runtime.params import SCALE_BLOCK, align, ceil_div

BF16_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (4096, 7168, 16384),
    (127, 4096, 7168),
    (1, 4096, 7168),
]


@dataclasses.dataclass
class BenchRow:
    op: str
    shape: tuple[int, int, int]
    kernel: str
    ours_us: float
    anchor: str
    anchor_us: float

    @property
    def flops(self) -> float:
        m, n, k = self.shape
        return 2.0 * m * n * k

    @property
    def ours_tflops(self) -> float:
        return self.flops / self.ours_us / 1e6

    @property
    def anchor_tflops(self) -> float:
        return self.flops / self.anchor_us / 1e6

    @property
    def ratio(self) -> float:
        return self.anchor_us / self.ours_us


def bench_bf16_gemm(shapes=BF16_SHAPES) -> tuple[list[BenchRow], dict]:
    import torch

    from cutegen.runtime import ops

    rows = []
    for m, n, k in shapes:
        fresh_allocations()
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        kernel = ops.choose_kernel("bf16_gemm_nt", m, n, k, d_dtype="bf16", adds=False, layout="nt")
        ours = time_cuda(lambda: ops.bf16_gemm_nt(a, b, out=out))
        ref = time_cuda(lambda: torch.matmul(a, b.t(), out=out))
        rows.append(BenchRow("bf16_gemm_nt", (m, n, k), kernel, ours, "torch.matmul", ref))
        del a, b, out
    small_a = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    small_b = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    small_out = torch.empty(128, 128, device="cuda", dtype=torch.bfloat16)
    overhead = {
        "cutegen.bf16_gemm_nt(out=)": host_overhead_us(lambda: ops.bf16_gemm_nt(small_a, small_b, out=small_out)),
        "cutegen.bf16_gemm_nt": host_overhead_us(lambda: ops.bf16_gemm_nt(small_a, small_b)),
        "torch.ops.cutegen.bf16_gemm_nt": host_overhead_us(lambda: torch.ops.cutegen.bf16_gemm_nt(small_a, small_b)),
        "torch.matmul": host_overhead_us(lambda: torch.matmul(small_a, small_b.t())),
    }
    return rows, overhead


# DeepGEMM on our H200 (its own benchmark, July 2025 build), TFLOPS: the anchors to beat, at
# DeepGEMM's own 21 shapes (its N = 7168, K = 576 problems included).
DEEPGEMM_FP8_TFLOPS = {
    (64, 2112, 7168): 180, (64, 7168, 576): 112, (64, 24576, 1536): 295, (64, 32768, 512): 241,
    (64, 7168, 16384): 389, (64, 4096, 7168): 257, (64, 7168, 2048): 238,
    (128, 2112, 7168): 333, (128, 7168, 576): 204, (128, 24576, 1536): 540, (128, 32768, 512): 431,
    (128, 7168, 16384): 625, (128, 4096, 7168): 459, (128, 7168, 2048): 408,
    (4096, 2112, 7168): 1155, (4096, 7168, 576): 894, (4096, 24576, 1536): 1326,
    (4096, 32768, 512): 1003, (4096, 7168, 16384): 1465, (4096, 4096, 7168): 1436,
    (4096, 7168, 2048): 1280,
}
# Besides DeepGEMM's shapes, the (N, K) = (576, 7168) problems of DeepSeek-V3's MLA projection,
# which DeepGEMM published no numbers for: measured beside cuBLAS only.
FP8_SHAPES = sorted(set(DEEPGEMM_FP8_TFLOPS) | {(m, 576, 7168) for m in (64, 128, 4096)})
# Decode-sized M (`cutegen bench --decode`): the (N, K) pairs of FP8_SHAPES at M = 1, 16 and 32, where
# DeepGEMM published no numbers; the anchor is cuBLAS blockwise in the same run.
DECODE_SHAPES = [(m, n, k) for m in (1, 16, 32) for n, k in sorted({(n, k) for _, n, k in FP8_SHAPES})]


def _fp8_inputs(m: int, n: int, k: int):
    import torch

    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sfa = torch.rand(m, ceil_div(k, SCALE_BLOCK), device="cuda") + 0.5
    sfb = torch.rand(ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK), device="cuda") + 0.5
    return a, to_mn_major_tma_aligned(sfa), b, sfb.contiguous(), sfa


def _cublas_blockwise(a, sfa_rows, b, sfb):
    """cuBLAS blockwise FP8 through torch.nn.functional.scaled_mm (BlockWise1x128 / 128x128)."""
    import torch
    import torch.nn.functional as F

    m, k = a.shape
    n = b.shape[0]
    kb = ceil_div(k, SCALE_BLOCK)
    l4 = ceil_div(kb, 4) * 4
    # [M, K/128] with strides (1, M), which scaled_mm checks literally (at M = 1 too, where
    # .t().contiguous().t() would keep stride K/128 for the size-1 mode).
    scale_a = torch.empty_strided((m, kb), (1, m), device=a.device, dtype=torch.float32)
    scale_a.copy_(sfa_rows)
    sb = torch.zeros(sfb.shape[0], l4, device=a.device)
    sb[:, :kb] = sfb
    # [L4, N/128] with strides (1, L4): scaled_mm wants the K-block count rounded up to 4 in the
    # shape itself once ceil(K/128) is not a multiple of 4 (K = 576: 8 x 56, not 5 x 56).
    scale_b = sb.t()
    st = F.ScalingType
    return lambda: F.scaled_mm(a, b.t(), scale_a, st.BlockWise1x128, scale_b, st.BlockWise128x128,
                               output_dtype=torch.bfloat16)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), measured now."""
    import torch

    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_cuda(lambda: dst.copy_(src), warmup=3, reps=10, flush_l2=False)
    return 2 * src.numel() / us / 1e3


def _deepgemm_in_run(anchor, a, sfa, b, sfb, ours_out) -> dict:
    """DeepGEMM's own kernel for this shape (a `cutegen deepgemm-build` folder), checked against
    cutegen's output on the same operands, then timed the same way."""
    import torch

    m, k = a.shape
    n = b.shape[0]
    entry = anchor.config(m, n, k)
    if entry is None:
        return {}
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    return _deepgemm_in_run_timed(entry, lambda out: anchor.launcher(a, sfa, b, sfb, out), d, ours_out,
                                  2.0 * m * n * k)


def _deepgemm_in_run_timed(entry: dict, make_launch, d, ours_out, flops: float, rows_mask=None,
                           reset=None) -> dict:
    """Run DeepGEMM's kernel `make_launch(d)` once into `d` (poisoned or, for accumulating kernels,
    reset by `reset`), compare with cutegen's `ours_out` (over `rows_mask` rows only, when given),
    then time it the same way as cutegen's call."""
    import torch

    launch = make_launch(d)
    if reset is not None:
        reset()
    launch()
    torch.cuda.synchronize()
    x, y = (d[rows_mask], ours_out[rows_mask]) if rows_mask is not None else (d, ours_out)
    equal = bool(torch.equal(x, y))
    x, y = x.double(), y.double()
    diff = float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
    us = time_cuda(launch)
    return {
        "deepgemm_run_us": us,
        "deepgemm_run_tflops": flops / us / 1e6,
        "deepgemm_run_config": short_config(entry),
        "deepgemm_run_equal": equal,
        "deepgemm_run_calc_diff": diff,
    }


def bench_fp8_gemm(shapes=FP8_SHAPES, deepgemm=None) -> list[dict]:
    """`deepgemm`: a `DeepGemmAnchor` (cutegen.bench.deepgemm_anchor) whose kernels are timed beside
    ours on the shapes it was built for, or None."""
    import torch

    from cutegen.runtime import fp8_ops, ops

    rows = []
    for m, n, k in shapes:
        fresh_allocations()
        a, sfa, b, sfb, sfa_rows = _fp8_inputs(m, n, k)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        kernel = ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="f32")
        ours = time_cuda(lambda: fp8_ops.fp8_gemm_nt(a, sfa, b, sfb, out=out))
        try:
            cublas = time_cuda(_cublas_blockwise(a, sfa_rows, b, sfb))
        except Exception as exc:  # an unsupported shape for cuBLAS is reported, not fatal
            cublas = None
            print(f"cuBLAS blockwise failed at {m}x{n}x{k}: {type(exc).__name__}: {str(exc)[:120]}")
        # What the device takes to move B's bytes once at this size, timed the same way: at small
        # M the GEMM is a stream of B, and the copy bandwidth of a 2 GiB copy is not reached by
        # transfers of a few MB.
        b_dst = torch.empty_like(b)
        b_copy = time_cuda(lambda: b_dst.copy_(b))
        flops = 2.0 * m * n * k
        rows.append(
            {
                "shape": [m, n, k],
                "kernel": kernel,
                "ours_us": ours,
                "ours_tflops": flops / ours / 1e6,
                "cublas_us": cublas,
                "cublas_tflops": flops / cublas / 1e6 if cublas else None,
                "deepgemm_tflops": DEEPGEMM_FP8_TFLOPS.get((m, n, k)),
                "b_gbs": (n * k + n * ceil_div(k, SCALE_BLOCK) * 4) / ours / 1e3,
                "b_copy_us": b_copy,
            }
        )
        if deepgemm is not None:
            rows[-1].update(_deepgemm_in_run(deepgemm, a, sfa, b, sfb, out))
        del a, sfa, b, sfb, sfa_rows, out, b_dst
    return rows


def render_fp8(rows: list[dict], env: dict, copy_gbs: float, title: str = "fp8_gemm_nt") -> str:
    import math

    lines = [
        f"# {title} on {env['gpu']} ({env['date']}; torch {env['torch']}, CUDA {env['cuda']}); copy bandwidth {copy_gbs:.0f} GB/s",
        "",
        "| M, N, K | kernel | µs | TFLOPS | cuBLAS TFLOPS | vs cuBLAS | DeepGEMM TFLOPS | vs DeepGEMM | B stream % of copy "
        "| copy of B µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    in_run = any(r.get("deepgemm_run_us") for r in rows)
    if in_run:
        lines[2] += f" {IN_RUN_LABEL} TFLOPS | vs it | its output vs cutegen's |"
        lines[3] += " --- | --- | --- |"
    vs_cublas, vs_dg, vs_dg_run = [], [], []
    for r in rows:
        cb = r["cublas_tflops"]
        dg = r["deepgemm_tflops"]
        rc = r["ours_tflops"] / cb if cb else None
        rd = r["ours_tflops"] / dg if dg else None
        if rc:
            vs_cublas.append(rc)
        if rd:
            vs_dg.append(rd)
        short = short_kernel(r["kernel"])
        bc = r.get("b_copy_us")
        lines.append(
            f"| {', '.join(map(str, r['shape']))} | {short} | {r['ours_us']:.1f} | {r['ours_tflops']:.0f} | "
            f"{cb and f'{cb:.0f}' or 'n/a'} | {rc and f'{rc:.2f}' or 'n/a'} | {dg or 'n/a'} | "
            f"{rd and f'{rd:.2f}' or 'n/a'} | {100 * r['b_gbs'] / copy_gbs:.0f} | "
            f"{bc and f'{bc:.1f}' or 'n/a'} |"
        )
        if in_run:
            dr = r.get("deepgemm_run_tflops")
            rr = r["ours_tflops"] / dr if dr else None
            if rr:
                vs_dg_run.append(rr)
            same = r.get("deepgemm_run_equal")
            lines[-1] += (f" {dr and f'{dr:.0f}' or 'n/a'} | {rr and f'{rr:.3f}' or 'n/a'} | "
                          f"{'n/a' if same is None else ('bitwise equal' if same else 'calc_diff %.1e' % r['deepgemm_run_calc_diff'])} |")

    def geo(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    versus_dg = f"vs DeepGEMM: {geo(vs_dg):.3f} (min {min(vs_dg):.3f}); " if vs_dg else ""
    versus_run = f"vs {IN_RUN_LABEL}: {geo(vs_dg_run):.3f} (min {min(vs_dg_run):.3f}); " if vs_dg_run else ""
    lines += ["", f"Geometric mean {versus_dg}{versus_run}vs cuBLAS blockwise: {geo(vs_cublas):.3f}"]
    return "\n".join(lines) + "\n"


# DeepGEMM's grouped contiguous numbers on our H200, TFLOPS (groups, rows per group, N, K).
DEEPGEMM_GROUPED_CONTIGUOUS = {
    (4, 8192, 4096, 7168): 1345, (4, 8192, 7168, 2048): 1257,
    (8, 4096, 4096, 7168): 1327, (8, 4096, 7168, 2048): 1240,
    (32, 256, 4096, 7168): 950, (32, 256, 7168, 2048): 912,
}


# The contiguous benchmark aligns each group's rows to DeepGEMM's alignment (every cutegen
# contiguous kernel accepts it).
CONTIGUOUS_BENCH_ALIGNMENT = CONTIGUOUS_ALIGNMENT


def contiguous_group_sizes(groups: int, expected: int, n: int) -> tuple[list[int], list[int]]:
    """(real rows, aligned span) per group of a contiguous benchmark problem: sizes drawn from
    0.7-1.3 x `expected` with a fixed seed, so every run (and `cutegen deepgemm-build`) sees the
    same problem."""
    import random

    rng = random.Random(groups * 1000 + n)
    sizes = [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    return sizes, [ceil_div(s, CONTIGUOUS_BENCH_ALIGNMENT) * CONTIGUOUS_BENCH_ALIGNMENT for s in sizes]


def deepgemm_problems(ops, all_shapes: bool = False) -> list:
    """The problems `cutegen deepgemm-build` compiles DeepGEMM's kernels for: every benchmark
    shape of the ops given that has a DeepGEMM counterpart (`DeepGemmKernel`); `all_shapes`
    adds the fp8_gemm_nt shapes DeepGEMM published no numbers for."""
    from cutegen.bench.deepgemm_anchor import DeepGemmKernel, DeepGemmProblem

    problems = []
    if "fp8_gemm_nt" in ops:
        shapes = FP8_SHAPES if all_shapes else sorted(DEEPGEMM_FP8_TFLOPS)
        problems += [DeepGemmProblem(DeepGemmKernel.DENSE_1D2D, *s) for s in shapes]
    if "m_grouped_fp8_gemm_nt_contiguous" in ops:
        for groups, expected, n, k in DEEPGEMM_GROUPED_CONTIGUOUS:
            total = sum(contiguous_group_sizes(groups, expected, n)[1])
            problems.append(DeepGemmProblem(DeepGemmKernel.CONTIGUOUS_1D2D, total, n, k, groups))
    if "m_grouped_fp8_gemm_nt_masked" in ops:
        problems += [DeepGemmProblem(DeepGemmKernel.MASKED_1D2D, expected, n, k, groups)
                     for groups, expected, n, k in DEEPGEMM_GROUPED_MASKED]
    if "fp8_wgrad_gemm_nt" in ops:
        problems += [DeepGemmProblem(DeepGemmKernel.WGRAD_1D1D, m, n, k)
                     for (m, n) in DEEPGEMM_WGRAD for k in WGRAD_KS]
    if "k_grouped_fp8_gemm_nt_contiguous" in ops:
        problems += [DeepGemmProblem(DeepGemmKernel.K_GROUPED_1D1D, m, n, k_grouped_expected_k(groups, mean), groups)
                     for groups, m, n, mean in DEEPGEMM_K_GROUPED]
    return problems


def bench_grouped_contiguous(deepgemm=None) -> list[dict]:
    """m_grouped_fp8_gemm_nt_contiguous beside a loop of cuBLAS blockwise calls (one per group)
    and, with `deepgemm` (a `DeepGemmAnchor`), DeepGEMM's own contiguous kernel."""
    import torch

    from cutegen.bench.deepgemm_anchor import DeepGemmKernel
    from cutegen.runtime import grouped_ops
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    rows = []
    for (groups, expected, n, k), anchor in DEEPGEMM_GROUPED_CONTIGUOUS.items():
        fresh_allocations()
        sizes, spans = contiguous_group_sizes(groups, expected, n)
        total = sum(spans)
        m_indices = torch.full((total,), -1, dtype=torch.int32, device="cuda")
        row = 0
        for g, (size, span) in enumerate(zip(sizes, spans)):
            m_indices[row : row + size] = g
            row += span
        a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn)
        sfa_rows = torch.rand(total, k // 128, device="cuda") + 0.5
        sfa = to_mn_major_tma_aligned(sfa_rows)
        sfb = torch.rand(groups, -(-n // 128), k // 128, device="cuda") + 0.5
        out = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
        starts = [sum(spans[:g]) for g in range(groups)]
        rows.append(
            _grouped_row(
                (groups, expected, n, k), sum(sizes), anchor,
                lambda: grouped_ops.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, m_indices, out=out),
                lambda: [
                    _cublas_blockwise(a[r : r + span], sfa_rows[r : r + span], b[g], sfb[g])
                    for g, (r, span) in enumerate(zip(starts, spans))
                ],
            )
        )
        entry = deepgemm.config(total, n, k, DeepGemmKernel.CONTIGUOUS_1D2D, groups) if deepgemm is not None else None
        if entry is not None:  # `out` holds cutegen's result from the timed calls
            real = m_indices >= 0  # DeepGEMM leaves padding rows alone; cutegen zeroes them
            rows[-1].update(_deepgemm_in_run_timed(
                entry,
                lambda d: deepgemm.contiguous_launcher(a, sfa, b, sfb, m_indices, d),
                torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16),
                out, 2.0 * sum(sizes) * n * k, rows_mask=real))
        del a, b, sfa_rows, sfa, sfb, out, m_indices
    return rows


def _grouped_row(problem, real_rows: int, anchor, run_ours, make_cublas_calls) -> dict:
    """Time a grouped GEMM and the loop of cuBLAS calls (one per group) it replaces; TFLOPS count
    real rows only. A configuration cuBLAS rejects is reported as n/a."""
    groups, rows_per_group, n, k = problem
    ours = time_cuda(run_ours)
    try:
        calls = make_cublas_calls()
        loop = time_cuda(lambda: [c() for c in calls])
    except Exception as exc:
        loop = None
        print(f"cuBLAS loop failed for {groups}x{rows_per_group}: {type(exc).__name__}: {str(exc)[:120]}")
    flops = 2.0 * real_rows * n * k
    return {
        "groups": groups, "rows_per_group": rows_per_group, "n": n, "k": k,
        "ours_us": ours, "ours_tflops": flops / ours / 1e6,
        "cublas_loop_tflops": flops / loop / 1e6 if loop else None,
        "deepgemm_tflops": anchor,
    }


def _in_run_cells(r: dict) -> str:
    """The in-run DeepGEMM cells of a printed row: TFLOPS, cutegen's ratio and the comparison."""
    dr = r.get("deepgemm_run_tflops")
    if not dr:
        return " n/a | n/a | n/a |"
    same = "bitwise equal" if r.get("deepgemm_run_equal") else f"calc_diff {r['deepgemm_run_calc_diff']:.1e}"
    return f" {dr:.0f} | {r['ours_tflops'] / dr:.2f} | {same} |"


def render_grouped(rows: list[dict], env: dict, op: str = "m_grouped_fp8_gemm_nt_contiguous") -> str:
    in_run = any(r.get("deepgemm_run_us") for r in rows)
    conditions = any(r.get("conditions") for r in rows)
    extra = f" {IN_RUN_LABEL} TFLOPS | vs it | outputs |" if in_run else ""
    lines = [
        f"# {op} on {env['gpu']} ({env['date']}); TFLOPS count real rows only",
        "",
        "| groups x rows |" + (" groups |" if conditions else "")
        + " N, K | TFLOPS | cuBLAS loop TFLOPS | DeepGEMM † TFLOPS | vs DeepGEMM † |" + extra,
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if conditions else "")
        + (" --- | --- | --- |" if in_run else ""),
    ]
    for r in rows:
        cb, dg = r["cublas_loop_tflops"], r.get("deepgemm_tflops")
        ratio = r["ours_tflops"] / dg if dg else None
        groups = ""
        if conditions:
            groups = (f" ragged in max_m {r['max_m']}: {r['real_rows']} rows |" if r.get("conditions") == "ragged"
                      else " full |")
        lines.append(
            f"| {r['groups']} x ~{r['rows_per_group']} |{groups} {r['n']}, {r['k']} | {r['ours_tflops']:.0f} | "
            f"{cb and f'{cb:.0f}' or 'n/a'} | {dg or 'n/a'} | {f'{ratio:.2f}' if ratio else 'n/a'} |"
            + (_in_run_cells(r) if in_run else "")
        )
    lines += ["", "† DeepGEMM's own benchmark on this H200, not this run (a historical figure, other conditions)."]
    return "\n".join(lines) + "\n"


# DeepGEMM's grouped masked numbers on our H200, TFLOPS counting real rows (groups, expected rows,
# N, K), from its own test: groups ragged in buffers of MASKED_MAX_M rows.
DEEPGEMM_GROUPED_MASKED = {
    (1, 1024, 4096, 7168): 778, (1, 1024, 7168, 2048): 820,
    (2, 512, 4096, 7168): 686, (2, 512, 7168, 2048): 647,
    (4, 256, 4096, 7168): 607, (4, 256, 7168, 2048): 697,
}
# DeepGEMM's masked test conditions (`generate_m_grouped_masked`): every group's buffer holds
# MASKED_MAX_M rows, of which masked_m[g] are real, drawn uniformly in MASKED_SPREAD x the
# expected rows.
MASKED_MAX_M = 4096
MASKED_SPREAD = (0.7, 1.3)
# The two conditions each masked problem runs under: ragged groups as above, and every group full
# (max_m = masked_m = the expected rows).
MASKED_CONDITIONS = ("ragged", "full")


def masked_group_sizes(groups: int, expected: int, seed: int = 0) -> list[int]:
    """masked_m of a ragged problem: `expected` x U(MASKED_SPREAD) per group, truncated as DeepGEMM's
    test does, from a seed fixed per problem (every run times the same sizes)."""
    import random

    rng = random.Random(f"{seed}:{groups}:{expected}")
    return [int(expected * rng.uniform(*MASKED_SPREAD)) for _ in range(groups)]


def bench_grouped_masked(deepgemm=None) -> list[dict]:
    """m_grouped_fp8_gemm_nt_masked under both `MASKED_CONDITIONS` beside a loop of cuBLAS blockwise
    calls over each group's real rows and, with `deepgemm` (a `DeepGemmAnchor`), DeepGEMM's own
    masked kernel on the same operands."""
    import torch

    from cutegen.bench.deepgemm_anchor import DeepGemmKernel
    from cutegen.runtime import grouped_ops
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    rows = []
    for (groups, expected, n, k), anchor in DEEPGEMM_GROUPED_MASKED.items():
        for condition in MASKED_CONDITIONS:
            ragged = condition == "ragged"
            sizes = masked_group_sizes(groups, expected) if ragged else [expected] * groups
            max_m = MASKED_MAX_M if ragged else expected
            fresh_allocations()
            a = torch.randn(groups, max_m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn)
            sfa_rows = torch.rand(groups, max_m, k // 128, device="cuda") + 0.5
            sfa = to_mn_major_tma_aligned(sfa_rows)
            sfb = torch.rand(groups, -(-n // 128), k // 128, device="cuda") + 0.5
            masked_m = torch.tensor(sizes, dtype=torch.int32, device="cuda")
            out = torch.empty(groups, max_m, n, device="cuda", dtype=torch.bfloat16)
            row = _grouped_row(
                (groups, expected, n, k), sum(sizes), anchor if ragged else None,
                lambda: grouped_ops.m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, masked_m, expected, out=out),
                lambda: [_cublas_blockwise(a[g, :size], sfa_rows[g, :size], b[g], sfb[g])
                         for g, size in enumerate(sizes) if size],
            )
            row.update(conditions=condition, max_m=max_m, masked_m=sizes, real_rows=sum(sizes))
            entry = (deepgemm.config(expected, n, k, DeepGemmKernel.MASKED_1D2D, groups)
                     if deepgemm is not None else None)
            if entry is not None:  # `out` holds cutegen's result from the timed calls
                real = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
                row.update(_deepgemm_in_run_timed(
                    entry,
                    lambda d: deepgemm.masked_launcher(a, sfa, b, sfb, masked_m, d, expected),
                    torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16),
                    out, 2.0 * sum(sizes) * n * k, rows_mask=real))
            rows.append(row)
            del a, b, sfa_rows, sfa, sfb, masked_m, out
    return rows


# DeepGEMM's dense weight-gradient numbers on our H200, TFLOPS: (M, N) -> (K=4096, K=8192).
WGRAD_KS = (4096, 8192)
DEEPGEMM_WGRAD = {
    (7168, 2112): (952, 1045), (1536, 24576): (1009, 1071), (512, 32768): (914, 1008),
    (16384, 7168): (1015, 1057), (7168, 4096): (979, 1046), (2048, 7168): (940, 1033),
}


def bench_wgrad(deepgemm=None) -> list[dict]:
    """fp8_wgrad_gemm_nt (D += A·Bᵀ, fp32) beside DeepGEMM's numbers from the anchors and, with
    `deepgemm` (a `DeepGemmAnchor`), DeepGEMM's own 1D1D kernel on the same operands."""
    import torch

    from cutegen.bench.deepgemm_anchor import DeepGemmKernel
    from cutegen.runtime import fp8_ops
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    rows = []
    for (m, n), anchors in DEEPGEMM_WGRAD.items():
        for k, anchor in zip(WGRAD_KS, anchors):
            fresh_allocations()
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
            sfa = to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda") + 0.5)
            sfb = to_mn_major_tma_aligned(torch.rand(n, k // 128, device="cuda") + 0.5)
            d = torch.zeros(m, n, device="cuda")
            ours = time_cuda(lambda: fp8_ops.fp8_wgrad_gemm_nt(a, sfa, b, sfb, d))
            rows.append({"shape": [m, n, k], "ours_us": ours, "ours_tflops": 2.0 * m * n * k / ours / 1e6,
                         "deepgemm_tflops": anchor})
            entry = deepgemm.config(m, n, k, DeepGemmKernel.WGRAD_1D1D) if deepgemm is not None else None
            if entry is not None:
                # Both accumulate into D: the same non-zero C for each, then one call each.
                c = torch.randn(m, n, device="cuda")
                d.copy_(c)
                fp8_ops.fp8_wgrad_gemm_nt(a, sfa, b, sfb, d)
                theirs = torch.empty_like(c)
                rows[-1].update(_deepgemm_in_run_timed(
                    entry, lambda out: deepgemm.wgrad_launcher(a, sfa, b, sfb, out), theirs, d,
                    2.0 * m * n * k, reset=lambda: theirs.copy_(c)))
                del c, theirs
            del a, b, sfa, sfb, d
    return rows


# DeepGEMM's k-grouped weight-gradient numbers on our H200, TFLOPS: (G, M, N, mean k) -> TFLOPS.
DEEPGEMM_K_GROUPED = {
    (4, 7168, 4096, 4096): 967, (4, 7168, 4096, 8192): 1041, (4, 2048, 7168, 4096): 946,
    (4, 2048, 7168, 8192): 1026, (8, 7168, 4096, 4096): 954, (8, 2048, 7168, 4096): 930,
}


def k_grouped_sizes(groups: int, mean: int, seed: int = 0) -> list[int]:
    """Per-group token counts drawn uniformly from 0.7-1.3 x mean (fixed seed: every run times
    the same problem)."""
    import random

    rng = random.Random(seed * 1000 + groups * 7 + mean)
    return [int(mean * rng.uniform(0.7, 1.3)) for _ in range(groups)]


def _token_span(k: int) -> int:
    """Tokens a k-grouped group of k tokens occupies in the operands: whole 128-token scale blocks."""
    return align(k, SCALE_BLOCK)


def k_grouped_expected_k(groups: int, mean: int) -> int:
    """The K DeepGEMM's heuristic plans a k-grouped benchmark problem for: its largest group, in
    whole 128-token blocks (the configuration `cutegen deepgemm-build` compiles and the bench
    looks up)."""
    return max(_token_span(k) for k in k_grouped_sizes(groups, mean))


def _zero_token_padding(flat, rows: int, sizes: list[int]):
    """Zero the padding tokens of flat k-grouped operand data (each group [rows, 128·⌈k_g/128⌉],
    its tokens first), as `grouped_transposed_quant_fp8` leaves them; returns `flat`."""
    import torch

    data = flat.view(torch.uint8)  # e4m3's zero is the byte 0; byte views fill on any torch
    start = 0
    for k in sizes:
        span = _token_span(k)
        data[start:start + rows * span].view(rows, span)[:, k:] = 0
        start += rows * span
    return flat


def bench_k_grouped(deepgemm=None) -> list[dict]:
    """k_grouped_fp8_gemm_nt_contiguous (per group D[g] += A_g·B_gᵀ, fp32) beside DeepGEMM's numbers
    from the anchors and, with `deepgemm` (a `DeepGemmAnchor`), DeepGEMM's own 1D1D kernel over the
    same operands (each group given its padded token count); TFLOPS count the real tokens
    (2·M·N·Σk_g) for both."""
    import torch

    from cutegen.bench.deepgemm_anchor import DeepGemmKernel
    from cutegen.runtime import k_grouped_ops

    rows = []
    for (groups, m, n, mean), anchor in DEEPGEMM_K_GROUPED.items():
        fresh_allocations()
        sizes = k_grouped_sizes(groups, mean)
        blocks = sum(_token_span(k) for k in sizes) // SCALE_BLOCK
        a = _zero_token_padding(torch.randn(128 * m * blocks, device="cuda").to(torch.float8_e4m3fn), m, sizes)
        b = _zero_token_padding(torch.randn(128 * n * blocks, device="cuda").to(torch.float8_e4m3fn), n, sizes)
        sfa = torch.rand(blocks, m, device="cuda") + 0.5
        sfb = torch.rand(blocks, n, device="cuda") + 0.5
        d = torch.zeros(groups, m, n, device="cuda")
        sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
        ours = time_cuda(lambda: k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(
            a, sfa, b, sfb, d, sizes_gpu, expected_k=mean))
        flops = 2.0 * m * n * sum(sizes)
        rows.append({"shape": [groups, m, n, mean], "group_sizes": sizes, "ours_us": ours,
                     "ours_tflops": flops / ours / 1e6, "deepgemm_tflops": anchor})
        expected_k = k_grouped_expected_k(groups, mean)
        entry = (deepgemm.config(m, n, expected_k, DeepGemmKernel.K_GROUPED_1D1D, groups)
                 if deepgemm is not None else None)
        if entry is not None:
            # Both accumulate into D: the same non-zero C for each, then one call each.
            c = torch.randn(groups, m, n, device="cuda")
            d.copy_(c)
            k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, sizes_gpu, expected_k=mean)
            theirs = torch.empty_like(c)
            rows[-1].update(_deepgemm_in_run_timed(
                entry, lambda out: deepgemm.k_grouped_launcher(a, sfa, b, sfb, out, sizes), theirs, d,
                flops, reset=lambda: theirs.copy_(c)))
            del c, theirs
        del a, b, sfa, sfb, d, sizes_gpu
    return rows


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), else the CUDA driver API version, else None."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"CUDA driver API {version // 1000}.{version % 1000 // 10}" if int(err) == 0 else None
    except Exception:  # noqa: BLE001 - the version is informative only
        return None


def environment() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "driver": driver_version(),
    }


def render(rows: list[BenchRow], overhead: dict, env: dict) -> str:
    lines = [
        f"# bf16_gemm_nt on {env['gpu']} ({env['date']}; torch {env['torch']}, CUDA {env['cuda']})",
        "",
        "| M, N, K | kernel | cutegen µs | TFLOPS | torch.matmul µs | TFLOPS | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.shape[0]}, {r.shape[1]}, {r.shape[2]} | {r.kernel} | {r.ours_us:.1f} | "
            f"{r.ours_tflops:.0f} | {r.anchor_us:.1f} | {r.anchor_tflops:.0f} | {r.ratio:.3f} |"
        )
    lines += ["", "Host time per call (128x128x128, wall clock, GPU not the bottleneck):", ""]
    lines += [f"- {k}: {v:.1f} µs" for k, v in overhead.items()]
    return "\n".join(lines) + "\n"


# Every GEMM op the report has a section for, the quantize ops together, and the host cost per call
# of every op (`cutegen.bench.host`).
OPS = (*GEMM_OPS, "quantize", "host", "bf16_family", "fused")


def render_vs_deepgemm(rows: list[dict], title: str, shape_header: str) -> str:
    """A Markdown table of rows beside DeepGEMM's published TFLOPS (and its kernel in this run,
    where it was timed)."""
    in_run = any(r.get("deepgemm_run_us") for r in rows)
    extra = f" {IN_RUN_LABEL} | vs it | outputs |" if in_run else ""
    lines = [f"# {title}", "", f"| {shape_header} | TFLOPS | DeepGEMM | ratio |" + extra,
             "| --- | --- | --- | --- |" + (" --- | --- | --- |" if in_run else "")]
    lines += [f"| {', '.join(map(str, r['shape']))} | {r['ours_tflops']:.0f} | {r['deepgemm_tflops']} | "
              f"{r['ours_tflops'] / r['deepgemm_tflops']:.2f} |" + (_in_run_cells(r) if in_run else "") for r in rows]
    return "\n".join(lines) + "\n"


def main(json_out: str | None = None, ops: tuple[str, ...] = OPS, report_dir: str | None = None,
         command: str | None = None, every_kernel: bool = False, decode: bool = False,
         deepgemm_dir: str | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("cutegen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    from cutegen.runtime import ops as runtime_ops

    env = environment()
    env["timer"] = timer()
    env["conditions"] = conditions().name
    print(f"timing: {timer()} timer; {conditions().description}", flush=True)
    # Each GEMM shape's operands are fresh allocations (`fresh_allocations`).
    env["fresh_allocations"] = True
    if command:
        env["command"] = command
    results: dict = {"environment": env}
    available = set()
    for op in GEMM_OPS:
        if runtime_ops.runnable_kernels(op):
            available.add(op)
    if "bf16_gemm_nt" in ops and "bf16_gemm_nt" in available:
        rows, overhead = bench_bf16_gemm()
        print(render(rows, overhead, env))
        results["bf16_gemm_nt"] = {
            "rows": [dataclasses.asdict(r) | {"ours_tflops": r.ours_tflops, "anchor_tflops": r.anchor_tflops, "ratio": r.ratio} for r in rows],
            "host_overhead_us": overhead,
        }
    deepgemm = None
    if deepgemm_dir:
        from cutegen.bench.deepgemm_anchor import DeepGemmAnchor

        deepgemm = DeepGemmAnchor(deepgemm_dir)
        env["deepgemm_in_run"] = deepgemm.describe()
    if "fp8_gemm_nt" in ops and "fp8_gemm_nt" in available:
        copy_gbs = copy_bandwidth_gbs()
        rows = bench_fp8_gemm(deepgemm=deepgemm)
        print(render_fp8(rows, env, copy_gbs))
        results["fp8_gemm_nt"] = {"rows": rows, "copy_gbs": copy_gbs}
        if decode:  # in the results JSON and printed; the report covers the DeepGEMM shapes only
            rows = bench_fp8_gemm(DECODE_SHAPES)
            print(render_fp8(rows, env, copy_gbs, "fp8_gemm_nt at decode-sized M"))
            results["fp8_gemm_nt_decode"] = {"rows": rows, "copy_gbs": copy_gbs}
    if "m_grouped_fp8_gemm_nt_contiguous" in ops and "m_grouped_fp8_gemm_nt_contiguous" in available:
        rows = bench_grouped_contiguous(deepgemm=deepgemm)
        print(render_grouped(rows, env))
        results["m_grouped_fp8_gemm_nt_contiguous"] = rows
    if "m_grouped_fp8_gemm_nt_masked" in ops and "m_grouped_fp8_gemm_nt_masked" in available:
        rows = bench_grouped_masked(deepgemm=deepgemm)
        print(render_grouped(rows, env, "m_grouped_fp8_gemm_nt_masked"))
        results["m_grouped_fp8_gemm_nt_masked"] = rows
    for op, bench_op, title in (
        ("fp8_wgrad_gemm_nt", lambda: bench_wgrad(deepgemm=deepgemm), "fp32 D += A·Bᵀ"),
        ("k_grouped_fp8_gemm_nt_contiguous", lambda: bench_k_grouped(deepgemm=deepgemm), "fp32 D[g] += A_g·B_gᵀ"),
    ):
        if op in ops and op in available:
            rows = bench_op()
            print(render_vs_deepgemm(rows, f"{op} ({title})", ", ".join(shape_columns(op))))
            results[op] = rows
    if "quantize" in ops:
        try:
            from cutegen.bench import quant as bench_quant
        except ImportError:
            bench_quant = None
        if bench_quant is not None:
            quant = bench_quant.bench_quant(every_kernel=every_kernel)
            print(bench_quant.render(quant, env))
            results["quantize"] = quant
    if "bf16_family" in ops:
        from cutegen.bench import bf16 as bench_bf16

        print("the BF16 family beside torch (interleaved, medians):", flush=True)
        results["bf16_family"] = bench_bf16.bench_bf16_family()
        print(bench_bf16.render(results["bf16_family"]))
    if "fused" in ops:
        from cutegen.bench import fused as bench_fused

        print("the fused MoE up-projection beside the unfused pipelines (interleaved, medians):", flush=True)
        results["fused"] = bench_fused.bench_fused()
        print(bench_fused.render(results["fused"]))
    if "host" in ops:
        from cutegen.bench import host as bench_host

        print("host cost per call (every op, direct, through torch.ops and deep_gemm, beside torch):", flush=True)
        results["host"] = bench_host.bench_host()
        print(bench_host.render(results["host"], env))
    if report_dir:
        from cutegen.bench import report

        if not json_out:  # the report links the results it was made from
            Path(report_dir).mkdir(parents=True, exist_ok=True)
            json_out = str(Path(report_dir) / f"{report.report_stem(env)}.json")
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(json_out, "w") as f:
            json.dump(results, f, indent=2, default=str)
    if report_dir:
        for path in report.write_report(results, report_dir, source=json_out, command=command):
            print(f"report: {path}")
    return 0
