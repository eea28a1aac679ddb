"""CPU tier: the pure-torch FP8 quantize references (the executable specification of the kernels).

Hand-computed cases, the NaN/Inf and padding policy, UE8M0 rounding and packing, scale layouts,
the grouped transposed layout, round-trip error bounds, and an independent oracle (numpy float32
arithmetic + a pure-Python e4m3 round-to-nearest-even encoder) on random data.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import quant_reference as qr  # noqa: E402
from cutegen.runtime.quant_reference import (  # noqa: E402
    dequant_grouped_transposed,
    dequant_per_block,
    dequant_per_token,
    grouped_transposed_quant_fp8_ref,
    pack_ue8m0,
    per_block_quant_fp8_ref,
    per_token_quant_fp8_ref,
    to_mn_major_tma_aligned,
    unpack_ue8m0,
)

NAN_BITS = 0x7FC00000


def f32(v: float) -> float:
    return float(np.float32(v))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def qbytes(q: torch.Tensor) -> torch.Tensor:
    return q.contiguous().view(torch.uint8)


def zero_scale(eps: float = 1e-4) -> float:
    return float(np.float32(eps) / np.float32(448.0))


# ------------------------------------------------------------------------------------------------
# An independent oracle


def e4m3_byte(v: float) -> int:
    """Round a float32 value to e4m3fn, nearest even, saturating to +-448; NaN -> 0x7F."""
    if math.isnan(v):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a >= 448.0:
        return sign | 0x7E
    step = 2.0**-9 if a < 2.0**-6 else 2.0 ** (math.floor(math.log2(a)) - 3)
    val = round(a / step) * step  # a / step is exact; round() is half-to-even
    if val == 0:
        return sign
    if val < 2.0**-6:
        return sign | int(val / 2.0**-9)
    e = math.floor(math.log2(val))
    mant = int((val / 2.0**e - 1.0) * 8)
    return sign | ((e + 7) << 3) | mant


def oracle_group(values: np.ndarray, eps: float, ue8m0: bool) -> tuple[np.ndarray, int]:
    """(e4m3 bytes, scale bits) of one group of float32 values, by numpy float32 arithmetic."""
    v = values.astype(np.float32)
    if not np.all(np.isfinite(v)):
        return np.full(v.shape, 0x7F, dtype=np.uint8), NAN_BITS
    amax = np.float32(np.max(np.abs(v))) if v.size else np.float32(0)
    s = np.float32(max(amax, np.float32(eps))) / np.float32(448.0)
    if ue8m0:
        s = np.float32(2.0 ** math.ceil(math.log2(float(s))))
    inv = np.float32(1.0) / s
    q = np.array([e4m3_byte(float(np.float32(x) * inv)) for x in v], dtype=np.uint8)
    return q, struct.unpack("<i", struct.pack("<f", float(s)))[0]


def test_oracle_encoder_on_known_values():
    assert e4m3_byte(448.0) == 0x7E and e4m3_byte(-448.0) == 0xFE
    assert e4m3_byte(1000.0) == 0x7E  # saturates
    assert e4m3_byte(1.0) == 0x38 and e4m3_byte(2.0**-9) == 0x01 and e4m3_byte(2.0**-6) == 0x08
    assert e4m3_byte(2.0**-10) == 0x00 and e4m3_byte(3 * 2.0**-10) == 0x02  # ties to even
    for byte in range(256):  # every finite code round-trips
        if byte & 0x7F == 0x7F:
            continue
        value = float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        assert e4m3_byte(value) == byte, hex(byte)


def random_with_outliers(m: int, k: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    mag = torch.pow(10.0, torch.randint(-6, 5, (m, k), generator=g).float())  # 1e-6 .. 1e4
    x = x * mag
    return x.to(dtype)


@pytest.mark.parametrize("scale_format", ["fp32", "ue8m0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_per_token_matches_oracle(scale_format, dtype):
    x = random_with_outliers(3, 384 + 64, seed=1, dtype=dtype)
    x[1, 130] = float("nan")
    q, sf = per_token_quant_fp8_ref(x, scale_format=scale_format)
    g = 4
    s = unpack_ue8m0(sf, g) if scale_format == "ue8m0" else sf
    xf = x.float().numpy()
    for m in range(3):
        for gi in range(g):
            vals = xf[m, gi * 128 : (gi + 1) * 128]
            want_q, want_s = oracle_group(vals, 1e-4, scale_format == "ue8m0")
            assert bits(s[m : m + 1, gi]).item() == want_s, (m, gi)
            got = qbytes(q)[m, gi * 128 : gi * 128 + len(vals)].numpy()
            assert np.array_equal(got, want_q), (m, gi)


def test_per_block_matches_oracle():
    w = random_with_outliers(200, 300, seed=2)
    q, s = per_block_quant_fp8_ref(w)
    assert s.shape == (2, 3)
    wf = w.float().numpy()
    for bi in range(2):
        for bj in range(3):
            blk = wf[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128]
            want_q, want_s = oracle_group(blk.reshape(-1), 1e-4, False)
            assert bits(s[bi : bi + 1, bj]).item() == want_s
            got = qbytes(q)[bi * 128 : bi * 128 + blk.shape[0], bj * 128 : bj * 128 + blk.shape[1]]
            assert np.array_equal(got.numpy().reshape(-1), want_q)


# ------------------------------------------------------------------------------------------------
# Hand-computed cases


def test_all_zero_group():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    q, s = per_token_quant_fp8_ref(x)
    assert torch.all(qbytes(q) == 0)
    assert s.dtype == torch.float32 and s.shape == (2, 2)
    assert torch.all(s == zero_scale())
    q, s = per_token_quant_fp8_ref(x, eps=0.5)
    assert torch.all(s == zero_scale(0.5))


def test_single_huge_outlier():
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 5] = 9984.0  # bf16-exact
    x[0, 6] = 1.0
    x[0, 7] = -0.001
    q, s = per_token_quant_fp8_ref(x)
    want_s = f32(np.float32(9984.0) / np.float32(448.0))
    assert s.item() == want_s
    inv = np.float32(1.0) / np.float32(want_s)
    qb = qbytes(q)[0]
    assert qb[5].item() == 0x7E  # the outlier maps to 448
    assert qb[6].item() == e4m3_byte(float(np.float32(1.0) * inv))
    assert qb[7].item() == e4m3_byte(float(np.float32(x[0, 7].float().item()) * inv))
    assert qb[7].item() == 0x80  # underflows to -0
    assert torch.all(qb[8:] == 0)


def test_subnormal_range_values():
    # amax = 448 -> s = 1, inv = 1: values are encoded as they are.
    x = torch.zeros(1, 128, dtype=torch.float32)
    x[0, 0] = 448.0
    x[0, 1] = 2.0**-9  # smallest subnormal
    x[0, 2] = 2.0**-10  # half of it: tie -> 0 (even)
    x[0, 3] = 3 * 2.0**-10  # 1.5 steps: tie -> 2 (even)
    x[0, 4] = 7 * 2.0**-9  # largest subnormal
    x[0, 5] = 2.0**-6  # smallest normal
    x[0, 6] = -5 * 2.0**-9
    q, s = per_token_quant_fp8_ref(x)
    assert s.item() == 1.0
    assert qbytes(q)[0, :7].tolist() == [0x7E, 0x01, 0x00, 0x02, 0x07, 0x08, 0x85]


def test_saturation_clamps_before_the_cast():
    # Some torch builds cast |x| >= 480 to NaN; the reference clamps first, like cvt.satfinite.
    xg = torch.tensor([[[1000.0, -1000.0, 470.0, 448.0, 463.9, 464.0]]])
    s = torch.ones(1, 1)
    q = qr.quantize_groups(xg, s, torch.zeros(1, 1, dtype=torch.bool))
    assert qbytes(q).reshape(-1).tolist() == [0x7E, 0xFE, 0x7E, 0x7E, 0x7E, 0x7E]


def test_scaled_product_may_round_above_448_and_saturates():
    # Find a bf16 amax for which amax * (1 / (amax / 448)) rounds above 448 in fp32.
    for raw in range(0x4300, 0x4700):
        a = np.float32(torch.tensor([raw], dtype=torch.int16).view(torch.bfloat16).float().item())
        s = a / np.float32(448.0)
        if a * (np.float32(1.0) / s) > np.float32(448.0):
            break
    else:
        pytest.skip("no such amax in the range searched")
    x = torch.tensor([[float(a)] + [0.0] * 127], dtype=torch.float32)
    q, _ = per_token_quant_fp8_ref(x)
    assert qbytes(q)[0, 0].item() == 0x7E


# ------------------------------------------------------------------------------------------------
# NaN / Inf policy


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_poisons_only_its_group(bad):
    x = random_with_outliers(2, 384, seed=3)
    clean_q, clean_s = per_token_quant_fp8_ref(x)
    x[1, 200] = bad
    q, s = per_token_quant_fp8_ref(x)
    assert bits(s[1:2, 1]).item() == NAN_BITS
    assert torch.all(qbytes(q)[1, 128:256] == 0x7F)
    # every other group is unchanged
    mask = torch.ones(2, 384, dtype=torch.bool)
    mask[1, 128:256] = False
    assert torch.equal(qbytes(q)[mask], qbytes(clean_q)[mask])
    smask = torch.ones(2, 3, dtype=torch.bool)
    smask[1, 1] = False
    assert torch.equal(bits(s)[smask], bits(clean_s)[smask])


def test_nonfinite_ue8m0_byte_is_ff():
    x = torch.ones(1, 256, dtype=torch.bfloat16)
    x[0, 3] = float("nan")
    _, sf = per_token_quant_fp8_ref(x, scale_format="ue8m0")
    word = sf.contiguous().view(torch.uint8).reshape(-1)[:4].tolist()
    assert word[0] == 0xFF and word[1] == (bits(torch.tensor([1.0 / 448])).item() + 0x7FFFFF) >> 23 & 0xFF
    assert word[2:] == [0, 0]


def test_nonfinite_per_block():
    w = torch.randn(256, 256, dtype=torch.bfloat16)
    w[130, 3] = float("inf")
    q, s = per_block_quant_fp8_ref(w)
    assert bits(s[1:2, 0]).item() == NAN_BITS
    assert torch.isfinite(s[0]).all() and torch.isfinite(s[1, 1])
    assert torch.all(qbytes(q)[128:, :128] == 0x7F)
    assert not torch.any(qbytes(q)[:128] == 0x7F)


def test_nonfinite_grouped_keeps_padding_zero():
    x = torch.randn(100, 16, dtype=torch.bfloat16)
    x[10, 3] = float("nan")
    q, s = grouped_transposed_quant_fp8_ref(x, [100])
    rows = qbytes(q).view(16, 128)
    assert torch.all(rows[3, :100] == 0x7F) and torch.all(rows[3, 100:] == 0)
    assert bits(s[0:1, 3]).item() == NAN_BITS
    assert torch.isfinite(s[0, torch.arange(16) != 3]).all()
    assert not torch.any(rows[torch.arange(16) != 3] == 0x7F)


# ------------------------------------------------------------------------------------------------
# UE8M0


def test_round_up_pow2_is_ceil_log2():
    g = torch.Generator().manual_seed(4)
    s = torch.exp(torch.randn(4000, generator=g) * 20).float()
    s = s[(s > 1e-37) & (s < 1e37)]
    got = qr.round_up_pow2(s)
    want = torch.tensor([2.0 ** math.ceil(math.log2(v)) for v in s.double().tolist()], dtype=torch.float32)
    assert torch.equal(got, want)


def test_ue8m0_exact_power_of_two_is_kept():
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    x[0, 0] = 448.0  # s = 1 exactly
    x[0, 128] = 224.0  # s = 0.5 exactly
    q, sf = per_token_quant_fp8_ref(x, scale_format="ue8m0")
    assert sf.contiguous().view(torch.uint8).reshape(-1)[:2].tolist() == [127, 126]
    assert qbytes(q)[0, 0].item() == 0x7E and qbytes(q)[0, 128].item() == 0x7E


def test_ue8m0_just_above_a_power_of_two_rounds_up_and_quantises_with_it():
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 0] = 448.0 * (1 + 2.0**-7)  # 451.5: s = 1.0078 -> 2
    x[0, 1] = 100.0
    q, sf = per_token_quant_fp8_ref(x, scale_format="ue8m0")
    assert sf.contiguous().view(torch.uint8).reshape(-1)[0].item() == 128  # 2^1
    # q uses the rounded scale: 451.5 / 2 = 225.75 -> 224; 100 / 2 = 50 -> 48 or 52 (RNE: 48)
    assert qbytes(q)[0, 0].item() == e4m3_byte(225.75) == e4m3_byte(224.0)
    assert qbytes(q)[0, 1].item() == e4m3_byte(50.0)
    assert unpack_ue8m0(sf, 1).item() == 2.0


def test_ue8m0_packing_layout():
    # 5 groups: word 0 = groups 0..3, word 1 = group 4 then three zero bytes.
    s = torch.tensor([[1.0, 2.0, 0.5, 4.0, 0.25], [8.0, 1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1, 2.0]])
    for layout in ("k-major", "mn-major-tma-aligned"):
        w = pack_ue8m0(s, layout)
        assert w.dtype == torch.int32 and w.shape == (3, 2)
        b = w.contiguous().view(torch.uint8).reshape(3, 8)
        assert b[0].tolist() == [127, 128, 126, 129, 125, 0, 0, 0]
        assert b[1, :4].tolist() == [130, 127, 127, 127]
        assert torch.equal(unpack_ue8m0(w, 5), s)
    mn = pack_ue8m0(s, "mn-major-tma-aligned")
    assert mn.stride() == (1, 4)
    # the padding row (row 3 of the [2, 4] buffer) is zero
    buf = torch.as_strided(mn, (2, 4), (4, 1))
    assert torch.all(buf[:, 3] == 0)


# ------------------------------------------------------------------------------------------------
# Layouts and shapes


@pytest.mark.parametrize("m", [1, 3, 4, 5, 130])
def test_mn_major_tma_aligned_layout(m):
    x = random_with_outliers(m, 640, seed=5)
    _, s_k = per_token_quant_fp8_ref(x)
    q2, s_mn = per_token_quant_fp8_ref(x, scale_layout="mn-major-tma-aligned")
    ma = qr.align(m, 4)
    assert s_k.stride() == (5, 1)
    assert s_mn.shape == (m, 5) and s_mn.stride() == (1, ma)
    assert torch.equal(s_k, s_mn)
    buf = torch.as_strided(s_mn, (5, ma), (ma, 1))
    assert torch.all(buf[:, m:] == 0)
    assert to_mn_major_tma_aligned(s_mn) is s_mn
    converted = to_mn_major_tma_aligned(s_k)
    assert converted.stride() == (1, ma) and torch.equal(converted, s_k)
    assert qr.is_mn_major_tma_aligned(converted) and (m == 1 or not qr.is_mn_major_tma_aligned(s_k))


def test_to_mn_major_rejects_non_matrix():
    with pytest.raises(ValueError, match="2-D"):
        to_mn_major_tma_aligned(torch.zeros(3))


def test_shapes_m1_k128_and_partial_k():
    x = random_with_outliers(1, 128, seed=6)
    q, s = per_token_quant_fp8_ref(x)
    assert q.shape == (1, 128) and q.dtype == torch.float8_e4m3fn and s.shape == (1, 1)
    # K = 200: the last group has 72 elements and counts the missing 56 as zeros.
    x = random_with_outliers(2, 200, seed=7)
    q, s = per_token_quant_fp8_ref(x)
    padded = torch.zeros(2, 256, dtype=x.dtype)
    padded[:, :200] = x
    qp, sp = per_token_quant_fp8_ref(padded)
    assert q.shape == (2, 200) and s.shape == (2, 2)
    assert torch.equal(bits(s), bits(sp)) and torch.equal(qbytes(q), qbytes(qp)[:, :200])


def test_bad_arguments_are_rejected():
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2-D"):
        per_token_quant_fp8_ref(x[None])
    with pytest.raises(ValueError, match="bf16, f16 or f32"):
        per_token_quant_fp8_ref(x.to(torch.int32))
    with pytest.raises(ValueError, match="scale_format"):
        per_token_quant_fp8_ref(x, scale_format="e8m0")
    with pytest.raises(ValueError, match="scale_layout"):
        per_token_quant_fp8_ref(x, scale_layout="row")
    for eps in (0.0, -1.0, float("nan"), float("inf"), 1e-40):
        with pytest.raises(ValueError, match="eps"):
            per_token_quant_fp8_ref(x, eps=eps)
    with pytest.raises(TypeError):
        per_block_quant_fp8_ref([[1.0]])
    with pytest.raises(ValueError, match="sum"):
        grouped_transposed_quant_fp8_ref(x, [1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        grouped_transposed_quant_fp8_ref(x, [5, -1])
    with pytest.raises(ValueError, match="num_blocks"):
        grouped_transposed_quant_fp8_ref(x, [4], num_blocks=0)


def test_per_block_partial_blocks():
    w = random_with_outliers(130, 129, seed=8)
    q, s = per_block_quant_fp8_ref(w)
    assert q.shape == (130, 129) and s.shape == (2, 2) and s.is_contiguous()
    # the corner block holds one element (row 128..129, col 128): its scale is from those only
    corner = w[128:, 128:].float()
    want = max(corner.abs().max().item(), f32(1e-4))
    assert s[1, 1].item() == f32(np.float32(want) / np.float32(448.0))


def test_per_block_ue8m0_packs_the_power_of_two_scales_it_quantised_with():
    w = random_with_outliers(300, 640, seed=10)
    q32, s32 = per_block_quant_fp8_ref(w)
    q, words = per_block_quant_fp8_ref(w, scale_format="ue8m0")
    # [ceil(N/128), ceil(ceil(K/128)/4)] int32, row-major: the SFB of the sm_100a UE8M0 GEMMs
    assert words.dtype == torch.int32 and words.shape == (3, 2) and words.is_contiguous()
    s = qr.unpack_ue8m0(words, 5)
    assert torch.equal(s, qr.round_up_pow2(s32))
    assert torch.all(s >= s32)
    # q is the quantisation with those scales: dequantised error within half an e4m3 step
    back = qr.dequant_per_block(q, s)
    err = (back - w.float()).abs()
    step = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :640]
    assert torch.all(err <= step * 16 + 1e-30)  # e4m3 has 3 mantissa bits: |err| <= 2^-4 * |x|max
    with pytest.raises(ValueError, match="scale_format"):
        per_block_quant_fp8_ref(w, scale_format="e8m0")


# ------------------------------------------------------------------------------------------------
# Grouped transposed


GROUPS = [0, 1, 127, 129, 0, 256, 3]


def test_grouped_layout_equals_per_token_of_each_transposed_group():
    h = 48
    t = sum(GROUPS)
    x = random_with_outliers(t, h, seed=9)
    q, s = grouped_transposed_quant_fp8_ref(x, torch.tensor(GROUPS, dtype=torch.int32))
    starts = qr.grouped_blocks(GROUPS)
    assert starts == [0, 0, 1, 2, 4, 4, 6, 7]
    assert s.shape == (7, h) and q.numel() == 128 * h * 7
    tok = 0
    for g, m in enumerate(GROUPS):
        nb = starts[g + 1] - starts[g]
        if m == 0:
            assert nb == 0
            continue
        xt = x[tok : tok + m].t().contiguous()  # [h, m]
        want_q, want_s = per_token_quant_fp8_ref(xt)  # 1x128 along tokens
        block = qbytes(q)[128 * h * starts[g] : 128 * h * starts[g + 1]].view(h, 128 * nb)
        assert torch.equal(block[:, :m], qbytes(want_q)), g
        assert torch.all(block[:, m:] == 0), g
        assert torch.equal(bits(s[starts[g] : starts[g + 1]]), bits(want_s.t())), g
        tok += m


def test_grouped_bound_adds_zero_blocks():
    x = random_with_outliers(300, 32, seed=10)
    sizes = [100, 200]
    q, s = grouped_transposed_quant_fp8_ref(x, sizes)
    bound = qr.grouped_num_blocks_bound(300, 2)
    assert bound == (300 + 254) // 128 == 4
    qb, sb = grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=bound + 2)
    assert sb.shape == (6, 32) and qb.numel() == 128 * 32 * 6
    assert torch.equal(qbytes(qb)[: q.numel()], qbytes(q))
    assert torch.all(qbytes(qb)[q.numel() :] == 0)
    assert torch.equal(bits(sb[:3]), bits(s))
    assert torch.all(sb[3:] == zero_scale())


def test_grouped_all_empty_and_single_token():
    x = torch.zeros(0, 16, dtype=torch.bfloat16)
    q, s = grouped_transposed_quant_fp8_ref(x, [0, 0])
    assert q.numel() == 0 and s.shape == (0, 16)
    x = torch.full((1, 16), 3.0, dtype=torch.bfloat16)
    q, s = grouped_transposed_quant_fp8_ref(x, [0, 1, 0])
    assert s.shape == (1, 16) and torch.all(s == f32(np.float32(3.0) / np.float32(448.0)))
    rows = qbytes(q).view(16, 128)
    assert torch.all(rows[:, 0] == 0x7E) and torch.all(rows[:, 1:] == 0)


# ------------------------------------------------------------------------------------------------
# Round trip


def _normal_mask(x: torch.Tensor, per_elem_scale: torch.Tensor) -> torch.Tensor:
    """Elements whose scaled value is in e4m3's normal range (>= 2^-6)."""
    return (x.float().abs() / per_elem_scale) >= 2.0**-6


def test_round_trip_error_bound():
    bound = 2.0**-4 * (1 + 1e-6)
    x = random_with_outliers(64, 1000, seed=11)
    for fmt in ("fp32", "ue8m0"):
        q, sf = per_token_quant_fp8_ref(x, scale_format=fmt)
        s = (unpack_ue8m0(sf, 8) if fmt == "ue8m0" else sf).repeat_interleave(128, 1)[:, :1000]
        d = dequant_per_token(q, sf, scale_format=fmt)
        mask = _normal_mask(x, s)
        rel = ((d - x.float()).abs() / x.float().abs())[mask]
        assert mask.float().mean() > 0.3 and rel.max().item() <= bound, fmt
    w = random_with_outliers(300, 260, seed=12)
    q, s = per_block_quant_fp8_ref(w)
    se = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :260]
    d = dequant_per_block(q, s)
    mask = _normal_mask(w, se)
    assert ((d - w.float()).abs() / w.float().abs())[mask].max().item() <= bound
    x = random_with_outliers(sum(GROUPS), 40, seed=13)
    q, s = grouped_transposed_quant_fp8_ref(x, GROUPS)
    d = dequant_grouped_transposed(q, s, GROUPS, 40)
    assert d.shape == x.shape
    # per-element scale of the grouped layout, rebuilt from the same formula
    err = (d - x.float()).abs()
    big = x.float().abs() >= 2.0**-6 * s.max()  # conservative: normal range under the largest scale
    assert (err[big] / x.float().abs()[big]).max().item() <= bound


def test_reference_runs_on_the_tensor_device():
    x = random_with_outliers(2, 128, seed=14)
    q, s = per_token_quant_fp8_ref(x)
    assert q.device == x.device and s.device == x.device
