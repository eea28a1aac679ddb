"""Input checks shared by the torch ops: matrices TMA can read, extents the kernels index, aligned base addresses, outputs that share no memory; each failure an `InputError` naming the argument."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .errors import InputError, shared_memory_error
from .params import byte_span, overlaps_itself

PTR_ALIGN_BYTES = 16  # TMA's rule for a global base address
# The kernels index every mode with a signed 32-bit integer.
MAX_EXTENT = (1 << 31) - 1


def checks_under(op: str, base_op: str, check: Callable[[], Any]) -> Any:
    """`check()`, a plain op's checks, with its errors naming `op` (an op built on `base_op`, e.g.
    a fused epilogue's) instead: the messages are otherwise the plain op's."""
    try:
        return check()
    except InputError as exc:
        raise InputError(str(exc).replace(f"{base_op}:", f"{op}:", 1)) from None


def check_kernel_name(op: str, kernel: Any) -> None:
    """InputError unless `kernel` (an entry point's ``kernel=``) is a kernel name or None."""
    if kernel is not None and not isinstance(kernel, str):
        raise InputError(f"{op}: argument 'kernel' must be a kernel name (str) or None, got {type(kernel).__name__}")


def check_extents(op: str, arg: str, t: torch.Tensor) -> None:
    """InputError when a mode of `t` is longer than a kernel can index (2^31 - 1)."""
    for dim, size in enumerate(t.shape):
        if size > MAX_EXTENT:
            raise InputError(
                f"{op}: argument '{arg}' has {size} elements along mode {dim} (shape {list(t.shape)}); the "
                f"kernels index at most {MAX_EXTENT} (2^31 - 1): split the problem"
            )


def check_not_overlapping_itself(op: str, arg: str, t: torch.Tensor) -> None:
    """InputError when two elements of the output `t` share memory (a row stride under its width,
    a broadcast mode): the kernel's writes would race."""
    if overlaps_itself(t.shape, t.stride()):
        raise InputError(
            f"{op}: argument '{arg}' must not overlap itself: its strides {list(t.stride())} for shape "
            f"{list(t.shape)} put two elements at one address (an output needs a row stride of at least "
            "its width and no mode of stride 0)"
        )


def span_of(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to just past its last."""
    return byte_span(t.shape, t.stride(), 8 * t.element_size())


def check_disjoint(op: str, outputs: dict[str, Any], inputs: dict[str, Any]) -> None:
    """InputError when an output shares memory with an input or another output (the inputs and
    outputs given as name -> tensor or (tensor, span in bytes) where the kernel writes past the
    tensor's own span)."""
    def extent(value: Any) -> tuple[int, int]:
        t, span = value if isinstance(value, tuple) else (value, None)
        return t.data_ptr(), span_of(t) if span is None else span

    placed = {name: extent(v) for name, v in inputs.items() if v is not None}
    for name, value in outputs.items():
        start, span = extent(value)
        for other, (other_start, other_span) in placed.items():
            if span and other_span and start < other_start + other_span and other_start < start + span:
                raise shared_memory_error(op, name, other, start, span, other_start, other_span)
        placed[name] = (start, span)


def check_matrix(
    op: str, arg: str, t: Any, device: Any | None, dtype: torch.dtype, row_align: int
) -> None:
    """A 2-D CUDA operand of `dtype`, on `device`, unit stride along its last dimension and a row
    stride that is a multiple of `row_align` elements (TMA's alignment rule); InputError otherwise."""

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
    check_extents(op, arg, t)
    rows, cols = t.shape
    if cols > 1 and t.stride(1) != 1:
        raise fail(
            f"must be contiguous along its last dimension (stride(1) == 1), got strides "
            f"{list(t.stride())}"
        )
    if rows > 1 and cols > 0 and t.stride(0) % row_align != 0:
        raise fail(
            f"must have a row stride that is a multiple of {row_align} elements ({row_align * t.element_size()} bytes), "
            f"got stride(0) = {t.stride(0)}"
        )


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


def check_expected_k(op: str, expected_k: Any) -> None:
    """InputError unless ``expected_k`` (the k-grouped GEMMs' hint of the tokens per group) is None
    or a non-negative int."""
    if expected_k is not None and (isinstance(expected_k, bool) or not isinstance(expected_k, int) or expected_k < 0):
        raise InputError(f"{op}: argument 'expected_k' must be a non-negative int (a hint for the kernel choice) "
                         f"or None, got {expected_k!r}")


__all__ = [
    "MAX_EXTENT",
    "PTR_ALIGN_BYTES",
    "check_aligned",
    "check_disjoint",
    "check_expected_k",
    "check_extents",
    "check_matrix",
    "check_not_overlapping_itself",
    "span_of",
]
