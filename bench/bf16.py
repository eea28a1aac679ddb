"""The BF16 family's benchmark: `bf16_gemm_nt` (bf16 and fp32 D) over M from 1 to 8192 beside
`torch.matmul`, and the M-grouped BF16 GEMMs beside the best torch alternative (a per-group
`torch.matmul` loop, `torch._grouped_mm`), every pair timed interleaved in one run (medians).

`bench_bf16_family()` needs a GPU; `render(results)` turns its results into Markdown (no torch).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from cutegen.bench.timing import interleaved_medians

# N, K of DeepSeek-V3 (q/kv down and up projections, attention output, shared expert) and Qwen3
# (attention and MLP projections of the 32B/235B models) layers.
DENSE_NK = [(2112, 7168), (24576, 1536), (7168, 2048), (4096, 7168), (12288, 5120), (5120, 25600)]
DENSE_M = [1, 16, 64, 128, 256, 333, 512, 1024, 2048, 4096, 8192]
# fp32 D: DeepGEMM's fp32-output shapes (a router and an LM head at K 7168).
FP32_NK = [(256, 7168), (129280, 7168)]
FP32_M = [1, 128, 4096]
# The other forms of the call: MN-major operands (DeepGEMM's backward: a data gradient nn, a weight
# gradient tn adding into an fp32 D) and D = C + A·Bᵀ at small M (DeepGEMM's BF16 test shapes):
# (layout, M, N, K, D type, adds into D).
OTHER_FORMS = [("nn", 4096, 7168, 2112), ("nn", 4096, 2048, 7168), ("tn", 7168, 2112, 4096, "f32", True),
               ("tn", 2048, 7168, 4096, "f32", True), ("tt", 4096, 4096, 4096),
               ("nt", 1, 576, 7168, "bf16", True), ("nt", 128, 4096, 7168, "bf16", True),
               ("tn", 576, 4096, 7168), ("tn", 576, 4096, 7168, "f32", True), ("tn", 256, 4096, 7168, "f32", True)]
# DeepGEMM's grouped benchmark shapes: contiguous (groups, expected rows), masked (groups, expected
# rows) in max_m 4096 buffers, each over its N, K list.
GROUPED_NK = [(6144, 7168), (7168, 3072), (4096, 4096), (4096, 2048)]
CONTIGUOUS = [(4, 8192), (8, 4096)]
MASKED = [(32, 192), (6, 1024), (32, 20), (6, 20)]
MASKED_MAX_M = 4096
ALIGNMENT = 128
# Rounds of interleaved timing per pair (each a median of `time_cuda`'s repetitions).
ROUNDS = 3
# Targets (geometric mean and floor over the dense shapes; grouped against the best torch).
DENSE_GEOMEAN_TARGET, DENSE_FLOOR, GROUPED_TARGET = 1.00, 0.95, 1.2



def ragged_group_sizes(groups: int, expected: int, seed: int) -> list[int]:
    """Rows per group drawn 0.7-1.3x `expected` (at least 1), from a seed fixed per problem."""
    import random

    rng = random.Random(seed)
    return [max(1, int(expected * rng.uniform(0.7, 1.3))) for _ in range(groups)]


def bench_dense() -> list[dict]:
    import torch

    from cutegen.bench.timing import fresh_allocations
    from cutegen.runtime import ops

    rows = []
    for d_dtype, ms, nks in (("bf16", DENSE_M, DENSE_NK), ("f32", FP32_M, FP32_NK)):
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[d_dtype]
        if not ops.runnable_kernels("bf16_gemm_nt", d_dtype=d_dtype, adds=False, layout="nt"):
            continue
        for n, k in nks:
            for m in ms:
                fresh_allocations()
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(m, n, device="cuda", dtype=dtype)
                ref = torch.empty(m, n, device="cuda", dtype=dtype)
                if dtype == torch.bfloat16:
                    anchor = lambda: torch.matmul(a, b.t(), out=ref)  # noqa: E731
                else:
                    anchor = lambda: torch.mm(a, b.t(), out_dtype=torch.float32)  # noqa: E731
                t = interleaved_medians({"ours": lambda: ops.bf16_gemm_nt(a, b, out=out), "torch": anchor}, ROUNDS)
                flops = 2.0 * m * n * k
                rows.append({
                    "d": d_dtype, "m": m, "n": n, "k": k,
                    "kernel": ops.choose_kernel("bf16_gemm_nt", m, n, k, d_dtype=d_dtype, adds=False, layout="nt"),
                    "ours_us": t["ours"], "torch_us": t["torch"], "ours_tflops": flops / t["ours"] / 1e6,
                    "torch_tflops": flops / t["torch"] / 1e6, "ratio": t["torch"] / t["ours"],
                })
                del a, b, out, ref
    for layout, m, n, k, *rest in OTHER_FORMS:
        d_dtype, adds = rest if rest else ("bf16", False)
        if not ops.runnable_kernels("bf16_gemm_nt", d_dtype=d_dtype, adds=adds, layout=layout):
            continue
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[d_dtype]
        fresh_allocations()
        # The same values as a [K, M] / [K, N] storage where the layout says so, as a backward has them.
        a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if layout in ("tn", "tt") else \
            torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16).t() if layout in ("nn", "tn") else \
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.zeros(m, n, device="cuda", dtype=dtype)
        if adds:  # D += A·Bᵀ in place; torch: one GEMM reading C (cuBLASLt's beta = 1)
            ours = lambda: ops.bf16_gemm_nt(a, b, out=out, c=out)  # noqa: E731
            anchor = _adding_anchor(torch, a, b, out)
        else:
            ours = lambda: ops.bf16_gemm_nt(a, b, out=out)  # noqa: E731
            anchor = lambda: torch.matmul(a, b.t(), out=out)  # noqa: E731
        t = interleaved_medians({"ours": ours, "torch": anchor}, ROUNDS)
        flops = 2.0 * m * n * k
        rows.append({
            "d": f"{d_dtype} {layout}{' +=' if adds else ''}", "m": m, "n": n, "k": k,
            "kernel": ops.choose_kernel("bf16_gemm_nt", m, n, k, d_dtype=d_dtype, adds=adds, layout=layout),
            "ours_us": t["ours"], "torch_us": t["torch"], "ours_tflops": flops / t["ours"] / 1e6,
            "torch_tflops": flops / t["torch"] / 1e6, "ratio": t["torch"] / t["ours"],
        })
        del a, b, out
    return rows


def _adding_anchor(torch, a, b, c) -> Callable[[], object]:
    """torch's D = C + A·Bᵀ in C's type: `torch.addmm`, one cuBLAS GEMM reading C (an fp32 C from
    bf16 operands through its `out_dtype`)."""
    widen = {} if c.dtype == torch.bfloat16 else {"out_dtype": c.dtype}
    return lambda: torch.addmm(c, a, b.t(), **widen)


def _grouped_mm(a, b_t, offs=None):
    """`torch._grouped_mm` where this torch has it (None otherwise)."""
    import torch

    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None
    return lambda: fn(a, b_t, offs=offs) if offs is not None else fn(a, b_t)


def bench_grouped() -> list[dict]:
    import torch

    from cutegen.bench.timing import fresh_allocations
    from cutegen.runtime import bf16_grouped_ops, ops

    rows = []
    layouts = []
    if ops.runnable_kernels("m_grouped_bf16_gemm_nt_contiguous"):
        layouts += [("contiguous", g, e) for g, e in CONTIGUOUS]
    if ops.runnable_kernels("m_grouped_bf16_gemm_nt_masked"):
        layouts += [("masked", g, e) for g, e in MASKED]
    for layout, groups, expected in layouts:
        for n, k in GROUPED_NK:
            fresh_allocations()
            sizes = ragged_group_sizes(groups, expected, seed=groups * 131 + n + k)
            b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
            fns: dict[str, Callable[[], object]] = {}
            if layout == "contiguous":
                spans = [-(-s // ALIGNMENT) * ALIGNMENT for s in sizes]
                starts = [sum(spans[:g]) for g in range(groups)]
                total = sum(spans)
                a = torch.zeros(total, k, device="cuda", dtype=torch.bfloat16)
                m_indices = torch.full((total,), -1, dtype=torch.int32, device="cuda")
                for g, (r, size) in enumerate(zip(starts, sizes)):
                    a[r : r + size] = torch.randn(size, k, device="cuda", dtype=torch.bfloat16)
                    m_indices[r : r + size] = g
                out = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
                fns["ours"] = lambda: bf16_grouped_ops.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out)
                fns["torch.matmul loop"] = lambda: [torch.matmul(a[r : r + s], b[g].t()) for g, (r, s) in enumerate(zip(starts, sizes))]
                ends = torch.tensor([r + s for r, s in zip(starts, spans)], dtype=torch.int32, device="cuda")
                grouped = _grouped_mm(a, b.transpose(1, 2), ends)
            else:
                a = torch.randn(groups, MASKED_MAX_M, k, device="cuda", dtype=torch.bfloat16)
                masked_m = torch.tensor(sizes, dtype=torch.int32, device="cuda")
                out = torch.empty(groups, MASKED_MAX_M, n, device="cuda", dtype=torch.bfloat16)
                fns["ours"] = lambda: bf16_grouped_ops.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, expected, out=out)
                fns["torch.matmul loop"] = lambda: [torch.matmul(a[g, :s], b[g].t()) for g, s in enumerate(sizes)]
                grouped = _grouped_mm(a, b.transpose(1, 2))  # every max_m row: no mask in torch
            if grouped is not None:
                try:
                    grouped()
                    fns["torch._grouped_mm"] = grouped
                except (RuntimeError, TypeError) as exc:
                    print(f"torch._grouped_mm refused {layout} {groups}x{expected} N {n} K {k}: {str(exc)[:100]}")
            t = interleaved_medians(fns, ROUNDS)
            flops = 2.0 * sum(sizes) * n * k
            best = min((name for name in t if name != "ours"), key=lambda name: t[name])
            rows.append({
                "layout": layout, "groups": groups, "expected": expected, "n": n, "k": k, "rows": sum(sizes),
                "ours_us": t["ours"], "ours_tflops": flops / t["ours"] / 1e6,
                "torch_us": {name: v for name, v in t.items() if name != "ours"},
                "best_torch": best, "ratio": t[best] / t["ours"],
            })
            del a, b, out
    return rows


def bench_bf16_family() -> dict:
    return {"dense": bench_dense(), "grouped": bench_grouped(),
            "targets": {"dense_geomean": DENSE_GEOMEAN_TARGET, "dense_floor": DENSE_FLOOR, "grouped": GROUPED_TARGET}}


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(results: dict) -> list[str]:
    """One line per table: geometric mean and worst ratio, against the targets."""
    out = []
    for d in ("bf16", "f32"):
        ratios = [r["ratio"] for r in results.get("dense", []) if r["d"] == d]
        if ratios:
            out.append(f"bf16_gemm_nt, {d} D: {_geomean(ratios):.3f}x torch.matmul (geometric mean over {len(ratios)} "
                       f"shapes; worst {min(ratios):.2f}x; targets {DENSE_GEOMEAN_TARGET:.2f}x and {DENSE_FLOOR:.2f}x)")
    other_forms = [r["ratio"] for r in results.get("dense", []) if r["d"] not in ("bf16", "f32")]
    if other_forms:
        out.append(f"bf16_gemm_nt, MN-major operands and D = C + A·Bᵀ: {_geomean(other_forms):.3f}x torch on the same views "
                   f"(geometric mean over {len(other_forms)} shapes; worst {min(other_forms):.2f}x)")
    for layout in ("contiguous", "masked"):
        ratios = [r["ratio"] for r in results.get("grouped", []) if r["layout"] == layout]
        if ratios:
            out.append(f"m_grouped_bf16_gemm_nt_{layout}: {_geomean(ratios):.3f}x the best torch alternative "
                       f"(worst {min(ratios):.2f}x; target {GROUPED_TARGET:.1f}x)")
    return out


def render(results: dict) -> str:
    """Markdown tables of `bench_bf16_family`'s results."""
    lines = ["## BF16 family (interleaved, medians)", ""]
    lines += [f"- {line}" for line in summary(results)] + [""]
    dense = results.get("dense", [])
    if dense:
        lines += ["| D | M, N, K | kernel | µs | TFLOPS | torch µs | torch TFLOPS | vs torch |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in dense:
            lines.append(f"| {r['d']} | {r['m']}, {r['n']}, {r['k']} | `{r['kernel']}` | {r['ours_us']:.1f} | "
                         f"{r['ours_tflops']:.0f} | {r['torch_us']:.1f} | {r['torch_tflops']:.0f} | {r['ratio']:.2f} |")
        lines.append("")
    grouped = results.get("grouped", [])
    if grouped:
        lines += ["| layout | groups x rows | N, K | µs | TFLOPS (real rows) | torch µs | vs best torch |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in grouped:
            torch_cells = ", ".join(f"{name} {us:.1f}" for name, us in r["torch_us"].items())
            lines.append(f"| {r['layout']} | {r['groups']} x ~{r['expected']} | {r['n']}, {r['k']} | {r['ours_us']:.1f} | "
                         f"{r['ours_tflops']:.0f} | {torch_cells} | {r['ratio']:.2f} ({r['best_torch']}) |")
        lines.append("")
    return "\n".join(lines)


__all__ = ["bench_bf16_family", "render", "summary"]
