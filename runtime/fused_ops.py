"""PyTorch entry points of the FP8 GEMMs whose epilogue applies SwiGLU and quantizes to FP8: the MoE up-projection in one kernel.

Each computes h = (A · sfa) · (B · sfb)ᵀ as its plain FP8 GEMM does (1x128 scales of A, 128x128 of
B, fp32 promotion), then a = SiLU(h_gate) · h_up and writes a quantized per token and 1x128 block,
exactly what the down-projection's FP8 GEMM takes as its A:

* ``fp8_gemm_nt_swiglu_quant(a, sfa, b, sfb, out=None, out_sf=None, *, eps=1e-4, use_ue8m0=False, kernel=None)``
  → (q [M, I] e4m3, sf [M, I/128] fp32 MN-major TMA-aligned);
* ``m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(a, sfa, b, sfb, m_indices, out=None, out_sf=None,
  *, zero_padding=True, eps=1e-4, use_ue8m0=False, kernel=None)``: experts' rows contiguous in A (prefill), as
  `m_grouped_fp8_gemm_nt_contiguous` takes them; padding rows (m_indices -1) are written as
  zeros with scale eps/448 unless ``zero_padding`` is False;
* ``m_grouped_fp8_gemm_nt_masked_swiglu_quant(a, sfa, b, sfb, masked_m, expected_m, out=None,
  out_sf=None, *, eps=1e-4, use_ue8m0=False, kernel=None)``: the masked layout (decode under CUDA graphs) →
  (q [G, max_m, I], sf [G, max_m, I/128]); rows past masked_m[g] are not computed.

``b`` is W13 with its gate and up rows interleaved in 128-row blocks and ``sfb`` its 128x128 block
scales reordered the same way: `interleave_gate_up` (once, when the weights are loaded). B has
N = 2I rows, I a multiple of 128. The input scales are fp32 (UE8M0 and FP4 weights are refused
naming the argument). ``use_ue8m0=True`` rounds the output's scales up to powers of two (values
UE8M0 holds exactly; DeepGEMM's ``use_ue8m0`` and the UE8M0 FP8 recipe), still stored as fp32 for
the Hopper GEMM that reads them, and quantizes with them: its own kernels (entries ending
``_ue8m0``). Numerics: `cutegen.runtime.fused_reference`. Bad inputs raise `InputError` naming
the argument before anything is launched.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import fp8_ops, grouped_ops
from .checks import check_aligned, check_disjoint, check_kernel_name, check_not_overlapping_itself, checks_under
from .errors import InputError
from .fused_reference import SWIGLU_BLOCK, interleave_gate_up
from .kernel_choice import kernel_for, masked_rows_per_group
from .launch import launch
from .quant_reference import DEFAULT_EPS, check_eps, is_mn_major_tma_aligned, mn_major_tma_aligned_empty
from .torch_ops import TorchOp, current_stream, device_ordinal

OP_DENSE = "fp8_gemm_nt_swiglu_quant"
OP_CONTIGUOUS = "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant"
OP_MASKED = "m_grouped_fp8_gemm_nt_masked_swiglu_quant"
SCALE_BLOCK = 128
# The entry suffix of the kernels whose output scales are rounded to powers of two (`Schedule.entry`).
UE8M0_ENTRY_SUFFIX = "_ue8m0"
# What each op binds, in the kernel's entry order (its contract's operands, `schedules.contract`).
OPERANDS = {
    OP_DENSE: ("a", "sfa", "b", "sfb", "d", "d_sf"),
    OP_CONTIGUOUS: ("a", "sfa", "b", "sfb", "d", "d_sf", "m_indices"),
    OP_MASKED: ("a", "sfa", "b", "sfb", "d", "d_sf", "masked_m"),
}
# The GEMM's checks name their own op: errors of the fused ops name the fused one.
_BASE_OPS = {OP_DENSE: "fp8_gemm_nt", OP_CONTIGUOUS: grouped_ops.OP, OP_MASKED: grouped_ops.OP_MASKED}


def _fail(op: str, arg: str, what: str) -> InputError:
    return InputError(f"{op}: argument '{arg}' {what}")


def _flag(op: str, use_ue8m0: Any) -> bool:
    if not isinstance(use_ue8m0, bool):
        raise _fail(op, "use_ue8m0", f"must be a bool, got {type(use_ue8m0).__name__}")
    return use_ue8m0


def _gemm_checks(op: str, check: Callable[[], Any]) -> Any:
    """The plain GEMM's checks of A, sfa, B, sfb (and the layout's metadata), under this op's name."""
    return checks_under(op, _BASE_OPS[op], check)


def _check_fused(op: str, a, sfa, b, n: int, out, out_sf, lead: tuple[int, ...], eps) -> int:
    """What the fused epilogue adds to the GEMM's checks; returns I = N/2."""
    if sfa.dtype != torch.float32:
        raise _fail(op, "sfa", f"must be fp32 scales (torch.float32): the fused kernels take no UE8M0 scales, got {sfa.dtype}")
    if fp8_ops.b_is_fp4(b) or b.dtype != torch.float8_e4m3fn:
        raise _fail(op, "b", f"must be torch.float8_e4m3fn weights, got {b.dtype}")
    if n % (2 * SWIGLU_BLOCK):
        raise _fail(op, "b", f"must have N = 2I rows with I a multiple of {SWIGLU_BLOCK} (gate and up interleaved "
                             f"in {SWIGLU_BLOCK}-row blocks, see interleave_gate_up), got N = {n}")
    try:
        check_eps(eps)
    except ValueError as exc:
        raise _fail(op, "eps", str(exc).removeprefix("eps ")) from None
    inter = n // 2
    if out is not None:
        shape = (*lead, inter)
        if not isinstance(out, torch.Tensor) or out.device != a.device or out.dtype != torch.float8_e4m3fn:
            raise _fail(op, "out", f"must be a torch.float8_e4m3fn tensor on {a.device}")
        if tuple(out.shape) != shape or out.stride(-1) != 1 or any(out.shape[i] > 1 and out.stride(i) % 16 for i in range(out.dim() - 1)):
            raise _fail(op, "out", f"must be {list(shape)} (I = N/2), contiguous along I with 16-byte aligned strides, "
                                   f"got {list(out.shape)} strides {list(out.stride())}")
        check_not_overlapping_itself(op, "out", out)
    if out_sf is not None:
        shape = (*lead, inter // SCALE_BLOCK)
        if not isinstance(out_sf, torch.Tensor) or out_sf.device != a.device or out_sf.dtype != torch.float32:
            raise _fail(op, "out_sf", f"must be a torch.float32 tensor on {a.device}")
        if tuple(out_sf.shape) != shape or not is_mn_major_tma_aligned(out_sf):
            raise _fail(op, "out_sf", f"must be {list(shape)}, MN-major and TMA-aligned (as the next GEMM's sfa), "
                                      f"got {list(out_sf.shape)} strides {list(out_sf.stride())}")
        check_not_overlapping_itself(op, "out_sf", out_sf)
    return inter


def _outputs(a: torch.Tensor, lead: tuple[int, ...], inter: int, out, out_sf) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's outputs, or new ones: q e4m3 [*lead, I], scales [*lead, I/128] MN-major."""
    q = out if out is not None else torch.empty((*lead, inter), dtype=torch.float8_e4m3fn, device=a.device)
    if out_sf is None:
        rows, blocks = lead[-1], inter // SCALE_BLOCK
        if len(lead) == 1:
            out_sf = mn_major_tma_aligned_empty(rows, blocks, torch.float32, a.device, zero=False)
        else:
            buf = torch.empty((lead[0], blocks, fp8_ops.tma_aligned_rows(rows)), dtype=torch.float32, device=a.device)
            out_sf = buf.transpose(1, 2)[:, :rows]
    return q, out_sf


def _launch(op: str, operands: dict, m: int, n: int, k: int, kernel: str, extents: dict, use_ue8m0: bool,
            rows_per_group: int | None = None, max_rows_per_group: int | None = None) -> None:
    for arg in ("a", "sfa", "b", "d", "d_sf"):
        check_aligned(op, "out" if arg == "d" else "out_sf" if arg == "d_sf" else arg, operands[arg], 16)
    check_aligned(op, "sfb", operands["sfb"], 4)
    a = operands["a"]
    device = device_ordinal(a)
    with torch.cuda.device(device):
        entry = op + UE8M0_ENTRY_SUFFIX if use_ue8m0 else op
        loaded = kernel_for(entry, m, n, k, device, kernel, "f32", rows_per_group=rows_per_group,
                            max_rows_per_group=max_rows_per_group)
        launch(loaded, operands, extents=extents, stream=current_stream(a))


# ---- dense ----------------------------------------------------------------------------------


def _dense_meta(a, sfa, b, sfb, out, out_sf, eps) -> tuple[int, int, int, int]:
    m, n, k = _gemm_checks(OP_DENSE, lambda: fp8_ops._check_meta(a, sfa, b, sfb, None))
    return m, n, k, _check_fused(OP_DENSE, a, sfa, b, n, out, out_sf, (m,), eps)


def _dense_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, out_sf: torch.Tensor,
    eps: float = DEFAULT_EPS, use_ue8m0: bool = False, kernel_name: str = "",
) -> None:
    m, n, k, _ = _dense_meta(a, sfa, b, sfb, out, out_sf, eps)
    check_disjoint(OP_DENSE, {"out": out, "out_sf": out_sf}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb})
    if m == 0:
        return
    operands = dict(zip(OPERANDS[OP_DENSE], (a, sfa, b, sfb, out, out_sf)))
    _launch(OP_DENSE, operands, m, n, k, kernel_name, {"eps": eps}, use_ue8m0)


def _dense_fake(a, sfa, b, sfb, out, out_sf, eps: float = DEFAULT_EPS, use_ue8m0: bool = False,
                kernel_name: str = "") -> None:
    _dense_meta(a, sfa, b, sfb, out, out_sf, eps)


DENSE = TorchOp(OP_DENSE, _dense_impl, _dense_fake, mutates=("out", "out_sf"))


def fp8_gemm_nt_swiglu_quant(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
    out: torch.Tensor | None = None, out_sf: torch.Tensor | None = None, *,
    eps: float = DEFAULT_EPS, use_ue8m0: bool = False, kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense up-projection with SwiGLU and per-token FP8 quantize fused; see the module docstring."""
    check_kernel_name(OP_DENSE, kernel)
    use_ue8m0 = _flag(OP_DENSE, use_ue8m0)
    m, _, _, inter = _dense_meta(a, sfa, b, sfb, out, out_sf, eps)
    q, sf = _outputs(a, (m,), inter, out, out_sf)
    DENSE.call(a, sfa, b, sfb, q, sf, float(eps), use_ue8m0, kernel or "")
    return q, sf


# ---- contiguous layout ------------------------------------------------------------------------


def _contiguous_meta(a, sfa, b, sfb, m_indices, out, out_sf, eps) -> tuple[int, int, int, int]:
    m, n, k, _ = _gemm_checks(OP_CONTIGUOUS, lambda: grouped_ops._check_meta(a, sfa, b, sfb, m_indices, None))
    return m, n, k, _check_fused(OP_CONTIGUOUS, a, sfa, b, n, out, out_sf, (m,), eps)


def _contiguous_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor,
    out: torch.Tensor, out_sf: torch.Tensor, zero_padding: bool = True, eps: float = DEFAULT_EPS,
    use_ue8m0: bool = False, kernel_name: str = "",
) -> None:
    m, n, k, _ = _contiguous_meta(a, sfa, b, sfb, m_indices, out, out_sf, eps)
    check_disjoint(OP_CONTIGUOUS, {"out": out, "out_sf": out_sf},
                   {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "m_indices": m_indices})
    if m == 0 or b.shape[0] == 0:
        return
    operands = dict(zip(OPERANDS[OP_CONTIGUOUS], (a, sfa, b, sfb, out, out_sf, m_indices)))
    _launch(OP_CONTIGUOUS, operands, m, n, k, kernel_name, {"eps": eps, "ZERO_PADDING": int(bool(zero_padding))},
            use_ue8m0)


def _contiguous_fake(a, sfa, b, sfb, m_indices, out, out_sf, zero_padding: bool = True, eps: float = DEFAULT_EPS,
                     use_ue8m0: bool = False, kernel_name: str = "") -> None:
    _contiguous_meta(a, sfa, b, sfb, m_indices, out, out_sf, eps)


CONTIGUOUS = TorchOp(OP_CONTIGUOUS, _contiguous_impl, _contiguous_fake, mutates=("out", "out_sf"))


def m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor,
    out: torch.Tensor | None = None, out_sf: torch.Tensor | None = None, *,
    zero_padding: bool = True, eps: float = DEFAULT_EPS, use_ue8m0: bool = False, kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill up-projection over contiguous experts with SwiGLU and FP8 quantize fused."""
    check_kernel_name(OP_CONTIGUOUS, kernel)
    use_ue8m0 = _flag(OP_CONTIGUOUS, use_ue8m0)
    m, _, _, inter = _contiguous_meta(a, sfa, b, sfb, m_indices, out, out_sf, eps)
    q, sf = _outputs(a, (m,), inter, out, out_sf)
    CONTIGUOUS.call(a, sfa, b, sfb, m_indices, q, sf, bool(zero_padding), float(eps), use_ue8m0, kernel or "")
    return q, sf


# ---- masked layout ----------------------------------------------------------------------------


def _masked_meta(a, sfa, b, sfb, masked_m, out, out_sf, eps) -> tuple[int, int, int, int, int]:
    g, max_m, n, k = _gemm_checks(OP_MASKED, lambda: grouped_ops._check_masked(a, sfa, b, sfb, masked_m, None))
    return g, max_m, n, k, _check_fused(OP_MASKED, a, sfa, b, n, out, out_sf, (g, max_m), eps)


def _masked_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    out: torch.Tensor, out_sf: torch.Tensor, eps: float = DEFAULT_EPS, use_ue8m0: bool = False, kernel_name: str = "",
) -> None:
    g, max_m, n, k, _ = _masked_meta(a, sfa, b, sfb, masked_m, out, out_sf, eps)
    check_disjoint(OP_MASKED, {"out": out, "out_sf": out_sf},
                   {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "masked_m": masked_m})
    if g == 0 or max_m == 0:
        return
    rows = masked_rows_per_group(expected_m, max_m)
    operands = dict(zip(OPERANDS[OP_MASKED], (a, sfa, b, sfb, out, out_sf, masked_m)))
    _launch(OP_MASKED, operands, rows * g, n, k, kernel_name, {"eps": eps}, use_ue8m0, rows_per_group=rows,
            max_rows_per_group=max_m)


def _masked_fake(a, sfa, b, sfb, masked_m, expected_m: int, out, out_sf, eps: float = DEFAULT_EPS,
                 use_ue8m0: bool = False, kernel_name: str = "") -> None:
    _masked_meta(a, sfa, b, sfb, masked_m, out, out_sf, eps)


MASKED = TorchOp(OP_MASKED, _masked_impl, _masked_fake, mutates=("out", "out_sf"))


def m_grouped_fp8_gemm_nt_masked_swiglu_quant(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    out: torch.Tensor | None = None, out_sf: torch.Tensor | None = None, *,
    eps: float = DEFAULT_EPS, use_ue8m0: bool = False, kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode up-projection over [G, max_m, K] (masked_m on the GPU) with SwiGLU and FP8
    quantize fused; CUDA-graph capturable."""
    check_kernel_name(OP_MASKED, kernel)
    use_ue8m0 = _flag(OP_MASKED, use_ue8m0)
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise _fail(OP_MASKED, "expected_m", f"must be an int (a hint for the kernel choice), got {type(expected_m).__name__}")
    g, max_m, _, _, inter = _masked_meta(a, sfa, b, sfb, masked_m, out, out_sf, eps)
    q, sf = _outputs(a, (g, max_m), inter, out, out_sf)
    MASKED.call(a, sfa, b, sfb, masked_m, expected_m, q, sf, float(eps), use_ue8m0, kernel or "")
    return q, sf



__all__ = [
    "fp8_gemm_nt_swiglu_quant",
    "interleave_gate_up",
    "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant",
    "m_grouped_fp8_gemm_nt_masked_swiglu_quant",
]
