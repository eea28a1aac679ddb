"""GPU tests of ``cutegen.runtime.fp8_ops.fp8_gemm_nt`` (DeepSeek-V3 block-scaled FP8 GEMM).

Two references: the fp32 product of the *unquantised* bf16 inputs (DeepGEMM's acceptance test,
calc_diff < 1e-3) and the fp32 product of the dequantised operands (what the kernel computes up to
fp32 summation order and the bf16 output rounding; a much tighter bound that catches a scale
applied to the wrong row or column block).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime.errors import InputError  # noqa: E402

pytestmark = pytest.mark.gpu

OP = "fp8_gemm_nt"
NK = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
# K not a multiple of 128 (DeepGEMM's N 7168, K 576; K = 208 and 16: the last scale block partial,
# the kernel's last K block reading zeros past K).
PARTIAL_K = [(m, 7168, 576) for m in (1, 64, 128, 4096)] + [(333, 200, 208), (100, 256, 16)]
SHAPES = [(m, n, k) for m in (1, 64, 128, 4096) for n, k in NK] + [
    (1000, 2112, 7168),
    (4095, 4096, 512),
    (333, 200, 384),  # N not a multiple of any tile, nor of the 128-row scale block
] + PARTIAL_K
FP8_MAX = 448.0


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_k(t: torch.Tensor) -> torch.Tensor:
    """t [R, K] as fp32 [R, ceil(K/128) * 128], zeros past K (a partial last scale block)."""
    r, k = t.shape
    out = torch.zeros(r, ceil_div(k, 128) * 128, device=t.device, dtype=torch.float32)
    out[:, :k] = t.float()
    return out


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1x128 blocks along K: q e4m3 [M, K], scales fp32 [M, ceil(K/128)] (row-major)."""
    m, k = x.shape
    xg = padded_k(x).view(m, -1, 128)
    s = xg.abs().amax(dim=2).clamp(min=1e-4) / FP8_MAX
    q = (xg / s.unsqueeze(2)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, -1)[:, :k].contiguous(), s


def quantize_per_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 blocks: q e4m3 [N, K], scales fp32 [ceil(N/128), ceil(K/128)]."""
    n, k = w.shape
    npad = ceil_div(n, 128) * 128
    wp = torch.zeros(npad, ceil_div(k, 128) * 128, device=w.device, dtype=torch.float32)
    wp[:n] = padded_k(w)
    wg = wp.view(npad // 128, 128, -1, 128)
    s = wg.abs().amax(dim=(1, 3)).clamp(min=1e-4) / FP8_MAX
    q = (wg / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(npad, -1)[:n, :k].contiguous(), s.contiguous()


def dequantized_reference(qa, sa, qb, sb) -> torch.Tensor:
    m, k = qa.shape
    n = qb.shape[0]
    a = padded_k(qa).view(m, -1, 128) * sa.unsqueeze(2)
    b = padded_k(qb).view(n, -1, 128) * sb.repeat_interleave(128, dim=0)[:n].unsqueeze(2)
    return a.view(m, -1) @ b.view(n, -1).T


def make_problem(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    # Row and column magnitudes spread over 2^-6 .. 2^6, so that every row of SFA and every
    # 128-row block of SFB differs and a misplaced scale cannot hide in the tolerance.
    row_mag = torch.exp2(torch.rand(m, 1, device="cuda", generator=g) * 12 - 6)
    col_mag = torch.exp2(torch.rand(n, 1, device="cuda", generator=g) * 12 - 6)
    a = (torch.randn(m, k, device="cuda", generator=g) * row_mag).to(torch.bfloat16)
    b = (torch.randn(n, k, device="cuda", generator=g) * col_mag).to(torch.bfloat16)
    qa, sa = quantize_per_token(a)
    qb, sb = quantize_per_block(b)
    return a, b, qa, sa, qb, sb


def poisoned(m: int, n: int) -> torch.Tensor:
    stride = ceil_div(n, 8) * 8
    return torch.full((m, stride), float("nan"), device="cuda", dtype=torch.bfloat16)[:, :n]


@pytest.fixture(scope="module")
def fp8(ops):
    from cutegen.runtime import fp8_ops

    if not ops.runnable_kernels(OP):
        pytest.skip("no fp8_gemm_nt kernel of the catalogue runs on this GPU")
    return fp8_ops


def check(out, a, b, qa, sa, qb, sb, what):
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (unwritten elements?)"
    exact = dequantized_reference(qa, sa, qb, sb)
    assert calc_diff(out.float(), exact) < 2e-5, f"{what}: differs from the dequantised product"
    assert calc_diff(out.float(), a.float() @ b.float().T) < 1e-3, f"{what}: calc_diff vs unquantised"


@pytest.mark.parametrize("m, n, k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_matches_references(ops, fp8, m, n, k):
    a, b, qa, sa, qb, sb = make_problem(m, n, k)
    out = poisoned(m, n)
    result = fp8.fp8_gemm_nt(qa, fp8.to_mn_major_tma_aligned(sa), qb, sb, out=out)
    assert result is out
    check(out, a, b, qa, sa, qb, sb, f"{m}x{n}x{k} via {ops.choose_kernel(OP, m, n, k)}")


# long-k: 67 K blocks, the last one partial: the tile's SFB, held in warp registers 32 blocks at a
# time, moves on to a second and a third chunk.
@pytest.mark.parametrize(
    "m, n, k",
    [(1000, 1000, 512), (4096, 4096, 256), (1000, 1000, 576), (300, 1000, 8528)],
    ids=["small-grid", "full-grid", "partial-k", "long-k"],
)
def test_every_kernel_runs(ops, fp8, m, n, k):
    a, b, qa, sa, qb, sb = make_problem(m, n, k, seed=3)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    for name in ops.runnable_kernels(OP, scale="f32"):
        out = poisoned(m, n)
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=out, kernel=name)
        check(out, a, b, qa, sa, qb, sb, name)


# Decode-sized M: the last (or only) 64-row tile ends at every 16-row step of its rows and on
# their edges; the rows of A past M are out of bounds of its TMA box (zero-filled).
RAGGED_SMALL_M = [1, 16, 17, 40, 63, 65, 100, 191]


@pytest.mark.parametrize("m", RAGGED_SMALL_M)
def test_64_row_kernels_at_ragged_small_m(ops, fp8, m):
    n, k = 200, 896
    a, b, qa, sa, qb, sb = make_problem(m, n, k, seed=11)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    names = [x for x in ops.runnable_kernels(OP, scale="f32") if "_64x" in x]
    assert names, "the catalogue has no 64-row fp8_gemm_nt kernel"
    for name in names:
        for splits in (1, 3) if "_episk_" in name else (None,):
            out = poisoned(m, n)
            fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=out, kernel=name, k_splits=splits)
            check(out, a, b, qa, sa, qb, sb, f"{name} at M={m}, {splits} splits")


SPLIT_SHAPES = [(1, 576, 7168), (64, 2112, 7168), (128, 200, 896), (333, 4096, 1664), (64, 576, 256), (64, 7168, 1088)]


@pytest.mark.parametrize("m, n, k", SPLIT_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SPLIT_SHAPES])
def test_split_k_kernels(ops, fp8, m, n, k):
    """Every split-K kernel with split counts from 1 to one per K block (uneven last splits
    included, and counts around the fixup's load batches of 3, 7 and 8 splits): the tile's
    partial sums are added in split order, so repeating a launch gives the same bits, and the
    per-tile counters are zero again afterwards."""
    from cutegen.runtime import split_k

    a, b, qa, sa, qb, sb = make_problem(m, n, k, seed=7)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    names = [x for x in ops.runnable_kernels(OP, scale="f32") if "_episk_" in x]
    assert names, "the catalogue has no split-K fp8_gemm_nt kernel"
    k_blocks = ceil_div(k, 128)
    for name in names:
        batch_edges = {s for s in (4, 7, 8, 9, 15, 17) if s <= k_blocks}
        for splits in sorted({1, 2, 3, max(1, k_blocks // 2), k_blocks} | batch_edges):
            out = poisoned(m, n)
            fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=out, kernel=name, k_splits=splits)
            check(out, a, b, qa, sa, qb, sb, f"{name} k_splits={splits}")
            again = poisoned(m, n)
            fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=again, kernel=name, k_splits=splits)
            assert torch.equal(out, again), f"{name} k_splits={splits}: two launches differ"
    torch.cuda.synchronize()
    for counters, _ in split_k._workspaces.values():
        assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"


def test_split_k_cuda_graph_and_bad_splits(ops, fp8):
    names = [x for x in ops.runnable_kernels(OP, scale="f32") if "_episk_" in x]
    plain = [x for x in ops.runnable_kernels(OP, scale="f32") if "_episk_" not in x]
    a, b, qa, sa, qb, sb = make_problem(64, 576, 7168, seed=9)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    static_out = poisoned(64, 576)
    fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=static_out, kernel=names[0], k_splits=8)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=static_out, kernel=names[0], k_splits=8)
    for _ in range(3):
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(static_out, a, b, qa, sa, qb, sb, f"{names[0]} replayed")
    with pytest.raises(InputError, match="'k_splits'.*does not split K"):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, kernel=plain[0], k_splits=2)
    with pytest.raises(InputError, match="'k_splits'.*positive int"):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, kernel=names[0], k_splits=0)


def test_split_k_workspace_growth(ops, fp8):
    """A larger problem grows the stream's workspace; the small problem, whose cached launch
    still views the replaced one, and the large one both keep computing right."""
    from cutegen.runtime import split_k

    name = next(x for x in ops.runnable_kernels(OP, scale="f32") if "_episk_" in x)
    small = make_problem(64, 256, 1024, seed=11)
    large = make_problem(200, 2048, 2048, seed=12)
    results = {}
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()  # a stream of its own: its workspace starts at the small size
    with torch.cuda.stream(stream):
        key = (torch.cuda.current_device(), stream.cuda_stream)
        sizes = []
        for label, (a, b, qa, sa, qb, sb) in (("small", small), ("large", large), ("small again", small)):
            out = poisoned(a.shape[0], b.shape[0])
            fp8.fp8_gemm_nt(qa, fp8.to_mn_major_tma_aligned(sa), qb, sb, out=out, kernel=name, k_splits=4)
            stream.synchronize()
            check(out, a, b, qa, sa, qb, sb, f"{name} {label}")
            results[label] = out
            sizes.append(split_k._workspaces[key][1].numel())
        assert sizes[0] < sizes[1] == sizes[2], f"the larger problem should grow the workspace: {sizes}"
        assert torch.equal(results["small"], results["small again"])
        for counters in (split_k._workspaces[key][0],):
            assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"


LAUNCHES_PER_GRAPH = 16


def test_split_k_graphs_replayed_at_once(ops, fp8):
    """Two graphs captured on one stream, each with a split-K launch, replayed at the same time on
    two streams: each captured launch has a workspace of its own, so neither sees the other's
    partial sums or counters."""
    name = next(x for x in ops.runnable_kernels(OP, scale="f32") if "_episk_" in x)
    problems = [make_problem(64, 576, 7168, seed=40 + i) for i in range(2)]
    outs = [poisoned(64, 576) for _ in problems]
    graphs = []
    capture = torch.cuda.Stream()
    for (a, b, qa, sa, qb, sb), out in zip(problems, outs):
        sfa = fp8.to_mn_major_tma_aligned(sa)
        with torch.cuda.stream(capture):
            fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=out, kernel=name, k_splits=8)  # warm-up
        capture.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            for _ in range(LAUNCHES_PER_GRAPH):  # long enough for the replays to overlap
                fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=out, kernel=name, k_splits=8)
        graphs.append(graph)
    streams = [torch.cuda.Stream() for _ in graphs]
    for rep in range(20):
        for out in outs:
            out.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for (a, b, qa, sa, qb, sb), out in zip(problems, outs):
            check(out, a, b, qa, sa, qb, sb, f"{name} replay {rep}")


def test_to_mn_major_tma_aligned(fp8):
    sa = torch.randn(37, 5, device="cuda")
    aligned = fp8.to_mn_major_tma_aligned(sa)
    assert aligned.stride() == (1, 40) and torch.equal(aligned, sa)
    assert fp8.to_mn_major_tma_aligned(aligned) is aligned


def test_bad_inputs_name_the_argument(fp8):
    a, b, qa, sa, qb, sb = make_problem(64, 256, 256)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    with pytest.raises(InputError, match="'sfa'.*MN-major"):
        fp8.fp8_gemm_nt(qa, sa.contiguous(), qb, sb)
    with pytest.raises(InputError, match="'a'.*float8_e4m3fn"):
        fp8.fp8_gemm_nt(a, sfa, qb, sb)
    with pytest.raises(InputError, match="'a'.*multiple of 16"):
        fp8.fp8_gemm_nt(qa[:, :200], sfa[:, :2], qb[:, :200], sb[:, :2])
    with pytest.raises(InputError, match="'sfb'.*shape"):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb[:1])
    with pytest.raises(InputError, match="'sfb'.*float32"):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb.double())
    with pytest.raises(InputError, match="'b'.*CUDA"):
        fp8.fp8_gemm_nt(qa, sfa, qb.cpu(), sb)
    with pytest.raises(InputError, match="'out'.*shape"):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=torch.empty(64, 128, device="cuda", dtype=torch.bfloat16))


def test_torch_compile_and_cuda_graph(fp8):
    a, b, qa, sa, qb, sb = make_problem(256, 512, 1024, seed=5)
    sfa = fp8.to_mn_major_tma_aligned(sa)
    compiled = torch.compile(lambda *t: fp8.fp8_gemm_nt(*t) * 2, fullgraph=True)
    out = compiled(qa, sfa, qb, sb)
    assert calc_diff(out.float() / 2, dequantized_reference(qa, sa, qb, sb)) < 2e-5

    static_out = poisoned(256, 512)
    fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=static_out)  # load the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8.fp8_gemm_nt(qa, sfa, qb, sb, out=static_out)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(static_out.float(), dequantized_reference(qa, sa, qb, sb)) < 2e-5


def ue8m0_problem(m: int, n: int, k: int, seed: int):
    """bf16 inputs quantised with power-of-two scales, packed as the UE8M0 kernels take them."""
    from cutegen.runtime import quant_ops, quant_reference

    a, b, *_ = make_problem(m, n, k, seed)
    qa, sfa_words = quant_ops.per_token_quant_fp8(a, scale_format="ue8m0", scale_layout="mn-major-tma-aligned")
    qb, sfb_words = quant_reference.per_block_quant_fp8_ref(b, scale_format="ue8m0")
    sa = quant_reference.unpack_ue8m0(sfa_words, k // 128)
    sb = quant_reference.unpack_ue8m0(sfb_words, k // 128)
    return a, b, qa, sa, sfa_words, qb, sb, sfb_words


def test_ue8m0_scales(ops, fp8):
    """UE8M0-packed scales: computed by the kernels that take them (sm_100a); refused with a
    message naming the format on a GPU that has none (Hopper)."""
    m, n, k = 1000, 776, 1024
    a, b, qa, sa, sfa_words, qb, sb, sfb_words = ue8m0_problem(m, n, k, seed=11)
    names = ops.runnable_kernels(OP, scale="ue8m0")
    if not names:
        with pytest.raises(Exception, match="no kernel with scales ue8m0 runs on"):
            fp8.fp8_gemm_nt(qa, sfa_words, qb, sfb_words)
        return
    for name in names:
        out = poisoned(m, n)
        fp8.fp8_gemm_nt(qa, sfa_words, qb, sfb_words, out=out, kernel=name)
        check(out, a, b, qa, sa, qb, sb, name)



def test_new_addresses_reuse_the_plan_and_threads_do_not_share_it(ops, fp8):
    """Calls of one shape with other tensors (a plan retargeted to new addresses, TMA descriptors
    included), bitwise equal to calls on fresh plans; two threads on two streams at once."""
    import threading

    m, n, k = 333, 2048, 1536
    problems = []
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
        qa, sa = quantize_per_token(a)
        qb, sb = quantize_per_block(b)
        problems.append((a, b, qa, fp8.to_mn_major_tma_aligned(sa), sa, qb, sb))
    first = []
    for a, b, qa, sa_mn, sa, qb, sb in problems:  # each call after the first patches addresses
        out = poisoned(m, n)
        fp8.fp8_gemm_nt(qa, sa_mn, qb, sb, out=out)
        check(out, a, b, qa, sa, qb, sb, "retargeted plan")
        first.append(out.clone())
    results: dict[int, list[torch.Tensor]] = {}

    def worker(index: int) -> None:
        stream = torch.cuda.Stream()
        outs = []
        with torch.cuda.stream(stream):
            for _ in range(25):
                for _, _, qa, sa_mn, _, qb, sb in problems:
                    outs.append(fp8.fp8_gemm_nt(qa, sa_mn, qb, sb))
        stream.synchronize()
        results[index] = outs

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outs in results.values():
        for i, out in enumerate(outs):
            assert torch.equal(out, first[i % len(problems)])


def test_remembered_call_still_refuses_a_misaligned_address(ops, fp8):
    """The second call of a layout skips the checks but not the alignment of the new addresses."""
    from cutegen.runtime.errors import InputError

    m, n, k = 256, 1024, 512
    qa = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    qb = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = fp8.to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda") + 0.5)
    sb = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    fp8.fp8_gemm_nt(qa, sa, qb, sb, out=out)  # remembered
    storage = torch.empty(m * k + 8, device="cuda", dtype=torch.float8_e4m3fn)
    shifted = storage[8:].view(m, k)  # the same layout, 8 bytes off a 16-byte boundary
    shifted.copy_(qa)
    with pytest.raises(InputError, match="'a'.*16-byte aligned"):
        fp8.fp8_gemm_nt(shifted, sa, qb, sb, out=out)
