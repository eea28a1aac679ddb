"""GPU tests of the FP4 per-token quantize kernels against `mx_reference.quant_fp4_ref`, bit for bit.

The reference is the specification: the packed E2M1 bytes and the packed UE8M0 scale words must
be equal. Outputs are poisoned (0xFF bytes: -6.0 codes and NaN scale bytes in every group, which
no real group of these inputs produces) before every run so an unwritten byte cannot pass;
inputs carry values spanning many decades, exact rounding midpoints, NaN and Inf. Run on a GPU
with a built catalogue (``CUTEGEN_BUILD_DIR``); see conftest.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import mx_reference as mx  # noqa: E402
from cutegen.runtime import quant_reference as ref  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402
from quant_checks import assert_same_bytes, data  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
LAYOUTS = ("k-major", "mn-major-tma-aligned")
# M = 1, ragged M, K of one group past whole tiles, K of a single group, a large weight.
SHAPES = [(1, 32), (1, 512), (37, 640 + 32), (6, 1536 + 64), (129, 7168 + 32), (4096, 7168)]


@pytest.fixture(scope="session")
def qops(ops, device_info):
    from cutegen.runtime import quant_ops

    if not ops.catalogue().compatible(quant_ops.OP_PER_TOKEN_FP4, device_info.capability):
        pytest.skip(f"no {quant_ops.OP_PER_TOKEN_FP4} kernel in {ops.catalogue().build_dir} runs on {device_info.arch}")
    return quant_ops


def poisoned_outputs(m: int, k: int, layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scales in `layout`, the scales' whole buffer), every byte 0xFF."""
    q = torch.full((m, k // 2), 0xFF, dtype=torch.uint8, device="cuda")
    cols = ref.ceil_div(ref.ceil_div(k, 32), 4)
    if layout == "mn-major-tma-aligned":
        ma = ref.align(m, 4)
        buf = torch.full((cols * ma,), -1, dtype=torch.int32, device="cuda")
        return q, buf.as_strided((m, cols), (1, ma)), buf
    buf = torch.full((m, cols), -1, dtype=torch.int32, device="cuda")
    return q, buf, buf


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES.values()))
def test_per_token_fp4_bit_exact(qops, dtype, layout):
    """Every built kernel in place (poisoned outputs), then the allocating form."""
    kernels = qops.quant_kernels(qops.OP_PER_TOKEN_FP4, DTYPES[dtype], "ue8m0")
    assert kernels
    for i, (m, k) in enumerate(SHAPES):
        if dtype != torch.bfloat16 and m * k > 1 << 22:
            continue  # the large shape once (bf16) keeps the tier fast
        x = data(m, k, seed=20 + i, dtype=dtype)
        want_q, want_s = mx.quant_fp4_ref(x, scale_layout=layout)
        for kernel in kernels:
            q, s, buf = poisoned_outputs(m, k, layout)
            got_q, got_s = qops.per_token_quant_fp4(x, scale_layout=layout, out=q, out_scales=s, kernel=kernel)
            assert got_q is q and got_s is s
            what = f"{dtype} {layout} {m}x{k} {kernel}"
            assert_same_bytes(q, want_q, what + " q")
            assert_same_bytes(s, want_s, what + " scales")
            if layout == "mn-major-tma-aligned":  # the padding rows are written with 0
                assert torch.all(buf.view(s.shape[1], ref.align(m, 4))[:, m:] == 0), what + " padding rows"
        q2, s2 = qops.per_token_quant_fp4(x, scale_layout=layout)
        assert_same_bytes(q2, want_q, f"{dtype} {layout} {m}x{k} q (new)")
        assert_same_bytes(s2, want_s, f"{dtype} {layout} {m}x{k} scales (new)")
        assert s2.stride() == want_s.stride() or m == 1 or s2.shape[1] == 1, (s2.stride(), want_s.stride())


def test_per_token_fp4_midpoints_saturation_and_specials(qops):
    """Every E2M1 rounding midpoint (ties to the even code), values just beside them, the
    largest code, negative zero, fp32 denormals and a group whose amax sets a scale of 1."""
    x = torch.zeros(8, 256, device="cuda", dtype=torch.float32)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device="cuda")
    # Row 0: each group holds 6.0 (scale 1) and the midpoints, both signs, and their neighbours.
    x[0, :32] = 6.0
    x[0, 1:8] = mids
    x[0, 8:15] = -mids
    x[0, 15:22] = torch.nextafter(mids, torch.full_like(mids, 10.0))
    x[0, 22:29] = torch.nextafter(mids, torch.zeros_like(mids))
    x[0, 29] = -0.0
    x[0, 30] = 1e-45
    x[1, 32:64] = -6.0 * 2.0**-20  # a tiny power-of-two scale
    x[2, :] = 3.0e38  # near fp32's largest: the scale is 2^126
    x[3, 5] = 1e-30  # below eps: the scale is eps / 6 rounded up
    x[4, 0:32] = torch.linspace(-7.0, 7.0, 32)  # amax 7 > 6: scale 2, saturation after scaling
    want_q, want_s = mx.quant_fp4_ref(x)
    got_q, got_s = qops.per_token_quant_fp4(x)
    assert_same_bytes(got_q, want_q, "q")
    assert_same_bytes(got_s, want_s, "scales")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_per_token_fp4_nonfinite_policy(qops, bad):
    """A group holding NaN or Inf: UE8M0 scale byte 0xFF and every code 7; its neighbours intact."""
    x = data(64, 1024, seed=3)
    x[5, 300] = bad
    x[63, 1023] = bad
    want_q, want_s = mx.quant_fp4_ref(x)
    got_q, got_s = qops.per_token_quant_fp4(x)
    assert_same_bytes(got_q, want_q, "q")
    assert_same_bytes(got_s, want_s, "scales")
    assert torch.all(got_q[5, 144:160] == 0x77)  # group 9 (columns 288-319): bytes 144-159
    assert int(got_s[5, 2].item()) & 0xFF00 == 0xFF00  # group 9 is byte 1 of word 2


def test_per_token_fp4_eps(qops):
    x = data(256, 2048, seed=4)
    x[7] = 0.0  # a zero row: the scale comes from eps alone
    for eps in (1e-4, 1e-30, 3.0):
        want_q, want_s = mx.quant_fp4_ref(x, eps=eps)
        got_q, got_s = qops.per_token_quant_fp4(x, eps=eps)
        assert_same_bytes(got_q, want_q, f"eps={eps} q")
        assert_same_bytes(got_s, want_s, f"eps={eps} scales")


def test_per_token_fp4_round_trip(qops):
    """Dequantised values within half an E2M1 step of the scaled input (|x / s| <= 6)."""
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16)
    q, s = qops.per_token_quant_fp4(x)
    back = mx.dequant_fp4(q, s)
    scale = mx.unpack_ue8m0(s, 4096 // 32).repeat_interleave(32, dim=1)
    err = ((back - x.float()) / scale).abs()
    assert float(err.max()) <= 1.0  # the widest gap between E2M1 values (4 to 6) is 2


def test_per_token_fp4_strided_input_and_cuda_graph(qops):
    """A row-strided view quantises like its copy; a captured call replays on new data."""
    big = data(96, 1024 + 64, seed=5)
    x = big[:, :1024]
    want_q, want_s = mx.quant_fp4_ref(x.contiguous(), scale_layout="mn-major-tma-aligned")
    q, s, _ = poisoned_outputs(96, 1024, "mn-major-tma-aligned")
    qops.per_token_quant_fp4(x, scale_layout="mn-major-tma-aligned", out=q, out_scales=s)
    assert_same_bytes(q, want_q, "strided q")
    assert_same_bytes(s, want_s, "strided scales")
    src = data(96, 1024, seed=6)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        qops.per_token_quant_fp4(src, scale_layout="mn-major-tma-aligned", out=q, out_scales=s)  # warm
        with torch.cuda.graph(graph, stream=stream):
            qops.per_token_quant_fp4(src, scale_layout="mn-major-tma-aligned", out=q, out_scales=s)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (7, 8):
        src.copy_(data(96, 1024, seed=seed))
        q.fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_s = mx.quant_fp4_ref(src, scale_layout="mn-major-tma-aligned")
        assert_same_bytes(q, want_q, f"replay {seed} q")
        assert_same_bytes(s, want_s, f"replay {seed} scales")


def test_per_token_fp4_bad_inputs_name_the_argument(qops):
    x = data(64, 640, seed=1)
    q = torch.empty(64, 320, dtype=torch.uint8, device="cuda")
    s = torch.empty(64, 5, dtype=torch.int32, device="cuda")
    cases = [
        (lambda: qops.per_token_quant_fp4(x.cpu()), "argument 'x' must be a CUDA tensor"),
        (lambda: qops.per_token_quant_fp4(x.to(torch.float8_e4m3fn)), "argument 'x' must be torch.bfloat16"),
        (lambda: qops.per_token_quant_fp4(x[:, :624]), "argument 'x' must have K a multiple of 32"),
        (lambda: qops.per_token_quant_fp4(x, group=128), "argument 'group' must be 32"),
        (lambda: qops.per_token_quant_fp4(x, scale_layout="blocked"), "argument 'scale_layout'"),
        (lambda: qops.per_token_quant_fp4(x, eps=0.0), "argument 'eps'"),
        (lambda: qops.per_token_quant_fp4(x, out=q), "argument 'out_scales' must be given together"),
        (lambda: qops.per_token_quant_fp4(x, out=q.view(torch.int8), out_scales=s), "argument 'out' must be torch.uint8"),
        (lambda: qops.per_token_quant_fp4(x, out=q[:, :300], out_scales=s), "argument 'out' must have shape"),
        (lambda: qops.per_token_quant_fp4(x, out=q, out_scales=s[:, :4]), "argument 'out_scales' must have shape"),
        (lambda: qops.per_token_quant_fp4(x, out=q, out_scales=s.float()), "argument 'out_scales' must be torch.int32"),
        (lambda: qops.per_token_quant_fp4(x, kernel="no_such_kernel"), "argument 'kernel' must name a kernel"),
    ]
    for call, match in cases:
        with pytest.raises(InputError, match=match):
            call()
    fp8 = qops.choose_quant_kernel(qops.OP_PER_TOKEN, "bf16", "ue8m0", 0)
    with pytest.raises(InputError, match="per_token_quant_fp8 kernel"):
        qops.per_token_quant_fp4(x, kernel=fp8)


def test_per_token_fp4_degenerate_extents_and_opcheck(qops):
    q, s = qops.per_token_quant_fp4(torch.empty(0, 64, dtype=torch.bfloat16, device="cuda"))
    assert q.shape == (0, 32) and s.shape == (0, 1)
    x = data(16, 256, seed=2)
    torch.library.opcheck(torch.ops.cutegen.per_token_quant_fp4.default, (x, 32, "mn-major-tma-aligned", 1e-4, ""))
