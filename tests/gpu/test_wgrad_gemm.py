"""GPU tests of the FP8 weight-gradient GEMM (``fp8_wgrad_gemm_nt``): both operands scaled per
1x128 along K, fp32 accumulation into D (C = D allowed), against fp32 references."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff, quantize_per_token  # noqa: E402

pytestmark = pytest.mark.gpu

OP = "fp8_wgrad_gemm_nt"
MN = [(7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168)]
KS = [4096, 8192]


@pytest.fixture(scope="module")
def fp8(ops):
    from cutegen.runtime import fp8_ops

    if not ops.runnable_kernels(OP):
        pytest.skip(f"no {OP} kernel of the catalogue runs on this GPU")
    return fp8_ops


def make(m: int, n: int, k: int, seed: int = 0):
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    qa, sa = quantize_per_token(a)
    qb, sb = quantize_per_token(b)
    return a, b, qa, to_mn_major_tma_aligned(sa), qb, to_mn_major_tma_aligned(sb)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m, n", MN, ids=[f"{m}x{n}" for m, n in MN])
def test_accumulates_into_d(fp8, m, n, k):
    a, b, qa, sfa, qb, sfb = make(m, n, k)
    c = torch.randn(m, n, device="cuda") * 50
    d = c.clone()
    fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d)  # C = D, in place
    ref = c + a.float() @ b.float().T
    assert calc_diff(d, ref) < 1e-3


def test_separate_c_and_every_kernel(ops, fp8):
    a, b, qa, sfa, qb, sfb = make(1000, 1000, 512, seed=2)
    c = torch.randn(1000, 1000, device="cuda")
    ref = c + a.float() @ b.float().T
    for name in ops.runnable_kernels(OP):
        d = torch.full((1000, 1000), float("nan"), device="cuda")
        fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d, c=c, kernel=name)
        assert calc_diff(d, ref) < 1e-3, name


def test_odd_n_view_every_kernel(ops, fp8):
    """D a view of wider rows (N = 333 odd, row stride 336): every kernel adds into the 333
    columns and leaves the columns past N, which belong to the caller's storage, untouched."""
    m, n, k = 300, 333, 384
    a, b, qa, sfa, qb, sfb = make(m, n, k, seed=4)
    c = torch.randn(m, n, device="cuda")
    ref = c + a.float() @ b.float().T
    for name in ops.runnable_kernels(OP):
        storage = torch.full((m, 336), 7.0, device="cuda")
        d = storage[:, :n]
        d.copy_(c)
        fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d, kernel=name)
        assert calc_diff(d, ref) < 1e-3, name
        assert torch.all(storage[:, n:] == 7.0), f"{name}: wrote past column N"


def test_tail_split_every_kernel_and_deterministic_mode(ops, fp8):
    """2200x2000x640 has more tiles than one wave of every kernel (ragged M and N), so the last
    wave's K blocks are shared among the clusters; under torch.use_deterministic_algorithms no
    tile is split and two runs are bitwise equal. Both agree with fp32 and with each other to
    the rounding of fp32 sums."""
    from cutegen.runtime.fp8_ops import tail_split

    m, n, k = 2200, 2000, 640
    a, b, qa, sfa, qb, sfb = make(m, n, k, seed=3)
    c = torch.randn(m, n, device="cuda")
    ref = c + a.float() @ b.float().T
    for name in ops.runnable_kernels(OP):
        assert tail_split() == 1
        split = torch.full((m, n), float("nan"), device="cuda")
        fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, split, c=c, kernel=name)
        assert calc_diff(split, ref) < 1e-3, name
        torch.use_deterministic_algorithms(True)
        try:
            assert tail_split() == 0
            whole = [torch.full((m, n), float("nan"), device="cuda") for _ in range(2)]
            for d in whole:
                fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d, c=c, kernel=name)
        finally:
            torch.use_deterministic_algorithms(False)
        assert torch.equal(whole[0], whole[1]), name
        assert calc_diff(whole[0], ref) < 1e-3, name
        assert ((split - whole[0]).abs().max() <= 1e-5 * whole[0].abs().max()).item(), name


def test_bad_inputs(fp8):
    from cutegen.runtime.errors import InputError

    a, b, qa, sfa, qb, sfb = make(256, 256, 256)
    d = torch.zeros(256, 256, device="cuda")
    with pytest.raises(InputError, match="'d'.*float32"):
        fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb, d.bfloat16())
    with pytest.raises(InputError, match="'sfb'.*MN-major"):
        fp8.fp8_wgrad_gemm_nt(qa, sfa, qb, sfb.contiguous(), d)
