"""The fused MoE up-projection's benchmark: the GEMM with SwiGLU + FP8 quantize in its epilogue beside the
unfused pipelines it replaces, every pipeline timed interleaved in one run (medians).

Per expert shape (DeepSeek-V3, Qwen3) and layout (prefill: contiguous; decode: masked, each
pipeline captured in one CUDA graph and replayed):

* ``fused``: `m_grouped_fp8_gemm_nt_{contiguous,masked}_swiglu_quant`;
* ``gemm``: the plain grouped GEMM alone (bf16 h), the floor the fused kernel is held to (within 5%);
* ``gemm + torch.compile``: the plain GEMM, then SiLU(gate)·up and the per-token quantize
  (`per_token_quant_fp8_ref`'s steps) compiled by ``torch.compile``;
* ``gemm + cutegen quantize``: the plain GEMM, SiLU(gate)·up in torch (bf16), then cutegen's
  `per_token_quant_fp8` (MN-major TMA-aligned scales).

Targets: fused ≥ 1.15x the best unfused pipeline at prefill, ≥ 1.3x at decode.

Then the dense GEMMs with a bias and GELU fused (`fp8_gemm_nt_epilogue`, `bf16_gemm_nt_epilogue`)
beside the plain GEMM followed by the bias and GELU in torch, eager and ``torch.compile``d.
`bench_fused()` needs a GPU; `render(results)` turns its results into Markdown (no torch).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from cutegen.bench.bf16 import ragged_group_sizes
from cutegen.bench.timing import interleaved_medians

# Experts' (hidden H, intermediate I): DeepSeek-V3, Qwen3-235B-A22B, Qwen3-30B-A3B.
EXPERTS = [("DeepSeek-V3", 7168, 2048), ("Qwen3-235B", 4096, 1536), ("Qwen3-30B", 2048, 768)]
# Prefill: (groups, expected rows per group), sizes drawn 0.7-1.3x. Decode: (groups, rows per
# group in max_m buffers).
PREFILL = [(8, 4096), (32, 512)]
DECODE = [(32, 16), (8, 128)]
DECODE_MAX_M = 256
ALIGNMENT = 128
ROUNDS = 3
PREFILL_TARGET, DECODE_TARGET, GEMM_TOLERANCE = 1.15, 1.3, 1.05
E4M3_MAX = 448.0
# Dense layers with a bias and GELU (M, N, K): an MLP's up-projection at decode and prefill sizes.
DENSE_EPILOGUE = [(128, 16384, 4096), (4096, 16384, 4096), (4096, 4096, 16384)]




def _activation_quant(eps: float = 1e-4):
    """SiLU(gate)·up of bf16 h [..., 2I] and its per-token 1x128 quantize, as one torch function."""
    import torch

    def act_quant(h: torch.Tensor):
        inter = h.shape[-1] // 2
        act = torch.nn.functional.silu(h[..., :inter].float()) * h[..., inter:].float()
        groups = act.unflatten(-1, (inter // 128, 128))
        s = groups.abs().amax(-1).clamp(min=eps) / E4M3_MAX
        q = (groups * (1.0 / s).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return q.flatten(-2), s

    return act_quant


def _allow_one_compile_per_problem() -> None:
    """Dynamo counts recompilations per code object, and every problem compiles the same function
    for its own shape: past its limit (8) it would run the rest eagerly under the compiled label."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 64))


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` captured once in a CUDA graph (after a warm-up call); returns its replay."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _problem(layout: str, groups: int, expected: int, hidden: int, inter: int, seed: int):
    """Quantized operands of one up-projection: (a, sfa, w13, sfb interleaved for the fused op,
    w13 and sfb as the plain GEMM takes them, layout metadata, real rows)."""
    import torch

    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned
    from cutegen.runtime.fused_ops import interleave_gate_up

    n, k = 2 * inter, hidden
    w = torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn)
    sfb = (torch.rand(groups, n // 128, k // 128, device="cuda") + 0.5) / 64
    w_fused, sfb_fused = interleave_gate_up(w, sfb)
    sizes = ragged_group_sizes(groups, expected, seed)
    if layout == "contiguous":
        spans = [-(-s // ALIGNMENT) * ALIGNMENT for s in sizes]
        total = sum(spans)
        meta = torch.full((total,), -1, dtype=torch.int32, device="cuda")
        row = 0
        for g, (size, span) in enumerate(zip(sizes, spans)):
            meta[row:row + size] = g
            row += span
        a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
        sfa = to_mn_major_tma_aligned((torch.rand(total, k // 128, device="cuda") + 0.5) / 64)
    else:
        sizes = [min(s, DECODE_MAX_M) for s in sizes]
        meta = torch.tensor(sizes, dtype=torch.int32, device="cuda")
        a = torch.randn(groups, DECODE_MAX_M, k, device="cuda").to(torch.float8_e4m3fn)
        sfa = to_mn_major_tma_aligned((torch.rand(groups, DECODE_MAX_M, k // 128, device="cuda") + 0.5) / 64)
    return a, sfa, w_fused, sfb_fused, w, sfb.contiguous(), meta, sum(sizes)


def bench_fused() -> dict[str, Any]:
    import torch

    from cutegen.bench.timing import fresh_allocations
    from cutegen.runtime import fused_ops, grouped_ops, ops, quant_ops
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    _allow_one_compile_per_problem()
    rows = []
    layouts = [("contiguous", g, e) for g, e in PREFILL] + [("masked", g, e) for g, e in DECODE]
    for model, hidden, inter in EXPERTS:
        for layout, groups, expected in layouts:
            fused_op = f"m_grouped_fp8_gemm_nt_{layout}_swiglu_quant"
            if not ops.runnable_kernels(fused_op):
                continue
            fresh_allocations()
            a, sfa, w_fused, sfb_fused, w, sfb, meta, real = _problem(layout, groups, expected, hidden, inter, seed=hidden + groups)
            if layout == "contiguous":
                h = torch.empty(a.shape[0], 2 * inter, device="cuda", dtype=torch.bfloat16)
                q = torch.empty(a.shape[0], inter, device="cuda", dtype=torch.float8_e4m3fn)
                sf = to_mn_major_tma_aligned(torch.empty(a.shape[0], inter // 128, device="cuda"))

                def fused(a=a, sfa=sfa, wf=w_fused, sf_f=sfb_fused, meta=meta, q=q, sf=sf):
                    fused_ops.m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(a, sfa, wf, sf_f, meta, out=q, out_sf=sf)

                def gemm(a=a, sfa=sfa, w=w, sfb=sfb, meta=meta, h=h):
                    grouped_ops.m_grouped_fp8_gemm_nt_contiguous(a, sfa, w, sfb, meta, out=h)
            else:
                h = torch.empty(groups, DECODE_MAX_M, 2 * inter, device="cuda", dtype=torch.bfloat16)
                q = torch.empty(groups, DECODE_MAX_M, inter, device="cuda", dtype=torch.float8_e4m3fn)
                sf = to_mn_major_tma_aligned(torch.empty(groups, DECODE_MAX_M, inter // 128, device="cuda"))

                def fused(a=a, sfa=sfa, wf=w_fused, sf_f=sfb_fused, meta=meta, q=q, sf=sf, e=expected):
                    fused_ops.m_grouped_fp8_gemm_nt_masked_swiglu_quant(a, sfa, wf, sf_f, meta, e, out=q, out_sf=sf)

                def gemm(a=a, sfa=sfa, w=w, sfb=sfb, meta=meta, h=h, e=expected):
                    grouped_ops.m_grouped_fp8_gemm_nt_masked(a, sfa, w, sfb, meta, e, out=h)

            compiled = torch.compile(_activation_quant(), dynamic=False)  # one shape each

            def with_compile(gemm=gemm, h=h, compiled=compiled):
                gemm()
                compiled(h)

            def with_cutegen_quant(gemm=gemm, h=h, inter=inter):
                gemm()
                act = (torch.nn.functional.silu(h[..., :inter].float()) * h[..., inter:].float()).to(torch.bfloat16)
                quant_ops.per_token_quant_fp8(act.reshape(-1, inter), scale_layout="mn-major-tma-aligned")

            fns = {"fused": fused, "gemm": gemm, "gemm + torch.compile": with_compile,
                   "gemm + cutegen quantize": with_cutegen_quant}
            if layout == "masked":  # decode runs under CUDA graphs
                fns = {name: _graphed(fn) for name, fn in fns.items()}
            t = interleaved_medians(fns, ROUNDS)
            unfused = {name: us for name, us in t.items() if name not in ("fused", "gemm")}
            best = min(unfused, key=unfused.get)
            flops = 2.0 * real * 2 * inter * hidden
            rows.append({
                "model": model, "layout": layout, "groups": groups, "expected": expected, "hidden": hidden,
                "intermediate": inter, "rows": real, "us": t, "fused_tflops": flops / t["fused"] / 1e6,
                "best_unfused": best, "speedup": unfused[best] / t["fused"], "vs_gemm": t["fused"] / t["gemm"],
            })
            del a, sfa, w_fused, sfb_fused, w, sfb, meta, h, q, sf
    return {"rows": rows, "bias_activation": bench_bias_activation(),
            "targets": {"prefill": PREFILL_TARGET, "decode": DECODE_TARGET, "gemm": GEMM_TOLERANCE}}


def bench_bias_activation() -> list[dict]:
    """D = GELU(A·Bᵀ + bias) per dense shape and GEMM (FP8, BF16): the fused kernel, the plain GEMM
    alone, and the plain GEMM then bias + GELU in torch (eager, ``torch.compile``d)."""
    import torch

    from cutegen.bench.timing import fresh_allocations
    from cutegen.runtime import epilogue_ops, ops
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    def bias_gelu(h, bias):
        return torch.nn.functional.gelu(h.float() + bias.float()).to(torch.bfloat16)

    _allow_one_compile_per_problem()
    rows = []
    for gemm_name in ("fp8_gemm_nt", "bf16_gemm_nt"):
        if not ops.runnable_kernels(f"{gemm_name}_bias_gelu"):
            continue
        for m, n, k in DENSE_EPILOGUE:
            fresh_allocations()
            bias = torch.randn(n, device="cuda").to(torch.bfloat16)
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            h = torch.empty_like(d)
            if gemm_name == "fp8_gemm_nt":
                a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
                sfa = to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda") + 0.5)
                sfb = torch.rand(n // 128, k // 128, device="cuda") + 0.5
                args = (a, sfa, b, sfb)
                fused = lambda args=args, bias=bias, d=d: epilogue_ops.fp8_gemm_nt_epilogue(*args, bias, "gelu", d)  # noqa: E731
                gemm = lambda args=args, h=h: ops.fp8_gemm_nt(*args, out=h)  # noqa: E731
            else:
                args = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
                fused = lambda args=args, bias=bias, d=d: epilogue_ops.bf16_gemm_nt_epilogue(*args, bias, "gelu", d)  # noqa: E731
                gemm = lambda args=args, h=h: ops.bf16_gemm_nt(*args, out=h)  # noqa: E731
            compiled = torch.compile(lambda h, bias: bias_gelu(h, bias), dynamic=False)  # one shape each
            fns = {
                "fused": fused,
                "gemm": gemm,
                "gemm + torch": lambda gemm=gemm, h=h, bias=bias, d=d: (gemm(), d.copy_(bias_gelu(h, bias))),
                "gemm + torch.compile": lambda gemm=gemm, h=h, bias=bias, d=d, c=compiled: (gemm(), d.copy_(c(h, bias))),
            }
            t = interleaved_medians(fns, ROUNDS)
            unfused = {name: us for name, us in t.items() if name.startswith("gemm +")}
            best = min(unfused, key=unfused.get)
            rows.append({"gemm": gemm_name, "m": m, "n": n, "k": k, "us": t,
                         "tflops": 2.0 * m * n * k / t["fused"] / 1e6, "best_unfused": best,
                         "speedup": unfused[best] / t["fused"], "vs_gemm": t["fused"] / t["gemm"]})
            del args, bias, d, h
    return rows


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(results: dict) -> list[str]:
    out = []
    for layout, phase, target in (("contiguous", "prefill", PREFILL_TARGET), ("masked", "decode", DECODE_TARGET)):
        rows = [r for r in results.get("rows", []) if r["layout"] == layout]
        if rows:
            speedups = [r["speedup"] for r in rows]
            slowest = max(r["vs_gemm"] for r in rows)
            out.append(f"{phase} ({layout}): fused {_geomean(speedups):.2f}x the best unfused pipeline (geometric mean "
                       f"over {len(rows)}; worst {min(speedups):.2f}x; target {target:.2f}x); fused at most "
                       f"{slowest:.2f}x the plain GEMM's time (target {GEMM_TOLERANCE:.2f}x)")
    dense = results.get("bias_activation", [])
    if dense:
        out.append(f"dense GEMM + bias + GELU: fused {_geomean([r['speedup'] for r in dense]):.2f}x the best unfused "
                   f"pipeline (geometric mean over {len(dense)}; worst {min(r['speedup'] for r in dense):.2f}x); "
                   f"fused at most {max(r['vs_gemm'] for r in dense):.2f}x the plain GEMM's time")
    return out


def render(results: dict) -> str:
    lines = ["## Fused MoE up-projection: GEMM + SwiGLU + FP8 quantize (interleaved, medians)", ""]
    lines += [f"- {line}" for line in summary(results)] + [""]
    rows = results.get("rows", [])
    if rows:
        lines += ["| model | layout | groups x rows | H, I | fused µs | TFLOPS | GEMM µs | unfused µs | vs best unfused | vs GEMM |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            unfused = ", ".join(f"{name} {us:.1f}" for name, us in r["us"].items() if name not in ("fused", "gemm"))
            lines.append(f"| {r['model']} | {r['layout']} | {r['groups']} x ~{r['expected']} | {r['hidden']}, {r['intermediate']} | "
                         f"{r['us']['fused']:.1f} | {r['fused_tflops']:.0f} | {r['us']['gemm']:.1f} | {unfused} | "
                         f"{r['speedup']:.2f} ({r['best_unfused']}) | {r['vs_gemm']:.2f} |")
        lines.append("")
    dense = results.get("bias_activation", [])
    if dense:
        lines += ["Dense GEMM + bias + GELU, fused and not (same run, interleaved, medians):", "",
                  "| GEMM | M, N, K | fused µs | TFLOPS | GEMM µs | unfused µs | vs best unfused | vs GEMM |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in dense:
            unfused = ", ".join(f"{name} {us:.1f}" for name, us in r["us"].items() if name.startswith("gemm +"))
            lines.append(f"| {r['gemm']} | {r['m']}, {r['n']}, {r['k']} | {r['us']['fused']:.1f} | {r['tflops']:.0f} | "
                         f"{r['us']['gemm']:.1f} | {unfused} | {r['speedup']:.2f} ({r['best_unfused']}) | "
                         f"{r['vs_gemm']:.2f} |")
        lines.append("")
    return "\n".join(lines)


__all__ = ["bench_bias_activation", "bench_fused", "render", "summary"]
