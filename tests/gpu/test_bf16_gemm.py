"""GPU tests of ``cutegen.runtime.ops.bf16_gemm_nt`` against an fp32 reference.

Run on a Hopper GPU with a built catalogue (``CUTEGEN_BUILD_DIR``); see conftest.py.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime.errors import ArchMismatchError, InputError  # noqa: E402
from cutegen.runtime.manifest import adds_into_d  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(m, n, k) for m in (1, 127, 4096) for n in (128, 200, 4096) for k in (64, 7168)]


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.float() @ b.float().T


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    assert out.dtype == torch.bfloat16
    assert tuple(out.shape) == tuple(ref.shape), what
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (unwritten elements?)"
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * scale + 1e-6), (
        f"{what}: max abs error {float((out.float() - ref).abs().max())} (ref max {scale})"
    )
    assert calc_diff(out.float(), ref) < 1e-4, what


def inputs(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.float32, generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float32, generator=g).to(torch.bfloat16)
    return a, b


def poisoned(m: int, n: int, row_stride: int | None = None) -> torch.Tensor:
    stride = row_stride or n
    storage = torch.full((m, stride), float("nan"), device="cuda", dtype=torch.bfloat16)
    return storage[:, :n]


# ------------------------------------------------------------------------------------------------
# Correctness


@pytest.mark.parametrize("m, n, k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_matches_reference(ops, gemm_kernels, m, n, k):
    a, b = inputs(m, n, k)
    out = poisoned(m, n)
    result = ops.bf16_gemm_nt(a, b, out=out)
    assert result is out
    chosen = ops.choose_kernel(ops.OP_BF16_GEMM_NT, m, n, k, d_dtype="bf16", adds=False, layout="nt")
    assert_matches(out, reference(a, b), f"{m}x{n}x{k} via {chosen}")


@pytest.mark.parametrize("m, n, k", [(1000, 1000, 512), (4096, 4096, 256)], ids=["small-grid", "full-persistent-grid"])
def test_every_kernel_runs(ops, gemm_kernels, m, n, k):
    # The second shape has more tiles than the GPU has clusters: every kernel runs its persistent loop.
    a, b = inputs(m, n, k, seed=1)
    ref = reference(a, b)
    for name in gemm_kernels:
        out = poisoned(m, n)
        ops.bf16_gemm_nt(a, b, out=out, kernel=name)
        assert_matches(out, ref, name)
        fresh = ops.bf16_gemm_nt(a, b, kernel=name)
        assert_matches(fresh, ref, f"{name} (new output)")


def check_tiles_at_m(ops, gemm_kernels, tile: str, m: int, n: int, k: int, seed: int) -> None:
    """Every kernel whose name has `tile` (e.g. "_64x") against the reference at M = m."""
    a, b = inputs(m, n, k, seed=seed)
    ref = reference(a, b)
    names = [x for x in gemm_kernels if tile in x]
    assert names, f"the catalogue has no bf16 kernel with {tile!r} in its name"
    for name in names:
        out = poisoned(m, n)
        ops.bf16_gemm_nt(a, b, out=out, kernel=name)
        assert_matches(out, ref, f"{name} at M={m}")


@pytest.mark.parametrize("m", [1, 16, 17, 40, 63, 65, 100, 191])
def test_64_row_kernels_at_ragged_small_m(ops, gemm_kernels, m):
    """Every 64-row kernel where the last (or only) tile ends inside its rows."""
    check_tiles_at_m(ops, gemm_kernels, "_64x", m, 200, 448, seed=5)


@pytest.mark.parametrize("m", [1, 100, 191, 193, 333, 385])
def test_192_row_kernels_at_ragged_m(ops, gemm_kernels, m):
    """Every 192-row kernel (three math warpgroups) where the last tile ends inside its rows, with
    N a multiple of none of the tile widths and K of no stage count."""
    check_tiles_at_m(ops, gemm_kernels, "_192x", m, 1000, 704, seed=7)


@pytest.mark.parametrize("m", [1, 15, 17, 100, 333, 513])
def test_swapped_role_kernels_at_ragged_m(ops, gemm_kernels, m):
    """Every kernel whose MMA takes B's rows as its M side (D written transposed through a
    column-major view) where M ends inside a tile's columns and N inside its rows."""
    check_tiles_at_m(ops, gemm_kernels, "_swapab", m, 1000, 704, seed=9)


def test_kernels_of_other_architectures_are_refused(ops, device_info, gemm_kernels, tmp_path):
    """A catalogue entry built for another architecture is refused with a clear message."""
    import hashlib
    import json
    import shutil

    from cutegen.runtime.catalogue import load_catalogue

    src = ops.catalogue().build_dir
    name = gemm_kernels[0]
    shutil.copytree(src / name, tmp_path / name)
    manifest = json.loads((tmp_path / name / "manifest.json").read_text())
    manifest["arch"] = "sm_100a"  # as an sm_100a build of the same kernel would say
    text = json.dumps(manifest)
    (tmp_path / name / "manifest.json").write_text(text)
    catalogue = json.loads((src / "catalogue.json").read_text())
    # the catalogue of that build records its manifest's digest
    digest = hashlib.sha256(text.encode()).hexdigest()
    catalogue["kernels"] = [dict(k, arch="sm_100a", manifest_sha256=digest)
                            for k in catalogue["kernels"] if k["name"] == name]
    (tmp_path / "catalogue.json").write_text(json.dumps(catalogue))
    cat = load_catalogue(tmp_path)
    assert cat.compatible(ops.OP_BF16_GEMM_NT, device_info.capability) == []
    with pytest.raises(ArchMismatchError, match="sm_100a"):
        cat.load(name, 0)


def test_new_output_with_ragged_n_and_strided_out(ops, gemm_kernels):
    m, n, k = 300, 201, 520
    a, b = inputs(m, n, k, seed=2)
    ref = reference(a, b)
    d = ops.bf16_gemm_nt(a, b)
    assert d.stride() == (208, 1)
    assert_matches(d, ref, "new output, N=201")
    out = poisoned(m, n, row_stride=256)
    ops.bf16_gemm_nt(a, b, out=out)
    assert_matches(out, ref, "out with row stride 256")
    # Inputs that are views with aligned row strides and offsets.
    big_a = torch.randn(m, k + 16, device="cuda").to(torch.bfloat16)
    big_b = torch.randn(n, k + 8, device="cuda").to(torch.bfloat16)
    va, vb = big_a[:, 8 : 8 + k], big_b[:, :k]
    assert_matches(ops.bf16_gemm_nt(va, vb), reference(va, vb), "strided views")


def test_degenerate_extents(ops, gemm_kernels):
    a, b = inputs(5, 16, 0)
    out = poisoned(5, 16)
    ops.bf16_gemm_nt(a, b, out=out)
    assert torch.equal(out.float(), torch.zeros(5, 16, device="cuda"))
    a, b = inputs(0, 16, 64)
    assert tuple(ops.bf16_gemm_nt(a, b).shape) == (0, 16)
    a, b = inputs(4, 0, 64)
    assert tuple(ops.bf16_gemm_nt(a, b).shape) == (4, 0)


def test_side_stream(ops, gemm_kernels):
    a, b = inputs(256, 512, 256, seed=3)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = ops.bf16_gemm_nt(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    assert_matches(out, reference(a, b), "side stream")


# ------------------------------------------------------------------------------------------------
# Input validation


def test_bad_inputs_name_the_argument(ops, gemm_kernels):
    a, b = inputs(64, 128, 64)
    cases = [
        ((a, b.half()), "argument 'b' must be torch.bfloat16, got torch.float16"),
        ((a.float(), b), "argument 'a' must be torch.bfloat16, got torch.float32"),
        ((a[None], b), "argument 'a' must be 2-D"),
        ((a.cpu(), b), "argument 'a' must be a CUDA tensor, got device cpu"),
        ((a, b.cpu()), "argument 'b' must be a CUDA tensor"),
        ((a, b[:, :56]), "argument 'b' must have K = a.shape\\[1\\] = 64"),
        # Neither K-major nor MN-major (an MN-major view is DeepGEMM's tt form, taken).
        ((torch.empty_strided((64, 64), (128, 2), device="cuda", dtype=torch.bfloat16), b),
         "argument 'a' must be contiguous along its last dimension"),
        ((a, torch.empty(128, 100, device="cuda", dtype=torch.bfloat16)[:, :64]),
         "argument 'b' must have a row stride that is a multiple of 8"),
        # K = 519 with row stride 520: strides are fine, the base address is off by 2 bytes.
        ((torch.empty(64, 520, device="cuda", dtype=torch.bfloat16)[:, 1:],
          torch.empty(128, 520, device="cuda", dtype=torch.bfloat16)[:, :519]),
         "argument 'a' must start at a 16-byte aligned address"),
    ]
    for args, match in cases:
        with pytest.raises(InputError, match=match):
            ops.bf16_gemm_nt(*args)
    with pytest.raises(InputError, match="argument 'out' must have shape"):
        ops.bf16_gemm_nt(a, b, out=torch.empty(64, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(InputError, match="argument 'out' must be torch.bfloat16 or torch.float32"):
        ops.bf16_gemm_nt(a, b, out=torch.empty(64, 128, device="cuda", dtype=torch.float16))
    with pytest.raises(InputError, match="argument 'kernel' must name a kernel"):
        ops.bf16_gemm_nt(a, b, kernel="no_such_kernel")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_operands_on_different_devices_are_refused(ops, gemm_kernels):
    a, b = inputs(64, 128, 64)
    with pytest.raises(InputError, match="argument 'b' must be on cuda:0"):
        ops.bf16_gemm_nt(a, b.to("cuda:1"))


# ------------------------------------------------------------------------------------------------
# torch integration


def test_opcheck(ops, gemm_kernels):
    a, b = inputs(128, 256, 128, seed=4)
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt.default, (a, b, ""))
    out = torch.empty(128, 256, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt_out.default, (a, b, out, ""))


def test_torch_compile_fullgraph(ops, gemm_kernels):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(a, b, c):
        d = ops.bf16_gemm_nt(a, b)
        e = torch.empty_like(d)
        ops.bf16_gemm_nt(a, c, out=e)
        return d.float() * 2 + e.float()

    a, b = inputs(192, 256, 128, seed=5)
    c = torch.randn_like(b)
    expected = reference(a, b) * 2 + reference(a, c)
    got = f(a, b, c)
    assert torch.allclose(got, expected, rtol=3e-2, atol=3e-2 * float(expected.abs().max()))


def test_cuda_graph_capture_and_replay(ops, gemm_kernels):
    m, n, k = 384, 640, 256
    a, b = inputs(m, n, k, seed=6)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    # Warm up on a side stream (loads the kernel, prepares the launch) as torch recommends.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.bf16_gemm_nt(a, b, out=out)
        fresh = ops.bf16_gemm_nt(a, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.bf16_gemm_nt(a, b, out=out)
        fresh = ops.bf16_gemm_nt(a, b)
    new_a, new_b = inputs(m, n, k, seed=7)
    a.copy_(new_a)
    b.copy_(new_b)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(new_a, new_b)
    assert_matches(out, ref, "graph replay (out=)")
    assert_matches(fresh, ref, "graph replay (new output)")


# ------------------------------------------------------------------------------------------------
# fp32 D and D = C + A·Bᵀ (DeepGEMM's bf16_gemm_nt(a, b, d, c))

FP32_SHAPES = [(1, 256, 7168), (128, 129280, 7168), (4096, 4096, 512), (333, 1000, 1000)]


def kernels_of(ops, d_dtype: str, adds: bool) -> list[str]:
    names = ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype=d_dtype, adds=adds, layout="nt")
    if not names:
        pytest.skip(f"no bf16_gemm_nt kernel writing {d_dtype} D (adds={adds}) runs on this GPU")
    return names


def exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double().T


@pytest.mark.parametrize("m, n, k", FP32_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in FP32_SHAPES])
def test_fp32_output(ops, m, n, k):
    kernels_of(ops, "f32", False)
    a, b = inputs(m, n, k, seed=7)
    out = torch.full((m, n), float("nan"), device="cuda")
    assert ops.bf16_gemm_nt(a, b, out=out) is out
    assert calc_diff(out, exact(a, b)) < 1e-9
    # Within fp32 accumulation error of the float64 product, element by element.
    assert torch.allclose(out.double(), exact(a, b), rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("d_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("k", [64, 1000])
def test_every_fp32_and_accumulating_kernel_runs(ops, d_dtype, k):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[d_dtype]
    m, n = 1000, 776
    a, b = inputs(m, n, k, seed=8)
    c = torch.randn(m, n, device="cuda").to(dtype)
    ref = exact(a, b)
    stores = ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype=d_dtype, adds=False, layout="nt")
    for name in stores if d_dtype == "f32" else []:
        out = torch.full((m, n), float("nan"), device="cuda")
        ops.bf16_gemm_nt(a, b, out=out, kernel=name)
        assert calc_diff(out, ref) < 1e-9, name
    for name in kernels_of(ops, d_dtype, True):
        # Split kernels at three splits (K = 64: one), as their storing twins.
        splits = 3 if "_episkadd_" in name else None
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        ops.bf16_gemm_nt(a, b, out=out, c=c, kernel=name, k_splits=splits)
        # One addition per element in D's type: C + what the storing twin (same tile, cluster
        # and stages) writes, fp32(C + tile) or bf16(C + bf16(tile)).
        twin = storing_twin(ops, name)
        if twin is not None:
            tile = ops.bf16_gemm_nt(a, b, out=torch.empty(m, n, device="cuda", dtype=dtype), kernel=twin, k_splits=splits)
            assert torch.equal(out, (c.float() + tile.float()).to(dtype)), name
        assert calc_diff(out, c.double() + ref) < (1e-9 if dtype == torch.float32 else 1e-5), name


def storing_twin(ops, name: str) -> str | None:
    """The catalogue's storing kernel of an adding kernel's tile, cluster, D type and K split (any
    stage count: stages do not change the sums' order), None where it has none (fp32 D in the
    widths)."""
    storing = name.replace("_epiadd_", "_epitma_").replace("_episkadd_", "_episk_")
    pattern = re.compile(re.sub(r"_s[0-9]+_", "_s[0-9]+_", re.escape(storing)))
    found = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT) if pattern.fullmatch(x)]
    return found[0] if found else None


def test_accumulate_in_place_and_aliases(ops):
    kernels_of(ops, "f32", True)
    m, n, k = 512, 384, 768
    a, b = inputs(m, n, k, seed=9)
    d = torch.randn(m, n, device="cuda")
    start = d.clone()
    assert ops.bf16_gemm_nt(a, b, out=d, c=d) is d  # D += A·Bᵀ, no copy
    assert calc_diff(d, start.double() + exact(a, b)) < 1e-9
    fresh = ops.bf16_gemm_nt(a, b, c=start)  # a new D of C's type
    assert fresh.dtype == torch.float32 and torch.equal(fresh, d)
    torch.ops.cutegen.bf16_gemm_nt_accumulate(a, b, fresh, "")
    assert calc_diff(fresh, start.double() + 2 * exact(a, b)) < 1e-9
    # K = 0: D = C, nothing launched.
    empty = torch.full((m, n), float("nan"), device="cuda")
    ops.bf16_gemm_nt(a[:, :0], b[:, :0], out=empty, c=start)
    assert torch.equal(empty, start)


def test_fp32_and_accumulate_refusals(ops):
    kernels_of(ops, "f32", True)
    a, b = inputs(128, 256, 128, seed=10)
    with pytest.raises(InputError, match="'c'"):
        ops.bf16_gemm_nt(a, b, out=torch.empty(128, 256, device="cuda"), c=torch.empty(128, 256, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(InputError, match="'c'"):
        ops.bf16_gemm_nt(a, b, c=torch.empty(128, 255, device="cuda"))
    with pytest.raises(InputError, match="'out'"):
        ops.bf16_gemm_nt(a, b, out=torch.empty(128, 256, device="cuda", dtype=torch.float16))
    with pytest.raises(InputError, match="'out'"):  # an fp32 row stride not a multiple of 16 bytes
        ops.bf16_gemm_nt(a, b, out=torch.empty(128, 258, device="cuda")[:, :256])
    with pytest.raises(InputError, match="'kernel'"):  # a storing kernel for an accumulation
        name = ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype="f32", adds=False, layout="nt")[0]
        ops.bf16_gemm_nt(a, b, out=torch.empty(128, 256, device="cuda"), c=torch.zeros(128, 256, device="cuda"), kernel=name)


def test_fp32_opcheck_and_graph(ops):
    kernels_of(ops, "f32", True)
    a, b = inputs(128, 256, 128, seed=11)
    out = torch.empty(128, 256, device="cuda")
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt_out.default, (a, b, out, ""))
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt_accumulate.default, (a, b, out, ""))
    d = torch.zeros(128, 256, device="cuda")
    ops.bf16_gemm_nt(a, b, out=d, c=d)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.bf16_gemm_nt(a, b, out=d, c=d)
    d.zero_()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(d, 3 * exact(a, b)) < 1e-9


# ------------------------------------------------------------------------------------------------
# MN-major operands (DeepGEMM's nn, tn and tt forms: transposed views read as they lie)

LAYOUTS = {"nn": (False, True), "tn": (True, True), "tt": (True, False)}


def mn_major_view(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] as a view of [K, rows] storage padded to 16 bytes (so that even one row is
    recognisably MN-major: its stride between K columns is not 1)."""
    rows, k = x.shape
    storage = torch.zeros(k, -(-rows // 8) * 8, device=x.device, dtype=x.dtype)
    storage[:, :rows] = x.t()
    return storage[:, :rows].t()


def operands_in(layout: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [M, K] and B [N, K] with the same values, MN-major where the layout says."""
    a_mn, b_mn = LAYOUTS[layout]
    return (mn_major_view(a) if a_mn else a), (mn_major_view(b) if b_mn else b)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("m, n, k", [(1000, 776, 640), (1, 256, 512), (4096, 4096, 256)])
def test_every_mn_major_kernel_runs(ops, layout, m, n, k):
    a, b = inputs(m, n, k, seed=12)
    x, y = operands_in(layout, a, b)
    ref = exact(a, b)
    names = [nm for nm in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, layout=layout)]
    if not names:
        pytest.skip(f"no bf16_gemm_nt kernel of layout {layout} runs on this GPU")
    for name in names:
        manifest = ops.catalogue().manifest(name)
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[manifest.schedule["c_dtype"]]
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        if adds_into_d(manifest.schedule):
            c = torch.randn(m, n, device="cuda").to(dtype)
            ops.bf16_gemm_nt(x, y, out=out, c=c, kernel=name)
            assert calc_diff(out, c.double() + ref) < 1e-9, name
        else:
            ops.bf16_gemm_nt(x, y, out=out, kernel=name)
            assert calc_diff(out, ref) < (1e-9 if dtype == torch.float32 else 1e-5), name
            # Beside the K-major kernel of the same tile (the same products, summed in the same order).
            twin = name.rsplit("_", 1)[0]
            if twin in ops.runnable_kernels(ops.OP_BF16_GEMM_NT):
                same = ops.bf16_gemm_nt(a, b, out=torch.empty_like(out), kernel=twin)
                print(f"{name}: {'bitwise equal to' if torch.equal(out, same) else 'differs from'} {twin}")
                assert calc_diff(out, same.double()) < 1e-9, name


def test_deep_gemm_transposed_names(ops):
    """DeepGEMM's bf16_gemm_nn / _tn / _tt take [K, N] / [K, M] storage; their results are the nt
    op's on the same values."""
    import cutegen.deep_gemm as deep_gemm

    if not ops.runnable_kernels(ops.OP_BF16_GEMM_NT, layout="tn"):
        pytest.skip("no MN-major bf16_gemm_nt kernel runs on this GPU")
    m, n, k = 512, 768, 1024
    a, b = inputs(m, n, k, seed=13)
    ref = ops.bf16_gemm_nt(a, b)
    for name, x, y in (("bf16_gemm_nn", a, b.t().contiguous()), ("bf16_gemm_tn", a.t().contiguous(), b.t().contiguous()),
                       ("bf16_gemm_tt", a.t().contiguous(), b)):
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        getattr(deep_gemm, name)(x, y, d)
        assert calc_diff(d, ref) < 1e-5, name
    # The weight gradient's call: fp32 D += A·Bᵀ with tokens first.
    d = torch.randn(m, n, device="cuda")
    start = d.clone()
    deep_gemm.bf16_gemm_tn(a.t().contiguous(), b.t().contiguous(), d, c=d)
    assert calc_diff(d, start.double() + exact(a, b)) < 1e-9


# ------------------------------------------------------------------------------------------------
# Split K (epilogue split_k_tma_store): small M

BF16_SPLIT_SHAPES = [(1, 256, 7168), (64, 2112, 7168), (128, 200, 1000), (333, 4096, 1664), (65, 576, 192)]


def split_kernels(ops, d_dtype: str) -> list[str]:
    names = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype=d_dtype, adds=False, layout="nt") if "_episk_" in x]
    if not names:
        pytest.skip(f"no split-K bf16_gemm_nt kernel writing {d_dtype} D runs on this GPU")
    return names


@pytest.mark.parametrize("m, n, k", BF16_SPLIT_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in BF16_SPLIT_SHAPES])
def test_split_k_kernels(ops, m, n, k):
    """Every split-K kernel, bf16 and fp32 D, with split counts from 1 to one per 128-wide K block
    (K = 1000 and 192 end inside a 64-wide K tile; uneven last splits; counts around the fixup's
    load batches): the partial sums are added in split order, so a second launch gives the same
    bits, and the per-tile counters are zero again afterwards."""
    from cutegen.runtime import split_k

    a, b = inputs(m, n, k, seed=21)
    ref64 = exact(a, b)
    k_blocks = -(-k // 128)
    for d_dtype, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        for name in split_kernels(ops, d_dtype):
            for splits in sorted({1, 2, 3, max(1, k_blocks // 2), k_blocks} | {s for s in (7, 8, 9, 16) if s <= k_blocks}):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                ops.bf16_gemm_nt(a, b, out=out, kernel=name, k_splits=splits)
                what = f"{name} k_splits={splits}"
                if dtype == torch.bfloat16:
                    assert_matches(out, ref64.float(), what)
                else:
                    assert calc_diff(out, ref64) < 1e-9, what
                    assert torch.allclose(out.double(), ref64, rtol=1e-4, atol=1e-4 * k ** 0.5), what
                again = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                ops.bf16_gemm_nt(a, b, out=again, kernel=name, k_splits=splits)
                assert torch.equal(out, again), f"{what}: two launches differ"
    torch.cuda.synchronize()
    for counters, _ in split_k._workspaces.values():
        assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"


# Split K adding into D (epilogue split_k_tma_store_add): small M with C

def split_adding_kernels(ops) -> list[str]:
    names = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, adds=True) if "_episkadd_" in x]
    if not names:
        pytest.skip("no split-K bf16_gemm_nt kernel adding into D runs on this GPU")
    return names


@pytest.mark.parametrize("m, n, k", BF16_SPLIT_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in BF16_SPLIT_SHAPES])
def test_split_k_adding_kernels(ops, m, n, k):
    """Every split-K kernel adding into D (bf16 and fp32 D, K-major and tokens-first operands) at
    split counts from 1 to one per 128-wide K block: D = C + A·Bᵀ within fp32 accumulation error of
    the float64 result (bf16 D: C plus the storing twin's bf16 tile, one bf16 addition), C added
    once whatever the count, the same bits from a second launch, and the counters zero after."""
    from cutegen.runtime import split_k

    a, b = inputs(m, n, k, seed=25)
    ref64 = exact(a, b)
    k_blocks = -(-k // 128)
    for name in split_adding_kernels(ops):
        manifest = ops.catalogue().manifest(name)
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[manifest.schedule["c_dtype"]]
        x, y = operands_in(manifest.schedule["layout"], a, b) if manifest.schedule["layout"] != "nt" else (a, b)
        c = torch.randn(m, n, device="cuda").to(dtype)
        twin = storing_twin(ops, name)
        for splits in sorted({1, 2, 3, max(1, k_blocks // 2), k_blocks} | {s for s in (7, 8, 9) if s <= k_blocks}):
            what = f"{name} k_splits={splits}"
            out = ops.bf16_gemm_nt(x, y, c=c, kernel=name, k_splits=splits)
            if dtype == torch.float32:
                assert calc_diff(out, c.double() + ref64) < 1e-9, what
                assert torch.allclose(out.double(), c.double() + ref64, rtol=1e-4, atol=1e-4 * k ** 0.5), what
            else:
                assert_matches(out, (c.double() + ref64).float(), what)
            if twin is not None:
                tile = ops.bf16_gemm_nt(x, y, out=torch.empty(m, n, device="cuda", dtype=dtype), kernel=twin, k_splits=splits)
                assert torch.equal(out, (c.float() + tile.float()).to(dtype)), what
            again = ops.bf16_gemm_nt(x, y, c=c, kernel=name, k_splits=splits)
            assert torch.equal(out, again), f"{what}: two launches differ"
    torch.cuda.synchronize()
    for counters, _ in split_k._workspaces.values():
        assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"


def test_split_k_adding_in_place_and_in_a_graph(ops):
    """D += A·Bᵀ in place through a split-K adding kernel, eagerly and replayed from a CUDA graph
    (its own workspace): each launch adds the product once."""
    names = [x for x in split_adding_kernels(ops) if "_f32_f32_" in x and x.endswith("_g8")]
    if not names:
        pytest.skip("no split-K bf16_gemm_nt kernel adding into an fp32 D runs on this GPU")
    m, n, k = 64, 576, 7168
    a, b = inputs(m, n, k, seed=26)
    ref = exact(a, b)
    d = torch.randn(m, n, device="cuda")
    start = d.clone()
    ops.bf16_gemm_nt(a, b, out=d, c=d, kernel=names[0], k_splits=8)
    assert calc_diff(d, start.double() + ref) < 1e-9
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.bf16_gemm_nt(a, b, out=d, c=d, kernel=names[0], k_splits=8)
    d.copy_(start)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(d, start.double() + 3 * ref) < 1e-9
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt_accumulate.default, (a, b, d, names[0], 8))


# Split K for the last wave only (epilogue split_k_last_wave_tma_store)

# (M, N, K); each run over several SM budgets, so that the tiles fill whole waves and part of one
# more (K = 1000 ends inside a 64-wide K tile) or stay below one wave (every tile split).
LAST_WAVE_SHAPES = [(300, 1000, 1000), (333, 4096, 1664), (129, 2112, 7168)]
LAST_WAVE_BUDGETS = (None, 10, 22, 38)


def last_wave_kernels(ops) -> list[str]:
    names = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype="bf16", adds=False, layout="nt")
             if "_episkw_" in x]
    if not names:
        pytest.skip("no last-wave split-K bf16_gemm_nt kernel runs on this GPU")
    return names


@pytest.mark.parametrize("m, n, k", LAST_WAVE_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in LAST_WAVE_SHAPES])
def test_split_k_last_wave_kernels(ops, m, n, k):
    """Every last-wave split-K kernel at split counts 1 to 16 and SM budgets that leave a partial
    last wave of a few tiles (or every tile in it): the result matches the float64 product, a
    second launch gives the same bits, and the counters are zero again afterwards."""
    from cutegen.runtime import sm_budget, split_k

    a, b = inputs(m, n, k, seed=23)
    ref64 = exact(a, b)
    try:
        for budget in LAST_WAVE_BUDGETS:
            sm_budget.set_num_sms(budget)
            for name in last_wave_kernels(ops):
                for splits in (1, 2, 4, 16):
                    out = poisoned(m, n)
                    ops.bf16_gemm_nt(a, b, out=out, kernel=name, k_splits=splits)
                    what = f"{name} k_splits={splits} SMs={budget}"
                    assert_matches(out, ref64.float(), what)
                    again = poisoned(m, n)
                    ops.bf16_gemm_nt(a, b, out=again, kernel=name, k_splits=splits)
                    assert torch.equal(out, again), f"{what}: two launches differ"
    finally:
        sm_budget.set_num_sms(None)
    torch.cuda.synchronize()
    for counters, _ in split_k._workspaces.values():
        assert int(counters.abs().sum()) == 0, "split-K counters not reset to zero"


def test_split_k_last_wave_in_a_graph(ops):
    """A captured last-wave split-K launch replays correctly with its own workspace, beside eager
    launches of the same kernel on the stream's."""
    name = last_wave_kernels(ops)[0]
    m, n, k = 333, 4096, 1664
    a, b = inputs(m, n, k, seed=24)
    ref = reference(a, b)
    static_out = poisoned(m, n)
    ops.bf16_gemm_nt(a, b, out=static_out, kernel=name, k_splits=8)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.bf16_gemm_nt(a, b, out=static_out, kernel=name, k_splits=8)
    for _ in range(3):
        static_out.fill_(float("nan"))
        graph.replay()
        eager = ops.bf16_gemm_nt(a, b, kernel=name, k_splits=8)
        torch.cuda.synchronize()
        assert_matches(static_out, ref, f"{name} replayed")
        assert_matches(eager, ref, f"{name} beside the replay")


def test_split_k_graph_and_refusals(ops):
    names = split_kernels(ops, "bf16")
    plain = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype="bf16", adds=False, layout="nt") if "_episk" not in x]
    m, n, k = 64, 576, 7168
    a, b = inputs(m, n, k, seed=22)
    ref = reference(a, b)
    static_out = poisoned(m, n)
    ops.bf16_gemm_nt(a, b, out=static_out, kernel=names[0], k_splits=8)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.bf16_gemm_nt(a, b, out=static_out, kernel=names[0], k_splits=8)
    for _ in range(3):
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(static_out, ref, f"{names[0]} replayed")
    with pytest.raises(InputError, match="'k_splits'.*does not split K"):
        ops.bf16_gemm_nt(a, b, kernel=plain[0], k_splits=2)
    with pytest.raises(InputError, match="'k_splits'.*positive int"):
        ops.bf16_gemm_nt(a, b, kernel=names[0], k_splits=0)
    adding = [x for x in ops.runnable_kernels(ops.OP_BF16_GEMM_NT, d_dtype="bf16", adds=True, layout="nt") if "_epiadd_" in x]
    with pytest.raises(InputError, match="'k_splits'.*does not split K"):
        ops.bf16_gemm_nt(a, b, c=torch.zeros(m, n, device="cuda", dtype=torch.bfloat16), kernel=adding[0], k_splits=4)
    torch.library.opcheck(torch.ops.cutegen.bf16_gemm_nt.default, (a, b, names[0], 4))
