"""PyTorch entry points, registered as torch custom ops (``torch.ops.cutegen.*``).

This is the only runtime module that imports torch. Importing ``cutegen.runtime`` does not import
it: ``cutegen.runtime.bf16_gemm_nt`` loads this module on first access.

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

Bad inputs raise `InputError` naming the argument before anything is launched. The kernel
catalogue is read once per process from ``$CUTEGEN_BUILD_DIR``, ``./build`` or the installed runtime
wheel's prebuilt kernels (`cutegen.runtime.catalogue.resolve_build_dir`; `set_build_dir`
changes it). Kernels launch on ``torch.cuda.current_stream(a.device)``, so the ops compose with
streams, ``torch.compile`` (fake implementations are registered) and CUDA-graph capture (run
each shape once before capturing, so that the kernel is loaded outside the capture).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import driver, heuristics, sm_budget
from .call_cache import CallCache, forget_all
from .catalogue import KernelCatalogue, load_catalogue
from .errors import ArtifactError, InputError, KernelLoadError
from .launch import launch

OP_BF16_GEMM_NT = "bf16_gemm_nt"
ROW_ALIGN_ELEMS = 8  # 16 bytes of bf16
PTR_ALIGN_BYTES = 16
_CHOICE_CACHE_SIZE = 4096

_lock = threading.RLock()
_catalogue: KernelCatalogue | None = None
_build_dir: str | os.PathLike[str] | None = None
# (op, device, M, N, K) -> kernel name; the op is part of the key (shapes repeat across ops).
_choices: dict[tuple[str, int, int, int, int], str] = {}


# ------------------------------------------------------------------------------------------------
# Catalogue and kernel choice


def set_build_dir(build_dir: str | os.PathLike[str] | None) -> None:
    """Use kernels from ``build_dir`` from now on (None: `catalogue.resolve_build_dir`)."""
    global _catalogue, _build_dir
    with _lock:
        _build_dir = build_dir
        _catalogue = None
        _choices.clear()
        forget_all()


def catalogue() -> KernelCatalogue:
    """The process-wide catalogue, opened on first use."""
    global _catalogue
    cat = _catalogue
    if cat is None:
        with _lock:
            if _catalogue is None:
                _catalogue = load_catalogue(_build_dir)
            cat = _catalogue
    return cat


def _candidates(op: str, ordinal: int, scale: str | None = None) -> list[Any]:
    """The catalogue's ``op`` kernels that run on GPU ``ordinal``; with ``scale`` ("f32",
    "ue8m0"), only those taking block scales in that format."""
    cat = catalogue()
    info = driver.device_info(ordinal)
    candidates = [m for m in cat.compatible(op, info.capability) if m.smem_bytes <= info.smem_optin]
    if not candidates:
        built = sorted({f"{e.arch}" for e in cat.entries(op)}) or ["none"]
        raise ArtifactError(
            f"{op}: no kernel in the catalogue at {cat.build_dir} runs on {info.arch} "
            f"({info.name}); kernels of this op are built for: {', '.join(built)}"
        )
    if scale is not None:
        formats = sorted({m.schedule.get("scale", "none") for m in candidates})
        candidates = [m for m in candidates if m.schedule.get("scale") == scale]
        if not candidates:
            raise ArtifactError(
                f"{op}: no kernel taking {scale} scales runs on {info.arch} ({info.name}); the "
                f"catalogue's kernels for this GPU take: {', '.join(formats)}"
            )
    return candidates


def runnable_kernels(op: str, device: int = 0, scale: str | None = None) -> list[str]:
    """Names of the catalogue's ``op`` kernels that run on GPU ``device`` (its architecture and
    shared memory), optionally only those taking ``scale`` block scales; kernels built for other
    architectures, e.g. sm_100a on a Hopper GPU, are left out. Empty when none run there."""
    try:
        return [m.name for m in _candidates(op, device, scale)]
    except ArtifactError:
        return []


def choose_kernel(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None,
) -> str:
    """The name of the kernel the heuristic (or tuning table) picks for this problem and GPU
    (among those taking ``scale`` block scales, when given; ``rows_per_group``: M is that many
    rows per group, as the masked grouped GEMM's groups, see `heuristics.score`)."""
    key = (op, int(device), int(m), int(n), int(k), scale, rows_per_group, sm_budget.budget())
    name = _choices.get(key)
    if name is None:
        info = driver.device_info(device)
        manifest = heuristics.choose(
            op, _candidates(op, device, scale), m, n, k, sm_budget.usable_sms(info.sm_count),
            build_dir=catalogue().build_dir,
            rows_per_group=rows_per_group,
        )
        name = manifest.name
        if len(_choices) >= _CHOICE_CACHE_SIZE:
            _choices.clear()
        _choices[key] = name
    return name


def explain(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None,
) -> list[heuristics.Score]:
    """The heuristic's scored table for this problem on this GPU, best first: the candidates
    `choose_kernel` weighs, scored as it does, with the same ``scale`` and ``rows_per_group``."""
    info = driver.device_info(device)
    return heuristics.explain(
        op, _candidates(op, device, scale), m, n, k, sm_budget.usable_sms(info.sm_count),
        build_dir=catalogue().build_dir,
        rows_per_group=rows_per_group,
    )


def forced_manifest(op: str, forced: str, scale: str | None = None) -> Any:
    """The manifest of the kernel a caller forced by name; InputError unless it is an `op` kernel
    (taking ``scale`` block scales, when given)."""
    cat = catalogue()
    if forced not in cat:
        known = ", ".join(cat.names(op)) or "none"
        raise InputError(
            f"{op}: argument 'kernel' must name a kernel of the catalogue at {cat.build_dir} "
            f"(known {op} kernels: {known}), got {forced!r}"
        )
    manifest = cat.manifest(forced)
    if manifest.op != op:
        raise InputError(f"{op}: argument 'kernel' names {forced!r}, a {manifest.op} kernel")
    if scale is not None and manifest.schedule.get("scale") != scale:
        raise InputError(
            f"{op}: argument 'kernel' names {forced!r}, which takes {manifest.schedule.get('scale')} "
            f"scales, but the scales passed are {scale}"
        )
    return manifest


def _kernel_for(
    op: str, m: int, n: int, k: int, device: int, forced: str, scale: str | None = None,
    rows_per_group: int | None = None,
) -> Any:
    name = (
        forced_manifest(op, forced, scale).name if forced
        else choose_kernel(op, m, n, k, device, scale, rows_per_group)
    )
    return catalogue().load(name, device)


# ------------------------------------------------------------------------------------------------
# Validation


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP_BF16_GEMM_NT}: argument '{arg}' {what}")


def check_matrix(
    op: str, arg: str, t: Any, device: Any | None, dtype: torch.dtype, row_align: int
) -> None:
    """A 2-D CUDA operand of `dtype`, on `device`, unit stride along its last dimension and a row
    stride that is a multiple of `row_align` elements (TMA's 16-byte rule); InputError otherwise."""

    def fail(what: str) -> InputError:
        return InputError(f"{op}: argument '{arg}' {what}")

    if not isinstance(t, torch.Tensor):
        raise fail(f"must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise fail(f"must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise fail(f"must be on {device} (the device of 'a'), got {t.device}")
    if t.dtype != dtype:
        raise fail(f"must be {dtype}, got {t.dtype}")
    if t.dim() != 2:
        raise fail(f"must be 2-D, got {t.dim()}-D with shape {list(t.shape)}")
    rows, cols = t.shape
    if cols > 1 and t.stride(1) != 1:
        raise fail(
            f"must be contiguous along its last dimension (stride(1) == 1), got strides "
            f"{list(t.stride())}"
        )
    if rows > 1 and cols > 0 and t.stride(0) % row_align != 0:
        raise fail(
            f"must have a row stride that is a multiple of {row_align} elements (16 bytes), "
            f"got stride(0) = {t.stride(0)}"
        )


def _check_matrix(arg: str, t: Any, device: Any | None) -> None:
    check_matrix(OP_BF16_GEMM_NT, arg, t, device, torch.bfloat16, ROW_ALIGN_ELEMS)


def _check_meta(a: Any, b: Any, out: Any | None) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
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
    return m, n, k


def check_aligned(op: str, arg: str, t: torch.Tensor | None, align_bytes: int = PTR_ALIGN_BYTES) -> None:
    """InputError unless `t` (when given and not empty) starts at an `align_bytes`-aligned address."""
    if t is None or t.numel() == 0:
        return
    ptr = t.data_ptr()
    if ptr % align_bytes:
        raise InputError(
            f"{op}: argument '{arg}' must start at a {align_bytes}-byte aligned address, got "
            f"0x{ptr:x} (storage offset {t.storage_offset()} elements)"
        )


def _check_pointers(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> None:
    for arg, t in (("a", a), ("b", b), ("out", out)):
        check_aligned(OP_BF16_GEMM_NT, arg, t)


# torch's current stream as a raw handle, without building a torch.cuda.Stream per call.
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: torch.device) -> int:
    """The ``CUstream`` handle of torch's current stream on ``device`` (a capture's, while capturing)."""
    if _raw_current_stream is not None:
        return int(_raw_current_stream(device.index if device.index is not None else torch.cuda.current_device()))
    return torch.cuda.current_stream(device).cuda_stream


def device_ordinal(t: torch.Tensor) -> int:
    """The CUDA ordinal of a tensor's device (the current device for a bare "cuda")."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _out_strides(n: Any) -> tuple[Any, int]:
    return ((n + ROW_ALIGN_ELEMS - 1) // ROW_ALIGN_ELEMS * ROW_ALIGN_ELEMS, 1)


def _new_out(a: torch.Tensor, m: Any, n: Any) -> torch.Tensor:
    return torch.empty_strided((m, n), _out_strides(n), dtype=torch.bfloat16, device=a.device)


# ------------------------------------------------------------------------------------------------
# Running


def _run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel: str) -> Any:
    """Launch; returns (kernel, prepared launch, operand names) for `_calls`, None if nothing ran."""
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return None
    if k == 0:
        out.zero_()
        return None
    device = device_ordinal(a)
    if torch.cuda.current_device() != device:
        with torch.cuda.device(device):
            return _launch(a, b, out, kernel, device, m, n, k)
    return _launch(a, b, out, kernel, device, m, n, k)


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel: str, device: int, m: int, n: int, k: int) -> Any:
    loaded = _kernel_for(OP_BF16_GEMM_NT, m, n, k, device, kernel)
    specs = loaded.manifest.operands
    if len(specs) != 3:
        raise KernelLoadError(
            f"kernel {loaded.name}: a {OP_BF16_GEMM_NT} kernel must declare operands (A, B, D), "
            f"got {[s.name for s in specs]}"
        )
    stream = current_stream(a.device)
    names = tuple(spec.name for spec in specs)
    prepared = launch(loaded, dict(zip(names, (a, b, out))), stream=stream)
    return loaded, prepared, names


_calls = CallCache(OP_BF16_GEMM_NT)


def _remember(key: tuple, ran: Any) -> None:
    if ran is not None:
        _calls.remember(key, *ran)


def _bf16_gemm_nt_impl(a: torch.Tensor, b: torch.Tensor, kernel: str) -> torch.Tensor:
    key = _calls.key((a, b), kernel)
    if key in _calls:
        out = _new_out(a, a.shape[0], b.shape[0])
        if _calls.launch(key, (a, b, out), current_stream(a.device)):
            return out
    m, n, _ = _check_meta(a, b, None)
    _check_pointers(a, b, None)
    out = _new_out(a, m, n)
    _remember(key, _run(a, b, out, kernel))
    return out


def _bf16_gemm_nt_out_impl(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel: str) -> None:
    key = _calls.key((a, b, out), kernel)
    if _calls.launch(key, (a, b, out), current_stream(a.device)):
        return
    _check_meta(a, b, out)
    _check_pointers(a, b, out)
    _remember(key, _run(a, b, out, kernel))


# The schema's string argument is `kernel_name`, not `kernel`: Inductor's FallbackKernel.create()
# takes a parameter named `kernel`, and an op argument of that name breaks torch.compile lowering.
@torch.library.custom_op("cutegen::bf16_gemm_nt", mutates_args=())
def _bf16_gemm_nt_op(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "") -> torch.Tensor:
    return _bf16_gemm_nt_impl(a, b, kernel_name)


@_bf16_gemm_nt_op.register_fake
def _bf16_gemm_nt_fake(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "") -> torch.Tensor:
    m, n, _ = _check_meta(a, b, None)
    return _new_out(a, m, n)


@torch.library.custom_op("cutegen::bf16_gemm_nt_out", mutates_args=("out",))
def _bf16_gemm_nt_out_op(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = ""
) -> None:
    _bf16_gemm_nt_out_impl(a, b, out, kernel_name)


@_bf16_gemm_nt_out_op.register_fake
def _bf16_gemm_nt_out_fake(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kernel_name: str = ""
) -> None:
    _check_meta(a, b, out)


def _plain_eager(*tensors: Any) -> bool:
    """True when calling the implementation directly is indistinguishable from the dispatcher:
    plain tensors, no autograd to record, not tracing, no dispatch mode active. Skipping the
    Python custom-op dispatch saves tens of microseconds per call."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True


def bf16_gemm_nt(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, kernel: str | None = None
) -> torch.Tensor:
    """D[M, N] = A[M, K] @ B[N, K]^T in bf16 (fp32 accumulation); see the module docstring.

    ``kernel`` forces a catalogue kernel by name (testing, benchmarking); by default the
    heuristic (or the tuning table) chooses. In plain eager mode the implementation is called
    directly; under ``torch.compile``, autograd, tensor subclasses or dispatch modes the call goes
    through the registered ``torch.ops.cutegen`` ops.
    """
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if kernel is not None and not isinstance(kernel, str):
        raise _fail("kernel", f"must be a kernel name (str) or None, got {type(kernel).__name__}")
    if out is not None and not isinstance(out, torch.Tensor):
        raise _fail("out", f"must be a torch.Tensor or None, got {type(out).__name__}")
    if _plain_eager(a, b, out):
        if out is None:
            return _bf16_gemm_nt_impl(a, b, kernel or "")
        _bf16_gemm_nt_out_impl(a, b, out, kernel or "")
        return out
    if out is None:
        return torch.ops.cutegen.bf16_gemm_nt(a, b, kernel or "")
    torch.ops.cutegen.bf16_gemm_nt_out(a, b, out, kernel or "")
    return out


__all__ = [
    "runnable_kernels",
    "bf16_gemm_nt",
    "catalogue",
    "choose_kernel",
    "explain",
    "set_build_dir",
]
