"""PyTorch entry point of the FP8 GEMM with DeepSeek-V3 block scales (``torch.ops.cutegen.fp8_gemm_nt``).

``fp8_gemm_nt(a, sfa, b, sfb, out=None, *, kernel=None)`` computes, DeepGEMM-compatibly,
D[M, N] (bf16) = Σ_kb (A[:, kb] · sfa[:, kb]) · (B[:, kb] · sfb[n/128, kb])ᵀ with fp32 promotion
after every 128-wide K block:

* ``a`` [M, K], ``b`` [N, K]: ``torch.float8_e4m3fn`` CUDA tensors, K-major (``stride(1) == 1``),
  K a multiple of 16, row strides multiples of 16 elements (16 bytes), 16-byte aligned bases. K
  need not be a multiple of 128: the last scale block then covers the remaining K % 128 columns
  (what ``per_token_quant_fp8`` and ``per_block_quant_fp8`` write for such K), and the kernel's
  last K block reads zeros past K.
* ``sfa``: fp32 [M, ⌈K/128⌉] per 1x128 block of A, **MN-major and TMA-aligned**: strides
  (1, align(M, 4)) — the layout DeepGEMM users produce. `to_mn_major_tma_aligned` converts a
  row-major SFA into it (and returns it unchanged when it already is).
* ``sfb``: fp32 [⌈N/128⌉, ⌈K/128⌉] per 128x128 block of B, row-major contiguous.
* UE8M0 scales instead (sm_100a kernels only): ``sfa`` int32 [M, ⌈K/512⌉] and ``sfb`` int32
  [⌈N/128⌉, ⌈K/512⌉], power-of-two scales packed as four exponent bytes per word along K (byte j
  of word w is K block 4w + j), in the same layouts: ``sfa`` MN-major and TMA-aligned (what
  ``per_token_quant_fp8(x, scale_format="ue8m0", scale_layout="mn-major-tma-aligned")`` writes),
  ``sfb`` row-major (``pack_ue8m0(scales, "k-major")`` of power-of-two per-block scales, e.g. from
  ``per_block_quant_fp8_ref(w, scale_format="ue8m0")``). ``sfb`` may also be **per row**, as
  DeepGEMM's SM100 kernels take it: int32 [N, ⌈K/512⌉], MN-major and TMA-aligned (what
  ``deep_gemm.transform_sf_into_required_layout`` makes on Blackwell); only the block-scaled
  kernels read that form (`sfb_per_row`). On a GPU without such kernels (Hopper) int32 scales are
  refused with a message saying so. Where the catalogue has kernels whose tensor cores apply the
  scales (``scale = "mx"``, Blackwell's block-scaled MMA), they run, and the scales are converted
  per call into the blocked layout those kernels read (`mx_reference.mx_scale_operands`).
* **FP4 weights** (FP8 x FP4, DeepGEMM's ``recipe_a=(1, 128), recipe_b=(1, 32)``): ``b`` packed
  e2m1, two per byte with element 2i in the low nibble (torch.uint8, int8 or float4_e2m1fn_x2
  [N, K/2]), K a multiple of 128, rows 32-byte aligned; ``sfa`` packed UE8M0 [M, ⌈K/512⌉] as above
  and ``sfb`` packed UE8M0 [N, K/128] per 1x32 of B (four per int32 word), both MN-major and
  TMA-aligned. Only the block-scaled kernels with FP4 B (sm_100a, ``b_dtype = "e2m1"``) read
  them; elsewhere FP4 ``b`` is refused naming it. The scales are converted per call, as above.
* ``out`` (optional): bf16 [M, N], ``stride(1) == 1``, row stride a multiple of 8, 16-byte aligned.
* M == 0 or N == 0: nothing is launched; K == 0: the result is zero-filled.

Bad inputs raise `InputError` naming the argument before anything is launched. What cannot be
checked without reading device memory: that the scales are finite and positive.
"""

from __future__ import annotations

from typing import Any

import torch

from . import split_k, stream_scratch
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_kernel_name, check_matrix, check_not_overlapping_itself
from .errors import InputError
from .kernel_choice import catalogue, kernel_for, runnable_kernels
from .launch import launch
from .mx_reference import mx_scale_operands
from .params import SCALE_BLOCK, OperandInfo, align, ceil_div
# One definition of DeepGEMM's SFA layout, shared with the quantize ops that produce it.
from .quant_reference import is_mn_major_tma_aligned, to_mn_major_tma_aligned
from .torch_ops import TorchOp, current_stream, device_ordinal, new_bf16_out, nothing_to_launch

OP_FP8_GEMM_NT = "fp8_gemm_nt"
FP8_ROW_ALIGN_ELEMS = 16  # 16 bytes of e4m3
OUT_ROW_ALIGN_ELEMS = 8  # 16 bytes of bf16
SFA_COLUMN_ALIGN = 4  # 16 bytes of fp32: TMA's stride rule
PTR_ALIGN_BYTES = 16
# Scale dtypes: fp32 scales, or UE8M0 exponents packed four per int32 word along K.
SCALE_DTYPES = (torch.float32, torch.int32)
UE8M0_PER_WORD = 4
# FP4 (e2m1) weights as torch holds them: two per byte, element 2i in the low nibble.
FP4_DTYPES = tuple(d for d in (torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
# Their TMA type (16U4_ALIGN16B) loads rows of whole 128 elements from 32-byte aligned rows.
FP4_K_MULTIPLE = 128
FP4_ALIGN_BYTES = 32
# FP4 weights carry one UE8M0 scale per 32 of their elements along K (DeepGEMM's recipe_b (1, 32)).
FP4_SCALE_VEC = 32


def b_is_fp4(b: Any) -> bool:
    """Whether ``b`` holds packed FP4 weights (a byte dtype: two e2m1 elements per byte)."""
    return isinstance(b, torch.Tensor) and b.dtype in FP4_DTYPES


def fp4_elements(t: torch.Tensor, k: int) -> OperandInfo:
    """Packed FP4 ``t`` ([..., K/2] bytes) as the kernels address it: in elements, K per row, each
    outer stride twice its bytes."""
    return OperandInfo(t.data_ptr(), (*t.shape[:-1], k), (*(2 * s for s in t.stride()[:-1]), 1), "e2m1")


def scale_format(sfa: torch.Tensor) -> str:
    """The schedule scale format of a scale tensor: "ue8m0" for packed int32 words, else "f32"."""
    return "ue8m0" if sfa.dtype == torch.int32 else "f32"


def sfb_per_row(sfb: torch.Tensor, n: int) -> bool:
    """Whether packed UE8M0 ``sfb`` holds a scale for every row of B (DeepGEMM's SM100 layout,
    [N, ⌈K/512⌉]) rather than one per 128-row block ([⌈N/128⌉, ⌈K/512⌉], row-major). The shapes
    differ unless N = 1, where a row-major [1, ⌈K/512⌉] is the per-block form (the same scales)."""
    if sfb.dtype != torch.int32 or sfb.dim() != 2 or sfb.shape[0] != n:
        return False
    return n != ceil_div(n, SCALE_BLOCK) or not sfb.is_contiguous()


def b_dtype_of(b: torch.Tensor) -> str:
    """The schedule's B element type of the kernels that take ``b``: "e2m1" (FP4) or "e4m3"."""
    return "e2m1" if b_is_fp4(b) else "e4m3"


def _kernel_scale(sfa: torch.Tensor, device: int, forced: str, b_dtype: str = "e4m3") -> str:
    """The schedule scale format of the kernels a call may run: that of its scales (`scale_format`);
    for UE8M0 scales, "mx" (the tensor cores apply them) where the catalogue has such kernels with
    ``b_dtype`` B for this GPU or the caller forced one, else "ue8m0" (promotion)."""
    scale = scale_format(sfa)
    if scale != "ue8m0":
        return scale
    if forced:
        cat = catalogue()
        return "mx" if forced in cat and cat.manifest(forced).schedule.get("scale") == "mx" else scale
    return "mx" if runnable_kernels(OP_FP8_GEMM_NT, device, "mx", b_dtype) else scale


def _call_scale(sfa: torch.Tensor, per_row_sfb: bool, device: int, forced: str, b_dtype: str = "e4m3") -> str:
    """`_kernel_scale`, refusing FP4 weights or a per-row ``sfb`` where no kernel that reads them
    would run."""
    scale = _kernel_scale(sfa, device, forced, b_dtype)
    if scale == "mx":
        return scale
    reader = f"kernel {forced} does not" if forced else "this GPU's catalogue has none"
    if b_dtype == "e2m1":
        raise _fail(
            "b", "holds FP4 (e2m1) weights: only kernels whose tensor cores apply the scales with FP4 B "
            f"(scale mx, b_dtype e2m1, sm_100a) read them, and {reader}",
        )
    if per_row_sfb:
        raise _fail(
            "sfb",
            "is per row (DeepGEMM's SM100 layout [N, ceil(K/512)]): only kernels whose tensor cores apply "
            f"the scales (scale mx, sm_100a) read it, and {reader}; pass per-block scales "
            "[ceil(N/128), ceil(K/512)] (row-major) instead",
        )
    return scale


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP_FP8_GEMM_NT}: argument '{arg}' {what}")


def tma_aligned_rows(m: int) -> int:
    """The column stride of an MN-major TMA-aligned scale tensor with m rows: align(m, 4)."""
    return align(m, SFA_COLUMN_ALIGN)


def _check_operand(arg: str, t: Any, device: Any | None, dtype: torch.dtype, row_align: int) -> None:
    check_matrix(OP_FP8_GEMM_NT, arg, t, device, dtype, row_align)


def _check_meta(a: Any, sfa: Any, b: Any, sfb: Any, out: Any | None) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
    for arg, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    _check_operand("a", a, None, torch.float8_e4m3fn, FP8_ROW_ALIGN_ELEMS)
    if b_is_fp4(b):
        return _check_fp4_meta(a, sfa, b, sfb, out)
    _check_operand("b", b, a.device, torch.float8_e4m3fn, FP8_ROW_ALIGN_ELEMS)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise _fail("b", f"must have K = a.shape[1] = {k} columns, got shape {list(b.shape)}")
    if k % FP8_ROW_ALIGN_ELEMS:
        raise _fail("a", f"must have K a multiple of {FP8_ROW_ALIGN_ELEMS} (16-byte rows for TMA), got K = {k}")
    k_blocks, n_blocks = ceil_div(k, SCALE_BLOCK), ceil_div(n, SCALE_BLOCK)
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device != a.device:
            raise _fail(arg, f"must be on {a.device} (the device of 'a'), got {t.device}")
        if t.dtype not in SCALE_DTYPES:
            raise _fail(
                arg, f"must be torch.float32 (fp32 scales) or torch.int32 (packed UE8M0 scales), got {t.dtype}"
            )
    if sfb.dtype != sfa.dtype:
        raise _fail("sfb", f"must have the dtype of 'sfa' ({sfa.dtype}: one scale format for both), got {sfb.dtype}")
    if sfa.dtype == torch.int32:  # UE8M0: four K blocks per int32 word
        k_blocks, what = ceil_div(k_blocks, UE8M0_PER_WORD), "ceil(K/512)"
    else:
        what = "ceil(K/128)"
    if tuple(sfa.shape) != (m, k_blocks):
        raise _fail("sfa", f"must have shape [M, {what}] = [{m}, {k_blocks}], got {list(sfa.shape)}")
    if not is_mn_major_tma_aligned(sfa):
        raise _fail(
            "sfa",
            f"must be MN-major and TMA-aligned: strides (1, {tma_aligned_rows(m)}) for M = {m}, got "
            f"{list(sfa.stride())}; convert with cutegen.runtime.to_mn_major_tma_aligned(sfa)",
        )
    if sfb_per_row(sfb, n):
        if not is_mn_major_tma_aligned(sfb):
            raise _fail(
                "sfb",
                f"is per row ([N, ceil(K/512)], DeepGEMM's SM100 layout) and must then be MN-major and "
                f"TMA-aligned: strides (1, {tma_aligned_rows(n)}) for N = {n}, got {list(sfb.stride())}; "
                "convert with cutegen.runtime.to_mn_major_tma_aligned(sfb)",
            )
        if tuple(sfb.shape) != (n, k_blocks):
            raise _fail("sfb", f"must have shape [N, ceil(K/512)] = [{n}, {k_blocks}] per row, got {list(sfb.shape)}")
    else:
        if tuple(sfb.shape) != (n_blocks, k_blocks):
            per_row = f" (or, packed UE8M0, [N, {what}] = [{n}, {k_blocks}] per row)" if sfb.dtype == torch.int32 else ""
            raise _fail(
                "sfb", f"must have shape [ceil(N/128), {what}] = [{n_blocks}, {k_blocks}]{per_row}, got {list(sfb.shape)}"
            )
        if not sfb.is_contiguous():
            raise _fail("sfb", f"must be row-major contiguous, got strides {list(sfb.stride())}")
    _check_out(a, out, m, n)
    return m, n, k


def _check_out(a: torch.Tensor, out: Any | None, m: int, n: int) -> None:
    if out is not None:
        _check_operand("out", out, a.device, torch.bfloat16, OUT_ROW_ALIGN_ELEMS)
        if tuple(out.shape) != (m, n):
            raise _fail("out", f"must have shape [M, N] = [{m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP_FP8_GEMM_NT, "out", out)


def _check_fp4_meta(a: torch.Tensor, sfa: Any, b: torch.Tensor, sfb: Any, out: Any | None) -> tuple[int, int, int]:
    """FP8 x FP4 (`b` packed e2m1 [N, K/2]): ``sfa`` packed UE8M0 [M, ⌈K/512⌉] per 1x128 of A,
    ``sfb`` packed UE8M0 [N, K/128] per 1x32 of B (four per int32 word), both MN-major and
    TMA-aligned (DeepGEMM's SM100 layouts); returns (M, N, K)."""
    check_matrix(OP_FP8_GEMM_NT, "b", b, a.device, b.dtype, FP4_ALIGN_BYTES)
    m, k = a.shape
    n, k_bytes = b.shape
    if 2 * k_bytes != k:
        raise _fail("b", f"holds FP4 (two e2m1 per byte) and must have K/2 = {k / 2:g} bytes per row, got shape {list(b.shape)}")
    if k % FP4_K_MULTIPLE:
        raise _fail("a", f"must have K a multiple of {FP4_K_MULTIPLE} with FP4 'b' (whole TMA rows of FP4), got K = {k}")
    words = {"sfa": (m, ceil_div(ceil_div(k, SCALE_BLOCK), UE8M0_PER_WORD), "[M, ceil(K/512)]: one per 1x128 of A"),
             "sfb": (n, ceil_div(k // FP4_SCALE_VEC, UE8M0_PER_WORD), "[N, K/128]: one per 1x32 of B")}
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        rows, cols, what = words[arg]
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device != a.device:
            raise _fail(arg, f"must be on {a.device} (the device of 'a'), got {t.device}")
        if t.dtype != torch.int32:
            raise _fail(arg, f"must be packed UE8M0 scales (torch.int32) with FP4 'b', got {t.dtype}")
        if tuple(t.shape) != (rows, cols):
            raise _fail(arg, f"must have shape {what} = [{rows}, {cols}], got {list(t.shape)}")
        if not is_mn_major_tma_aligned(t):
            raise _fail(
                arg,
                f"must be MN-major and TMA-aligned: strides (1, {tma_aligned_rows(rows)}), got {list(t.stride())}; "
                f"convert with cutegen.runtime.to_mn_major_tma_aligned({arg})",
            )
    _check_out(a, out, m, n)
    return m, n, k


def _check_pointers(op: str = OP_FP8_GEMM_NT, sfb_align: int = 4, **tensors: torch.Tensor | None) -> None:
    """Base alignment: 16 bytes (TMA) for every operand but SFB, which fp8_gemm_nt reads with
    plain loads (4 bytes) and the weight-gradient GEMM loads by TMA (16), and FP4 B (32: its TMA
    type's rule)."""
    for arg, t in tensors.items():
        align = sfb_align if arg == "sfb" else FP4_ALIGN_BYTES if arg == "b" and b_is_fp4(t) else PTR_ALIGN_BYTES
        check_aligned(op, arg, t, align)




# Split-K launches are remembered with their stream's workspace.
_calls = CallCache(OP_FP8_GEMM_NT, stream_scratch.capturing)


def _run(a, sfa, b, sfb, out, kernel: str, k_splits: int) -> Any:
    """Launch; returns what `_calls` remembers of it, None when nothing was launched."""
    m, k = a.shape
    n = b.shape[0]
    if nothing_to_launch(out, m, n, k):
        return None
    device = device_ordinal(a)
    with torch.cuda.device(device):
        b_dtype = b_dtype_of(b)
        per_row = b_dtype == "e2m1" or sfb_per_row(sfb, n)
        loaded = kernel_for(
            OP_FP8_GEMM_NT, m, n, k, device, kernel, _call_scale(sfa, per_row, device, kernel, b_dtype), b_dtype=b_dtype
        )
        stream = current_stream(a)
        operands = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": out}
        workspace, extents = split_k.bind(loaded, operands, a.device, stream, m, n, k, k_splits, _fail)
        if loaded.manifest.fact("mma_applies_scales"):
            # The block-scaled MMA reads its scales in the blocked layout, made per call from the
            # caller's: nothing is remembered, so every call converts its own scales.
            operands["sfa"], operands["sfb"] = mx_scale_operands(
                sfa, sfb, m, n, k, sfb_per_row=per_row, sfb_granularity=FP4_SCALE_VEC if b_dtype == "e2m1" else SCALE_BLOCK
            )
            if b_dtype == "e2m1":  # the kernel counts FP4 elements: [N, K] with rows of 2x the bytes
                operands["b"] = fp4_elements(b, k)
            launch(loaded, operands, stream=stream)
            return None
        prepared = launch(loaded, operands, extents=extents, stream=stream)
    return Launched(loaded, prepared, _CALL_OPERANDS, fixed=workspace)


_CALL_OPERANDS = ("a", "sfa", "b", "sfb", "d")


def _impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, kernel_name: str = "", k_splits: int = 0
) -> torch.Tensor:
    call, key = _calls.find((a, sfa, b, sfb), kernel_name, k_splits)
    if call is not None:
        out = call.new_output()
        if call.relaunch((a, sfa, b, sfb, out), current_stream(a)):
            return out
    m, n, _ = _check_meta(a, sfa, b, sfb, None)
    _check_pointers(a=a, sfa=sfa, b=b, sfb=sfb)
    out = new_bf16_out(a, m, n)
    _calls.remember(key, _run(a, sfa, b, sfb, out, kernel_name, k_splits), new_output=out)
    return out


def _out_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, kernel_name: str = "",
    k_splits: int = 0,
) -> None:
    call, key = _calls.find((a, sfa, b, sfb, out), kernel_name, k_splits)
    if call is not None and call.relaunch((a, sfa, b, sfb, out), current_stream(a)):
        return
    _check_meta(a, sfa, b, sfb, out)
    _check_pointers(a=a, sfa=sfa, b=b, sfb=sfb, out=out)
    check_disjoint(OP_FP8_GEMM_NT, {"out": out}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb})
    ran = _run(a, sfa, b, sfb, out, kernel_name, k_splits)
    _calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, sfa, b, sfb, out))


def _fake(a, sfa, b, sfb, kernel_name: str = "", k_splits: int = 0):
    m, n, _ = _check_meta(a, sfa, b, sfb, None)
    return new_bf16_out(a, m, n)


def _out_fake(a, sfa, b, sfb, out, kernel_name: str = "", k_splits: int = 0) -> None:
    _check_meta(a, sfa, b, sfb, out)


FP8_GEMM_NT = TorchOp(OP_FP8_GEMM_NT, _impl, _fake)
FP8_GEMM_NT_OUT = TorchOp(f"{OP_FP8_GEMM_NT}_out", _out_impl, _out_fake, mutates=("out",))


def fp8_gemm_nt(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    kernel: str | None = None,
    k_splits: int | None = None,
) -> torch.Tensor:
    """D[M, N] = (A · sfa) @ (B · sfb)^T in bf16; see the module docstring.

    ``kernel`` forces a catalogue kernel by name; by default the heuristic (or the tuning table)
    chooses. ``k_splits`` sets how many CTAs share each tile's K blocks when the kernel splits K
    (epilogue ``split_k_tma_store``; by default the heuristic's count; rounded so that no split is
    empty); any other kernel takes only 1. Plain eager calls skip the dispatcher; under
    ``torch.compile``, autograd or dispatch modes the call goes through
    ``torch.ops.cutegen.fp8_gemm_nt`` (`torch_ops.TorchOp`).
    """
    # The tensors are checked by the op itself (once per call layout), naming each argument.
    check_kernel_name(OP_FP8_GEMM_NT, kernel)
    if k_splits is not None and (isinstance(k_splits, bool) or not isinstance(k_splits, int) or k_splits < 1):
        raise _fail("k_splits", f"must be a positive int or None, got {k_splits!r}")
    if out is None:
        return FP8_GEMM_NT.call(a, sfa, b, sfb, kernel or "", k_splits or 0)
    FP8_GEMM_NT_OUT.call(a, sfa, b, sfb, out, kernel or "", k_splits or 0)
    return out


# ---- weight gradient: both operands scaled per 1x128, fp32 accumulation in place -------------
OP_FP8_WGRAD = "fp8_wgrad_gemm_nt"
F32_ROW_ALIGN_ELEMS = 4  # 16 bytes of fp32


def _check_wgrad(a, sfa, b, sfb, d, c) -> tuple[int, int, int]:
    def fail(arg: str, what: str) -> InputError:
        return InputError(f"{OP_FP8_WGRAD}: argument '{arg}' {what}")

    check_matrix(OP_FP8_WGRAD, "a", a, None, torch.float8_e4m3fn, FP8_ROW_ALIGN_ELEMS)
    check_matrix(OP_FP8_WGRAD, "b", b, a.device, torch.float8_e4m3fn, FP8_ROW_ALIGN_ELEMS)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise fail("b", f"must have K = a.shape[1] = {k} columns, got shape {list(b.shape)}")
    if k % SCALE_BLOCK:
        raise fail("a", f"must have K a multiple of {SCALE_BLOCK}, got K = {k}")
    k_blocks = k // SCALE_BLOCK
    packed = isinstance(sfa, torch.Tensor) and sfa.dtype == torch.int32
    # Packed UE8M0 scales (DeepGEMM's SM100 1D1D form), four per int32 word along K.
    dtype, cols, what = (torch.int32, ceil_div(k_blocks, UE8M0_PER_WORD), "ceil(K/512)") if packed else (torch.float32, k_blocks, "K/128")
    for arg, t, rows in (("sfa", sfa, m), ("sfb", sfb, n)):
        if not isinstance(t, torch.Tensor) or t.device != a.device or t.dtype != dtype:
            raise fail(arg, f"must be a {dtype} tensor on {a.device} (torch.float32 scales, or packed UE8M0 "
                            f"torch.int32 for both), got {getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) != (rows, cols) or not is_mn_major_tma_aligned(t):
            raise fail(
                arg,
                f"must be [{rows}, {what} = {cols}], MN-major and TMA-aligned (strides (1, "
                f"{tma_aligned_rows(rows)})); got shape {list(t.shape)} strides {list(t.stride())}; "
                "convert with to_mn_major_tma_aligned",
            )
    check_matrix(OP_FP8_WGRAD, "d", d, a.device, torch.float32, F32_ROW_ALIGN_ELEMS)
    if tuple(d.shape) != (m, n):
        raise fail("d", f"must have shape [M, N] = [{m}, {n}], got {list(d.shape)}")
    check_not_overlapping_itself(OP_FP8_WGRAD, "d", d)
    if c is not None:
        if not isinstance(c, torch.Tensor) or c.device != a.device or c.dtype != torch.float32 or tuple(c.shape) != (m, n):
            raise fail("c", f"must be a torch.float32 [M, N] = [{m}, {n}] tensor on {a.device}")
    return m, n, k


def tail_split() -> int:
    """``TAIL_SPLIT`` for a weight-gradient launch: 1, the K blocks of the last, partial wave's
    tiles are shared by all the clusters (each adds its part into D), or 0 under
    ``torch.use_deterministic_algorithms(True)``: no tile is split and D is bitwise reproducible.
    With 1, the order of a split tile's fp32 additions into D varies between runs (a difference
    of the order of fp32 rounding, ~1e-7 relative)."""
    return 0 if torch.are_deterministic_algorithms_enabled() else 1


_wgrad_calls = CallCache(OP_FP8_WGRAD)


def _same_view(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two tensors are the same elements in the same order (not merely the same address)."""
    return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()


def _wgrad_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
    c: torch.Tensor | None = None, kernel_name: str = "",
) -> None:
    split = tail_split()
    call, key = _wgrad_calls.find((a, sfa, b, sfb, d) if c is None else (a, sfa, b, sfb, d, c), kernel_name, split)
    if call is None:
        _check_wgrad(a, sfa, b, sfb, d, c)
        check_disjoint(OP_FP8_WGRAD, {"d": d}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb})
    if c is not None and not _same_view(c, d):  # C = D needs no copy; D = C.t() does
        d.copy_(c)
    if call is not None and call.relaunch((a, sfa, b, sfb, d), current_stream(a)):
        return
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or k == 0:
        return
    packed = sfa.dtype == torch.int32
    if packed:
        _check_pointers(OP_FP8_WGRAD, PTR_ALIGN_BYTES, a=a, b=b, out=d)
    else:
        _check_pointers(OP_FP8_WGRAD, PTR_ALIGN_BYTES, a=a, sfa=sfa, b=b, sfb=sfb, out=d)
    device = device_ordinal(a)
    with torch.cuda.device(device):
        scale = _wgrad_scale(packed, device, kernel_name)
        loaded = kernel_for(OP_FP8_WGRAD, m, n, k, device, kernel_name, scale)
        operands = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": d}
        if packed:
            # The block-scaled MMA's blocked scales, made per call: nothing is remembered.
            operands["sfa"], operands["sfb"] = mx_scale_operands(sfa, sfb, m, n, k, sfb_per_row=True)
            launch(loaded, operands, stream=current_stream(a), extents={"TAIL_SPLIT": split})
            return
        prepared = launch(loaded, operands, stream=current_stream(a), extents={"TAIL_SPLIT": split})
    _wgrad_calls.remember(key, Launched(loaded, prepared, _CALL_OPERANDS, outputs={"d": "d"}), (a, sfa, b, sfb, d))


def _wgrad_scale(packed: bool, device: int, forced: str) -> str:
    """The scale format of the weight-gradient kernels a call may run: "f32", or "mx" for packed
    UE8M0 scales (Blackwell's block-scaled kernels), refused naming 'sfa' where none runs."""
    if not packed:
        return "f32"
    if forced or runnable_kernels(OP_FP8_WGRAD, device, "mx"):
        return "mx"
    raise InputError(
        f"{OP_FP8_WGRAD}: argument 'sfa' holds packed UE8M0 (int32) scales: only kernels whose tensor cores "
        "apply the scales (scale mx, sm_100a) take them, and this GPU's catalogue has none"
    )


def _wgrad_fake(a, sfa, b, sfb, d, c=None, kernel_name: str = "") -> None:
    _check_wgrad(a, sfa, b, sfb, d, c)


FP8_WGRAD_GEMM_NT = TorchOp(OP_FP8_WGRAD, _wgrad_impl, _wgrad_fake, mutates=("d",))


def fp8_wgrad_gemm_nt(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    kernel: str | None = None,
) -> torch.Tensor:
    """Weight gradient: D[M, N] (fp32) = C + (A · sfa) @ (B · sfb)^T, returned (D is written in place).

    A [M, K] and B [N, K] are e4m3 with fp32 scales per 1x128 along K on **both** sides (sfa
    [M, K/128] and sfb [N, K/128], each MN-major and TMA-aligned, as the per-token quantize
    writes them with ``scale_layout="mn-major-tma-aligned"``), or packed UE8M0 scales on both
    sides (int32 [M, ⌈K/512⌉] and [N, ⌈K/512⌉], MN-major and TMA-aligned: DeepGEMM's SM100 1D1D
    form), which only Blackwell's block-scaled kernels take (converted per call; refused naming
    ``sfa`` elsewhere). Those kernels split no tile, so D is bitwise reproducible there. Without ``c``, D accumulates into
    itself (C = D); with ``c``, D is first set to C. The kernel adds its fp32 tile into D with a
    TMA reduce-add, so D must not alias A, B or the scales.
    """
    check_kernel_name(OP_FP8_WGRAD, kernel)
    FP8_WGRAD_GEMM_NT.call(a, sfa, b, sfb, d, c, kernel or "")
    return d


__all__ = [
    "b_is_fp4",
    "fp8_gemm_nt",
    "sfb_per_row",
    "fp8_wgrad_gemm_nt",
    "is_mn_major_tma_aligned",
    "to_mn_major_tma_aligned",
    "tma_aligned_rows",
]
