"""Pure-torch reference FP8 quantizers: the executable specification of cutegen's quantize kernels.

Runs on CPU and GPU tensors (torch only). The kernels in `cutegen.templates.hopper_quant` must
produce exactly these bytes; the GPU tests compare bit for bit.

Numerics (DeepSeek-V3 / DeepGEMM convention)
---------------------------------------------
For each group (1x128 along K per token; 128x128 per weight block; 128 tokens per hidden column
in the grouped transposed layout):

* ``amax = max |x|`` over the group's real elements (inputs are widened to fp32 exactly);
* ``s = max(amax, eps) / 448`` in fp32 with IEEE round-to-nearest division; ``eps`` is rounded
  to fp32 first;
* UE8M0 scales: ``s`` is rounded *up* to a power of two, ``2^ceil(log2 s)`` (exact integer
  arithmetic on its bits), and that rounded ``s`` is both used and stored;
* ``inv = 1 / s`` (fp32, round to nearest); ``q = e4m3(clamp(x * inv, -448, 448))`` with the
  product rounded to nearest in fp32 and the cast rounding to nearest even. The explicit clamp is
  what the hardware's ``cvt.rn.satfinite`` does; torch's own cast does not saturate.

NaN / Inf policy (one rule for every op)
----------------------------------------
A group that contains any NaN or +-Inf is *poisoned*: its scale is NaN (the canonical
``0x7FC00000``; UE8M0 byte ``0xFF``, which is UE8M0's NaN) and every real element of the group
is the e4m3 NaN byte ``0x7F``. Other groups are unaffected. Downstream, q * scale is NaN for the
whole group, so a bad input is never silently turned into finite numbers.

Padding
-------
* Partial groups (K or N not a multiple of 128; a group of fewer than 128 tokens): missing
  elements count as zeros in the amax and are not written (per-token, per-block), or are written
  as e4m3 ``0x00`` (grouped transposed, whose rows are padded to 128 tokens) -- also in a
  poisoned block, so padding never yields NaN.
* Scale buffers: padding rows of the MN-major TMA-aligned layout (rows M..align(M,4)-1) are 0
  (fp32 0.0; UE8M0 byte 0), and so are the UE8M0 bytes of groups past ceil(K/128) in the last
  packed word. Scale rows of the grouped layout past the real blocks (when the caller's bound is
  larger) are blocks of zero tokens: q = 0, scale = the scale of an all-zero group.

Scale layouts
-------------
* ``k-major``: fp32 [M, G] row-major, G = ceil(K/128).
* ``mn-major-tma-aligned`` (DeepGEMM's SFA): logical [M, G] with strides ``(1, align(M, 4))``,
  i.e. a [G, align(M, 4)] buffer viewed transposed. `to_mn_major_tma_aligned` converts.
* UE8M0 (``scale_format="ue8m0"``): the exponent bytes ``e = bits(s) >> 23`` (s = 2^(e-127))
  packed four per int32, little-endian: byte ``j`` of word ``(m, k)`` is group ``4k + j``;
  logical int32 [M, ceil(G/4)] in either layout above (``mn-major-tma-aligned`` gives DeepGEMM's
  ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` layout, strides ``(1, align(M, 4))``).

Grouped transposed layout
-------------------------
Input x [T, H], group sizes m_g (sum = T; group g is tokens [sum_{j<g} m_j, ... + m_g)).
With ``P_g = 128 * ceil(m_g / 128)`` and ``B_g = sum_{j<g} ceil(m_j / 128)``: group g's output is
the e4m3 block ``x_g^T`` [H, P_g] row-major (row h = hidden column h over the group's tokens,
positions m_g..P_g-1 are 0) at element offset ``128 * H * B_g`` of the flat q; its scales are
rows ``B_g .. B_g + P_g/128 - 1`` of the fp32 [S, H] row-major scale tensor (row ``B_g + b``,
column h: block b of hidden column h). Empty groups take no space. S defaults to ``B_G`` (the
exact count); a larger S (an upper bound the caller passes so that nothing is read back from
the GPU) adds rows of zero blocks: row r at offset ``128 * H * r`` with 128-token rows.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .errors import InputError
from .params import align, ceil_div

E4M3_MAX = 448.0
GROUP = 128
DEFAULT_EPS = 1e-4
# Smallest eps accepted: keeps s = eps/448 a normal fp32 number, so 1/s is finite.
MIN_EPS = 1e-30
MAX_EPS = 3.4028234663852886e38  # fp32's largest
SCALE_FORMATS = ("fp32", "ue8m0")
SCALE_LAYOUTS = ("k-major", "mn-major-tma-aligned")
TMA_ALIGN_ROWS = 4  # 16 bytes of 4-byte scales
NAN_BITS = 0x7FC00000
E4M3_NAN_BYTE = 0x7F
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_eps(eps: float, where: str = "eps") -> float:
    """eps as a Python float, or ValueError: finite, at least MIN_EPS, representable in fp32."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a float, got {type(eps).__name__}") from None
    if not math.isfinite(value) or value < MIN_EPS or value > MAX_EPS:
        raise ValueError(f"{where} must be a finite float in [{MIN_EPS}, 3.4e38], got {eps!r}")
    return value


# ------------------------------------------------------------------------------------------------
# Shared pieces


def round_up_pow2(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 s) for positive normal fp32 s, exactly (integer arithmetic on the bits)."""
    bits = s.contiguous().view(torch.int32)
    return ((bits + 0x007FFFFF) & 0x7F800000).view(torch.float32)


def group_scales(amax: torch.Tensor, bad: torch.Tensor, eps: float, ue8m0: bool, largest: float = E4M3_MAX) -> torch.Tensor:
    """Scales of groups with fp32 ``amax`` (ignored where ``bad``): max(amax, eps) / ``largest`` (the
    output type's largest value: e4m3's 448 unless given), pow2 if ue8m0, NaN if bad."""
    eps32 = torch.tensor(eps, dtype=torch.float32, device=amax.device)
    amax = torch.where(bad, torch.zeros_like(amax), amax)
    # A tensor divisor: torch on CUDA turns division by a Python scalar into a multiplication by
    # its reciprocal, which is not the IEEE quotient the kernels compute.
    s = torch.maximum(amax, eps32) / torch.full_like(amax, largest)
    if ue8m0:
        s = round_up_pow2(s)
    nan = torch.tensor(NAN_BITS, dtype=torch.int32, device=amax.device).view(torch.float32)
    return torch.where(bad, nan, s)


def quantize_groups(xg: torch.Tensor, s: torch.Tensor, bad: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """e4m3 of ``xg`` [..., n] (fp32) with one scale per leading index: see the module docstring.

    ``real`` (bool, broadcastable to xg) marks real elements; padding bytes are 0 even in a
    poisoned group.
    """
    inv = torch.ones_like(s) / s
    y = (xg * inv.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    nan_mask = bad.unsqueeze(-1).expand_as(q)
    if real is not None:
        nan_mask = nan_mask & real
        q = torch.where(real, q, torch.zeros_like(q))
    q = torch.where(nan_mask, torch.full_like(q, E4M3_NAN_BYTE), q)
    return q.view(torch.float8_e4m3fn)


def amax_and_bad(xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group (last dim): max |x| over the finite elements, and whether any element is not finite."""
    finite = torch.isfinite(xg)
    bad = (~finite).any(dim=-1)
    amax = torch.where(finite, xg, torch.zeros_like(xg)).abs().amax(dim=-1)
    return amax, bad


def _check_input(x: torch.Tensor, name: str, rank: int = 2) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {list(x.shape)}")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"{name} must be bf16, f16 or f32, got {x.dtype}")


# ------------------------------------------------------------------------------------------------
# Scale layouts


def is_mn_major_tma_aligned(sf: torch.Tensor) -> bool:
    """True when ``sf`` [M, G] has strides (1, align(M, 4)) (modes of extent <= 1 are free); for a
    batched ``sf`` [B, M, G] (the masked grouped GEMM's SFA), each batch is such a matrix and the
    batches are back to back (batch stride G * align(M, 4))."""
    # Strides only (no views): the check also runs on fake tensors while tracing.
    if sf.dim() == 3:
        b, m, g = sf.shape
        batch_ok = b <= 1 or sf.stride(0) == g * align(m, TMA_ALIGN_ROWS)
        matrix_ok = (m <= 1 or sf.stride(1) == 1) and (g <= 1 or sf.stride(2) == align(m, TMA_ALIGN_ROWS))
        return not b or (batch_ok and matrix_ok)
    if sf.dim() != 2:
        return False
    m, g = sf.shape
    return (m <= 1 or sf.stride(0) == 1) and (g <= 1 or sf.stride(1) == align(m, TMA_ALIGN_ROWS))


def mn_major_tma_aligned_empty(m: int, g: int, dtype: torch.dtype, device, zero: bool = True) -> torch.Tensor:
    """A [m, g] tensor in the MN-major TMA-aligned layout (a [g, align(m, 4)] buffer, transposed)."""
    buf = (torch.zeros if zero else torch.empty)((g, align(m, TMA_ALIGN_ROWS)), dtype=dtype, device=device)
    return buf.t()[:m]


def to_mn_major_tma_aligned(sf: torch.Tensor) -> torch.Tensor:
    """``sf`` [M, G] (or batched [B, M, G]) in DeepGEMM's MN-major TMA-aligned layout: strides
    (1, align(M, 4)) per matrix, batches back to back.

    Returns ``sf`` itself when it already has that layout; otherwise a copy whose padding rows
    (M .. align(M, 4) - 1 of the underlying buffer) are 0.
    """
    if not isinstance(sf, torch.Tensor) or sf.dim() not in (2, 3):
        raise InputError(
            f"to_mn_major_tma_aligned: argument 'sf' must be a 2-D [M, G] or 3-D [B, M, G] tensor, got "
            f"{getattr(sf, 'shape', type(sf).__name__)}"
        )
    if is_mn_major_tma_aligned(sf):
        return sf
    if sf.dim() == 3:
        b, m, g = sf.shape
        buf = torch.zeros((b, g, align(m, TMA_ALIGN_ROWS)), dtype=sf.dtype, device=sf.device)
        out = buf.transpose(1, 2)[:, :m]
        out.copy_(sf)
        return out
    m, g = sf.shape
    out = mn_major_tma_aligned_empty(m, g, sf.dtype, sf.device)
    out.copy_(sf)
    return out


def pack_ue8m0(s: torch.Tensor, layout: str = "mn-major-tma-aligned") -> torch.Tensor:
    """Power-of-two (or NaN) fp32 scales [M, G] -> int32 [M, ceil(G/4)], four exponent bytes per word.

    Byte j (little-endian) of word (m, k) is the exponent byte of group 4k + j; bytes past G are 0.
    """
    if layout not in SCALE_LAYOUTS:
        raise ValueError(f"layout must be one of {SCALE_LAYOUTS}, got {layout!r}")
    m, g = s.shape
    exps = ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    g4 = ceil_div(g, 4)
    padded = torch.zeros((m, g4 * 4), dtype=torch.uint8, device=s.device)
    padded[:, :g] = exps
    words = padded.view(torch.int32)  # [m, g4], little-endian bytes
    if layout == "k-major":
        return words.contiguous()
    return to_mn_major_tma_aligned(words)


def unpack_ue8m0(words: torch.Tensor, groups: int) -> torch.Tensor:
    """The fp32 scales [M, groups] a packed UE8M0 tensor holds (byte 0xFF reads back as NaN)."""
    m = words.shape[0]
    b = words.contiguous().view(torch.uint8).reshape(m, -1)[:, :groups].to(torch.int32)
    s = (b << 23).view(torch.float32)
    nan = torch.tensor(NAN_BITS, dtype=torch.int32, device=words.device).view(torch.float32)
    return torch.where(b == 0xFF, nan, s)


# ------------------------------------------------------------------------------------------------
# Per-token 1x128


def per_token_quant_fp8_ref(
    x: torch.Tensor,
    group: int = GROUP,
    scale_format: str = "fp32",
    scale_layout: str = "k-major",
    eps: float = DEFAULT_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x [M, K] per token in 1 x ``group`` groups along K.

    Returns ``(q, scales)``: q e4m3 [M, K] contiguous; scales per ``scale_format`` and
    ``scale_layout`` (module docstring): fp32 [M, ceil(K/group)], or packed UE8M0 int32
    [M, ceil(ceil(K/group)/4)]. Any K >= 0 works here (the last group may be partial); the
    kernels additionally need K % 16 == 0 (16-byte rows).
    """
    _check_input(x, "x")
    if not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format!r}")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    eps = check_eps(eps)
    m, k = x.shape
    g = ceil_div(k, group)
    xf = torch.zeros((m, g * group), dtype=torch.float32, device=x.device)
    xf[:, :k] = x.float()
    xg = xf.view(m, g, group)
    amax, bad = amax_and_bad(xg)
    s = group_scales(amax, bad, eps, scale_format == "ue8m0")
    q = quantize_groups(xg, s, bad).view(m, g * group)[:, :k].contiguous()
    if scale_format == "ue8m0":
        return q, pack_ue8m0(s, scale_layout)
    if scale_layout == "mn-major-tma-aligned":
        return q, to_mn_major_tma_aligned(s)
    return q, s.contiguous()


def dequant_per_token(q: torch.Tensor, scales: torch.Tensor, group: int = GROUP, scale_format: str = "fp32") -> torch.Tensor:
    """fp32 q * scale (scales in any layout of `per_token_quant_fp8_ref`)."""
    m, k = q.shape
    g = ceil_div(k, group)
    s = unpack_ue8m0(scales, g) if scale_format == "ue8m0" else scales.float()
    return q.float() * s.repeat_interleave(group, dim=1)[:, :k]


# ------------------------------------------------------------------------------------------------
# Per-block 128x128


def per_block_quant_fp8_ref(
    w: torch.Tensor, eps: float = DEFAULT_EPS, block: int = GROUP, scale_format: str = "fp32"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a weight w [N, K] per ``block`` x ``block`` block.

    Returns ``(q, scales)``: q e4m3 [N, K] contiguous, scales fp32 [ceil(N/block), ceil(K/block)]
    row-major, or with ``scale_format="ue8m0"`` power-of-two scales (rounded up, used to quantise)
    packed four per int32 along K, row-major [ceil(N/block), ceil(ceil(K/block)/4)]: the SFB the
    sm_100a UE8M0 GEMMs take. N and K need not be multiples of the block (partial blocks count
    zeros).
    """
    _check_input(w, "w")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format!r}")
    eps = check_eps(eps)
    n, k = w.shape
    bn, bk = ceil_div(n, block), ceil_div(k, block)
    wf = torch.zeros((bn * block, bk * block), dtype=torch.float32, device=w.device)
    wf[:n, :k] = w.float()
    blocks = wf.view(bn, block, bk, block).permute(0, 2, 1, 3).reshape(bn, bk, block * block)
    amax, bad = amax_and_bad(blocks)
    s = group_scales(amax, bad, eps, scale_format == "ue8m0")
    q = quantize_groups(blocks, s, bad)
    q = q.view(torch.uint8).view(bn, bk, block, block).permute(0, 2, 1, 3).reshape(bn * block, bk * block)
    q = q[:n, :k].contiguous().view(torch.float8_e4m3fn)
    if scale_format == "ue8m0":
        return q, pack_ue8m0(s.contiguous(), "k-major")
    return q, s.contiguous()


def dequant_per_block(q: torch.Tensor, scales: torch.Tensor, block: int = GROUP) -> torch.Tensor:
    n, k = q.shape
    s = scales.float().repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    return q.float() * s


# ------------------------------------------------------------------------------------------------
# Grouped transposed per-token


def grouped_blocks(group_sizes: Sequence[int]) -> list[int]:
    """Block starts B_g (length G + 1) of the grouped layout."""
    out = [0]
    for m in group_sizes:
        out.append(out[-1] + ceil_div(int(m), GROUP))
    return out


def grouped_num_blocks_bound(num_tokens: int, num_groups: int) -> int:
    """An upper bound on sum ceil(m_g/128) knowing only T and G: floor((T + 127 G) / 128)."""
    return (num_tokens + (GROUP - 1) * num_groups) // GROUP


def grouped_transposed_quant_fp8_ref(
    x: torch.Tensor,
    group_sizes: torch.Tensor | Sequence[int],
    eps: float = DEFAULT_EPS,
    num_blocks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped transposed per-token quantize (module docstring): ``(q flat e4m3 [128*H*S], scales fp32 [S, H])``.

    ``num_blocks`` is S, the number of scale rows (at least sum ceil(m_g/128); default exactly
    that); extra rows are zero blocks.
    """
    _check_input(x, "x")
    eps = check_eps(eps)
    sizes = [int(v) for v in (group_sizes.tolist() if isinstance(group_sizes, torch.Tensor) else group_sizes)]
    t, h = x.shape
    if any(m < 0 for m in sizes):
        raise ValueError(f"group_sizes must be non-negative, got {sizes}")
    if sum(sizes) != t:
        raise ValueError(f"group_sizes must sum to x.shape[0] = {t}, got {sum(sizes)}")
    starts = grouped_blocks(sizes)
    real_blocks = starts[-1]
    s_rows = real_blocks if num_blocks is None else int(num_blocks)
    if s_rows < real_blocks:
        raise ValueError(f"num_blocks must be at least sum ceil(m_g/128) = {real_blocks}, got {num_blocks}")
    q = torch.zeros(GROUP * h * s_rows, dtype=torch.uint8, device=x.device)
    sf = torch.empty((s_rows, h), dtype=torch.float32, device=x.device)
    tok = 0
    for g, m in enumerate(sizes):
        nb = starts[g + 1] - starts[g]
        if nb == 0:
            continue
        p = nb * GROUP
        xt = torch.zeros((h, p), dtype=torch.float32, device=x.device)
        xt[:, :m] = x[tok : tok + m].float().t()
        blocks = xt.view(h, nb, GROUP)
        amax, bad = amax_and_bad(blocks)
        s = group_scales(amax, bad, eps, False)  # [h, nb]
        real = (torch.arange(p, device=x.device) < m).view(nb, GROUP).unsqueeze(0)
        qg = quantize_groups(blocks, s, bad, real).view(torch.uint8).view(h, p)
        base = GROUP * h * starts[g]
        q[base : base + h * p] = qg.reshape(-1)
        sf[starts[g] : starts[g + 1]] = s.t()
        tok += m
    if s_rows > real_blocks:
        zero = torch.zeros(1, dtype=torch.float32, device=x.device)
        sf[real_blocks:] = group_scales(zero, torch.zeros(1, dtype=torch.bool, device=x.device), eps, False)
    return q.view(torch.float8_e4m3fn), sf


def dequant_grouped_transposed(
    q: torch.Tensor, scales: torch.Tensor, group_sizes: Sequence[int], hidden: int
) -> torch.Tensor:
    """x [T, H] back from the grouped layout (fp32): the inverse of the layout, times the scales."""
    sizes = [int(v) for v in group_sizes]
    starts = grouped_blocks(sizes)
    outs = []
    for g, m in enumerate(sizes):
        nb = starts[g + 1] - starts[g]
        if nb == 0:
            continue
        p = nb * GROUP
        base = GROUP * hidden * starts[g]
        qg = q.view(torch.uint8)[base : base + hidden * p].view(torch.float8_e4m3fn).float().view(hidden, p)
        s = scales[starts[g] : starts[g + 1]].t().repeat_interleave(GROUP, dim=1)  # [h, p]
        outs.append((qg * s)[:, :m].t())
    if not outs:
        return torch.zeros((0, hidden), dtype=torch.float32, device=q.device)
    return torch.cat(outs, 0)


__all__ = [
    "DEFAULT_EPS",
    "E4M3_MAX",
    "GROUP",
    "MIN_EPS",
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "align",
    "amax_and_bad",
    "ceil_div",
    "check_eps",
    "dequant_grouped_transposed",
    "dequant_per_block",
    "dequant_per_token",
    "group_scales",
    "grouped_blocks",
    "grouped_num_blocks_bound",
    "grouped_transposed_quant_fp8_ref",
    "is_mn_major_tma_aligned",
    "mn_major_tma_aligned_empty",
    "pack_ue8m0",
    "per_block_quant_fp8_ref",
    "per_token_quant_fp8_ref",
    "quantize_groups",
    "round_up_pow2",
    "to_mn_major_tma_aligned",
    "unpack_ue8m0",
]
