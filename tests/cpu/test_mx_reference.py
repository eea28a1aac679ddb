"""CPU tier: the block-scaled (MX) references, bit for bit: UE8M0 and FP4 E2M1 decoding, the MMA's
blocked scale layout (against the byte formula and against cuBLAS's `to_blocked` recipe), DeepGEMM's
SM100 packed layout converted into it, and the float64 reference product."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import mx_reference as mx  # noqa: E402
from cutegen.runtime.quant_reference import pack_ue8m0  # noqa: E402


def test_ue8m0_decodes_every_byte_exactly():
    e = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    s = mx.ue8m0_to_float(e)
    for byte in range(255):
        assert float(s[byte]) == math.ldexp(1.0, byte - 127), byte
    assert math.isnan(float(s[255]))
    assert torch.equal(mx.float_to_ue8m0(s), e)
    with pytest.raises(ValueError, match="powers of two"):
        mx.float_to_ue8m0(torch.tensor([3.0]))
    with pytest.raises(ValueError, match="powers of two"):
        mx.float_to_ue8m0(torch.tensor([-2.0]))


def test_e2m1_codes_and_packing():
    codes = torch.arange(16, dtype=torch.uint8)
    want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    got = mx.e2m1_to_float(codes)
    assert got.tolist() == want and all(math.copysign(1, g) == math.copysign(1, w) for g, w in zip(got.tolist(), want))
    packed = mx.pack_e2m1(codes.view(2, 8))
    assert packed.shape == (2, 4) and packed[0, 0] == 0x10 and packed[1, 3] == 0xFE  # element 2i low
    assert torch.equal(mx.unpack_e2m1(packed), codes.view(2, 8))
    with pytest.raises(ValueError, match="0-15"):
        mx.e2m1_to_float(torch.tensor([16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="even"):
        mx.pack_e2m1(torch.zeros(3, dtype=torch.uint8))


@pytest.mark.parametrize("rows, scales", [(1, 1), (128, 4), (130, 7), (300, 9)])
def test_blocked_layout_matches_the_byte_formula_and_cublas_recipe(rows, scales):
    sf = torch.randint(1, 255, (rows, scales), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))
    blocked = mx.to_blocked(sf)
    rb, kb = -(-rows // 128), -(-scales // 4)
    assert blocked.numel() == rb * kb * 512
    for r in range(rows):
        for j in range(scales):
            assert blocked[mx.blocked_offset(r, j, scales)] == sf[r, j]
    assert int(blocked.to(torch.int64).sum()) == int(sf.to(torch.int64).sum())  # padding is zero
    # cuBLAS's recipe (torch's scaled_mm tests): view(RM,128,RK,4).permute(0,2,1,3).reshape(-1,4,32,4)
    # .transpose(1,2).reshape(-1,32,16).
    padded = torch.zeros(rb * 128, kb * 4, dtype=torch.uint8)
    padded[:rows, :scales] = sf
    cublas = padded.view(rb, 128, kb, 4).permute(0, 2, 1, 3).reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16)
    assert torch.equal(blocked, cublas.flatten())
    assert torch.equal(mx.from_blocked(blocked, rows, scales), sf)


def test_deepgemm_sm100_scales_convert_to_the_blocked_layout():
    """DeepGEMM's packed UE8M0 words (MN-major, TMA-aligned) of 1x128 scales become one scale per
    32 elements: every 32-element vector of a 128-element block carries the block's scale."""
    rows, k = 200, 1536
    blocks = k // 128
    rng = random.Random(7)
    s = torch.tensor([[2.0 ** rng.randint(-20, 20) for _ in range(blocks)] for _ in range(rows)])
    words = pack_ue8m0(s)  # DeepGEMM's layout
    assert words.stride(0) == 1 and words.stride(1) == 200
    blocked = mx.deepgemm_sf_to_blocked(words, rows, blocks)
    per_vec = mx.from_blocked(blocked, rows, k // 32)
    want = mx.float_to_ue8m0(s).repeat_interleave(4, dim=1)
    assert torch.equal(per_vec, want)
    with pytest.raises(ValueError, match="fewer than"):
        mx.deepgemm_sf_to_blocked(words, rows, 13)
    with pytest.raises(ValueError, match="whole number"):
        mx.expand_scales(want, 48)


def test_reference_product_is_the_scaled_dot_product():
    g = torch.Generator().manual_seed(3)
    m, n, k = 5, 6, 96
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn)
    b_codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    b = mx.e2m1_to_float(b_codes)
    sfa = torch.randint(120, 134, (m, k // 32), dtype=torch.uint8, generator=g)
    sfb = torch.randint(120, 134, (n, k // 32), dtype=torch.uint8, generator=g)
    d = mx.mx_gemm_ref(a, sfa, b, sfb)
    for i in range(m):
        for j in range(n):
            want = sum(float(a[i, kk].float()) * 2.0 ** (int(sfa[i, kk // 32]) - 127)
                       * float(b[j, kk]) * 2.0 ** (int(sfb[j, kk // 32]) - 127) for kk in range(k))
            assert float(d[i, j]) == pytest.approx(want, rel=1e-12, abs=1e-30)


def test_fp8_gemm_scales_become_the_mma_operands():
    """`fp8_gemm_nt`'s UE8M0 scales (1x128 for A, 128x128 for B, DeepGEMM's packing) become one scale
    per 32 elements for every row of A and of B, in the blocked layout, sized as the kernel's
    manifest requires (⌈rows/128⌉ · ⌈K/128⌉ atoms of 512 bytes)."""
    m, n, k = 130, 300, 640
    blocks = k // 128
    rng = random.Random(11)
    sa = torch.tensor([[2.0 ** rng.randint(-9, 9) for _ in range(blocks)] for _ in range(m)])
    sb = torch.tensor([[2.0 ** rng.randint(-9, 9) for _ in range(blocks)] for _ in range(-(-n // 128))])
    sfa_blocked, sfb_blocked = mx.mx_scale_operands(pack_ue8m0(sa), pack_ue8m0(sb, "k-major"), m, n, k)
    assert sfa_blocked.numel() == 2 * blocks * 512 and sfb_blocked.numel() == 3 * blocks * 512
    a_vec = mx.from_blocked(sfa_blocked, m, k // 32)
    b_vec = mx.from_blocked(sfb_blocked, n, k // 32)
    for r in (0, 77, 129):
        for v in range(k // 32):
            assert int(a_vec[r, v]) == int(mx.float_to_ue8m0(sa[r, v // 4 : v // 4 + 1]))
    for r in (0, 127, 128, 299):
        for v in range(k // 32):
            assert int(b_vec[r, v]) == int(mx.float_to_ue8m0(sb[r // 128, v // 4 : v // 4 + 1]))


def test_per_row_sfb_is_read_row_by_row():
    """DeepGEMM's SM100 ``sfb`` (per row, [N, ⌈K/512⌉] MN-major TMA-aligned) becomes the same blocked
    bytes as its per-block form when each 128-row block shares its scales, and each row's own scales
    otherwise."""
    m, n, k = 3, 260, 896
    blocks = k // 128
    rng = random.Random(12)
    sa = torch.tensor([[2.0 ** rng.randint(-9, 9) for _ in range(blocks)] for _ in range(m)])
    per_block = torch.tensor([[2.0 ** rng.randint(-9, 9) for _ in range(blocks)] for _ in range(-(-n // 128))])
    broadcast = per_block.repeat_interleave(128, dim=0)[:n]
    packed_rows = pack_ue8m0(broadcast)
    assert packed_rows.shape == (n, 2) and packed_rows.stride() == (1, 260)
    by_block = mx.mx_scale_operands(pack_ue8m0(sa), pack_ue8m0(per_block, "k-major"), m, n, k)
    by_row = mx.mx_scale_operands(pack_ue8m0(sa), packed_rows, m, n, k, sfb_per_row=True)
    assert torch.equal(by_block[0], by_row[0]) and torch.equal(by_block[1], by_row[1])
    rows = torch.tensor([[2.0 ** rng.randint(-9, 9) for _ in range(blocks)] for _ in range(n)])
    _, sfb_blocked = mx.mx_scale_operands(pack_ue8m0(sa), pack_ue8m0(rows), m, n, k, sfb_per_row=True)
    b_vec = mx.from_blocked(sfb_blocked, n, k // 32)
    for r in (0, 1, 127, 128, 259):
        for v in range(k // 32):
            assert int(b_vec[r, v]) == int(mx.float_to_ue8m0(rows[r, v // 4 : v // 4 + 1]))


def test_fp8_fp4_operands_give_the_dequantized_product():
    """FP8 x FP4 as `fp8_gemm_nt` takes it (A e4m3 with 1x128 UE8M0 scales; B packed e2m1 with
    1x32 UE8M0 scales per row, both DeepGEMM's packed MN-major layout) becomes blocked operands
    whose float64 product (what the block-scaled MMA accumulates) equals the product of the
    dequantized inputs computed element by element."""
    m, n, k = 5, 140, 256
    g = torch.Generator().manual_seed(13)
    a = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32).to(torch.uint8)
    packed = mx.pack_e2m1(codes)
    assert packed.shape == (n, k // 2) and torch.equal(mx.unpack_e2m1(packed), codes)
    sa = 2.0 ** torch.randint(-6, 6, (m, k // 128), generator=g).float()
    sb = 2.0 ** torch.randint(-6, 6, (n, k // 32), generator=g).float()
    sfa_blocked, sfb_blocked = mx.mx_scale_operands(pack_ue8m0(sa), pack_ue8m0(sb), m, n, k,
                                                    sfb_per_row=True, sfb_granularity=32)
    assert sfb_blocked.numel() == 2 * (k // 128) * 512
    sfa_vec = mx.from_blocked(sfa_blocked, m, k // 32)
    sfb_vec = mx.from_blocked(sfb_blocked, n, k // 32)
    assert torch.equal(sfb_vec, mx.float_to_ue8m0(sb))
    d = mx.mx_gemm_ref(a, sfa_vec, mx.e2m1_to_float(mx.unpack_e2m1(packed)), sfb_vec)
    b_values = mx.e2m1_to_float(codes).double()
    want = (a.double() * sa.double().repeat_interleave(128, dim=1)) @ (b_values * sb.double().repeat_interleave(32, dim=1)).T
    assert torch.equal(d, want)


def test_grouped_scales_become_each_groups_atoms_in_turn():
    """The grouped GEMMs' packed scales: SFA over all ΣM rows (contiguous) or each group's max_m
    rows (masked), SFB of each expert (per row, per 1x32 for FP4, or per 128x128 block), become
    blocked atoms group after group: each group's bytes are `to_blocked` of its own scales."""
    g, rows, n, k = 3, 130, 200, 512
    rng = torch.Generator().manual_seed(14)

    def pow2(*shape):
        return 2.0 ** torch.randint(-8, 8, shape, generator=rng).float()

    def pack(s3):  # each group packed as DeepGEMM packs it (MN-major words), groups stacked
        return torch.stack([pack_ue8m0(x) for x in s3])

    sa, sb_rows, sb_fp4, sb_blocks = pow2(g, rows, k // 128), pow2(g, n, k // 128), pow2(g, n, k // 32), pow2(g, 2, k // 128)
    sfa, sfb = mx.mx_grouped_scale_operands(pack(sa), pack(sb_rows), k)
    _, sfb4 = mx.mx_grouped_scale_operands(pack(sa), pack(sb_fp4), k, sfb_granularity=32)
    _, sfbb = mx.mx_grouped_scale_operands(pack(sa), pack(sb_blocks), k, sfb_per_row=False)
    atoms_a, atoms_b = 2 * (k // 128) * 512, 2 * (k // 128) * 512
    assert sfa.numel() == g * atoms_a and sfb.numel() == sfb4.numel() == sfbb.numel() == g * atoms_b
    for i in range(g):
        a_i = mx.from_blocked(sfa[i * atoms_a:(i + 1) * atoms_a], rows, k // 32)
        assert torch.equal(a_i, mx.float_to_ue8m0(sa[i]).repeat_interleave(4, dim=1))
        b_i = mx.from_blocked(sfb[i * atoms_b:(i + 1) * atoms_b], n, k // 32)
        assert torch.equal(b_i, mx.float_to_ue8m0(sb_rows[i]).repeat_interleave(4, dim=1))
        b4_i = mx.from_blocked(sfb4[i * atoms_b:(i + 1) * atoms_b], n, k // 32)
        assert torch.equal(b4_i, mx.float_to_ue8m0(sb_fp4[i]))
        bb_i = mx.from_blocked(sfbb[i * atoms_b:(i + 1) * atoms_b], n, k // 32)
        want = mx.float_to_ue8m0(sb_blocks[i]).repeat_interleave(128, dim=0)[:n].repeat_interleave(4, dim=1)
        assert torch.equal(bb_i, want)
    flat = pack_ue8m0(sa.reshape(g * rows, -1))  # the contiguous layout's [ΣM, ⌈KB/4⌉]
    sfa_flat, _ = mx.mx_grouped_scale_operands(flat, pack(sb_rows), k)
    assert torch.equal(sfa_flat, mx.to_blocked(mx.expand_scales(mx.float_to_ue8m0(sa.reshape(g * rows, -1)), 128)))


def test_e2m1_rounds_to_nearest_with_ties_to_even_and_saturates():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert mx.e2m1_to_float(mx.float_to_e2m1(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert mx.e2m1_to_float(mx.float_to_e2m1(-ties)).tolist() == [0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    assert mx.float_to_e2m1(torch.tensor([7.0, -1e30, -0.0, -0.1])).tolist() == [7, 15, 0, 0]
    g = torch.Generator().manual_seed(21)
    y = (torch.rand(20000, generator=g) - 0.5) * 16
    values = torch.tensor(mx.E2M1_VALUES)
    magnitude = y.abs().clamp(max=6.0)
    nearest = values[(magnitude[:, None] - values[None, :]).abs().argmin(dim=1)]
    not_tie = ~torch.isin(magnitude, torch.tensor([mid for mid, _ in mx.E2M1_MIDPOINTS]))
    got = mx.e2m1_to_float(mx.float_to_e2m1(y))
    assert torch.equal(got.abs()[not_tie], nearest[not_tie]) and bool((got * y >= 0).all())


def test_fp4_quantize_scales_by_powers_of_two_and_round_trips_within_half_a_step():
    m, k, group = 6, 200, 32  # a partial last group of 8 elements
    g = torch.Generator().manual_seed(22)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m)[:, None]
    packed, words = mx.quant_fp4_ref(x, group)
    assert packed.shape == (m, k // 2) and packed.dtype == torch.uint8 and words.dtype == torch.int32
    s = mx.ue8m0_to_float(words.view(torch.uint8).reshape(m, -1)[:, :7])
    assert torch.equal(mx.float_to_ue8m0(s), words.view(torch.uint8).reshape(m, -1)[:, :7])  # powers of two
    xg = torch.zeros(m, 7 * group)
    xg[:, :k] = x
    amax = xg.view(m, 7, group).abs().amax(-1)
    assert bool((amax / s <= 6.0).all()) and bool((amax / s > 3.0).all())  # the smallest power of two that fits
    back = mx.dequant_fp4(packed, words, group)
    # E2M1's largest step is 2 (4 to 6): no element moves by more than one step's half, scaled.
    assert bool(((back - x).abs() <= s.repeat_interleave(group, dim=1)[:, :k]).all())
    exact = mx.e2m1_to_float(torch.randint(0, 16, (m, k), generator=g, dtype=torch.int32).to(torch.uint8)) * 8.0
    exact[:, ::group] = 48.0  # every group's amax 6 x 8
    packed, words = mx.quant_fp4_ref(exact, group, scale_layout="mn-major-tma-aligned")
    assert torch.equal(mx.dequant_fp4(packed, words, group), exact)


def test_fp4_quantize_poisons_a_group_holding_nan_or_inf_and_checks_its_arguments():
    x = torch.ones(2, 96)
    x[1, 40] = float("nan")
    x[0, 95] = float("inf")
    packed, words = mx.quant_fp4_ref(x)
    scale_bytes = words.view(torch.uint8).reshape(2, -1)[:, :3]
    assert scale_bytes.tolist() == [[127 - 2, 127 - 2, 0xFF], [127 - 2, 0xFF, 127 - 2]]  # 1/6 rounds up to 2^-2
    back = mx.dequant_fp4(packed, words)
    nan = torch.isnan(back)
    assert bool(nan[0, 64:].all()) and bool(nan[1, 32:64].all()) and int(nan.sum()) == 64
    for bad, match in ((torch.ones(2, 7), "even"), (torch.ones(2, 2, 2), "2-D")):
        with pytest.raises(ValueError, match=match):
            mx.quant_fp4_ref(bad)
    with pytest.raises(ValueError, match="group"):
        mx.quant_fp4_ref(torch.ones(2, 8), group=3)


def test_fp4_weights_from_the_quantizer_feed_the_fp8_fp4_operands():
    """What `quant_fp4_ref` writes for a weight (1x32 UE8M0 scales per row, DeepGEMM's SM100
    layout) is what `fp8_gemm_nt` takes for an FP4 B: through the blocked operands, the float64
    product equals the product of the dequantised inputs."""
    m, n, k = 4, 136, 256
    g = torch.Generator().manual_seed(23)
    a = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
    sa = 2.0 ** torch.randint(-4, 4, (m, k // 128), generator=g).float()
    packed, sfb = mx.quant_fp4_ref(torch.randn(n, k, generator=g), 32, scale_layout="mn-major-tma-aligned")
    sfa_blocked, sfb_blocked = mx.mx_scale_operands(pack_ue8m0(sa), sfb, m, n, k, sfb_per_row=True, sfb_granularity=32)
    d = mx.mx_gemm_ref(a, mx.from_blocked(sfa_blocked, m, k // 32), mx.e2m1_to_float(mx.unpack_e2m1(packed)),
                       mx.from_blocked(sfb_blocked, n, k // 32))
    want = (a.double() * sa.double().repeat_interleave(128, dim=1)) @ mx.dequant_fp4(packed, sfb).double().T
    assert torch.equal(d, want)


def test_k_grouped_tn_scales_and_product():
    """The tokens-first k-grouped gradient's scales (fp32 [S, rows], powers of two and NaN) become
    the blocked bytes of one scale per row and 32 tokens; with them the block-scaled product of
    each group's A_gᵀ and B_g over its 128-token blocks is `k_grouped_tn_reference`'s."""
    from cutegen.runtime.k_grouped_ops import k_grouped_tn_reference

    g = torch.Generator().manual_seed(7)
    s_blocks, m, n = 6, 144, 48
    exps = torch.randint(-20, 21, (s_blocks, m), generator=g).float()
    sfa = torch.pow(2.0, exps)
    sfa[0, 0], sfa[1, 3] = 2.0**-127, float("nan")
    blocked = mx.k_grouped_scale_operand(sfa)
    assert blocked.numel() == -(-m // 128) * s_blocks * 512
    back = mx.from_blocked(blocked, m, 4 * s_blocks)
    want = mx.expand_scales(mx.float_to_ue8m0(sfa).t(), 128)
    assert torch.equal(back, want)

    # Groups of 256, 0, 128 and 512 tokens (the last cut to the 3 blocks A holds past the others).
    sfa = torch.pow(2.0, torch.randint(-6, 7, (s_blocks, m), generator=g).float())
    sfb = torch.pow(2.0, torch.randint(-6, 7, (s_blocks, n), generator=g).float())
    a = (torch.randn(128 * s_blocks, m, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(128 * s_blocks, n, generator=g) * 4).to(torch.float8_e4m3fn)
    sizes = [256, 0, 128, 512]
    ref = k_grouped_tn_reference(a, sfa, b, sfb, sizes)
    sa = mx.from_blocked(mx.k_grouped_scale_operand(sfa), m, 4 * s_blocks)
    sb = mx.from_blocked(mx.k_grouped_scale_operand(sfb), n, 4 * s_blocks)
    first = 0
    for size, got in zip(sizes, ref):
        blocks = min(-(-size // 128), s_blocks - first)
        tokens = slice(128 * first, 128 * (first + blocks))
        vectors = slice(4 * first, 4 * (first + blocks))
        mma = mx.mx_gemm_ref(a[tokens].t().float(), sa[:, vectors], b[tokens].t().float(), sb[:, vectors])
        assert got.shape == (m, n)
        torch.testing.assert_close(got, mma, rtol=1e-12, atol=0)
        first += blocks
    assert first == s_blocks and not ref[1].any()
