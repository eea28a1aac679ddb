"""Block-scaled (MX) numerics and scale layouts of Blackwell's block-scaled tensor-core MMA, in torch.

The executable specification that sm_100a block-scaled kernels are checked against, runnable on
CPU and GPU tensors (torch only):

* **UE8M0** scale bytes: ``2^(e - 127)``; byte ``0xFF`` is NaN (the quantizers write it for a
  poisoned group, `quant_reference`);
* **FP4 E2M1** elements, two per byte, element ``2i`` in the low nibble: sign bit 3, exponent bits
  2-1 (bias 1), mantissa bit 0: ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` and their negatives;
* the **MX block**: one UE8M0 scale per ``MX_VEC`` (32) consecutive elements along K
  (``kind::mxf8f6f4``); a coarser recipe (DeepGEMM's 1x128 activation scales, 128x128 weight
  scales) is the same scale repeated over its 32-element vectors (`expand_scales`);
* the **blocked scale layout** the MMA reads (PTX's scale-factor layout, CUTLASS's
  ``BlockScaledBasicChunk``, cuBLAS's ``to_blocked``): 512-byte atoms of 128 rows x 4 scales, the
  atoms of a row block along K one after another; inside an atom, row ``r`` and scale ``j`` sit at
  byte ``(r % 32) * 16 + (r // 32) * 4 + j``;
* **DeepGEMM's SM100 layout** (its ``get_mn_major_tma_aligned_packed_ue8m0_tensor``): int32 words
  [MN, ⌈blocks/4⌉], MN-major with columns of align(MN, 4) words, byte ``j`` of word ``w`` the scale
  of block ``4w + j`` (`quant_reference.pack_ue8m0`); `deepgemm_sf_to_blocked` converts it.

`mx_gemm_ref` is the float64 product these define: D = Σ_k (a · sfa) (b · sfb). `quant_fp4_ref`
quantises to FP4 with UE8M0 scales (round to nearest even, saturating), `dequant_fp4` inverts it.

**NVFP4** (``kind::mxf4nvf4``): FP4 E2M1 elements with one E4M3 scale per 16 along K, in the same
blocked layout, and an fp32 scale per tensor that the GEMM applies as alpha: `quant_nvfp4_ref`,
`dequant_nvfp4`, `nvfp4_gemm_ref`.
"""

from __future__ import annotations

import torch

from .params import ceil_div
from .quant_reference import DEFAULT_EPS, E4M3_MAX, amax_and_bad, check_eps, group_scales, pack_ue8m0, unpack_ue8m0

# Elements per MX scale along K.
MX_VEC = 32
# The MMA's scale atom: 128 rows by 4 scales, 512 bytes.
ATOM_ROWS = 128
ATOM_SCALES = 4
ATOM_BYTES = ATOM_ROWS * ATOM_SCALES
UE8M0_NAN = 0xFF
# FP4 E2M1 magnitudes by their three low bits.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_MAX_CODE = 7
# The midpoints between consecutive magnitudes, and whether the lower one's code is even (a tie
# rounds to it) or odd (a tie rounds up).
E2M1_MIDPOINTS = tuple(
    ((lo + hi) / 2, i % 2 == 0) for i, (lo, hi) in enumerate(zip(E2M1_VALUES, E2M1_VALUES[1:]))
)


def ue8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8) -> their fp32 scales 2^(e - 127), exactly (e = 0 is 2^-127, an fp32
    subnormal); 0xFF -> NaN."""
    if e.dtype != torch.uint8:
        raise TypeError(f"UE8M0 scales are uint8 bytes, got {e.dtype}")
    ints = e.to(torch.int32)
    normal = (ints << 23).view(torch.float32)
    subnormal = torch.tensor(2.0**-127, dtype=torch.float32, device=e.device)
    out = torch.where(ints == 0, subnormal, normal)
    return torch.where(ints == UE8M0_NAN, torch.tensor(float("nan"), device=e.device), out)


def float_to_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """fp32 scales that are powers of two (2^-127 to 2^127) or NaN -> their UE8M0 bytes; anything
    else is refused (a block-scaled MMA cannot hold it exactly)."""
    s = s.to(torch.float32)
    nan = torch.isnan(s)
    bits = s.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    sub = (exponent == 0) & (mantissa == 1 << 22)  # 2^-127
    ok = nan | sub | ((mantissa == 0) & (bits >= 0) & (exponent > 0) & (exponent < 0xFF))
    if not bool(ok.all()):
        raise ValueError("UE8M0 holds only positive powers of two from 2^-127 to 2^127 (and NaN)")
    out = torch.where(sub, torch.zeros_like(exponent), exponent)
    return torch.where(nan, torch.full_like(out, UE8M0_NAN), out).to(torch.uint8)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """FP4 E2M1 codes (uint8 values 0-15) -> fp32."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"E2M1 codes are uint8 values 0-15, got {codes.dtype}")
    if bool((codes > 15).any()):
        raise ValueError("an E2M1 code is 4 bits: values 0-15")
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    magnitude = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Packed FP4 [..., K/2] (uint8, element 2i in the low nibble) -> codes [..., K]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed FP4 is uint8, got {packed.dtype}")
    low, high = packed & 0xF, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Codes [..., K] (K even) -> packed FP4 [..., K/2], element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 packs two elements per byte: the last extent ({codes.shape[-1]}) must be even")
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def float_to_e2m1(y: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 codes (uint8 0-15): to the nearest E2M1 value, a tie to the even code (0, 1, 2
    or 4 in magnitude), saturating at ±6 (PTX's ``cvt.rn.satfinite.e2m1x2.f32``); a result of
    zero is +0 (code 0). NaN has no E2M1 code: the caller handles it (`quant_fp4_ref`)."""
    a = y.to(torch.float32).abs()
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for midpoint, lower_is_even in E2M1_MIDPOINTS:
        code += (a > midpoint if lower_is_even else a >= midpoint).to(torch.uint8)
    negative = (y < 0) & (code != 0)
    return code | (negative.to(torch.uint8) << 3)


def quant_fp4_ref(
    x: torch.Tensor, group: int = MX_VEC, eps: float = DEFAULT_EPS, scale_layout: str = "k-major"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x [M, K] (K even) to FP4 E2M1 per 1 x ``group`` along K with UE8M0 scales: the
    FP4 weights (``group`` 32) or activations the block-scaled sm_100a kernels take.

    Per group: ``amax`` over its real elements (a partial last group counts its missing elements
    as zeros); ``s = 2^ceil(log2(max(amax, eps) / 6))`` (`quant_reference.group_scales` with UE8M0
    rounding, so every scaled element has magnitude at most 6); each element's code is
    `float_to_e2m1` of ``x · (1 / s)`` (fp32, round to nearest). A group holding NaN or ±Inf has
    the NaN scale (UE8M0 byte 0xFF) and codes 7 (6.0): its dequantised values are NaN.

    Returns ``(packed, scales)``: packed codes uint8 [M, K/2] (element 2i in the low nibble, as
    `pack_e2m1`), and the scales packed four per int32 as `quant_reference.pack_ue8m0` writes them
    in ``scale_layout`` (``mn-major-tma-aligned``: DeepGEMM's SM100 layout, what `fp8_gemm_nt`
    takes for an FP4 B with ``group`` 32). DeepGEMM's ``per_token_cast_to_fp4`` test helper
    differs only at exact midpoints, which it rounds toward zero.
    """
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point tensor, got {tuple(x.shape)} {x.dtype}")
    m, k = x.shape
    if k % 2:
        raise ValueError(f"FP4 packs two elements per byte: K ({k}) must be even")
    if not isinstance(group, int) or group < 2 or group % 2:
        raise ValueError(f"group must be a positive even int, got {group!r}")
    eps = check_eps(eps)
    g = ceil_div(k, group)
    xf = torch.zeros((m, g * group), dtype=torch.float32, device=x.device)
    xf[:, :k] = x.float()
    xg = xf.view(m, g, group)
    amax, bad = amax_and_bad(xg)
    s = group_scales(amax, bad, eps, True, E2M1_MAX)
    inv = torch.ones_like(s) / s
    codes = float_to_e2m1(xg * inv.unsqueeze(-1))
    codes = torch.where(bad.unsqueeze(-1), torch.full_like(codes, E2M1_MAX_CODE), codes)
    packed = pack_e2m1(codes.view(m, g * group)[:, :k])
    return packed, pack_ue8m0(s, scale_layout)


def dequant_fp4(packed: torch.Tensor, scales: torch.Tensor, group: int = MX_VEC) -> torch.Tensor:
    """fp32 values of `quant_fp4_ref`'s output (scales in either layout)."""
    values = e2m1_to_float(unpack_e2m1(packed))
    m, k = values.shape
    s = unpack_ue8m0(scales, ceil_div(k, group))
    return values * s.repeat_interleave(group, dim=1)[:, :k]


def expand_scales(sf: torch.Tensor, granularity: int, vec: int = MX_VEC) -> torch.Tensor:
    """Scales [MN, blocks] of `granularity` elements each along K -> one per `vec` elements
    [MN, blocks * granularity / vec], each repeated over the vectors its block covers."""
    if granularity % vec:
        raise ValueError(f"a block of {granularity} elements is not a whole number of {vec}-element vectors")
    return sf.repeat_interleave(granularity // vec, dim=-1)


def blocked_offset(row: int, scale: int, scales: int) -> int:
    """The byte of scale `scale` of row `row` in the blocked layout of a [rows, scales] matrix."""
    atoms_k = ceil_div(scales, ATOM_SCALES)
    atom = (row // ATOM_ROWS) * atoms_k + scale // ATOM_SCALES
    return atom * ATOM_BYTES + (row % 32) * 16 + ((row // 32) % 4) * 4 + scale % ATOM_SCALES


def to_blocked(sf: torch.Tensor) -> torch.Tensor:
    """Scale bytes [rows, scales] (uint8) -> the MMA's blocked layout, flat uint8 of
    ⌈rows/128⌉ · ⌈scales/4⌉ · 512 bytes; rows and scales past the matrix are zero. A batch
    [G, rows, scales] gives each matrix's atoms one after another."""
    if sf.dtype != torch.uint8 or sf.dim() not in (2, 3):
        raise TypeError(f"scales must be a uint8 matrix or a batch of them, got {sf.dtype} of rank {sf.dim()}")
    batch = sf if sf.dim() == 3 else sf.unsqueeze(0)
    groups, rows, scales = batch.shape
    rb, kb = ceil_div(rows, ATOM_ROWS), ceil_div(scales, ATOM_SCALES)
    padded = torch.zeros(groups, rb * ATOM_ROWS, kb * ATOM_SCALES, dtype=torch.uint8, device=sf.device)
    padded[:, :rows, :scales] = batch
    # (group, row block, 4 row quarters of 32, 32 rows, scale block, 4 scales) -> atom order
    # (group, row block, scale block, row in 32, quarter, scale).
    atoms = padded.view(groups, rb, 4, 32, kb, ATOM_SCALES).permute(0, 1, 4, 3, 2, 5)
    return atoms.contiguous().flatten()


def from_blocked(blocked: torch.Tensor, rows: int, scales: int) -> torch.Tensor:
    """The inverse of `to_blocked`: the [rows, scales] scale bytes a blocked buffer holds."""
    rb, kb = ceil_div(rows, ATOM_ROWS), ceil_div(scales, ATOM_SCALES)
    if blocked.numel() != rb * kb * ATOM_BYTES:
        raise ValueError(f"a blocked [{rows}, {scales}] scale matrix has {rb * kb * ATOM_BYTES} bytes, "
                         f"got {blocked.numel()}")
    atoms = blocked.reshape(rb, kb, 32, 4, ATOM_SCALES).permute(0, 3, 2, 1, 4)
    return atoms.reshape(rb * ATOM_ROWS, kb * ATOM_SCALES)[:rows, :scales].contiguous()


def deepgemm_sf_to_blocked(words: torch.Tensor, rows: int, blocks: int, granularity: int = 128,
                           vec: int = MX_VEC) -> torch.Tensor:
    """DeepGEMM's SM100 scales (int32 words [rows, ⌈blocks/4⌉], any strides: MN-major and
    TMA-aligned as DeepGEMM makes them) of `blocks` scales of `granularity` elements along K per
    row -> the MMA's blocked layout of one scale per `vec` elements."""
    if words.dtype != torch.int32 or words.dim() != 2 or words.shape[0] != rows:
        raise ValueError(f"DeepGEMM's packed scales are int32 [{rows}, ⌈blocks/4⌉], got {words.dtype} "
                         f"{tuple(words.shape)}")
    if words.shape[1] * 4 < blocks:
        raise ValueError(f"{words.shape[1]} words per row hold {4 * words.shape[1]} scales, fewer than {blocks}")
    sf = words.contiguous().view(torch.uint8).reshape(rows, -1)[:, :blocks]
    return to_blocked(expand_scales(sf, granularity, vec))


def ue8m0_bytes(words: torch.Tensor, scales: int) -> torch.Tensor:
    """Packed UE8M0 words (int32 [..., W], any strides: byte j of word w is scale 4w + j) -> the
    first `scales` scale bytes of each row, uint8 [..., scales]."""
    packed = words.contiguous().view(torch.uint8)
    return packed.reshape(*words.shape[:-1], -1)[..., :scales]


def mx_grouped_scale_operands(sfa: torch.Tensor, sfb: torch.Tensor, k: int, sfb_granularity: int = 128,
                              sfb_per_row: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped GEMMs' packed UE8M0 scales -> the block-scaled MMA's operands. ``sfa`` int32
    [ΣM, ⌈KB/4⌉] (contiguous layout) or [G, max_m, ⌈KB/4⌉] (masked; each group's atoms one after
    another) per 1x128 of A; ``sfb`` int32 [G, N, W] per row of each expert (one scale per
    `sfb_granularity` elements: 128, or 32 for FP4 weights) or, with ``sfb_per_row`` False,
    [G, ⌈N/128⌉, ⌈KB/4⌉] per 128x128 block; every expert's atoms one after another."""
    sfa_bytes = ue8m0_bytes(sfa, ceil_div(k, 128))
    sfb_bytes = ue8m0_bytes(sfb, ceil_div(k, sfb_granularity))
    if not sfb_per_row:
        sfb_bytes = sfb_bytes.repeat_interleave(ATOM_ROWS, dim=1)
    return to_blocked(expand_scales(sfa_bytes, 128)), to_blocked(expand_scales(sfb_bytes, sfb_granularity))


def k_grouped_scale_operand(sf: torch.Tensor) -> torch.Tensor:
    """The k-grouped weight gradient's scales in DeepGEMM's SM100 tn form (fp32 [S, rows]: one
    per 128-token block and row, powers of two as UE8M0 holds them) -> the block-scaled MMA's
    blocked bytes of every row and 32-token vector (atoms by row block, then 128-token block).
    Each scale's byte is its fp32 exponent field, which is its UE8M0 byte for every power of two
    from 2^-127 to 2^127 and for NaN; read on the GPU without a check (that would synchronise):
    any other value counts as the power of two at or below it."""
    exponents = ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return to_blocked(expand_scales(exponents.t(), 128))


def mx_dequant(values: torch.Tensor, sf: torch.Tensor, vec: int = MX_VEC) -> torch.Tensor:
    """Elements [MN, K] (any float dtype, or E2M1 codes decoded first) times their UE8M0 scales
    [MN, ⌈K/vec⌉], in float64."""
    scales = ue8m0_to_float(sf).double().repeat_interleave(vec, dim=-1)[:, : values.shape[-1]]
    return values.double() * scales


def mx_gemm_ref(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                vec: int = MX_VEC) -> torch.Tensor:
    """D [M, N] = Σ_k (a[m, k] · sfa[m, k/vec]) (b[n, k] · sfb[n, k/vec]), in float64: what a
    block-scaled MMA accumulates, before its fp32 rounding."""
    return mx_dequant(a, sfa, vec) @ mx_dequant(b, sfb, vec).T


def mx_scale_operands(sfa: torch.Tensor, sfb: torch.Tensor, m: int, n: int, k: int,
                      granularity: int = 128, sfb_per_row: bool = False,
                      sfb_granularity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_gemm_nt`'s UE8M0 scales (DeepGEMM's: ``sfa`` int32 words [M, ⌈KB/4⌉] per 1x128 block of A,
    any strides; ``sfb`` int32 words [⌈N/128⌉, ⌈KB/4⌉] per 128x128 block of B, or with
    ``sfb_per_row`` [N, ⌈KB/4⌉] per 1x128 block, DeepGEMM's SM100 form; ``sfb_granularity`` 32:
    per row, one per 32 elements, as FP4 weights carry them) -> the block-scaled MMA's operands:
    the blocked bytes of one scale per 32 elements for every row of A and of B (each block's scale
    over its rows and 32-element vectors)."""
    gran_b = sfb_granularity or granularity
    sfa_bytes = sfa.contiguous().view(torch.uint8).reshape(m, -1)[:, :ceil_div(k, granularity)]
    sfb_bytes = sfb.contiguous().view(torch.uint8).reshape(sfb.shape[0], -1)[:, :ceil_div(k, gran_b)]
    sfb_rows = sfb_bytes if sfb_per_row else sfb_bytes.repeat_interleave(ATOM_ROWS, dim=0)[:n]
    return (to_blocked(expand_scales(sfa_bytes, granularity)),
            to_blocked(expand_scales(sfb_rows, gran_b)))


# ---- NVFP4: FP4 E2M1 with an E4M3 scale per 16 elements and an fp32 scale per tensor ----------
# One E4M3 scale per NV_VEC consecutive elements along K (`kind::mxf4nvf4`), the MMA's blocked
# layout as above; the tensor's fp32 scale is not the MMA's: the GEMM multiplies by alpha.
NV_VEC = 16


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor scale: 448 · 6 / amax(x), so that the largest 16-element block's scale
    is E4M3's largest (448); 1 for a tensor of zeros. fp32, one element, on x's device."""
    amax = x.detach().abs().amax().to(torch.float32)
    return torch.where(amax > 0, (E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax)).reshape(1)


def quant_nvfp4_ref(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x [M, K] (K a multiple of 16) to NVFP4 under ``global_scale`` (fp32, one element:
    `nvfp4_global_scale`, or one calibrated elsewhere). Per 1x16 block along K: ``s`` = the E4M3
    value nearest ``amax / 6 · global_scale`` (ties to even, saturating at 448); each element's
    code is `float_to_e2m1` of ``x · (global_scale / s)`` (fp32; all codes 0 where ``s`` is 0). A
    block holding NaN or ±Inf gets the NaN scale (E4M3 0x7F) and codes 7.

    Returns ``(packed, scales)``: codes uint8 [M, K/2] (element 2i in the low nibble) and the
    scales as ``torch.float8_e4m3fn`` [M, K/16] row-major; ``to_blocked(scales.view(torch.uint8))``
    is the layout `nvfp4_gemm_nt` reads (what vLLM and FlashInfer call the swizzled 128x4 layout).
    The dequantised value is ``e2m1 · s / global_scale`` (`dequant_nvfp4`). Engines' CUDA
    quantizers divide with an approximate reciprocal, so an element within an ulp of a rounding
    midpoint may take the neighbouring code there."""
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point tensor, got {tuple(x.shape)} {x.dtype}")
    m, k = x.shape
    if k % NV_VEC:
        raise ValueError(f"NVFP4 scales blocks of {NV_VEC} elements along K: K ({k}) must be a multiple of {NV_VEC}")
    gs = _global_scale_value(global_scale, x.device)
    xg = x.float().view(m, k // NV_VEC, NV_VEC)
    amax, bad = amax_and_bad(xg)
    sf = (amax / E2M1_MAX * gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf = torch.where(bad, torch.full_like(sf, float("nan")), sf)
    s = sf.float()
    inv = torch.where(s > 0, gs / s, torch.zeros_like(s))
    codes = float_to_e2m1(xg * inv.unsqueeze(-1))
    codes = torch.where(bad.unsqueeze(-1), torch.full_like(codes, E2M1_MAX_CODE), codes)
    return pack_e2m1(codes.view(m, k)), sf


def dequant_nvfp4(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of `quant_nvfp4_ref`'s output: e2m1 · s / global_scale."""
    values = e2m1_to_float(unpack_e2m1(packed))
    s = scales.float().repeat_interleave(NV_VEC, dim=1)
    return values * s / _global_scale_value(global_scale, packed.device)


def nvfp4_gemm_ref(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                   alpha: torch.Tensor | float) -> torch.Tensor:
    """D [M, N] = alpha · Σ_k (a[m, k] · sfa[m, k/16]) (b[n, k] · sfb[n, k/16]) in float64, from
    packed codes and E4M3 scales [rows, K/16] (row-major): what `nvfp4_gemm_nt` computes before
    its fp32 accumulation and bf16 rounding."""
    def dequant(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
        values = e2m1_to_float(unpack_e2m1(packed)).double()
        return values * sf.double().repeat_interleave(NV_VEC, dim=1)

    scale = float(alpha) if not isinstance(alpha, torch.Tensor) else float(alpha.reshape(-1)[0])
    return dequant(a, sfa) @ dequant(b, sfb).T * scale


def _global_scale_value(global_scale: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not isinstance(global_scale, torch.Tensor) or global_scale.numel() != 1:
        raise ValueError("global_scale must be a tensor of one fp32 element (nvfp4_global_scale)")
    return global_scale.to(device=device, dtype=torch.float32).reshape(())
