"""DeepGEMM's pure-torch quantize and packing helpers (``deep_gemm.utils.math``), same results.

These are the reference casts DeepGEMM's tests and engines use to make operands: per token
(1 x gran_k along K), per channel (gran_k x 1 along the rows), per 128x128 block, to FP8 e4m3
with fp32 scales s = max(amax, 1e-4) / 448 (rounded up to a power of two with ``use_ue8m0``),
and the FP4 (e2m1) casts. `per_token_cast_to_fp8` and `per_block_cast_to_fp8` run on cutegen's
quantize kernels where those compute the same thing (bf16 CUDA input, gran_k 128, fp32 scales,
K a multiple of 16); everything else is computed here in torch.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
AMAX_FLOOR = 1e-4
# e2m1 magnitudes and the midpoints between them (round to nearest, ties to the lower code).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """|x| rounded up to a power of two (the UE8M0 value), exponent clamped to [1, 254]."""
    bits = x.abs().float().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exponent.clamp(1, 254) << 23).view(torch.float32)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales [..., 4j] -> their exponent bytes packed four per int32 [..., j]."""
    if x.dtype != torch.float32 or x.size(-1) % 4:
        raise ValueError(f"pack_ue8m0_to_int: 'x' must be fp32 with a last dimension divisible by 4, got {x.dtype} {list(x.shape)}")
    bits = x.view(torch.int32)
    if not bool(((bits >= 0) & (bits & 0x7FFFFF == 0)).all()):
        raise ValueError("pack_ue8m0_to_int: 'x' must hold non-negative powers of two (UE8M0 values)")
    return (bits >> 23).to(torch.uint8).view(torch.int32)


def unpack_ue8m0_from_int(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_ue8m0_to_int`: int32 words -> four fp32 powers of two each."""
    return (packed.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def _scales(amax: torch.Tensor, limit: float, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(min=AMAX_FLOOR) / limit
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def _kernel_backed(x: torch.Tensor, use_ue8m0: bool, gran_k: int) -> bool:
    return (
        x.is_cuda and x.dtype == torch.bfloat16 and x.dim() == 2 and gran_k == 128 and not use_ue8m0
        and x.size(1) % 16 == 0 and x.stride(1) == 1 and x.size(0) > 0 and x.size(1) > 0
    )


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], scales [M, ceil(K/gran_k)] fp32, or packed int32 with
    ``use_packed_ue8m0``), one scale per row and gran_k columns, row-major."""
    if x.dim() != 2:
        raise ValueError(f"per_token_cast_to_fp8: 'x' must be 2-D [M, K], got {list(x.shape)}")
    if _kernel_backed(x, use_ue8m0, gran_k) and not use_packed_ue8m0:
        from cutegen.runtime import quant_ops

        return quant_ops.per_token_quant_fp8(x, scale_layout="k-major", eps=AMAX_FLOOR)
    m, k = x.shape
    padded = torch.zeros((m, align(k, gran_k)), dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    blocks = padded.view(m, -1, gran_k)
    sf = _scales(blocks.abs().float().amax(dim=2), FP8_MAX, use_ue8m0)
    q = (blocks * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, -1)[:, :k].contiguous()
    return q, pack_ue8m0_to_int(sf) if use_packed_ue8m0 else sf


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [K, N] (K a multiple of gran_k) -> (e4m3 [K, N], scales fp32 [K/gran_k, N]): one scale
    per column and gran_k rows."""
    if x.dim() != 2 or x.size(0) % gran_k:
        raise ValueError(f"per_channel_cast_to_fp8: 'x' must be 2-D with rows a multiple of {gran_k}, got {list(x.shape)}")
    k, n = x.shape
    blocks = x.view(-1, gran_k, n)
    sf = _scales(blocks.abs().float().amax(dim=1), FP8_MAX, use_ue8m0)
    return (blocks * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(k, n), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (e4m3 [N, K], scales fp32 [ceil(N/gran_k), ceil(K/gran_k)]): one scale per
    gran_k x gran_k block."""
    if x.dim() != 2:
        raise ValueError(f"per_block_cast_to_fp8: 'x' must be 2-D [N, K], got {list(x.shape)}")
    if _kernel_backed(x, use_ue8m0, gran_k):
        from cutegen.runtime import quant_ops

        return quant_ops.per_block_quant_fp8(x, eps=AMAX_FLOOR)
    n, k = x.shape
    padded = torch.zeros((align(n, gran_k), align(k, gran_k)), dtype=x.dtype, device=x.device)
    padded[:n, :k] = x
    blocks = padded.view(-1, gran_k, padded.size(1) // gran_k, gran_k)
    sf = _scales(blocks.abs().float().amax(dim=(1, 3), keepdim=True), FP8_MAX, use_ue8m0)
    q = (blocks * (1.0 / sf)).to(torch.float8_e4m3fn).view_as(padded)[:n, :k].contiguous()
    return q, sf.view(blocks.size(0), blocks.size(2))


def per_custom_dims_cast_to_fp8(x: torch.Tensor, dims: tuple, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per index of ``dims`` (the amax over every other dimension)."""
    reduced = tuple(i for i in range(x.dim()) if i not in set(dims))
    sf = _scales(x.abs().float().amax(dim=reduced, keepdim=True), FP8_MAX, use_ue8m0)
    return (x * (1.0 / sf)).to(torch.float8_e4m3fn), sf.squeeze()


def _fp4_codes(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (int8, sign in bit 3) of x, rounded to the nearest value; -0 becomes +0."""
    magnitude = torch.zeros_like(x, dtype=torch.uint8)
    ax = x.abs()
    for boundary in FP4_MIDPOINTS:
        magnitude += (ax > boundary).to(torch.uint8)
    negative = (x < 0) & (magnitude != 0)
    return (magnitude | (negative.to(torch.uint8) << 3)).view(torch.int8)


def per_token_cast_to_fp4(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K even) -> (two e2m1 codes per int8 byte [M, K/2], low nibble first; scales
    [M, ceil(K/gran_k)] with s = max(amax, 1e-4) / 6, packed UE8M0 words with
    ``use_packed_ue8m0``, padded with 1.0 to a multiple of four scales)."""
    m, k = x.shape
    if k % 2:
        raise ValueError(f"per_token_cast_to_fp4: 'x' must have an even number of columns, got {k}")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("per_token_cast_to_fp4: use_packed_ue8m0 needs use_ue8m0")
    padded_k = align(k, gran_k)
    padded = torch.zeros((m, padded_k), dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    blocks = padded.view(m, -1, gran_k)
    sf = _scales(blocks.abs().float().amax(dim=2), FP4_MAX, use_ue8m0)
    codes = _fp4_codes(blocks * (1.0 / sf.unsqueeze(2))).view(m, padded_k // 2, 2)
    packed = ((codes[:, :, 0] & 0x0F) | ((codes[:, :, 1] & 0x0F) << 4))[:, : k // 2].contiguous()
    if use_packed_ue8m0:
        pad = align(sf.size(-1), 4) - sf.size(-1)
        if pad:
            sf = torch.nn.functional.pad(sf, (0, pad), value=1.0)
        return packed, pack_ue8m0_to_int(sf)
    return packed, sf


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """The transpose of a packed-e2m1 matrix [M, K/2] (M even): [K, M/2], packed the same way."""
    if a.dtype != torch.int8 or a.dim() != 2 or a.size(0) % 2:
        raise ValueError(f"transpose_packed_fp4: 'a' must be a 2-D int8 tensor with an even row count, got {a.dtype} {list(a.shape)}")
    m, half_k = a.shape
    codes = torch.empty((m, 2 * half_k), device=a.device, dtype=torch.int8)
    codes[:, 0::2], codes[:, 1::2] = a & 0x0F, (a >> 4) & 0x0F
    pairs = codes.t().contiguous().view(2 * half_k, m // 2, 2)
    return ((pairs[:, :, 0] & 0x0F) | ((pairs[:, :, 1] & 0x0F) << 4)).contiguous()


def cast_back_from_fp4(packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Packed e2m1 [M, K/2] and its scales -> fp32 [M, K]."""
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    m, half_k = packed.shape
    codes = torch.zeros((m, 2 * half_k), dtype=torch.int8, device=packed.device)
    codes[:, 0::2], codes[:, 1::2] = packed & 0x0F, (packed >> 4) & 0x0F
    table = torch.tensor(FP4_VALUES, device=packed.device, dtype=torch.float32)
    index = (codes & 0x07).to(torch.int64)
    values = torch.where(((codes & 0x08) != 0) & (index != 0), -table[index], table[index])
    return values * sf[:, torch.arange(2 * half_k, device=packed.device) // gran_k]


__all__ = [
    "align",
    "cast_back_from_fp4",
    "ceil_div",
    "ceil_to_ue8m0",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "transpose_packed_fp4",
    "unpack_ue8m0_from_int",
]
