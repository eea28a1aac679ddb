"""PyTorch entry points of the M-grouped (mixture-of-experts) BF16 GEMMs: contiguous and masked layouts.

``m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=None, *, zero_padding=True)`` is
DeepGEMM's op of the same name: for every row r of A with group g = m_indices[r] ≥ 0,
D[r] = A[r] @ B[g]ᵀ in bf16 with fp32 accumulation.

* ``a`` [ΣM, K] bf16, K-major with a 16-byte aligned row stride: every group's rows back to back,
  each group's segment padded to a multiple of `contiguous_alignment()` rows (128).
* ``b`` [G, N, K] bf16, contiguous along K with 16-byte aligned row and group strides; or
  MN-major, a view of [G, K, N] storage (``w.transpose(1, 2)``, DeepGEMM's ``nn`` form), read as
  it lies (kernels of layout ``nn``).
* ``m_indices`` int32 [ΣM] on the GPU: each row's group, -1 for padding rows
  (`m_indices_from_group_ends` builds it from cumulative group ends, on the GPU).
* ``out`` (optional) bf16 [ΣM, N], contiguous along N with a 16-byte aligned row stride.
* Padding rows of D are written as zeros; ``zero_padding=False`` opts out: tiles made only of
  padding rows are then neither computed nor written, and padding rows inside a tile hold
  unspecified values.

Not checked (device data, no host synchronisation): that every value of ``m_indices`` is -1 or a
valid group and that each aligned 128-row block holds one group's rows (plus trailing padding).
The kernel takes a block's group from its first row; a value outside [0, G) marks its row as
padding, like -1: B is never read for it and its row of D is written as zeros.

``m_grouped_bf16_gemm_nt_masked(a, b, masked_m, expected_m, out=None)`` is DeepGEMM's decode
layout: ``a`` [G, max_m, K] bf16 (contiguous along K, 16-byte aligned strides), ``b`` as above,
``masked_m`` int32 [G] on the GPU: rows [0, masked_m[g]) of group g are real. Only their tiles
are scheduled (on the GPU); groups with 0 rows cost nothing; rows of D at or past masked_m[g] are
unspecified within the group's last tile and untouched beyond it. ``expected_m`` only guides the
kernel choice. Nothing reads ``masked_m`` on the host, so the call is CUDA-graph capturable. A
count past max_m is taken as max_m, a negative one as 0.

``k_grouped_bf16_gemm_tn_contiguous(a, b, d, group_sizes, c=None, *, expected_k=None)`` is
DeepGEMM's MoE weight gradient in BF16: for every group g with k_g = group_sizes[g] tokens,
D[g] (fp32 [M, N]) = C[g] + A_gᵀ · B_g over the group's rows of ``a`` [Σk, M] and ``b`` [Σk, N]
(bf16, contiguous, tokens first: groups one after another; M and N multiples of 8; Σk a multiple
of 128). ``d`` fp32 [G, M, N], contiguous along N, accumulated in place (C = D) unless ``c`` is
given, in which case D is first set to C. ``group_sizes`` int32 [G] on the GPU, never read by the
host (graph-capturable); each k_g must be a multiple of 128, which is not checked (device data):
the kernel takes ⌈k_g/128⌉ blocks of 128 tokens, cut to the Σk/128 the operands hold, so a wrong
size never reads or writes out of bounds. Groups with 0 tokens leave D[g] as it is. A
per-launch descriptor workspace is kept per stream (`k_grouped_ops.descriptor_workspace`).
Ran on an H200 on 2026-12-05.

The M-grouped ops with K == 0 write zeros (an empty sum) and launch nothing. All: bad inputs raise
`InputError` naming the argument before anything is launched; kernels launch on torch's current stream of
``a``'s device; ``kernel`` forces a catalogue kernel by name. sm_90a kernels only.
"""

from __future__ import annotations

from typing import Any

import torch

from . import stream_scratch
from .call_cache import CallCache, Launched
from .checks import (
    check_aligned, check_disjoint, check_expected_k, check_extents, check_kernel_name, check_matrix,
    check_not_overlapping_itself,
)
from .errors import InputError, KernelLoadError
from .grouped_ops import M_ALIGNMENT
from .k_grouped_ops import check_sizes_and_output, descriptor_workspace, set_d_to_c, workspace_words
from .kernel_choice import kernel_for, masked_rows_per_group
from .launch import launch
from .torch_ops import ROW_ALIGN_ELEMS, TorchOp, current_stream, device_ordinal, new_bf16_group_out, new_bf16_out

OP_CONTIGUOUS = "m_grouped_bf16_gemm_nt_contiguous"
OP_MASKED = "m_grouped_bf16_gemm_nt_masked"


def _failure(op: str):
    def fail(arg: str, what: str) -> InputError:
        return InputError(f"{op}: argument '{arg}' {what}")

    return fail


_fail = _failure(OP_CONTIGUOUS)
_fail_masked = _failure(OP_MASKED)


def experts_mn_major(b: torch.Tensor) -> bool:
    """Whether B [G, N, K] is MN-major (each expert's N contiguous: a view of [G, K, N] storage,
    DeepGEMM's nn form) rather than K-major."""
    _, n, k = b.shape
    return k > 1 and b.stride(2) != 1 and (n == 1 or b.stride(1) == 1)


def _check_grouped(fail, op: str, arg: str, t: Any, device: Any | None, rows: int | None = None,
                   mn_major_ok: bool = False) -> tuple[int, int, int]:
    """A bf16 [G, X, K] CUDA operand contiguous along K with 16-byte aligned row and group strides
    (on `device`; with G == `rows` when given), or with `mn_major_ok` contiguous along X with a
    16-byte aligned stride between its K columns; returns its shape."""
    if not isinstance(t, torch.Tensor):
        raise fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda" or (device is not None and t.device != device):
        raise fail(arg, f"must be a CUDA tensor on {device if device is not None else 'a GPU'}, got {t.device}")
    if t.dtype != torch.bfloat16 or t.dim() != 3:
        raise fail(arg, f"must be a torch.bfloat16 tensor of rank 3, got {t.dtype} {list(t.shape)}")
    check_extents(op, arg, t)
    g, x, k = t.shape
    if mn_major_ok and experts_mn_major(t):
        if t.stride(2) % ROW_ALIGN_ELEMS or (g > 1 and t.stride(0) % ROW_ALIGN_ELEMS):
            raise fail(arg, f"is MN-major (unit stride along N) and must have 16-byte aligned strides between its "
                            f"K columns and groups, got strides {list(t.stride())}")
    elif (k > 1 and t.stride(2) != 1) or (x > 1 and t.stride(1) % ROW_ALIGN_ELEMS) or (g > 1 and t.stride(0) % ROW_ALIGN_ELEMS):
        raise fail(arg, f"must be contiguous along its last dimension{' (or along N)' if mn_major_ok else ''} with "
                        f"16-byte aligned row and group strides, got strides {list(t.stride())}")
    if rows is not None and g != rows:
        raise fail(arg, f"must have G = {rows} groups, got shape {list(t.shape)}")
    return g, x, k


# ---- contiguous layout ------------------------------------------------------------------------
def check_contiguous(a: Any, b: Any, m_indices: Any, out: Any | None) -> tuple[int, int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (ΣM, N, K, G)."""
    check_matrix(OP_CONTIGUOUS, "a", a, None, torch.bfloat16, ROW_ALIGN_ELEMS)
    m, k = a.shape
    g, n, kb = _check_grouped(_fail, OP_CONTIGUOUS, "b", b, a.device, mn_major_ok=True)
    if kb != k:
        raise _fail("b", f"must be [G, N, K] with K = a.shape[1] = {k}, got shape {list(b.shape)}")
    if m % M_ALIGNMENT:
        raise _fail("a", f"must have ΣM a multiple of {M_ALIGNMENT} (each group's segment is aligned), got {m} rows")
    if not isinstance(m_indices, torch.Tensor) or m_indices.device != a.device:
        raise _fail("m_indices", f"must be a tensor on {a.device}")
    if m_indices.dtype != torch.int32 or tuple(m_indices.shape) != (m,) or (m > 1 and m_indices.stride(0) != 1):
        raise _fail("m_indices", f"must be a contiguous int32 [ΣM] = [{m}] tensor, got {m_indices.dtype} {list(m_indices.shape)}")
    if out is not None:
        check_matrix(OP_CONTIGUOUS, "out", out, a.device, torch.bfloat16, ROW_ALIGN_ELEMS)
        if tuple(out.shape) != (m, n):
            raise _fail("out", f"must have shape [ΣM, N] = [{m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP_CONTIGUOUS, "out", out)
    return m, n, k, g


_CONTIGUOUS_OPERANDS = ("a", "b", "d", "m_indices")


def _run_contiguous(a, b, m_indices, out, zero_padding: bool, kernel: str) -> Launched | None:
    """Launch; returns what `_calls` remembers of it, None when nothing was launched."""
    m, k = a.shape
    g, n, _ = b.shape
    if m == 0 or n == 0:
        return None
    if g == 0 or k == 0:
        # No group to read (every row is padding) or an empty sum: D is zeros.
        if zero_padding or k == 0:
            out.zero_()
        return None
    for arg, t in (("a", a), ("b", b), ("out", out)):
        check_aligned(OP_CONTIGUOUS, arg, t)
    device = device_ordinal(a)
    with torch.cuda.device(device):
        loaded = kernel_for(OP_CONTIGUOUS, m, n, k, device, kernel, layout="nn" if experts_mn_major(b) else "nt")
        names = sorted(s.name for s in loaded.manifest.operands)
        if names != sorted(_CONTIGUOUS_OPERANDS):
            raise KernelLoadError(f"kernel {loaded.name}: unexpected operands {names} for {OP_CONTIGUOUS}")
        operands = dict(zip(_CONTIGUOUS_OPERANDS, (a, b, out, m_indices)))
        prepared = launch(loaded, operands, extents={"ZERO_PADDING": 1 if zero_padding else 0}, stream=current_stream(a))
    return Launched(loaded, prepared, _CONTIGUOUS_OPERANDS)


_calls = CallCache(OP_CONTIGUOUS)


def _contiguous(a, b, m_indices, out, zero_padding: bool, kernel: str) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, b, m_indices) if out is None else (a, b, m_indices, out)
    call, key = _calls.find(tensors, zero_padding, kernel)
    if call is not None:
        d = out if out is not None else call.new_output()
        if call.relaunch((a, b, d, m_indices), current_stream(a)):
            return d
    m, n, _, _ = check_contiguous(a, b, m_indices, out)
    if out is None:
        d = new_bf16_out(a, m, n)
        _calls.remember(key, _run_contiguous(a, b, m_indices, d, zero_padding, kernel), new_output=d)
        return d
    check_disjoint(OP_CONTIGUOUS, {"out": out}, {"a": a, "b": b, "m_indices": m_indices})
    ran = _run_contiguous(a, b, m_indices, out, zero_padding, kernel)
    _calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, b, out, m_indices))
    return out


def _contiguous_impl(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor, zero_padding: bool = True,
                     kernel_name: str = "") -> torch.Tensor:
    return _contiguous(a, b, m_indices, None, zero_padding, kernel_name)


def _contiguous_fake(a, b, m_indices, zero_padding: bool = True, kernel_name: str = ""):
    m, n, _, _ = check_contiguous(a, b, m_indices, None)
    return new_bf16_out(a, m, n)


def _contiguous_out_impl(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor, out: torch.Tensor,
                         zero_padding: bool = True, kernel_name: str = "") -> None:
    _contiguous(a, b, m_indices, out, zero_padding, kernel_name)


def _contiguous_out_fake(a, b, m_indices, out, zero_padding: bool = True, kernel_name: str = "") -> None:
    check_contiguous(a, b, m_indices, out)


CONTIGUOUS = TorchOp(OP_CONTIGUOUS, _contiguous_impl, _contiguous_fake)
CONTIGUOUS_OUT = TorchOp(f"{OP_CONTIGUOUS}_out", _contiguous_out_impl, _contiguous_out_fake, mutates=("out",))


def m_grouped_bf16_gemm_nt_contiguous(
    a: torch.Tensor,
    b: torch.Tensor,
    m_indices: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    zero_padding: bool = True,
    kernel: str | None = None,
) -> torch.Tensor:
    """Grouped BF16 GEMM over contiguous expert segments; see the module docstring."""
    check_kernel_name(OP_CONTIGUOUS, kernel)
    if out is None:
        return CONTIGUOUS.call(a, b, m_indices, bool(zero_padding), kernel or "")
    CONTIGUOUS_OUT.call(a, b, m_indices, out, bool(zero_padding), kernel or "")
    return out


# ---- masked layout ----------------------------------------------------------------------------
def check_masked(a: Any, b: Any, masked_m: Any, out: Any | None) -> tuple[int, int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (G, max_m, N, K)."""
    g, max_m, k = _check_grouped(_fail_masked, OP_MASKED, "a", a, None)
    _, n, kb = _check_grouped(_fail_masked, OP_MASKED, "b", b, a.device, rows=g)
    if kb != k:
        raise _fail_masked("b", f"must be [G, N, K] with K = a.shape[2] = {k}, got shape {list(b.shape)}")
    if (not isinstance(masked_m, torch.Tensor) or masked_m.device != a.device or masked_m.dtype != torch.int32
            or tuple(masked_m.shape) != (g,)):
        raise _fail_masked("masked_m", f"must be an int32 [G] = [{g}] tensor on {a.device}")
    if out is not None:
        _check_grouped(_fail_masked, OP_MASKED, "out", out, a.device, rows=g)
        if tuple(out.shape) != (g, max_m, n):
            raise _fail_masked("out", f"must have shape [G, max_m, N] = [{g}, {max_m}, {n}], got {list(out.shape)}")
        check_not_overlapping_itself(OP_MASKED, "out", out)
    return g, max_m, n, k


_MASKED_OPERANDS = ("a", "b", "d", "masked_m")


def _run_masked(a, b, masked_m, expected_m: int, out, kernel: str) -> Launched | None:
    """Launch; returns what `_masked_calls` remembers of it, None when nothing was launched."""
    g, max_m, k = a.shape
    n = b.shape[1]
    if g == 0 or max_m == 0 or n == 0:
        return None
    if k == 0:
        out.zero_()
        return None
    for arg, t in (("a", a), ("b", b), ("out", out)):
        check_aligned(OP_MASKED, arg, t)
    device = device_ordinal(a)
    rows = masked_rows_per_group(expected_m, max_m)
    with torch.cuda.device(device):
        # Each group pads its rows to the tile height: the heuristic sees G groups of about `rows`
        # rows, at most max_m.
        loaded = kernel_for(OP_MASKED, rows * g, n, k, device, kernel, rows_per_group=rows, layout="nt",
                            max_rows_per_group=max_m)
        names = sorted(s.name for s in loaded.manifest.operands)
        if names != sorted(_MASKED_OPERANDS):
            raise KernelLoadError(f"kernel {loaded.name}: unexpected operands {names} for {OP_MASKED}")
        operands = dict(zip(_MASKED_OPERANDS, (a, b, out, masked_m)))
        prepared = launch(loaded, operands, stream=current_stream(a))
    return Launched(loaded, prepared, _MASKED_OPERANDS)


_masked_calls = CallCache(OP_MASKED)


def _masked(a, b, masked_m, expected_m: int, out, kernel: str) -> torch.Tensor:
    """Check (once per call layout, `call_cache`), launch, return D."""
    tensors = (a, b, masked_m) if out is None else (a, b, masked_m, out)
    call, key = _masked_calls.find(tensors, expected_m, kernel)
    if call is not None:
        d = out if out is not None else call.new_output()
        if call.relaunch((a, b, d, masked_m), current_stream(a)):
            return d
    g, max_m, n, _ = check_masked(a, b, masked_m, out)
    if out is None:
        d = new_bf16_group_out(a, g, max_m, n)
        _masked_calls.remember(key, _run_masked(a, b, masked_m, expected_m, d, kernel), new_output=d)
        return d
    check_disjoint(OP_MASKED, {"out": out}, {"a": a, "b": b, "masked_m": masked_m})
    ran = _run_masked(a, b, masked_m, expected_m, out, kernel)
    _masked_calls.remember(key, ran and ran._replace(outputs={"d": "out"}), (a, b, out, masked_m))
    return out


def _masked_impl(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                 kernel_name: str = "") -> torch.Tensor:
    return _masked(a, b, masked_m, expected_m, None, kernel_name)


def _masked_fake(a, b, masked_m, expected_m: int, kernel_name: str = ""):
    g, max_m, n, _ = check_masked(a, b, masked_m, None)
    return new_bf16_group_out(a, g, max_m, n)


def _masked_out_impl(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int, out: torch.Tensor,
                     kernel_name: str = "") -> None:
    _masked(a, b, masked_m, expected_m, out, kernel_name)


def _masked_out_fake(a, b, masked_m, expected_m: int, out, kernel_name: str = "") -> None:
    check_masked(a, b, masked_m, out)


MASKED = TorchOp(OP_MASKED, _masked_impl, _masked_fake)
MASKED_OUT = TorchOp(f"{OP_MASKED}_out", _masked_out_impl, _masked_out_fake, mutates=("out",))


def m_grouped_bf16_gemm_nt_masked(
    a: torch.Tensor,
    b: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    out: torch.Tensor | None = None,
    *,
    kernel: str | None = None,
) -> torch.Tensor:
    """Grouped BF16 GEMM over [G, max_m, K] with per-group row counts on the GPU; see the module docstring."""
    check_kernel_name(OP_MASKED, kernel)
    if isinstance(expected_m, bool) or not isinstance(expected_m, int):
        raise _fail_masked("expected_m", f"must be an int (a hint for the kernel choice), got {type(expected_m).__name__}")
    if out is None:
        return MASKED.call(a, b, masked_m, expected_m, kernel or "")
    MASKED_OUT.call(a, b, masked_m, expected_m, out, kernel or "")
    return out


# ---- k-grouped layout (the MoE weight gradient) ------------------------------------------------
OP_K_GROUPED = "k_grouped_bf16_gemm_tn_contiguous"
_fail_k = _failure(OP_K_GROUPED)
# Tokens per block of the k-grouped layout: each group's k is a multiple of it.
K_ALIGNMENT = 128
_K_GROUPED_OPERANDS = ("a", "b", "d", "group_sizes")


def check_k_grouped(a: Any, b: Any, d: Any, group_sizes: Any, c: Any | None) -> tuple[int, int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (G, M, N, Σk)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise _fail_k(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda" or t.dtype != torch.bfloat16 or t.dim() != 2:
            raise _fail_k(arg, f"must be a torch.bfloat16 CUDA tensor [Σk, rows] (tokens first), got {t.dtype} {list(t.shape)} on {t.device}")
        if not t.is_contiguous():
            raise _fail_k(arg, f"must be contiguous (row-major [Σk, rows]), got strides {list(t.stride())}")
        check_extents(OP_K_GROUPED, arg, t)
    if b.device != a.device:
        raise _fail_k("b", f"must be on {a.device} (the device of 'a'), got {b.device}")
    tokens, m = a.shape
    tokens_b, n = b.shape
    if tokens_b != tokens:
        raise _fail_k("b", f"must have Σk = a.shape[0] = {tokens} rows, got {tokens_b}")
    if tokens % K_ALIGNMENT:
        raise _fail_k("a", f"must have Σk a multiple of {K_ALIGNMENT} (every group's k is), got {tokens}")
    for arg, rows in (("a", m), ("b", n)):
        if rows % ROW_ALIGN_ELEMS:
            raise _fail_k(arg, f"must have a multiple of {ROW_ALIGN_ELEMS} columns (its rows are 16-byte aligned for TMA), got {rows}")
    return check_sizes_and_output(OP_K_GROUPED, a.device, group_sizes, d, c, m, n), m, n, tokens


_k_calls = CallCache(OP_K_GROUPED, stream_scratch.capturing)


def _k_grouped(a, b, d, group_sizes, c, expected_k: int | None, kernel: str) -> None:
    tensors = (a, b, d, group_sizes)
    call, key = _k_calls.find(tensors if c is None else (*tensors, c), c is None, expected_k, kernel)
    if call is None:
        g, m, n, tokens = check_k_grouped(a, b, d, group_sizes, c)
        check_disjoint(OP_K_GROUPED, {"d": d}, {"a": a, "b": b, "group_sizes": group_sizes})
    set_d_to_c(d, c)
    if call is not None:
        if call.relaunch(tensors, current_stream(a)):
            return
        g, m, n, tokens = check_k_grouped(a, b, d, group_sizes, c)
    if g == 0 or m == 0 or n == 0 or tokens == 0:
        return
    for arg, t in (("a", a), ("b", b), ("d", d)):
        check_aligned(OP_K_GROUPED, arg, t)
    device = device_ordinal(a)
    # The kernel choice sees the groups' tiles stacked along M over the tokens of one group.
    k_hint = int(expected_k) if expected_k else max(1, tokens // max(g, 1))
    k_hint = max(K_ALIGNMENT, -(-k_hint // K_ALIGNMENT) * K_ALIGNMENT)
    with torch.cuda.device(device):
        loaded = kernel_for(OP_K_GROUPED, m * g, n, k_hint, device, kernel, layout="tn")
        stream = current_stream(a)
        workspace = descriptor_workspace(a.device, stream, workspace_words(loaded.device.sm_count))
        # The GEMM reads A and B as MN-major [M, Σk] and [N, Σk]: views of the tensors themselves.
        operands = dict(zip(_K_GROUPED_OPERANDS, (a.t(), b.t(), d, group_sizes)), workspace=workspace)
        prepared = launch(loaded, operands, stream=stream)
    _k_calls.remember(
        key, Launched(loaded, prepared, _K_GROUPED_OPERANDS, fixed={"workspace": workspace}, outputs={"d": "d"}), tensors
    )


def _k_grouped_impl(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, group_sizes: torch.Tensor,
                    c: torch.Tensor | None = None, expected_k: int = 0, kernel_name: str = "") -> None:
    _k_grouped(a, b, d, group_sizes, c, expected_k or None, kernel_name)


def _k_grouped_fake(a, b, d, group_sizes, c=None, expected_k: int = 0, kernel_name: str = "") -> None:
    check_k_grouped(a, b, d, group_sizes, c)


K_GROUPED = TorchOp(OP_K_GROUPED, _k_grouped_impl, _k_grouped_fake, mutates=("d",))


def k_grouped_bf16_gemm_tn_contiguous(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    group_sizes: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    expected_k: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """MoE weight gradient in BF16 over groups that split the tokens; D is updated in place and
    returned (see the module docstring)."""
    check_kernel_name(OP_K_GROUPED, kernel)
    check_expected_k(OP_K_GROUPED, expected_k)
    K_GROUPED.call(a, b, d, group_sizes, c, expected_k or 0, kernel or "")
    return d


__all__ = [
    "OP_CONTIGUOUS",
    "OP_K_GROUPED",
    "check_k_grouped",
    "k_grouped_bf16_gemm_tn_contiguous",
    "OP_MASKED",
    "check_contiguous",
    "check_masked",
    "experts_mn_major",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
]
