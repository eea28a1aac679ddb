"""GPU tests of the dense GEMMs with a fused bias and/or activation (`fp8_gemm_nt_epilogue`, `bf16_gemm_nt_epilogue`, with a residual).

Every kernel of each epilogue is forced by name. With small integer operands (and power-of-two
scales) the GEMM's fp32 sums are exact whatever the summation order, so D must be
`bias_activation_ref` of those sums: bit for bit for a bias alone (one fp32 add, one rounding),
within one bf16 ulp where an activation's exp/erf may round differently from torch's. Outputs are
poisoned first (NaN); M = 1, ragged M and N off the tile width are covered; one launch is replayed
from a CUDA graph with new data.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_fused_epilogue import exact_sums, integer_operands  # noqa: E402

pytestmark = pytest.mark.gpu

EPILOGUES = (("bias", True, "none"), ("bias_silu", True, "silu"), ("bias_gelu", True, "gelu"),
             ("silu", False, "silu"), ("gelu", False, "gelu"))
SHAPES = ((1, 256, 512), (200, 200, 512), (1000, 776, 640))


@pytest.fixture(scope="module")
def epilogue(ops):
    from cutegen.runtime import epilogue_ops

    if not any(ops.runnable_kernels(f"{gemm}_{suffix}") for gemm in epilogue_ops.GEMM.values() for suffix, _, _ in EPILOGUES):
        pytest.skip("no bias/activation kernel of the catalogue runs on this GPU")
    return epilogue_ops


# GELU's negative tail: 1 + erf(x/√2) cancels in fp32, and the kernel's erf and torch's round
# differently there; measured on an H100 (NOTES N86): 0.06% of outputs differ from torch's, by at
# most 3.1e-5, and against fp64 both miss the rounded value equally often (3.31%, 3.32%).
GELU_TAIL_ABS = 2 ** -14


def assert_matches(out: torch.Tensor, ref: torch.Tensor, activation: str, name: str) -> None:
    """Bit for bit where one fp32 add and one rounding made `ref` ("none"), else within one bf16 ulp
    (and, for GELU, `GELU_TAIL_ABS`)."""
    assert not out.isnan().any(), f"{name}: unwritten (poisoned) elements"
    if activation == "none":
        assert torch.equal(out, ref), name
    else:
        # One bf16 ulp (2^-8 relative, the 8-bit significand) of the reference.
        diff = (out.float() - ref.float()).abs()
        tail = GELU_TAIL_ABS if activation == "gelu" else 2 ** -24
        assert (diff <= ref.float().abs() * 2 ** -8 + tail).all(), f"{name}: max diff {diff.max().item()}"


def integer_bf16(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-4, 5, (rows, cols), generator=g, device="cuda").to(torch.bfloat16)


@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("suffix, has_bias, activation", EPILOGUES, ids=[e[0] for e in EPILOGUES])
def test_fp8_epilogue_is_the_reference_of_exact_sums(epilogue, ops, m, n, k, suffix, has_bias, activation):
    from cutegen.runtime.fused_reference import bias_activation_ref

    qa, sa, qb, sb = integer_operands(m, -(-n // 128) * 128, k, seed=m + n)
    qb, sb = qb[:n].contiguous(), sb
    bias = (torch.randn(n, device="cuda") * 8).to(torch.bfloat16) if has_bias else None
    h = exact_sums(qa, sa, qb, sb)
    ref = bias_activation_ref(h, bias, activation)
    for name in ops.runnable_kernels(f"fp8_gemm_nt_{suffix}"):
        if "_epiadd_" in name:  # the residual kernels: `test_fp8_residual_is_added_to_the_biased_sum`
            continue
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        got = epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, bias, activation, out, kernel=name)
        assert got is out
        assert_matches(out, ref, activation, name)


@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("suffix, has_bias, activation", EPILOGUES, ids=[e[0] for e in EPILOGUES])
def test_bf16_epilogue_is_the_reference_of_exact_sums(epilogue, ops, m, n, k, suffix, has_bias, activation):
    from cutegen.runtime.fused_reference import bias_activation_ref

    a, b = integer_bf16(m, k, seed=m), integer_bf16(n, k, seed=n + 1)
    bias = (torch.randn(n, device="cuda") * 8).to(torch.bfloat16) if has_bias else None
    ref = bias_activation_ref(a.float() @ b.float().t(), bias, activation)
    for name in ops.runnable_kernels(f"bf16_gemm_nt_{suffix}"):
        if "_epiadd_" in name:  # the residual kernels: `test_residual_is_added_to_the_biased_sum`
            continue
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        epilogue.bf16_gemm_nt_epilogue(a, b, bias, activation, out, kernel=name)
        assert_matches(out, ref, activation, name)


@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda v: str(v))
def test_residual_is_added_to_the_biased_sum(epilogue, ops, m, n, k):
    """D = C + (A·Bᵀ + bias): the biased sum rounded to bf16, then added to C by the TMA's
    reduce-add (one more rounding: within one bf16 ulp of the fp32 sum's); in place (out is c) and
    into a new output."""
    from cutegen.runtime.fused_reference import bias_activation_ref

    a, b = integer_bf16(m, k, seed=m + 2), integer_bf16(n, k, seed=n + 3)
    bias = (torch.randn(n, device="cuda") * 8).to(torch.bfloat16)
    c = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    ref = (c.float() + bias_activation_ref(a.float() @ b.float().t(), bias).float()).to(torch.bfloat16)
    names = [x for x in ops.runnable_kernels("bf16_gemm_nt_bias") if "_epiadd_" in x]
    assert names
    for name in names:
        got = epilogue.bf16_gemm_nt_epilogue(a, b, bias, c=c, kernel=name)
        assert got is not c
        assert_matches(got, ref, "residual", name)
        inplace = c.clone()
        assert epilogue.bf16_gemm_nt_epilogue(a, b, bias, out=inplace, c=inplace, kernel=name) is inplace
        assert torch.equal(inplace, got), name


@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("has_bias", (True, False), ids=("bias", "no_bias"))
def test_fp8_residual_is_added_to_the_biased_sum(epilogue, ops, m, n, k, has_bias):
    """The FP8 GEMM's residual, D = C + (A·Bᵀ + bias) (a zero bias when none is given): the biased
    exact sum rounded to bf16, added to C by the reduce-add; in place and into a new output."""
    from cutegen.runtime.fused_reference import bias_activation_ref

    qa, sa, qb, sb = integer_operands(m, -(-n // 128) * 128, k, seed=m + n + 5)
    qb = qb[:n].contiguous()
    bias = (torch.randn(n, device="cuda") * 8).to(torch.bfloat16) if has_bias else None
    c = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    ref = (c.float() + bias_activation_ref(exact_sums(qa, sa, qb, sb), bias).float()).to(torch.bfloat16)
    names = [x for x in ops.runnable_kernels("fp8_gemm_nt_bias") if "_epiadd_" in x]
    assert names
    for name in names:
        got = epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, bias, c=c, kernel=name)
        assert got is not c
        assert_matches(got, ref, "residual", name)
        inplace = c.clone()
        assert epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, bias, out=inplace, c=inplace, kernel=name) is inplace
        assert torch.equal(inplace, got), name
    # The heuristic's choice among them, with the residual given.
    assert torch.equal(epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, bias, c=c), got)


def test_fp8_residual_without_a_bias_captured_first_then_eager(epilogue, ops):
    """The zero bias of a residual without one, first needed inside a CUDA-graph capture: the graph
    writes its own zeros, and a later eager call gets zeros that exist outside the graph."""
    if not [x for x in ops.runnable_kernels("fp8_gemm_nt_bias") if "_epiadd_" in x]:
        pytest.skip("no FP8 residual kernel runs on this GPU")
    from cutegen.runtime.fused_reference import bias_activation_ref

    m, n, k = 96, 392, 512  # an N no other test uses: the zero bias is not made yet
    qa, sa, qb, sb = integer_operands(m, -(-n // 128) * 128, k, seed=77)
    qb = qb[:n].contiguous()
    c = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    ref = (c.float() + bias_activation_ref(exact_sums(qa, sa, qb, sb)).float()).to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, out=out, c=c)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, ref, "residual", "captured")
    assert_matches(epilogue.fp8_gemm_nt_epilogue(qa, sa, qb, sb, c=c), ref, "residual", "eager after capture")


def test_random_data_close_to_the_fp64_reference_and_a_new_output_by_default(epilogue, ops):
    """bf16 operands of a real layer's scale: D within bf16 rounding of act(A·Bᵀ + bias) in fp64."""
    g = torch.Generator(device="cuda").manual_seed(3)
    m, n, k = 333, 2112, 7168
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    y = a.double() @ b.double().t() + bias.double()
    ref = torch.nn.functional.gelu(y)
    out = epilogue.bf16_gemm_nt_epilogue(a, b, bias, "gelu")
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    err = (out.double() - ref).abs()
    assert (err <= ref.abs() * 2 ** -7 + 1e-3 * ref.abs().amax()).all(), err.max().item()


def test_graph_replay_reads_new_data_and_the_torch_op_matches(epilogue, ops):
    from cutegen.runtime.fused_reference import bias_activation_ref

    m, n, k = 128, 384, 256
    a, b = integer_bf16(m, k, seed=5), integer_bf16(n, k, seed=6)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    epilogue.bf16_gemm_nt_epilogue(a, b, bias, "silu", out)  # warm-up: load the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        epilogue.bf16_gemm_nt_epilogue(a, b, bias, "silu", out)
    a.copy_(integer_bf16(m, k, seed=7))
    bias.copy_(torch.randn(n, device="cuda").to(torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, bias_activation_ref(a.float() @ b.float().t(), bias, "silu"), "silu", "graph replay")
    again = torch.empty_like(out)
    torch.ops.cutegen.bf16_gemm_nt_epilogue(a, b, bias, "silu", again)
    assert torch.equal(again, out)
