"""Input checks shared by the torch ops: matrices TMA can read, aligned base addresses; each failure an `InputError` naming the argument."""

from __future__ import annotations

from typing import Any

import torch

from .errors import InputError

PTR_ALIGN_BYTES = 16  # TMA's rule for a global base address


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


__all__ = ["PTR_ALIGN_BYTES", "check_aligned", "check_matrix"]
