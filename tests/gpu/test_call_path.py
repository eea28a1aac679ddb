"""GPU tests of the call path: a call with an earlier call's layout (remembered, relaunched at new
addresses, scratch included) gives the bytes the checked path gives, for every op; a launch with
another context current falls back to the kernel's; scratch is never shared across streams or
with a CUDA graph being captured."""

from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rt():
    from cutegen import runtime
    from cutegen.runtime import bf16_ops, call_cache, fp8_ops, grouped_ops, k_grouped_ops, quant_ops

    runtime.register_torch_ops()
    return {"fp8": fp8_ops, "bf16": bf16_ops, "grouped": grouped_ops, "k_grouped": k_grouped_ops,
            "quant": quant_ops, "cache": call_cache}


def fp8_set(m: int, n: int, k: int, seed: int, groups: int | None = None):
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    g = torch.Generator(device="cuda").manual_seed(seed)
    kb = -(-k // 128)
    lead = () if groups is None else (groups,)
    qa = torch.randn(*lead, m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sa = to_mn_major_tma_aligned(torch.rand(*lead, m, kb, device="cuda", generator=g) + 0.5)
    qb = torch.randn(*(lead or ()), n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sb = torch.rand(*(lead or ()), -(-n // 128), kb, device="cuda", generator=g) + 0.5
    return qa, sa, qb, sb


def same_as_checked(rt, call, first, second, what: str):
    """call(first) remembers the layout, and again finds it by its key and guards it; call(second)
    is found by the guard and relaunches at new addresses; the checked path on `second` (every
    remembered call forgotten first) must give the same bytes and outputs of the same layout."""
    call(*first)
    call(*first)
    fast = call(*second)
    torch.cuda.synchronize()
    layouts = [(t.shape, t.stride(), t.dtype, t.untyped_storage().nbytes()) for t in fast]
    fast = [t.clone() for t in fast]
    rt["cache"].forget_all()
    checked = call(*second)
    torch.cuda.synchronize()
    assert layouts == [(t.shape, t.stride(), t.dtype, t.untyped_storage().nbytes()) for t in checked], what
    for f, c in zip(fast, checked):
        assert torch.equal(f.view(torch.uint8) if f.dtype == torch.float8_e4m3fn else f,
                           c.view(torch.uint8) if c.dtype == torch.float8_e4m3fn else c), what


def test_a_layout_seen_twice_is_found_by_its_guard(rt, monkeypatch):
    fp8 = rt["fp8"]
    assert rt["cache"]._guard is not None, "torch's tensor guards are missing: every call builds its layout key"
    rt["cache"].forget_all()
    sets = [fp8_set(128, 3072, 4096, seed) for seed in (11, 12, 13)]
    fp8.fp8_gemm_nt(*sets[0])  # checked and remembered
    fp8.fp8_gemm_nt(*sets[1])  # found by its key, and guarded
    monkeypatch.setattr(fp8._calls, "key", lambda *args: pytest.fail("the layout key was built"))
    fast = fp8.fp8_gemm_nt(*sets[2])
    monkeypatch.undo()
    fast = fast.clone()
    rt["cache"].forget_all()
    assert torch.equal(fast, fp8.fp8_gemm_nt(*sets[2]))


def test_fp8_and_bf16_relaunch_at_new_addresses(rt):
    fp8, bf16 = rt["fp8"], rt["bf16"]
    for m, n, k in ((128, 3072, 4096), (333, 2112, 7168), (64, 576, 7168)):  # the last splits K
        sets = [fp8_set(m, n, k, seed) for seed in (1, 2)]
        same_as_checked(rt, lambda qa, sa, qb, sb: [fp8.fp8_gemm_nt(qa, sa, qb, sb)], *sets, f"fp8 {m}x{n}x{k}")

        def with_out(qa, sa, qb, sb):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            fp8.fp8_gemm_nt(qa, sa, qb, sb, out=out)
            return [out]

        same_as_checked(rt, with_out, *sets, f"fp8 out= {m}x{n}x{k}")
    a = [torch.randn(200, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    same_as_checked(rt, lambda x, y: [bf16.bf16_gemm_nt(x, y)], (a[0], b[0]), (a[1], b[1]), "bf16")


def test_weight_gradients_relaunch_at_new_addresses(rt):
    fp8, kg = rt["fp8"], rt["k_grouped"]
    m, n, k = 576, 1024, 1024
    sets = []
    for seed in (3, 4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        qa = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
        qb = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
        sa = fp8.to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda", generator=g) + 0.5)
        sb = fp8.to_mn_major_tma_aligned(torch.rand(n, k // 128, device="cuda", generator=g) + 0.5)
        c = torch.randn(m, n, device="cuda", generator=g)
        sets.append((qa, sa, qb, sb, c))
    torch.use_deterministic_algorithms(True)  # whole tiles: bitwise reproducible
    try:
        for with_c in (False, True):
            def wgrad(qa, sa, qb, sb, c):
                d = c.clone() if not with_c else torch.zeros_like(c)
                fp8.fp8_wgrad_gemm_nt(qa, sa, qb, sb, d, c if with_c else None)
                return [d]

            same_as_checked(rt, wgrad, *sets, f"wgrad c={with_c}")
    finally:
        torch.use_deterministic_algorithms(False)
    groups, mm, nn = 3, 256, 128
    sizes = torch.tensor([300, 0, 200], dtype=torch.int32, device="cuda")
    blocks = 3 + 0 + 2
    ksets = []
    for seed in (5, 6):
        g = torch.Generator(device="cuda").manual_seed(seed)
        ksets.append((torch.randn(128 * mm * blocks, device="cuda", generator=g).to(torch.float8_e4m3fn),
                      torch.rand(blocks, mm, device="cuda", generator=g) + 0.5,
                      torch.randn(128 * nn * blocks, device="cuda", generator=g).to(torch.float8_e4m3fn),
                      torch.rand(blocks, nn, device="cuda", generator=g) + 0.5))

    def k_grouped(a, sa, b, sb):
        d = torch.ones(groups, mm, nn, device="cuda")
        kg.k_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, d, sizes)
        return [d]

    same_as_checked(rt, k_grouped, *ksets, "k-grouped")


def test_grouped_layouts_relaunch_at_new_addresses(rt):
    grouped = rt["grouped"]
    groups, rows, n, k = 3, 256, 512, 1024
    m_indices = torch.arange(groups, device="cuda", dtype=torch.int32).repeat_interleave(rows)
    m_indices[rows - 5 : rows] = -1
    contiguous = [fp8_set(groups * rows, n, k, seed) for seed in (7, 8)]
    contiguous = [(qa, sa, qb.expand(groups, n, k).contiguous(), sb.expand(groups, *sb.shape).contiguous())
                  for qa, sa, qb, sb in contiguous]
    same_as_checked(
        rt, lambda qa, sa, qb, sb: [grouped.m_grouped_fp8_gemm_nt_contiguous(qa, sa, qb, sb, m_indices)],
        *contiguous, "contiguous")
    masked_m = torch.tensor([100, 0, 256], dtype=torch.int32, device="cuda")
    masked = [fp8_set(rows, n, k, seed, groups=groups) for seed in (9, 10)]

    def masked_call(qa, sa, qb, sb):
        out = torch.zeros(groups, rows, n, device="cuda", dtype=torch.bfloat16)
        grouped.m_grouped_fp8_gemm_nt_masked(qa, sa, qb, sb, masked_m, 128, out=out)
        return [out]

    same_as_checked(rt, masked_call, *masked, "masked")


def test_quantize_ops_relaunch_at_new_addresses(rt):
    quant = rt["quant"]
    for m in (100, 257):  # M % 4 != 0: the MN-major scales' padding rows
        xs = [(torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
        for layout in ("k-major", "mn-major-tma-aligned"):
            same_as_checked(rt, lambda x: list(quant.per_token_quant_fp8(x, scale_layout=layout)), *xs,
                            f"per-token {layout} M={m}")

            def per_token_out(x):
                q, sf = quant.per_token_quant_fp8(x, scale_layout=layout)  # outputs of the right layout
                q.fill_(0), sf.fill_(float("nan"))
                quant.per_token_quant_fp8(x, scale_layout=layout, out=q, out_scales=sf)
                return [q, sf]

            same_as_checked(rt, per_token_out, *xs, f"per-token out= {layout} M={m}")
        same_as_checked(rt, lambda w: list(quant.per_block_quant_fp8(w)), *xs, f"per-block M={m}")
    sizes = torch.tensor([130, 0, 70, 57], dtype=torch.int32, device="cuda")
    xs = [(torch.randn(257, 512, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
    same_as_checked(rt, lambda x: list(quant.grouped_transposed_quant_fp8(x, sizes)), *xs, "grouped transposed")


def test_remembered_per_token_out_still_checks_the_padding_rows_fit(rt):
    from cutegen.runtime.errors import InputError

    quant = rt["quant"]
    m, k = 101, 512
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    q, sf = quant.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned")
    quant.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned", out=q, out_scales=sf)  # remembered
    tight = torch.empty(k // 128 * 104 - 3, device="cuda").as_strided((m, k // 128), (1, 104))
    with pytest.raises(InputError, match="'out_scales'.*padding|all 104 rows"):
        quant.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned", out=q, out_scales=tight)


def test_launch_with_another_context_current_falls_back(rt):
    from cutegen.runtime.driver import check, cu

    fp8 = rt["fp8"]
    qa, sa, qb, sb = fp8_set(128, 1024, 512, 11)
    want = fp8.fp8_gemm_nt(qa, sa, qb, sb)
    out = torch.empty_like(want)
    fp8.fp8_gemm_nt(qa, sa, qb, sb, out=out)  # remembered
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    device = check(cu.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
    try:  # cuda-bindings 13 takes creation parameters first; 12 does not
        other = check(cu.cuCtxCreate(None, 0, device), "cuCtxCreate")
    except TypeError:
        other = check(cu.cuCtxCreate(0, device), "cuCtxCreate")
    # `other` is current on this thread now: the kernel's context is not
    try:
        fp8.fp8_gemm_nt(qa, sa, qb, sb, out=out)
    finally:
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
        check(cu.cuCtxDestroy(other), "cuCtxDestroy")
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.skipif(os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
                    reason="CUDA-graph capture needs torch's caching allocator")
def test_scratch_is_per_stream_and_per_capture(rt):
    """The grouped quantize's tile counter and the split-K workspace: a call remembered on one
    stream is not relaunched on another, nor while that stream captures a graph."""
    quant, fp8 = rt["quant"], rt["fp8"]
    sizes = torch.tensor([64, 200, 0, 1], dtype=torch.int32, device="cuda")
    x = torch.randn(265, 256, device="cuda", dtype=torch.bfloat16)
    want = quant.grouped_transposed_quant_fp8(x, sizes)
    qa, sa, qb, sb = fp8_set(64, 576, 7168, 12)  # a split-K problem
    want_d = fp8.fp8_gemm_nt(qa, sa, qb, sb)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    results = {}

    def on(stream, name):
        with torch.cuda.stream(stream):
            results[name] = (quant.grouped_transposed_quant_fp8(x, sizes), fp8.fp8_gemm_nt(qa, sa, qb, sb))
        stream.synchronize()

    threads = [threading.Thread(target=on, args=(s, i)) for i, s in enumerate((side, torch.cuda.Stream()))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    on(side, "again")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = (quant.grouped_transposed_quant_fp8(x, sizes), fp8.fp8_gemm_nt(qa, sa, qb, sb))
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    for (q, s), d in [*results.values(), captured]:
        assert torch.equal(q.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(s, want[1])
        assert torch.equal(d, want_d)


def test_outputs_sharing_memory_are_refused_first_and_remembered_calls_alike(rt):
    """`out` over an input, over itself (row stride under N), a quantizer's outputs over each other:
    InputError naming both arguments, on a first call and on a call with a remembered layout."""
    from cutegen.runtime.errors import InputError

    fp8, quant = rt["fp8"], rt["quant"]
    m, n, k = 128, 256, 512
    raw = torch.empty(4 * m * k, device="cuda", dtype=torch.uint8)
    qa = raw[: m * k].view(torch.float8_e4m3fn).view(m, k)
    qa.copy_(torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn))
    _, sa, qb, sb = fp8_set(m, n, k, 13)
    apart = raw[2 * m * k : 2 * m * k + 2 * m * n].view(torch.bfloat16).view(m, n)
    over_a = raw[m * k // 2 : m * k // 2 + 2 * m * n].view(torch.bfloat16).view(m, n)
    with pytest.raises(InputError, match="fp8_gemm_nt: argument 'out' must not share memory with argument 'a'"):
        fp8.fp8_gemm_nt(qa, sa, qb, sb, out=over_a)  # the checked path
    fp8.fp8_gemm_nt(qa, sa, qb, sb, out=apart)  # remembered
    with pytest.raises(InputError, match="fp8_gemm_nt: argument 'out' must not share memory with argument 'a'"):
        fp8.fp8_gemm_nt(qa, sa, qb, sb, out=over_a)  # the same layout: the remembered path
    torch.cuda.synchronize()
    tight = torch.empty(m * n, device="cuda", dtype=torch.bfloat16).as_strided((m, n), (n - 8, 1))
    with pytest.raises(InputError, match="argument 'out' must not overlap itself"):
        fp8.fp8_gemm_nt(qa, sa, qb, sb, out=tight)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    q, sf = quant.per_token_quant_fp8(x)
    quant.per_token_quant_fp8(x, out=q, out_scales=sf)  # remembered
    shared = torch.empty(m * k // 4 + 64, device="cuda", dtype=torch.float32)
    q_over = shared.view(torch.float8_e4m3fn)[: m * k].view(m, k)
    sf_over = shared[: m * (k // 128)].view(m, k // 128)
    with pytest.raises(InputError, match="per_token_quant_fp8: argument 'out(_scales)?' must not share memory with "
                                         "argument 'out(_scales)?'"):
        quant.per_token_quant_fp8(x, out=q_over, out_scales=sf_over)


def test_weight_gradient_c_is_a_transposed_view_of_d(rt):
    """C = D is accumulated in place; C = D.t() has D's address but not its elements, and must
    not be taken for C = D (the copy into D then refuses, as torch does for such overlap)."""
    fp8 = rt["fp8"]
    n, k = 256, 512
    g = torch.Generator(device="cuda").manual_seed(14)
    qa = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    qb = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sa = fp8.to_mn_major_tma_aligned(torch.rand(n, k // 128, device="cuda", generator=g) + 0.5)
    sb = fp8.to_mn_major_tma_aligned(torch.rand(n, k // 128, device="cuda", generator=g) + 0.5)
    d = torch.randn(n, n, device="cuda", generator=g)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        fp8.fp8_wgrad_gemm_nt(qa, sa, qb, sb, d, d.t())
    c = torch.randn(n, n, device="cuda", generator=g)
    want = d.clone()
    torch.use_deterministic_algorithms(True)
    try:
        fp8.fp8_wgrad_gemm_nt(qa, sa, qb, sb, want, c.t().contiguous())
        fp8.fp8_wgrad_gemm_nt(qa, sa, qb, sb, d, c.t())  # a transposed view that is not D: copied
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(d, want)


def test_extents_past_int32_are_refused_naming_the_argument(rt):
    from cutegen.runtime.errors import InputError

    fp8 = rt["fp8"]
    store = torch.empty(16, device="cuda", dtype=torch.float8_e4m3fn)
    huge = store.as_strided((1 << 31, 16), (0, 1))  # never read: refused first
    sa = torch.empty_strided(((1 << 31), 1), (1, 1 << 31), device="meta")
    with pytest.raises(InputError, match="argument 'a' has 2147483648 elements along mode 0"):
        fp8.fp8_gemm_nt(huge, sa, store.view(1, 16), torch.ones(1, 1, device="cuda"))
