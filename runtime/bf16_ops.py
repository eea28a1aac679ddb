"""The BF16 GEMM ``bf16_gemm_nt`` (``torch.ops.cutegen.bf16_gemm_nt``): D = A·Bᵀ (+ C) with fp32 accumulation, bf16 or fp32 D.

``bf16_gemm_nt(a, b, out=None, *, c=None, kernel=None)`` computes D[M, N] = A[M, K] @ B[N, K]^T,
plus C when given, with fp32 accumulation (DeepGEMM's ``nt`` convention and its
``bf16_gemm_nt(a, b, d, c)``):

* ``a`` [M, K] and ``b`` [N, K]: ``torch.bfloat16`` CUDA tensors on one device, K-major
  (``stride(1) == 1``) or MN-major (``stride(0) == 1``: a transposed view ``x.t()`` of a [K, M]
  or [K, N] matrix, DeepGEMM's ``nn``, ``tn`` and ``tt`` forms, read as they lie), the other
  stride a multiple of 8 elements (16 bytes), base addresses 16-byte aligned (TMA's rules; a mode
  of extent 1 is exempt from its stride rule). The MN-major kernels (layouts ``nn``, ``tn``,
  ``tt`` in `cutegen list`) ran on an H200 on 2026-12-05.
* ``out`` (optional): ``torch.bfloat16`` or ``torch.float32`` [M, N] on the same device,
  ``stride(1) == 1``, a 16-byte aligned row stride and base; written in place and returned.
* ``c`` (optional): [M, N] of D's type (``out``'s, or bf16 without ``out``). D = C + A·Bᵀ: C is
  copied into D unless it is ``out`` itself (then D += A·Bᵀ in place, no copy), and the kernel
  adds each fp32 tile into D by the TMA's reduce-add: one addition per element in D's type, so an
  fp32 D gets fp32(C + A·Bᵀ) and a bf16 D bf16(C + bf16(A·Bᵀ)). Without ``out`` the result has
  C's dtype.
* Without ``out`` the result is a new [M, N] tensor whose row stride is N rounded up to 16 bytes
  (so it is contiguous whenever N % 8 == 0).
* M == 0 or N == 0: nothing is launched. K == 0: D is C, or zeros (an empty sum), nothing is
  launched.
* ``kernel``: force a kernel of the catalogue by name (else the heuristic chooses; see
  `cutegen.runtime.heuristics`); it must write D's type, and add into D exactly when C is given.
* ``k_splits``: the split count of a split-K kernel (epilogues ``split_k_tma_store`` and, with
  ``c``, ``split_k_tma_store_add``: each tile's 128-wide K blocks shared among that many CTAs, the
  fp32 partial sums added in split order by the last, which stores the tile or adds it into D; by
  default the heuristic's count); refused for other kernels.

The fp32-D and accumulating kernels ran on an H200 on 2026-12-05 (`cutegen list bf16_gemm_nt`
says what ran per kernel).

Bad inputs raise `InputError` naming the argument before anything is launched. Kernels launch
on torch's current stream of ``a``'s device, so the op composes with streams, ``torch.compile``
(fake implementations are registered) and CUDA-graph capture (run each shape once before
capturing, so that the kernel is loaded outside the capture). ``torch.ops.cutegen.bf16_gemm_nt``
(new bf16 D), ``bf16_gemm_nt_out`` (into ``out``) and ``bf16_gemm_nt_accumulate`` (``out`` +=
A·Bᵀ) are the registered ops.
"""

from __future__ import annotations

from typing import Any

import torch

from . import split_k, stream_scratch
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_kernel_name, check_matrix, check_not_overlapping_itself
from .errors import InputError
from .kernel_choice import kernel_for
from .launch import launch
from .torch_ops import ROW_ALIGN_BYTES, ROW_ALIGN_ELEMS, TorchOp, bf16_out_strides, current_stream, device_ordinal, new_bf16_out, nothing_to_launch

OP_BF16_GEMM_NT = "bf16_gemm_nt"


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP_BF16_GEMM_NT}: argument '{arg}' {what}")


# D's types and their names in the manifests.
D_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _check_matrix(arg: str, t: Any, device: Any | None, dtype: torch.dtype = torch.bfloat16) -> None:
    check_matrix(OP_BF16_GEMM_NT, arg, t, device, dtype, ROW_ALIGN_BYTES // dtype.itemsize)


def _check_d(arg: str, t: Any, device: Any, shape: tuple[int, int], dtype: torch.dtype | None = None) -> None:
    """D (``out``) or C: a bf16 or fp32 [M, N] matrix (of ``dtype`` when given)."""
    if not isinstance(t, torch.Tensor):
        raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in D_DTYPES or (dtype is not None and t.dtype != dtype):
        want = dtype if dtype is not None else "torch.bfloat16 or torch.float32"
        raise _fail(arg, f"must be {want}{' (the type of D)' if dtype is not None else ''}, got {t.dtype}")
    _check_matrix(arg, t, device, t.dtype)
    if tuple(t.shape) != shape:
        raise _fail(arg, f"must have shape [M, N] = [{shape[0]}, {shape[1]}], got {list(t.shape)}")


def mn_major(t: torch.Tensor) -> bool:
    """Whether the [rows, K] operand `t` is MN-major (its rows contiguous: a transposed view of a
    [K, rows] matrix) rather than K-major; a matrix of one column is K-major."""
    rows, cols = t.shape
    return cols > 1 and t.stride(1) != 1 and (rows == 1 or t.stride(0) == 1)


def layout_of(a: torch.Tensor, b: torch.Tensor) -> str:
    """DeepGEMM's letters for the majorness of A and B: "nt" (both K-major), "nn", "tn", "tt"."""
    return {(False, False): "nt", (False, True): "nn", (True, True): "tn", (True, False): "tt"}[(mn_major(a), mn_major(b))]


def _check_operand(arg: str, t: Any, device: Any | None) -> None:
    """A bf16 [rows, K] operand, K-major (`_check_matrix`) or MN-major (its transposed view
    [K, rows] K-major: unit stride along the rows, a 16-byte aligned stride between them)."""
    if not isinstance(t, torch.Tensor):
        raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 2 and mn_major(t):
        if t.stride(1) % ROW_ALIGN_ELEMS:
            raise _fail(arg, f"is MN-major (unit stride along its rows) and must have a stride between its "
                             f"columns that is a multiple of {ROW_ALIGN_ELEMS} elements (16 bytes), got stride(1) = {t.stride(1)}")
        _check_matrix(arg, t.t(), device)  # dtype, device, extents
        return
    _check_matrix(arg, t, device)


def check_meta(a: Any, b: Any, out: Any | None, c: Any | None = None) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    _check_operand("a", a, None)
    _check_operand("b", b, a.device)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise _fail("b", f"must have K = a.shape[1] = {k} columns, got shape {list(b.shape)}")
    if out is not None:
        _check_d("out", out, a.device, (m, n))
        check_not_overlapping_itself(OP_BF16_GEMM_NT, "out", out)
    if c is not None:
        _check_d("c", c, a.device, (m, n), out.dtype if out is not None else None)
    return m, n, k


_OPERANDS = ("a", "b", "d")


def _run(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel: str, adds: bool = False, k_splits: int = 0
) -> Launched | None:
    """Launch (``adds``: a kernel adding its tiles into ``out``; ``k_splits``: a split-K kernel's
    split count, 0 for the heuristic's); returns what `_calls` remembers of it, None if nothing
    ran."""
    for arg, t in (("a", a), ("b", b), ("out", out)):
        check_aligned(OP_BF16_GEMM_NT, arg, t)
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or (adds and k == 0):
        return None
    if nothing_to_launch(out, m, n, k):
        return None
    device = device_ordinal(a)
    with torch.cuda.device(device):
        loaded = kernel_for(
            OP_BF16_GEMM_NT, m, n, k, device, kernel, d_dtype=D_DTYPES[out.dtype], adds=adds, layout=layout_of(a, b)
        )
        stream = current_stream(a)
        operands = {"a": a, "b": b, "d": out}
        workspace, extents = split_k.bind(loaded, operands, a.device, stream, m, n, k, k_splits, _fail)
        prepared = launch(loaded, operands, extents=extents, stream=stream)
    return Launched(loaded, prepared, _OPERANDS, fixed=workspace)


# Split-K launches are remembered with their stream's workspace.
_calls = CallCache(OP_BF16_GEMM_NT, stream_scratch.capturing)


def _impl(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> torch.Tensor:
    call, key = _calls.find((a, b), kernel_name, k_splits)
    if call is not None:
        out = call.new_output()
        if call.relaunch((a, b, out), current_stream(a)):
            return out
    m, n, _ = check_meta(a, b, None)
    out = new_bf16_out(a, m, n)
    _calls.remember(key, _run(a, b, out, kernel_name, k_splits=k_splits), new_output=out)
    return out


def _out_impl(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> None:
    call, key = _calls.find((a, b, out), kernel_name, k_splits)
    if call is not None and call.relaunch((a, b, out), current_stream(a)):
        return
    check_meta(a, b, out)
    check_disjoint(OP_BF16_GEMM_NT, {"out": out}, {"a": a, "b": b})
    ran = _run(a, b, out, kernel_name, k_splits=k_splits)
    _calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, b, out))


def _fake(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> torch.Tensor:
    m, n, _ = check_meta(a, b, None)
    return new_bf16_out(a, m, n)


def _out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> None:
    check_meta(a, b, out)


def _accumulate_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> None:
    check_meta(a, b, out)


_accumulations = CallCache(f"{OP_BF16_GEMM_NT}_accumulate", stream_scratch.capturing)


def _accumulate_impl(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "", k_splits: int = 0) -> None:
    call, key = _accumulations.find((a, b, out), kernel_name, k_splits)
    if call is not None and call.relaunch((a, b, out), current_stream(a)):
        return
    check_meta(a, b, out)
    check_disjoint(OP_BF16_GEMM_NT, {"out": out}, {"a": a, "b": b})
    ran = _run(a, b, out, kernel_name, adds=True, k_splits=k_splits)
    _accumulations.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, b, out))


# The schema's string argument is `kernel_name`, not `kernel`: Inductor's FallbackKernel.create()
# takes a parameter named `kernel`, and an op argument of that name breaks torch.compile lowering.
BF16_GEMM_NT = TorchOp(OP_BF16_GEMM_NT, _impl, _fake)
BF16_GEMM_NT_OUT = TorchOp(f"{OP_BF16_GEMM_NT}_out", _out_impl, _out_fake, mutates=("out",))
# out += A·Bᵀ (D = C + A·Bᵀ once C is in D).
BF16_GEMM_NT_ACCUMULATE = TorchOp(f"{OP_BF16_GEMM_NT}_accumulate", _accumulate_impl, _accumulate_fake, mutates=("out",))


def _is_same_matrix(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype


def bf16_gemm_nt(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, c: torch.Tensor | None = None,
    kernel: str | None = None, k_splits: int | None = None,
) -> torch.Tensor:
    """D[M, N] = A[M, K] @ B[N, K]^T (+ C), fp32 accumulation, bf16 or fp32 D; see the module docstring.

    ``kernel`` forces a catalogue kernel by name (testing, benchmarking); by default the
    heuristic (or the tuning table) chooses. ``k_splits`` sets how many CTAs share each tile's
    128-wide K blocks when the kernel splits K (epilogue ``split_k_tma_store``; by default the
    heuristic's count; rounded so that no split is empty); not with ``c``.
    """
    # The tensors are checked by the op itself (once per call layout), naming each argument.
    check_kernel_name(OP_BF16_GEMM_NT, kernel)
    if k_splits is not None and (isinstance(k_splits, bool) or not isinstance(k_splits, int) or k_splits < 1):
        raise _fail("k_splits", f"must be a positive int or None, got {k_splits!r}")
    if c is None:
        if out is None:
            return BF16_GEMM_NT.call(a, b, kernel or "", k_splits or 0)
        BF16_GEMM_NT_OUT.call(a, b, out, kernel or "", k_splits or 0)
        return out
    if not isinstance(c, torch.Tensor):
        raise _fail("c", f"must be a torch.Tensor or None, got {type(c).__name__}")
    if out is None:
        check_meta(a, b, None, c)
        out = torch.empty_strided(tuple(c.shape), bf16_out_strides(c.shape[1], c.element_size()), dtype=c.dtype, device=c.device)
        out.copy_(c)
    elif not (isinstance(out, torch.Tensor) and _is_same_matrix(c, out)):
        check_meta(a, b, out, c)
        check_disjoint(OP_BF16_GEMM_NT, {"out": out}, {"c": c})
        out.copy_(c)
    BF16_GEMM_NT_ACCUMULATE.call(a, b, out, kernel or "", k_splits or 0)
    return out


__all__ = ["D_DTYPES", "OP_BF16_GEMM_NT", "bf16_gemm_nt", "check_meta", "layout_of", "mn_major"]
