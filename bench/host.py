"""`cutegen bench --op host`: host µs per call of every op, called directly, through torch.ops and DeepGEMM's API, beside torch's calls in the same run.

Each case is one way of calling one op on one problem (a decode-sized and a prefill-sized one per
op). Its calls are issued in batches of `BATCH`, back to back without synchronising, each batch
after a `torch.cuda.synchronize()`: the host µs per call is the batch's wall time over its calls,
and the GPU µs per call is the time between CUDA events recorded before and after the batch over
its calls, which is the kernels' time when the GPU is the bottleneck and the host's when the host
is (the row says which). Each case runs twice: with the same tensors every call, and with operands
and outputs at another address on every call (`ROTATION` sets, each a view of one pool at its own
16-byte offset, with the same shapes and strides: what an engine's layers do). All cases of all
problems take turns, `ROUNDS` rounds of `BATCHES` batches each, so that a slower spell of the
shared host falls on all of them alike; the medians are over every batch of every round. The anchors (a bf16 ``torch.matmul``, cuBLAS blockwise FP8 through
``torch.nn.functional.scaled_mm``, a ``torch.empty`` of the output) are timed the same way in the
same run. `first_calls` times, in a fresh process, each op's first call (catalogue, module load,
kernel choice, TMA encoding and the launch), synchronised.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from cutegen.runtime.params import SCALE_BLOCK, align, ceil_div

BATCH = 100
BATCHES = 1  # per case and round
# Many short rounds: each case's batches are spread over the whole run, so that a slower spell of
# the shared host reaches few of any case's batches and the median passes it by.
ROUNDS = 12
ROTATION = 1000
# The targets of the call path on an H200 (host µs per call, direct / through torch.ops).
TARGET_FP8_DIRECT_US = 10.0
TARGET_FP8_TORCH_OPS_US = 20.0
TARGET_OTHER_DIRECT_US = 12.0
TARGET_FIRST_CALL_MS = 20.0

# Paths a case calls an op through.
DIRECT, TORCH_OPS, DEEP_GEMM, ANCHOR = "direct", "torch.ops", "deep_gemm", "anchor"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One op's problem of one size, with the text the table shows."""

    op: str
    size: str  # "decode" or "prefill"
    shape: str


@dataclasses.dataclass(frozen=True)
class Case:
    """One way of calling: ``make(i)`` returns the call on operand set i (0 for the fixed run)."""

    problem: Problem
    path: str
    label: str
    make: Callable[[int], Callable[[], object]]


def distinct_views(t: Any, count: int, fill: Callable[[Any], None]) -> list[Any]:
    """``count`` tensors with ``t``'s shape, strides and dtype at ``count`` distinct 16-byte aligned
    addresses: views of one pool, each 16 bytes further on (so a thousand cost a few KiB more than one)."""
    import torch

    step = 16 // t.element_size()
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    pool = torch.empty(span + (count - 1) * step, dtype=t.dtype, device=t.device)
    fill(pool)
    return [pool.as_strided(t.shape, t.stride(), i * step) for i in range(count)]


def _fill_fp8(pool: Any) -> None:
    import torch

    pool.copy_(torch.randn(pool.shape, device=pool.device).to(pool.dtype))


def _fill_scales(pool: Any) -> None:
    pool.uniform_(0.5, 1.5)


def _fill_normal(pool: Any) -> None:
    pool.normal_()


def _fill_zero(pool: Any) -> None:
    pool.zero_()


def _fill_for(t: Any) -> Callable[[Any], None]:
    import torch

    if t.dtype == torch.float8_e4m3fn:
        return _fill_fp8
    if t.dtype == torch.float32:
        return _fill_scales
    return _fill_normal


class Operands:
    """Operand set i of a problem: the fixed tensors (i = 0 in the fixed run) or distinct views."""

    def __init__(self, count: int, **tensors: Any) -> None:
        import torch

        self.sets: list[dict[str, Any]] = [dict() for _ in range(count)]
        for name, t in tensors.items():
            if t is None:
                views = [None] * count
            elif t.dtype == torch.int32:  # group metadata: exact copies, never shifted windows
                views = [t] + [t.clone() for _ in range(count - 1)]
            else:
                views = distinct_views(t, count, _fill_for(t))
            for i, view in enumerate(views):
                self.sets[i][name] = view

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.sets[i % len(self.sets)]


def measure(calls: list[Callable[[], object]]) -> tuple[list[float], list[float]]:
    """Host and GPU µs per call of each batch of ``calls`` (module docstring)."""
    import torch

    host, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for b in range(0, len(calls), BATCH):
        batch = calls[b : b + BATCH]
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for call in batch:
            call()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        host.append((t1 - t0) / len(batch) * 1e6)
        gpu.append(start.elapsed_time(end) / len(batch) * 1e3)
    return host, gpu


def measure_cases(cases: list["Case"]) -> list[dict[str, float]]:
    """Each case fixed and rotating, the cases taking turns over `ROUNDS` rounds; per case the
    medians of its host and GPU µs per call."""
    import torch

    runs = []
    per_round = BATCH * BATCHES
    for case in cases:
        for rotating in (False, True):
            # rotating: operand set i % ROTATION for call i, so consecutive calls never share an address
            calls = [case.make(i if rotating else 0) for i in range(per_round * ROUNDS)]
            for call in calls[: 2 * BATCH]:  # warm-up: every plan prepared, every allocation cached
                call()
            runs.append((calls, [], []))
    torch.cuda.synchronize()
    for r in range(ROUNDS):
        for calls, host, gpu in runs:
            h, g = measure(calls[r * per_round : (r + 1) * per_round])
            host += h
            gpu += g
    med = [(statistics.median(host), statistics.median(gpu)) for _, host, gpu in runs]
    return [
        {"fixed_host_us": med[2 * i][0], "fixed_gpu_us": med[2 * i][1],
         "rotating_host_us": med[2 * i + 1][0], "rotating_gpu_us": med[2 * i + 1][1]}
        for i in range(len(cases))
    ]


# ------------------------------------------------------------------------------------------------
# The problems and the ways of calling each op


def _mn_major(rows_major: Any) -> Any:
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    return to_mn_major_tma_aligned(rows_major)


def _dense_cases(size: str, m: int, n: int, k: int) -> list[Case]:
    import torch
    import torch.nn.functional as F

    import cutegen.deep_gemm as dg
    from cutegen.runtime import bf16_ops, fp8_ops

    kb = ceil_div(k, SCALE_BLOCK)
    shape = f"M={m} N={n} K={k}"
    fp8 = Problem("fp8_gemm_nt", size, shape)
    sfa_rows = torch.rand(m, kb, device="cuda") + 0.5
    ops = Operands(
        ROTATION,
        a=torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn),
        sfa=_mn_major(sfa_rows),
        b=torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn),
        sfb=torch.rand(ceil_div(n, SCALE_BLOCK), kb, device="cuda") + 0.5,
        d=torch.empty(m, n, device="cuda", dtype=torch.bfloat16),
        a16=torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
        b16=torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
        sfa_rows=sfa_rows,
    )
    # cuBLAS's scales: SFA [M, K/128] with strides (1, M) (MN-major when M % 4 == 0), SFB
    # transposed with the K-block count rounded up to 4 (see bench._cublas_blockwise).
    sb4 = torch.zeros(ceil_div(n, SCALE_BLOCK), align(kb, 4), device="cuda")
    sb4[:, :kb] = ops[0]["sfb"]
    scale_b = sb4.t()
    st = F.ScalingType
    cases = [
        Case(fp8, DIRECT, "fp8_ops.fp8_gemm_nt(a, sfa, b, sfb, out=d)",
             lambda i: (lambda o: lambda: fp8_ops.fp8_gemm_nt(o["a"], o["sfa"], o["b"], o["sfb"], out=o["d"]))(ops[i])),
        Case(fp8, DIRECT, "fp8_ops.fp8_gemm_nt(a, sfa, b, sfb) (new output)",
             lambda i: (lambda o: lambda: fp8_ops.fp8_gemm_nt(o["a"], o["sfa"], o["b"], o["sfb"]))(ops[i])),
        Case(fp8, TORCH_OPS, "torch.ops.cutegen.fp8_gemm_nt_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.fp8_gemm_nt_out(o["a"], o["sfa"], o["b"], o["sfb"], o["d"]))(ops[i])),
        Case(fp8, TORCH_OPS, "torch.ops.cutegen.fp8_gemm_nt (new output)",
             lambda i: (lambda o: lambda: torch.ops.cutegen.fp8_gemm_nt(o["a"], o["sfa"], o["b"], o["sfb"]))(ops[i])),
        Case(fp8, DEEP_GEMM, "deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d)",
             lambda i: (lambda o: lambda: dg.fp8_gemm_nt((o["a"], o["sfa"]), (o["b"], o["sfb"]), o["d"]))(ops[i])),
        Case(fp8, DEEP_GEMM, "deep_gemm.fp8_gemm_nt, row-major sfa (one transposing copy)",
             lambda i: (lambda o: lambda: dg.fp8_gemm_nt((o["a"], o["sfa_rows"]), (o["b"], o["sfb"]), o["d"]))(ops[i])),
    ]
    if m % 4 == 0:  # scaled_mm checks SFA's strides (1, M) literally
        cases.append(Case(fp8, ANCHOR, "F.scaled_mm blockwise (cuBLAS)", lambda i: (lambda o: lambda: F.scaled_mm(
            o["a"], o["b"].t(), o["sfa"], st.BlockWise1x128, scale_b, st.BlockWise128x128,
            output_dtype=torch.bfloat16))(ops[i])))
    cases.append(Case(fp8, ANCHOR, "torch.empty of the output",
                      lambda i: lambda: torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
    bf16 = Problem("bf16_gemm_nt", size, shape)
    cases += [
        Case(bf16, DIRECT, "bf16_ops.bf16_gemm_nt(a, b, out=d)",
             lambda i: (lambda o: lambda: bf16_ops.bf16_gemm_nt(o["a16"], o["b16"], out=o["d"]))(ops[i])),
        Case(bf16, TORCH_OPS, "torch.ops.cutegen.bf16_gemm_nt_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.bf16_gemm_nt_out(o["a16"], o["b16"], o["d"]))(ops[i])),
        Case(bf16, DEEP_GEMM, "deep_gemm.bf16_gemm_nt(a, b, d)",
             lambda i: (lambda o: lambda: dg.bf16_gemm_nt(o["a16"], o["b16"], o["d"]))(ops[i])),
        Case(bf16, ANCHOR, "torch.matmul(a, b.t(), out=d)",
             lambda i: (lambda o: lambda: torch.matmul(o["a16"], o["b16"].t(), out=o["d"]))(ops[i])),
        Case(bf16, ANCHOR, "torch.matmul(a, b.t()) (new output)",
             lambda i: (lambda o: lambda: torch.matmul(o["a16"], o["b16"].t()))(ops[i])),
    ]
    return cases


def _wgrad_cases(size: str, m: int, n: int, k: int) -> list[Case]:
    import torch

    import cutegen.deep_gemm as dg
    from cutegen.runtime import fp8_ops

    problem = Problem("fp8_wgrad_gemm_nt", size, f"M={m} N={n} K={k}")
    ops = Operands(
        ROTATION,
        a=torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn),
        sfa=_mn_major(torch.rand(m, k // SCALE_BLOCK, device="cuda") + 0.5),
        b=torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn),
        sfb=_mn_major(torch.rand(n, k // SCALE_BLOCK, device="cuda") + 0.5),
        d=torch.zeros(m, n, device="cuda"),
    )
    return [
        Case(problem, DIRECT, "fp8_ops.fp8_wgrad_gemm_nt(a, sfa, b, sfb, d)",
             lambda i: (lambda o: lambda: fp8_ops.fp8_wgrad_gemm_nt(o["a"], o["sfa"], o["b"], o["sfb"], o["d"]))(ops[i])),
        Case(problem, TORCH_OPS, "torch.ops.cutegen.fp8_wgrad_gemm_nt",
             lambda i: (lambda o: lambda: torch.ops.cutegen.fp8_wgrad_gemm_nt(o["a"], o["sfa"], o["b"], o["sfb"], o["d"]))(ops[i])),
        Case(problem, DEEP_GEMM, "deep_gemm.fp8_gemm_nt(..., c=d, recipe=(1, 1, 128))",
             lambda i: (lambda o: lambda: dg.fp8_gemm_nt((o["a"], o["sfa"]), (o["b"], o["sfb"]), o["d"], c=o["d"],
                                                          recipe=(1, 1, 128)))(ops[i])),
    ]


def _contiguous_cases(size: str, groups: int, rows: int, n: int, k: int) -> list[Case]:
    import torch

    import cutegen.deep_gemm as dg
    from cutegen.runtime import grouped_ops

    total = groups * rows
    problem = Problem("m_grouped_fp8_gemm_nt_contiguous", size, f"{groups} x {rows} rows, N={n} K={k}")
    m_indices = torch.arange(groups, device="cuda", dtype=torch.int32).repeat_interleave(rows)
    m_indices[rows - 7 : rows] = -1  # a few padding rows
    ops = Operands(
        ROTATION,
        a=torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn),
        sfa=_mn_major(torch.rand(total, k // SCALE_BLOCK, device="cuda") + 0.5),
        b=torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn),
        sfb=torch.rand(groups, ceil_div(n, SCALE_BLOCK), k // SCALE_BLOCK, device="cuda") + 0.5,
        d=torch.empty(total, n, device="cuda", dtype=torch.bfloat16),
        m_indices=m_indices,
    )
    return [
        Case(problem, DIRECT, "grouped_ops.m_grouped_fp8_gemm_nt_contiguous(..., out=d)",
             lambda i: (lambda o: lambda: grouped_ops.m_grouped_fp8_gemm_nt_contiguous(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["m_indices"], out=o["d"]))(ops[i])),
        Case(problem, TORCH_OPS, "torch.ops.cutegen.m_grouped_fp8_gemm_nt_contiguous_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.m_grouped_fp8_gemm_nt_contiguous_out(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["m_indices"], o["d"]))(ops[i])),
        Case(problem, DEEP_GEMM, "deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices)",
             lambda i: (lambda o: lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
                 (o["a"], o["sfa"]), (o["b"], o["sfb"]), o["d"], o["m_indices"]))(ops[i])),
    ]


def _masked_cases(size: str, groups: int, max_m: int, expected_m: int, n: int, k: int) -> list[Case]:
    import torch

    import cutegen.deep_gemm as dg
    from cutegen.runtime import grouped_ops

    problem = Problem("m_grouped_fp8_gemm_nt_masked", size, f"{groups} x max_m {max_m} (expected {expected_m}), N={n} K={k}")
    ops = Operands(
        ROTATION,
        a=torch.randn(groups, max_m, k, device="cuda").to(torch.float8_e4m3fn),
        sfa=_mn_major(torch.rand(groups, max_m, k // SCALE_BLOCK, device="cuda") + 0.5),
        b=torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn),
        sfb=torch.rand(groups, ceil_div(n, SCALE_BLOCK), k // SCALE_BLOCK, device="cuda") + 0.5,
        d=torch.empty(groups, max_m, n, device="cuda", dtype=torch.bfloat16),
        masked_m=torch.full((groups,), expected_m, dtype=torch.int32, device="cuda"),
    )
    return [
        Case(problem, DIRECT, "grouped_ops.m_grouped_fp8_gemm_nt_masked(..., out=d)",
             lambda i: (lambda o: lambda: grouped_ops.m_grouped_fp8_gemm_nt_masked(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["masked_m"], expected_m, out=o["d"]))(ops[i])),
        Case(problem, TORCH_OPS, "torch.ops.cutegen.m_grouped_fp8_gemm_nt_masked_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.m_grouped_fp8_gemm_nt_masked_out(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["masked_m"], expected_m, o["d"]))(ops[i])),
        Case(problem, DEEP_GEMM, "deep_gemm.fp8_m_grouped_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m)",
             lambda i: (lambda o: lambda: dg.fp8_m_grouped_gemm_nt_masked(
                 (o["a"], o["sfa"]), (o["b"], o["sfb"]), o["d"], o["masked_m"], expected_m))(ops[i])),
    ]


def _k_grouped_cases(size: str, groups: int, tokens: int, m: int, n: int) -> list[Case]:
    import torch

    import cutegen.deep_gemm as dg
    from cutegen.runtime import k_grouped_ops

    problem = Problem("k_grouped_fp8_gemm_nt_contiguous", size, f"{groups} x {tokens} tokens, M={m} N={n}")
    blocks = groups * tokens // SCALE_BLOCK
    ops = Operands(
        ROTATION,
        a=torch.randn(SCALE_BLOCK * m * blocks, device="cuda").to(torch.float8_e4m3fn),
        sfa=torch.rand(blocks, m, device="cuda") + 0.5,
        b=torch.randn(SCALE_BLOCK * n * blocks, device="cuda").to(torch.float8_e4m3fn),
        sfb=torch.rand(blocks, n, device="cuda") + 0.5,
        d=torch.zeros(groups, m, n, device="cuda"),
        sizes=torch.full((groups,), tokens, dtype=torch.int32, device="cuda"),
    )
    ks = [tokens] * groups
    return [
        Case(problem, DIRECT, "k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, sizes)",
             lambda i: (lambda o: lambda: k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["sizes"]))(ops[i])),
        Case(problem, TORCH_OPS, "torch.ops.cutegen.k_grouped_fp8_gemm_nt_contiguous",
             lambda i: (lambda o: lambda: torch.ops.cutegen.k_grouped_fp8_gemm_nt_contiguous(
                 o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["sizes"]))(ops[i])),
        # DeepGEMM's layout: scales [rows, Σk/128] MN-major, the transposes of cutegen's.
        Case(problem, DEEP_GEMM, "deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, sizes, c=d)",
             lambda i: (lambda o: lambda: dg.k_grouped_fp8_gemm_nt_contiguous(
                 (o["a"], o["sfa"].t()), (o["b"], o["sfb"].t()), o["d"], ks, o["sizes"], c=o["d"]))(ops[i])),
    ]


def _quant_cases(size: str, m: int, k: int, groups: int) -> list[Case]:
    import torch

    from cutegen.runtime import quant_ops

    kb = ceil_div(k, SCALE_BLOCK)
    per_token = Problem("per_token_quant_fp8", size, f"x [{m}, {k}]")
    per_block = Problem("per_block_quant_fp8", size, f"w [{m}, {k}]")
    transposed = Problem("grouped_transposed_quant_fp8", size, f"x [{m}, {k}], {groups} groups")
    rows = align(m, 4)
    ops = Operands(
        ROTATION,
        x=torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
        q=torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn),
        sf=torch.empty_strided((m, kb), (1, rows), device="cuda", dtype=torch.float32),
        sfb=torch.empty(ceil_div(m, SCALE_BLOCK), kb, device="cuda", dtype=torch.float32),
        sizes=torch.full((groups,), m // groups, dtype=torch.int32, device="cuda"),
    )
    s = quant_ops.grouped_num_blocks_bound(m, groups)
    grouped_out = Operands(
        ROTATION,
        q=torch.empty(SCALE_BLOCK * k * s, device="cuda", dtype=torch.float8_e4m3fn),
        sf=torch.empty(s, k, device="cuda", dtype=torch.float32),
    )
    layout = "mn-major-tma-aligned"
    return [
        Case(per_token, DIRECT, "quant_ops.per_token_quant_fp8(x, scale_layout=MN-major) (new outputs)",
             lambda i: (lambda o: lambda: quant_ops.per_token_quant_fp8(o["x"], scale_layout=layout))(ops[i])),
        Case(per_token, DIRECT, "quant_ops.per_token_quant_fp8(x, ..., out=q, out_scales=sf)",
             lambda i: (lambda o: lambda: quant_ops.per_token_quant_fp8(
                 o["x"], scale_layout=layout, out=o["q"], out_scales=o["sf"]))(ops[i])),
        Case(per_token, TORCH_OPS, "torch.ops.cutegen.per_token_quant_fp8_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.per_token_quant_fp8_out(
                 o["x"], o["q"], o["sf"], SCALE_BLOCK, "fp32", layout, quant_ops.DEFAULT_EPS, ""))(ops[i])),
        Case(per_block, DIRECT, "quant_ops.per_block_quant_fp8(w, out=q, out_scales=sf)",
             lambda i: (lambda o: lambda: quant_ops.per_block_quant_fp8(o["x"], out=o["q"], out_scales=o["sfb"]))(ops[i])),
        Case(per_block, TORCH_OPS, "torch.ops.cutegen.per_block_quant_fp8_out",
             lambda i: (lambda o: lambda: torch.ops.cutegen.per_block_quant_fp8_out(
                 o["x"], o["q"], o["sfb"], quant_ops.DEFAULT_EPS, ""))(ops[i])),
        Case(transposed, DIRECT, "quant_ops.grouped_transposed_quant_fp8(x, sizes, out=q, out_scales=sf)",
             lambda i: (lambda o, g: lambda: quant_ops.grouped_transposed_quant_fp8(
                 o["x"], o["sizes"], out=g["q"], out_scales=g["sf"]))(ops[i], grouped_out[i])),
        Case(transposed, TORCH_OPS, "torch.ops.cutegen.grouped_transposed_quant_fp8_out",
             lambda i: (lambda o, g: lambda: torch.ops.cutegen.grouped_transposed_quant_fp8_out(
                 o["x"], o["sizes"], g["q"], g["sf"], quant_ops.DEFAULT_EPS, ""))(ops[i], grouped_out[i])),
        Case(per_token, ANCHOR, "torch.empty of q", lambda i: lambda: torch.empty(
            m, k, device="cuda", dtype=torch.float8_e4m3fn)),
    ]


# (size, builder, arguments): the problems, each op at a decode and a prefill size.
PROBLEMS: tuple[tuple[str, Callable[..., list[Case]], tuple], ...] = (
    ("decode", _dense_cases, (128, 3072, 4096)),
    ("prefill", _dense_cases, (4096, 7168, 2048)),
    ("decode", _wgrad_cases, (1536, 1024, 512)),
    ("prefill", _wgrad_cases, (7168, 2048, 4096)),
    ("decode", _contiguous_cases, (4, 128, 3072, 4096)),
    ("prefill", _contiguous_cases, (8, 512, 4096, 7168)),
    ("decode", _masked_cases, (4, 128, 64, 3072, 4096)),
    ("prefill", _masked_cases, (8, 1024, 512, 4096, 7168)),
    ("decode", _k_grouped_cases, (4, 128, 1024, 1024)),
    ("prefill", _k_grouped_cases, (8, 2048, 2048, 7168)),
    ("decode", _quant_cases, (128, 4096, 4)),
    ("prefill", _quant_cases, (4096, 7168, 8)),
)


def bench_host(progress: Callable[[str], None] = print) -> dict:
    """Every case of `PROBLEMS` timed (module docstring) and the first calls in a fresh process."""
    import torch

    rows = []
    # Every problem's cases take turns in each round, so that a slower spell of the host falls
    # on all of them alike (a spell over one problem's turns alone skewed its rows by 1.5x).
    cases = [case for size, build, args in PROBLEMS for case in build(size, *args)]
    for case, timing in zip(cases, measure_cases(cases)):
        rows.append({"op": case.problem.op, "size": case.problem.size, "shape": case.problem.shape,
                     "path": case.path, "call": case.label, **timing})
        progress(f"  {case.problem.op} {case.problem.size} {case.path}: {case.label}: host "
                 f"{timing['fixed_host_us']:.1f} / {timing['rotating_host_us']:.1f} µs, GPU "
                 f"{timing['rotating_gpu_us']:.1f} µs")
    del cases
    torch.cuda.empty_cache()
    return {"rows": rows, "first_calls_ms": first_calls(), "batch": BATCH, "batches": BATCHES * ROUNDS,
            "rounds": ROUNDS, "rotation": ROTATION, "turns": "every problem"}


# ------------------------------------------------------------------------------------------------
# First calls, in a fresh process

_FIRST_CALLS = r"""
import json, sys, time
import torch
from cutegen.runtime import bf16_ops, fp8_ops, grouped_ops, k_grouped_ops, quant_ops

def mn(t):
    return fp8_ops.to_mn_major_tma_aligned(t)

m, n, k, g = 128, 3072, 4096, 4
kb = k // 128
a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
sfa = mn(torch.rand(m, kb, device="cuda") + 0.5)
sfb = torch.rand(n // 128, kb, device="cuda") + 0.5
d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
ga = torch.randn(g * m, k, device="cuda").to(torch.float8_e4m3fn)
gsfa = mn(torch.rand(g * m, kb, device="cuda") + 0.5)
gb = torch.randn(g, n, k, device="cuda").to(torch.float8_e4m3fn)
gsfb = torch.rand(g, n // 128, kb, device="cuda") + 0.5
gd = torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16)
m_indices = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
ma = ga.view(g, m, k)
msfa = mn(torch.rand(g, m, kb, device="cuda") + 0.5)
masked_m = torch.full((g,), m // 2, dtype=torch.int32, device="cuda")
md = gd.view(g, m, n)
wd = torch.zeros(m, n, device="cuda")
wsfb = mn(torch.rand(n, kb, device="cuda") + 0.5)
ka = torch.randn(128 * 256 * 8, device="cuda").to(torch.float8_e4m3fn)
ksf = torch.rand(8, 256, device="cuda") + 0.5
kd = torch.zeros(2, 256, 256, device="cuda")
ks = torch.full((2,), 512, dtype=torch.int32, device="cuda")
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
group_sizes = ks[:1] // 8  # made here: its division is torch's first, outside the timed call
torch.cuda.synchronize()
calls = {
    "fp8_gemm_nt": lambda: fp8_ops.fp8_gemm_nt(a, sfa, b, sfb, out=d),
    "bf16_gemm_nt": lambda: bf16_ops.bf16_gemm_nt(a16, b16, out=d),
    "fp8_wgrad_gemm_nt": lambda: fp8_ops.fp8_wgrad_gemm_nt(a, sfa, b, wsfb, wd),
    "m_grouped_fp8_gemm_nt_contiguous": lambda: grouped_ops.m_grouped_fp8_gemm_nt_contiguous(ga, gsfa, gb, gsfb, m_indices, out=gd),
    "m_grouped_fp8_gemm_nt_masked": lambda: grouped_ops.m_grouped_fp8_gemm_nt_masked(ma, msfa, gb, gsfb, masked_m, m // 2, out=md),
    "k_grouped_fp8_gemm_nt_contiguous": lambda: k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(ka, ksf, ka, ksf, kd, ks),
    "per_token_quant_fp8": lambda: quant_ops.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned"),
    "per_block_quant_fp8": lambda: quant_ops.per_block_quant_fp8(b16),
    "grouped_transposed_quant_fp8": lambda: quant_ops.grouped_transposed_quant_fp8(x, group_sizes),
}
out = {}
for name, call in calls.items():
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    out[name] = {"first_ms": (t1 - t0) * 1e3, "second_ms": (t2 - t1) * 1e3}
print(json.dumps(out))
"""


def first_calls() -> dict:
    """Each op's first and second call in a fresh process (ms, synchronised), in the order listed;
    the first op's first call also opens the catalogue."""
    done = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# The table


def _target(row: dict) -> float | None:
    if row["path"] == DIRECT:
        return TARGET_FP8_DIRECT_US if row["op"] == "fp8_gemm_nt" else TARGET_OTHER_DIRECT_US
    if row["path"] == TORCH_OPS and row["op"] == "fp8_gemm_nt":
        return TARGET_FP8_TORCH_OPS_US
    return None


def table_lines(result: dict) -> list[str]:
    """The method in a paragraph, the host-cost table and the first calls (Markdown lines): what the
    printout and the report's ``host`` section show."""
    lines = [
        f"Calls issued in batches of {result.get('batch', BATCH)} without synchronising "
        f"({result.get('batches', BATCHES * ROUNDS)} batches in {result.get('rounds', 1)} rounds, the cases of "
        f"{result.get('turns', 'a problem')} taking turns; medians); fixed: the same tensors every call; rotating: "
        f"operands and outputs at another address every call ({result.get('rotation', ROTATION)} sets). "
        "GPU µs per call: CUDA events around each batch (the kernels' time, or the host's when the host is "
        f"slower: bound). Targets: fp8_gemm_nt ≤ {TARGET_FP8_DIRECT_US:.0f} µs direct and "
        f"≤ {TARGET_FP8_TORCH_OPS_US:.0f} µs through torch.ops, other ops ≤ {TARGET_OTHER_DIRECT_US:.0f} µs "
        "direct, whichever of fixed and rotating is slower.",
        "",
        "| op | size | problem | path | call | host µs fixed | host µs rotating | GPU µs/call | bound | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result.get("rows", []):
        target = _target(r)
        worst = max(r["fixed_host_us"], r["rotating_host_us"])
        verdict = "" if target is None else (f"≤ {target:.0f}: met" if worst <= target else f"≤ {target:.0f}: missed")
        bound = "host" if r["rotating_host_us"] >= 0.9 * r["rotating_gpu_us"] else "GPU"
        lines.append(
            f"| {r['op']} | {r['size']} | {r['shape']} | {r['path']} | `{r['call']}` | {r['fixed_host_us']:.1f} | "
            f"{r['rotating_host_us']:.1f} | {r['rotating_gpu_us']:.1f} | {bound} | {verdict} |"
        )
    first = result.get("first_calls_ms") or {}
    lines += ["", f"First call of each op in a fresh process (ms, synchronised; target ≤ {TARGET_FIRST_CALL_MS:.0f} ms; "
                  "the first op's also opens the catalogue):", ""]
    if "error" in first:
        lines.append(f"- not measured: {first['error']}")
    else:
        lines += [f"- {op}: first {v['first_ms']:.1f} ms, second {v['second_ms']:.2f} ms" for op, v in first.items()]
    return lines


def summary_line(result: dict) -> str:
    """One line for the report's summary: fp8_gemm_nt's host µs at the decode size, direct and
    through torch.ops, beside cuBLAS blockwise (the range over its rows, fixed and rotating)."""
    def span(path: str, call: str | None = None) -> str:
        values = [v for r in result.get("rows", [])
                  if r["op"] == "fp8_gemm_nt" and r["path"] == path and r["size"] == "decode"
                  and (call is None or r["call"].startswith(call))
                  for v in (r["fixed_host_us"], r["rotating_host_us"])]
        return f"{min(values):.1f}-{max(values):.1f} µs" if values else "n/a"

    met = [r for r in result.get("rows", []) if _target(r) is not None]
    n_met = sum(max(r["fixed_host_us"], r["rotating_host_us"]) <= _target(r) for r in met)
    return (f"- `host`: fp8_gemm_nt at decode size {span(DIRECT)} per call direct, {span(TORCH_OPS)} through "
            f"torch.ops (cuBLAS blockwise {span(ANCHOR, 'F.scaled_mm')}); {n_met} of {len(met)} calls within "
            "their targets")


def render(result: dict, env: dict) -> str:
    """The host-cost printout (Markdown)."""
    title = (f"# Host cost per call on {env.get('gpu', '?')} ({env.get('date', '?')}; "
             f"torch {env.get('torch', '?')})")
    return "\n".join([title, "", *table_lines(result)]) + "\n"


__all__ = ["Case", "Problem", "bench_host", "distinct_views", "first_calls", "measure", "render", "summary_line",
           "table_lines"]
