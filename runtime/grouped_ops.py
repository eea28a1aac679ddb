"""PyTorch entry points of the M-grouped (mixture-of-experts) FP8 GEMMs: contiguous and masked layouts.

``m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, m_indices, out=None, *, zero_padding=True)``
is DeepGEMM's op of the same name: for every row r of A with group g = m_indices[r] ≥ 0,
D[r] = (A[r] · sfa[r]) @ (B[g] · sfb[g])ᵀ in bf16 with fp32 promotion per 128-wide K block.

* ``a`` [ΣM, K] e4m3: every group's rows back to back, each group's segment padded to a multiple
  of `contiguous_alignment()` rows (128); ``sfa`` fp32 [ΣM, K/128], MN-major and TMA-aligned.
* ``b`` [G, N, K] e4m3 (K contiguous); ``sfb`` fp32 [G, ⌈N/128⌉, K/128], contiguous.
* ``m_indices`` int32 [ΣM] on the GPU: each row's group, -1 for padding rows. `m_indices_from_group_ends`
  builds it on the GPU from cumulative group ends, with no host synchronisation.
* Padding rows of D are written as zeros; ``zero_padding=False`` opts out: tiles made only of
  padding rows are then neither computed nor written, and padding rows inside a tile hold
  unspecified values.

What cannot be checked without a host synchronisation (and is not): that every value of
``m_indices`` is -1 or a valid group, and that each aligned 128-row block holds one group's rows
(plus trailing padding). The kernel takes a block's group from its first row. A value outside
[0, G) (G + 5, -7, 2³¹ - 1) marks its row as padding, like -1: B and SFB are never read for it
and its row of D is written as zeros (a block whose first row names no group is a padding block).

``m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, masked_m, expected_m, out=None)`` is DeepGEMM's
decode layout: ``a`` [G, max_m, K] e4m3, ``sfa`` fp32 [G, max_m, K/128] (each group MN-major and
TMA-aligned, groups back to back: `to_mn_major_tma_aligned` converts), ``b``/``sfb`` as above,
``masked_m`` int32 [G] on the GPU: rows [0, masked_m[g]) of group g are real. Only their tiles are
scheduled (on the GPU); groups with 0 rows cost nothing; rows of D at or past masked_m[g] are
unspecified within the group's last tile and untouched beyond it. ``expected_m`` only guides the
kernel choice. Nothing reads ``masked_m`` on the host, so the call is CUDA-graph capturable and a
captured graph replays correctly with new ``masked_m`` values. Not checked (device data): that
0 <= masked_m[g] <= max_m; the kernel takes a count into that range (past max_m: the max_m rows
there are; negative: none, group g of D untouched).
"""

from __future__ import annotations

from typing import Any

import torch

from . import fp8_ops
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_extents, check_matrix, check_not_overlapping_itself
from .errors import InputError, KernelLoadError
from .heuristics import CONTIGUOUS_OP as OP
from .kernel_choice import kernel_for
from .launch import launch
from .torch_ops import TorchOp, current_stream, device_ordinal, new_bf16_out

# Rows per M block of the grouped kernels: every group's segment must start at a multiple of it.
M_ALIGNMENT = 128


def contiguous_alignment() -> int:
    """The row alignment of each group's segment in the contiguous layout (DeepGEMM's M block)."""
    return M_ALIGNMENT


def m_indices_from_group_ends(group_ends: torch.Tensor, num_rows: int) -> torch.Tensor:
    """m_indices [num_rows] int32 from int32 [G] cumulative group ends, computed on the GPU.

    Group g's real rows are [start_g, group_ends[g]) where start_g is the previous group's end
    rounded up to `contiguous_alignment()` (0 for g = 0); rows between a group's end and the next
    start, and past the last, are padding (-1). No host synchronisation: capturable in a CUDA graph.
    """
    if not isinstance(group_ends, torch.Tensor) or group_ends.dim() != 1:
        raise InputError(f"{OP}: argument 'group_ends' must be a 1-D int32 tensor [G], got {group_ends!r:.60}")
    if group_ends.dtype != torch.int32:
        raise InputError(f"{OP}: argument 'group_ends' must be torch.int32, got {group_ends.dtype}")
    if group_ends.numel() == 0:
        return torch.full((num_rows,), -1, dtype=torch.int32, device=group_ends.device)
    ends = group_ends.long()
    aligned = (ends + M_ALIGNMENT - 1) // M_ALIGNMENT * M_ALIGNMENT
    starts = torch.cat([torch.zeros(1, dtype=torch.long, device=ends.device), aligned[:-1]])
    rows = torch.arange(num_rows, device=ends.device)
    group = torch.searchsorted(starts, rows, right=True) - 1
    valid = (group >= 0) & (rows < ends[group.clamp(min=0)])
    return torch.where(valid, group, torch.full_like(group, -1)).to(torch.int32)


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP}: argument '{arg}' {what}")


def _check_meta(a, sfa, b, sfb, m_indices, out) -> tuple[int, int, int, int]:
    """Everything checkable without data; returns (ΣM, N, K, G)."""
    check_matrix(OP, "a", a, None, torch.float8_e4m3fn, fp8_ops.FP8_ROW_ALIGN_ELEMS)
    m, k = a.shape
    if not isinstance(b, torch.Tensor):
        raise _fail("b", f"must be a torch.Tensor, got {type(b).__name__}")
    if b.device != a.device or b.dtype != torch.float8_e4m3fn or b.dim() != 3:
        raise _fail("b", f"must be a float8_e4m3fn [G, N, K] tensor on {a.device}, got {b.dtype} {list(b.shape)} on {b.device}")
    g, n, kb = b.shape
    if kb != k:
        raise _fail("b", f"must have K = a.shape[1] = {k}, got shape {list(b.shape)}")
    if b.stride(2) != 1 or (n > 1 and b.stride(1) % 16) or (g > 1 and b.stride(0) % 16):
        raise _fail("b", f"must be contiguous along K with 16-byte aligned row and group strides, got strides {list(b.stride())}")
    if k % fp8_ops.SCALE_BLOCK:
        raise _fail("a", f"must have K a multiple of 128 (one scale per 128 along K), got K = {k}")
    if m % M_ALIGNMENT:
        raise _fail("a", f"must have ΣM a multiple of {M_ALIGNMENT} (each group's segment is aligned), got {m} rows")
    k_blocks, n_blocks = k // fp8_ops.SCALE_BLOCK, fp8_ops.ceil_div(n, fp8_ops.SCALE_BLOCK)
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor) or t.device != a.device or t.dtype != torch.float32:
            raise _fail(arg, f"must be a torch.float32 tensor on {a.device}, got {getattr(t, 'dtype', type(t).__name__)}")
    if tuple(sfa.shape) != (m, k_blocks) or not fp8_ops.is_mn_major_tma_aligned(sfa):
        raise _fail(
            "sfa",
            f"must be [ΣM, K/128] = [{m}, {k_blocks}] with strides (1, {fp8_ops.tma_aligned_rows(m)}) "
            f"(MN-major, TMA-aligned; see to_mn_major_tma_aligned), got shape {list(sfa.shape)} strides {list(sfa.stride())}",
        )
    if tuple(sfb.shape) != (g, n_blocks, k_blocks) or not sfb.is_contiguous():
        raise _fail("sfb", f"must be a contiguous [G, ceil(N/128), K/128] = [{g}, {n_blocks}, {k_blocks}] tensor, got {list(sfb.shape)}")
    if not isinstance(m_indices, torch.Tensor) or m_indices.device != a.device:
        raise _fail("m_indices", f"must be a tensor on {a.device}")
    if m_indices.dtype != torch.int32 or tuple(m_indices.shape) != (m,) or (m > 1 and m_indices.stride(0) != 1):
        raise _fail("m_indices", f"must be a contiguous int32 [ΣM] = [{m}] tensor, got {m_indices.dtype} {list(m_indices.shape)}")
    if out is not None:
        check_matrix(OP, "out", out, a.device, torch.bfloat16, fp8_ops.OUT_ROW_ALIGN_ELEMS)
        if tuple(out.shape) != (m, n):
            raise _fail("out", f"must have shape [ΣM, N] = [{m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP, "out", out)
    return m, n, k, g


def _run(a, sfa, b, sfb, m_indices, out, zero_padding: bool, kernel: str) -> Any:
    """Launch; returns what `_calls` remembers of it, None when nothing was launched."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or b.shape[0] == 0:
        if out.numel() and zero_padding:
            out.zero_()
        return None
    for arg, t in (("a", a), ("sfa", sfa), ("b", b), ("out", out)):
        check_aligned(OP, arg, t)
    device = device_ordinal(a)
    with torch.cuda.device(device):
        loaded = kernel_for(OP, m, n, k, device, kernel)
        names = sorted(s.name for s in loaded.manifest.operands)
        if names != sorted(_CALL_OPERANDS):
            raise KernelLoadError(f"kernel {loaded.name}: unexpected operands {names} for {OP}")
        stream = current_stream(a)
        prepared = launch(
            loaded,
            {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": out, "m_indices": m_indices},
            extents={"ZERO_PADDING": 1 if zero_padding else 0},
            stream=stream,
        )
    return Launched(loaded, prepared, _CALL_OPERANDS)


_calls = CallCache(OP)
_CALL_OPERANDS = ("a", "sfa", "b", "sfb", "d", "m_indices")


def _contiguous(a, sfa, b, sfb, m_indices, out, zero_padding: bool, kernel: str) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, sfa, b, sfb, m_indices) if out is None else (a, sfa, b, sfb, m_indices, out)
    key = _calls.key(tensors, zero_padding, kernel)
    call = _calls.get(key)
    if call is not None:
        d = out if out is not None else new_bf16_out(a, a.shape[0], b.shape[1])
        if _calls.launch(call, (a, sfa, b, sfb, d, m_indices), current_stream(a)):
            return d
    m, n, _, _ = _check_meta(a, sfa, b, sfb, m_indices, out)
    if out is None:
        d = new_bf16_out(a, m, n)
        _calls.remember(key, _run(a, sfa, b, sfb, m_indices, d, zero_padding, kernel))
        return d
    check_disjoint(OP, {"out": out}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "m_indices": m_indices})
    ran = _run(a, sfa, b, sfb, m_indices, out, zero_padding, kernel)
    _calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, sfa, b, sfb, out, m_indices))
    return out


def _impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor,
    zero_padding: bool = True, kernel_name: str = "",
) -> torch.Tensor:
    return _contiguous(a, sfa, b, sfb, m_indices, None, zero_padding, kernel_name)


def _fake(a, sfa, b, sfb, m_indices, zero_padding: bool = True, kernel_name: str = ""):
    m, n, _, _ = _check_meta(a, sfa, b, sfb, m_indices, None)
    return new_bf16_out(a, m, n)


def _out_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor, out: torch.Tensor,
    zero_padding: bool = True, kernel_name: str = "",
) -> None:
    _contiguous(a, sfa, b, sfb, m_indices, out, zero_padding, kernel_name)


def _out_fake(a, sfa, b, sfb, m_indices, out, zero_padding: bool = True, kernel_name: str = "") -> None:
    _check_meta(a, sfa, b, sfb, m_indices, out)


CONTIGUOUS = TorchOp(OP, _impl, _fake)
CONTIGUOUS_OUT = TorchOp(f"{OP}_out", _out_impl, _out_fake, mutates=("out",))


def m_grouped_fp8_gemm_nt_contiguous(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    m_indices: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    zero_padding: bool = True,
    kernel: str | None = None,
) -> torch.Tensor:
    """Grouped FP8 GEMM over contiguous expert segments; see the module docstring."""
    if kernel is not None and not isinstance(kernel, str):
        raise _fail("kernel", f"must be a kernel name (str) or None, got {type(kernel).__name__}")
    if out is None:
        return CONTIGUOUS(a, sfa, b, sfb, m_indices, bool(zero_padding), kernel or "")
    CONTIGUOUS_OUT(a, sfa, b, sfb, m_indices, out, bool(zero_padding), kernel or "")
    return out


# ---- masked layout ----------------------------------------------------------------------------
OP_MASKED = "m_grouped_fp8_gemm_nt_masked"


def _fail_masked(arg: str, what: str) -> InputError:
    return InputError(f"{OP_MASKED}: argument '{arg}' {what}")


def _check_masked(a, sfa, b, sfb, masked_m, out) -> tuple[int, int, int, int]:
    """Everything checkable without data; returns (G, max_m, N, K)."""
    for arg, t, rank, dtype in (("a", a, 3, torch.float8_e4m3fn), ("b", b, 3, torch.float8_e4m3fn)):
        if not isinstance(t, torch.Tensor):
            raise _fail_masked(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda" or t.dtype != dtype or t.dim() != rank:
            raise _fail_masked(arg, f"must be a {dtype} CUDA tensor of rank {rank}, got {t.dtype} {list(t.shape)} on {t.device}")
        if t.stride(2) != 1 or any(t.shape[i] > 1 and t.stride(i) % 16 for i in (0, 1)):
            raise _fail_masked(arg, f"must be contiguous along K with 16-byte aligned strides, got {list(t.stride())}")
        check_extents(OP_MASKED, arg, t)
    g, max_m, k = a.shape
    gb, n, kb = b.shape
    if b.device != a.device:
        raise _fail_masked("b", f"must be on {a.device}, got {b.device}")
    if gb != g or kb != k:
        raise _fail_masked("b", f"must be [G, N, K] with G = {g} and K = {k}, got {list(b.shape)}")
    if k % fp8_ops.SCALE_BLOCK:
        raise _fail_masked("a", f"must have K a multiple of 128, got K = {k}")
    k_blocks, n_blocks = k // fp8_ops.SCALE_BLOCK, fp8_ops.ceil_div(n, fp8_ops.SCALE_BLOCK)
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor) or t.device != a.device or t.dtype != torch.float32:
            raise _fail_masked(arg, f"must be a torch.float32 tensor on {a.device}")
    if tuple(sfa.shape) != (g, max_m, k_blocks) or not fp8_ops.is_mn_major_tma_aligned(sfa):
        raise _fail_masked(
            "sfa",
            f"must be [G, max_m, K/128] = [{g}, {max_m}, {k_blocks}], each group MN-major and TMA-aligned "
            f"(see to_mn_major_tma_aligned), got shape {list(sfa.shape)} strides {list(sfa.stride())}",
        )
    if tuple(sfb.shape) != (g, n_blocks, k_blocks) or not sfb.is_contiguous():
        raise _fail_masked("sfb", f"must be a contiguous [G, ceil(N/128), K/128] = [{g}, {n_blocks}, {k_blocks}] tensor, got {list(sfb.shape)}")
    if not isinstance(masked_m, torch.Tensor) or masked_m.device != a.device or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (g,):
        raise _fail_masked("masked_m", f"must be an int32 [G] = [{g}] tensor on {a.device}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.device != a.device or out.dtype != torch.bfloat16:
            raise _fail_masked("out", f"must be a bf16 tensor on {a.device}")
        if tuple(out.shape) != (g, max_m, n) or out.stride(2) != 1 or (max_m > 1 and out.stride(1) % 8) or (g > 1 and out.stride(0) % 8):
            raise _fail_masked("out", f"must be [G, max_m, N] = [{g}, {max_m}, {n}], contiguous along N with 16-byte aligned strides")
        check_not_overlapping_itself(OP_MASKED, "out", out)
    return g, max_m, n, k


def _new_masked_out(a, g, max_m, n):
    row = (n + 7) // 8 * 8
    return torch.empty_strided((g, max_m, n), (max_m * row, row, 1), dtype=torch.bfloat16, device=a.device)


def _run_masked(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel: str) -> Any:
    """Launch; returns what `_masked_calls` remembers of it, None when nothing was launched."""
    g, max_m, k = a.shape
    n = b.shape[1]
    if g == 0 or max_m == 0 or n == 0:
        return None
    for arg, t in (("a", a), ("sfa", sfa), ("b", b), ("out", out)):
        check_aligned(OP_MASKED, arg, t)
    device = device_ordinal(a)
    rows = max(1, min(int(expected_m), max_m))
    with torch.cuda.device(device):
        # Each group pads its rows to the tile height: the heuristic sees G groups of `rows`.
        loaded = kernel_for(OP_MASKED, rows * g, n, k, device, kernel, rows_per_group=rows)
        stream = current_stream(a)
        prepared = launch(loaded, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": out, "masked_m": masked_m}, stream=stream)
    return Launched(loaded, prepared, _MASKED_OPERANDS)


_masked_calls = CallCache(OP_MASKED)
_MASKED_OPERANDS = ("a", "sfa", "b", "sfb", "d", "masked_m")


def _masked(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel: str) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, sfa, b, sfb, masked_m) if out is None else (a, sfa, b, sfb, masked_m, out)
    key = _masked_calls.key(tensors, expected_m, kernel)
    call = _masked_calls.get(key)
    if call is not None:
        d = out if out is not None else _new_masked_out(a, a.shape[0], a.shape[1], b.shape[1])
        if _masked_calls.launch(call, (a, sfa, b, sfb, d, masked_m), current_stream(a)):
            return d
    g, max_m, n, _ = _check_masked(a, sfa, b, sfb, masked_m, out)
    if out is None:
        d = _new_masked_out(a, g, max_m, n)
        _masked_calls.remember(key, _run_masked(a, sfa, b, sfb, masked_m, expected_m, d, kernel))
        return d
    check_disjoint(OP_MASKED, {"out": out}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "masked_m": masked_m})
    ran = _run_masked(a, sfa, b, sfb, masked_m, expected_m, out, kernel)
    _masked_calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, sfa, b, sfb, out, masked_m))
    return out


def _masked_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    kernel_name: str = "",
) -> torch.Tensor:
    return _masked(a, sfa, b, sfb, masked_m, expected_m, None, kernel_name)


def _masked_fake(a, sfa, b, sfb, masked_m, expected_m: int, kernel_name: str = ""):
    g, max_m, n, _ = _check_masked(a, sfa, b, sfb, masked_m, None)
    return _new_masked_out(a, g, max_m, n)


def _masked_out_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    out: torch.Tensor, kernel_name: str = "",
) -> None:
    _masked(a, sfa, b, sfb, masked_m, expected_m, out, kernel_name)


def _masked_out_fake(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel_name: str = "") -> None:
    _check_masked(a, sfa, b, sfb, masked_m, out)


MASKED = TorchOp(OP_MASKED, _masked_impl, _masked_fake)
MASKED_OUT = TorchOp(f"{OP_MASKED}_out", _masked_out_impl, _masked_out_fake, mutates=("out",))


def m_grouped_fp8_gemm_nt_masked(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    out: torch.Tensor | None = None,
    *,
    kernel: str | None = None,
) -> torch.Tensor:
    """Grouped FP8 GEMM over [G, max_m, K] with per-group row counts on the GPU; see the module docstring."""
    if kernel is not None and not isinstance(kernel, str):
        raise _fail_masked("kernel", f"must be a kernel name (str) or None, got {type(kernel).__name__}")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise _fail_masked("expected_m", f"must be an int (a hint for the kernel choice), got {type(expected_m).__name__}")
    if out is None:
        return MASKED(a, sfa, b, sfb, masked_m, expected_m, kernel or "")
    MASKED_OUT(a, sfa, b, sfb, masked_m, expected_m, out, kernel or "")
    return out


__all__ = [
    "contiguous_alignment",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_indices_from_group_ends",
]
