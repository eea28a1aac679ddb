"""CPU tier: the runtime pieces the quantize kernels added -- ``tensor`` bindings (the DSL's C struct
of a plain dynamic tensor), the ``blocks`` grid rule, operands without a unit-stride mode -- and
the torch-facing quantize ops' validation under fake tensors. No GPU, no CuTe DSL."""

from __future__ import annotations

import random
import struct

import pytest

from cutegen.runtime.errors import InputError, KernelLoadError
from cutegen.runtime.launch import blocks_grid, compute_grid
from cutegen.runtime.manifest import GridRule, KernelManifest, ManifestError, OperandSpec, Param
from cutegen.runtime.params import (
    OperandInfo,
    check_manifest,
    normalize_operand,
    pack_params,
    pack_tensor_struct,
    tensor_struct_layout,
)


def tensor_binding(operand: str, shape: list[str], strides: list[int], shape_width: int = 32) -> dict:
    return {
        "kind": "tensor",
        "operand": operand,
        "shape": shape,
        "shape_widths": [shape_width] * len(shape),
        "strides": strides,
        "stride_widths": [64] * len(strides),
    }


def quant_manifest(params: list[Param] | None = None, grid: GridRule | None = None) -> KernelManifest:
    """Shaped like the per-token quantize kernel's manifest."""
    if params is None:
        params = [
            Param(0, "x", 0, 24, 8, tensor_binding("x", ["M", "K"], [0])),
            Param(1, "q", 24, 24, 8, tensor_binding("q", ["M", "K"], [0])),
            Param(2, "sf", 48, 32, 8, tensor_binding("sf", ["SM", "SG"], [0, 1])),
            Param(3, "eps", 80, 4, 4, {"kind": "scalar", "dtype": "f32", "expr": "eps"}),
        ]
    return KernelManifest(
        name="cutegen_test_quant",
        op="per_token_quant_fp8",
        arch="sm_90a",
        entry="kernel_quant_0",
        cubin="kernel.cubin",
        sha256="0" * 64,
        block=(256, 1, 1),
        cluster=(1, 1, 1),
        smem_bytes=0,
        pdl=False,
        cooperative=False,
        grid=grid
        or GridRule(kind="blocks", blocks=["min(ceil_div(max(M, SM), 8) * ceil_div(K, 512), max_active_clusters)", "1", "1"]),
        operands=[
            OperandSpec("x", "bf16", ["M", "K"], 1, 16),
            OperandSpec("q", "e4m3", ["M", "K"], 1, 16),
            OperandSpec("sf", "f32", ["SM", "SG"], -1, 4),
        ],
        params=params,
        schedule={},
        toolchain={},
    )


# ------------------------------------------------------------------------------------------------
# tensor bindings


@pytest.mark.parametrize(
    "shape_widths, stride_widths, offsets, size",
    [
        ([32, 32], [64], [0, 8, 12, 16], 24),
        ([32, 32], [64, 64], [0, 8, 12, 16, 24], 32),
        ([32], [], [0, 8], 16),
        ([64], [], [0, 8], 16),
        ([32, 32, 32], [64], [0, 8, 12, 16, 24], 32),
        ([32, 32, 32], [32], [0, 8, 12, 16, 20], 24),
        ([], [], [0], 8),
    ],
)
def test_tensor_struct_layout(shape_widths, stride_widths, offsets, size):
    binding = {
        "kind": "tensor",
        "operand": "x",
        "shape": [f"E{i}" for i in range(len(shape_widths))],
        "shape_widths": shape_widths,
        "strides": list(range(len(stride_widths))),
        "stride_widths": stride_widths,
    }
    got_offsets, got_size, got_align = tensor_struct_layout(binding)
    assert (got_offsets, got_size, got_align) == (offsets, size, 8)


def test_tensor_struct_layout_refuses_malformed_bindings():
    with pytest.raises(ValueError, match="widths"):
        tensor_struct_layout({"shape": ["M"], "shape_widths": [32, 32]})
    with pytest.raises(ValueError, match="width 16"):
        tensor_struct_layout({"shape": ["M"], "shape_widths": [16]})


def test_pack_tensor_struct_bytes():
    info = OperandInfo(0x7F0012345670, (37, 640), (656, 1), "bf16")
    blob = pack_tensor_struct(tensor_binding("x", ["M", "K"], [0]), info, {"M": 37, "K": 640})
    assert blob == struct.pack("<QiiQ", 0x7F0012345670, 37, 640, 656)
    sf = OperandInfo(0x7F2000000000, (40, 5), (1, 40), "f32")
    blob = pack_tensor_struct(tensor_binding("sf", ["SM", "SG"], [0, 1]), sf, {"SM": 40, "SG": 5})
    assert blob == struct.pack("<QiiQQ", 0x7F2000000000, 40, 5, 1, 40)
    q = OperandInfo(0x7F3000000000, (3 << 31,), (1,), "e4m3")
    blob = pack_tensor_struct(tensor_binding("q", ["Q"], [], 64), q, {"Q": 3 << 31})
    assert blob == struct.pack("<Qq", 0x7F3000000000, 3 << 31)
    gs = OperandInfo(0x7F4000000000, (8,), (1,), "i32")
    blob = pack_tensor_struct(tensor_binding("group_sizes", ["G"], []), gs, {"G": 8})
    assert blob == struct.pack("<Qi", 0x7F4000000000, 8) + b"\0" * 4
    with pytest.raises(InputError, match="does not fit in 32 bits"):
        pack_tensor_struct(tensor_binding("q", ["Q"], []), q, {"Q": 3 << 31})


def test_pack_params_of_a_quant_manifest():
    m = quant_manifest()
    check_manifest(m)
    operands = {
        "x": OperandInfo(0x7F0000000000, (37, 640), (656, 1), "bf16"),
        "q": OperandInfo(0x7F1000000000, (37, 640), (672, 1), "e4m3"),
        "sf": OperandInfo(0x7F2000000000, (40, 5), (1, 40), "f32"),
    }
    env = {"M": 37, "K": 640, "SM": 40, "SG": 5, "eps": 1e-4}
    blob = pack_params(m, env, operands, {}).tobytes()
    assert len(blob) == 84
    assert blob[0:24] == struct.pack("<QiiQ", 0x7F0000000000, 37, 640, 656)
    assert blob[24:48] == struct.pack("<QiiQ", 0x7F1000000000, 37, 640, 672)
    assert blob[48:80] == struct.pack("<QiiQQ", 0x7F2000000000, 40, 5, 1, 40)
    assert blob[80:84] == struct.pack("<f", 1e-4)
    with pytest.raises(InputError, match="operand 'x' was not given"):
        pack_params(m, env, {"q": operands["q"], "sf": operands["sf"]}, {})


@pytest.mark.parametrize(
    "param, match",
    [
        (Param(2, "sf", 48, 24, 8, tensor_binding("sf", ["SM", "SG"], [0, 1])), "32 bytes"),
        (Param(2, "sf", 48, 32, 8, tensor_binding("sf", ["SM", "SG"], [0, 2])), "out of range"),
        (Param(2, "sf", 48, 32, 8, tensor_binding("nope", ["SM", "SG"], [0, 1])), "unknown operand"),
        (Param(2, "sf", 48, 32, 8, tensor_binding("sf", ["SM", "import os"], [0, 1])), "not valid"),
    ],
)
def test_check_manifest_refuses_bad_tensor_bindings(param, match):
    params = list(quant_manifest().params)
    params[2] = param
    with pytest.raises(KernelLoadError, match=match):
        check_manifest(quant_manifest(params))


# ------------------------------------------------------------------------------------------------
# the "blocks" grid rule


def test_blocks_grid_rule():
    m = quant_manifest()
    env = {"M": 37, "K": 640, "SM": 40, "SG": 5}
    grid, derived = compute_grid(m, env, 500)
    assert grid == (5 * 2, 1, 1) and derived == {}
    assert compute_grid(m, {**env, "M": 24064, "SM": 24064, "K": 7168}, 528)[0] == (528, 1, 1)
    assert compute_grid(m, {**env, "M": 0, "SM": 0}, 528)[0] == (0, 1, 1)
    rule = GridRule(kind="blocks", blocks=["S * ceil_div(H, 64)", "2", "sm_count"])
    assert blocks_grid(rule, {"S": 3, "H": 100, "sm_count": 132}) == (6, 2, 132)
    with pytest.raises(InputError, match="'H'"):
        blocks_grid(rule, {"S": 3, "sm_count": 1})


def test_blocks_grid_rule_is_validated():
    with pytest.raises(ManifestError, match="three expressions"):
        GridRule(kind="blocks", blocks=["1", "1"])
    with pytest.raises(ManifestError, match="three expressions"):
        GridRule(kind="blocks")
    bad = quant_manifest(grid=GridRule(kind="blocks", blocks=["__import__('os')", "1", "1"]))
    with pytest.raises(KernelLoadError):
        check_manifest(bad)


def test_quant_manifest_json_round_trip():
    m = quant_manifest()
    back = KernelManifest.from_json(m.to_json())
    assert back == m
    assert back.grid.blocks == m.grid.blocks and back.operands[2].contiguous_mode == -1


# ------------------------------------------------------------------------------------------------
# operands without a unit-stride mode


def test_operand_without_contiguous_mode():
    spec = OperandSpec("sf", "f32", ["SM", "SG"], -1, 4)
    for strides in ((1, 40), (5, 1), (7, 3)):
        info = OperandInfo(0x1000, (37, 5), strides, "f32")
        assert normalize_operand("k", spec, info).strides == strides
    spec16 = OperandSpec("sf", "f32", ["SM", "SG"], -1, 16)
    with pytest.raises(InputError, match="stride of mode 0"):
        normalize_operand("k", spec16, OperandInfo(0x1000, (37, 5), (5, 1), "f32"))
    check_manifest(quant_manifest())
    bad = quant_manifest()
    bad = KernelManifest(**{**bad.__dict__, "operands": [*bad.operands[:2], OperandSpec("sf", "f32", ["SM", "SG"], -2, 4)]})
    with pytest.raises(KernelLoadError, match="contiguous_mode"):
        check_manifest(bad)


# ------------------------------------------------------------------------------------------------
# torch-facing ops: validation and fake implementations (fake CUDA tensors on the CPU)


@pytest.fixture()
def fake_cuda():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        yield torch, mode


def test_max_groups_matches_the_template():
    pytest.importorskip("torch")
    from cutegen.runtime import quant_ops
    from cutegen.schedules.spec import QUANT_GROUP, QUANT_MAX_GROUPS

    assert quant_ops.MAX_GROUPS == QUANT_MAX_GROUPS and quant_ops.GROUP == QUANT_GROUP


def test_lazy_exports():
    pytest.importorskip("torch")
    import cutegen.runtime as rt
    from cutegen.runtime import quant_ops

    assert rt.per_token_quant_fp8 is quant_ops.per_token_quant_fp8
    assert rt.per_block_quant_fp8 is quant_ops.per_block_quant_fp8
    assert rt.grouped_transposed_quant_fp8 is quant_ops.grouped_transposed_quant_fp8


def test_per_token_fake_shapes_and_layouts(fake_cuda):
    torch, _ = fake_cuda
    from cutegen.runtime.quant_ops import per_token_quant_fp8

    x = torch.empty(37, 640, dtype=torch.bfloat16, device="cuda")
    q, s = per_token_quant_fp8(x)
    assert q.shape == (37, 640) and q.dtype == torch.float8_e4m3fn
    assert s.shape == (37, 5) and s.dtype == torch.float32 and s.stride() == (5, 1)
    q, s = per_token_quant_fp8(x, scale_layout="mn-major-tma-aligned")
    assert s.stride() == (1, 40)
    q, s = per_token_quant_fp8(x.float(), scale_format="ue8m0", scale_layout="mn-major-tma-aligned")
    assert s.shape == (37, 2) and s.dtype == torch.int32 and s.stride() == (1, 40)
    q, s = per_token_quant_fp8(x.half(), scale_format="ue8m0")
    assert s.shape == (37, 2) and s.stride() == (2, 1)


def test_per_token_validation(fake_cuda):
    torch, _ = fake_cuda
    from cutegen.runtime.quant_ops import per_token_quant_fp8

    x = torch.empty(37, 640, dtype=torch.bfloat16, device="cuda")
    cases = [
        (dict(x=x.to(torch.int32)), "argument 'x' must be torch.bfloat16 or torch.float16 or torch.float32"),
        (dict(x=torch.empty(37, 600, dtype=torch.bfloat16, device="cuda")), "argument 'x' must have K a multiple of 16"),
        (dict(x=torch.empty(1, 37, 640, dtype=torch.bfloat16, device="cuda")), "argument 'x' must be 2-D"),
        (dict(x=torch.empty_strided((640, 37), (1, 640), dtype=torch.bfloat16, device="cuda")), "argument 'x' must be contiguous along its last dimension"),
        (dict(x=torch.empty_strided((37, 624), (648, 1), dtype=torch.bfloat16, device="cuda")), None),
        (dict(x=x, group=64), "argument 'group' must be 128"),
        (dict(x=x, scale_format="e8m0"), "argument 'scale_format'"),
        (dict(x=x, scale_layout="mn-major"), "argument 'scale_layout'"),
        (dict(x=x, eps=0.0), "argument 'eps' must be a finite float"),
        (dict(x=x, eps=float("nan")), "argument 'eps'"),
        (dict(x=x, out=torch.empty(37, 640, dtype=torch.float8_e4m3fn, device="cuda")), "argument 'out_scales' must be given together"),
        (dict(x=x, out=torch.empty(37, 64, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(37, 5, device="cuda")), "argument 'out' must have shape \\[37, 640\\]"),
        (dict(x=x, out=torch.empty(37, 640, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(37, 4, device="cuda")), "argument 'out_scales' must have shape \\[37, 5\\]"),
        (dict(x=x, scale_layout="mn-major-tma-aligned", out=torch.empty(37, 640, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(37, 5, device="cuda")), "argument 'out_scales' must have strides \\(1, 40\\)"),
        (dict(x=x, scale_format="ue8m0", out=torch.empty(37, 640, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(37, 2, device="cuda")), "argument 'out_scales' must be torch.int32"),
        (dict(x=x, kernel=3), "argument 'kernel' must be a kernel name"),
    ]
    for kwargs, match in cases:
        if match is None:
            per_token_quant_fp8(**kwargs)  # a view with a 16-byte row stride is fine
            continue
        with pytest.raises(InputError, match=match):
            per_token_quant_fp8(**kwargs)


def test_per_block_fake_and_validation(fake_cuda):
    torch, _ = fake_cuda
    from cutegen.runtime.quant_ops import per_block_quant_fp8

    w = torch.empty(300, 272, dtype=torch.float32, device="cuda")
    q, s = per_block_quant_fp8(w)
    assert q.shape == (300, 272) and s.shape == (3, 3) and s.dtype == torch.float32
    with pytest.raises(InputError, match="argument 'w' must have K a multiple of 16"):
        per_block_quant_fp8(torch.empty_strided((300, 100), (200, 1), dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(InputError, match="argument 'w' must have a row stride that is a multiple of 4"):
        per_block_quant_fp8(torch.empty_strided((300, 272), (274, 1), dtype=torch.float32, device="cuda"))
    with pytest.raises(InputError, match="argument 'out_scales' must have shape \\[3, 3\\]"):
        per_block_quant_fp8(w, out=torch.empty(300, 272, dtype=torch.float8_e4m3fn, device="cuda"),
                            out_scales=torch.empty(3, 2, device="cuda"))


def test_grouped_fake_and_validation(fake_cuda):
    torch, _ = fake_cuda
    from cutegen.runtime.quant_ops import grouped_num_blocks_bound, grouped_transposed_quant_fp8

    x = torch.empty(24064, 7168, dtype=torch.bfloat16, device="cuda")
    gs = torch.empty(8, dtype=torch.int32, device="cuda")
    q, s = grouped_transposed_quant_fp8(x, gs)
    bound = grouped_num_blocks_bound(24064, 8)
    assert bound == 195 and s.shape == (195, 7168) and q.shape == (128 * 7168 * 195,)
    q, s = grouped_transposed_quant_fp8(x, gs, num_blocks=188)
    assert s.shape == (188, 7168) and q.dtype == torch.float8_e4m3fn
    cases = [
        (dict(x=x.float(), group_sizes=gs), "argument 'x' must be torch.bfloat16"),
        (dict(x=x, group_sizes=gs.long()), "argument 'group_sizes' must be torch.int32"),
        (dict(x=x, group_sizes=torch.empty(1025, dtype=torch.int32, device="cuda")), "argument 'group_sizes' must hold 1 to 1024"),
        (dict(x=x, group_sizes=torch.empty(0, dtype=torch.int32, device="cuda")), "argument 'group_sizes' must hold 1 to 1024"),
        (dict(x=x, group_sizes=torch.empty_strided((8,), (2,), dtype=torch.int32, device="cuda")), "argument 'group_sizes' must be contiguous"),
        (dict(x=torch.empty_strided((64, 60), (104, 1), dtype=torch.bfloat16, device="cuda"), group_sizes=gs), "argument 'x' must have H a multiple of 8"),
        (dict(x=x, group_sizes=gs, num_blocks=-1), "argument 'num_blocks'"),
        (dict(x=x, group_sizes=gs, eps=-1.0), "argument 'eps'"),
        (dict(x=x, group_sizes=gs, out=torch.empty(10, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(2, 7168, device="cuda")), "argument 'out' must have shape \\[1835008\\]"),
        (dict(x=x, group_sizes=gs, num_blocks=3, out=torch.empty(128 * 7168 * 2, dtype=torch.float8_e4m3fn, device="cuda"),
              out_scales=torch.empty(2, 7168, device="cuda")), "argument 'num_blocks' must equal out_scales.shape\\[0\\] = 2"),
    ]
    for kwargs, match in cases:
        with pytest.raises(InputError, match=match):
            grouped_transposed_quant_fp8(**kwargs)


def test_ops_refuse_cpu_tensors_and_non_tensors():
    torch = pytest.importorskip("torch")
    from cutegen.runtime.quant_ops import grouped_transposed_quant_fp8, per_block_quant_fp8, per_token_quant_fp8

    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="per_token_quant_fp8: argument 'x' must be a CUDA tensor, got device cpu"):
        per_token_quant_fp8(x)
    with pytest.raises(InputError, match="per_block_quant_fp8: argument 'w' must be a torch.Tensor, got list"):
        per_block_quant_fp8([1.0])
    with pytest.raises(InputError, match="argument 'group_sizes' must be a torch.Tensor"):
        grouped_transposed_quant_fp8(x, [4])


def test_grouped_bound_covers_every_split():
    from cutegen.runtime.quant_ops import grouped_num_blocks_bound

    rng = random.Random(5)
    for _ in range(2000):
        g = rng.randint(1, 12)
        t = rng.randint(0, 3000)
        cuts = sorted(rng.randint(0, t) for _ in range(g - 1))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, t])]
        assert sum(-(-m // 128) for m in sizes) <= grouped_num_blocks_bound(t, g)


def test_quant_op_schemas_avoid_inductor_reserved_names():
    torch = pytest.importorskip("torch")
    import cutegen.runtime.quant_ops  # noqa: F401 - registers the ops

    for name in ("per_token_quant_fp8", "per_token_quant_fp8_out", "per_block_quant_fp8",
                 "per_block_quant_fp8_out", "grouped_transposed_quant_fp8", "grouped_transposed_quant_fp8_out"):
        op = getattr(torch.ops.cutegen, name).default
        names = [arg.name for arg in op._schema.arguments]
        assert "kernel" not in names and "kernel_name" in names, name


def test_bench_quant_render_without_a_gpu():
    from cutegen.bench import quant as bench_quant

    rows = [
        bench_quant._row("per_token_quant_fp8", "x [8, 128] bf16", "copy (same bytes)", 10.0, 4000),
        bench_quant._row("per_token_quant_fp8", "x [8, 128] bf16", "cutegen (fp32, k-major)", 12.5, 4000, kernel="k"),
        bench_quant._row("per_token_quant_fp8", "x [8, 128] bf16", "torch.compile (reference)", None, 4000, "RuntimeError: x"),
    ]
    assert rows[1]["gbs"] == 4000 / 12.5 / 1e3 and rows[2]["gbs"] is None
    text = bench_quant.render({"rows": rows, "copy_gbs": 0.4}, {"gpu": "H200", "date": "today"})
    assert "| per_token_quant_fp8 | x [8, 128] bf16 | cutegen (fp32, k-major) | 12.5 |" in text
    assert "RuntimeError: x" in text and "H200" in text


def test_bench_quant_keeps_the_faster_of_two_copy_timings(monkeypatch):
    from cutegen.bench import quant as bench_quant

    rows = [
        bench_quant._row("per_token_quant_fp8", "x [8, 128] bf16", "copy (same bytes)", 12.0, 4000),
        bench_quant._row("grouped_transposed_quant_fp8", "x [8, 128] bf16", "copy (same bytes)", 9.0, 4000),
    ]
    timings = iter([10.0, 11.0])
    monkeypatch.setattr(bench_quant, "_copy_us", lambda nbytes, reps: next(timings))
    bench_quant._retime_copy(rows, "per_token_quant_fp8", reps=3)
    bench_quant._retime_copy(rows, "grouped_transposed_quant_fp8", reps=3)
    assert rows[0]["us"] == 10.0 and rows[0]["gbs"] == 4000 / 10.0 / 1e3
    assert rows[1]["us"] == 9.0
