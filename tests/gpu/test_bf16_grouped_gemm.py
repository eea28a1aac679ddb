"""GPU tests of the M-grouped BF16 GEMMs (``m_grouped_bf16_gemm_nt_contiguous`` and ``_masked``).

Every runnable kernel, against the fp32 (and float64, for a tight bound) product of the same bf16
inputs; outputs poisoned with NaN first; padding rows zero (or untouched with the opt-out); empty,
one-row and ragged groups; N and K not tile multiples; CUDA-graph replay with new counts; bad
inputs refused naming the argument.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff  # noqa: E402

pytestmark = pytest.mark.gpu

OP = "m_grouped_bf16_gemm_nt_contiguous"
MASKED_OP = "m_grouped_bf16_gemm_nt_masked"
# N, K from DeepSeek-V3 / Qwen3 expert layers, and one of neither a tile multiple (N 1000, K 1000).
NK = [(4096, 7168), (7168, 2048), (1536, 4096), (1000, 1000)]
LAYOUTS = [(4, 4096), (8, 1024), (32, 256)]
# Against a float64 reference: the bf16 rounding of D alone gives calc_diff ~1.4e-6 (measured on
# the H200, 2026-12-05); DeepGEMM's own BF16 tests use 1e-5.
EXACT = 1e-5


@pytest.fixture(scope="module")
def grouped(ops):
    from cutegen.runtime import bf16_grouped_ops

    if not ops.runnable_kernels(OP, layout="nt"):
        pytest.skip(f"no {OP} kernel of the catalogue runs on this GPU")
    return bf16_grouped_ops


@pytest.fixture(scope="module")
def masked(ops):
    from cutegen.runtime import bf16_grouped_ops

    if not ops.runnable_kernels(MASKED_OP):
        pytest.skip(f"no {MASKED_OP} kernel of the catalogue runs on this GPU")
    return bf16_grouped_ops


def group_sizes(groups: int, expected: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes = [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    sizes[0] = 0  # an empty group
    sizes[-1] = 1  # a one-row group
    return sizes


def make_problem(sizes: list[int], n: int, k: int, seed: int = 0, padding_data: bool = False):
    """A [ΣM, K] with each group's segment aligned to 128 rows (padding rows random when
    `padding_data`, else zero), B [G, N, K], m_indices, the aligned segment sizes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    aligned = [-(-s // 128) * 128 for s in sizes]
    total = max(sum(aligned), 128)
    m_indices = torch.full((total,), -1, dtype=torch.int32, device="cuda")
    a = torch.randn(total, k, device="cuda", generator=g).to(torch.bfloat16)
    if not padding_data:
        a.zero_()
    row = 0
    for gi, (size, span) in enumerate(zip(sizes, aligned)):
        m_indices[row : row + size] = gi
        a[row : row + size] = torch.randn(size, k, device="cuda", generator=g).to(torch.bfloat16)
        row += span
    b = torch.randn(len(sizes), n, k, device="cuda", generator=g).to(torch.bfloat16)
    return a, b, m_indices, aligned


def poisoned(*shape: int) -> torch.Tensor:
    *lead, n = shape
    return torch.full((*lead, -(-n // 8) * 8), float("nan"), device="cuda", dtype=torch.bfloat16)[..., :n]


def check_contiguous(out, a, b, sizes, aligned, label: str = "", zero_padding: bool = True) -> None:
    row = 0
    for gi, (size, span) in enumerate(zip(sizes, aligned)):
        rows = slice(row, row + size)
        if size:
            ref = a[rows].double() @ b[gi].double().T
            assert calc_diff(out[rows].double(), ref) < EXACT, f"{label}group {gi} ({size} rows)"
        if zero_padding:
            assert torch.all(out[row + size : row + span] == 0), f"{label}group {gi}: padding rows not zero"
        row += span


@pytest.mark.parametrize("groups, expected", LAYOUTS, ids=[f"{g}x{e}" for g, e in LAYOUTS])
@pytest.mark.parametrize("n, k", NK, ids=[f"N{n}-K{k}" for n, k in NK])
def test_contiguous_matches_reference(grouped, groups, expected, n, k):
    sizes = group_sizes(groups, expected, seed=groups * 7 + n)
    a, b, m_indices, aligned = make_problem(sizes, n, k)
    out = poisoned(a.shape[0], n)
    grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out)
    check_contiguous(out, a, b, sizes, aligned)
    # The new-output form gives the same bits.
    assert torch.equal(grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices), out)


@pytest.mark.parametrize("k", [64, 1000, 4096])
def test_every_contiguous_kernel_runs(ops, grouped, k):
    """Every kernel; groups ending at, past and before a warpgroup's 64 rows and a whole tile, a
    padding tile between groups (in a 2x1 cluster the pair of a computed tile); padding rows of A
    hold random data, so computing them or skipping real rows would show."""
    sizes = [64, 65, 0, 63, 192, 1]
    a, b, m_indices, aligned = make_problem(sizes, 640, k, seed=17, padding_data=True)
    for name in ops.runnable_kernels(OP, layout="nt"):
        for zero_padding in (True, False):
            out = poisoned(a.shape[0], 640)
            grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out, kernel=name, zero_padding=zero_padding)
            check_contiguous(out, a, b, sizes, aligned, f"{name} zero_padding={zero_padding}: ", zero_padding)


def test_padding_opt_out_leaves_padding_only_tiles_untouched(ops, grouped):
    sizes = [130, 0, 5]
    a, b, m_indices, aligned = make_problem(sizes, 256, 512, seed=11)
    m_indices[256:384] = -1  # a whole 128-row tile of padding
    for name in ops.runnable_kernels(OP, layout="nt"):
        out = poisoned(a.shape[0], 256)
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out, zero_padding=False, kernel=name)
        assert torch.isnan(out[256:384]).all(), f"{name}: padding tile written with the opt-out"
        ref = a[:130].double() @ b[0].double().T
        assert calc_diff(out[:130].double(), ref) < EXACT, name


def test_group_ends_and_cuda_graph(grouped):
    sizes = [100, 300, 0, 17]
    a, b, m_indices, aligned = make_problem(sizes, 512, 1024, seed=5)
    from cutegen.runtime.grouped_ops import m_indices_from_group_ends

    ends, row = [], 0
    for size, span in zip(sizes, aligned):
        ends.append(row + size)
        row += span
    assert torch.equal(m_indices_from_group_ends(torch.tensor(ends, dtype=torch.int32, device="cuda"), a.shape[0]), m_indices)
    out = poisoned(a.shape[0], 512)
    grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out)
    expected = out.clone()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    check_contiguous(out, a, b, sizes, aligned)


def test_contiguous_metadata_out_of_range_is_padding(grouped):
    """m_indices values outside [0, G) are padding rows: zeros, B never read for them."""
    sizes = [128, 128]
    a, b, m_indices, aligned = make_problem(sizes, 256, 256, seed=2)
    m_indices[128:] = torch.tensor([2, 1000, 2**31 - 1, -7] * 32, dtype=torch.int32)
    out = poisoned(256, 256)
    grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=out)
    assert torch.all(out[128:] == 0)
    assert calc_diff(out[:128].double(), a[:128].double() @ b[0].double().T) < EXACT


def test_contiguous_bad_inputs(grouped):
    from cutegen.runtime.errors import InputError

    a, b, m_indices, _ = make_problem([128, 128], 256, 256)
    with pytest.raises(InputError, match="'m_indices'"):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices.long())
    with pytest.raises(InputError, match="'b'"):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b[0], m_indices)
    with pytest.raises(InputError, match="'b'"):  # neither K-major nor N-major
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, torch.empty(2, 256, 512, device="cuda", dtype=torch.bfloat16)[:, :, ::2], m_indices)
    with pytest.raises(InputError, match="multiple of 128"):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a[:200], b, m_indices[:200])
    with pytest.raises(InputError, match="'a'"):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a.float(), b, m_indices)
    with pytest.raises(InputError, match="'out'"):
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices, out=poisoned(256, 128))


# ---- masked layout ---------------------------------------------------------------------------
MASKED_LAYOUTS = [(1, 1024), (4, 256), (32, 192), (6, 1024), (32, 20)]


def make_masked(groups: int, max_m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(groups, max_m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(groups, n, k, device="cuda", generator=g).to(torch.bfloat16)
    return a, b


def masked_counts(groups: int, max_m: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    counts = [min(max_m, int(max_m * rng.uniform(0.7, 1.0))) for _ in range(groups)]
    if groups > 1:
        counts[1] = 0  # an empty group costs nothing and writes nothing
    return counts


def check_masked(out, a, b, counts, label: str = "") -> None:
    """Group g's first counts[g] rows against float64; a group with no rows still all NaN."""
    for gi, rows in enumerate(counts):
        if rows:
            ref = a[gi, :rows].double() @ b[gi].double().T
            assert calc_diff(out[gi, :rows].double(), ref) < EXACT, f"{label}group {gi} ({rows} rows)"
        else:
            assert torch.isnan(out[gi]).all(), f"{label}group {gi} has no rows but was written"


@pytest.mark.parametrize("groups, max_m", MASKED_LAYOUTS, ids=[f"{g}x{m}" for g, m in MASKED_LAYOUTS])
@pytest.mark.parametrize("n, k", NK, ids=[f"N{n}-K{k}" for n, k in NK])
def test_masked_matches_reference(masked, groups, max_m, n, k):
    counts = masked_counts(groups, max_m, seed=groups + max_m + n)
    a, b = make_masked(groups, max_m, n, k)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = poisoned(groups, max_m, n)
    masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, expected_m=max_m, out=out)
    check_masked(out, a, b, counts)


@pytest.mark.parametrize("k", [64, 1000, 4096])
def test_every_masked_kernel_runs(ops, masked, k):
    counts = [200, 0, 33, 1]
    a, b = make_masked(4, 256, 384, k, seed=4)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    for name in ops.runnable_kernels(MASKED_OP):
        out = poisoned(4, 256, 384)
        masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 128, out=out, kernel=name)
        check_masked(out, a, b, counts, f"{name}: ")


def test_masked_graph_replay_with_new_counts(masked):
    groups, max_m, n, k = 4, 256, 512, 1024
    a, b = make_masked(groups, max_m, n, k, seed=9)
    masked_m = torch.tensor([256, 0, 100, 7], dtype=torch.int32, device="cuda")
    out = poisoned(groups, max_m, n)
    masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 128, out=out)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 128, out=out)
    for counts in ([13, 256, 0, 64], [0, 0, 0, 1], [256, 256, 256, 256], [300, -5, 2**31 - 1, 0]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(out, a, b, [max(0, min(c, max_m)) for c in counts], f"{counts}: ")


def test_masked_bad_inputs(masked):
    from cutegen.runtime.errors import InputError

    a, b = make_masked(2, 64, 128, 256)
    masked_m = torch.tensor([64, 3], dtype=torch.int32, device="cuda")
    with pytest.raises(InputError, match="'masked_m'"):
        masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m.long(), 64)
    with pytest.raises(InputError, match="'b'"):
        masked.m_grouped_bf16_gemm_nt_masked(a, b[:1], masked_m, 64)
    with pytest.raises(InputError, match="'expected_m'"):
        masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 64.0)
    with pytest.raises(InputError, match="'out'"):
        masked.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, 64, out=poisoned(2, 64, 64))


def test_deep_gemm_names(ops, grouped, masked):
    """DeepGEMM's calls through cutegen.deep_gemm: the contiguous op with per-row groups and with
    cumulative group ends (use_psum_layout), the masked op and its alias."""
    import cutegen.deep_gemm as deep_gemm

    sizes = [100, 0, 300]
    a, b, m_indices, aligned = make_problem(sizes, 768, 512, seed=21)
    d = poisoned(a.shape[0], 768)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices)
    check_contiguous(d, a, b, sizes, aligned)
    ends, row = [], 0
    for size, span in zip(sizes, aligned):
        ends.append(row + size)
        row += span
    d2 = poisoned(a.shape[0], 768)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d2, torch.tensor(ends, dtype=torch.int32, device="cuda"),
                                                use_psum_layout=True)
    assert torch.equal(d2, d)
    am, bm = make_masked(3, 128, 256, 512, seed=22)
    masked_m = torch.tensor([128, 0, 9], dtype=torch.int32, device="cuda")
    for function in (deep_gemm.m_grouped_bf16_gemm_nt_masked, deep_gemm.bf16_m_grouped_gemm_nt_masked):
        dm = poisoned(3, 128, 256)
        function(am, bm, dm, masked_m, 64)
        check_masked(dm, am, bm, [128, 0, 9])


def test_mn_major_experts(ops, grouped):
    """MN-major experts (each B[g] stored [K, N], DeepGEMM's nn form): every kernel of layout nn,
    and DeepGEMM's m_grouped_bf16_gemm_nn_contiguous."""
    import cutegen.deep_gemm as deep_gemm

    names = ops.runnable_kernels(OP, layout="nn")
    if not names:
        pytest.skip("no m_grouped_bf16_gemm_nt_contiguous kernel of layout nn runs on this GPU")
    sizes = [64, 65, 0, 192, 1]
    a, b, m_indices, aligned = make_problem(sizes, 640, 1000, seed=23, padding_data=True)
    b_kn = b.transpose(1, 2).contiguous()  # [G, K, N]
    for name in names:
        out = poisoned(a.shape[0], 640)
        grouped.m_grouped_bf16_gemm_nt_contiguous(a, b_kn.transpose(1, 2), m_indices, out=out, kernel=name)
        check_contiguous(out, a, b, sizes, aligned, f"{name}: ")
    d = poisoned(a.shape[0], 640)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, b_kn, d, m_indices)
    check_contiguous(d, a, b, sizes, aligned, "deep_gemm nn: ")


# ---- k-grouped weight gradient (tokens first) --------------------------------------------------
K_OP = "k_grouped_bf16_gemm_tn_contiguous"


def make_k_grouped(ks: list[int], m: int, n: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(sum(ks), m, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(sum(ks), n, device="cuda", generator=g).to(torch.bfloat16)
    return a, b, torch.tensor(ks, dtype=torch.int32, device="cuda")


def k_grouped_reference(a, b, ks, c):
    out, start = [], 0
    for gi, k in enumerate(ks):
        out.append(c[gi].double() + a[start : start + k].double().T @ b[start : start + k].double())
        start += k
    return out


@pytest.mark.parametrize("ks, m, n", [([256, 0, 512, 128], 768, 1024), ([1024] * 4, 2048, 4096), ([128], 256, 264)])
def test_every_k_grouped_kernel_runs(ops, ks, m, n):
    from cutegen.runtime import bf16_grouped_ops

    names = ops.runnable_kernels(K_OP)
    if not names:
        pytest.skip(f"no {K_OP} kernel of the catalogue runs on this GPU")
    a, b, sizes = make_k_grouped(ks, m, n, seed=len(ks) + m)
    c = torch.randn(len(ks), m, n, device="cuda")
    ref = k_grouped_reference(a, b, ks, c)
    for name in names:
        d = torch.full((len(ks), m, n), float("nan"), device="cuda")
        bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, sizes, c, kernel=name)
        for gi, k in enumerate(ks):
            if k:
                assert calc_diff(d[gi].double(), ref[gi]) < 1e-9, f"{name}: group {gi}"
            else:
                assert torch.equal(d[gi], c[gi]), f"{name}: empty group {gi} is not C"
        # In place (C = D): D += the groups' products again.
        before = d.clone()
        bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, sizes, kernel=name)
        for gi, k in enumerate(ks):
            assert calc_diff(d[gi].double(), before[gi].double() + (ref[gi] - c[gi].double())) < 1e-9 if k else torch.equal(d[gi], before[gi])


def test_k_grouped_graph_and_deep_gemm(ops):
    import cutegen.deep_gemm as deep_gemm
    from cutegen.runtime import bf16_grouped_ops

    if not ops.runnable_kernels(K_OP):
        pytest.skip(f"no {K_OP} kernel of the catalogue runs on this GPU")
    ks, m, n = [256, 128, 384], 512, 768
    a, b, sizes = make_k_grouped(ks, m, n, seed=31)
    zero = torch.zeros(len(ks), m, n, device="cuda")
    ref = k_grouped_reference(a, b, ks, zero)
    d = torch.zeros(len(ks), m, n, device="cuda")
    bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, sizes)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, sizes)
    d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for gi in range(len(ks)):
        assert calc_diff(d[gi].double(), ref[gi]) < 1e-9
    out = torch.full((len(ks), m, n), float("nan"), device="cuda")
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, out, ks, sizes, c=zero)
    for gi in range(len(ks)):
        assert calc_diff(out[gi].double(), ref[gi]) < 1e-9
