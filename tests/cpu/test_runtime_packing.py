"""CPU tests of the runtime: parameter packing, TMA arguments, grid, heuristics, catalogue, errors.

Everything here runs without a GPU and without the CuTe DSL, on synthetic manifests.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cutegen.runtime import heuristics
from cutegen.runtime.catalogue import (
    KernelCatalogue,
    arch_compatible,
    check_arch,
    load_catalogue,
    required_capability,
)
from cutegen.runtime.errors import (
    ArchMismatchError,
    ArtifactError,
    CudaError,
    InputError,
    KernelLoadError,
)
from cutegen.runtime.launch import operand_info, persistent_grid
from cutegen.runtime.manifest import (
    Catalogue,
    CatalogueEntry,
    GridRule,
    KernelManifest,
    ManifestError,
    OperandSpec,
    Param,
    Requirement,
)
from cutegen.runtime.params import (
    Expr,
    OperandInfo,
    TmaArgs,
    aligned_zeros,
    bind_operands,
    check_manifest,
    check_requirements,
    evaluate,
    kernel_param_pointers,
    normalize_operand,
    pack_params,
    tma_args_from_binding,
)

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "src" / "cutegen" / "runtime"


# ------------------------------------------------------------------------------------------------
# Synthetic manifests


def tma(operand: str, box: list[int], modes=(1, 0), swizzle="128B") -> dict:
    return {
        "kind": "tma",
        "operand": operand,
        "modes": list(modes),
        "box": box,
        "swizzle": swizzle,
        "dtype": "bf16",
        "l2_promotion": "128B",
        "oob_fill": "none",
    }


def gemm_params() -> list[Param]:
    """A Hopper-GEMM-like parameter list exercising every binding kind."""
    return [
        Param(0, "tiled_mma", 0, 1, 1, {"kind": "zeros"}),
        Param(1, "tma_a", 64, 128, 64, tma("a", [64, 128])),
        Param(2, "coord_a", 192, 8, 4, {"kind": "shape", "values": ["M", "K"], "width": 32}),
        Param(3, "tma_b", 256, 128, 64, tma("b", [64, 256])),
        Param(4, "coord_b", 384, 8, 4, {"kind": "shape", "values": ["N", "K"], "width": 32}),
        Param(5, "tma_d", 448, 128, 64, tma("d", [32, 64], swizzle="64B")),
        Param(6, "coord_d", 576, 16, 8, {"kind": "shape", "values": ["M", "N"], "width": 64}),
        Param(7, "tiles_m", 592, 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "ceil_div(M, 128)"}),
        Param(8, "half_k", 596, 4, 4, {"kind": "scalar", "dtype": "f32", "expr": "K // 2"}),
        Param(9, "ptr_d", 600, 8, 8, {"kind": "pointer", "operand": "d"}),
        Param(10, "clusters", 608, 8, 8, {"kind": "scalar", "dtype": "i64", "expr": "max_active_clusters"}),
    ]


def make_manifest(
    name: str = "gemm_128x256_c2x1",
    tile_m: int = 128,
    tile_n: int = 256,
    cluster_m: int = 2,
    cluster_n: int = 1,
    multicast: str = "b",
    arch: str = "sm_90a",
    params: list[Param] | None = None,
    cubin: str = "kernel.cubin",
    sha256: str = "0" * 64,
) -> KernelManifest:
    return KernelManifest(
        name=name,
        op="bf16_gemm_nt",
        arch=arch,
        entry="kernel_cutlass_gemm_0",
        cubin=cubin,
        sha256=sha256,
        block=(384, 1, 1),
        cluster=(cluster_m, cluster_n, 1),
        smem_bytes=200_000,
        pdl=False,
        cooperative=False,
        grid=GridRule("persistent_clusters", tile_m, tile_n, cluster_m, cluster_n),
        operands=[
            OperandSpec("a", "bf16", ["M", "K"], 1, 16),
            OperandSpec("b", "bf16", ["N", "K"], 1, 16),
            OperandSpec("d", "bf16", ["M", "N"], 1, 16),
        ],
        params=gemm_params() if params is None else params,
        schedule={"tile_m": tile_m, "tile_n": tile_n, "multicast": multicast},
        toolchain={"cutlass_dsl": "4.8.1"},
        facts=bf16_facts(tile_m, tile_n, cluster_m, cluster_n, multicast, arch),
    )


def bf16_facts(tile_m: int, tile_n: int, cluster_m: int, cluster_n: int, multicast: str, arch: str) -> dict:
    """The derived facts a bf16 GEMM kernel of this tile and cluster records (`Schedule.facts`)."""
    from cutegen.schedules import parse_name

    mc = {"none": "0", "a": "a", "b": "b", "ab": "ab"}[multicast]
    name = (f"cutegen_{arch.replace('_', '')}_gemm_bf16_bf16_bf16_f32_nosf_{tile_m}x{tile_n}x64_c{cluster_m}x{cluster_n}"
            f"_mc{mc}_s4_wg2_r40x232_epitma_rm_g8")
    return parse_name(name).facts()


def operands(m: int = 1000, n: int = 2000, k: int = 512) -> dict[str, OperandInfo]:
    return {
        "a": OperandInfo(0x7F00_0000_0000, (m, k), (k, 1), "bf16"),
        "b": OperandInfo(0x7F10_0000_0000, (n, k), (k, 1), "bf16"),
        "d": OperandInfo(0x7F20_0000_0000, (m, n), (n, 1), "bf16"),
    }


# ------------------------------------------------------------------------------------------------
# Packing


def test_check_manifest_accepts_the_synthetic_layout():
    m = make_manifest()
    check_manifest(m)
    assert m.param_bytes == 616


def test_pack_params_offsets_widths_and_alignment():
    m = make_manifest()
    maps = {name: bytes([i]) * 128 for i, name in enumerate(("tma_a", "tma_b", "tma_d"), start=1)}
    extents = {"M": 1000, "N": 2000, "K": 512, "max_active_clusters": 66}
    blob = pack_params(m, extents, operands(), maps)
    raw = blob.tobytes()
    assert len(raw) == m.param_bytes == 616
    assert blob.address % 64 == 0
    assert raw[0:1] == b"\0"  # zeros
    assert raw[64:192] == b"\x01" * 128
    assert raw[256:384] == b"\x02" * 128
    assert raw[448:576] == b"\x03" * 128
    assert struct.unpack_from("<ii", raw, 192) == (1000, 512)
    assert struct.unpack_from("<ii", raw, 384) == (2000, 512)
    assert struct.unpack_from("<qq", raw, 576) == (1000, 2000)
    assert struct.unpack_from("<i", raw, 592) == (8,)  # ceil(1000 / 128)
    assert struct.unpack_from("<f", raw, 596) == (256.0,)
    assert struct.unpack_from("<Q", raw, 600) == (0x7F20_0000_0000,)
    assert struct.unpack_from("<q", raw, 608) == (66,)
    # Padding between params stays zero.
    assert raw[1:64] == b"\0" * 63
    assert raw[200:256] == b"\0" * 56


def test_kernel_param_pointers_point_at_each_offset():
    m = make_manifest()
    maps = {n: b"\0" * 128 for n in ("tma_a", "tma_b", "tma_d")}
    blob = pack_params(m, {"M": 1, "N": 1, "K": 1, "max_active_clusters": 1}, operands(1, 1, 8), maps)
    ptrs = kernel_param_pointers(blob)
    assert len(ptrs) == len(m.params)
    assert [p - blob.address for p in ptrs] == [p.offset for p in m.params]


def test_pack_params_refuses_missing_map_and_out_of_range_values():
    m = make_manifest()
    extents = {"M": 1, "N": 1, "K": 8, "max_active_clusters": 1}
    with pytest.raises(InputError, match="tma_b"):
        pack_params(m, extents, operands(), {"tma_a": b"\0" * 128, "tma_d": b"\0" * 128})
    maps = {n: b"\0" * 128 for n in ("tma_a", "tma_b", "tma_d")}
    with pytest.raises(InputError, match="32 bits"):
        pack_params(m, {**extents, "M": 1 << 33}, operands(), maps)
    with pytest.raises(InputError, match="max_active_clusters"):
        pack_params(m, {"M": 1, "N": 1, "K": 8}, operands(), maps)


def test_aligned_zeros_is_aligned_and_zero():
    for n in (1, 63, 616, 4096):
        buf = aligned_zeros(n)
        assert buf.ctypes.data % 64 == 0
        assert buf.nbytes == n and not buf.any()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda ps: ps.__setitem__(2, dataclasses.replace(ps[2], offset=180)), "overlaps"),
        (lambda ps: ps.__setitem__(3, dataclasses.replace(ps[3], offset=260)), "multiple"),
        (lambda ps: ps.__setitem__(9, dataclasses.replace(ps[9], binding={"kind": "pointer", "operand": "x"})), "unknown operand"),
        (lambda ps: ps.__setitem__(7, dataclasses.replace(ps[7], binding={"kind": "scalar", "dtype": "i32", "expr": "__import__('os')"})), "not allowed"),
        (lambda ps: ps.__setitem__(1, dataclasses.replace(ps[1], binding=tma("a", [128, 128]))), "swizzle span"),
        (lambda ps: ps.__setitem__(1, dataclasses.replace(ps[1], binding=tma("a", [64, 512]))), "box"),
        (lambda ps: ps.__setitem__(1, dataclasses.replace(ps[1], binding=tma("a", [64, 64], modes=(0, 0)))), "permutation"),
        (lambda ps: ps.__setitem__(8, dataclasses.replace(ps[8], size=8)), "does not fit"),
        (lambda ps: ps.__setitem__(4, dataclasses.replace(ps[4], index=7)), "index"),
    ],
)
def test_check_manifest_refuses_inconsistent_layouts(mutate, match):
    params = gemm_params()
    mutate(params)
    with pytest.raises(KernelLoadError, match=match):
        check_manifest(make_manifest(params=params))


# ------------------------------------------------------------------------------------------------
# Expressions


def test_expressions_evaluate_safely():
    env = {"M": 1000, "N": 7, "K": 64}
    assert evaluate("ceil_div(M, 128)", env) == 8
    assert evaluate("M * N + K // 2 - 1", env) == 7031
    assert evaluate("-(M) % 7", env) == (-1000) % 7
    assert evaluate("max(M, N, 5) + min(K, 3)", env) == 1003
    assert evaluate(42, env) == 42
    assert Expr("ceil_div(M, 128) * N").symbols == {"M", "N"}
    for bad in ("__import__('os').system('true')", "M.real", "M / 2", "lambda: 1", "M if N else K",
                "ceil_div(M)", "open('x')", "[M]", "M ** 2", "'s'"):
        with pytest.raises(KernelLoadError):
            Expr(bad)
    with pytest.raises(InputError, match="'Q'"):
        evaluate("Q + 1", env)
    with pytest.raises(InputError, match="divides by zero"):
        evaluate("ceil_div(M, N - 7)", env)


# ------------------------------------------------------------------------------------------------
# Operands and TMA arguments


def test_tma_args_for_k_major_a_with_multicast_box():
    # A [M=1000, K=512] bf16, K-major; a 256x64 smem tile multicast over 2 CTAs: the generator
    # cuts the box from the last TMA dimension, (64, 256) -> (64, 128), and writes that box.
    binding = tma("a", [64, 128])
    args = tma_args_from_binding(binding, (1000, 512), (512, 1), 16, 0x7F00_0000_0000, "a")
    assert args == TmaArgs(
        dtype="bf16",
        rank=2,
        global_address=0x7F00_0000_0000,
        global_dims=(512, 1000),
        global_strides=(1024,),
        box=(64, 128),
        element_strides=(1, 1),
        interleave="none",
        swizzle="128B",
        l2_promotion="128B",
        oob_fill="none",
    )
    assert hash(args) == hash(dataclasses.replace(args))  # usable as a cache key


def test_tma_args_rank3_with_batch_mode():
    binding = {**tma("a", [64, 128, 1], modes=(1, 0, 2))}
    args = tma_args_from_binding(binding, (256, 128, 3), (128, 1, 256 * 128), 16, 0x1000, "a")
    assert args.global_dims == (128, 256, 3)
    assert args.global_strides == (256, 256 * 128 * 2)


@pytest.mark.parametrize(
    "shape, strides, ptr, match",
    [
        ((1000, 500), (500, 1), 0x1000, "multiple of 16"),  # row stride 1000 B
        ((1000, 512), (512, 1), 0x1008, "16-byte aligned"),
        ((1000, 512), (1, 1000), 0x1000, "unit stride"),
        ((0, 512), (512, 1), 0x1000, "1..2\\*\\*32"),
    ],
)
def test_tma_args_refuse_bad_operands_naming_them(shape, strides, ptr, match):
    with pytest.raises(InputError, match=match) as info:
        tma_args_from_binding(tma("a", [64, 128]), shape, strides, 16, ptr, "a")
    assert "'a'" in str(info.value)


def test_bind_operands_binds_and_checks_extents():
    m = make_manifest()
    normalized, extents = bind_operands(m, operands(1000, 2000, 512))
    assert extents == {"M": 1000, "N": 2000, "K": 512}
    assert normalized["a"].shape == (1000, 512)
    bad = operands()
    bad["b"] = OperandInfo(0x7F10_0000_0000, (2000, 256), (256, 1), "bf16")
    with pytest.raises(InputError, match="extent K is 256 from operand 'b'.*512 from operand 'a'"):
        bind_operands(m, bad)
    bad = operands()
    bad["b"] = OperandInfo(0x7F10_0000_0000, (2000, 512), (512, 1), "f16")
    with pytest.raises(InputError, match="'b' must have dtype bf16, got f16"):
        bind_operands(m, bad)
    missing = operands()
    del missing["d"]
    with pytest.raises(InputError, match="'d' is missing"):
        bind_operands(m, missing)
    with pytest.raises(InputError, match="extent M is 1000 from operand 'a'.*999 from the given"):
        bind_operands(m, operands(), {"M": 999})


def test_normalize_operand_pads_modes_and_canonicalises_unit_strides():
    spec = OperandSpec("a", "bf16", ["M", "K", "L"], 1, 16)
    info = normalize_operand("k", spec, OperandInfo(0x1000, (1, 20), (3, 1), "bf16"))
    # M == 1: its stride addresses nothing and becomes the span rounded to 16 bytes (24 elems).
    assert info.shape == (1, 20, 1)
    assert info.strides == (24, 1, 24)
    with pytest.raises(InputError, match="contiguous along mode 1"):
        normalize_operand("k", spec, OperandInfo(0x1000, (4, 8), (1, 4), "bf16"))
    with pytest.raises(InputError, match="multiple of 8 elements"):
        normalize_operand("k", spec, OperandInfo(0x1000, (4, 7), (7, 1), "bf16"))
    with pytest.raises(InputError, match="16-byte aligned"):
        normalize_operand("k", spec, OperandInfo(0x1002, (4, 8), (8, 1), "bf16"))
    with pytest.raises(InputError, match="rank 3"):
        normalize_operand("k", spec, OperandInfo(0x1000, (1, 1, 8, 8), (64, 64, 8, 1), "bf16"))


def test_normalize_operand_refuses_null_negative_strides_and_written_overlap():
    spec = OperandSpec("d", "bf16", ["M", "N"], 1, 16, written=True)
    with pytest.raises(InputError, match="NULL"):
        normalize_operand("k", spec, OperandInfo(0, (4, 8), (8, 1), "bf16"))
    assert normalize_operand("k", spec, OperandInfo(0, (0, 8), (8, 1), "bf16")).shape == (0, 8)  # empty
    with pytest.raises(InputError, match="negative stride"):
        normalize_operand("k", spec, OperandInfo(0x1000, (4, 8), (-8, 1), "bf16"))
    with pytest.raises(InputError, match="share memory"):  # a row stride under the width: ldd < N
        normalize_operand("k", spec, OperandInfo(0x1000, (4, 16), (8, 1), "bf16"))
    with pytest.raises(InputError, match="share memory"):  # a broadcast row
        normalize_operand("k", spec, OperandInfo(0x1000, (4, 16), (0, 1), "bf16"))
    packed = OperandSpec("sfb", "f32", ["G", "NB", "KB"], 2, 4, packed=True)
    assert normalize_operand("k", packed, OperandInfo(0x1000, (2, 3, 5), (15, 5, 1), "f32")).strides == (15, 5, 1)
    assert normalize_operand("k", packed, OperandInfo(0x1000, (1, 3, 5), (99, 5, 1), "f32")).shape == (1, 3, 5)
    with pytest.raises(InputError, match="packed row-major"):
        normalize_operand("k", packed, OperandInfo(0x1000, (2, 3, 5), (16, 5, 1), "f32"))
    # An input may overlap itself (the kernel only reads it).
    read = OperandSpec("a", "bf16", ["M", "K"], 1, 16)
    assert normalize_operand("k", read, OperandInfo(0x1000, (4, 16), (8, 1), "bf16")).strides == (8, 1)


def test_requirements_and_scalar_ranges_are_checked():
    m = dataclasses.replace(
        make_manifest(),
        requires=[Requirement("KB", "==", "ceil_div(K, 128)"), Requirement("SN", ">=", "ceil_div(N, 128)")],
    )
    check_manifest(m)
    check_requirements(m, {"K": 300, "KB": 3, "N": 129, "SN": 2})
    check_requirements(m, {"K": 300, "KB": 3, "N": 129, "SN": 5})
    with pytest.raises(InputError, match=r"extent KB must be == ceil_div\(K, 128\) = 3, got 2"):
        check_requirements(m, {"K": 300, "KB": 2, "N": 129, "SN": 2})
    with pytest.raises(InputError, match=r"extent SN must be >= ceil_div\(N, 128\) = 2, got 1"):
        check_requirements(m, {"K": 300, "KB": 3, "N": 129, "SN": 1})
    with pytest.raises(ManifestError, match="relation"):
        Requirement("KB", "<", "K")
    assert KernelManifest.from_json(m.to_json()).requires == m.requires
    eps = Param(0, "eps", 0, 4, 4, {"kind": "scalar", "dtype": "f32", "expr": "eps", "range": [1e-30, 3.4e38]})
    scaled = dataclasses.replace(make_manifest(), params=[eps])
    check_manifest(scaled)
    assert bytes(pack_params(scaled, {"eps": 1e-4}, {}, {}).data[:4]) == struct.pack("<f", 1e-4)
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(InputError, match="must be in"):
            pack_params(scaled, {"eps": bad}, {}, {})


def test_operand_info_from_records():
    info = operand_info((0x1000, [4, 8], [8, 1], "bf16"), "a")
    assert info == OperandInfo(0x1000, (4, 8), (8, 1), "bf16")
    assert operand_info(info) is info
    with pytest.raises(InputError, match="'x'"):
        operand_info(3.0, "x")


def test_operand_info_refuses_cpu_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match="CUDA tensor"):
        operand_info(torch.zeros(4, 8, dtype=torch.bfloat16), "a")


def test_launch_plan_key_tells_layouts_apart_and_not_addresses():
    torch = pytest.importorskip("torch")
    from cutegen.runtime.launch import _operands_key

    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    key, addresses = _operands_key({"a": x})
    assert addresses == {"a": x.data_ptr()}
    assert _operands_key({"a": x.clone()})[0] == key  # another address: the same plan
    for other in (x[1:], x.t(), x.view(torch.float16), x[:, :4]):
        assert _operands_key({"a": other})[0] != key
    assert _operands_key({"b": x})[0] != key
    record = (0x1000, (4, 8), (8, 1), "bf16")
    assert _operands_key({"a": record}) == ((("a", (4, 8), (8, 1), "bf16"),), {"a": 0x1000})
    with pytest.raises(InputError, match="'a'"):
        _operands_key({"a": 3.0})


def test_address_sites_cover_every_address_param():
    import numpy as np

    from cutegen.runtime.launch import address_sites

    manifest = make_manifest()
    sites = address_sites(manifest)
    kinds = {p.binding["kind"] for p in manifest.params}
    assert {"pointer", "tma"} & kinds
    expected = sorted(
        (p.binding["operand"], p.offset // 8) for p in manifest.params if p.binding["kind"] in ("pointer", "tensor", "tma")
    )
    assert sorted((op, word) for op, word, _ in sites) == expected
    for param in manifest.params:
        if param.binding["kind"] == "tma":
            assert any(word == param.offset // 8 and need >= 16 for _, word, need in sites)

    # A blob packed for one set of addresses, with its address sites rewritten, is the blob packed
    # for the other (descriptors stand in with their address in the first 8 bytes, as encoded).
    def packed(infos):
        maps = {
            p.name: infos[p.binding["operand"]].ptr.to_bytes(8, "little") + bytes(range(1, 121))
            for p in manifest.params if p.binding["kind"] == "tma"
        }
        return pack_params(manifest, {"M": 1000, "N": 2000, "K": 512, "max_active_clusters": 66}, infos, maps)

    first = operands()
    second = {name: OperandInfo(info.ptr + 0x4000_0000, info.shape, info.strides, info.dtype) for name, info in first.items()}
    blob = packed(first).data.copy()
    words = blob.view(np.uint64)
    for operand, word, _ in sites:
        words[word] = second[operand].ptr
    assert bytes(blob) == packed(second).tobytes()
    # A blob that does not end on a whole 8-byte word (a trailing i32) still holds every site in
    # its whole words, which is all `launch` views as uint64.
    tail = make_manifest(params=gemm_params() + [Param(11, "tail", 616, 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "1"})])
    assert tail.param_bytes % 8 == 4
    assert all((word + 1) * 8 <= tail.param_bytes // 8 * 8 for _, word, _ in address_sites(tail))


# ------------------------------------------------------------------------------------------------
# Grid


def test_persistent_grid():
    rule = GridRule("persistent_clusters", 128, 256, 2, 1)
    grid, derived = persistent_grid(rule, 4096, 4096, 66)
    assert derived == {"tiles_m": 32, "tiles_n": 16, "cluster_tiles": 256, "num_clusters": 66}
    assert grid == (2, 1, 66)
    grid, derived = persistent_grid(rule, 1, 200, 66)
    assert grid == (2, 1, 1) and derived["cluster_tiles"] == 1
    grid, _ = persistent_grid(rule, 1000, 1000, 0)  # no occupancy answer: at least 1 cluster
    assert grid == (2, 1, 1)


# ------------------------------------------------------------------------------------------------
# Heuristics


def candidates() -> list[KernelManifest]:
    out = []
    for tm, tn, cm, mc in [
        (64, 128, 1, "none"),
        (64, 256, 1, "none"),
        (128, 128, 1, "none"),
        (128, 256, 1, "none"),
        (128, 256, 2, "b"),
        (128, 128, 2, "b"),
    ]:
        out.append(make_manifest(f"gemm_{tm}x{tn}_c{cm}x1_{mc}", tm, tn, cm, 1, mc))
    return out


@pytest.mark.parametrize("mnk", [(1, 4096, 7168), (64, 2112, 7168), (4096, 4096, 4096), (1000, 1000, 512)])
def test_heuristic_is_deterministic_and_order_independent(mnk):
    cands = candidates()
    first = heuristics.choose("bf16_gemm_nt", cands, *mnk, 132, tuning={}).name
    for seed in range(5):
        shuffled = cands[:]
        random.Random(seed).shuffle(shuffled)
        assert heuristics.choose("bf16_gemm_nt", shuffled, *mnk, 132, tuning={}).name == first
    table = heuristics.explain("bf16_gemm_nt", cands, *mnk, 132, tuning={})
    assert table[0].name == first
    assert sorted(s.name for s in table) == sorted(c.name for c in cands)


def test_heuristic_sanity():
    cands = candidates()
    for m in (1, 17, 64):
        pick = heuristics.choose("bf16_gemm_nt", cands, m, 4096, 7168, 132, tuning={})
        assert pick.grid.tile_m == 64, (m, pick.name)
    big = heuristics.choose("bf16_gemm_nt", cands, 8192, 8192, 8192, 132, tuning={})
    assert (big.grid.tile_m, big.grid.tile_n) == (128, 256)
    assert big.grid.cluster_m == 2  # tiles_m >= 2: the 2x1 cluster with B multicast
    # With a single M tile a 2x1 cluster shares nothing: never preferred.
    one = heuristics.choose("bf16_gemm_nt", [c for c in cands if c.grid.tile_m == 128], 100, 4096, 4096, 132, tuning={})
    assert one.grid.cluster_m == 1
    score = heuristics.score(cands[4], 4096, 4096, 4096, 132)
    assert score.tiles == 32 * 16 and score.waves == 4
    assert 0 < score.wave_efficiency <= 1


def test_tuning_table_takes_precedence(tmp_path, monkeypatch):
    cands = candidates()
    model_pick = heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096, 132, tuning={}).name
    other = next(c.name for c in cands if c.name != model_pick)
    table = {"bf16_gemm_nt": {"4096,4096,4096": other}}
    assert heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096, tuning=table).name == other
    # A shape not in the table, and a table naming an unknown kernel, fall back to the model.
    untuned = heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4095, tuning={}).name
    assert heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4095, tuning=table).name == untuned
    assert (
        heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096,
                          tuning={"bf16_gemm_nt": {"4096,4096,4096": "nope"}}).name
        == model_pick
    )
    # From <build_dir>/tuning.json ...
    monkeypatch.delenv(heuristics.TUNING_ENV, raising=False)
    (tmp_path / "tuning.json").write_text(json.dumps({"bf16_gemm_nt": {"4096, 4096, 4096": other}}))
    assert heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096, build_dir=tmp_path).name == other
    rows = heuristics.explain("bf16_gemm_nt", cands, 4096, 4096, 4096, build_dir=tmp_path)
    assert rows[0].name == other and rows[0].source == "tuning"
    assert "tuning" in heuristics.format_table(rows)
    # ... and $CUTEGEN_TUNING wins over the build folder's table.
    third = next(c.name for c in cands if c.name not in (other, model_pick))
    env_table = tmp_path / "env.json"
    env_table.write_text(json.dumps({"bf16_gemm_nt": {"4096,4096,4096": third}}))
    monkeypatch.setenv(heuristics.TUNING_ENV, str(env_table))
    assert heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096, build_dir=tmp_path).name == third
    env_table.write_text("{not json")
    with pytest.raises(ArtifactError, match="tuning table"):
        heuristics.choose("bf16_gemm_nt", cands, 4096, 4096, 4096, build_dir=tmp_path)


def test_heuristic_needs_candidates_of_the_op():
    with pytest.raises(ArtifactError, match="no kernel for fp8_gemm_nt"):
        heuristics.choose("fp8_gemm_nt", candidates(), 1, 1, 1, tuning={})


# ------------------------------------------------------------------------------------------------
# Manifest, catalogue, architecture


def test_manifest_json_round_trip():
    m = make_manifest()
    again = KernelManifest.from_json(m.to_json())
    assert again == m
    assert again.to_json() == m.to_json()
    check_manifest(again)


def write_build(tmp_path: Path, manifests: list[KernelManifest], cubins: dict[str, bytes]) -> Path:
    entries = []
    for m in manifests:
        folder = tmp_path / m.name
        folder.mkdir()
        data = cubins[m.name]
        m = dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest())
        (folder / "manifest.json").write_text(m.to_json())
        (folder / m.cubin).write_bytes(data)
        entries.append(CatalogueEntry(m.name, m.op, m.arch, f"{m.name}/manifest.json", m.schedule))
    (tmp_path / "catalogue.json").write_text(Catalogue(entries, {"cutlass_dsl": "4.8.1"}).to_json())
    return tmp_path


def test_catalogue_lists_and_verifies_cubins(tmp_path, monkeypatch):
    m90 = make_manifest("k90")
    m100 = make_manifest("k100", arch="sm_100a")
    build = write_build(tmp_path, [m90, m100], {"k90": b"\x7fELF-90", "k100": b"\x7fELF-100"})
    monkeypatch.setenv("CUTEGEN_BUILD_DIR", str(build))
    cat = load_catalogue()
    assert cat.build_dir == build and len(cat) == 2
    assert cat.names("bf16_gemm_nt") == ["k90", "k100"]
    assert cat.names(arch="sm_100a") == ["k100"]
    assert [m.name for m in cat.compatible("bf16_gemm_nt", (9, 0))] == ["k90"]
    assert cat.read_cubin("k90") == b"\x7fELF-90"
    (build / "k90" / "kernel.cubin").write_bytes(b"\x7fELF-tampered")
    with pytest.raises(ArtifactError, match=r"k90/kernel\.cubin is corrupt or stale: sha256"):
        cat.read_cubin("k90")
    (build / "k90" / "kernel.cubin").unlink()
    with pytest.raises(ArtifactError, match="cannot be read"):
        cat.read_cubin("k90")
    with pytest.raises(ArtifactError, match="no kernel named 'zzz'.*k90"):
        cat.manifest("zzz")
    (build / "k100" / "manifest.json").write_text("{")
    with pytest.raises(ArtifactError, match="k100.*not valid JSON"):
        KernelCatalogue.open(build).manifest("k100")
    (build / "k100" / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest .* is missing"):
        KernelCatalogue.open(build).manifest("k100")


def test_catalogue_reads_only_the_manifests_of_kernels_whose_schedule_is_wanted(tmp_path):
    wide, narrow = make_manifest("wide", tile_n=256), make_manifest("narrow", tile_n=128)
    build = write_build(tmp_path, [wide, narrow], {"wide": b"\x7fELF-w", "narrow": b"\x7fELF-n"})
    (build / "wide" / "manifest.json").write_text("{")  # read, it would be refused
    cat = KernelCatalogue.open(build)
    assert [m.name for m in cat.compatible("bf16_gemm_nt", (9, 0), lambda s: s["tile_n"] == 128)] == ["narrow"]
    with pytest.raises(ArtifactError, match="wide.*not valid JSON"):
        cat.compatible("bf16_gemm_nt", (9, 0))


def test_catalogue_refuses_a_manifest_whose_schedule_is_not_its_line(tmp_path):
    build = write_build(tmp_path, [make_manifest("k90", tile_n=256)], {"k90": b"\x7fELF-90"})
    index = Catalogue.from_json((build / "catalogue.json").read_text())
    line = dataclasses.replace(index.kernels[0], schedule={**index.kernels[0].schedule, "tile_n": 128})
    (build / "catalogue.json").write_text(dataclasses.replace(index, kernels=[line]).to_json())
    with pytest.raises(ArtifactError, match="k90.*another schedule than its line in the catalogue"):
        KernelCatalogue.open(build).manifest("k90")


def test_catalogue_refuses_edited_manifests_paths_out_of_the_folder_and_wrong_shapes(tmp_path):
    m = make_manifest("k90")
    build = write_build(tmp_path, [m], {"k90": b"\x7fELF-90"})
    index = Catalogue.from_json((build / "catalogue.json").read_text())
    raw = (build / "k90" / "manifest.json").read_bytes()
    recorded = dataclasses.replace(index.kernels[0], manifest_sha256=hashlib.sha256(raw).hexdigest())
    (build / "catalogue.json").write_text(dataclasses.replace(index, kernels=[recorded]).to_json())
    assert KernelCatalogue.open(build).manifest("k90").name == "k90"
    edited = json.loads(raw)
    edited["smem_bytes"] = 1
    (build / "k90" / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(ArtifactError, match="k90.*sha256 .* is not the .* the catalogue records"):
        KernelCatalogue.open(build).manifest("k90")
    (build / "k90" / "manifest.json").write_bytes(raw)
    outside = dataclasses.replace(recorded, manifest="../elsewhere/manifest.json")
    (build / "catalogue.json").write_text(dataclasses.replace(index, kernels=[outside]).to_json())
    with pytest.raises(ArtifactError, match="manifest path '../elsewhere/manifest.json' leads out of the build folder"):
        KernelCatalogue.open(build).manifest("k90")
    absolute_cubin = json.loads(raw)
    absolute_cubin["cubin"] = "/etc/passwd"
    (build / "k90" / "manifest.json").write_text(json.dumps(absolute_cubin))
    (build / "catalogue.json").write_text(index.to_json())  # no digest recorded
    with pytest.raises(ArtifactError, match="cubin path '.*passwd' leads out of the build folder"):
        KernelCatalogue.open(build).read_cubin("k90")
    for wrong in ("[1, 2]", json.dumps(json.loads(raw) | {"smem_bytes": "lots"})):
        (build / "k90" / "manifest.json").write_text(wrong)
        with pytest.raises(ArtifactError, match="k90.*malformed manifest"):
            KernelCatalogue.open(build).manifest("k90")
    (build / "catalogue.json").write_text("[]")
    with pytest.raises(ArtifactError, match="catalogue.json cannot be used: malformed catalogue"):
        KernelCatalogue.open(build)


def test_missing_catalogue_is_a_clear_error(tmp_path):
    with pytest.raises(ArtifactError, match="no kernel catalogue at .*cutegen build"):
        load_catalogue(tmp_path)


def test_arch_rules_and_message():
    assert required_capability("sm_90a") == (9, 0, "exact")
    assert required_capability("sm_100a") == (10, 0, "exact")
    assert arch_compatible("sm_90a", (9, 0)) and not arch_compatible("sm_90a", (10, 0))
    assert arch_compatible("sm_80", (8, 6)) and not arch_compatible("sm_86", (8, 0))
    check_arch(make_manifest("k90"), (9, 0), "NVIDIA H200")
    with pytest.raises(ArchMismatchError) as info:
        check_arch(make_manifest("k100", arch="sm_100a"), (9, 0), "NVIDIA H200")
    message = str(info.value)
    assert message.startswith("kernel k100 is built for sm_100a; this GPU is sm_90 (NVIDIA H200):")
    assert "compute capability 10.0" in message


def test_catalogue_load_refuses_other_arch_before_touching_the_cubin(tmp_path, monkeypatch):
    from cutegen.runtime import driver

    build = write_build(tmp_path, [make_manifest("k100", arch="sm_100a")], {"k100": b"x"})
    (build / "k100" / "kernel.cubin").unlink()  # never read: the arch check comes first
    fake = driver.DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 232448)
    monkeypatch.setattr(driver, "device_info", lambda ordinal=0: fake)
    with pytest.raises(ArchMismatchError, match="sm_100a; this GPU is sm_90 \\(NVIDIA H200\\)"):
        KernelCatalogue.open(build).load("k100")


def test_kernel_choice_is_remembered_per_op(tmp_path, monkeypatch):
    """Two ops asked for the same shape each get one of their own kernels (the choice cache is
    keyed by op as well as shape)."""
    from cutegen.runtime import driver, ops

    bf16 = make_manifest("bf16_k")
    fp8 = dataclasses.replace(make_manifest("fp8_k"), op="fp8_gemm_nt")
    build = write_build(tmp_path, [bf16, fp8], {"bf16_k": b"a", "fp8_k": b"b"})
    fake = driver.DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 232448)
    monkeypatch.setattr(driver, "device_info", lambda ordinal=0: fake)
    ops.set_build_dir(build)
    try:
        assert ops.choose_kernel("bf16_gemm_nt", 4096, 4096, 4096) == "bf16_k"
        assert ops.choose_kernel("fp8_gemm_nt", 4096, 4096, 4096) == "fp8_k"
        assert ops.choose_kernel("bf16_gemm_nt", 4096, 4096, 4096) == "bf16_k"
    finally:
        ops.set_build_dir(None)


# ------------------------------------------------------------------------------------------------
# Driver-layer helpers that need no driver


def test_check_and_param_layout_comparison():
    from cutegen.runtime import driver

    cu = driver.cu
    assert driver.check((cu.CUresult.CUDA_SUCCESS, 5), "x") == 5
    assert driver.check((cu.CUresult.CUDA_SUCCESS,), "x") is None
    assert driver.check((cu.CUresult.CUDA_SUCCESS, 1, 2), "x") == (1, 2)
    with pytest.raises(CudaError, match="cuFoo failed with CUDA_ERROR_INVALID_VALUE"):
        driver.check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuFoo")
    m = make_manifest()
    shifted = [(p.offset + 48, p.size) for p in m.params]  # the driver's constant shift
    driver.compare_param_layout(m, shifted)
    with pytest.raises(KernelLoadError, match="has 10 parameters but the manifest declares 11"):
        driver.compare_param_layout(m, shifted[:-1])
    wrong = shifted[:]
    wrong[6] = (wrong[6][0], 12)
    with pytest.raises(KernelLoadError, match="'coord_d'"):
        driver.compare_param_layout(m, wrong)


def test_launch_config_attributes_are_fresh_and_complete():
    from cutegen.runtime import driver

    cu = driver.cu
    m = dataclasses.replace(make_manifest(), pdl=True)
    config, attrs = driver.launch_config(m, (2, 1, 66), stream=0)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (2, 1, 66)
    assert (config.blockDimX, config.sharedMemBytes, config.numAttrs) == (384, 200_000, 2)
    ids = [a.id for a in attrs]
    assert ids == [
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    ]
    assert (attrs[0].value.clusterDim.x, attrs[0].value.clusterDim.y) == (2, 1)
    assert driver.launch_attributes(m) is not driver.launch_attributes(m)


# ------------------------------------------------------------------------------------------------
# Imports and the torch-facing layer's validation


def _run_python(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runtime_import_is_light_and_ops_never_imports_cutlass():
    _run_python(
        "import sys, cutegen.runtime as r\n"
        "assert 'torch' not in sys.modules and 'cuda.bindings.driver' not in sys.modules\n"
        "assert 'cutlass' not in sys.modules\n"
    )
    pytest.importorskip("torch")
    _run_python(
        "import sys, cutegen.runtime.ops\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'cutlass' or m.startswith(("
        "'cutegen.gen', 'cutegen.templates', 'cutegen.schedules'))]\n"
        "assert not bad, bad\n"
        "import cutegen.runtime as r\n"
        "assert r.bf16_gemm_nt is cutegen.runtime.ops.bf16_gemm_nt\n"
    )


# The torch-facing modules; the rest of the runtime works without torch.
TORCH_FACING = {
    "ops.py", "bf16_ops.py", "bf16_grouped_ops.py", "fp8_ops.py", "grouped_ops.py", "k_grouped_ops.py", "quant_ops.py", "quant_reference.py",
    "split_k.py", "stream_scratch.py", "checks.py", "torch_ops.py",
}


def test_runtime_sources_import_nothing_forbidden():
    forbidden = ("cutlass", "cutegen.gen", "cutegen.templates", "cutegen.schedules")
    for path in RUNTIME_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                names = [f"cutegen.{node.module}"]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
                if name.split(".")[0] == "torch":
                    assert path.name in TORCH_FACING, f"{path.name} imports torch"


@pytest.fixture()
def fake_cuda():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        yield torch, mode


def test_ops_validation_under_fake_tensors(fake_cuda):
    torch, _ = fake_cuda
    from cutegen.runtime import ops

    a = torch.empty(100, 64, dtype=torch.bfloat16, device="cuda")
    b = torch.empty(201, 64, dtype=torch.bfloat16, device="cuda")
    d = ops.bf16_gemm_nt(a, b)
    assert tuple(d.shape) == (100, 201) and d.stride() == (208, 1) and d.dtype == torch.bfloat16
    cases = [
        ((a, b.to(torch.float16)), "argument 'b' must be torch.bfloat16, got torch.float16"),
        ((a, torch.empty(201, 56, dtype=torch.bfloat16, device="cuda")), "argument 'b' must have K = a.shape\\[1\\] = 64"),
        ((torch.empty(2, 100, 64, dtype=torch.bfloat16, device="cuda"), b), "argument 'a' must be 2-D"),
        ((torch.empty_strided((100, 64), (2, 200), dtype=torch.bfloat16, device="cuda"), b), "argument 'a' must be contiguous along its last dimension"),
        # MN-major (DeepGEMM's tt form) with a column stride off 16 bytes.
        ((torch.empty_strided((100, 64), (1, 100), dtype=torch.bfloat16, device="cuda"), b), "argument 'a' is MN-major .* multiple of 8 elements"),
        ((torch.empty_strided((100, 60), (60, 1), dtype=torch.bfloat16, device="cuda"),
          torch.empty(201, 60, dtype=torch.bfloat16, device="cuda")), "argument 'a' must have a row stride that is a multiple of 8"),
    ]
    for args, match in cases:
        with pytest.raises(InputError, match=match):
            ops.bf16_gemm_nt(*args)
    with pytest.raises(InputError, match="argument 'out' must have shape \\[M, N\\] = \\[100, 201\\]"):
        ops.bf16_gemm_nt(a, b, out=torch.empty(100, 200, dtype=torch.bfloat16, device="cuda"))
    out = torch.empty_strided((100, 201), (208, 1), dtype=torch.bfloat16, device="cuda")
    assert ops.bf16_gemm_nt(a, b, out=out) is out
    with pytest.raises(InputError, match="argument 'kernel' must be a kernel name"):
        ops.bf16_gemm_nt(a, b, kernel=3)


def test_ops_refuses_cpu_and_non_tensors():
    torch = pytest.importorskip("torch")
    from cutegen.runtime import ops

    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="argument 'a' must be a CUDA tensor, got device cpu"):
        ops.bf16_gemm_nt(a, a)
    with pytest.raises(InputError, match="argument 'b' must be a torch.Tensor, got list"):
        ops.bf16_gemm_nt(a, [1, 2])


# Every op module's torch.ops.cutegen ops, as `import cutegen.runtime` registers them.
REGISTERED_OPS = {
    "bf16_gemm_nt", "bf16_gemm_nt_out", "fp8_gemm_nt", "fp8_gemm_nt_out", "fp8_wgrad_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous_out", "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_masked_out", "k_grouped_fp8_gemm_nt_contiguous", "per_token_quant_fp8",
    "per_token_quant_fp8_out", "per_block_quant_fp8", "per_block_quant_fp8_out", "grouped_transposed_quant_fp8",
    "grouped_transposed_quant_fp8_out",
}


def test_import_runtime_registers_every_op_when_torch_is_loaded():
    pytest.importorskip("torch")
    _run_python(
        "import torch, cutegen.runtime\n"
        f"missing = [op for op in {sorted(REGISTERED_OPS)!r} if not hasattr(torch.ops.cutegen, op)]\n"
        "assert not missing, missing\n"
    )


def test_op_schemas_avoid_inductor_reserved_names():
    # Inductor's FallbackKernel.create() has a parameter named `kernel`: an op argument with that
    # name fails torch.compile lowering ("got multiple values for argument 'kernel'").
    torch = pytest.importorskip("torch")
    import cutegen.runtime

    cutegen.runtime.register_torch_ops()
    for name in sorted(REGISTERED_OPS):
        op = getattr(torch.ops.cutegen, name).default
        names = [arg.name for arg in op._schema.arguments]
        assert "kernel" not in names, name


def test_load_refuses_a_manifest_its_cubin_contradicts():
    from cutegen.runtime.driver import FunctionFacts, compare_function_facts

    m = dataclasses.replace(make_manifest(), block=(384, 1, 1), cluster=(2, 1, 1), smem_bytes=200_000)
    compare_function_facts(m, FunctionFacts(384, 1024, (0, 0, 0)), 232_448)  # no cluster required
    compare_function_facts(m, FunctionFacts(384, 0, (2, 1, 1)), 232_448)
    with pytest.raises(KernelLoadError, match="launches 384 threads per block; its cubin's entry takes at most 256"):
        compare_function_facts(m, FunctionFacts(256, 0, (0, 0, 0)), 232_448)
    with pytest.raises(KernelLoadError, match="40000 bytes of static shared memory .* exceed this GPU's 232448"):
        compare_function_facts(m, FunctionFacts(384, 40_000, (0, 0, 0)), 232_448)
    with pytest.raises(KernelLoadError, match=r"requires clusters of \(1, 2, 1\); the manifest launches \(2, 1, 1\)"):
        compare_function_facts(m, FunctionFacts(384, 0, (1, 2, 1)), 232_448)
