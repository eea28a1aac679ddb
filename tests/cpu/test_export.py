"""`cutegen export` and the generated C launcher, `cutegen verify`, and the CLI around them (CPU only).

The C launcher's ABI self-check: the exported C files are compiled with gcc against ``cuda.h``
and linked with ``cuda_driver_stub.c``, a stand-in for libcuda that records every driver call.
The linked program loads and launches kernels on fake device pointers; for each problem the test
computes what cutegen's Python runtime would do (``bind_operands``, ``tma_args_from_binding``,
``pack_params``, ``persistent_grid``) and asserts the C launcher passed exactly that:
``cuTensorMapEncodeTiled`` arguments, the parameter bytes at the manifest offsets, grid, block,
cluster, shared memory and attributes; and that it refuses exactly the inputs Python refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cutegen.gen import cli
from cutegen.gen.build import render_header, write_catalogue
from cutegen.gen.export import (
    EXPORT_MARKER,
    ExportError,
    _stride_arg_name,
    c_expr,
    export_kernels,
    kernel_view,
)
from cutegen.gen.verify import EXPECTED_MMA, verify_kernel
from cutegen.runtime.catalogue import KernelCatalogue
from cutegen.runtime.errors import InputError
from cutegen.runtime.launch import compute_grid
from cutegen.runtime.manifest import GridRule, KernelManifest, OperandSpec, Param
from cutegen.runtime.params import (
    OperandInfo,
    bind_operands,
    check_requirements,
    evaluate,
    pack_params,
    tma_args_from_binding,
)
from cutegen.schedules.predicates import OP_ARCHS
from cutegen.schedules.loader import default_schedules
from toolchain import cuda_include
from schedule_files import ONE_CTA_CLUSTER, bf16_family

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STUB = HERE / "cuda_driver_stub.c"
EXAMPLE = REPO / "examples" / "c_launcher"
CUDA_INVALID_VALUE = 1
CUDA_INVALID_CONTEXT = 201
CUDA_INVALID_IMAGE = 200
CUDA_NO_BINARY_FOR_GPU = 209
CUDA_FILE_NOT_FOUND = 301
STREAM = 0x5150
FAKE_CUBIN = b"\x7fELF this is not a real cubin, only bytes with a sha256"

REPRESENTATIVE = (
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_64x128x64_c1x1_mc0_s8_wg1_r40x232_epitma_rm_g8",
)


# ---- toolchain ---------------------------------------------------------------------------------



@pytest.fixture(scope="session")
def toolchain() -> dict[str, Any]:
    cc = shutil.which("gcc") or shutil.which("cc")
    inc = cuda_include()
    if cc is None or inc is None:
        pytest.fail("a C compiler and cuda.h (pip package nvidia-cuda-runtime) are needed")
    return {"cc": cc, "include": inc, "cxx": shutil.which("g++"), "cmake": shutil.which("cmake"),
            "make": shutil.which("make")}


CFLAGS = ["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-Wshadow"]


def compile_c(tc: dict, out: Path, sources: list[Path], includes: list[Path], extra: list[str] = ()) -> Path:
    cmd = [tc["cc"], *CFLAGS, f"-I{tc['include']}", *[f"-I{i}" for i in includes], *map(str, sources),
           *extra, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return out


def export_sources(export_dir: Path) -> list[Path]:
    return sorted(export_dir.glob("*.c")) + sorted(export_dir.glob("*/launcher.c"))


def run_records(exe: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[dict]]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CUTEGEN_STUB_")}
    full_env.update(env or {})
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=full_env, timeout=60)
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return proc.returncode, records


def stub_params(manifest: KernelManifest, bias: int = 48) -> str:
    """The parameter layout as the driver reports it (offsets shifted by a constant)."""
    return ",".join(f"{p.offset + bias}:{p.size}" for p in manifest.params)


# ---- the test program that drives a generated launcher -----------------------------------------

DRIVER = """\
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cutegen_kernels.h"

static void emit(const char* what, CUresult r) {{
  const char* m = cutegen_last_error();
  printf("{{\\"call\\":\\"%s\\",\\"result\\":%d,\\"error\\":\\"", what, (int)r);
  for (; *m; m++) {{
    if (*m == '"' || *m == '\\\\') putchar('\\\\');
    putchar(*m);
  }}
  printf("\\"}}\\n");
}}

int main(int argc, char** argv) {{
  cutegen_kernel k;
  CUresult r;
  int i = 2;
  if (argc < 2) return 2;
  r = cutegen_kernel_load(&k, &{name}_info, argv[1]);
  emit("load", r);
  if (r != CUDA_SUCCESS) return 3;
  printf("{{\\"call\\":\\"loaded\\",\\"sm_count\\":%d,\\"max_active_clusters\\":%d}}\\n", k.sm_count,
         k.max_active_clusters);
  while (i + {nargs} <= argc) {{
    r = {launch}(&k, {call_args}, (CUstream)(uintptr_t){stream});
    emit("launch", r);
    i += {nargs};
  }}
  cutegen_kernel_unload(&k);
  return 0;
}}
"""


def driver_source(view: Any, use_op: bool = False) -> str:
    conv = []
    for j, a in enumerate(view.args):
        if a.ctype == "CUdeviceptr":
            conv.append(f"(CUdeviceptr)strtoull(argv[i + {j}], NULL, 0)")
        elif a.ctype == "int64_t":
            conv.append(f"(int64_t)strtoll(argv[i + {j}], NULL, 0)")
        elif a.ctype == "float":
            conv.append(f"(float)strtod(argv[i + {j}], NULL)")
        else:
            conv.append(f"(int32_t)strtol(argv[i + {j}], NULL, 0)")
    launch = f"cutegen_{view.manifest.op}_launch" if use_op else f"{view.name}_launch"
    return DRIVER.format(name=view.name, nargs=len(view.args), launch=launch, call_args=", ".join(conv),
                         stream=STREAM)


def build_driver(tc: dict, export_dir: Path, name: str, work: Path, use_op: bool = False) -> Path:
    manifest = KernelManifest.from_json((export_dir / name / "manifest.json").read_text())
    view = kernel_view(manifest)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"driver_{'op' if use_op else 'kernel'}.c"
    src.write_text(driver_source(view, use_op))
    return compile_c(tc, work / src.stem, [src, *export_sources(export_dir), STUB], [export_dir])


# ---- the Python runtime's answer ---------------------------------------------------------------


def python_reference(manifest: KernelManifest, problem: dict[str, Any], sm_count: int, mac: int) -> dict:
    """What cutegen.runtime.launch.prepare does for this problem (without a driver)."""
    given = {a.name: problem[a.name] for a in kernel_view(manifest).args if a.kind == "scalar"}
    operands = {}
    for spec in manifest.operands:
        rank = len(spec.shape)
        shape = tuple(int(s) if str(s).isdigit() else problem[s] for s in spec.shape)
        strides = tuple(
            1 if m == spec.contiguous_mode else problem[_stride_arg_name(spec.name, rank, m, spec.contiguous_mode)]
            for m in range(rank)
        )
        operands[spec.name] = OperandInfo(problem[spec.name], shape, strides, spec.dtype)
    try:
        normalized, bound = bind_operands(manifest, operands, given)
        rule = manifest.grid
        if rule.kind == "persistent_clusters" and (bound[rule.extent_m] == 0 or bound[rule.extent_n] == 0):
            return {"kind": "skip"}
        env = dict(bound, sm_count=sm_count, max_active_clusters=mac)
        grid, derived = compute_grid(manifest, env, mac)
        if min(grid) <= 0:
            return {"kind": "skip"}
        check_requirements(manifest, env)
        env.update(derived)
        for p in manifest.params:  # a float scalar's range (pack_params)
            if p.binding["kind"] == "scalar" and "range" in p.binding:
                value = evaluate(p.binding["expr"], env)
                if not p.binding["range"][0] <= value <= p.binding["range"][1]:
                    raise InputError(f"param {p.name}: {value} out of range")
        tma = {}
        for p in manifest.params:
            if p.binding["kind"] == "tma":
                info = normalized[p.binding["operand"]]
                tma[p.name] = tma_args_from_binding(
                    p.binding, info.shape, info.strides, info.elem_bits, info.ptr, p.binding["operand"]
                )
        return {"kind": "launch", "grid": grid, "tma": tma, "env": env, "normalized": normalized}
    except InputError as exc:
        return {"kind": "error", "error": str(exc)}


def problem_args(view: Any, problem: dict[str, Any]) -> list[str]:
    return [str(problem[a.name]) for a in view.args]


def segments(records: list[dict]) -> list[list[dict]]:
    """The records of each launch call, ending with the driver's own "launch" record."""
    out, cur, started = [], [], False
    for rec in records:
        if rec["call"] == "loaded":
            started = True
            continue
        if not started:
            continue
        cur.append(rec)
        if rec["call"] == "launch":
            out.append(cur)
            cur = []
    return out


def assert_matches_python(manifest: KernelManifest, seg: list[dict], problem: dict, sm_count: int, mac: int) -> None:
    from cutegen.runtime.tma import _tables

    dtypes, swizzles, promotions, fills, interleaves = _tables()
    ref = python_reference(manifest, problem, sm_count, mac)
    result = seg[-1]
    launches = [r for r in seg if r["call"] == "cuLaunchKernelEx"]
    encodes = [r for r in seg if r["call"] == "cuTensorMapEncodeTiled"]
    where = f"{manifest.name} {problem}"
    if ref["kind"] == "error":
        assert result["result"] == CUDA_INVALID_VALUE, (where, ref, result)
        assert result["error"], where
        assert launches == [], where
        return
    assert result["result"] == 0, (where, result)
    if ref["kind"] == "skip":
        assert launches == [] and encodes == [], where
        return
    # cuTensorMapEncodeTiled: one call per tma param, in param order, with Python's arguments.
    tma_params = [p for p in manifest.params if p.binding["kind"] == "tma"]
    assert len(encodes) == len(tma_params), where
    maps = {}
    for p, rec in zip(tma_params, encodes):
        args = ref["tma"][p.name]
        assert rec["dtype"] == int(dtypes[args.dtype]), (where, p.name)
        assert rec["rank"] == args.rank
        assert rec["address"] == args.global_address
        assert tuple(rec["dims"]) == args.global_dims, (where, p.name, rec["dims"], args.global_dims)
        assert tuple(rec["strides"]) == args.global_strides, (where, p.name)
        assert tuple(rec["box"]) == args.box, (where, p.name)
        assert tuple(rec["element_strides"]) == args.element_strides
        assert rec["interleave"] == int(interleaves[args.interleave])
        assert rec["swizzle"] == int(swizzles[args.swizzle]), (where, p.name)
        assert rec["l2"] == int(promotions[args.l2_promotion])
        assert rec["oob"] == int(fills[args.oob_fill])
        maps[p.name] = bytes.fromhex(rec["map"])
    # The parameter bytes at the manifest offsets equal Python's packing (with the same maps).
    blob = pack_params(manifest, ref["env"], ref["normalized"], maps).tobytes()
    (launch,) = launches
    assert launch["function_ok"] and launch["extra_null"]
    assert len(launch["params"]) == len(manifest.params)
    for p, got in zip(manifest.params, launch["params"]):
        assert bytes.fromhex(got) == blob[p.offset : p.offset + p.size], (where, p.name)
    base = manifest.params[0].offset
    assert launch["deltas"] == [p.offset - base for p in manifest.params]
    # Launch configuration.
    assert tuple(launch["grid"]) == ref["grid"], where
    assert launch["block"] == list(manifest.block)
    assert launch["smem"] == manifest.smem_bytes
    assert launch["stream"] == STREAM
    attrs = {a["id"]: a for a in launch["attrs"]}
    assert attrs[4]["cluster"] == list(manifest.cluster)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (6 in attrs) == manifest.pdl  # PROGRAMMATIC_STREAM_SERIALIZATION
    assert (2 in attrs) == manifest.cooperative  # COOPERATIVE
    if manifest.pdl:
        assert attrs[6]["pdl"] == 1
    if manifest.cooperative:
        assert attrs[2]["cooperative"] == 1


# ---- kernels to export -------------------------------------------------------------------------


def _layout(specs: list[tuple[str, int, int, dict]]) -> list[Param]:
    params, offset = [], 0
    for i, (name, size, align, binding) in enumerate(specs):
        offset = -(-offset // align) * align
        params.append(Param(i, name, offset, size, align, binding))
        offset += size
    return params


def _tma(operand: str, dtype: str, modes: list[int], box: list[int], swizzle: str) -> dict:
    return {"kind": "tma", "operand": operand, "dtype": dtype, "modes": modes, "box": box,
            "swizzle": swizzle, "interleave": "none", "l2_promotion": "128B", "oob_fill": "none"}


def gemm_like_manifest(name: str = "cutegen_test_gemm_like", cluster_m: int = 2) -> KernelManifest:
    params = _layout([
        ("tma_a", 128, 64, _tma("a", "bf16", [1, 0], [64, 64], "128B")),
        ("extents_a", 8, 4, {"kind": "shape", "operand": "a", "values": ["M", "K"], "width": 32}),
        ("tma_b", 128, 64, _tma("b", "bf16", [1, 0], [64, 128], "128B")),
        ("extents_b", 8, 4, {"kind": "shape", "operand": "b", "values": ["N", "K"], "width": 32}),
        ("tma_d", 128, 64, _tma("d", "bf16", [1, 0], [32, 64], "64B")),
        ("extents_d", 8, 4, {"kind": "shape", "operand": "d", "values": ["M", "N"], "width": 32}),
    ])
    return _manifest(name, "bf16_gemm_nt", params, [
        OperandSpec("a", "bf16", ["M", "K"], 1, 16),
        OperandSpec("b", "bf16", ["N", "K"], 1, 16),
        OperandSpec("d", "bf16", ["M", "N"], 1, 16),
    ], GridRule("persistent_clusters", 128, 128, cluster_m, 1), (cluster_m, 1, 1), pdl=False, cooperative=False)


def all_bindings_manifest(name: str = "cutegen_test_all_bindings") -> KernelManifest:
    params = _layout([
        ("tma_x", 128, 64, _tma("x", "bf16", [1, 0, 2], [64, 128, 1], "128B")),
        ("extents_x", 12, 4, {"kind": "shape", "operand": "x", "values": ["M", "K", "L"], "width": 32}),
        ("mma", 1, 1, {"kind": "zeros"}),
        ("bias_ptr", 8, 8, {"kind": "pointer", "operand": "bias"}),
        ("tiles", 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "ceil_div(M, 128) * 2 - K % 7"}),
        ("big", 8, 8, {"kind": "scalar", "dtype": "i64",
                       "expr": "num_clusters * max_active_clusters + sm_count - tiles_n // 3 + cluster_tiles"}),
        ("alpha", 4, 4, {"kind": "scalar", "dtype": "f32", "expr": "1.5"}),
        ("beta", 4, 4, {"kind": "scalar", "dtype": "f32", "expr": "K * 2 + L"}),
        ("ext64", 32, 8, {"kind": "shape", "operand": "x", "values": ["M", "N", "K", "L"], "width": 64}),
        ("ext16", 6, 2, {"kind": "shape", "operand": "x", "values": ["L", "min(K, 7)", "max(N, M, 3)"], "width": 16}),
        ("tma_w", 128, 64, _tma("w", "bf16", [1, 0], [32, 64], "64B")),
        ("tma_out", 128, 64, _tma("out", "f32", [1, 0], [8, 8], "32B")),
        ("count", 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "num_clusters - tiles_m % 5"}),
    ])
    return _manifest(name, "test_op", params, [
        OperandSpec("x", "bf16", ["M", "K", "L"], 1, 16),
        OperandSpec("w", "bf16", ["N", "K"], 1, 16),
        OperandSpec("out", "f32", ["M", "N"], 1, 16),
        OperandSpec("bias", "f32", ["N"], 0, 16),
    ], GridRule("persistent_clusters", 128, 64, 1, 1), (1, 1, 1), pdl=True, cooperative=True)


def blocks_tensor_manifest(name: str = "cutegen_test_blocks_tensor") -> KernelManifest:
    """The grid rule "blocks", "tensor" bindings and an operand with no unit-stride mode."""
    params = _layout([
        ("x_t", 32, 8, {"kind": "tensor", "operand": "x", "shape": ["M", "K"], "shape_widths": [32, 32],
                        "strides": [0, 1], "stride_widths": [64, 64]}),
        ("q_t", 32, 8, {"kind": "tensor", "operand": "q", "shape": ["M", "K"], "shape_widths": [32, 64],
                        "strides": [0], "stride_widths": [32]}),
        ("s_ptr", 8, 8, {"kind": "pointer", "operand": "s"}),
        ("n_tiles", 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "ceil_div(M, 8) * ceil_div(K, 512)"}),
        ("mac", 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "max_active_clusters + sm_count"}),
        ("kb", 4, 4, {"kind": "shape", "operand": "s", "values": ["KB"], "width": 32}),
    ])
    m = _manifest(name, "test_quant", params, [
        OperandSpec("x", "f32", ["M", "K"], -1, 4),
        OperandSpec("q", "e4m3", ["M", "K"], 1, 16),
        OperandSpec("s", "f32", ["M", "KB"], 0, 16),
    ], GridRule(kind="blocks", blocks=["min(ceil_div(M, 8) * ceil_div(K, 512), max_active_clusters)", "1", "1"]),
        (1, 1, 1), pdl=False, cooperative=False)
    return m


def _manifest(name, op, params, operands, grid, cluster, pdl, cooperative) -> KernelManifest:
    return KernelManifest(
        name=name, op=op, arch="sm_90a", entry=f"{name}_entry", cubin="kernel.cubin",
        sha256=hashlib.sha256(FAKE_CUBIN).hexdigest(), block=(256, 1, 1), cluster=cluster,
        smem_bytes=100000, pdl=pdl, cooperative=cooperative, grid=grid, operands=operands,
        params=params, schedule={"consumer_regs": 232, "producer_regs": 40},
        toolchain={"cutegen": "test", "nvidia-cutlass-dsl": "test"}, registers=128,
    )


SASS_OK = {"mma": {"HGMMA": 8}, "mma_shapes": {}, "local_loads": 0, "local_stores": 0, "registers": 168,
           "stack_bytes": 0, "static_smem_bytes": 1024, "instructions": 900}


def write_kernel(build: Path, m: KernelManifest, cubin: bytes = FAKE_CUBIN, sass: dict | None = None) -> None:
    d = build / m.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.cubin").write_bytes(cubin)
    (d / "manifest.json").write_text(m.to_json())
    (d / "kernel.h").write_text(render_header(m))
    (d / "sass.txt").write_text("SASS summary\n")
    (d / "sass_summary.json").write_text(json.dumps(sass if sass is not None else SASS_OK))


@pytest.fixture()
def synthetic_build(tmp_path) -> Path:
    build = tmp_path / "build"
    for m in (gemm_like_manifest(), gemm_like_manifest("cutegen_test_gemm_like_c1", cluster_m=1),
              all_bindings_manifest(), blocks_tensor_manifest()):
        write_kernel(build, m)
    write_catalogue(build)
    return build


@pytest.fixture(scope="module")
def real_build(tmp_path_factory) -> Path:
    pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")
    from cutegen.gen.build import build_schedules
    from cutegen.schedules import default_schedules, procedural_name

    root = tmp_path_factory.mktemp("real")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(root / "cache"))
    try:
        schedules = [s for s in default_schedules() if procedural_name(s) in REPRESENTATIVE]
        assert len(schedules) == len(REPRESENTATIVE)
        report = build_schedules(schedules, root / "build", jobs=2, progress=False)
        assert report.ok, report.summary()
    finally:
        mp.undo()
    return root / "build"


@pytest.fixture(scope="module")
def real_export(real_build, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "kernels"
    export_kernels(real_build, list(REPRESENTATIVE), out)
    return out


# ---- the export folder -------------------------------------------------------------------------


def test_export_folder_contents(real_build, real_export):
    out = real_export
    for name in REPRESENTATIVE:
        for f in ("kernel.cubin", "manifest.json", "kernel.h", "launcher.c", "sass.txt", "sass_summary.json"):
            assert (out / name / f).is_file(), f
        assert (out / name / "kernel.cubin").read_bytes() == (real_build / name / "kernel.cubin").read_bytes()
        assert (out / name / "kernel.h").read_text() == (real_build / name / "kernel.h").read_text()
        assert not (out / name / "kernel.ptx").exists()
    for f in ("catalogue.json", "cutegen_launcher.h", "cutegen_launcher.c", "cutegen_kernels.h",
              "cutegen_kernels.c", "cutegen_bf16_gemm_nt.c", "cutegen.cmake", "cutegen.mk", "README.md",
              EXPORT_MARKER):
        assert (out / f).is_file(), f
    # The export is a build folder for the Python runtime too (catalogue, manifests, sha256).
    cat = KernelCatalogue.open(out)
    assert sorted(cat.names()) == sorted(REPRESENTATIVE)
    for name in REPRESENTATIVE:
        assert cat.read_cubin(name) == (out / name / "kernel.cubin").read_bytes()
    readme = (out / "README.md").read_text()
    for word in ("cutegen_bf16_gemm_nt_launch", "cutegen_kernel_load", "cutegen.cmake", "cutegen_last_error",
                 "CUTEGEN_CUDA_INCLUDE_DIR", *REPRESENTATIVE):
        assert word in readme, word
    cmake = (out / "cutegen.cmake").read_text()
    assert "CUDA::cuda_driver" in cmake and "cutegen::kernels" in cmake
    for name in REPRESENTATIVE:
        assert f"{name}/launcher.c" in cmake and f"{name}/launcher.c" in (out / "cutegen.mk").read_text()
    header = (out / "cutegen_kernels.h").read_text()
    for name in REPRESENTATIVE:
        assert (
            f"CUresult {name}_launch(const cutegen_kernel* kernel, CUdeviceptr a, int64_t lda, CUdeviceptr b, "
            "int64_t ldb, CUdeviceptr d, int64_t ldd, int32_t M, int32_t N, int32_t K, CUstream stream);"
        ) in header
    # Nothing but cuda.h and the C library is included by the generated C.
    for path in [*out.glob("*.[ch]"), *out.glob("*/launcher.c")]:
        for line in path.read_text().splitlines():
            if line.startswith("#include"):
                inc = line.split()[1]
                assert inc in ('<cuda.h>', '<stddef.h>', '<stdint.h>', '<stdarg.h>', '<stdio.h>', '<stdlib.h>',
                               '<string.h>', '"cutegen_launcher.h"', '"cutegen_kernels.h"',
                               '"../cutegen_kernels.h"', '"kernel.h"'), (path, line)


def test_export_replaces_an_earlier_export_and_refuses_other_folders(synthetic_build, tmp_path):
    out = tmp_path / "out"
    first = export_kernels(synthetic_build, ["cutegen_test_gemm_like", "cutegen_test_all_bindings"], out)
    assert sorted(first.kernels) == ["cutegen_test_all_bindings", "cutegen_test_gemm_like"]
    assert first.skipped_dispatch == []
    second = export_kernels(synthetic_build, ["cutegen_test_gemm_like"], out)
    assert second.kernels == ["cutegen_test_gemm_like"]
    assert not (out / "cutegen_test_all_bindings").exists()
    assert json.loads((out / "catalogue.json").read_text())["kernels"][0]["name"] == "cutegen_test_gemm_like"
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not a cutegen export") as info:
        export_kernels(synthetic_build, ["cutegen_test_gemm_like"], other)
    assert info.value.usage and (other / "precious.txt").read_text() == "keep me"
    with pytest.raises(ExportError, match="must not be the build folder"):
        export_kernels(synthetic_build, ["cutegen_test_gemm_like"], synthetic_build)
    with pytest.raises(ExportError, match="not in"):
        export_kernels(synthetic_build, ["cutegen_nope"], tmp_path / "x")


def test_export_refuses_corrupt_and_unsupported_kernels(synthetic_build, tmp_path):
    (synthetic_build / "cutegen_test_gemm_like" / "kernel.cubin").write_bytes(b"tampered")
    with pytest.raises(ExportError, match="sha256") as info:
        export_kernels(synthetic_build, ["cutegen_test_gemm_like"], tmp_path / "a")
    assert not info.value.usage
    assert not (tmp_path / "a").exists()

    m = all_bindings_manifest()
    cases = [
        (7, {"kind": "scalar", "dtype": "f32", "expr": "K * 0.5"}, "float literal"),
        (4, {"kind": "scalar", "dtype": "i32", "expr": "M + stream"}, "'stream' is ambiguous or reserved"),
        (12, {"kind": "scalar", "dtype": "u32", "expr": "M"}, "not supported"),
    ]
    for index, binding, match in cases:
        params = list(m.params)
        p = params[index]
        params[index] = Param(p.index, p.name, p.offset, p.size, p.align, binding)
        bad = KernelManifest(**{**m.__dict__, "params": params})
        with pytest.raises(ExportError, match=match):
            kernel_view(bad)
    # A symbol no operand binds becomes an argument given by the caller (like the runtime's extents).
    params = list(m.params)
    params[4] = Param(4, "tiles", params[4].offset, 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "M + warps"})
    view = kernel_view(KernelManifest(**{**m.__dict__, "params": params}))
    assert [(a.ctype, a.name, a.kind) for a in view.args][-1] == ("int64_t", "warps", "scalar")
    bad_grid = KernelManifest(**{**m.__dict__, "grid": GridRule("persistent_clusters", 128, 64, 1, 1, "M", "Q")})
    with pytest.raises(ExportError, match="'Q'"):
        kernel_view(bad_grid)
    bad_name = KernelManifest(**{**m.__dict__, "operands": [*m.operands[:3], OperandSpec("kernel", "f32", ["N"], 0, 16)],
                                 "params": [p if p.binding.get("operand") != "bias" else
                                            Param(p.index, p.name, p.offset, p.size, p.align,
                                                  {"kind": "pointer", "operand": "kernel"}) for p in m.params]})
    with pytest.raises(ExportError, match="reserved"):
        kernel_view(bad_name)


def test_generated_c_is_strict_c11_and_cxx_clean(toolchain, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_gemm_like", "cutegen_test_gemm_like_c1",
                                     "cutegen_test_all_bindings"], out)
    for src in export_sources(out):
        obj = tmp_path / (src.parent.name + "_" + src.stem + ".o")
        compile_c(toolchain, obj, [src], [out], ["-c", "-Wconversion", "-Wno-sign-conversion"])
    # Two ops, one with two kernels of one signature: both dispatchers exist.
    assert (out / "cutegen_bf16_gemm_nt.c").is_file() and (out / "cutegen_test_op.c").is_file()
    if toolchain["cxx"]:
        src = tmp_path / "use.cpp"
        src.write_text('#include "cutegen_kernels.h"\nint main() { cutegen_launch_plan p; (void)p; '
                       "return cutegen_find_kernel(\"x\") == nullptr ? 0 : 1; }\n")
        proc = subprocess.run([toolchain["cxx"], "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                               f"-I{toolchain['include']}", f"-I{out}", str(src)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


# ---- expressions -------------------------------------------------------------------------------


EXPRESSIONS = ["M", "ceil_div(M, 128)", "M // 7", "M % 7", "-M // 3", "(-M) % 5", "ceil_div(-M, 4)",
               "min(M, N, 3)", "max(M, N - 200)", "M * N - K + 12", "-(M - N) // (K % 3 + 1)",
               "ceil_div(M, 128) * 2 - K % 7", "K // (N - N)"]


def test_c_expressions_have_python_semantics(toolchain, tmp_path):
    envs = [{"M": 1000, "N": 17, "K": 9}, {"M": 1, "N": 300, "K": 5}, {"M": -13, "N": 4, "K": -7}]
    exprs = [c_expr(e, ["M", "N", "K"]) for e in EXPRESSIONS]
    body = []
    for env in envs:
        body.append("{")
        body += [f"  const int64_t s_{k} = {v};" for k, v in env.items()]
        for text, code in zip(EXPRESSIONS, exprs):
            body.append(f'  {{ int bad = 0; int64_t v = {code}; printf("%s %lld %d\\n", {json.dumps(text)}, '
                        "(long long)v, bad); }")
        body.append("}")
    src = tmp_path / "expr.c"
    src.write_text('#include <stdio.h>\n#include "cutegen_launcher.h"\nint main(void) {\n' + "\n".join(body)
                   + "\nreturn 0; }\n")
    from cutegen.gen.export import render_files

    files = render_files([kernel_view(gemm_like_manifest(), len(FAKE_CUBIN))])
    (tmp_path / "cutegen_launcher.h").write_text(files["cutegen_launcher.h"])
    (tmp_path / "cutegen_launcher.c").write_text(files["cutegen_launcher.c"])
    exe = compile_c(toolchain, tmp_path / "expr", [src, tmp_path / "cutegen_launcher.c", STUB], [tmp_path],
                    ["-Wno-unused-variable"])
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    i = 0
    for env in envs:
        for text in EXPRESSIONS:
            got_text, value, bad = lines[i].rsplit(" ", 2)
            assert got_text == text
            try:
                want = evaluate(text, env)
            except InputError:
                assert bad == "1", text
            else:
                assert bad == "0" and int(value) == want, (text, env, value, want)
            i += 1


def test_sha256_in_c_matches_hashlib(toolchain, tmp_path):
    from cutegen.gen.export import render_files

    files = render_files([kernel_view(gemm_like_manifest(), len(FAKE_CUBIN))])
    (tmp_path / "cutegen_launcher.h").write_text(files["cutegen_launcher.h"])
    (tmp_path / "cutegen_launcher.c").write_text(files["cutegen_launcher.c"])
    lengths = [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 4096 + 17]
    src = tmp_path / "sha.c"
    src.write_text(textwrap.dedent("""\
        #include <stdio.h>
        #include <stdlib.h>
        #include "cutegen_launcher.h"
        int main(int argc, char** argv) {
          int i;
          for (i = 1; i < argc; i++) {
            size_t n = (size_t)strtoul(argv[i], NULL, 0), j;
            unsigned char* buf = malloc(n + 1);
            char hex[65];
            for (j = 0; j < n; j++) buf[j] = (unsigned char)(j * 7 + 3);
            cutegen__sha256_hex(buf, n, hex);
            printf("%s\\n", hex);
            free(buf);
          }
          return 0;
        }
        """))
    exe = compile_c(toolchain, tmp_path / "sha", [src, tmp_path / "cutegen_launcher.c", STUB], [tmp_path])
    out = subprocess.run([str(exe), *map(str, lengths)], capture_output=True, text=True, check=True).stdout.split()
    for n, got in zip(lengths, out):
        data = bytes((j * 7 + 3) & 0xFF for j in range(n))
        assert got == hashlib.sha256(data).hexdigest(), n


# ---- the ABI self-check ------------------------------------------------------------------------


def gemm_problems() -> list[dict[str, int]]:
    base = {"a": 0x10000, "b": 0x7000000, "d": 0x9000000}

    def p(m, n, k, lda=None, ldb=None, ldd=None, **kw):
        return {**base, "M": m, "N": n, "K": k, "lda": k if lda is None else lda,
                "ldb": k if ldb is None else ldb, "ldd": n if ldd is None else ldd, **kw}

    return [
        p(1000, 1024, 4096),
        p(4096, 7168, 2048, lda=2048 + 64, ldd=7168 + 8),
        p(1, 1536, 2048, lda=3),           # extent 1: the stride is replaced by a canonical one
        p(77, 1, 64, ldd=5),                # N = 1
        p(0, 1024, 4096),                   # empty output: nothing launched
        p(128, 0, 64),
        p(128, 256, 0),                     # K = 0: TMA refuses the extent
        p(128, 256, 64, a=0x10008),         # misaligned base address
        p(128, 256, 4100),                  # row stride not a multiple of 16 bytes
        p(-5, 256, 64),                     # negative extent
        p(70000, 5000, 8),                  # more cluster tiles than fit at once
        p(2147483647, 16, 8),               # the largest int32 extent
        p(300, 200, 100, lda=96),           # overlapping rows are legal, as in Python
    ]


@pytest.mark.parametrize("name", REPRESENTATIVE)
@pytest.mark.parametrize("mac", [66, 0, -1])
def test_c_launcher_abi_selfcheck_real_kernels(toolchain, real_export, name, mac, tmp_path_factory):
    manifest = KernelManifest.from_json((real_export / name / "manifest.json").read_text())
    work = tmp_path_factory.getbasetemp() / f"driver_{name[-60:]}"
    exe = work / "driver_kernel"
    if not exe.exists():
        build_driver(toolchain, real_export, name, work)
    view = kernel_view(manifest)
    problems = gemm_problems()
    args = [str(real_export)] + [x for pr in problems for x in problem_args(view, pr)]
    env = {"CUTEGEN_STUB_PARAMS": stub_params(manifest), "CUTEGEN_STUB_MAX_ACTIVE_CLUSTERS": str(mac),
           "CUTEGEN_STUB_SMS": "132"}
    rc, records = run_records(exe, args, env)
    assert rc == 0, records
    load = next(r for r in records if r["call"] == "load")
    assert load["result"] == 0, load
    loaded = next(r for r in records if r["call"] == "loaded")
    cluster = manifest.cluster[0] * manifest.cluster[1] * manifest.cluster[2]
    expected_mac = mac if mac > 0 else 132 // cluster  # the runtime's fallback
    assert loaded == {"call": "loaded", "sm_count": 132, "max_active_clusters": expected_mac}
    # Load: the entry, max dynamic smem, non-portable clusters, the occupancy query's config.
    (get,) = [r for r in records if r["call"] == "cuModuleGetFunction"]
    assert get["name"] == manifest.entry and get["module_ok"]
    attrs = [(r["attrib"], r["value"]) for r in records if r["call"] == "cuFuncSetAttribute"]
    assert (8, manifest.smem_bytes) in attrs  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert ((14, 1) in attrs) == (cluster > 1)  # NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    (occ,) = [r for r in records if r["call"] == "cuOccupancyMaxActiveClusters"]
    assert occ["grid"] == list(manifest.cluster) and occ["block"] == list(manifest.block)
    assert occ["smem"] == manifest.smem_bytes and occ["attrs"] == [{"id": 4, "cluster": list(manifest.cluster)}]
    segs = segments(records)
    assert len(segs) == len(problems)
    for problem, seg in zip(problems, segs):
        assert_matches_python(manifest, seg, problem, 132, expected_mac)
    assert any(r["call"] == "cuModuleUnload" for r in records)


# One kernel of every op the default schedules define, built for real: whatever ops and bindings
# the templates grow, their exported C launcher must pack exactly what the Python runtime packs.
# Every (arch, op) a template exists for; sm_100a launches run against a stub GPU of capability 10.0.
ARCH_OPS = sorted(
    {(a.value, o.value) for o, archs in OP_ARCHS.items() for a in archs}
    # Entry points of their own: the ops with an activation fused into their epilogue.
    | {(s.arch.value, s.entry) for s in default_schedules() if s.fused_epilogue}
)
STUB_CC = {"sm_90a": "90", "sm_100a": "100"}


@pytest.fixture(scope="module")
def per_op_export(tmp_path_factory) -> dict[str, Any]:
    pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")
    from cutegen.gen.build import build_schedules
    from cutegen.schedules import all_expanded, procedural_name

    chosen: dict[tuple[str, str], Any] = {}
    for e in all_expanded():
        if e.valid and e.schedule is not None:
            chosen.setdefault((e.schedule.arch.value, e.schedule.entry), e.schedule)
    root = tmp_path_factory.mktemp("per_op")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(root / "cache"))
    try:
        report = build_schedules(list(chosen.values()), root / "build", jobs=2, progress=False)
    finally:
        mp.undo()
    failed = {r.name: r.error for r in report.results if r.status == "failed"}
    names = {op: procedural_name(s) for op, s in chosen.items() if procedural_name(s) not in failed}
    export_kernels(root / "build", sorted(names.values()), root / "export")
    return {"export": root / "export", "names": names, "failed": failed, "ops": set(chosen)}


SIZES = [1000, 1536, 2048, 56, 12, 7, 3, 5, 9]


def packed_strides(shape: list[int], contiguous_mode: int, bits: int, pad: bool = True) -> list[int]:
    """Strides of a dense layout, the contiguous mode first; with ``pad``, its rows padded to 16
    bytes (FP4: 32, its TMA type's rule)."""
    rank = len(shape)
    order = [contiguous_mode if contiguous_mode >= 0 else rank - 1]
    order += [m for m in reversed(range(rank)) if m not in order]
    gran = max(1, (256 if bits == 4 else 128) // bits) if pad else 1
    strides, acc = [0] * rank, 1
    for i, m in enumerate(order):
        strides[m] = acc
        acc *= max(1, shape[m])
        if i == 0:
            acc = -(-acc // gran) * gran
    return strides


def generic_problems(manifest: KernelManifest) -> list[dict[str, Any]]:
    """A plain problem for any manifest, and variants: an extent of 1, of 0, a misaligned operand."""
    view = kernel_view(manifest)
    out = []
    for variant in ("plain", "one", "zero", "misaligned", "small"):
        ext = {e: SIZES[i % len(SIZES)] for i, e in enumerate(view.extents)}
        if variant == "one":
            ext[view.extents[0]] = 1
        elif variant == "zero":
            ext[view.extents[0]] = 0
        elif variant == "small":
            ext = {e: 8 * (i + 1) for i, e in enumerate(view.extents)}
        scalars = {a.name: 0.0001 if a.ctype == "float" else 3 for a in view.args if a.kind == "scalar"}
        satisfy_requirements(manifest, ext, scalars)
        out.append(problem_of(manifest, ext, scalars, misaligned=variant == "misaligned"))
    return out


def problem_of(manifest: KernelManifest, ext: dict[str, int], scalars: dict[str, Any], misaligned: bool = False) -> dict:
    """Extents, scalars, addresses and strides of operands laid out packed (rows padded to 16
    bytes unless the kernel reads the operand as a packed array)."""
    from cutegen.runtime.params import DTYPE_BITS

    problem: dict[str, Any] = dict(ext)
    for i, spec in enumerate(manifest.operands):
        problem[spec.name] = 0x10000000 * (i + 1) + (8 if misaligned and i == 0 else 0)
        shape = [int(s) if str(s).isdigit() else ext[s] for s in spec.shape]
        strides = packed_strides(shape, spec.contiguous_mode, DTYPE_BITS[spec.dtype], pad=not spec.packed)
        for mode in range(len(shape)):
            if mode != spec.contiguous_mode:
                problem[_stride_arg_name(spec.name, len(shape), mode, spec.contiguous_mode)] = strides[mode]
    problem.update(scalars)
    return problem


def satisfy_requirements(manifest: KernelManifest, ext: dict[str, int], scalars: dict[str, Any]) -> None:
    """Set the extents the manifest's ``requires`` constrain to the least values that satisfy them."""
    for r in manifest.requires:
        bound = evaluate(r.expr, {**ext, **scalars, "sm_count": 132, "max_active_clusters": 66})
        if r.relation == "==" or ext[r.symbol] < bound:
            ext[r.symbol] = bound


def launch_op_kernel(toolchain, per_op_export, arch_op, tmp_path, make_problems):
    """Run the exported C launcher of the (arch, op) kernel of `per_op_export` on each problem of
    ``make_problems(manifest)`` against the recording driver stub: (manifest, problems, records)."""
    name = per_op_export["names"][arch_op]
    out = per_op_export["export"]
    manifest = KernelManifest.from_json((out / name / "manifest.json").read_text())
    exe = build_driver(toolchain, out, name, tmp_path)
    view = kernel_view(manifest)
    problems = make_problems(manifest)
    args = [str(out)] + [x for pr in problems for x in problem_args(view, pr)]
    rc, records = run_records(
        exe, args, {"CUTEGEN_STUB_PARAMS": stub_params(manifest), "CUTEGEN_STUB_CC": STUB_CC[arch_op[0]]}
    )
    assert rc == 0, records
    return manifest, problems, records


@pytest.mark.slow  # per_op_export compiles one kernel of every (arch, op)
@pytest.mark.parametrize("arch_op", ARCH_OPS, ids="/".join)
def test_c_launcher_abi_selfcheck_one_kernel_per_op(toolchain, per_op_export, arch_op, tmp_path):
    if arch_op not in per_op_export["ops"]:
        pytest.skip(f"no valid default schedule of {arch_op}")
    if arch_op not in per_op_export["names"]:
        pytest.fail(f"the {arch_op} kernel failed to build: {per_op_export['failed']}")
    manifest, problems, records = launch_op_kernel(toolchain, per_op_export, arch_op, tmp_path, generic_problems)
    segs = segments(records)
    assert len(segs) == len(problems)
    kinds = []
    for problem, seg in zip(problems, segs):
        kinds.append(python_reference(manifest, problem, 132, 66)["kind"])
        assert_matches_python(manifest, seg, problem, 132, 66)
    assert kinds[0] == "launch" and kinds[3] == "error", kinds


def build_and_export_one(tmp_path_factory, stem: str, name: str) -> tuple[Path, KernelManifest]:
    """Compile one kernel in a cache of its own and export it: (the folder holding build/ and
    export/, its exported manifest)."""
    pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")
    from cutegen.gen.build import build_schedules
    from cutegen.schedules import parse_name

    root = tmp_path_factory.mktemp(stem)
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(root / "cache"))
    try:
        report = build_schedules([parse_name(name)], root / "build", jobs=1, progress=False)
    finally:
        mp.undo()
    assert report.ok, report.summary()
    export_kernels(root / "build", [name], root / "export")
    return root, KernelManifest.from_json((root / "export" / name / "manifest.json").read_text())


FP4_KERNEL = "cutegen_sm100a_fp8gemm_e4m3_e2m1_bf16_f32_sfmx_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rm_g8"


@pytest.mark.slow  # compiles the kernel
def test_c_launcher_abi_selfcheck_fp4_operand(toolchain, tmp_path_factory, tmp_path):
    """The FP8 x FP4 kernel through the C launcher: FP4 B's extents and strides are counted in
    elements and its descriptor has the 16U4_ALIGN16B type (14), as in Python; what that type
    cannot load (K not a multiple of 128, a row stride off 32 bytes, a base off 32 bytes) is
    refused by both."""
    root, manifest = build_and_export_one(tmp_path_factory, "fp4", FP4_KERNEL)
    assert manifest.operand("b").dtype == "e2m1" and manifest.operand("b").align_bytes == 32
    view = kernel_view(manifest)
    exe = build_driver(toolchain, root / "export", FP4_KERNEL, tmp_path)

    def problem(m, n, k, **change):
        ext = {"M": m, "N": n, "K": k, "SA": 0, "SB": 0}
        satisfy_requirements(manifest, ext, {})
        return {**problem_of(manifest, ext, {}), **change}

    plain = problem(1000, 776, 640)
    stride_b = _stride_arg_name("b", 2, 0, 1)
    assert plain[stride_b] == 640
    problems = [
        plain,
        {**plain, stride_b: 640 + 64},  # rows padded by 32 bytes
        problem(1, 128, 128),
        problem(300, 256, 576),  # K not a whole number of 128-element FP4 rows
        {**plain, stride_b: 640 + 16},  # a row stride of 328 bytes
        {**plain, "b": plain["b"] + 16},  # a base 16 bytes off 32
    ]
    args = [str(root / "export")] + [x for pr in problems for x in problem_args(view, pr)]
    rc, records = run_records(exe, args, {"CUTEGEN_STUB_PARAMS": stub_params(manifest), "CUTEGEN_STUB_CC": STUB_CC["sm_100a"]})
    assert rc == 0, records
    segs = segments(records)
    assert len(segs) == len(problems)
    kinds = [python_reference(manifest, pr, 132, 66)["kind"] for pr in problems]
    assert kinds == ["launch"] * 3 + ["error"] * 3, kinds
    for pr, seg in zip(problems, segs):
        assert_matches_python(manifest, seg, pr, 132, 66)
    encodes = [r for r in segs[0] if r["call"] == "cuTensorMapEncodeTiled"]
    assert [r["dtype"] for r in encodes] == [0, 14, 9]  # e4m3 (as u8), FP4 unpacked, bf16
    assert encodes[1]["dims"] == [640, 776] and encodes[1]["strides"] == [320]


MN_MAJOR_KERNEL = "cutegen_sm90a_gemm_bf16_bf16_f32_f32_nosf_128x128x64_c2x1_mcb_s6_wg2_r40x232_epiadd_rm_g8_tn"


@pytest.mark.slow  # compiles the kernel
def test_c_launcher_abi_selfcheck_mn_major_operands(toolchain, tmp_path_factory, tmp_path):
    """A kernel reading A and B MN-major (layout tn) through the C launcher: each operand's stride
    argument is the one between its K columns and its descriptor runs along M (N) first, as in
    Python, for the generic problems (plain, an extent of 1 and of 0, misaligned, small)."""
    root, manifest = build_and_export_one(tmp_path_factory, "mn_major", MN_MAJOR_KERNEL)
    assert manifest.operand("a").contiguous_mode == 0 and manifest.operand("b").contiguous_mode == 0
    view = kernel_view(manifest)
    exe = build_driver(toolchain, root / "export", MN_MAJOR_KERNEL, tmp_path)
    problems = generic_problems(manifest)
    args = [str(root / "export")] + [x for pr in problems for x in problem_args(view, pr)]
    rc, records = run_records(exe, args, {"CUTEGEN_STUB_PARAMS": stub_params(manifest), "CUTEGEN_STUB_CC": STUB_CC["sm_90a"]})
    assert rc == 0, records
    segs = segments(records)
    kinds = [python_reference(manifest, pr, 132, 66)["kind"] for pr in problems]
    assert kinds[0] == "launch" and kinds[3] == "error", kinds
    for pr, seg in zip(problems, segs):
        assert_matches_python(manifest, seg, pr, 132, 66)
    encodes = [r for r in segs[0] if r["call"] == "cuTensorMapEncodeTiled"]
    m, n, k = problems[0]["M"], problems[0]["N"], problems[0]["K"]
    assert encodes[0]["dims"] == [m, k] and encodes[1]["dims"] == [n, k]  # M, N contiguous


def faulty_problems(manifest: KernelManifest) -> list[tuple[str, str, dict[str, Any]]]:
    """(what, a phrase of the expected error, problem): the plain problem with one fault each: every
    requirement broken, every operand NULL, a negative stride, a packed operand's stride padded, a
    written operand whose rows overlap, a float scalar out of range (NaN)."""
    from cutegen.runtime.params import DTYPE_BYTES

    view = kernel_view(manifest)
    plain = generic_problems(manifest)[0]
    extents = {e: plain[e] for e in view.extents}
    scalars = {a.name: plain[a.name] for a in view.args if a.kind == "scalar"}
    out = []
    for r in manifest.requires:
        bound = evaluate(r.expr, {**plain, "sm_count": 132, "max_active_clusters": 66})
        broken = {**extents, r.symbol: bound + 1 if r.relation == "==" else bound - 1}
        out.append((f"requires {r}", f"extent {r.symbol} must be", problem_of(manifest, broken, scalars)))
    for spec in manifest.operands:
        out.append((f"{spec.name} NULL", "NULL", {**plain, spec.name: 0}))
        rank = len(spec.shape)
        extent = [int(x) if str(x).isdigit() else plain[x] for x in spec.shape]
        for mode in range(rank):
            if mode == spec.contiguous_mode or extent[mode] <= 1:
                continue
            arg = _stride_arg_name(spec.name, rank, mode, spec.contiguous_mode)
            out.append((f"{arg} negative", "negative", {**plain, arg: -plain[arg]}))
            if spec.packed:
                step = max(1, spec.align_bytes // DTYPE_BYTES[spec.dtype])
                out.append((f"{arg} not packed", "packed", {**plain, arg: plain[arg] + step}))
            if spec.written and spec.contiguous_mode >= 0 and extent[spec.contiguous_mode] > 1:
                # A row stride under the row's width, still a multiple of the alignment.
                step = max(1, spec.align_bytes // DTYPE_BYTES[spec.dtype])
                width = extent[spec.contiguous_mode]
                if width > step:
                    out.append((f"{arg} under the width", "share memory", {**plain, arg: (width - 1) // step * step}))
    for p in manifest.params:
        if p.binding["kind"] == "scalar" and "range" in p.binding:
            out.append((f"{p.binding['expr']} NaN", "must be in", {**plain, p.binding["expr"]: "nan"}))
    return out


@pytest.mark.slow  # per_op_export compiles one kernel of every (arch, op)
@pytest.mark.parametrize("arch_op", ARCH_OPS, ids="/".join)
def test_c_launcher_refuses_what_the_python_runtime_refuses(toolchain, per_op_export, arch_op, tmp_path):
    """Each fault of `faulty_problems`, on one real kernel of every op: the C launcher returns
    CUDA_ERROR_INVALID_VALUE with a message naming it and launches nothing; the Python runtime
    refuses the same problem."""
    if arch_op not in per_op_export["names"]:
        pytest.skip(f"no built kernel of {arch_op}")
    faults: list = []

    def problems(manifest: KernelManifest) -> list[dict]:
        faults.extend(faulty_problems(manifest))
        return [problem for _, _, problem in faults]

    manifest, _, records = launch_op_kernel(toolchain, per_op_export, arch_op, tmp_path, problems)
    assert faults
    results = [r for r in records if r["call"] == "launch" and "result" in r]
    assert not any(r["call"] == "cuLaunchKernelEx" for r in records), "a faulty problem was launched"
    assert len(results) == len(faults)
    for (what, phrase, problem), result in zip(faults, results):
        assert result["result"] == CUDA_INVALID_VALUE and phrase in result["error"], (what, result)
        if "NaN" not in what:  # the Python reference takes scalars as numbers
            assert python_reference(manifest, problem, 132, 66)["kind"] == "error", what


def test_c_launcher_abi_selfcheck_every_binding_kind(toolchain, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_all_bindings"], out)
    manifest = all_bindings_manifest()
    exe = build_driver(toolchain, out, manifest.name, tmp_path / "w")
    view = kernel_view(manifest)
    assert [a.name for a in view.args] == ["x", "x_stride0", "x_stride2", "w", "ldw", "out", "ldout", "bias",
                                           "M", "N", "K", "L"]
    base = {"x": 0x100000, "w": 0x200000, "out": 0x300000, "bias": 0x400000}
    problems = [
        {**base, "M": 1000, "N": 520, "K": 64, "L": 3, "x_stride0": 64, "x_stride2": 64000, "ldw": 64, "ldout": 520},
        {**base, "M": 5, "N": 40, "K": 16, "L": 1, "x_stride0": 24, "x_stride2": 7, "ldw": 16, "ldout": 44},
        {**base, "M": 300, "N": 64, "K": 1000, "L": 2, "x_stride0": 1000, "x_stride2": 300000, "ldw": 1000,
         "ldout": 64, "bias": 0x400004},   # misaligned pointer operand
        {**base, "M": 0, "N": 64, "K": 8, "L": 2, "x_stride0": 8, "x_stride2": 8, "ldw": 8, "ldout": 64},
        {**base, "M": 64, "N": 64, "K": 8, "L": 0, "x_stride0": 8, "x_stride2": 512, "ldw": 8, "ldout": 64},
    ]
    args = [str(out)] + [x for pr in problems for x in problem_args(view, pr)]
    rc, records = run_records(exe, args, {"CUTEGEN_STUB_PARAMS": stub_params(manifest),
                                          "CUTEGEN_STUB_MAX_ACTIVE_CLUSTERS": "7", "CUTEGEN_STUB_SMS": "100"})
    assert rc == 0, records
    segs = segments(records)
    assert len(segs) == len(problems)
    kinds = []
    for problem, seg in zip(problems, segs):
        kinds.append(python_reference(manifest, problem, 100, 7)["kind"])
        assert_matches_python(manifest, seg, problem, 100, 7)
    assert kinds == ["launch", "launch", "error", "skip", "error"]


def test_c_launcher_abi_selfcheck_blocks_grid_and_tensor_structs(toolchain, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_blocks_tensor"], out)
    manifest = blocks_tensor_manifest()
    exe = build_driver(toolchain, out, manifest.name, tmp_path / "w")
    view = kernel_view(manifest)
    assert [a.name for a in view.args] == ["x", "x_stride0", "x_stride1", "q", "ldq", "s", "lds", "M", "K", "KB"]
    base = {"x": 0x100000, "q": 0x200000, "s": 0x300000}
    problems = [
        {**base, "M": 4096, "K": 7168, "KB": 56, "x_stride0": 7168, "x_stride1": 1, "ldq": 7168, "lds": 4096},
        {**base, "M": 64, "K": 512, "KB": 4, "x_stride0": 4, "x_stride1": 256, "ldq": 512, "lds": 64},  # transposed x
        {**base, "M": 1, "K": 128, "KB": 1, "x_stride0": 3, "x_stride1": 1, "ldq": 5, "lds": 7},  # extent-1 modes
        {**base, "M": 0, "K": 128, "KB": 1, "x_stride0": 128, "x_stride1": 1, "ldq": 128, "lds": 4},  # grid 0: skip
        {**base, "M": 64, "K": 512, "KB": 4, "x_stride0": 3, "x_stride1": 1, "ldq": 512, "lds": 64,
         "x": 0x100002},  # misaligned
        {**base, "M": 64, "K": 512, "KB": 4, "x_stride0": 512, "x_stride1": 1, "ldq": 512, "lds": 64,
         "q": 0x200008},
    ]
    args = [str(out)] + [x for pr in problems for x in problem_args(view, pr)]
    rc, records = run_records(exe, args, {"CUTEGEN_STUB_PARAMS": stub_params(manifest),
                                          "CUTEGEN_STUB_MAX_ACTIVE_CLUSTERS": "264"})
    assert rc == 0, records
    segs = segments(records)
    kinds = []
    for problem, seg in zip(problems, segs):
        kinds.append(python_reference(manifest, problem, 132, 264)["kind"])
        assert_matches_python(manifest, seg, problem, 132, 264)
    assert kinds == ["launch", "launch", "launch", "skip", "error", "error"]


def test_op_dispatch_and_kernel_identity(toolchain, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_gemm_like", "cutegen_test_gemm_like_c1"], out)
    m = gemm_like_manifest()
    exe = build_driver(toolchain, out, m.name, tmp_path / "w", use_op=True)
    view = kernel_view(m)
    problem = gemm_problems()[0]
    rc, records = run_records(exe, [str(out), *problem_args(view, problem)], {"CUTEGEN_STUB_PARAMS": stub_params(m)})
    assert rc == 0
    (seg,) = segments(records)
    assert_matches_python(m, seg, problem, 132, 66)
    # A kernel's own launcher refuses a kernel loaded from another cubin.
    src = tmp_path / "mix.c"
    src.write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        #include "cutegen_kernels.h"
        int main(int argc, char** argv) {{
          cutegen_kernel k;
          cutegen_launch_plan plan;
          CUresult r;
          (void)argc;
          if (cutegen_kernel_load(&k, cutegen_find_kernel("cutegen_test_gemm_like_c1"), argv[1])) return 3;
          r = cutegen_test_gemm_like_prepare(&k, 0x1000, 64, 0x2000, 64, 0x3000, 64, 64, 64, 64, &plan);
          printf("%d %s\\n", (int)r, cutegen_last_error());
          r = cutegen_launch(&k, &plan, NULL);
          printf("%d %s\\n", (int)r, cutegen_last_error());
          r = cutegen_bf16_gemm_nt_prepare(&k, 0x1000, 64, 0x2000, 64, 0x3000, 64, 64, 64, 64, &plan);
          printf("%d grid %u %u %u\\n", (int)r, plan.grid[0], plan.grid[1], plan.grid[2]);
          printf("%d\\n", cutegen_find_kernel("nope") == NULL && CUTEGEN_NUM_KERNELS == 2);
          return 0;
        }}
        """))
    exe = compile_c(toolchain, tmp_path / "mix", [src, *export_sources(out), STUB], [out])
    lines = subprocess.run([str(exe), str(out)], capture_output=True, text=True, check=True,
                           env={**os.environ, "CUTEGEN_STUB_LOG": str(tmp_path / "log")}).stdout.splitlines()
    assert lines[0].startswith("400 ") and "cutegen_test_gemm_like_c1" in lines[0]  # CUDA_ERROR_INVALID_HANDLE
    assert lines[1].startswith(f"{CUDA_INVALID_VALUE} ") and "not prepared" in lines[1]
    assert lines[2] == "0 grid 1 1 1"
    assert lines[3] == "1"


def test_load_errors_are_clear(toolchain, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_gemm_like"], out)
    m = gemm_like_manifest()
    exe = build_driver(toolchain, out, m.name, tmp_path / "w")
    good = {"CUTEGEN_STUB_PARAMS": stub_params(m)}

    def load(env, folder=out):
        rc, records = run_records(exe, [str(folder)], env)
        return next(r for r in records if r["call"] == "load")

    assert load(good)["result"] == 0
    assert load({})["result"] == 0  # a driver without cuFuncGetParamInfo: the layout is trusted
    r = load({**good, "CUTEGEN_STUB_CC": "80"})
    assert r["result"] == CUDA_NO_BINARY_FOR_GPU and "sm_90a" in r["error"] and "sm_80" in r["error"]
    r = load({**good, "CUTEGEN_STUB_CC": "100"})
    assert r["result"] == CUDA_NO_BINARY_FOR_GPU and "sm_100" in r["error"]
    r = load({**good, "CUTEGEN_STUB_SMEM_OPTIN": "99999"})
    assert r["result"] == CUDA_INVALID_VALUE and "100000 bytes" in r["error"]
    r = load({**good, "CUTEGEN_STUB_NO_CONTEXT": "1"})
    assert r["result"] == CUDA_INVALID_CONTEXT and "no current CUDA context" in r["error"]
    r = load({**good, "CUTEGEN_STUB_LOAD_FAIL": "1"})
    assert r["result"] == CUDA_NO_BINARY_FOR_GPU and "cuModuleLoadData" in r["error"]
    bad_size = ",".join(f"{p.offset + 48}:{p.size + (i == 3)}" for i, p in enumerate(m.params))
    r = load({"CUTEGEN_STUB_PARAMS": bad_size})
    assert r["result"] == CUDA_INVALID_IMAGE and "param 3" in r["error"]
    r = load({"CUTEGEN_STUB_PARAMS": stub_params(m).rsplit(",", 1)[0]})
    assert r["result"] == CUDA_INVALID_IMAGE and "5 parameters but the manifest declares 6" in r["error"]
    r = load(good, folder=tmp_path / "missing")
    assert r["result"] == CUDA_FILE_NOT_FOUND and "cannot open the cubin" in r["error"]
    cubin = out / m.name / "kernel.cubin"
    cubin.write_bytes(FAKE_CUBIN[:-1] + b"!")
    r = load(good)
    assert r["result"] == CUDA_INVALID_IMAGE and "sha256" in r["error"]
    cubin.write_bytes(FAKE_CUBIN + b"!")
    r = load(good)
    assert r["result"] == CUDA_INVALID_IMAGE and "bytes" in r["error"]


def test_loading_an_image_of_unstated_size_still_checks_its_sha256(toolchain, synthetic_build, tmp_path):
    """cutegen_kernel_load_data(size = 0) takes the manifest's size and checks the sha256 as ever."""
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_gemm_like"], out)
    m = gemm_like_manifest()
    src = tmp_path / "load_data.c"
    src.write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        #include <string.h>
        #include "cutegen_kernels.h"
        int main(int argc, char** argv) {{
          static const unsigned char image[] = {{{", ".join(str(c) for c in FAKE_CUBIN)}}};
          unsigned char copy[sizeof image];
          cutegen_kernel k;
          CUresult r;
          (void)argv;
          memcpy(copy, image, sizeof image);
          if (argc > 1) copy[3] ^= 1;  /* one bit flipped */
          r = cutegen_kernel_load_data(&k, &{m.name}_info, copy, 0);
          printf("%d %s\\n", (int)r, cutegen_last_error());
          if (r == CUDA_SUCCESS) cutegen_kernel_unload(&k);
          return 0;
        }}
        """))
    exe = compile_c(toolchain, tmp_path / "load_data", [src, *export_sources(out), STUB], [out])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTEGEN_STUB_")}
    env["CUTEGEN_STUB_PARAMS"] = stub_params(m)
    def last_line(*args: str) -> str:  # the stub prints its records before it
        run = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, check=True)
        return next(line for line in run.stdout.splitlines() if not line.startswith("{"))

    good = last_line()
    assert good.startswith("0 "), good
    bad = last_line("flip")
    assert bad.startswith(f"{CUDA_INVALID_IMAGE} ") and "sha256" in bad, bad


# ---- build systems and the example -------------------------------------------------------------


def _stub_archive(toolchain, tmp_path: Path) -> Path:
    obj = compile_c(toolchain, tmp_path / "stub.o", [STUB], [], ["-c"])
    lib = tmp_path / "libcuda_stub.a"
    subprocess.run(["ar", "rcs", str(lib), str(obj)], check=True)
    return lib


def test_cmake_snippet_builds_a_library(toolchain, synthetic_build, tmp_path):
    if toolchain["cmake"] is None:
        pytest.skip("cmake is not installed")
    out = tmp_path / "exp"
    export_kernels(synthetic_build, ["cutegen_test_gemm_like", "cutegen_test_all_bindings"], out)
    lib = _stub_archive(toolchain, tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.18)
        project(use_cutegen C)
        include("{out}/cutegen.cmake")
        add_executable(use main.c)
        target_link_libraries(use PRIVATE cutegen::kernels)
        """))
    (proj / "main.c").write_text(textwrap.dedent("""\
        #include <stdio.h>
        #include "cutegen_kernels.h"
        int main(void) {
          cutegen_kernel k;
          CUresult r = cutegen_kernel_load(&k, &cutegen_test_gemm_like_info, NULL); /* CUTEGEN_EXPORT_DIR */
          printf("load %d %s\\n", (int)r, cutegen_last_error());
          return r == CUDA_SUCCESS ? 0 : 1;
        }
        """))
    bdir = tmp_path / "b"
    cfg = subprocess.run([toolchain["cmake"], "-S", str(proj), "-B", str(bdir), f"-DCMAKE_C_COMPILER={toolchain['cc']}",
                          f"-DCUTEGEN_CUDA_INCLUDE_DIR={toolchain['include']}", f"-DCUTEGEN_CUDA_LIBRARY={lib}"],
                         capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    bld = subprocess.run([toolchain["cmake"], "--build", str(bdir)], capture_output=True, text=True)
    assert bld.returncode == 0, bld.stdout + bld.stderr
    run = subprocess.run([str(bdir / "use")], capture_output=True, text=True,
                         env={**os.environ, "CUTEGEN_STUB_LOG": str(tmp_path / "log")})
    assert run.returncode == 0 and "load 0" in run.stdout, run.stdout + run.stderr


def test_c_launcher_example_builds_and_checks_its_result(toolchain, real_export, tmp_path):
    """examples/c_launcher compiles and links against the stub driver; run there, the kernel does
    nothing, so the example must report the wrong result and fail (exit 1), not pass."""
    if toolchain["make"] is None:
        pytest.skip("make is not installed")
    obj = compile_c(toolchain, tmp_path / "stub.o", [STUB], [], ["-c"])
    out = tmp_path / "bin"
    proc = subprocess.run(
        [toolchain["make"], "-C", str(EXAMPLE), f"EXPORT_DIR={real_export}", f"CUDA_INCLUDE={toolchain['include']}",
         f"CUDA_LIBS={obj}", f"OUT={out}", f"CC={toolchain['cc']}", "EXTRA_CFLAGS=-Werror"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exe = out / "c_launcher"
    assert exe.is_file()
    env = {**os.environ, "CUTEGEN_STUB_LOG": str(tmp_path / "log"),
           "CUTEGEN_STUB_PARAMS": stub_params(KernelManifest.from_json(
               (real_export / REPRESENTATIVE[0] / "manifest.json").read_text()))}
    run = subprocess.run([str(exe), str(real_export), REPRESENTATIVE[0], "300", "256", "128"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "max abs error" in run.stdout and "FAIL" in run.stdout
    # The stub runs no kernel: every checked element (16 rows x 256) is still the NaN poison.
    assert "4096 mismatches (4096 unwritten)" in run.stdout, run.stdout
    run = subprocess.run([str(exe), str(real_export)], capture_output=True, text=True,
                         env={**env, "CUTEGEN_STUB_NO_DEVICE": "1"}, timeout=60)
    assert run.returncode == 2 and "cuInit" in run.stderr
    run = subprocess.run([str(exe), str(real_export), "cutegen_no_such_kernel"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode == 2 and "cutegen_no_such_kernel" in run.stderr


# ---- verify ------------------------------------------------------------------------------------


def test_verify_real_kernels_pass(real_build):
    for name in REPRESENTATIVE:
        verdict = verify_kernel(real_build / name)
        assert verdict.ok, verdict.to_dict()
        assert [c.name for c in verdict.checks] == [
            "mma", "wgmma_pipeline", "local_memory", "stack", "registers", "smem", "cubin"]


def test_verify_expected_mma_table():
    assert EXPECTED_MMA[("sm_90a", "bf16_gemm_nt")] == "HGMMA"
    assert EXPECTED_MMA[("sm_90a", "fp8_gemm_nt")] == "QGMMA"
    assert EXPECTED_MMA[("sm_100a", "fp8_gemm_nt")] == "UTCQMMA"
    assert EXPECTED_MMA[("sm_100a", "bf16_gemm_nt")] == "UTCHMMA"


@pytest.mark.parametrize(
    "sass, manifest_change, check, words",
    [
        ({"mma": {"HMMA": 4}}, {}, "mma", ["expected HGMMA", "HMMA x4"]),
        ({"local_loads": 3, "local_stores": 1}, {}, "local_memory", ["LDL 3", "STL 1"]),
        ({"stack_bytes": 16}, {}, "stack", ["16 bytes"]),
        ({"registers": 200}, {"block": (384, 1, 1)}, "registers", ["200 registers x 384 threads"]),
        ({}, {"schedule": {"consumer_regs": 264}}, "registers", ["consumer_regs=264"]),
        ({"static_smem_bytes": 2048}, {"smem_bytes": 231424}, "smem", ["231424 dynamic + 2048 static"]),
        ({}, {"op": "mystery_op"}, "mma", ["no expected MMA opcode", "EXPECTED_MMA"]),
        ({"wgmma_waits": {"0": 17}}, {"facts": {"wgmma_accumulators": 2}}, "wgmma_pipeline", ["serialised", "need 1"]),
        ({"wgmma_waits": {"0": 5, "1": 4}}, {"facts": {"wgmma_accumulators": 4}}, "wgmma_pipeline", ["leaves 1", "need 3"]),
        ({}, {"facts": {"wgmma_accumulators": 2}}, "wgmma_pipeline", ["does not count the WGMMA waits"]),
    ],
)
def test_verify_detects_each_failure(tmp_path, sass, manifest_change, check, words):
    m = KernelManifest(**{**gemm_like_manifest().__dict__, **manifest_change})
    write_kernel(tmp_path, m, sass={**SASS_OK, **sass})
    verdict = verify_kernel(tmp_path / m.name)
    bad = verdict.failures()
    assert [c.name for c in bad] == [check], verdict.to_dict()
    for w in words:
        assert w in bad[0].detail


def test_verify_corrupt_cubin_and_missing_summary(tmp_path):
    m = gemm_like_manifest()
    write_kernel(tmp_path, m, cubin=b"other bytes")
    assert [c.name for c in verify_kernel(tmp_path / m.name).failures()] == ["cubin"]
    (tmp_path / m.name / "sass_summary.json").unlink()
    verdict = verify_kernel(tmp_path / m.name)
    assert not verdict.ok and "rebuild" in verdict.checks[0].detail


# ---- the command line --------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_export(capsys, synthetic_build, tmp_path):
    out = tmp_path / "exp"
    rc, stdout, err = run_cli(capsys, "export", "gemm_like", "-o", str(out), "--build-dir", str(synthetic_build))
    assert rc == 0, err
    assert "exported 2 kernel(s)" in stdout and "README.md" in stdout
    assert (out / "cutegen_test_gemm_like_c1" / "launcher.c").is_file()
    rc, stdout, err = run_cli(capsys, "export", "cutegen_test_all_*", "-o", str(out), "--build-dir",
                              str(synthetic_build), "--json")
    assert rc == 0, err
    data = json.loads(stdout)
    assert data["kernels"] == ["cutegen_test_all_bindings"] and "cutegen_launcher.c" in data["files"]
    assert data["out_dir"] == str(out)
    # all built kernels when no pattern is given
    rc, stdout, err = run_cli(capsys, "export", "-o", str(out), "--build-dir", str(synthetic_build), "--json")
    assert rc == 0 and len(json.loads(stdout)["kernels"]) == 4


def test_cli_export_errors(capsys, synthetic_build, tmp_path):
    out = str(tmp_path / "exp")
    rc, _, err = run_cli(capsys, "export", "zzz", "-o", out, "--build-dir", str(synthetic_build))
    assert rc == 1 and "'zzz'" in err and "Traceback" not in err  # a pattern matching nothing
    rc, _, err = run_cli(capsys, "export", "cutegen_test_gemm_lik", "-o", out, "--build-dir", str(synthetic_build),
                         "--op", "fp8_gemm_nt")
    assert rc == 2 and "no kernels for op fp8_gemm_nt" in err
    # a pattern naming a default schedule that was not built: say how to build it
    rc, _, err = run_cli(capsys, "export", "128x256x64_c2x1", "-o", out, "--build-dir", str(synthetic_build))
    assert rc == 1 and "not built there" in err and "cutegen build" in err
    rc, _, err = run_cli(capsys, "export", "gemm_like", "-o", out, "--build-dir", str(tmp_path / "nowhere"))
    assert rc == 2 and "no kernel catalogue" in err
    rc, _, err = run_cli(capsys, "export", "gemm_like", "--build-dir", str(synthetic_build))
    assert rc == 2 and "-o" in err
    rc, _, err = run_cli(capsys, "export", "", "-o", out, "--build-dir", str(synthetic_build))
    assert rc == 2 and "empty pattern" in err
    (synthetic_build / "cutegen_test_gemm_like" / "kernel.cubin").write_bytes(b"x")
    rc, _, err = run_cli(capsys, "export", "cutegen_test_gemm_like", "-o", out, "--build-dir", str(synthetic_build))
    assert rc == 1 and "sha256" in err
    (synthetic_build / "catalogue.json").write_text("{not json")
    rc, _, err = run_cli(capsys, "export", "-o", out, "--build-dir", str(synthetic_build))
    assert rc == 2 and "cannot be used" in err


def test_cli_verify(capsys, synthetic_build):
    rc, out, err = run_cli(capsys, "verify", "gemm_like", "--build-dir", str(synthetic_build))
    assert rc == 0, out + err
    assert "HGMMA x8" in out and "2 kernel(s) verified" in out and "2 ok, 0 failed" in out
    for col in ("NAME", "MMA", "LDL/STL", "STACK", "REGS/BUDGET", "SMEM/LIMIT", "STATUS"):
        assert col in out
    # test_op and test_quant have no expected MMA opcode: verify fails (exit 1) and says why
    rc, out, err = run_cli(capsys, "verify", "--build-dir", str(synthetic_build))
    assert rc == 1 and "FAIL mma: no expected MMA opcode" in out and "2 ok, 2 failed" in out
    rc, out, _ = run_cli(capsys, "verify", "--build-dir", str(synthetic_build), "--json")
    data = json.loads(out)
    assert rc == 1 and data["ok"] is False
    by = {k["name"]: k for k in data["kernels"]}
    assert by["cutegen_test_gemm_like"]["ok"] and not by["cutegen_test_all_bindings"]["ok"]
    assert {c["name"] for c in by["cutegen_test_gemm_like"]["checks"]} == {
        "mma", "wgmma_pipeline", "local_memory", "stack", "registers", "smem", "cubin"}
    rc, _, err = run_cli(capsys, "verify", "nothing_like_this", "--build-dir", str(synthetic_build))
    assert rc == 1 and "nothing_like_this" in err  # a pattern matching nothing
    rc, _, err = run_cli(capsys, "verify", "--build-dir", str(synthetic_build / "none"))
    assert rc == 2 and "no kernel catalogue" in err
    rc, _, err = run_cli(capsys, "verify", "--arch", "sm_75")
    assert rc == 2


def test_cli_verify_real_build(capsys, real_build):
    rc, out, err = run_cli(capsys, "verify", "--build-dir", str(real_build))
    assert rc == 0, out + err
    assert out.count(" ok") >= len(REPRESENTATIVE)


SCHEDULES_TOML = bf16_family(
    "extra_family",
    sweep="tile = [ {tile_m = 64, tile_n = 192, math_warpgroups = 1}, {tile_m = 128, tile_n = 48, math_warpgroups = 2} ]",
    base_extra=ONE_CTA_CLUSTER,
)
EXTRA = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_64x192x64_c1x1_mc0_s6_wg1_r40x232_epitma_rm_g8"


def test_cli_extra_schedule_files(capsys, tmp_path, monkeypatch):
    path = tmp_path / "extra.toml"
    path.write_text(SCHEDULES_TOML)
    rc, out, _ = run_cli(capsys, "list", "--names")
    defaults = out.split()
    rc, out, _ = run_cli(capsys, "list", "--schedules", str(path), "--names")
    names = out.split()
    assert rc == 0 and EXTRA in names and len(names) == len(defaults) + 2 and set(defaults) < set(names)
    rc, out, _ = run_cli(capsys, "list", "64x192", "--schedules", str(path), "--json")
    (entry,) = json.loads(out)
    assert entry["name"] == EXTRA and entry["family"] == "extra_family" and entry["source"] == str(path)
    rc, out, _ = run_cli(capsys, "show", EXTRA, "--schedules", str(path), "--build-dir", str(tmp_path))
    assert rc == 0 and "extra_family" in out
    rc, out, _ = run_cli(capsys, "show", "64x192", "--schedules", str(path), "--json", "--build-dir", str(tmp_path))
    assert rc == 0 and json.loads(out)["name"] == EXTRA
    rc, _, err = run_cli(capsys, "list", "--schedules", str(tmp_path / "missing.toml"))
    assert rc == 2 and "missing.toml" in err
    (tmp_path / "broken.toml").write_text("[[family]\n")
    rc, _, err = run_cli(capsys, "list", "--schedules", str(tmp_path / "broken.toml"))
    assert rc == 2 and "not valid TOML" in err
    # build passes the extra schedules to the builder
    import sys
    import types

    calls = []
    mod = types.ModuleType("cutegen.gen.build")

    class Report:
        ok = True

        def summary(self):
            return "FAKE"

    def build_schedules(schedules, *, out_dir, jobs, force):
        calls.append(list(schedules))
        return Report()

    mod.build_schedules = build_schedules  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cutegen.gen.build", mod)
    rc, out, _ = run_cli(capsys, "build", "64x192", "--schedules", str(path), "-o", str(tmp_path / "b"), "-j", "1")
    assert rc == 0 and [len(c) for c in calls] == [1]


def test_examples_new_shape_family_schedules_are_valid(capsys):
    path = REPO / "examples" / "new_shape_family" / "qwen3_30b_a3b.toml"
    rc, out, err = run_cli(capsys, "list", "--schedules", str(path), "--json")
    assert rc == 0, err
    mine = [e for e in json.loads(out) if e["source"] == str(path)]
    assert len(mine) >= 4 and all(e["valid"] for e in mine)
    defaults = {e.name for e in cli._load(None, None)}
    assert not defaults & {e["name"] for e in mine}, "the example should add schedules, not repeat the defaults"


def test_every_op_with_a_template_has_an_expected_mma_entry():
    from cutegen.schedules.predicates import OP_ARCHS

    missing = [(a.value, o.value) for o, archs in OP_ARCHS.items() for a in archs if (a.value, o.value) not in EXPECTED_MMA]
    assert missing == [], f"add these (arch, op) pairs to cutegen.gen.verify.EXPECTED_MMA: {missing}"
