"""PyTorch entry point of the NVFP4 GEMM on Blackwell's block-scaled MMA (``torch.ops.cutegen.nvfp4_gemm_nt``).

``nvfp4_gemm_nt(a, sfa, b, sfb, alpha, out=None, *, kernel=None)`` computes
D[M, N] (bf16) = alpha · Σ_k (A[m, k] · sfa[m, k/16]) · (B[n, k] · sfb[n, k/16]), the tensor cores
applying the scales (``kind::mxf4nvf4``) and accumulating in fp32:

* ``a`` [M, K/2], ``b`` [N, K/2]: FP4 E2M1 packed two per byte, element 2i in the low nibble
  (torch.uint8, int8 or float4_e2m1fn_x2), K-major (``stride(1) == 1``), K a multiple of 256 (the
  kernels' K tile), bases and row strides multiples of 32 bytes (the TMA type's rule).
* ``sfa``, ``sfb``: their E4M3 scales, one per 16 elements along K (torch.float8_e4m3fn, or the
  same bytes as torch.uint8), in the MMA's blocked layout — 512-byte atoms of 128 rows x 4 scales,
  what vLLM and FlashInfer call the swizzled 128x4 layout — shaped [⌈M/128⌉·128, K/16] (or flat,
  the same bytes), contiguous. ``mx_reference.to_blocked(scales.view(torch.uint8))`` makes them
  from row-major [M, K/16] scales; ``mx_reference.quant_nvfp4_ref`` quantises to NVFP4.
* ``alpha``: a CUDA fp32 tensor of one element, read by the kernel (so a CUDA graph may change it
  between replays): NVFP4's per-tensor scales, 1 / (global_scale_a · global_scale_b).
* ``out`` (optional): bf16 [M, N], ``stride(1) == 1``, row stride a multiple of 8, 16-byte aligned.
* M == 0 or N == 0: nothing is launched; K == 0: the result is zero-filled.

Only sm_100a kernels compute it (``scale = "nv"``); on any other GPU the call is refused before a
launch, naming ``a``. Bad inputs raise `InputError` naming the argument. What cannot be checked
without reading device memory: that the scales and alpha are finite.
"""

from __future__ import annotations

from typing import Any

import torch

from .checks import (
    PTR_ALIGN_BYTES, check_aligned, check_disjoint, check_kernel_name, check_matrix, check_not_overlapping_itself,
)
from .errors import InputError
from .fp8_ops import FP4_ALIGN_BYTES, FP4_DTYPES, fp4_elements
from .kernel_choice import kernel_for, runnable_kernels
from .launch import launch
from .mx_reference import ATOM_ROWS, NV_VEC
from .params import ceil_div
from .torch_ops import ROW_ALIGN_ELEMS, TorchOp, current_stream, device_ordinal, new_bf16_out, nothing_to_launch

OP_NVFP4_GEMM_NT = "nvfp4_gemm_nt"
SCALE_NV = "nv"
SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)
# The kernels' K tile: one 128-byte row of FP4 with four scale atoms per 128 rows.
K_MULTIPLE = 256


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP_NVFP4_GEMM_NT}: argument '{arg}' {what}")


def _check_fp4(arg: str, t: Any, device: Any | None) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FP4_DTYPES:
        names = ", ".join(str(d) for d in FP4_DTYPES)
        raise _fail(arg, f"must hold FP4 packed two per byte ({names}), got {t.dtype}")
    check_matrix(OP_NVFP4_GEMM_NT, arg, t, device, t.dtype, FP4_ALIGN_BYTES)


def _check_scales(arg: str, t: Any, a: torch.Tensor, rows: int, k: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.device != a.device:
        raise _fail(arg, f"must be on {a.device} (the device of 'a'), got {t.device}")
    if t.dtype not in SCALE_DTYPES:
        raise _fail(arg, f"must be E4M3 scales (torch.float8_e4m3fn, or torch.uint8 bytes), got {t.dtype}")
    padded = ceil_div(rows, ATOM_ROWS) * ATOM_ROWS
    if t.numel() != padded * (k // NV_VEC):
        raise _fail(arg, f"must hold one scale per 16 elements of {rows} rows padded to {padded} in the blocked "
                         f"layout: [{padded}, {k // NV_VEC}] ({padded * (k // NV_VEC)} bytes), got shape "
                         f"{list(t.shape)}")
    if not t.is_contiguous():
        raise _fail(arg, f"must be contiguous (the blocked layout's bytes in order), got strides {list(t.stride())}")


def _check_meta(a: Any, sfa: Any, b: Any, sfb: Any, alpha: Any, out: Any | None) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
    _check_fp4("a", a, None)
    _check_fp4("b", b, a.device)
    m, k = a.shape[0], 2 * a.shape[1]
    n = b.shape[0]
    if b.shape[1] != a.shape[1]:
        raise _fail("b", f"must have K/2 = a.shape[1] = {a.shape[1]} bytes per row, got shape {list(b.shape)}")
    if k % K_MULTIPLE:
        raise _fail("a", f"must have K a multiple of {K_MULTIPLE} (K/2 a multiple of {K_MULTIPLE // 2} bytes), got K = {k}")
    _check_scales("sfa", sfa, a, m, k)
    _check_scales("sfb", sfb, a, n, k)
    if not isinstance(alpha, torch.Tensor):
        raise _fail("alpha", f"must be a torch.Tensor of one fp32 element, got {type(alpha).__name__}")
    if alpha.device != a.device or alpha.dtype != torch.float32 or alpha.numel() != 1:
        raise _fail("alpha", f"must be one fp32 element on {a.device}, got {alpha.dtype} of shape {list(alpha.shape)} "
                             f"on {alpha.device}")
    if out is not None:
        check_matrix(OP_NVFP4_GEMM_NT, "out", out, a.device, torch.bfloat16, ROW_ALIGN_ELEMS)
        if tuple(out.shape) != (m, n):
            raise _fail("out", f"must have shape [M, N] = [{m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP_NVFP4_GEMM_NT, "out", out)
    return m, n, k


def _check_pointers(**tensors: torch.Tensor | None) -> None:
    for arg, t in tensors.items():
        check_aligned(OP_NVFP4_GEMM_NT, arg, t, FP4_ALIGN_BYTES if arg in ("a", "b") else 4 if arg == "alpha"
                      else PTR_ALIGN_BYTES)


def _run(a, sfa, b, sfb, alpha, out, kernel: str) -> None:
    m, n = a.shape[0], b.shape[0]
    k = 2 * a.shape[1]
    if nothing_to_launch(out, m, n, k):
        return
    device = device_ordinal(a)
    with torch.cuda.device(device):
        if not kernel and not runnable_kernels(OP_NVFP4_GEMM_NT, device, SCALE_NV):
            raise _fail("a", "holds NVFP4, which only Blackwell's block-scaled MMA computes (sm_100a kernels, "
                             "scale nv), and this GPU's catalogue has none")
        loaded = kernel_for(OP_NVFP4_GEMM_NT, m, n, k, device, kernel, SCALE_NV)
        operands = {
            "a": fp4_elements(a, k), "sfa": sfa.view(torch.uint8).reshape(-1),
            "b": fp4_elements(b, k), "sfb": sfb.view(torch.uint8).reshape(-1),
            "d": out, "alpha": alpha.reshape(1),
        }
        launch(loaded, operands, stream=current_stream(a))


_CALL_OPERANDS = ("a", "sfa", "b", "sfb", "d", "alpha")


def _impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, alpha: torch.Tensor,
          kernel_name: str = "") -> torch.Tensor:
    m, n, _ = _check_meta(a, sfa, b, sfb, alpha, None)
    _check_pointers(a=a, sfa=sfa, b=b, sfb=sfb, alpha=alpha)
    out = new_bf16_out(a, m, n)
    _run(a, sfa, b, sfb, alpha, out, kernel_name)
    return out


def _out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, alpha: torch.Tensor,
              out: torch.Tensor, kernel_name: str = "") -> None:
    _check_meta(a, sfa, b, sfb, alpha, out)
    _check_pointers(a=a, sfa=sfa, b=b, sfb=sfb, alpha=alpha, out=out)
    check_disjoint(OP_NVFP4_GEMM_NT, {"out": out}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "alpha": alpha})
    _run(a, sfa, b, sfb, alpha, out, kernel_name)


def _fake(a, sfa, b, sfb, alpha, kernel_name: str = ""):
    m, n, _ = _check_meta(a, sfa, b, sfb, alpha, None)
    return new_bf16_out(a, m, n)


def _out_fake(a, sfa, b, sfb, alpha, out, kernel_name: str = "") -> None:
    _check_meta(a, sfa, b, sfb, alpha, out)


NVFP4_GEMM_NT = TorchOp(OP_NVFP4_GEMM_NT, _impl, _fake)
NVFP4_GEMM_NT_OUT = TorchOp(f"{OP_NVFP4_GEMM_NT}_out", _out_impl, _out_fake, mutates=("out",))


def nvfp4_gemm_nt(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    kernel: str | None = None,
) -> torch.Tensor:
    """D[M, N] = alpha · (A · sfa) @ (B · sfb)^T in bf16, NVFP4 operands; see the module docstring.

    ``kernel`` forces a catalogue kernel by name; by default the heuristic chooses. Plain eager
    calls skip the dispatcher; under ``torch.compile``, autograd or dispatch modes the call goes
    through ``torch.ops.cutegen.nvfp4_gemm_nt`` (`torch_ops.TorchOp`).
    """
    check_kernel_name(OP_NVFP4_GEMM_NT, kernel)
    if out is None:
        return NVFP4_GEMM_NT.call(a, sfa, b, sfb, alpha, kernel or "")
    NVFP4_GEMM_NT_OUT.call(a, sfa, b, sfb, alpha, out, kernel or "")
    return out


__all__ = ["OP_NVFP4_GEMM_NT", "nvfp4_gemm_nt"]
