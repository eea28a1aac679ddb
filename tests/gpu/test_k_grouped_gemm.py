"""GPU tests of the k-grouped FP8 weight-gradient GEMM (``k_grouped_fp8_gemm_nt_contiguous``): per
group, D[g] += dy_gᵀ · x_g from the grouped transposed quantize's layout, against fp32 on the
unquantised inputs; empty and ragged groups; CUDA-graph replay with new group sizes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_fp8_gemm import calc_diff  # noqa: E402

pytestmark = pytest.mark.gpu

OP = "k_grouped_fp8_gemm_nt_contiguous"
# (G, M, N, mean tokens per group)
SHAPES = [
    (4, 7168, 4096, 4096),
    (4, 2048, 7168, 4096),
    (4, 7168, 4096, 8192),
    (4, 2048, 7168, 8192),
    (8, 7168, 4096, 4096),
    (8, 2048, 7168, 4096),
]
POISON = float("nan")


@pytest.fixture(scope="module")
def kg(ops):
    from cutegen.runtime import k_grouped_ops

    if not ops.runnable_kernels(OP):
        pytest.skip(f"no {OP} kernel of the catalogue runs on this GPU")
    return k_grouped_ops


def group_sizes_around(g: int, mean: int, seed: int) -> list[int]:
    """Per-group token counts drawn from 0.7-1.3 x mean (not multiples of 128)."""
    gen = torch.Generator().manual_seed(seed)
    return [int(mean * (0.7 + 0.6 * torch.rand(1, generator=gen).item())) for _ in range(g)]


def make(sizes: list[int], m: int, n: int, seed: int = 0, zero_channel: tuple[int, int] | None = None):
    """bf16 dy [T, M] and x [T, N] (fresh random data with outliers), their grouped transposed
    quantisations by the reference, and the GPU group sizes."""
    from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref

    t = sum(sizes)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dy = (torch.randn(t, m, device="cuda", generator=g) * torch.rand(t, 1, device="cuda", generator=g) * 4).bfloat16()
    x = torch.randn(t, n, device="cuda", generator=g).bfloat16()
    if zero_channel is not None:  # one channel of one group all zero (its scale is eps-bound)
        group, channel = zero_channel
        start = sum(sizes[:group])
        x[start : start + sizes[group], channel] = 0
    qa, sfa = grouped_transposed_quant_fp8_ref(dy, sizes)
    qb, sfb = grouped_transposed_quant_fp8_ref(x, sizes)
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    return dy, x, qa, sfa, qb, sfb, sizes_gpu


def references(dy, x, sizes):
    out, start = [], 0
    for k in sizes:
        out.append(dy[start : start + k].float().T @ x[start : start + k].float())
        start += k
    return out


def check_groups(d, c, refs, sizes, label=""):
    for g, (k, ref) in enumerate(zip(sizes, refs)):
        expect = c[g] + ref
        if k == 0:
            assert torch.equal(d[g], c[g]), f"{label} group {g} (empty) changed"
            continue
        diff = calc_diff(d[g], expect)
        assert diff < 1e-3, f"{label} group {g} ({k} tokens): calc_diff {diff:.2e}"


@pytest.mark.parametrize("g, m, n, mean", SHAPES, ids=[f"{g}x{m}x{n}_k{k}" for g, m, n, k in SHAPES])
def test_matches_fp32_per_group(kg, g, m, n, mean):
    sizes = group_sizes_around(g, mean, seed=g * m + mean)
    dy, x, qa, sfa, qb, sfb, sizes_gpu = make(sizes, m, n, seed=1)
    c = torch.randn(g, m, n, device="cuda") * 30
    d = c.clone()
    kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu, expected_k=mean)
    check_groups(d, c, references(dy, x, sizes), sizes, f"{g}x{m}x{n}")


def test_awkward_groups_every_kernel(ops, kg):
    # An empty group, one token, 129 tokens, a 128-token group with an all-zero channel, and
    # an empty last group.
    sizes = [0, 1, 129, 128, 700, 0]
    m, n = 512, 384
    dy, x, qa, sfa, qb, sfb, sizes_gpu = make(sizes, m, n, seed=3, zero_channel=(3, 17))
    refs = references(dy, x, sizes)
    c = torch.randn(len(sizes), m, n, device="cuda")
    for name in ops.runnable_kernels(OP):
        d = torch.full_like(c, POISON)
        kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu, c=c, kernel=name)
        # Empty groups: D is set to C and left alone by the kernel (no NaN from the poison).
        check_groups(d, c, refs, sizes, name)


def test_ragged_rows_and_oversized_block_count(kg):
    # M and N not multiples of the tile, and S larger than the groups need (the quantize's
    # upper bound form): the extra block rows are never read.
    from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref

    sizes = [300, 1000, 5]
    m, n = 4 * 75, 4 * 53
    t = sum(sizes)
    dy = torch.randn(t, m, device="cuda").bfloat16()
    x = torch.randn(t, n, device="cuda").bfloat16()
    qa, sfa = grouped_transposed_quant_fp8_ref(dy, sizes, num_blocks=20)
    qb, sfb = grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=20)
    d = torch.zeros(len(sizes), m, n, device="cuda")
    kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, torch.tensor(sizes, dtype=torch.int32, device="cuda"))
    check_groups(d, torch.zeros_like(d), references(dy, x, sizes), sizes)


def test_end_to_end_from_the_quantize_kernel(kg):
    # bf16 x and dy with router group sizes -> grouped_transposed_quant_fp8 (the kernel, sizes
    # on the GPU) -> k-grouped GEMM -> per-expert fp32 dyᵀ·x.
    from cutegen.runtime import quant_ops

    sizes = [1500, 0, 2200, 513, 1024]
    m, n = 1024, 2048
    t = sum(sizes)
    gen = torch.Generator(device="cuda").manual_seed(7)
    dy = torch.randn(t, m, device="cuda", generator=gen).bfloat16()
    x = torch.randn(t, n, device="cuda", generator=gen).bfloat16()
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    qa, sfa = quant_ops.grouped_transposed_quant_fp8(dy, sizes_gpu)
    qb, sfb = quant_ops.grouped_transposed_quant_fp8(x, sizes_gpu)
    d = torch.full((len(sizes), m, n), POISON, device="cuda")
    c = torch.zeros_like(d)
    kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu, c=c)
    check_groups(d, c, references(dy, x, sizes), sizes, "end to end")


def test_cuda_graph_replay_with_new_group_sizes(kg):
    # Capacity for 4 groups of up to 1024 tokens; the graph is captured once and replayed with
    # other sizes written into the same GPU tensors (no host synchronisation in the launch).
    from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref

    m, n, cap = 512, 640, 20
    sizes_gpu = torch.zeros(4, dtype=torch.int32, device="cuda")
    qa = torch.zeros(128 * m * cap, dtype=torch.float8_e4m3fn, device="cuda")
    qb = torch.zeros(128 * n * cap, dtype=torch.float8_e4m3fn, device="cuda")
    sfa = torch.ones(cap, m, device="cuda")
    sfb = torch.ones(cap, n, device="cuda")
    d = torch.zeros(4, m, n, device="cuda")

    def load(sizes, seed):
        t = sum(sizes)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dy = torch.randn(t, m, device="cuda", generator=gen).bfloat16()
        x = torch.randn(t, n, device="cuda", generator=gen).bfloat16()
        a, sa = grouped_transposed_quant_fp8_ref(dy, sizes, num_blocks=cap)
        b, sb = grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=cap)
        qa.copy_(a), qb.copy_(b), sfa.copy_(sa), sfb.copy_(sb)
        sizes_gpu.copy_(torch.tensor(sizes, dtype=torch.int32))
        d.zero_()
        return references(dy, x, sizes)

    load([256, 256, 256, 256], 0)
    kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu)  # warm-up (loads the kernel)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kg.k_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, d, sizes_gpu)
    for seed, sizes in enumerate(([1000, 0, 17, 900], [129, 1024, 1024, 1], [0, 0, 0, 5])):
        refs = load(sizes, seed + 1)
        graph.replay()
        torch.cuda.synchronize()
        check_groups(d, torch.zeros_like(d), refs, sizes, f"replay {sizes}")


def test_bad_inputs(kg):
    from cutegen.runtime.errors import InputError
    from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref

    sizes = [200, 100]
    dy = torch.randn(300, 256, device="cuda").bfloat16()
    x = torch.randn(300, 128, device="cuda").bfloat16()
    qa, sfa = grouped_transposed_quant_fp8_ref(dy, sizes)
    qb, sfb = grouped_transposed_quant_fp8_ref(x, sizes)
    sz = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    d = torch.zeros(2, 256, 128, device="cuda")
    run = kg.k_grouped_fp8_gemm_nt_contiguous
    with pytest.raises(InputError, match="'d'.*float32"):
        run(qa, sfa, qb, sfb, d.bfloat16(), sz)
    with pytest.raises(InputError, match="'d'.*shape"):
        run(qa, sfa, qb, sfb, d[:1], sz)
    with pytest.raises(InputError, match="'a'.*float8_e4m3fn"):
        run(qa.view(torch.uint8), sfa, qb, sfb, d, sz)
    with pytest.raises(InputError, match="'a'.*1-D"):
        run(qa.view(256, -1), sfa, qb, sfb, d, sz)
    with pytest.raises(InputError, match="'b'.*elements"):
        run(qa, sfa, qb[:-128], sfb, d, sz)
    with pytest.raises(InputError, match="'sfb'.*block rows"):
        run(qa, sfa, qb, sfb[:1], d, sz)
    with pytest.raises(InputError, match="'group_sizes'.*int32"):
        run(qa, sfa, qb, sfb, d, sz.long())
    with pytest.raises(InputError, match="'group_sizes'.*on cuda"):
        run(qa, sfa, qb, sfb, d, sz.cpu())
    with pytest.raises(InputError, match="'sfa'.*float32"):
        run(qa, sfa.double(), qb, sfb, d, sz)
    with pytest.raises(InputError, match="'c'"):
        run(qa, sfa, qb, sfb, d, sz, c=torch.zeros(2, 256, 127, device="cuda"))
