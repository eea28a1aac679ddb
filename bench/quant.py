"""Benchmark of the FP8 and FP4 quantize kernels beside eager torch, ``torch.compile`` and a copy (GPU).

Same method as `cutegen.bench.run`: fresh random inputs (normal values times magnitudes spanning
1e-6 .. 1e4), warm-up, then each call timed alone (by its kernels' durations or by CUDA events:
`cutegen bench --timer`) with the L2 flushed before it; medians (means under `--conditions
deepgemm`). Bandwidth counts bytes read + written: input, q and scales. The copy anchor is a
device-to-device copy of half that many bytes (so it reads and writes the same total), timed the
same way, at the start and again at the end of each case; the faster median is kept (a copy timed
once per case was sometimes 10% slow: 137.6 and 138.9 µs for the grouped case in two reports,
against 123.5-124.9 µs in every other call).
Ratios within one run are what to compare.

Cases (the anchors of ``docs``/the brief): per-token 1x128 on x [24064, 7168] bf16; the grouped
transposed per-token quantize of the same x split into the MoE groups
(5120, 512, 2560, 2048, 2048, 512, 3072, 8192); per-block 128x128 of a [7168, 16384] weight; FP4
per-token 1x32 of the same weight (the FP8 x FP4 GEMMs' B, MN-major scales).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

PER_TOKEN_SHAPE = (24064, 7168)
MOE_GROUPS = (5120, 512, 2560, 2048, 2048, 512, 3072, 8192)
MOE_HIDDEN = 7168
WEIGHT_SHAPE = (7168, 16384)


def _inputs(m: int, k: int, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x *= torch.pow(10.0, torch.randint(-6, 5, (m, k), device="cuda", generator=g).float())
    return x.to(torch.bfloat16)


def _time(fn: Callable[[], object], reps: int) -> float:
    from cutegen.bench.timing import time_cuda

    return time_cuda(fn, warmup=3, reps=reps)


def _try_time(fn: Callable[[], object], reps: int) -> tuple[float | None, str]:
    """Median µs, or None and the reason when `fn` cannot run (e.g. torch.compile fails)."""
    try:
        fn()
        return _time(fn, reps), ""
    except Exception as exc:  # noqa: BLE001 - a failing anchor is reported, not fatal
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def _copy_us(nbytes: int, reps: int) -> float:
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = _time(lambda: dst.copy_(src), reps)
    del src, dst
    return us


def _retime_copy(rows: list[dict], op: str, reps: int) -> None:
    """Time the copy anchor of `op`'s case again and keep the faster of its two medians."""
    row = next(r for r in rows if r["op"] == op and r["impl"].startswith("copy"))
    us = min(row["us"], _copy_us(row["bytes"], reps))
    row.update(us=us, gbs=row["bytes"] / us / 1e3)


def _row(op: str, case: str, impl: str, us: float | None, nbytes: int, note: str = "", kernel: str = "") -> dict:
    return {
        "op": op,
        "case": case,
        "impl": impl,
        "us": us,
        "bytes": nbytes,
        "gbs": (nbytes / us / 1e3) if us else None,
        "note": note,
        "kernel": kernel,
    }


def _other_kernels(op: str, chosen: str, scale_format: str, device: int) -> list[str]:
    """The runnable bf16-input kernels of `op` taking `scale_format` scales, but the one the
    runtime chooses."""
    from cutegen.runtime import quant_ops

    return [n for n in quant_ops.quant_kernels(op, "bf16", scale_format, device) if n != chosen]


def bench_quant(reps: int = 20, compile_grouped: bool = True, every_kernel: bool = False) -> dict[str, Any]:
    """Run every quantize case; returns ``{"rows": [...], "copy_gbs": ...}`` (see `render`).

    Each op is timed beside eager torch and ``torch.compile`` of its reference; a compile that
    fails is reported with its error. ``compile_grouped=False`` skips compiling the grouped
    reference (a Python loop over the groups: the slowest to compile, and it failed in the
    anchor measurement). ``every_kernel=True`` adds a row for every other runnable kernel of each
    cutegen case, forced by name (to compare schedules in one run).
    """
    import torch

    from cutegen.runtime import quant_ops
    from cutegen.runtime import quant_reference as ref

    rows: list[dict] = []
    t0 = time.perf_counter()

    # ---- per-token FP4 1x32 (weights for the FP8 x FP4 GEMMs) ---------------------------------
    from cutegen.runtime import mx_reference as mx

    n, k = WEIGHT_SHAPE
    w = _inputs(n, k, seed=4)
    cols = ref.ceil_div(ref.ceil_div(k, quant_ops.FP4_GROUP), 4)
    nbytes = n * k * 2 + n * k // 2 + n * cols * 4
    case = f"w [{n}, {k}] bf16"
    rows.append(_row("per_token_quant_fp4", case, "copy (same bytes)", _copy_us(nbytes, reps), nbytes))
    layout = "mn-major-tma-aligned"
    q, s = quant_ops.per_token_quant_fp4(w, scale_layout=layout)
    us = _time(lambda: quant_ops.per_token_quant_fp4(w, scale_layout=layout, out=q, out_scales=s), reps)
    name = quant_ops.choose_quant_kernel(quant_ops.OP_PER_TOKEN_FP4, "bf16", "ue8m0", w.device.index or 0)
    rows.append(_row("per_token_quant_fp4", case, f"cutegen ({layout})", us, nbytes, kernel=name))
    us, note = _try_time(lambda: mx.quant_fp4_ref(w, scale_layout=layout), max(3, reps // 4))
    rows.append(_row("per_token_quant_fp4", case, "eager torch (reference)", us, nbytes, note))
    compiled = torch.compile(mx.quant_fp4_ref)
    us, note = _try_time(lambda: compiled(w, scale_layout=layout), reps)
    rows.append(_row("per_token_quant_fp4", case, "torch.compile (reference)", us, nbytes, note))
    _retime_copy(rows, "per_token_quant_fp4", reps)
    del w, q, s
    torch.cuda.empty_cache()

    # ---- per-token 1x128 ----------------------------------------------------------------------
    m, k = PER_TOKEN_SHAPE
    x = _inputs(m, k, seed=1)
    g = ref.ceil_div(k, 128)
    nbytes = m * k * 2 + m * k + m * g * 4
    case = f"x [{m}, {k}] bf16"
    rows.append(_row("per_token_quant_fp8", case, "copy (same bytes)", _copy_us(nbytes, reps), nbytes))
    for fmt, layout in (("fp32", "mn-major-tma-aligned"), ("fp32", "k-major"), ("ue8m0", "mn-major-tma-aligned")):
        q, s = quant_ops.per_token_quant_fp8(x, scale_format=fmt, scale_layout=layout)
        us = _time(lambda: quant_ops.per_token_quant_fp8(x, scale_format=fmt, scale_layout=layout, out=q, out_scales=s), reps)
        name = quant_ops.choose_quant_kernel(quant_ops.OP_PER_TOKEN, "bf16", fmt, x.device.index or 0, layout)
        rows.append(_row("per_token_quant_fp8", case, f"cutegen ({fmt}, {layout})", us, nbytes, kernel=name))
        for other in _other_kernels(quant_ops.OP_PER_TOKEN, name, fmt, x.device.index or 0) if every_kernel else ():
            us = _time(lambda: quant_ops.per_token_quant_fp8(
                x, scale_format=fmt, scale_layout=layout, out=q, out_scales=s, kernel=other), reps)
            rows.append(_row("per_token_quant_fp8", case, f"forced ({fmt}, {layout})", us, nbytes, kernel=other))
        del q, s
    us, note = _try_time(lambda: ref.per_token_quant_fp8_ref(x, scale_layout="mn-major-tma-aligned"), reps)
    rows.append(_row("per_token_quant_fp8", case, "eager torch (reference)", us, nbytes, note))
    compiled = torch.compile(ref.per_token_quant_fp8_ref)
    us, note = _try_time(lambda: compiled(x, scale_layout="mn-major-tma-aligned"), reps)
    rows.append(_row("per_token_quant_fp8", case, "torch.compile (reference)", us, nbytes, note))
    _retime_copy(rows, "per_token_quant_fp8", reps)
    del x
    torch.cuda.empty_cache()

    # ---- grouped transposed -------------------------------------------------------------------
    t_tokens, h = sum(MOE_GROUPS), MOE_HIDDEN
    x = _inputs(t_tokens, h, seed=2)
    gs = torch.tensor(MOE_GROUPS, dtype=torch.int32, device="cuda")
    exact = sum(ref.ceil_div(v, 128) for v in MOE_GROUPS)
    nbytes = t_tokens * h * 2 + 128 * h * exact + exact * h * 4
    case = f"x [{t_tokens}, {h}] bf16, {len(MOE_GROUPS)} groups"
    rows.append(_row("grouped_transposed_quant_fp8", case, "copy (same bytes)", _copy_us(nbytes, reps), nbytes))
    name = quant_ops.choose_quant_kernel(quant_ops.OP_GROUPED, "bf16", "fp32", x.device.index or 0)
    for label, num_blocks in (("exact block count", exact), ("default bound (no host sync)", None)):
        q, s = quant_ops.grouped_transposed_quant_fp8(x, gs, num_blocks=num_blocks)
        us = _time(lambda: quant_ops.grouped_transposed_quant_fp8(x, gs, out=q, out_scales=s), reps)
        moved = t_tokens * h * 2 + q.numel() + s.numel() * 4
        rows.append(_row("grouped_transposed_quant_fp8", case, f"cutegen ({label}, S={s.shape[0]})", us, moved,
                         kernel=name))
        for other in _other_kernels(quant_ops.OP_GROUPED, name, "fp32", x.device.index or 0) if every_kernel else ():
            us = _time(lambda: quant_ops.grouped_transposed_quant_fp8(x, gs, out=q, out_scales=s, kernel=other), reps)
            rows.append(_row("grouped_transposed_quant_fp8", case, f"forced ({label}, S={s.shape[0]})", us, moved,
                             kernel=other))
        del q, s
    us, note = _try_time(lambda: ref.grouped_transposed_quant_fp8_ref(x, list(MOE_GROUPS)), max(3, reps // 4))
    rows.append(_row("grouped_transposed_quant_fp8", case, "eager torch loop (reference)", us, nbytes, note))
    if compile_grouped:
        compiled = torch.compile(ref.grouped_transposed_quant_fp8_ref)
        us, note = _try_time(lambda: compiled(x, list(MOE_GROUPS)), max(3, reps // 4))
        rows.append(_row("grouped_transposed_quant_fp8", case, "torch.compile (reference)", us, nbytes, note))
    _retime_copy(rows, "grouped_transposed_quant_fp8", reps)
    del x
    torch.cuda.empty_cache()

    # ---- per-block 128x128 --------------------------------------------------------------------
    n, k = WEIGHT_SHAPE
    w = _inputs(n, k, seed=3)
    nbytes = n * k * 2 + n * k + ref.ceil_div(n, 128) * ref.ceil_div(k, 128) * 4
    case = f"w [{n}, {k}] bf16"
    rows.append(_row("per_block_quant_fp8", case, "copy (same bytes)", _copy_us(nbytes, reps), nbytes))
    q, s = quant_ops.per_block_quant_fp8(w)
    us = _time(lambda: quant_ops.per_block_quant_fp8(w, out=q, out_scales=s), reps)
    name = quant_ops.choose_quant_kernel(quant_ops.OP_PER_BLOCK, "bf16", "fp32", w.device.index or 0)
    rows.append(_row("per_block_quant_fp8", case, "cutegen", us, nbytes, kernel=name))
    for other in _other_kernels(quant_ops.OP_PER_BLOCK, name, "fp32", w.device.index or 0) if every_kernel else ():
        us = _time(lambda: quant_ops.per_block_quant_fp8(w, out=q, out_scales=s, kernel=other), reps)
        rows.append(_row("per_block_quant_fp8", case, "forced", us, nbytes, kernel=other))
    us, note = _try_time(lambda: ref.per_block_quant_fp8_ref(w), reps)
    rows.append(_row("per_block_quant_fp8", case, "eager torch (reference)", us, nbytes, note))
    compiled = torch.compile(ref.per_block_quant_fp8_ref)
    us, note = _try_time(lambda: compiled(w), reps)
    rows.append(_row("per_block_quant_fp8", case, "torch.compile (reference)", us, nbytes, note))
    _retime_copy(rows, "per_block_quant_fp8", reps)
    del w, q, s
    torch.cuda.empty_cache()

    # Ratios: against eager torch and against the copy of the same bytes, per case.
    for row in rows:
        same = [r for r in rows if r["op"] == row["op"]]
        eager = next((r["us"] for r in same if r["impl"].startswith("eager")), None)
        copy = next((r["us"] for r in same if r["impl"].startswith("copy")), None)
        row["speedup_vs_eager"] = (eager / row["us"]) if eager and row["us"] else None
        row["fraction_of_copy_bw"] = (copy / row["us"] * row["bytes"] / next(
            r["bytes"] for r in same if r["impl"].startswith("copy"))) if copy and row["us"] else None
    copy_gbs = statistics.median([r["gbs"] for r in rows if r["impl"].startswith("copy") and r["gbs"]])
    return {"rows": rows, "copy_gbs": copy_gbs, "seconds": time.perf_counter() - t0}


def render(result: dict[str, Any], env: dict | None = None) -> str:
    """Markdown table of `bench_quant`'s result."""
    head = "# FP8 quantize"
    if env:
        head += f" on {env.get('gpu', '?')} ({env.get('date', '')}; torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')})"
    lines = [
        head,
        "",
        f"Copy bandwidth in this run (read + written): {result.get('copy_gbs', 0):.0f} GB/s. "
        "GB/s = bytes read + written / time per call; 'of copy' = that bandwidth over the copy's.",
        "",
        "| op | case | implementation | µs | GB/s | vs eager | of copy | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def fmt(v: float | None, spec: str) -> str:
        return "–" if v is None else format(v, spec)

    for r in result["rows"]:
        lines.append(
            f"| {r['op']} | {r['case']} | {r['impl']} | {fmt(r['us'], '.1f')} | {fmt(r['gbs'], '.0f')} | "
            f"{fmt(r.get('speedup_vs_eager'), '.1f') + ('x' if r.get('speedup_vs_eager') else '')} | "
            f"{fmt(r.get('fraction_of_copy_bw'), '.2f')} | {r.get('note') or r.get('kernel') or ''} |"
        )
    return "\n".join(lines) + "\n"


__all__ = ["bench_quant", "render"]
