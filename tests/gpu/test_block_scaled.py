"""GPU tests of the block-scaled kernels (sm_100a, ``scale = "mx"``: the tensor cores apply the UE8M0
scales; ``"nv"``: NVFP4's E4M3 scales), for every op that has them: the dense FP8, FP8 x FP4 and
NVFP4 GEMMs, the M-grouped GEMMs over both layouts with FP8 or FP4 experts, and the weight
gradients (dense, and k-grouped tokens first).

On a Blackwell GPU every such kernel runs, forced by name, against the fp32 product of its
dequantised operands (what the MMA accumulates, up to summation order and the output rounding) and,
for FP8 operands, the product of the unquantised inputs. On any other GPU (the H200) each op called
with packed UE8M0 scales or FP4 weights is refused before a launch, naming the argument, and its
output is left as it was.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime.errors import InputError  # noqa: E402

pytestmark = pytest.mark.gpu

GEMM, CONTIGUOUS, MASKED, WGRAD = (
    "fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "fp8_wgrad_gemm_nt",
)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)


def fp8_rows(x: torch.Tensor):
    """x [R, K] -> (e4m3 [R, K], packed UE8M0 [R, ⌈K/512⌉] MN-major TMA-aligned, fp32 dequantised)."""
    from cutegen.runtime import quant_reference as qr

    q, words = qr.per_token_quant_fp8_ref(x, scale_format="ue8m0", scale_layout="mn-major-tma-aligned")
    return q, words, qr.dequant_per_token(q, words, scale_format="ue8m0")


def fp4_rows(x: torch.Tensor):
    """x [R, K] -> (packed e2m1 int8 [R, K/2], packed UE8M0 per 1x32 [R, K/128] MN-major
    TMA-aligned, fp32 dequantised)."""
    from cutegen.deep_gemm.utils import math as dgm
    from cutegen.runtime.quant_reference import to_mn_major_tma_aligned

    q, words = dgm.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    return q, to_mn_major_tma_aligned(words), dgm.cast_back_from_fp4(q, words, gran_k=32, use_packed_ue8m0=True)


def weights(x: torch.Tensor, b_dtype: str):
    return fp4_rows(x) if b_dtype == "e2m1" else fp8_rows(x)


def inputs(*shape, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def check(out: torch.Tensor, exact: torch.Tensor, unquantised: torch.Tensor | None, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (unwritten elements?)"
    assert calc_diff(out.float(), exact) < 2e-5, f"{what}: differs from the dequantised product"
    if unquantised is not None:
        assert calc_diff(out.float(), unquantised) < 1e-3, f"{what}: calc_diff vs unquantised"


def mx_kernels(ops, op: str, b_dtype: str) -> list[str]:
    names = ops.runnable_kernels(op, scale="mx", b_dtype=b_dtype)
    if not names:
        pytest.skip(f"no block-scaled {op} kernel with {b_dtype} B runs on this GPU (they are sm_100a kernels)")
    return names


@pytest.mark.parametrize("b_dtype", ["e4m3", "e2m1"])
@pytest.mark.parametrize("m, n, k", [(1, 2112, 7168), (128, 4096, 1024), (1000, 776, 1024), (4096, 7168, 2048)])
def test_dense(ops, b_dtype, m, n, k):
    from cutegen.runtime import fp8_ops

    names = mx_kernels(ops, GEMM, b_dtype)
    a, b = inputs(m, k, seed=1), inputs(n, k, seed=2)
    qa, sfa, da = fp8_rows(a)
    qb, sfb, db = weights(b, b_dtype)
    unquantised = a.float() @ b.float().T if b_dtype == "e4m3" else None
    for name in names:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        fp8_ops.fp8_gemm_nt(qa, sfa, qb, sfb, out=out, kernel=name)
        check(out, da @ db.T, unquantised, name)


@pytest.mark.parametrize("b_dtype", ["e4m3", "e2m1"])
def test_contiguous(ops, b_dtype):
    """Experts of 300, 0, 128 and 77 rows (segments aligned to 128), a row whose m_indices names no
    group (G + 5): real rows against their expert's product, padding rows zero."""
    from cutegen.runtime import grouped_ops

    names = mx_kernels(ops, CONTIGUOUS, b_dtype)
    g, n, k, sizes = 4, 776, 1024, [300, 0, 128, 77]
    m = sum(-(-s // 128) * 128 for s in sizes)
    ends = torch.tensor([sum(-(-s // 128) * 128 for s in sizes[:i]) + sizes[i] for i in range(g)], dtype=torch.int32)
    m_indices = grouped_ops.m_indices_from_group_ends(ends.cuda(), m)
    m_indices[5] = g + 5
    a, w = inputs(m, k, seed=3), inputs(g, n, k, seed=4)
    qa, sfa, da = fp8_rows(a)
    packed = [weights(w[i], b_dtype) for i in range(g)]
    qb = torch.stack([p[0] for p in packed])
    sfb = grouped_ops_mn_major(torch.stack([p[1].contiguous() for p in packed]))
    rows = m_indices.long().cpu()
    for name in names:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, m_indices, out=out, kernel=name)
        for i in range(g):
            real = (rows == i).nonzero().flatten().cuda()
            if real.numel():
                check(out[real], da[real] @ packed[i][2].T, None, f"{name} expert {i}")
        padding = ((rows < 0) | (rows >= g)).nonzero().flatten().cuda()
        assert bool((out[padding] == 0).all()), f"{name}: padding rows not zero"


@pytest.mark.parametrize("b_dtype", ["e4m3", "e2m1"])
def test_masked(ops, b_dtype):
    """Three experts of max_m 384 rows with 0, 200 and 384 real rows: each real row against its
    expert's product; group 0 of D untouched. 384 rows are three 128-row scale blocks, so a CTA
    pair's second CTA has no rows in an expert's last 256-row tile."""
    from cutegen.runtime import grouped_ops

    names = mx_kernels(ops, MASKED, b_dtype)
    g, max_m, n, k = 3, 384, 4096, 1024
    masked_m = torch.tensor([0, 200, 384], dtype=torch.int32, device="cuda")
    a, w = inputs(g, max_m, k, seed=5), inputs(g, n, k, seed=6)
    per_group = [fp8_rows(a[i]) for i in range(g)]
    qa = torch.stack([p[0] for p in per_group])
    sfa = grouped_ops_mn_major(torch.stack([p[1].contiguous() for p in per_group]))
    packed = [weights(w[i], b_dtype) for i in range(g)]
    qb = torch.stack([p[0] for p in packed])
    sfb = grouped_ops_mn_major(torch.stack([p[1].contiguous() for p in packed]))
    for name in names:
        out = torch.full((g, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_ops.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sfb, masked_m, 200, out=out, kernel=name)
        assert bool(torch.isnan(out[0]).all()), f"{name}: an expert with no rows was written"
        for i in (1, 2):
            r = int(masked_m[i])
            check(out[i, :r], per_group[i][2][:r] @ packed[i][2].T, None, f"{name} expert {i}")


def test_weight_gradient(ops):
    """D = C + A·Bᵀ in fp32 with packed UE8M0 scales per 1x128 on both sides."""
    from cutegen.runtime import fp8_ops

    names = mx_kernels(ops, WGRAD, "e4m3")
    m, n, k = 1536, 776, 2048
    a, b = inputs(m, k, seed=7), inputs(n, k, seed=8)
    qa, sfa, da = fp8_rows(a)
    qb, sfb, db = fp8_rows(b)
    c = torch.randn(m, n, device="cuda")
    for name in names:
        d = torch.full((m, n), float("nan"), device="cuda")
        fp8_ops.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d, c=c, kernel=name)
        check(d - c, da @ db.T, a.float() @ b.float().T, name)


@pytest.mark.parametrize("recipe", [(1, 1, 128), (1, 128, 128)])
def test_deep_gemm_fp32_d_and_c_with_bf16_d(ops, recipe):
    """DeepGEMM's SM100 `fp8_gemm_nt` with fp32 D (C optional) under either recipe, and a bf16 D
    with C, through `cutegen.deep_gemm` (the weight-gradient kernels; B's block scales per row)."""
    from cutegen.runtime import quant_reference as qr
    import cutegen.deep_gemm as dg

    mx_kernels(ops, WGRAD, "e4m3")
    m, n, k = 1000, 776, 1024
    a, b = inputs(m, k, seed=16), inputs(n, k, seed=17)
    qa, sfa, da = fp8_rows(a)
    if recipe == (1, 1, 128):
        qb, sfb, db = fp8_rows(b)
    else:
        qb, sfb = qr.per_block_quant_fp8_ref(b, scale_format="ue8m0")
        db = qr.dequant_per_block(qb, qr.unpack_ue8m0(sfb, -(-k // 128)))
    exact = da @ db.T
    c = torch.randn(m, n, device="cuda")
    for d_dtype, with_c in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, True)):
        d = torch.full((m, n), float("nan"), device="cuda", dtype=d_dtype)
        cc = c.to(d_dtype) if with_c else None
        dg.fp8_gemm_nt((qa, sfa), (qb, sfb), d, c=cc, recipe=recipe)
        check(d.float() - (cc.float() if with_c else 0), exact, None, f"{recipe} {d_dtype} C={with_c}")


def grouped_ops_mn_major(words: torch.Tensor) -> torch.Tensor:
    """Per-group words [G, R, W] in the MN-major TMA-aligned layout, groups back to back."""
    from cutegen.runtime.quant_reference import to_mn_major_tma_aligned

    return to_mn_major_tma_aligned(words)


def test_refused_where_no_block_scaled_kernel_runs(ops):
    """Packed UE8M0 scales and FP4 weights on a GPU without block-scaled kernels (Hopper): every op
    refuses them before a launch, naming the argument; the outputs are untouched."""
    from cutegen.runtime import fp8_ops, grouped_ops

    if any(ops.runnable_kernels(op, scale="mx") for op in (GEMM, CONTIGUOUS, MASKED, WGRAD)):
        pytest.skip("this GPU runs block-scaled kernels (test_dense and the others check them)")
    m, n, k, g = 256, 256, 512, 2
    qa, sfa, _ = fp8_rows(inputs(m, k, seed=9))
    qb, sfb, _ = fp8_rows(inputs(n, k, seed=10))
    qb4, sfb4, _ = fp4_rows(inputs(n, k, seed=11))
    out = torch.full((m, n), 3.0, device="cuda", dtype=torch.bfloat16)
    for b, sf, arg in ((qb, sfb, "sfb"), (qb4, sfb4, "b")):
        with pytest.raises(InputError, match=f"argument '{arg}'"):
            fp8_ops.fp8_gemm_nt(qa, sfa, b, sf, out=out)
    d = torch.full((m, n), 3.0, device="cuda")
    with pytest.raises(InputError, match="argument 'sfa'"):
        fp8_ops.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d)
    experts_b = qb.unsqueeze(0).expand(g, n, k).contiguous()
    experts_sfb = grouped_ops_mn_major(sfb.contiguous().unsqueeze(0).expand(g, n, -1).contiguous())
    m_indices = torch.zeros(m, dtype=torch.int32, device="cuda")
    with pytest.raises(InputError, match="argument 'sfa'"):
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, experts_b, experts_sfb, m_indices, out=out)
    experts_a = qa.unsqueeze(0).expand(g, m, k).contiguous()
    experts_sfa = grouped_ops_mn_major(sfa.contiguous().unsqueeze(0).expand(g, m, -1).contiguous())
    out3 = torch.full((g, m, n), 3.0, device="cuda", dtype=torch.bfloat16)
    experts_b4 = qb4.unsqueeze(0).expand(g, n, k // 2).contiguous()
    experts_sfb4 = grouped_ops_mn_major(sfb4.contiguous().unsqueeze(0).expand(g, n, -1).contiguous())
    with pytest.raises(InputError, match="argument 'b'"):
        grouped_ops.m_grouped_fp8_gemm_nt_masked(
            experts_a, experts_sfa, experts_b4, experts_sfb4, torch.full((g,), m, dtype=torch.int32, device="cuda"), m,
            out=out3,
        )
    torch.cuda.synchronize()
    assert bool((out == 3).all()) and bool((d == 3).all()) and bool((out3 == 3).all())


NVFP4 = "nvfp4_gemm_nt"


def nvfp4_rows(x: torch.Tensor):
    """x [R, K] -> (packed e2m1 [R, K/2], E4M3 scales in the blocked layout, the global scale, fp32
    dequantised), NVFP4's recipe (`mx_reference.quant_nvfp4_ref`)."""
    from cutegen.runtime import mx_reference as mx

    gs = mx.nvfp4_global_scale(x)
    q, sf = mx.quant_nvfp4_ref(x, gs)
    return q, mx.to_blocked(sf.view(torch.uint8)), gs, mx.dequant_nvfp4(q, sf, gs)


@pytest.mark.parametrize("m, n, k", [(1, 2112, 7168), (128, 4096, 1024), (1000, 776, 1024), (4096, 7168, 2048)])
def test_nvfp4(ops, m, n, k):
    """D = alpha · A·Bᵀ from NVFP4 operands, every kernel forced by name, against the fp32 product of
    the dequantised operands (and, loosely, of the unquantised inputs)."""
    from cutegen.runtime import nvfp4_ops

    names = ops.runnable_kernels(NVFP4, scale="nv")
    if not names:
        pytest.skip("no NVFP4 kernel runs on this GPU (they are sm_100a kernels)")
    a, b = inputs(m, k, seed=21), inputs(n, k, seed=22)
    qa, sfa, ga, da = nvfp4_rows(a)
    qb, sfb, gb, db = nvfp4_rows(b)
    alpha = (1.0 / (ga * gb)).to(torch.float32)
    unquantised = a.float() @ b.float().T
    for name in names:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        nvfp4_ops.nvfp4_gemm_nt(qa, sfa, qb, sfb, alpha, out=out, kernel=name)
        assert not torch.isnan(out).any(), f"{name}: NaN in the output (unwritten elements?)"
        assert calc_diff(out.float(), da @ db.T) < 2e-5, f"{name}: differs from the dequantised product"
        # FP4 keeps one mantissa bit (DeepGEMM's bound for FP4 x FP4 is 0.02).
        assert calc_diff(out.float(), unquantised) < 0.02, f"{name}: calc_diff vs unquantised"


def test_nvfp4_refused_where_no_kernel_runs(ops):
    """On a GPU without NVFP4 kernels (Hopper), the op refuses the call before a launch, naming 'a';
    the output is untouched."""
    from cutegen.runtime import nvfp4_ops

    if ops.runnable_kernels(NVFP4):
        pytest.skip("this GPU runs the NVFP4 kernels (test_nvfp4 checks them)")
    qa, sfa, ga, _ = nvfp4_rows(inputs(256, 512, seed=23))
    qb, sfb, gb, _ = nvfp4_rows(inputs(256, 512, seed=24))
    out = torch.full((256, 256), 3.0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="nvfp4_gemm_nt: argument 'a' holds NVFP4.*catalogue has none"):
        nvfp4_ops.nvfp4_gemm_nt(qa, sfa, qb, sfb, (1.0 / (ga * gb)).float(), out=out)
    torch.cuda.synchronize()
    assert bool((out == 3).all())


KGROUPED_TN = "k_grouped_fp8_gemm_tn_contiguous"


def fp8_token_blocks(x: torch.Tensor):
    """x [Σk, R] (tokens first) -> (e4m3 [Σk, R], fp32 scales [Σk/128, R] per 128-token block and
    column, powers of two as UE8M0 holds them, fp32 dequantised)."""
    blocks = x.float().view(-1, 128, x.shape[1])
    amax = blocks.abs().amax(dim=1).clamp_min(1e-4)
    scales = torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0)))
    q = (blocks / scales.unsqueeze(1)).to(torch.float8_e4m3fn)
    return q.view_as(x), scales, (q.float() * scales.unsqueeze(1)).view(x.shape)


def test_k_grouped_tn(ops):
    """DeepGEMM's SM100 k-grouped weight gradient: D[g] = C[g] + A_gᵀ B_g over each group's tokens
    (an empty group keeps C), every block-scaled kernel forced by name."""
    from cutegen.runtime import k_grouped_ops

    names = mx_kernels(ops, KGROUPED_TN, "e4m3")
    sizes, m, n = [256, 0, 384, 128, 512], 1024, 528
    tokens = sum(sizes)
    qa, sfa, da = fp8_token_blocks(inputs(tokens, m, seed=12))
    qb, sfb, db = fp8_token_blocks(inputs(tokens, n, seed=13))
    group_sizes = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    c = torch.randn(len(sizes), m, n, device="cuda")
    for name in names:
        d = torch.full_like(c, float("nan"))
        k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous(qa, sfa, qb, sfb, d, group_sizes, c, kernel=name)
        first = 0
        for g, size in enumerate(sizes):
            rows = slice(first, first + size)
            if size == 0:
                assert torch.equal(d[g], c[g]), f"{name}: an empty group's D is not C"
            else:
                check(d[g] - c[g], da[rows].T @ db[rows], None, f"{name} group {g}")
            first += size


def test_k_grouped_tn_refused_where_no_block_scaled_kernel_runs(ops):
    """On a GPU without sm_100a kernels the tokens-first k-grouped gradient fails before a launch,
    naming the GPU and the architectures its kernels are built for; D (and C) are untouched."""
    from cutegen.runtime import k_grouped_ops
    from cutegen.runtime.errors import ArtifactError

    if ops.runnable_kernels(KGROUPED_TN):
        pytest.skip("this GPU runs the block-scaled k-grouped kernels (test_k_grouped_tn checks them)")
    qa, sfa, _ = fp8_token_blocks(inputs(256, 128, seed=14))
    qb, sfb, _ = fp8_token_blocks(inputs(256, 64, seed=15))
    d = torch.full((2, 128, 64), 3.0, device="cuda")
    c = torch.full_like(d, 5.0)
    with pytest.raises(ArtifactError, match="k_grouped_fp8_gemm_tn_contiguous: no kernel in the catalogue .* runs on"):
        k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous(
            qa, sfa, qb, sfb, d, torch.tensor([128, 128], dtype=torch.int32, device="cuda"), c
        )
    torch.cuda.synchronize()
    assert bool((d == 3).all())
