"""The BF16 GEMM ``bf16_gemm_nt`` (``torch.ops.cutegen.bf16_gemm_nt``): D = A·Bᵀ in bf16 with fp32 accumulation.

``bf16_gemm_nt(a, b, out=None, *, kernel=None)`` computes D[M, N] = A[M, K] @ B[N, K]^T in bf16
with fp32 accumulation (DeepGEMM's ``nt`` convention):

* ``a`` [M, K] and ``b`` [N, K]: ``torch.bfloat16`` CUDA tensors on one device, K-major
  (``stride(1) == 1``), row strides multiples of 8 elements (16 bytes), base addresses 16-byte
  aligned (TMA's rules; a mode of extent 1 is exempt from its stride rule).
* ``out`` (optional): ``torch.bfloat16`` [M, N] on the same device, ``stride(1) == 1``, row stride
  a multiple of 8, 16-byte aligned; written in place and returned.
* Without ``out`` the result is a new [M, N] tensor whose row stride is N rounded up to a
  multiple of 8 (so it is contiguous whenever N % 8 == 0).
* M == 0 or N == 0: nothing is launched. K == 0: the result is zero-filled (an empty sum), nothing
  is launched.
* ``kernel``: force a kernel of the catalogue by name (else the heuristic chooses; see
  `cutegen.runtime.heuristics`).

Bad inputs raise `InputError` naming the argument before anything is launched. Kernels launch
on torch's current stream of ``a``'s device, so the op composes with streams, ``torch.compile``
(a fake implementation is registered) and CUDA-graph capture (run each shape once before
capturing, so that the kernel is loaded outside the capture).
"""

from __future__ import annotations

from typing import Any

import torch

from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_matrix, check_not_overlapping_itself
from .errors import InputError, KernelLoadError
from .kernel_choice import kernel_for
from .launch import launch
from .torch_ops import ROW_ALIGN_ELEMS, TorchOp, current_stream, device_ordinal, new_bf16_out, nothing_to_launch

OP_BF16_GEMM_NT = "bf16_gemm_nt"


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP_BF16_GEMM_NT}: argument '{arg}' {what}")


def _check_matrix(arg: str, t: Any, device: Any | None) -> None:
    check_matrix(OP_BF16_GEMM_NT, arg, t, device, torch.bfloat16, ROW_ALIGN_ELEMS)


def check_meta(a: Any, b: Any, out: Any | None) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    _check_matrix("a", a, None)
    _check_matrix("b", b, a.device)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise _fail("b", f"must have K = a.shape[1] = {k} columns, got shape {list(b.shape)}")
    if out is not None:
        _check_matrix("out", out, a.device)
        if tuple(out.shape) != (m, n):
            raise _fail("out", f"must have shape [M, N] = [{m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP_BF16_GEMM_NT, "out", out)
    return m, n, k


def _run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel: str) -> Launched | None:
    """Launch; returns what `_calls` remembers of it, None if nothing ran."""
    for arg, t in (("a", a), ("b", b), ("out", out)):
        check_aligned(OP_BF16_GEMM_NT, arg, t)
    m, k = a.shape
    n = b.shape[0]
    if nothing_to_launch(out, m, n, k):
        return None
    device = device_ordinal(a)
    with torch.cuda.device(device):
        loaded = kernel_for(OP_BF16_GEMM_NT, m, n, k, device, kernel)
        specs = loaded.manifest.operands
        if len(specs) != 3:
            raise KernelLoadError(
                f"kernel {loaded.name}: a {OP_BF16_GEMM_NT} kernel must declare operands (A, B, D), "
                f"got {[s.name for s in specs]}"
            )
        names = tuple(spec.name for spec in specs)
        prepared = launch(loaded, dict(zip(names, (a, b, out))), stream=current_stream(a))
    return Launched(loaded, prepared, names)


_calls = CallCache(OP_BF16_GEMM_NT)


def _impl(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "") -> torch.Tensor:
    key = _calls.key((a, b), kernel_name)
    call = _calls.get(key)
    if call is not None:
        out = new_bf16_out(a, a.shape[0], b.shape[0])
        if _calls.launch(call, (a, b, out), current_stream(a)):
            return out
    m, n, _ = check_meta(a, b, None)
    out = new_bf16_out(a, m, n)
    _calls.remember(key, _run(a, b, out, kernel_name))
    return out


def _out_impl(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "") -> None:
    key = _calls.key((a, b, out), kernel_name)
    call = _calls.get(key)
    if call is not None and _calls.launch(call, (a, b, out), current_stream(a)):
        return
    check_meta(a, b, out)
    check_disjoint(OP_BF16_GEMM_NT, {"out": out}, {"a": a, "b": b})
    ran = _run(a, b, out, kernel_name)
    _calls.remember(key, ran and ran._replace(outputs={ran.names[2]: "out"}), (a, b, out))


def _fake(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "") -> torch.Tensor:
    m, n, _ = check_meta(a, b, None)
    return new_bf16_out(a, m, n)


def _out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = "") -> None:
    check_meta(a, b, out)


# The schema's string argument is `kernel_name`, not `kernel`: Inductor's FallbackKernel.create()
# takes a parameter named `kernel`, and an op argument of that name breaks torch.compile lowering.
BF16_GEMM_NT = TorchOp(OP_BF16_GEMM_NT, _impl, _fake)
BF16_GEMM_NT_OUT = TorchOp(f"{OP_BF16_GEMM_NT}_out", _out_impl, _out_fake, mutates=("out",))


def bf16_gemm_nt(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, kernel: str | None = None
) -> torch.Tensor:
    """D[M, N] = A[M, K] @ B[N, K]^T in bf16 (fp32 accumulation); see the module docstring.

    ``kernel`` forces a catalogue kernel by name (testing, benchmarking); by default the
    heuristic (or the tuning table) chooses.
    """
    # The tensors are checked by the op itself (once per call layout), naming each argument.
    if kernel is not None and not isinstance(kernel, str):
        raise _fail("kernel", f"must be a kernel name (str) or None, got {type(kernel).__name__}")
    if out is None:
        return BF16_GEMM_NT(a, b, kernel or "")
    BF16_GEMM_NT_OUT(a, b, out, kernel or "")
    return out


__all__ = ["OP_BF16_GEMM_NT", "bf16_gemm_nt", "check_meta"]
