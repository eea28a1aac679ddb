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

**Blackwell's block-scaled kernels** (sm_100a, ``scale = "mx"``; compiled and checked only) take
DeepGEMM's SM100 forms in both layouts: packed UE8M0 scales, ``sfa`` int32 [ΣM, ⌈K/512⌉] (masked:
[G, max_m, ⌈K/512⌉]) per 1x128 of A, MN-major and TMA-aligned (per group), and ``sfb`` int32
[G, N, ⌈K/512⌉] per row of each expert, MN-major and TMA-aligned per group (or [G, ⌈N/128⌉,
⌈K/512⌉] contiguous per 128x128 block); with **FP4 experts**, ``b`` packed e2m1 [G, N, K/2]
(uint8, int8 or float4_e2m1fn_x2; rows and groups 32-byte aligned) and ``sfb`` int32 [G, N, K/128]
per 1x32. The scales are converted per call into the blocked layout those kernels read
(`mx_reference.mx_grouped_scale_operands`) and such calls are not remembered; elsewhere (Hopper)
packed scales are refused naming ``sfa``, FP4 experts naming ``b``.

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

from . import fp8_ops, split_k, stream_scratch
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_extents, check_kernel_name, check_matrix, check_not_overlapping_itself
from .errors import InputError, KernelLoadError
from .heuristics import CONTIGUOUS_OP as OP
from .kernel_choice import kernel_for, masked_rows_per_group, runnable_kernels
from .launch import launch
from .mx_reference import mx_grouped_scale_operands
from .torch_ops import TorchOp, current_stream, device_ordinal, new_bf16_group_out, new_bf16_out

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


# ---- the experts' weights and the packed UE8M0 scales (both layouts) ---------------------------
def _check_b(fail, a: torch.Tensor, b: Any, k: int) -> tuple[int, int, bool]:
    """B [G, N, K] e4m3, or packed FP4 [G, N, K/2] (two e2m1 per byte); returns (G, N, FP4)."""
    if not isinstance(b, torch.Tensor):
        raise fail("b", f"must be a torch.Tensor, got {type(b).__name__}")
    fp4 = fp8_ops.b_is_fp4(b)
    if b.device != a.device or not (fp4 or b.dtype == torch.float8_e4m3fn) or b.dim() != 3:
        raise fail("b", f"must be a float8_e4m3fn [G, N, K] (or packed FP4 [G, N, K/2]) tensor on {a.device}, "
                        f"got {b.dtype} {list(b.shape)} on {b.device}")
    g, n, kb = b.shape
    if (2 * kb if fp4 else kb) != k:
        raise fail("b", f"must have K = a's K = {k}{' / 2 bytes (FP4)' if fp4 else ''}, got shape {list(b.shape)}")
    align = fp8_ops.FP4_ALIGN_BYTES if fp4 else 16
    if b.stride(2) != 1 or (n > 1 and b.stride(1) % align) or (g > 1 and b.stride(0) % align):
        raise fail("b", f"must be contiguous along K with {align}-byte aligned row and group strides, got strides {list(b.stride())}")
    return g, n, fp4


def _check_packed_scales(fail, device: Any, sfa: Any, sfb: Any, a_rows: tuple[int, ...], g: int, n: int, k: int,
                         fp4: bool) -> None:
    """Packed UE8M0 scales (DeepGEMM's SM100 layouts), applied by the MMA: ``sfa`` int32
    [*a_rows, ⌈K/512⌉] per 1x128 of A, MN-major and TMA-aligned (per group); ``sfb`` int32
    [G, N, ⌈K/512⌉] per row of each expert (FP4 weights: [G, N, K/128], per 1x32), MN-major and
    TMA-aligned per group, or [G, ⌈N/128⌉, ⌈K/512⌉] contiguous per 128x128 block (FP8 only)."""
    words = fp8_ops.ceil_div(fp8_ops.ceil_div(k, fp8_ops.SCALE_BLOCK), fp8_ops.UE8M0_PER_WORD)
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor) or t.device != device or t.dtype != torch.int32:
            raise fail(arg, f"must be packed UE8M0 scales (torch.int32) on {device} with FP4 'b' or packed 'sfa'/'sfb', "
                            f"got {getattr(t, 'dtype', type(t).__name__)}")
    if tuple(sfa.shape) != (*a_rows, words) or not fp8_ops.is_mn_major_tma_aligned(sfa):
        raise fail("sfa", f"must be int32 {[*a_rows, words]} (packed UE8M0 per 1x128 of A), MN-major and TMA-aligned, "
                          f"got shape {list(sfa.shape)} strides {list(sfa.stride())}")
    b_words = k // fp8_ops.FP4_SCALE_VEC // fp8_ops.UE8M0_PER_WORD if fp4 else words
    if tuple(sfb.shape) == (g, n, b_words) and fp8_ops.is_mn_major_tma_aligned(sfb):
        return
    if not fp4 and tuple(sfb.shape) == (g, fp8_ops.ceil_div(n, fp8_ops.SCALE_BLOCK), words) and sfb.is_contiguous():
        return
    what = "[G, N, K/128] per 1x32 of each FP4 expert" if fp4 else "[G, N, ceil(K/512)] per row of each expert"
    raise fail("sfb", f"must be int32 {what} ({[g, n, b_words]}), MN-major and TMA-aligned per group"
                      f"{'' if fp4 else ', or [G, ceil(N/128), ceil(K/512)] contiguous per 128x128 block'}, "
                      f"got shape {list(sfb.shape)} strides {list(sfb.stride())}")


def _packed(sfa: Any, sfb: Any, b: Any) -> bool:
    """Whether a grouped call takes the block-scaled kernels: packed UE8M0 scales or FP4 weights."""
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.int32 for t in (sfa, sfb)) or fp8_ops.b_is_fp4(b)


def _scale_for_call(op: str, fail, packed: bool, b_dtype: str, device: int, forced: str) -> str:
    """The schedule scale format of the kernels a grouped call may run: "f32", or "mx" for packed
    UE8M0 scales, refused naming the argument where no such kernel runs."""
    if not packed:
        return "f32"
    if forced or runnable_kernels(op, device, "mx", b_dtype):
        return "mx"
    if b_dtype == "e2m1":
        arg, what, key = "b", "holds FP4 (e2m1) weights", "scale mx, b_dtype e2m1"
    else:
        arg, what, key = "sfa", "holds packed UE8M0 (int32) scales", "scale mx"
    raise fail(arg, f"{what}: only kernels whose tensor cores apply the scales ({key}, sm_100a) take them, "
                    "and this GPU's catalogue has none")


def _mx_operands(operands: dict, sfa, b, sfb, k: int) -> None:
    """The block-scaled kernels' operands in place of the caller's: the blocked scale bytes, and
    FP4 B counted in elements."""
    fp4 = fp8_ops.b_is_fp4(b)
    per_row = fp4 or sfb.shape[1] == b.shape[1] and not (b.shape[1] == 1 and sfb.is_contiguous())
    operands["sfa"], operands["sfb"] = mx_grouped_scale_operands(
        sfa, sfb, k, fp8_ops.FP4_SCALE_VEC if fp4 else fp8_ops.SCALE_BLOCK, per_row
    )
    if fp4:
        operands["b"] = fp8_ops.fp4_elements(b, k)


def _check_meta(a, sfa, b, sfb, m_indices, out) -> tuple[int, int, int, int]:
    """Everything checkable without data; returns (ΣM, N, K, G)."""
    check_matrix(OP, "a", a, None, torch.float8_e4m3fn, fp8_ops.FP8_ROW_ALIGN_ELEMS)
    m, k = a.shape
    g, n, fp4 = _check_b(_fail, a, b, k)
    if k % fp8_ops.SCALE_BLOCK:
        raise _fail("a", f"must have K a multiple of 128 (one scale per 128 along K), got K = {k}")
    if m % M_ALIGNMENT:
        raise _fail("a", f"must have ΣM a multiple of {M_ALIGNMENT} (each group's segment is aligned), got {m} rows")
    k_blocks, n_blocks = k // fp8_ops.SCALE_BLOCK, fp8_ops.ceil_div(n, fp8_ops.SCALE_BLOCK)
    if _packed(sfa, sfb, b):
        _check_packed_scales(_fail, a.device, sfa, sfb, (m,), g, n, k, fp4)
    else:
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
    packed = _packed(sfa, sfb, b)
    b_dtype = fp8_ops.b_dtype_of(b)
    for arg, t in (("a", a), ("sfa", None if packed else sfa), ("b", b), ("out", out)):
        check_aligned(OP, arg, t, fp8_ops.FP4_ALIGN_BYTES if arg == "b" and b_dtype == "e2m1" else 16)
    device = device_ordinal(a)
    with torch.cuda.device(device):
        scale = _scale_for_call(OP, _fail, packed, b_dtype, device, kernel)
        loaded = kernel_for(OP, m, n, k, device, kernel, scale, b_dtype=b_dtype)
        names = sorted(s.name for s in loaded.manifest.operands)
        if names != sorted(_CALL_OPERANDS):
            raise KernelLoadError(f"kernel {loaded.name}: unexpected operands {names} for {OP}")
        stream = current_stream(a)
        operands = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": out, "m_indices": m_indices}
        extents = {"ZERO_PADDING": 1 if zero_padding else 0}
        if packed:
            # Scales converted per call into the blocked layout: nothing is remembered.
            _mx_operands(operands, sfa, b, sfb, k)
            launch(loaded, operands, extents=extents, stream=stream)
            return None
        prepared = launch(loaded, operands, extents=extents, stream=stream)
    return Launched(loaded, prepared, _CALL_OPERANDS)


_calls = CallCache(OP)
_CALL_OPERANDS = ("a", "sfa", "b", "sfb", "d", "m_indices")


def _contiguous(a, sfa, b, sfb, m_indices, out, zero_padding: bool, kernel: str) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, sfa, b, sfb, m_indices) if out is None else (a, sfa, b, sfb, m_indices, out)
    call, key = _calls.find(tensors, zero_padding, kernel)
    if call is not None:
        d = out if out is not None else call.new_output()
        if call.relaunch((a, sfa, b, sfb, d, m_indices), current_stream(a)):
            return d
    m, n, _, _ = _check_meta(a, sfa, b, sfb, m_indices, out)
    if out is None:
        d = new_bf16_out(a, m, n)
        _calls.remember(key, _run(a, sfa, b, sfb, m_indices, d, zero_padding, kernel), new_output=d)
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
    check_kernel_name(OP, kernel)
    if out is None:
        return CONTIGUOUS.call(a, sfa, b, sfb, m_indices, bool(zero_padding), kernel or "")
    CONTIGUOUS_OUT.call(a, sfa, b, sfb, m_indices, out, bool(zero_padding), kernel or "")
    return out


# ---- masked layout ----------------------------------------------------------------------------
OP_MASKED = "m_grouped_fp8_gemm_nt_masked"


def _fail_masked(arg: str, what: str) -> InputError:
    return InputError(f"{OP_MASKED}: argument '{arg}' {what}")


def _check_masked(a, sfa, b, sfb, masked_m, out) -> tuple[int, int, int, int]:
    """Everything checkable without data; returns (G, max_m, N, K)."""
    if not isinstance(a, torch.Tensor):
        raise _fail_masked("a", f"must be a torch.Tensor, got {type(a).__name__}")
    if a.device.type != "cuda" or a.dtype != torch.float8_e4m3fn or a.dim() != 3:
        raise _fail_masked("a", f"must be a torch.float8_e4m3fn CUDA tensor of rank 3, got {a.dtype} {list(a.shape)} on {a.device}")
    if a.stride(2) != 1 or any(a.shape[i] > 1 and a.stride(i) % 16 for i in (0, 1)):
        raise _fail_masked("a", f"must be contiguous along K with 16-byte aligned strides, got {list(a.stride())}")
    check_extents(OP_MASKED, "a", a)
    g, max_m, k = a.shape
    gb, n, fp4 = _check_b(_fail_masked, a, b, k)
    check_extents(OP_MASKED, "b", b)
    if gb != g:
        raise _fail_masked("b", f"must be [G, N, K] with G = {g} and K = {k}, got {list(b.shape)}")
    if k % fp8_ops.SCALE_BLOCK:
        raise _fail_masked("a", f"must have K a multiple of 128, got K = {k}")
    k_blocks, n_blocks = k // fp8_ops.SCALE_BLOCK, fp8_ops.ceil_div(n, fp8_ops.SCALE_BLOCK)
    if _packed(sfa, sfb, b):
        _check_packed_scales(_fail_masked, a.device, sfa, sfb, (g, max_m), g, n, k, fp4)
    else:
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


def _run_masked(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel: str, k_splits: int) -> Any:
    """Launch; returns what `_masked_calls` remembers of it, None when nothing was launched."""
    g, max_m, k = a.shape
    n = b.shape[1]
    if g == 0 or max_m == 0 or n == 0:
        return None
    packed = _packed(sfa, sfb, b)
    b_dtype = fp8_ops.b_dtype_of(b)
    for arg, t in (("a", a), ("sfa", None if packed else sfa), ("b", b), ("out", out)):
        check_aligned(OP_MASKED, arg, t, fp8_ops.FP4_ALIGN_BYTES if arg == "b" and b_dtype == "e2m1" else 16)
    device = device_ordinal(a)
    rows = masked_rows_per_group(expected_m, max_m)
    with torch.cuda.device(device):
        scale = _scale_for_call(OP_MASKED, _fail_masked, packed, b_dtype, device, kernel)
        # Each group pads its rows to the tile height: the heuristic sees G groups of about `rows`
        # rows, at most max_m.
        loaded = kernel_for(OP_MASKED, rows * g, n, k, device, kernel, scale, rows_per_group=rows, b_dtype=b_dtype,
                            max_rows_per_group=max_m)
        stream = current_stream(a)
        operands = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": out, "masked_m": masked_m}
        if packed:
            # Scales converted per call into the blocked layout: nothing is remembered.
            _mx_operands(operands, sfa, b, sfb, k)
            launch(loaded, operands, stream=stream)
            return None
        # A kernel that splits its last wave takes the split-K workspace.
        workspace, extents = split_k.bind(
            loaded, operands, a.device, stream, rows * g, n, k, k_splits, _fail_masked, rows_per_group=rows,
            max_rows_per_group=max_m,
        )
        prepared = launch(loaded, operands, extents=extents, stream=stream)
    return Launched(loaded, prepared, _MASKED_OPERANDS, fixed=workspace)


# Calls of last-wave split kernels are remembered with their stream's split-K workspace.
_masked_calls = CallCache(OP_MASKED, stream_scratch.capturing)
_MASKED_OPERANDS = ("a", "sfa", "b", "sfb", "d", "masked_m")


def _masked(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel: str, k_splits: int) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, sfa, b, sfb, masked_m) if out is None else (a, sfa, b, sfb, masked_m, out)
    call, key = _masked_calls.find(tensors, expected_m, kernel, k_splits)
    if call is not None:
        d = out if out is not None else call.new_output()
        if call.relaunch((a, sfa, b, sfb, d, masked_m), current_stream(a)):
            return d
    g, max_m, n, _ = _check_masked(a, sfa, b, sfb, masked_m, out)
    if out is None:
        d = new_bf16_group_out(a, g, max_m, n)
        _masked_calls.remember(key, _run_masked(a, sfa, b, sfb, masked_m, expected_m, d, kernel, k_splits), new_output=d)
        return d
    check_disjoint(OP_MASKED, {"out": out}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "masked_m": masked_m})
    ran = _run_masked(a, sfa, b, sfb, masked_m, expected_m, out, kernel, k_splits)
    _masked_calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, sfa, b, sfb, out, masked_m))
    return out


def _masked_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    kernel_name: str = "", k_splits: int = 0,
) -> torch.Tensor:
    return _masked(a, sfa, b, sfb, masked_m, expected_m, None, kernel_name, k_splits)


def _masked_fake(a, sfa, b, sfb, masked_m, expected_m: int, kernel_name: str = "", k_splits: int = 0):
    g, max_m, n, _ = _check_masked(a, sfa, b, sfb, masked_m, None)
    return new_bf16_group_out(a, g, max_m, n)


def _masked_out_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    out: torch.Tensor, kernel_name: str = "", k_splits: int = 0,
) -> None:
    _masked(a, sfa, b, sfb, masked_m, expected_m, out, kernel_name, k_splits)


def _masked_out_fake(a, sfa, b, sfb, masked_m, expected_m: int, out, kernel_name: str = "", k_splits: int = 0) -> None:
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
    k_splits: int | None = None,
) -> torch.Tensor:
    """Grouped FP8 GEMM over [G, max_m, K] with per-group row counts on the GPU; see the module docstring.

    ``kernel`` forces a catalogue kernel by name. ``k_splits`` is the most ways a kernel that
    splits its last wave (epilogue ``split_k_last_wave_tma_store``) splits each of that wave's
    tiles along K (by default the heuristic's count); any other kernel takes only 1.
    """
    check_kernel_name(OP_MASKED, kernel)
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise _fail_masked("expected_m", f"must be an int (a hint for the kernel choice), got {type(expected_m).__name__}")
    if k_splits is not None and (isinstance(k_splits, bool) or not isinstance(k_splits, int) or k_splits < 1):
        raise _fail_masked("k_splits", f"must be a positive int or None, got {k_splits!r}")
    if out is None:
        return MASKED.call(a, sfa, b, sfb, masked_m, expected_m, kernel or "", k_splits or 0)
    MASKED_OUT.call(a, sfa, b, sfb, masked_m, expected_m, out, kernel or "", k_splits or 0)
    return out


__all__ = [
    "contiguous_alignment",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_indices_from_group_ends",
]
