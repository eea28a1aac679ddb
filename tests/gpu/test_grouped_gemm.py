"""GPU tests of the M-grouped FP8 GEMM, contiguous layout (``m_grouped_fp8_gemm_nt_contiguous``).

Per group: calc_diff < 1e-3 against the fp32 product of the unquantised bf16 inputs, and a tight
bound against the dequantised product; padding rows are zero (or untouched with the opt-out);
outputs are poisoned first.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff, dequantized_reference, quantize_per_block, quantize_per_token  # noqa: E402

pytestmark = pytest.mark.gpu

OP = "m_grouped_fp8_gemm_nt_contiguous"
NK = [(4096, 7168), (7168, 2048), (6144, 7168), (7168, 3072)]
# (groups, expected rows per group); sizes drawn from 0.7-1.3 x, plus an empty and a one-row group.
LAYOUTS = [(4, 8192), (8, 4096), (32, 256)]


@pytest.fixture(scope="module")
def grouped(ops):
    from cutegen.runtime import grouped_ops

    if not ops.runnable_kernels(OP):
        pytest.skip(f"no {OP} kernel of the catalogue runs on this GPU")
    return grouped_ops


def group_sizes(groups: int, expected: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes = [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    sizes[0] = 0  # an empty group
    sizes[-1] = 1  # a one-row group
    return sizes


def make_problem(sizes: list[int], n: int, k: int, seed: int = 0):
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    g = torch.Generator(device="cuda").manual_seed(seed)
    groups = len(sizes)
    aligned = [-(-s // 128) * 128 for s in sizes]
    total = max(sum(aligned), 128)
    m_indices = torch.full((total,), -1, dtype=torch.int32, device="cuda")
    a = torch.zeros(total, k, device="cuda", dtype=torch.bfloat16)
    row = 0
    for gi, (size, span) in enumerate(zip(sizes, aligned)):
        m_indices[row : row + size] = gi
        a[row : row + size] = torch.randn(size, k, device="cuda", generator=g).to(torch.bfloat16)
        row += span
    b = torch.randn(groups, n, k, device="cuda", generator=g).to(torch.bfloat16)
    qa, sa = quantize_per_token(a)
    qb, sb = zip(*(quantize_per_block(b[i]) for i in range(groups)))
    return a, b, qa, to_mn_major_tma_aligned(sa), sa, torch.stack(qb), torch.stack(sb), m_indices, aligned


def poisoned(m: int, n: int) -> torch.Tensor:
    return torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda", dtype=torch.bfloat16)[:, :n]


@pytest.mark.parametrize("groups, expected", LAYOUTS, ids=[f"{g}x{e}" for g, e in LAYOUTS])
@pytest.mark.parametrize("n, k", NK, ids=[f"N{n}-K{k}" for n, k in NK])
def test_contiguous_matches_reference(grouped, groups, expected, n, k):
    sizes = group_sizes(groups, expected, seed=groups * 7 + n)
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, n, k)
    out = poisoned(qa.shape[0], n)
    grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out)
    row = 0
    for gi, (size, span) in enumerate(zip(sizes, aligned)):
        if size:
            got = out[row : row + size].float()
            ref = a[row : row + size].float() @ b[gi].float().T
            assert calc_diff(got, ref) < 1e-3, f"group {gi} ({size} rows)"
        padding = out[row + size : row + span]
        assert torch.all(padding == 0), f"group {gi}: padding rows are not zero"
        row += span


def test_padding_opt_out_leaves_padding_only_tiles_untouched(grouped):
    sizes = [130, 0, 5]
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, 256, 512, seed=11)
    m_indices[256:384] = -1  # a whole 128-row tile of padding
    out = poisoned(qa.shape[0], 256)
    grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out, zero_padding=False)
    assert torch.isnan(out[256:384]).all()
    ref = a[:130].float() @ b[0].float().T
    assert calc_diff(out[:130].float(), ref) < 1e-3


def test_group_ends_form_and_cuda_graph(grouped):
    sizes = [100, 300, 0, 17]
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, 512, 1024, seed=5)
    ends, row = [], 0
    for size, span in zip(sizes, aligned):
        ends.append(row + size)
        row += span
    from_ends = grouped.m_indices_from_group_ends(torch.tensor(ends, dtype=torch.int32, device="cuda"), qa.shape[0])
    assert torch.equal(from_ends, m_indices)
    out = poisoned(qa.shape[0], 512)
    grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out)
    expected = out.clone()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


# K = 8320: 65 K blocks, so the tile's SFB (held in warp registers 32 blocks at a time) moves on
# to a second and a third chunk.
@pytest.mark.parametrize("k", [512, 8320])
def test_every_kernel_runs(ops, grouped, k):
    sizes = [300, 1, 0, 700]
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, 1000, k, seed=3)
    for name in ops.runnable_kernels(OP):
        out = poisoned(qa.shape[0], 1000)
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out, kernel=name)
        row = 0
        for gi, (size, span) in enumerate(zip(sizes, aligned)):
            if size:
                ref = a[row : row + size].float() @ b[gi].float().T
                assert calc_diff(out[row : row + size].float(), ref) < 1e-3, f"{name}: group {gi}"
            assert torch.all(out[row + size : row + span] == 0), name
            row += span


def test_padding_tile_beside_a_computed_tile(ops, grouped):
    """Every kernel, a tile of padding rows (random data in A) between two groups' tiles: in a
    2x1 cluster it is the pair of group 0's tile, so the pair computes it (both CTAs walk the
    same stages) without sharing B. Its rows are zeros, or left as they were with the opt-out."""
    sizes = [128, 128, 5]
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, 384, 1024, seed=13)
    m_indices[128:256] = -1
    for name in ops.runnable_kernels(OP):
        for zero_padding in (True, False):
            out = poisoned(qa.shape[0], 384)
            grouped.m_grouped_fp8_gemm_nt_contiguous(
                qa, sfa, qb, sb, m_indices, out=out, kernel=name, zero_padding=zero_padding
            )
            for gi, row in ((0, 0), (2, 256)):
                ref = a[row : row + sizes[gi]].float() @ b[gi].float().T
                assert calc_diff(out[row : row + sizes[gi]].float(), ref) < 1e-3, f"{name}: group {gi}"
            padding = out[128:256]
            if zero_padding:
                assert torch.all(padding == 0), f"{name}: padding tile not zero"
            else:
                assert torch.isnan(padding).all(), f"{name}: padding tile written with the opt-out"


@pytest.mark.parametrize("k", [1024, 4096])
def test_warpgroups_of_padding_rows(ops, grouped, k):
    """Every kernel, groups whose last tile ends at, just past and just before a math warpgroup's
    64 rows (64, 65, 63; 192 = a whole tile and one warpgroup's rows; 1): a warpgroup whose rows
    are all padding issues no WGMMAs and writes zeros, the other computes. A's padding rows hold
    random data, so a warpgroup that computed them, or skipped real rows, would show."""
    sizes = [64, 65, 63, 192, 1]
    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem(sizes, 640, k, seed=17)
    qa.copy_(torch.randn(qa.shape, device="cuda").to(qa.dtype))  # padding rows no longer zero
    for name in ops.runnable_kernels(OP):
        out = poisoned(qa.shape[0], 640)
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out, kernel=name)
        row = 0
        for gi, (size, span) in enumerate(zip(sizes, aligned)):
            rows = slice(row, row + size)
            exact = dequantized_reference(qa[rows], sa[rows], qb[gi], sb[gi])
            assert calc_diff(out[rows].float(), exact) < 2e-5, f"{name}: group {gi} ({size} rows)"
            assert torch.all(out[row + size : row + span] == 0), f"{name}: group {gi}: padding rows not zero"
            row += span


def test_bad_inputs(grouped):
    from cutegen.runtime.errors import InputError

    a, b, qa, sfa, sa, qb, sb, m_indices, aligned = make_problem([128, 128], 256, 256)
    with pytest.raises(InputError, match="'m_indices'"):
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices.long())
    with pytest.raises(InputError, match="'b'"):
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb[0], sb, m_indices)
    with pytest.raises(InputError, match="'sfb'"):
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb[:1], m_indices)
    with pytest.raises(InputError, match="multiple of 128"):
        grouped.m_grouped_fp8_gemm_nt_contiguous(qa[:200], sfa[:200], qb, sb, m_indices[:200])


# ---- masked layout ---------------------------------------------------------------------------
MASKED_OP = "m_grouped_fp8_gemm_nt_masked"
MASKED_LAYOUTS = [(1, 1024), (2, 512), (4, 256), (32, 192), (6, 1024), (32, 20)]


@pytest.fixture(scope="module")
def masked(ops):
    from cutegen.runtime import grouped_ops

    if not ops.runnable_kernels(MASKED_OP):
        pytest.skip(f"no {MASKED_OP} kernel of the catalogue runs on this GPU")
    return grouped_ops


def make_masked(groups: int, max_m: int, n: int, k: int, seed: int = 0):
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(groups, max_m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(groups, n, k, device="cuda", generator=g).to(torch.bfloat16)
    qa, sa = zip(*(quantize_per_token(a[i]) for i in range(groups)))
    qb, sb = zip(*(quantize_per_block(b[i]) for i in range(groups)))
    sfa = to_mn_major_tma_aligned(torch.stack(sa))
    return a, b, torch.stack(qa), sfa, torch.stack(qb), torch.stack(sb)


def masked_counts(groups: int, max_m: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    counts = [min(max_m, int(max_m * rng.uniform(0.7, 1.0))) for _ in range(groups)]
    if groups > 1:
        counts[1] = 0  # an empty group costs nothing and writes nothing
    return counts


@pytest.mark.parametrize("groups, max_m", MASKED_LAYOUTS, ids=[f"{g}x{m}" for g, m in MASKED_LAYOUTS])
@pytest.mark.parametrize("n, k", NK, ids=[f"N{n}-K{k}" for n, k in NK])
def test_masked_matches_reference(masked, groups, max_m, n, k):
    counts = masked_counts(groups, max_m, seed=groups + max_m + n)
    a, b, qa, sfa, qb, sb = make_masked(groups, max_m, n, k)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, expected_m=max_m, out=out)
    check_masked(out, a, b, counts)


def check_masked(out, a, b, rows_per_group, label: str = "") -> None:
    """Group g's first rows_per_group[g] rows of D within calc_diff 1e-3 of fp32 on the unquantised
    inputs; a group with no rows still all NaN (the poison: nothing written)."""
    for gi, rows in enumerate(rows_per_group):
        if rows:
            ref = a[gi, :rows].float() @ b[gi].float().T
            assert calc_diff(out[gi, :rows].float(), ref) < 1e-3, f"{label}group {gi} ({rows} rows)"
        else:
            assert torch.isnan(out[gi]).all(), f"{label}group {gi} has no rows but was written"


def test_masked_graph_replay_with_new_counts(masked):
    groups, max_m, n, k = 4, 256, 512, 1024
    a, b, qa, sfa, qb, sb = make_masked(groups, max_m, n, k, seed=9)
    masked_m = torch.tensor([256, 0, 100, 7], dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 128, out=out)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 128, out=out)
    for counts in ([13, 256, 0, 64], [0, 0, 0, 1], [256, 256, 256, 256]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for gi, rows in enumerate(counts):
            if rows:
                ref = a[gi, :rows].float() @ b[gi].float().T
                assert calc_diff(out[gi, :rows].float(), ref) < 1e-3, f"{counts}: group {gi}"


@pytest.mark.parametrize("k", [512, 8320])
def test_masked_every_kernel_runs(ops, masked, k):
    counts = [200, 0, 33]
    a, b, qa, sfa, qb, sb = make_masked(3, 256, 384, k, seed=4)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    for name in ops.runnable_kernels(MASKED_OP):
        out = torch.full((3, 256, 384), float("nan"), device="cuda", dtype=torch.bfloat16)
        masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 128, out=out, kernel=name)
        for gi, rows in enumerate(counts):
            if rows:
                ref = a[gi, :rows].float() @ b[gi].float().T
                assert calc_diff(out[gi, :rows].float(), ref) < 1e-3, f"{name}: group {gi}"


def test_masked_last_wave_split_kernels(ops, masked):
    """The masked kernels that split the last wave along K: under SM budgets that leave a last
    wave of a few tiles (or every tile in it), with ragged and empty groups, each result within
    calc_diff 1e-3 of fp32, a second launch bit-identical, replayed in a CUDA graph with new counts
    (its own workspace), and the split counters zero afterwards; a kernel that does not split
    refuses a split count."""
    from cutegen.runtime import sm_budget, split_k
    from cutegen.runtime.errors import InputError

    names = [x for x in ops.runnable_kernels(MASKED_OP) if "_episkw_" in x]
    if not names:
        pytest.skip("no last-wave split masked kernel runs on this GPU")
    groups, max_m, n, k = 3, 640, 768, 2944  # 23 K blocks: uneven shares
    a, b, qa, sfa, qb, sb = make_masked(groups, max_m, n, k, seed=31)
    counts = [601, 0, 130]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    try:
        for budget in (None, 6, 10, 26):
            sm_budget.set_num_sms(budget)
            for name in names:
                for splits in (None, 2, 5, 16):
                    label = f"{name} SMs={budget} k_splits={splits}: "
                    out = torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 256, out=out, kernel=name, k_splits=splits)
                    check_masked(out, a, b, counts, label)
                    again = torch.full_like(out, float("nan"))
                    masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 256, out=again, kernel=name, k_splits=splits)
                    assert torch.equal(out.nan_to_num(7.0), again.nan_to_num(7.0)), f"{label}two launches differ"
        sm_budget.set_num_sms(10)
        out = torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 256, out=out, kernel=names[0], k_splits=4)
        for replay_counts in ([640, 77, 0], [0, 0, 1], [300, 300, 300]):
            masked_m.copy_(torch.tensor(replay_counts, dtype=torch.int32))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            check_masked(out, a, b, replay_counts, f"replayed {replay_counts}: ")
    finally:
        sm_budget.set_num_sms(None)
    torch.cuda.synchronize()
    for counters, _ in split_k._workspaces.values():
        assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"
    plain = next(x for x in ops.runnable_kernels(MASKED_OP) if "_episkw_" not in x)
    with pytest.raises(InputError, match="'k_splits'.*does not split K"):
        masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 256, kernel=plain, k_splits=2)
    with pytest.raises(InputError, match="'k_splits'.*positive int"):
        masked.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 256, kernel=names[0], k_splits=0)
