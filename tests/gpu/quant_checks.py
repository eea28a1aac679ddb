"""Data and byte comparisons the quantize kernels' GPU tests share (`test_quant.py`, `test_fp4_quant.py`)."""

from __future__ import annotations

import torch


def data(m: int, k: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Normal values times magnitudes 1e-6 .. 1e4 (per element), on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    mag = torch.pow(10.0, torch.randint(-6, 5, (m, k), device="cuda", generator=g).float())
    return (x * mag).to(dtype)


def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g = torch.empty(got.shape, dtype=got.dtype, device=got.device).copy_(got).view(-1).view(torch.uint8)
    w = torch.empty(want.shape, dtype=want.dtype, device=want.device).copy_(want).view(-1).view(torch.uint8)
    diff = (g != w).nonzero().reshape(-1)
    assert diff.numel() == 0, (
        f"{what}: {diff.numel()} bytes differ, first at byte {int(diff[0])} of the row-major "
        f"view: got 0x{int(g[diff[0]]):02x}, want 0x{int(w[diff[0]]):02x}"
    )
