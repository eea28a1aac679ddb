"""CPU tier: build the FP8 and FP4 quantize kernels with the CuTe DSL and check what the build writes:
manifest vs PTX, the instructions the numerics rely on, SASS without local memory, the C header,
and the ABI self-check (the DSL host launch bytes equal the runtime's packing)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")

import abi_probe as ap  # noqa: E402
from cutegen.gen.build import _compile, _make_manifest, build_schedules  # noqa: E402
from cutegen.gen.ptx import parse_ptx_entry  # noqa: E402
from cutegen.runtime.launch import compute_grid  # noqa: E402
from cutegen.runtime.manifest import KernelManifest  # noqa: E402
from cutegen.runtime.params import OperandInfo, bind_operands, pack_params  # noqa: E402
from cutegen.schedules.loader import default_schedules  # noqa: E402
from cutegen.schedules.naming import parse_name, procedural_name  # noqa: E402
from toolchain import assert_kernel_header_compiles  # noqa: E402

pytestmark = pytest.mark.slow

QUANT = [s for s in default_schedules() if s.op.is_quantize]
NAMES = sorted(procedural_name(s) for s in QUANT)
# One tile per batch: double-buffered in registers for 16-bit inputs, one buffer for fp32; tiles
# of 8 rows x 512 columns (MN-major scales) and 4 rows x 1024 columns (K-major scales).
PER_TOKEN = "cutegen_sm90a_ptquant_{dt}_e4m3_{sf}_8x512x128_s{st}_wg2"
PER_TOKEN_WIDE = PER_TOKEN.replace("_8x512x128_", "_4x1024x128_")
PER_TOKEN_STAGES = {"bf16": 1, "f16": 1, "f32": 1}
PER_BLOCK = "cutegen_sm90a_pbquant_{dt}_e4m3_sff32_128x128x128_s1_wg2"
GROUPED = "cutegen_sm90a_gtquant_bf16_e4m3_sff32_128x64x128_s2_wg2"
PER_TOKEN_FP4 = "cutegen_sm90a_ptquant4_{dt}_e2m1_sfue8m0_8x512x32_s1_wg2"
def sm100(name: str) -> str:
    """The same quantizer compiled for Blackwell (the Hopper templates, built for sm_100a)."""
    return name.replace("cutegen_sm90a_", "cutegen_sm100a_")


# Registers the occupancy design assumes: per-token 4 CTAs of 256 threads per SM, grouped 3
# (its .minnctapersm), per-block 2.
MAX_REGISTERS = {"ptquant": 64, "ptquant4": 64, "gtquant": 85, "pbquant": 128}
MIN_CTAS = {"ptquant": 4, "ptquant4": 4, "gtquant": 3, "pbquant": 2}


def test_default_quant_schedules():
    assert len(NAMES) == 16 + 9 + 6
    for dt in ("bf16", "f16", "f32"):
        for sf in ("sff32", "sfue8m0"):
            assert PER_TOKEN.format(dt=dt, sf=sf, st=PER_TOKEN_STAGES[dt]) in NAMES
            assert PER_TOKEN_WIDE.format(dt=dt, sf=sf, st=PER_TOKEN_STAGES[dt]) in NAMES
            assert sm100(PER_TOKEN).format(dt=dt, sf=sf, st=1) in NAMES
        assert PER_BLOCK.format(dt=dt) in NAMES
        assert sm100(PER_BLOCK).format(dt=dt) in NAMES
        assert PER_TOKEN_FP4.format(dt=dt) in NAMES and sm100(PER_TOKEN_FP4).format(dt=dt) in NAMES
    assert GROUPED in NAMES


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("qbuild")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(root / "cache"))
    report = build_schedules(QUANT, root / "out", jobs=2, progress=False)
    yield {"out": root / "out", "report": report}
    mp.undo()


def test_every_quant_kernel_builds(built):
    assert built["report"].ok, built["report"].summary()
    assert sorted(r.name for r in built["report"].results) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_manifest_matches_ptx_and_schedule(built, name):
    d = built["out"] / name
    m = KernelManifest.from_json((d / "manifest.json").read_text())
    ptx = (d / "kernel.ptx").read_text()
    entry = parse_ptx_entry(ptx)
    s = parse_name(name)
    assert entry.name == m.entry
    assert tuple(entry.reqntid) == tuple(m.block) == (s.threads_per_cta, 1, 1)
    assert [(p.offset, p.size, p.align) for p in entry.params] == [(p.offset, p.size, p.align) for p in m.params]
    kinds = [p.binding["kind"] for p in m.params]
    # the grouped kernel's tile counter is a bare pointer; everything else a tensor
    assert kinds[-1] == "scalar" and set(kinds[:-1]) == ({"tensor", "pointer"} if "_gtquant_" in name else {"tensor"})
    assert m.grid.kind == "blocks" and m.cluster == (1, 1, 1)
    assert m.smem_bytes == s.smem_bytes  # the spec's formula is the template's allocation
    assert m.op == s.op.value


@pytest.mark.parametrize("name", NAMES)
def test_ptx_uses_the_specified_numerics(built, name):
    ptx = (built["out"] / name / "kernel.ptx").read_text()
    if "_ptquant4_" in name:
        # E2M1 codes by fp32 arithmetic (no FP4 conversion instruction, so that any GPU runs them),
        # packed two per byte: a lane's piece of 8 (16-bit inputs) or 4 (fp32) codes is one store.
        assert "cvt.rn.satfinite.e4m3x2" not in ptx and "e2m1x2" not in ptx
        assert re.search(r"st\.global[.\w]*\.(b32|u32)\b" if "_f32_" not in name else r"st\.global[.\w]*\.(b16|u16|v2\.b8)\s", ptx)
    else:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # RNE, saturating to +-448
    assert "div.rn.f32" in ptx and "rcp.rn.f32" in ptx  # IEEE s = max(amax, eps)/448 (FP4: /6) and 1/s
    for approx in ("div.approx", "div.full", "rcp.approx", ".ftz"):
        assert approx not in ptx, approx
    # 128-bit loads: four 32-bit words, or (as NVVM writes some for sm_100a) two 64-bit ones.
    assert re.search(r"ld\.global[.\w]*\.(v4\.[bfus]32|v2\.[bfus]64)\b", ptx)
    if "_gtquant_" in name:
        assert "st.global.v4" in ptx  # 128-bit stores of q
    if "_ptquant_" in name and "_ptquant_f32_" not in name:
        # A lane's 8 q bytes per 16-byte input piece: two words, or one 64-bit word (sm_100a).
        assert re.search(r"st\.global[.\w]*\.(v2\.b32|b64)\b", ptx)


@pytest.mark.parametrize("name", NAMES)
def test_sass_has_no_local_memory(built, name):
    summary = json.loads((built["out"] / name / "sass_summary.json").read_text())
    assert summary["local_loads"] == 0 and summary["local_stores"] == 0, summary
    assert summary["stack_bytes"] == 0
    assert not any(summary["mma"].values())
    tag = name.split("_")[2]
    assert summary["registers"] <= MAX_REGISTERS[tag], summary["registers"]


@pytest.mark.parametrize("name", NAMES)
def test_kernels_are_compiled_for_their_occupancy(built, name):
    entry = parse_ptx_entry((built["out"] / name / "kernel.ptx").read_text())
    assert entry.minnctapersm == MIN_CTAS[name.split("_")[2]]


@pytest.mark.parametrize("name", [PER_TOKEN.format(dt="bf16", sf="sfue8m0", st=1), PER_BLOCK.format(dt="f32"), GROUPED])
def test_header_compiles(built, name, tmp_path):
    assert_kernel_header_compiles(built["out"], name, tmp_path)


# ------------------------------------------------------------------------------------------------
# ABI self-check: what the DSL's own host code would launch equals what the runtime packs.


def _probe(name: str, operands: dict[str, OperandInfo], extents: dict, mac: int, tmp_path: Path):
    if ap.find_runtime_static_lib() is None or shutil.which("gcc") is None:
        pytest.fail("the ABI self-check needs gcc and the DSL's static runtime library")
    schedule = parse_name(name)
    art = _compile(schedule, tmp_path / "compile")
    manifest = _make_manifest(schedule, art, None)
    fakes = art["fake_arguments"]
    args = [
        ap.CPointer(o.ptr) if key == "tile_counter" else ap.ctensor_from_fake(f, o.ptr, o.shape, o.strides)
        for f, (key, o) in zip(fakes, operands.items())
    ]
    args += [ap.CScalar(extents["eps"]), ap.CScalar(mac), ap.CStream(0x5000)]
    captured = ap.capture_launch(art["compiled"], args, tmp_path / "probe")
    _, env = bind_operands(manifest, operands, extents)
    grid, _ = compute_grid(manifest, env, mac)
    assert captured.grid == grid
    assert captured.block == tuple(manifest.block)
    assert captured.smem_bytes == manifest.smem_bytes
    blob = pack_params(manifest, env, operands, {}).tobytes()
    ours = [blob[p.offset : p.offset + p.size] for p in manifest.params]
    assert captured.mismatches(ours) == []
    return captured, manifest


@pytest.fixture()
def compile_dir(tmp_path):
    (tmp_path / "compile").mkdir()
    return tmp_path


PER_TOKEN_CASES = [
    # (dtype, scale tag, M, K, row padding, scale layout, max active clusters, tile)
    ("bf16", "sff32", 37, 640, 16, "k-major", 500, PER_TOKEN),
    ("bf16", "sff32", 37, 640, 16, "k-major", 500, PER_TOKEN_WIDE),
    ("bf16", "sff32", 37, 640, 0, "mn-major", 7, PER_TOKEN),
    ("f32", "sfue8m0", 1, 128, 4, "mn-major", 3, PER_TOKEN),
    ("f16", "sfue8m0", 4096, 7168, 0, "k-major", 528, PER_TOKEN_WIDE),
    # Blackwell: the activations the block-scaled kernels take (packed UE8M0, MN-major).
    ("bf16", "sfue8m0", 1000, 7168, 0, "mn-major", 592, sm100(PER_TOKEN)),
    ("f32", "sff32", 37, 640, 16, "k-major", 500, sm100(PER_TOKEN)),
]


@pytest.mark.parametrize("case", PER_TOKEN_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}x{c[3]}-{c[5]}-{c[7].split('_')[8]}")
def test_abi_per_token(case, compile_dir):
    dt, sf, m, k, pad, layout, mac, tile = case
    g = -(-k // 128)
    cols = g if sf == "sff32" else -(-g // 4)
    ma = -(-m // 4) * 4
    sf_shape, sf_strides = ((ma, cols), (1, ma)) if layout == "mn-major" else ((m, cols), (cols, 1))
    operands = {
        "x": OperandInfo(0x7F0000000000, (m, k), (k + pad, 1), dt),
        "q": OperandInfo(0x7F1000000000, (m, k), (k + 16, 1), "e4m3"),
        "sf": OperandInfo(0x7F2000000000, sf_shape, sf_strides, "i32" if sf == "sfue8m0" else "f32"),
    }
    _probe(tile.format(dt=dt, sf=sf, st=PER_TOKEN_STAGES[dt]), operands, {"eps": 1e-4}, mac, compile_dir)


FP4_CASES = [
    # (dtype, M, K, row padding, scale layout, max active clusters, arch)
    ("bf16", 37, 640 + 32, 16, "k-major", 500, "sm_90a"),
    ("f32", 1, 32, 4, "mn-major", 3, "sm_90a"),
    ("bf16", 1000, 7168, 0, "mn-major", 592, "sm_100a"),
]


@pytest.mark.parametrize("case", FP4_CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}-{c[4]}-{c[6]}")
def test_abi_per_token_fp4(case, compile_dir):
    dt, m, k, pad, layout, mac, arch = case
    groups = -(-k // 32)
    cols = -(-groups // 4)
    ma = -(-m // 4) * 4
    sf_shape, sf_strides = ((ma, cols), (1, ma)) if layout == "mn-major" else ((m, cols), (cols, 1))
    operands = {
        "x": OperandInfo(0x7F0000000000, (m, k), (k + pad, 1), dt),
        "q": OperandInfo(0x7F1000000000, (m, k // 2), (k // 2 + 16, 1), "u8"),
        "sf": OperandInfo(0x7F2000000000, sf_shape, sf_strides, "i32"),
    }
    name = PER_TOKEN_FP4.format(dt=dt)
    _probe(name if arch == "sm_90a" else sm100(name), operands, {"eps": 1e-4}, mac, compile_dir)


def test_abi_per_block(compile_dir):
    operands = {
        "w": OperandInfo(0x7F0000000000, (300, 272), (288, 1), "bf16"),
        "q": OperandInfo(0x7F1000000000, (300, 272), (272, 1), "e4m3"),
        "sf": OperandInfo(0x7F2000000000, (3, 3), (3, 1), "f32"),
    }
    _probe(PER_BLOCK.format(dt="bf16"), operands, {"eps": 0.25}, 264, compile_dir)


def test_abi_per_block_sm100(compile_dir):
    operands = {
        "w": OperandInfo(0x7F0000000000, (300, 272), (288, 1), "bf16"),
        "q": OperandInfo(0x7F1000000000, (300, 272), (272, 1), "e4m3"),
        "sf": OperandInfo(0x7F2000000000, (3, 3), (3, 1), "f32"),
    }
    _probe(sm100(PER_BLOCK).format(dt="bf16"), operands, {"eps": 0.25}, 296, compile_dir)


def test_abi_grouped(compile_dir):
    t, h, s = 1000, 200, 15
    operands = {
        "x": OperandInfo(0x7F0000000000, (t, h), (208, 1), "bf16"),
        "group_sizes": OperandInfo(0x7F0800000000, (8,), (1,), "i32"),
        "q": OperandInfo(0x7F1000000000, (128 * h * s,), (1,), "e4m3"),
        "sf": OperandInfo(0x7F2000000000, (s, h), (h, 1), "f32"),
        "tile_counter": OperandInfo(0x7F3000000000, (1,), (1,), "i32"),
    }
    captured, manifest = _probe(GROUPED, operands, {"eps": 1e-4}, 396, compile_dir)
    assert captured.grid == (min(s * -(-h // 64), 396), 1, 1)


# ------------------------------------------------------------------------------------------------
# The grouped kernel's shared-memory transpose, modelled in Python with the template's constants.


def test_grouped_transpose_mapping_is_conflict_free_and_complete():
    from cutegen.templates import hopper_quant as hq

    k = hq.GroupedTransposedQuantKernel(parse_name(GROUPED))
    words, rows, chunks = k.words, k.tile_t, k.chunks
    assert (words, rows, chunks, k.loads, k.threads) == (32, 128, 8, 4, 256)
    written = {}
    # store: thread t writes 16 bytes of token row t//8 + 32*i at chunk slot c ^ ((row >> 4) & 7)
    for i in range(k.loads):
        for warp in range(k.threads // 32):
            for quarter in range(4):  # a 128-bit store is served per quarter warp
                banks = set()
                for lane in range(quarter * 8, quarter * 8 + 8):
                    tid = warp * 32 + lane
                    c = tid % chunks
                    row = tid // chunks + i * k.rows_per_load
                    slot = c ^ ((row >> 4) & 7)
                    for w in range(4):
                        word = slot * 4 + w
                        assert (row, word) not in written
                        written[(row, word)] = (row, c * 4 + w)  # logical (token, bf16 pair)
                        banks.add(word % 32)
                assert len(banks) == 32  # the quarter warp writes one whole 128-byte row
    assert len(written) == rows * words
    # read: lane l of warp w reads word (4w + l%4) ^ (4 * (l//4)) of token rows 16*(l//4) + i
    seen = set()
    for warp in range(k.threads // 32):
        for i in range(k.seg_tokens):
            banks = set()
            for lane in range(32):
                pair = warp * 4 + lane % 4
                seg = lane // 4
                row = seg * k.seg_tokens + i
                word = pair ^ (seg * 4)
                assert written[(row, word)] == (row, pair)  # the swizzle is undone
                seen.add((row, pair))
                banks.add(word % 32)
            assert len(banks) == 32  # conflict-free
    assert len(seen) == rows * words


@pytest.mark.parametrize("dynamic_per_cta", [None, 8])
def test_grouped_tile_walk_model(dynamic_per_cta):
    """The kernel's walk, with CTAs interleaved at random: tiles bidx and bidx + grid, then tiles
    claimed from the counter two ahead (2 * grid + old) when there are more than
    DYNAMIC_TILES_PER_CTA per CTA, else the static bidx + k * grid. Every tile is visited exactly once, each
    CTA's tiles (hence rows) only grow, a launch makes exactly tiles - grid claims, the claim
    that zeroes the counter is the last one, and each row's group is found by scanning the block
    starts forward from the previous tile's group: always the largest g with B_g <= r (skipping
    empty groups), in at most G scan steps over a CTA's whole walk."""
    import random

    from cutegen.templates import hopper_quant as hq

    per_cta = hq.DYNAMIC_TILES_PER_CTA if dynamic_per_cta is None else dynamic_per_cta
    rng = random.Random(3)
    for _ in range(300):
        sizes = [rng.choice([0, 0, 1, 127, 128, 129, 300, 5000]) for _ in range(rng.randint(1, 40))]
        starts = [0]
        for m in sizes:
            starts.append(starts[-1] + -(-m // 128))
        n, s_total = len(sizes), starts[-1]
        s_rows = s_total + rng.randint(0, 3)  # the caller's bound may exceed the real blocks
        h_tiles = rng.randint(1, 120)
        tiles = s_rows * h_tiles
        if tiles == 0:
            continue
        grid = min(tiles, rng.randint(1, 400))
        dynamic = tiles > per_cta * grid
        counter = {"value": 0, "claims": 0, "zeroed_after": None}

        def claim():
            old = counter["value"]
            counter["value"] += 1
            counter["claims"] += 1
            return 2 * grid + old

        # per CTA: [current tile, next tile, claim in flight, group, scans]
        ctas = {b: [b, b + grid, claim() if dynamic else b + 2 * grid, 0, 0] for b in range(grid)}
        visited = []
        while ctas:
            b = rng.choice(list(ctas))
            tile, tile_n, pending, g, scans = ctas[b]
            r = tile // h_tiles
            if r >= s_rows:
                del ctas[b]
                continue
            if r < s_total:  # _advance_group
                while starts[min(g + 1, n)] <= r:
                    g, scans = g + 1, scans + 1
                assert starts[g] <= r < starts[g + 1] and sizes[g] > 0
            assert scans <= n
            visited.append(tile)
            # thread 0 publishes the claim (the tile after next) and claims again
            published = pending
            if not dynamic:
                pending += grid
            elif pending < tiles:
                pending = claim()
            elif pending == tiles + grid - 1:
                counter["zeroed_after"] = counter["claims"]
                counter["value"] = 0
            assert tile_n > tile
            ctas[b] = [tile_n, published, pending, g, scans]
        assert sorted(visited) == list(range(tiles))
        if not dynamic:  # the static walk
            assert counter["claims"] == 0
        if dynamic:
            assert counter["claims"] == tiles - grid
            assert counter["zeroed_after"] == tiles - grid
        assert counter["value"] == 0


def test_quant_kernels_listed_and_chosen_on_a_hopper(built, monkeypatch):
    """The runtime lists a quantize op's kernels by input dtype and scale format, and chooses the
    per-token tile width by scale layout and otherwise the first by name (a simulated H200: no
    driver needed)."""
    pytest.importorskip("torch")
    from cutegen.runtime import driver, ops, quant_ops

    info = driver.DeviceInfo(ordinal=0, name="NVIDIA H200", capability=(9, 0), sm_count=132, smem_optin=232448)
    monkeypatch.setattr(driver, "device_info", lambda ordinal=0: info)
    monkeypatch.setattr(quant_ops, "_choices", {})
    ops.set_build_dir(built["out"])
    try:
        ue8m0 = PER_TOKEN.format(dt="bf16", sf="sfue8m0", st=1)
        ue8m0_wide = PER_TOKEN_WIDE.format(dt="bf16", sf="sfue8m0", st=1)
        assert quant_ops.quant_kernels("per_token_quant_fp8", "bf16", "ue8m0") == [ue8m0_wide, ue8m0]
        assert quant_ops.quant_kernels("grouped_transposed_quant_fp8", "bf16", "fp32") == [GROUPED]
        assert quant_ops.quant_kernels("per_block_quant_fp8", "f16", "fp32") == [PER_BLOCK.format(dt="f16")]
        for dt in ("bf16", "f16", "f32"):
            for sf, fmt in (("sff32", "fp32"), ("sfue8m0", "ue8m0")):
                choose = lambda layout: quant_ops.choose_quant_kernel("per_token_quant_fp8", dt, fmt, 0, layout)  # noqa: E731
                assert choose("k-major") == PER_TOKEN_WIDE.format(dt=dt, sf=sf, st=1)
                assert choose("mn-major-tma-aligned") == PER_TOKEN.format(dt=dt, sf=sf, st=1)
        # Without a layout: the first by name.
        assert quant_ops.choose_quant_kernel("per_token_quant_fp8", "f32", "fp32") == PER_TOKEN_WIDE.format(
            dt="f32", sf="sff32", st=1
        )
    finally:
        ops.set_build_dir(None)


def test_fp4_code_rule_is_the_reference_rounding():
    """The kernel's E2M1 rule (`_e2m1_code`: |y| scaled to its region's step, rounded by adding
    ROUND_MAGIC in fp32, read off the bits, capped), evaluated with its constants in fp32 numpy,
    gives `mx_reference.float_to_e2m1`'s code for 3 million random finite floats, every rounding
    boundary and its two neighbours; its largest value and poisoned code are the reference's."""
    import numpy as np

    torch = pytest.importorskip("torch")
    from cutegen.runtime import mx_reference as mx
    from cutegen.templates import hopper_quant as hq

    def kernel_rule(y: np.ndarray) -> np.ndarray:
        a = np.abs(y)
        scale = np.full_like(a, hq.E2M1_REGIONS[0][1])
        offset = np.full(a.shape, hq.E2M1_REGIONS[0][2], dtype=np.int32)
        for start, step_scale, step_offset in hq.E2M1_REGIONS[1:]:
            scale = np.where(a >= start, np.float32(step_scale), scale)
            offset = np.where(a >= start, step_offset, offset)
        rounded = ((a * scale).astype(np.float32) + np.float32(hq.ROUND_MAGIC)).view(np.int32) - hq.ROUND_MAGIC_BITS
        code = np.minimum(rounded + offset, hq.E2M1_MAX_CODE)
        return (code | np.where((y.view(np.int32) < 0) & (code != 0), hq.E2M1_SIGN, 0)).astype(np.uint8)

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2**32, 3_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bounds = np.array([m for m, _ in mx.E2M1_MIDPOINTS] + [0.0, 6.0, 7.0, 1e30, 3.4e38], dtype=np.float32)
    bounds = np.concatenate([bounds, -bounds])
    edges = np.concatenate([bounds, np.nextafter(bounds, np.float32(np.inf)), np.nextafter(bounds, np.float32(-np.inf))])
    y = np.concatenate([y[np.isfinite(y)], edges]).astype(np.float32)
    want = mx.float_to_e2m1(torch.from_numpy(y.copy())).numpy()
    assert np.array_equal(kernel_rule(y), want)
    assert np.float32(hq.ROUND_MAGIC).view(np.int32) == hq.ROUND_MAGIC_BITS
    assert hq.E2M1_MAX == mx.E2M1_MAX and hq.E2M1_NAN_CODE == hq.E2M1_MAX_CODE == mx.E2M1_MAX_CODE


def test_fp4_bf16_pair_rule_is_the_reference_rounding():
    """The kernel's rule for bf16 inputs, two elements a word (`_e2m1_codes_bf16x2` with its
    constants: integer lanes, the bf16 FMA rounding modelled by torch's bf16 rounding), gives
    `mx_reference.float_to_e2m1`'s code pair for every finite bf16 value in each lane (the
    multiply by the power-of-two 1/s is exact, so y itself is any bf16)."""
    import numpy as np

    torch = pytest.importorskip("torch")
    from cutegen.runtime import mx_reference as mx
    from cutegen.templates import hopper_quant as hq

    def lanes(op, a, b):
        return op(a & 0xFFFF, b & 0xFFFF) | (op(a >> 16, b >> 16) << 16)

    def fma_lanes(a, b_word, c_word):  # fma.rn.bf16x2: exact a·b + c, one rounding to bf16
        out = np.zeros_like(a)
        for shift in (0, 16):
            x, b, c = (((v >> shift) & 0xFFFF).astype(np.uint32) << 16 for v in (a, np.uint32(b_word), np.uint32(c_word)))
            exact = x.view(np.float32).astype(np.float64) * b.view(np.float32).astype(np.float64) + c.view(np.float32).astype(np.float64)
            rounded = torch.from_numpy(exact).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint32) & 0xFFFF
            out |= rounded << shift
        return out

    h = np.arange(1 << 16, dtype=np.uint32)
    h = h[np.isfinite((h << 16).view(np.float32))]
    lo, hi = h, h[::-1].copy()
    y = lo | (hi << 16)
    a = y & hq.BF16X2_ABS
    top = (a >> 6) & hq.BF16X2_MANTISSA_TOP
    rounded = ((a + hq.BF16X2_ROUND_ONE_BIT + top) >> 6) & hq.BF16X2_LANE_10_BITS
    at_least_one = lanes(np.minimum, lanes(np.maximum, rounded, hq.BF16X2_EXPONENT_OF_ONE) - hq.BF16X2_EXPONENT_OF_ONE,
                         hq.BF16X2_CODE_MAX)
    below_one = lanes(np.minimum, fma_lanes(a, hq.BF16X2_TWO, hq.BF16X2_ROUND_MAGIC) - hq.BF16X2_ROUND_MAGIC,
                      hq.BF16X2_CODE_BELOW_ONE_MAX)
    code = lanes(np.maximum, at_least_one, below_one)
    sign = (y.view(np.int32) >> hq.BF16X2_SIGN_TO_BIT_3).view(np.uint32) & hq.BF16X2_CODE_SIGN
    code = code | (sign & ((code + hq.BF16X2_CODE_MAX) & hq.BF16X2_CODE_SIGN))
    byte = (code | (code >> 12)) & 0xFF

    def reference(bits):
        return mx.float_to_e2m1(torch.from_numpy((bits << 16).view(np.float32).copy())).numpy().astype(np.uint32)

    assert np.array_equal(byte, reference(lo) | (reference(hi) << 4))
