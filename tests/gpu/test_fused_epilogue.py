"""GPU tests of the FP8 GEMMs with the SwiGLU + FP8 quantize epilogue (dense, contiguous, masked).

Every kernel of each op is forced by name. Exactness: with small integer operands and power-of-two
scales the GEMM's fp32 sums are exact whatever the summation order, so the kernel's e4m3 bytes
and scales must equal `swiglu_quant_ref` computed by torch on the GPU from those sums, bit for bit,
with exact scales and with scales rounded to powers of two (`use_ue8m0`).
Accuracy: on random quantized data, the dequantized output is within e4m3's half ulp of SwiGLU of
the fp64 product of the dequantized operands. Outputs are poisoned first; rows past M (past
masked_m, padding rows) are checked as the op documents.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import dequantized_reference, quantize_per_block, quantize_per_token  # noqa: E402

pytestmark = pytest.mark.gpu

OPS = ("fp8_gemm_nt_swiglu_quant", "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant",
       "m_grouped_fp8_gemm_nt_masked_swiglu_quant")
POISON_Q = 0x7E  # e4m3 448: never what a zero or small activation quantizes to
EPS = 1e-4


@pytest.fixture(scope="module")
def fused(ops):
    from cutegen.runtime import fused_ops

    if not any(ops.runnable_kernels(op) for op in OPS):
        pytest.skip("no SwiGLU kernel of the catalogue runs on this GPU")
    return fused_ops


def kernels(ops, op, ue8m0=False):
    """The op's kernels (those whose output scales are powers of two with ``ue8m0``)."""
    return ops.runnable_kernels(op + ("_ue8m0" if ue8m0 else ""))


# Exact fp32 scales, and scales rounded up to powers of two (`use_ue8m0`).
UE8M0 = pytest.mark.parametrize("ue8m0", (False, True), ids=("f32", "ue8m0"))


def integer_operands(rows: int, n: int, k: int, seed: int, groups: int | None = None):
    """e4m3 A, B with values in -4..4 and power-of-two scales: exact fp32 sums."""
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    g = torch.Generator(device="cuda").manual_seed(seed)
    lead = () if groups is None else (groups,)
    a = torch.randint(-4, 5, (rows, k), generator=g, device="cuda").float()
    b = torch.randint(-4, 5, (*lead, n, k), generator=g, device="cuda").float()
    sfa = torch.exp2(torch.randint(-4, 1, (rows, k // 128), generator=g, device="cuda").float())
    sfb = torch.exp2(torch.randint(-3, 1, (*lead, n // 128, k // 128), generator=g, device="cuda").float())
    return (a.to(torch.float8_e4m3fn), to_mn_major_tma_aligned(sfa), b.to(torch.float8_e4m3fn), sfb.contiguous())


def exact_sums(qa, sa, qb, sb) -> torch.Tensor:
    """The GEMM's sums (exact in fp32 for integer operands and power-of-two scales), in B's row order."""
    return dequantized_reference(qa, sa.contiguous(), qb, sb).float()


def masked_integer_operands(groups: int, max_m: int, n: int, k: int, seed: int):
    """`integer_operands` per group (seeds seed, seed + 1, ...), and the masked layout's A, SFA
    (MN-major), B, SFB stacked from them: (parts, qa, sa, qb, sb)."""
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    parts = [integer_operands(max_m, n, k, seed=seed + gi) for gi in range(groups)]
    qa = torch.stack([p[0] for p in parts])
    sa = to_mn_major_tma_aligned(torch.stack([p[1] for p in parts]))
    qb = torch.stack([p[2] for p in parts])
    sb = torch.stack([p[3] for p in parts])
    return parts, qa, sa, qb, sb


def contiguous_exact_sums(qa, sa, qb, sb, m_indices, groups: int) -> torch.Tensor:
    """The contiguous layout's sums per row (exact, as `exact_sums`), in B's row order; zero on
    rows naming no group."""
    h = torch.zeros(qa.shape[0], qb.shape[-2], device="cuda")
    for gi in range(groups):
        sel = m_indices == gi
        if sel.any():
            h[sel] = exact_sums(qa[sel], sa[sel], qb[gi], sb[gi])
    return h


def reference_of_interleaved(h_interleaved: torch.Tensor, ue8m0: bool = False):
    from cutegen.runtime.fused_reference import deinterleave_gate_up, swiglu_quant_ref

    h = deinterleave_gate_up(h_interleaved.T.contiguous()).T  # back to gate | up columns
    return swiglu_quant_ref(h, eps=EPS, use_ue8m0=ue8m0)


def assert_bitwise(q, sf, q_ref, sf_ref, rows):
    assert torch.equal(q[:rows].view(torch.uint8), q_ref[:rows].view(torch.uint8))
    assert torch.equal(sf[:rows].contiguous().view(torch.int32), sf_ref[:rows].contiguous().view(torch.int32))


@UE8M0
@pytest.mark.parametrize("m", [1, 200, 1024])
def test_dense_is_bitwise_the_reference_of_exact_sums(fused, ops, m, ue8m0):
    n, k = 512, 512
    qa, sa, qb, sb = integer_operands(m, n, k, seed=m)
    q_ref, sf_ref = reference_of_interleaved(exact_sums(qa, sa, qb, sb), ue8m0)
    if ue8m0:  # the reference rounds the scales to powers of two
        assert (torch.frexp(sf_ref)[0] == 0.5).all()
    names = kernels(ops, OPS[0], ue8m0)
    assert names
    for name in names:
        out = torch.full((m, n // 2), POISON_Q, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        q, sf = fused.fp8_gemm_nt_swiglu_quant(qa, sa, qb, sb, out=out, eps=EPS, use_ue8m0=ue8m0, kernel=name)
        assert q is out
        assert_bitwise(q, sf, q_ref, sf_ref, m)
    # The heuristic's choice serves the same scale rounding.
    q, sf = fused.fp8_gemm_nt_swiglu_quant(qa, sa, qb, sb, eps=EPS, use_ue8m0=ue8m0)
    assert_bitwise(q, sf, q_ref, sf_ref, m)


@pytest.mark.parametrize("m, n, k", [(333, 2 * 2048, 7168), (4096, 2 * 768, 2048)])
def test_dense_random_data_within_half_an_ulp_of_fp64(fused, ops, m, n, k):
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned
    from cutegen.runtime.quant_reference import dequant_per_token

    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    qa, sa = quantize_per_token(x)
    qb, sb = quantize_per_block(w)
    h = dequantized_reference(qa, sa, qb, sb).double()
    from cutegen.runtime.fused_reference import deinterleave_gate_up

    h = deinterleave_gate_up(h.T.contiguous()).T
    act = torch.nn.functional.silu(h[:, : n // 2]) * h[:, n // 2:]
    for name in kernels(ops, OPS[0]):
        q, sf = fused.fp8_gemm_nt_swiglu_quant(qa, to_mn_major_tma_aligned(sa), qb, sb, kernel=name)
        deq = dequant_per_token(q, sf.contiguous()).double()
        bound = act.abs() / 16 + sf.contiguous().repeat_interleave(128, 1).double() * 2 ** -9 + 1e-3 * act.abs().amax()
        assert ((deq - act).abs() <= bound).all(), name


@UE8M0
def test_contiguous_padding_rows_and_empty_groups(fused, ops, ue8m0):
    sizes = [0, 200, 1, 384]
    n, k, groups = 512, 512, len(sizes)
    aligned = [-(-s // 128) * 128 for s in sizes]
    rows = sum(aligned)
    qa, sa, qb, sb = integer_operands(rows, n, k, seed=3, groups=groups)
    m_indices = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    start = 0
    for gi, (s, al) in enumerate(zip(sizes, aligned)):
        m_indices[start:start + s] = gi
        start += al
    h = contiguous_exact_sums(qa, sa, qb, sb, m_indices, groups)
    q_ref, sf_ref = reference_of_interleaved(h, ue8m0)
    for name in kernels(ops, OPS[1], ue8m0):
        for zero_padding in (True, False):
            out = torch.full((rows, n // 2), POISON_Q, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
            q, sf = fused.m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(
                qa, sa, qb, sb, m_indices, out=out, zero_padding=zero_padding, eps=EPS, use_ue8m0=ue8m0, kernel=name
            )
            real = m_indices >= 0
            assert torch.equal(q[real].view(torch.uint8), q_ref[real].view(torch.uint8)), name
            assert torch.equal(sf[real], sf_ref[real]), name
            if zero_padding:  # padding rows: zeros, scale eps/448 (a zero row's)
                assert torch.equal(q[~real].view(torch.uint8), q_ref[~real].view(torch.uint8)), name


@UE8M0
@pytest.mark.parametrize("n", [512, 768])  # 768: three N tiles, a 1x2 cluster's fourth past N
def test_masked_rows_and_graph_replay(fused, ops, n, ue8m0):
    groups, max_m, k = 4, 256, 512
    masked = torch.tensor([0, 1, 130, 256], dtype=torch.int32, device="cuda")
    parts, qa, sa, qb, sb = masked_integer_operands(groups, max_m, n, k, seed=10)
    refs = [reference_of_interleaved(exact_sums(*p), ue8m0) for p in parts]
    for name in kernels(ops, OPS[2], ue8m0):
        out = torch.full((groups, max_m, n // 2), POISON_Q, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        q, sf = fused.m_grouped_fp8_gemm_nt_masked_swiglu_quant(
            qa, sa, qb, sb, masked, 128, out=out, eps=EPS, use_ue8m0=ue8m0, kernel=name
        )
        for gi in range(groups):
            rows = int(masked[gi])
            assert_bitwise(q[gi], sf[gi], *refs[gi], rows)
        # Rows of tiles past masked_m are never computed: group 0's first tile stays poisoned.
        assert (q[0].view(torch.uint8) == POISON_Q).all()
        graph = torch.cuda.CUDAGraph()
        out.view(torch.uint8).fill_(POISON_Q)
        with torch.cuda.graph(graph):
            fused.m_grouped_fp8_gemm_nt_masked_swiglu_quant(
                qa, sa, qb, sb, masked, 128, out=out, out_sf=sf, eps=EPS, use_ue8m0=ue8m0, kernel=name
            )
        graph.replay()
        torch.cuda.synchronize()
        for gi in range(1, groups):
            assert_bitwise(out[gi], sf[gi], *refs[gi], int(masked[gi]))
