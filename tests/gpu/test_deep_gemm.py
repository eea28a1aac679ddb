"""GPU tests of `cutegen.deep_gemm`, called exactly as vLLM and SGLang call DeepGEMM.

Tuple operands, ``torch.empty`` outputs written in place, row-major fp32 activation scales (what
engines' quantizers write), m_indices with -1 padding, cumulative group ends (psum layout), the
masked alias inside a captured CUDA graph, DeepGEMM's k-grouped operand layout: each result is
compared bit for bit with cutegen's native op on the same operands, and against the fp32
product of the unquantised inputs (calc_diff < 1e-3). Outputs are poisoned first.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff, quantize_per_block, quantize_per_token  # noqa: E402

pytestmark = pytest.mark.gpu

POISON = float("nan")


@pytest.fixture(scope="module")
def dg():
    import cutegen.deep_gemm as module

    return module


def poisoned(shape, dtype):
    return torch.full(shape, POISON, dtype=dtype, device="cuda")


def bitwise_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (128, 576, 7168), (333, 4096, 7168), (4096, 7168, 2048), (64, 24576, 1536)])
def test_fp8_gemm_nt_engine_call_matches_native(dg, m, n, k):
    from cutegen.runtime import fp8_ops

    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = quantize_per_token(a)  # row-major scales, as engines' quantizers write them
    qb, sb = quantize_per_block(b)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16).fill_(POISON)
    dg.fp8_gemm_nt((qa, sa), (qb, sb), d)
    native = fp8_ops.fp8_gemm_nt(qa, fp8_ops.to_mn_major_tma_aligned(sa), qb, sb)
    assert bitwise_equal(d, native)
    assert calc_diff(d, a.float() @ b.float().T) < 1e-3
    d2 = poisoned((m, n), torch.bfloat16)
    dg.fp8_fp4_gemm_nt((qa, dg.get_mn_major_tma_aligned_tensor(sa)), (qb, sb), d2, recipe=(1, 128, 128))
    assert bitwise_equal(d2, native)


@pytest.mark.parametrize("m,n,k", [(2112, 4096, 7168), (576, 4096, 2048), (4096, 7168, 512)])
def test_fp8_gemm_nt_weight_gradient_recipe(dg, m, n, k):
    from cutegen.runtime import fp8_ops

    torch.manual_seed(7)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = quantize_per_token(a)
    qb, sb = quantize_per_token(b)  # (1, 1, 128): per-row scales on both sides
    c = torch.randn(m, n, device="cuda") * 32
    torch.use_deterministic_algorithms(True)  # every tile whole: bitwise reproducible
    try:
        d = c.clone()
        dg.fp8_gemm_nt((qa, sa), (qb, sb), d, c=d, recipe=(1, 1, 128))  # DeepGEMM's in-place C = D
        native = c.clone()
        fp8_ops.fp8_wgrad_gemm_nt(
            qa, fp8_ops.to_mn_major_tma_aligned(sa), qb, fp8_ops.to_mn_major_tma_aligned(sb), native
        )
        assert bitwise_equal(d, native)
        d_no_c = poisoned((m, n), torch.float32)
        dg.fp8_gemm_nt((qa, sa), (qb, sb), d_no_c, recipe_a=(1, 128), recipe_b=(1, 128))
        assert calc_diff(d_no_c, a.float() @ b.float().T) < 1e-3
    finally:
        torch.use_deterministic_algorithms(False)
    assert calc_diff(d, c + a.float() @ b.float().T) < 1e-3


def _contiguous_problem(sizes, n, k, seed):
    from cutegen.runtime import grouped_ops

    g = torch.Generator(device="cuda").manual_seed(seed)
    aligned = [-(-s // 128) * 128 for s in sizes]
    total = sum(aligned)
    a = torch.zeros(total, k, device="cuda", dtype=torch.bfloat16)
    m_indices = torch.full((total,), -1, dtype=torch.int32, device="cuda")
    ends, row = [], 0
    for gi, (size, span) in enumerate(zip(sizes, aligned)):
        a[row : row + size] = torch.randn(size, k, device="cuda", generator=g).to(torch.bfloat16)
        m_indices[row : row + size] = gi
        ends.append(row + size)
        row += span
    b = torch.randn(len(sizes), n, k, device="cuda", generator=g).to(torch.bfloat16)
    qa, sa = quantize_per_token(a)
    qb, sb = zip(*(quantize_per_block(b[i]) for i in range(len(sizes))))
    group_ends = torch.tensor(ends, dtype=torch.int32, device="cuda")
    assert torch.equal(grouped_ops.m_indices_from_group_ends(group_ends, total), m_indices)
    return a, b, qa, sa, torch.stack(qb), torch.stack(sb), m_indices, group_ends


@pytest.mark.parametrize("groups,expected,n,k", [(4, 1024, 4096, 7168), (8, 300, 7168, 2048)])
def test_m_grouped_contiguous_engine_calls(dg, groups, expected, n, k):
    from cutegen.runtime import fp8_ops, grouped_ops

    rng = random.Random(groups)
    sizes = [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    sizes[1] = 0  # an empty expert
    a, b, qa, sa, qb, sb, m_indices, ends = _contiguous_problem(sizes, n, k, seed=groups)
    native = grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, fp8_ops.to_mn_major_tma_aligned(sa), qb, sb, m_indices)
    d = poisoned(tuple(native.shape), torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous((qa, sa), (qb, sb), d, m_indices)  # vLLM: positional m_indices
    assert bitwise_equal(d, native)
    d_psum = poisoned(tuple(native.shape), torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous((qa, sa), (qb, sb), d_psum, ends, use_psum_layout=True,
                                        expected_m_for_psum_layout=expected)
    assert bitwise_equal(d_psum, native)
    reference = torch.zeros_like(native, dtype=torch.float32)
    rows = m_indices.long()
    for gi in range(groups):
        sel = rows == gi
        reference[sel] = a[sel].float() @ b[gi].float().T
    assert calc_diff(d, reference) < 1e-3
    assert bool((d[rows < 0] == 0).all())


def test_m_grouped_alignment_other_than_128_is_refused(dg):
    qa = torch.zeros(128, 128, device="cuda", dtype=torch.float8_e4m3fn)
    sa = torch.ones(128, 1, device="cuda")
    qb = torch.zeros(1, 128, 128, device="cuda", dtype=torch.float8_e4m3fn)
    sb = torch.ones(1, 1, 1, device="cuda")
    d = torch.empty(128, 128, device="cuda", dtype=torch.bfloat16)
    dg.set_mk_alignment_for_contiguous_layout(64)
    try:
        with pytest.raises(ValueError, match="set_mk_alignment_for_contiguous_layout"):
            dg.m_grouped_fp8_gemm_nt_contiguous((qa, sa), (qb, sb), d, torch.zeros(128, dtype=torch.int32, device="cuda"))
    finally:
        dg.set_mk_alignment_for_contiguous_layout(dg.get_theoretical_mk_alignment_for_contiguous_layout())


def test_masked_alias_inside_a_cuda_graph(dg):
    from cutegen.runtime import fp8_ops, grouped_ops

    groups, max_m, n, k = 6, 256, 4096, 2048
    torch.manual_seed(3)
    a = torch.randn(groups, max_m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = zip(*(quantize_per_token(a[i]) for i in range(groups)))
    qb, sb = zip(*(quantize_per_block(b[i]) for i in range(groups)))
    qa, sa, qb, sb = torch.stack(qa), torch.stack(sa), torch.stack(qb), torch.stack(sb)
    masked_m = torch.tensor([0, 1, 100, 256, 37, 200], dtype=torch.int32, device="cuda")
    d = poisoned((groups, max_m, n), torch.bfloat16)
    dg.fp8_m_grouped_gemm_nt_masked((qa, sa), (qb, sb), d, masked_m, 128)  # warm-up loads the kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dg.fp8_m_grouped_gemm_nt_masked((qa, sa), (qb, sb), d, masked_m, 128)
    masked_m.copy_(torch.tensor([5, 256, 0, 129, 64, 1], dtype=torch.int32))
    d.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    native = grouped_ops.m_grouped_fp8_gemm_nt_masked(qa, fp8_ops.to_mn_major_tma_aligned(sa), qb, sb, masked_m, 128)
    for gi, rows in enumerate(masked_m.tolist()):
        assert bitwise_equal(d[gi, :rows], native[gi, :rows])
        if rows:
            assert calc_diff(d[gi, :rows], a[gi, :rows].float() @ b[gi].float().T) < 1e-3


def test_k_grouped_deepgemm_layout_matches_native(dg):
    from cutegen.runtime import k_grouped_ops, quant_ops

    groups, m, n = 4, 512, 768
    ks = [384, 0, 1280, 256]
    torch.manual_seed(11)
    dy = torch.randn(sum(ks), m, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(sum(ks), n, device="cuda", dtype=torch.bfloat16)
    sizes = torch.tensor(ks, dtype=torch.int32, device="cuda")
    qa, sfa = quant_ops.grouped_transposed_quant_fp8(dy, sizes, num_blocks=sum(ks) // 128)
    qb, sfb = quant_ops.grouped_transposed_quant_fp8(x, sizes, num_blocks=sum(ks) // 128)
    c = torch.randn(groups, m, n, device="cuda")
    torch.use_deterministic_algorithms(True)
    try:
        native = c.clone()
        k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, native, sizes)
        d = c.clone()  # DeepGEMM's layout: flat data, scales [rows, Σk/128] (MN-major views)
        dg.k_grouped_fp8_gemm_nt_contiguous((qa, sfa.T), (qb, sfb.T), d, ks, sizes, d)
    finally:
        torch.use_deterministic_algorithms(False)
    assert bitwise_equal(d, native)
    start = 0
    for gi, kg in enumerate(ks):
        ref = c[gi] + dy[start : start + kg].float().T @ x[start : start + kg].float()
        assert calc_diff(d[gi], ref) < 1e-3 if kg else torch.equal(d[gi], c[gi])
        start += kg


def test_bf16_gemm_nt_and_what_is_not_there(dg):
    from cutegen.runtime import ops

    a = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    d = poisoned((300, 512), torch.bfloat16)
    dg.bf16_gemm_nt(a, b, d)
    assert bitwise_equal(d, ops.bf16_gemm_nt(a, b))
    # fp32 D, then D = C + A·Bᵀ with C apart from D and with C = D (SGLang's and the weight
    # gradients' calls), the same bits as cutegen's own op.
    d32 = poisoned((300, 512), torch.float32)
    dg.bf16_gemm_nt(a, b, d32)
    assert bitwise_equal(d32, ops.bf16_gemm_nt(a, b, out=torch.empty_like(d32)))
    c = torch.randn(300, 512, device="cuda")
    dg.bf16_gemm_nt(a, b, d32, c=c)
    assert bitwise_equal(d32, ops.bf16_gemm_nt(a, b, c=c))
    dg.bf16_gemm_nt(a, b, d32, c=d32)
    assert calc_diff(d32, c + 2 * (a.float() @ b.float().T)) < 1e-6
    qa = torch.zeros(128, 64, dtype=torch.int8, device="cuda")
    with pytest.raises(NotImplementedError, match="FP4"):
        dg.fp8_gemm_nt((qa, torch.ones(128, 1, device="cuda")), (qa, torch.ones(128, 1, device="cuda")), d)
    # DeepGEMM's SM100 k-grouped form has sm_100a kernels only: elsewhere refused before a launch.
    from cutegen.runtime import ops
    from cutegen.runtime.errors import ArtifactError

    if not ops.runnable_kernels("k_grouped_fp8_gemm_tn_contiguous"):
        qt = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn)
        ones = torch.ones(2, 128, device="cuda")
        dk = torch.full((2, 128, 128), 3.0, device="cuda")
        with pytest.raises(ArtifactError, match="k_grouped_fp8_gemm_tn_contiguous: no kernel"):
            dg.k_grouped_fp8_gemm_tn_contiguous(
                (qt, ones), (qt, ones), dk, [128, 128], torch.tensor([128, 128], dtype=torch.int32, device="cuda"), c=dk
            )
        assert bool((dk == 3).all())


def test_set_num_sms_caps_the_persistent_grid(dg):
    from cutegen.runtime import fp8_ops, ops

    m, n, k = 4096, 4096, 2048
    qa = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    qb = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = fp8_ops.to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda") + 0.5)
    sb = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    full = fp8_ops.fp8_gemm_nt(qa, sa, qb, sb)
    device_sms = dg.get_num_sms()
    dg.set_num_sms(32)
    try:
        assert dg.get_num_sms() == 32
        d = poisoned((m, n), torch.bfloat16)
        dg.fp8_gemm_nt((qa, sa), (qb, sb), d)
        name = ops.choose_kernel(fp8_ops.OP_FP8_GEMM_NT, m, n, k, scale="f32")
        kernel = ops.catalogue().load(name, torch.cuda.current_device())
        prepared = next(reversed(kernel.launch_cache.values()))
        assert prepared.grid[0] * prepared.grid[1] * prepared.grid[2] <= 32
    finally:
        dg.set_num_sms(device_sms)
    assert dg.get_num_sms() == device_sms
    assert bitwise_equal(d, full) or calc_diff(d, full) < 1e-6  # another kernel may be chosen for 32 SMs
