"""GPU tests of metadata the host cannot check (m_indices, masked_m, group_sizes): out-of-range
values never make a kernel read or write out of bounds, and give the documented result, on every
kernel of each op. Run under ``compute-sanitizer --tool memcheck`` with
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (every tensor its own allocation) to see overruns."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff  # noqa: E402
from test_grouped_gemm import MASKED_OP, check_masked, make_masked, make_problem, poisoned  # noqa: E402
from test_fused_epilogue import (  # noqa: E402
    POISON_Q, contiguous_exact_sums, exact_sums, integer_operands, masked_integer_operands, reference_of_interleaved,
)
from test_k_grouped_gemm import make, references  # noqa: E402

pytestmark = pytest.mark.gpu

CONTIGUOUS_OP = "m_grouped_fp8_gemm_nt_contiguous"
# The SwiGLU + FP8 quantize ops of both layouts, with exact and power-of-two output scales.
SWIGLU_CONTIGUOUS_OPS = ("m_grouped_fp8_gemm_nt_contiguous_swiglu_quant", "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant_ue8m0")
SWIGLU_MASKED_OPS = ("m_grouped_fp8_gemm_nt_masked_swiglu_quant", "m_grouped_fp8_gemm_nt_masked_swiglu_quant_ue8m0")
K_GROUPED_OP = "k_grouped_fp8_gemm_nt_contiguous"
INT32_MAX = 2**31 - 1


def kernels(ops, op: str) -> list[str]:
    names = ops.runnable_kernels(op)
    if not names:
        pytest.skip(f"no {op} kernel of the catalogue runs on this GPU")
    return names


def test_contiguous_rows_naming_no_group_are_padding(ops):
    """m_indices ≥ G or below -1 marks a row as padding, like -1: zero in D, B and SFB never
    read for it. Whole tiles (G, G + 1000, INT32_MAX, -7) and single rows inside a real tile."""
    from cutegen.runtime import grouped_ops

    sizes = [256, 128, 128, 128, 128, 200]
    n, k = 384, 512
    a, b, qa, sfa, _, qb, sb, m_indices, aligned = make_problem(sizes, n, k, seed=5)
    groups = len(sizes)
    starts = [sum(aligned[:i]) for i in range(groups)]
    bad_tiles = {1: groups, 2: groups + 1000, 3: INT32_MAX, 4: -7}  # group -> what its rows name instead
    for gi, value in bad_tiles.items():
        m_indices[starts[gi] : starts[gi] + sizes[gi]] = value
    bad_rows = [starts[0] + 5, starts[5] + 77]  # inside real tiles, not a tile's first row
    m_indices[bad_rows[0]] = groups
    m_indices[bad_rows[1]] = INT32_MAX
    for name in kernels(ops, CONTIGUOUS_OP):
        out = poisoned(qa.shape[0], n)
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sb, m_indices, out=out, kernel=name)
        torch.cuda.synchronize()
        for gi in bad_tiles:
            assert torch.all(out[starts[gi] : starts[gi] + aligned[gi]] == 0), f"{name}: tile naming {bad_tiles[gi]}"
        for row in bad_rows:
            assert torch.all(out[row] == 0), f"{name}: row {row} naming no group"
        for gi in (0, 5):
            rows = torch.arange(starts[gi], starts[gi] + sizes[gi], device="cuda")
            rows = rows[(m_indices[rows] == gi)]
            ref = a[rows].float() @ b[gi].float().T
            assert calc_diff(out[rows].float(), ref) < 1e-3, f"{name}: group {gi}"


def test_masked_counts_past_the_rows_or_negative(ops):
    """masked_m[g] > max_m computes the max_m rows there are; a negative count is 0 (nothing
    written); INT32_MAX neither overflows the tile count nor runs past A, SFA or D."""
    from cutegen.runtime import grouped_ops

    groups, max_m, n, k = 4, 192, 384, 512
    a, b, qa, sfa, qb, sb = make_masked(groups, max_m, n, k, seed=6)
    counts = [max_m + 50, -5, INT32_MAX, 70]
    rows_computed = [max_m, 0, max_m, 70]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    for name in kernels(ops, MASKED_OP):
        out = torch.full((groups, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_ops.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sb, masked_m, 128, out=out, kernel=name)
        torch.cuda.synchronize()
        check_masked(out, a, b, rows_computed, f"{name}, masked_m {counts}: ")


def _swiglu_kernels(ops, entries) -> list[tuple[str, bool]]:
    """(kernel, rounds its scales to powers of two) of every runnable kernel of the entries."""
    found = [(name, entry.endswith("_ue8m0")) for entry in entries for name in ops.runnable_kernels(entry)]
    if not found:
        pytest.skip(f"no {entries[0]} kernel of the catalogue runs on this GPU")
    return found


def test_swiglu_contiguous_rows_naming_no_group_are_padding(ops):
    """The fused SwiGLU op reads m_indices as the plain one does: rows naming no group (G,
    INT32_MAX, -7 over whole tiles; G on one row of a real tile) are padding, written as zeros with
    a zero row's scale, and B is never read for them; the real rows are bitwise the reference."""
    from cutegen.runtime import fused_ops

    groups, n, k = 3, 512, 512
    tiles = [0, 1, groups, INT32_MAX, -7]  # the group each 128-row tile names
    rows = 128 * len(tiles)
    qa, sa, qb, sb = integer_operands(rows, n, k, seed=21, groups=groups)
    m_indices = torch.tensor([g for g in tiles for _ in range(128)], dtype=torch.int32, device="cuda")
    m_indices[5] = groups  # one row inside group 0's tile
    h = contiguous_exact_sums(qa, sa, qb, sb, m_indices, groups)
    for name, ue8m0 in _swiglu_kernels(ops, SWIGLU_CONTIGUOUS_OPS):
        q_ref, sf_ref = reference_of_interleaved(h, ue8m0)
        out = torch.full((rows, n // 2), POISON_Q, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        q, sf = fused_ops.m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(
            qa, sa, qb, sb, m_indices, out=out, use_ue8m0=ue8m0, kernel=name
        )
        torch.cuda.synchronize()
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), name
        assert torch.equal(sf, sf_ref), name
        assert (q[128 * 2:].view(torch.uint8) == 0).all() and (q[5].view(torch.uint8) == 0).all(), name


def test_swiglu_masked_counts_past_the_rows_or_negative(ops):
    """masked_m past max_m (and INT32_MAX) computes the max_m rows there are, a negative count
    none (the poison stays); the computed rows are bitwise the reference."""
    from cutegen.runtime import fused_ops

    groups, max_m, n, k = 4, 192, 512, 512
    counts = [max_m + 100, -5, INT32_MAX, 70]
    rows_computed = [max_m, 0, max_m, 70]
    parts, qa, sa, qb, sb = masked_integer_operands(groups, max_m, n, k, seed=30)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    for name, ue8m0 in _swiglu_kernels(ops, SWIGLU_MASKED_OPS):
        out = torch.full((groups, max_m, n // 2), POISON_Q, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        q, sf = fused_ops.m_grouped_fp8_gemm_nt_masked_swiglu_quant(
            qa, sa, qb, sb, masked_m, 96, out=out, use_ue8m0=ue8m0, kernel=name
        )
        torch.cuda.synchronize()
        for gi, rows in enumerate(rows_computed):
            q_ref, sf_ref = reference_of_interleaved(exact_sums(*parts[gi]), ue8m0)
            assert torch.equal(q[gi, :rows].view(torch.uint8), q_ref[:rows].view(torch.uint8)), f"{name}: group {gi}"
            assert torch.equal(sf[gi, :rows].contiguous(), sf_ref[:rows].contiguous()), f"{name}: group {gi}"
        assert (q[1].view(torch.uint8) == POISON_Q).all(), f"{name}: a negative count wrote rows"


def test_k_grouped_sizes_past_the_operands(ops):
    """group_sizes needing more 128-token blocks than the operands hold (S): a group reaching
    past them contracts over the blocks inside, groups wholly past them and negative sizes keep
    D = C; INT32_MAX does not overflow."""
    from cutegen.runtime import k_grouped_ops

    held = [300, 200]  # S = 3 + 2 blocks
    m, n = 256, 384
    dy, x, qa, sfa, qb, sfb, _ = make(held, m, n, seed=7)
    refs = references(dy, x, held)
    cases = {
        "past S": ([300, 700, 50], {0: refs[0], 1: refs[1]}),  # group 1 keeps its 2 blocks; group 2 has none
        "negative": ([300, -9, 200], {0: refs[0], 2: refs[1]}),
        "int32 max": ([INT32_MAX, 128], {}),  # group 0 takes all 5 blocks; group 1 none
    }
    for name in kernels(ops, K_GROUPED_OP):
        for label, (sizes, expected) in cases.items():
            c = torch.randn(len(sizes), m, n, device="cuda")
            d = torch.full_like(c, float("nan"))
            sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
            k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu, c=c, kernel=name)
            torch.cuda.synchronize()
            for g in range(len(sizes)):
                if g in expected:
                    diff = calc_diff(d[g], c[g] + expected[g])
                    assert diff < 1e-3, f"{name} {label}: group {g} calc_diff {diff:.2e}"
                elif label == "int32 max" and g == 0:
                    assert torch.isfinite(d[g]).all(), f"{name} {label}: group 0 not finite"
                else:
                    assert torch.equal(d[g], c[g]), f"{name} {label}: group {g} changed"


def test_grouped_quantize_sizes_past_the_tokens(ops):
    """group_sizes that sum past T (INT32_MAX included) or are negative: tokens past T are never
    read (zeros), the prefix sums do not overflow, and the groups inside T are quantised as the
    reference quantises them."""
    from cutegen.runtime import quant_ops
    from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref

    kernels(ops, "grouped_transposed_quant_fp8")
    t, h, s = 300, 256, 12
    x = torch.randn(t, h, device="cuda").bfloat16()
    cases = {
        "negative": ([-5, 300], [0, 300]),
        "int32 max": ([INT32_MAX, INT32_MAX, 5], [300]),  # the first takes every token; the rest none
        "past T": ([200, 400], [200]),  # the second group's tokens past T read as zeros
    }
    for label, (sizes, held) in cases.items():
        q, sf = quant_ops.grouped_transposed_quant_fp8(
            x, torch.tensor(sizes, dtype=torch.int32, device="cuda"), num_blocks=s
        )
        torch.cuda.synchronize()
        rq, rsf = grouped_transposed_quant_fp8_ref(x[: sum(held)], held, num_blocks=s)
        blocks = sum(-(-k // 128) for k in held)
        assert torch.equal(q[: 128 * h * blocks].view(torch.uint8), rq[: 128 * h * blocks].view(torch.uint8)), label
        assert torch.equal(sf[:blocks], rsf[:blocks]), label
