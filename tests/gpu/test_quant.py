"""GPU tests of the FP8 quantize kernels against their pure-torch references, bit for bit.

``cutegen.runtime.quant_reference`` is the specification: q bytes and scale bits must be equal,
outputs are poisoned (0xFF bytes, which no quantizer writes) before every run so an unwritten
byte cannot pass, and inputs carry outliers spanning many decades plus NaN/Inf where the policy
is tested. Run on a Hopper GPU with a built catalogue (``CUTEGEN_BUILD_DIR``); see conftest.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import quant_reference as ref  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402
from quant_checks import assert_same_bytes, data  # noqa: E402

pytestmark = pytest.mark.gpu

MOE_GROUPS = [5120, 512, 2560, 2048, 2048, 512, 3072, 8192]  # sum 24064
POISON = 0xFF



def same_layout(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Same shape and the same strides on every dimension longer than 1 (a size-1 dimension's
    stride never addresses memory, and torch picks it freely)."""
    return x.shape == y.shape and all(
        sx == sy for n, sx, sy in zip(x.shape, x.stride(), y.stride()) if n > 1
    )

@pytest.fixture(scope="session")
def qops(ops, device_info):
    from cutegen.runtime import quant_ops

    cat = ops.catalogue()
    for op in (quant_ops.OP_PER_TOKEN, quant_ops.OP_PER_BLOCK, quant_ops.OP_GROUPED):
        if not cat.compatible(op, device_info.capability):
            pytest.skip(f"no {op} kernel in {cat.build_dir} runs on {device_info.arch}")
    return quant_ops


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output like `t` with every byte 0xFF (e4m3 -NaN / an fp32 NaN no quantizer writes)."""
    out = torch.empty_like(t)
    if out.element_size() == 1:
        out.view(torch.uint8).fill_(POISON)
    else:
        out.view(torch.int32).fill_(-1)
    return out


def poisoned_scales(m: int, cols: int, dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale tensor in `layout`, its whole underlying buffer), every byte 0xFF."""
    if layout == "mn-major-tma-aligned":
        ma = ref.align(m, 4)
        buf = torch.full((cols * ma,), -1, dtype=torch.int32, device="cuda").view(dtype)
        return buf.as_strided((m, cols), (1, ma)), buf
    buf = torch.full((m, cols), -1, dtype=torch.int32, device="cuda").view(dtype)
    return buf, buf


# ------------------------------------------------------------------------------------------------
# Per-token


PER_TOKEN_SHAPES = [(1, 128), (1, 16), (37, 640), (6, 1536 + 16), (129, 7168 + 16), (4096, 7168)]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


@pytest.mark.parametrize("layout", ["k-major", "mn-major-tma-aligned"])
@pytest.mark.parametrize("scale_format", ["fp32", "ue8m0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
def test_per_token_bit_exact(qops, dtype, scale_format, layout):
    """Every built kernel (both tile widths) with either scale layout; the allocating form runs
    the kernel the runtime chooses."""
    kernels = qops.quant_kernels(qops.OP_PER_TOKEN, DTYPE_NAMES[dtype], scale_format)
    assert len(kernels) >= 2, kernels
    for i, (m, k) in enumerate(PER_TOKEN_SHAPES):
        if dtype != torch.bfloat16 and m * k > 1 << 22:
            continue  # the large shape once (bf16) keeps the tier fast
        x = data(m, k, seed=10 + i, dtype=dtype)
        want_q, want_s = ref.per_token_quant_fp8_ref(x, scale_format=scale_format, scale_layout=layout)
        g = ref.ceil_div(k, 128)
        cols = g if scale_format == "fp32" else ref.ceil_div(g, 4)
        sdt = torch.float32 if scale_format == "fp32" else torch.int32
        for kernel in kernels:
            q = poisoned_like(torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda"))
            s, buf = poisoned_scales(m, cols, sdt, layout)
            got_q, got_s = qops.per_token_quant_fp8(
                x, scale_format=scale_format, scale_layout=layout, out=q, out_scales=s, kernel=kernel
            )
            assert got_q is q and got_s is s
            what = f"{dtype} {scale_format} {layout} {m}x{k} {kernel}"
            assert_same_bytes(q, want_q, what + " q")
            assert_same_bytes(s, want_s, what + " scales")
            if layout == "mn-major-tma-aligned":  # padding rows are written with 0
                full = buf.view(torch.int32).view(cols, ref.align(m, 4))
                assert torch.all(full[:, m:] == 0), what + " padding rows"
        # the allocating form returns the same bytes and the requested layout
        what = f"{dtype} {scale_format} {layout} {m}x{k}"
        q2, s2 = qops.per_token_quant_fp8(x, scale_format=scale_format, scale_layout=layout)
        assert_same_bytes(q2, want_q, what + " q (new)")
        assert_same_bytes(s2, want_s, what + " scales (new)")
        assert same_layout(s2, want_s), (what, s2.stride(), want_s.stride())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_per_token_nonfinite_policy(qops, bad):
    x = data(64, 1024, seed=3)
    x[5, 300] = bad
    x[63, 1023] = bad
    for fmt in ("fp32", "ue8m0"):
        want_q, want_s = ref.per_token_quant_fp8_ref(x, scale_format=fmt)
        got_q, got_s = qops.per_token_quant_fp8(x, scale_format=fmt)
        assert_same_bytes(got_q, want_q, f"{fmt} q")
        assert_same_bytes(got_s, want_s, f"{fmt} scales")
    assert torch.all(got_q.view(torch.uint8)[5, 256:384] == 0x7F)


def test_per_token_special_values(qops):
    x = torch.zeros(8, 512, device="cuda", dtype=torch.float32)
    x[1, :128] = 2.0**-9  # e4m3 subnormal steps after scaling
    x[2, 0] = 448.0
    x[2, 1:8] = torch.tensor([2.0**-9, 2.0**-10, 3 * 2.0**-10, 7 * 2.0**-9, 2.0**-6, -5 * 2.0**-9, 1e-30])
    x[3, :] = -1e38
    x[4, 0] = 448.0 * (1 + 2.0**-7)  # just above a power-of-two scale
    x[5, 7] = 1e-45  # an fp32 denormal
    for fmt in ("fp32", "ue8m0"):
        want_q, want_s = ref.per_token_quant_fp8_ref(x, scale_format=fmt)
        got_q, got_s = qops.per_token_quant_fp8(x, scale_format=fmt)
        assert_same_bytes(got_q, want_q, fmt)
        assert_same_bytes(got_s, want_s, fmt)


def test_per_token_eps_and_round_trip(qops):
    x = data(256, 2048, seed=4)
    for eps in (1e-4, 1e-30, 3.0):
        want_q, want_s = ref.per_token_quant_fp8_ref(x, eps=eps)
        got_q, got_s = qops.per_token_quant_fp8(x, eps=eps)
        assert_same_bytes(got_q, want_q, f"eps={eps}")
        assert_same_bytes(got_s, want_s, f"eps={eps}")
    q, s = qops.per_token_quant_fp8(x)
    d = ref.dequant_per_token(q, s)
    se = s.repeat_interleave(128, 1)
    mask = x.float().abs() / se >= 2.0**-6
    rel = ((d - x.float()).abs() / x.float().abs())[mask]
    assert rel.max().item() <= 2.0**-4 * (1 + 1e-6)


def test_per_token_strided_input_and_gemm_layout(qops):
    base = data(300, 1040, seed=5)
    x = base[:, 8:1032]  # row stride 1040, 16-byte aligned start
    want_q, want_s = ref.per_token_quant_fp8_ref(x, scale_layout="mn-major-tma-aligned")
    q, s = qops.per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned")
    assert_same_bytes(q, want_q, "strided x")
    assert_same_bytes(s, want_s, "strided x scales")
    from cutegen.runtime.fp8_ops import is_mn_major_tma_aligned

    assert is_mn_major_tma_aligned(s)  # what fp8_gemm_nt takes as SFA


@pytest.mark.parametrize("layout", ["mn-major-tma-aligned", "k-major"])
def test_quantize_kernels_feed_fp8_gemm(qops, layout):
    """End to end: bf16 activations and weights, quantised by the kernels (per-token, per-block),
    then `fp8_gemm_nt`, against the fp32 product of the unquantised inputs. K-major scales go
    through `to_mn_major_tma_aligned` first."""
    from cutegen.runtime import fp8_ops
    from test_fp8_gemm import calc_diff

    for i, (m, n, k) in enumerate([(1000, 2112, 7168), (129, 576, 1536), (1, 4096, 512)]):
        g = torch.Generator(device="cuda").manual_seed(70 + i)
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
        qa, sa = qops.per_token_quant_fp8(a, scale_layout=layout)
        qb, sb = qops.per_block_quant_fp8(b)
        if layout == "k-major":
            sa = fp8_ops.to_mn_major_tma_aligned(sa)
        d = fp8_ops.fp8_gemm_nt(qa, sa, qb, sb)
        diff = calc_diff(d, a.float() @ b.float().t())
        assert diff < 1e-3, f"{m}x{n}x{k} {layout}: calc_diff {diff:.2e}"


# ------------------------------------------------------------------------------------------------
# Per-block


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
def test_per_block_bit_exact(qops, dtype):
    shapes = [(1, 16), (128, 128), (130, 144), (300, 272), (2112, 7168)]
    for i, (n, k) in enumerate(shapes):
        if dtype != torch.bfloat16 and n * k > 1 << 22:
            continue
        w = data(n, k, seed=20 + i, dtype=dtype)
        if i == 3:
            w[200, 100] = float("nan")
            w[0, 271] = float("inf")
        want_q, want_s = ref.per_block_quant_fp8_ref(w)
        q = poisoned_like(torch.empty(n, k, dtype=torch.float8_e4m3fn, device="cuda"))
        s = poisoned_like(torch.empty(ref.ceil_div(n, 128), ref.ceil_div(k, 128), device="cuda"))
        qops.per_block_quant_fp8(w, out=q, out_scales=s)
        assert_same_bytes(q, want_q, f"{dtype} {n}x{k} q")
        assert_same_bytes(s, want_s, f"{dtype} {n}x{k} scales")
    d = ref.dequant_per_block(q, s)
    se = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]
    mask = w.float().abs() / se >= 2.0**-6
    assert ((d - w.float()).abs() / w.float().abs())[mask].max().item() <= 2.0**-4 * (1 + 1e-6)


# ------------------------------------------------------------------------------------------------
# Grouped transposed


def run_grouped(qops, x, sizes, num_blocks=None, poison=True, kernel=None):
    gs = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    s_rows = qops.grouped_num_blocks_bound(x.shape[0], len(sizes)) if num_blocks is None else num_blocks
    q = torch.full((128 * x.shape[1] * s_rows,), POISON, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    s = torch.full((s_rows, x.shape[1]), -1, dtype=torch.int32, device="cuda").view(torch.float32)
    if not poison:
        return qops.grouped_transposed_quant_fp8(x, gs, num_blocks=num_blocks, kernel=kernel)
    qops.grouped_transposed_quant_fp8(x, gs, out=q, out_scales=s, kernel=kernel)
    return q, s


@pytest.mark.parametrize(
    "sizes, hidden",
    [
        ([0, 1, 127, 129], 64),
        ([129, 0, 0, 1, 127, 256, 3], 200),
        ([1], 8),
        ([0, 0, 300], 136),
        ([200] * 40 + [0] * 10 + [77] * 14, 72),
    ],
)
def test_grouped_bit_exact_small(qops, sizes, hidden):
    x = data(sum(sizes), hidden, seed=len(sizes))
    for kernel in qops.quant_kernels(qops.OP_GROUPED, "bf16", "fp32"):
        for num_blocks in (None, sum(ref.ceil_div(m, 128) for m in sizes)):
            q, s = run_grouped(qops, x, sizes, num_blocks, kernel=kernel)
            want_q, want_s = ref.grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=s.shape[0])
            assert_same_bytes(q, want_q, f"{kernel} {sizes} H={hidden} q (S={s.shape[0]})")
            assert_same_bytes(s, want_s, f"{kernel} {sizes} H={hidden} scales (S={s.shape[0]})")


def test_grouped_no_tokens(qops):
    # T = 0 with a caller's bound S > 0: S blocks of zero tokens (the kernel reads no token).
    x = torch.empty(0, 64, dtype=torch.bfloat16, device="cuda")
    q, s = run_grouped(qops, x, [0, 0, 0], num_blocks=2)
    want_q, want_s = ref.grouped_transposed_quant_fp8_ref(x, [0, 0, 0], num_blocks=2)
    assert_same_bytes(q, want_q, "T=0 q")
    assert_same_bytes(s, want_s, "T=0 scales")


def test_grouped_sizes_past_t_read_as_zeros(qops):
    # Group sizes stay on the GPU and are not checked against T: tokens past T read as zeros,
    # including in a block that is whole by its group size (group 1's first block here).
    x = data(200, 72, seed=11)
    sizes = [128, 160]
    padded = torch.cat([x, torch.zeros(sum(sizes) - x.shape[0], 72, dtype=x.dtype, device=x.device)])
    want_q, want_s = ref.grouped_transposed_quant_fp8_ref(padded, sizes, num_blocks=3)
    for kernel in qops.quant_kernels(qops.OP_GROUPED, "bf16", "fp32"):
        q, s = run_grouped(qops, x, sizes, num_blocks=3, kernel=kernel)
        assert_same_bytes(q, want_q, f"{kernel} q")
        assert_same_bytes(s, want_s, f"{kernel} scales")


def test_grouped_moe_configuration(qops):
    x = data(sum(MOE_GROUPS), 7168, seed=7)
    x[100, 5] = float("nan")  # one poisoned block in group 0
    x[5120 + 511, 7000] = float("-inf")  # the last token of group 1
    exact = sum(ref.ceil_div(m, 128) for m in MOE_GROUPS)
    assert exact == 188
    want_q, want_s = ref.grouped_transposed_quant_fp8_ref(x, MOE_GROUPS, num_blocks=exact)
    for kernel in qops.quant_kernels(qops.OP_GROUPED, "bf16", "fp32"):
        q, s = run_grouped(qops, x, MOE_GROUPS, num_blocks=exact, kernel=kernel)
        assert_same_bytes(q, want_q, f"MoE q ({kernel})")
        assert_same_bytes(s, want_s, f"MoE scales ({kernel})")
    # the default bound (no host knowledge of the sizes): the same bytes, then zero blocks
    q2, s2 = run_grouped(qops, x, MOE_GROUPS)
    assert s2.shape[0] == 195
    assert_same_bytes(q2[: q.numel()], q, "MoE q (bound)")
    assert torch.all(q2.view(torch.uint8)[q.numel() :] == 0)
    assert_same_bytes(s2[:exact], s, "MoE scales (bound)")
    assert torch.all(s2[exact:] == ref.group_scales(torch.zeros(1, device="cuda"), torch.zeros(1, dtype=torch.bool, device="cuda"), 1e-4, False))
    d = ref.dequant_grouped_transposed(q, s, MOE_GROUPS, 7168)
    finite = torch.isfinite(x.float()) & torch.isfinite(d)
    big = finite & (x.float().abs() >= 2.0**-6 * s[torch.isfinite(s)].max())
    assert ((d - x.float()).abs()[big] / x.float().abs()[big]).max().item() <= 2.0**-4 * (1 + 1e-6)


def test_grouped_cuda_graph(qops):
    sizes = [300, 0, 129, 1]
    x = data(sum(sizes), 256, seed=8)
    gs = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, s = qops.grouped_transposed_quant_fp8(x, gs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = qops.grouped_transposed_quant_fp8(x, gs)
    new_sizes = [1, 129, 0, 300]  # same T: the graph reads the sizes from the device
    gs.copy_(torch.tensor(new_sizes, dtype=torch.int32))
    x.copy_(data(sum(sizes), 256, seed=9))
    graph.replay()
    torch.cuda.synchronize()
    want_q, want_s = ref.grouped_transposed_quant_fp8_ref(x, new_sizes, num_blocks=s.shape[0])
    assert_same_bytes(q, want_q, "graph replay q")
    assert_same_bytes(s, want_s, "graph replay scales")


def test_grouped_dynamic_tiles(qops):
    """Problems with more tiles than two per CTA take the counter path: ragged groups, launches
    of different sizes back to back on one stream and at the same time on two, each bit-exact,
    and every counter back at zero afterwards."""
    cases = [
        ([1000, 0, 129, 3000, 7], 2048),  # 35 scale rows x 32 hidden tiles
        ([128 * 30, 1], 4096),
        ([5, 3000, 1, 0, 2900, 640], 1024),
    ]
    inputs = [(data(sum(sizes), h, seed=20 + i), sizes) for i, (sizes, h) in enumerate(cases)]
    wants = [ref.grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=sum(ref.ceil_div(m, 128) for m in sizes))
             for x, sizes in inputs]
    exact = [w[1].shape[0] for w in wants]
    for kernel in qops.quant_kernels(qops.OP_GROUPED, "bf16", "fp32"):
        for _ in range(3):
            for (x, sizes), (want_q, want_s), s_rows in zip(inputs, wants, exact):
                q, s = run_grouped(qops, x, sizes, num_blocks=s_rows, kernel=kernel)
                assert_same_bytes(q, want_q, f"{kernel} {sizes} q")
                assert_same_bytes(s, want_s, f"{kernel} {sizes} scales")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    results = {}
    for rep in range(4):
        for j, st in enumerate(streams):
            x, sizes = inputs[(rep + j) % len(inputs)]
            with torch.cuda.stream(st):
                results[(rep, j)] = run_grouped(qops, x, sizes, num_blocks=exact[(rep + j) % len(inputs)])
    torch.cuda.synchronize()
    for (rep, j), (q, s) in results.items():
        want_q, want_s = wants[(rep + j) % len(inputs)]
        assert_same_bytes(q, want_q, f"stream {j} launch {rep} q")
        assert_same_bytes(s, want_s, f"stream {j} launch {rep} scales")
    for key, counter in qops._tile_counters.items():
        assert int(counter.item()) == 0, f"tile counter of {key} left at {int(counter.item())}"


def test_grouped_dynamic_tiles_cuda_graph(qops):
    """A captured launch of the counter path replays correctly, again and again."""
    sizes = [2000, 0, 129, 1500]
    x = data(sum(sizes), 2048, seed=30)
    gs = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    s_rows = sum(ref.ceil_div(m, 128) for m in sizes)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        qops.grouped_transposed_quant_fp8(x, gs, num_blocks=s_rows)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = qops.grouped_transposed_quant_fp8(x, gs, num_blocks=s_rows)
    for seed in (31, 32, 33):
        x.copy_(data(sum(sizes), 2048, seed=seed))
        q.view(torch.uint8).fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_s = ref.grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=s_rows)
        assert_same_bytes(q, want_q, f"replay {seed} q")
        assert_same_bytes(s, want_s, f"replay {seed} scales")


# ------------------------------------------------------------------------------------------------
# Inputs refused before anything is launched


def test_bad_inputs_name_the_argument(qops):
    x = data(64, 640, seed=1)
    buf = torch.empty(64, 656, dtype=torch.bfloat16, device="cuda")
    cases = [
        (lambda: qops.per_token_quant_fp8(x.cpu()), "argument 'x' must be a CUDA tensor"),
        (lambda: qops.per_token_quant_fp8(x.to(torch.float8_e4m3fn)), "argument 'x' must be torch.bfloat16"),
        (lambda: qops.per_token_quant_fp8(x[:, :600]), "argument 'x' must have K a multiple of 16"),
        (lambda: qops.per_token_quant_fp8(buf[:, 1:641]), "argument 'x' must start at a 16-byte aligned address"),
        (lambda: qops.per_token_quant_fp8(x, scale_format="mxfp8"), "argument 'scale_format'"),
        (lambda: qops.per_token_quant_fp8(x, eps=0.0), "argument 'eps'"),
        (lambda: qops.per_token_quant_fp8(x, kernel="no_such_kernel"), "argument 'kernel' must name a kernel"),
        (lambda: qops.per_block_quant_fp8(x.t()), "argument 'w' must be contiguous along its last dimension"),
        (lambda: qops.grouped_transposed_quant_fp8(x, torch.tensor([64], device="cuda")), "argument 'group_sizes' must be torch.int32"),
        (lambda: qops.grouped_transposed_quant_fp8(x, torch.tensor([64], dtype=torch.int32)), "argument 'group_sizes' must be a CUDA tensor"),
        (lambda: qops.grouped_transposed_quant_fp8(x.float(), torch.tensor([64], dtype=torch.int32, device="cuda")), "argument 'x' must be torch.bfloat16"),
    ]
    for call, match in cases:
        with pytest.raises(InputError, match=match):
            call()
    other = qops.choose_quant_kernel(qops.OP_PER_TOKEN, "bf16", "ue8m0", 0)
    with pytest.raises(InputError, match="built for input bf16 with ue8m0"):
        qops.per_token_quant_fp8(x, kernel=other)


def test_degenerate_extents(qops):
    q, s = qops.per_token_quant_fp8(torch.empty(0, 128, dtype=torch.bfloat16, device="cuda"))
    assert q.shape == (0, 128) and s.shape == (0, 1)
    q, s = qops.per_block_quant_fp8(torch.empty(5, 0, dtype=torch.bfloat16, device="cuda"))
    assert q.shape == (5, 0) and s.shape == (1, 0)


def test_opcheck(qops):
    x = data(16, 256, seed=2)
    torch.library.opcheck(torch.ops.cutegen.per_token_quant_fp8.default, (x, 128, "fp32", "mn-major-tma-aligned", 1e-4, ""))
    torch.library.opcheck(torch.ops.cutegen.per_block_quant_fp8.default, (x, 1e-4, ""))
    gs = torch.tensor([10, 6], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.cutegen.grouped_transposed_quant_fp8.default, (x, gs, 1e-4, -1, ""))
