"""DeepGEMM's numeric checks (``deep_gemm.testing``): calc_diff, count_bytes, assert_bitwise_equal."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float | torch.Tensor:
    """1 - 2·Σxy / Σ(x² + y²) in float64: 0 for equal tensors, FP8 GEMMs pass below 1e-3."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:  # both all zero
        return 0.0
    return 1 - 2 * (x * y).sum() / denominator


def count_bytes(*tensors) -> int:
    """Bytes held by the tensors (nested tuples and lists included; None counts 0)."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """AssertionError naming the first differing byte unless x and y have the same bytes."""
    assert x.shape == y.shape, f"shapes differ: {list(x.shape)} vs {list(y.shape)}"
    assert x.dtype == y.dtype, f"dtypes differ: {x.dtype} vs {y.dtype}"
    xb, yb = x.contiguous().view(torch.uint8).flatten(), y.contiguous().view(torch.uint8).flatten()
    if torch.equal(xb, yb):
        return
    mismatch = xb != yb
    first = int(mismatch.nonzero()[0].item())
    element = first // x.element_size()
    raise AssertionError(
        f"bitwise mismatch{f' ({label})' if label else ''}: {int(mismatch.sum().item())} of {mismatch.numel()} "
        f"bytes differ, first at byte {first} (element {element}: {x.flatten()[element].item()} vs "
        f"{y.flatten()[element].item()})"
    )


__all__ = ["assert_bitwise_equal", "calc_diff", "count_bytes"]
