"""CPU tier: build representative schedules with the CuTe DSL and check every artifact the build writes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")

from cutegen.gen.build import build_schedules, write_catalogue  # noqa: E402
from cutegen.gen.ptx import parse_ptx_entry  # noqa: E402
from cutegen.runtime.manifest import Catalogue, KernelManifest  # noqa: E402
from cutegen.schedules.loader import default_schedules  # noqa: E402
from cutegen.schedules.naming import procedural_name  # noqa: E402
from toolchain import assert_kernel_header_compiles  # noqa: E402

pytestmark = pytest.mark.slow

# Two schedules that between them cover: 1 and 2 math warpgroups, cluster 1x1 and 2x1 with
# multicast of B, 128- and 256-wide tiles.
REPRESENTATIVE = (
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_64x128x64_c1x1_mc0_s8_wg1_r40x232_epitma_rm_g8",
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x112x128_c2x1_mcb_s6_wg2_r40x232_epitma_rm_g8",
)
EXPECTED_MMA = {"bf16_gemm_nt": "HGMMA", "fp8_gemm_nt": "QGMMA"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    cache = root / "cache"
    out = root / "out"
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(cache))
    schedules = [s for s in default_schedules() if procedural_name(s) in REPRESENTATIVE]
    assert len(schedules) == len(REPRESENTATIVE), "representative schedules left the default set"
    first = build_schedules(schedules, out, jobs=2, progress=False)
    second = build_schedules(schedules, out, jobs=2, progress=False)
    yield {"out": out, "cache": cache, "first": first, "second": second, "schedules": schedules}
    mp.undo()


def test_first_build_compiles_everything(built):
    report = built["first"]
    assert report.ok, report.summary()
    assert report.count("built") == len(REPRESENTATIVE)


def test_identical_rebuild_is_all_cache_hits(built):
    report = built["second"]
    assert report.ok
    assert report.count("cached") == len(REPRESENTATIVE), report.summary()


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_kernel_folder_contents(built, name):
    d = built["out"] / name
    for f in ("kernel.cubin", "kernel.ptx", "manifest.json", "kernel.h", "sass.txt"):
        assert (d / f).is_file(), f"{f} missing from {d}"
    m = KernelManifest.from_json((d / "manifest.json").read_text())
    assert m.name == name
    assert m.sha256 == hashlib.sha256((d / "kernel.cubin").read_bytes()).hexdigest()
    assert m.arch == "sm_90a" and m.op in EXPECTED_MMA
    assert m.toolchain["nvidia-cutlass-dsl"] == "4.8.1"


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_manifest_matches_ptx(built, name):
    d = built["out"] / name
    m = KernelManifest.from_json((d / "manifest.json").read_text())
    entry = parse_ptx_entry((d / "kernel.ptx").read_text())
    assert entry.name == m.entry
    assert tuple(entry.reqntid) == tuple(m.block)
    assert [(p.offset, p.size, p.align) for p in entry.params] == [
        (p.offset, p.size, p.align) for p in m.params
    ]
    kinds = [p.binding["kind"] for p in m.params]
    s = m.schedule
    # 64-row tiles carry a second map of A with 16-row boxes, for the tile that holds row M - 1.
    tail = ["tma"] if s["tile_m"] == 64 else []
    tail_operand = ["a"] if tail else []
    if m.op == "fp8_gemm_nt":
        assert kinds == ["tma", "shape", "tma", "shape", "tma", "shape", "pointer", "tma", "shape"] + tail
        assert [p.binding.get("operand") for p in m.params if p.binding["kind"] != "shape"] == [
            "a", "b", "sfa", "sfb", "d"
        ] + tail_operand
    else:
        assert kinds == ["tma", "shape", "tma", "shape", "tma", "shape"] + tail
    if tail:
        assert m.params[-1].name == "tma_a_tail" and m.params[-1].binding["box"] == [s["tile_k"], 16]
    assert m.cluster == (s["cluster_m"], s["cluster_n"], 1)
    assert 0 < m.smem_bytes <= 232448
    # The B box is split across the multicast CTAs.
    tma_b = m.params[2].binding
    assert tma_b["box"] == [s["tile_k"], s["tile_n"] // s["cluster_m"]]


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_sass_has_the_mma_and_no_local_memory(built, name):
    mma = EXPECTED_MMA[KernelManifest.from_json((built["out"] / name / "manifest.json").read_text()).op]
    summary = json.loads((built["out"] / name / "sass_summary.json").read_text())
    assert summary["mma"].get(mma, 0) > 0, summary
    assert summary["local_loads"] == 0 and summary["local_stores"] == 0, summary
    assert summary["stack_bytes"] == 0
    assert mma in (built["out"] / name / "sass.txt").read_text()


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_loads_choose_their_l2_policies_from_m(built, name):
    """Dense GEMMs pick evict-first for B and evict-last for A at run time when M spans at most
    STREAMED_B_MAX_TILE_ROWS tile rows, else the default policy (0); every A/B load carries one."""
    from cutegen.templates.hopper_producer import L2_EVICT_FIRST, L2_EVICT_LAST, STREAMED_B_MAX_TILE_ROWS

    ptx = (built["out"] / name / "kernel.ptx").read_text()
    tile_m = KernelManifest.from_json((built["out"] / name / "manifest.json").read_text()).grid.tile_m
    selects = re.findall(r"setp\.lt\.s32\s+(%p\d+), %r\d+, (\d+);\s+selp\.b64\s+(%rd\d+), (\d+), 0, \1;"
                         r"\s+selp\.b64\s+(%rd\d+), (\d+), 0, \1;", ptx)
    assert len(selects) == 1, selects
    _, bound, first_reg, first, last_reg, last = selects[0]
    assert int(bound) == STREAMED_B_MAX_TILE_ROWS * tile_m + 1  # M < bound: at most that many tile rows
    assert (int(first), int(last)) == (L2_EVICT_FIRST, L2_EVICT_LAST)
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global\S*L2::cache_hint \[[^]]+\], "
                       r"\[[^]]+\], \[[^]]+\],(?: %rs\d+,)? (%rd\d+);", ptx)
    assert first_reg in loads and last_reg in loads


def test_prune_removes_only_kernels_no_schedule_produces(built, tmp_path, capsys):
    """`cutegen build --prune` drops a stale kernel folder (its manifest names a kernel the schedule
    files no longer produce) and keeps the others, whatever the patterns built, and non-kernel folders."""
    import shutil

    from cutegen.gen.cli import main

    out = tmp_path / "build"
    shutil.copytree(built["out"], out)
    name = REPRESENTATIVE[1]
    stale = out / "old_kernel"
    shutil.copytree(out / name, stale)
    manifest = json.loads((stale / "manifest.json").read_text())
    manifest["name"] = name.replace("64x128x64", "64x96x64")
    (stale / "manifest.json").write_text(json.dumps(manifest))
    (out / "notes").mkdir()
    (out / "notes" / "readme.txt").write_text("not a kernel")
    assert main(["build", "-o", str(out), "-j", "1", name]) == 0
    assert stale.is_dir() and len(Catalogue.from_json((out / "catalogue.json").read_text()).kernels) == 4
    assert main(["build", "-o", str(out), "-j", "1", "--prune", name]) == 0
    assert not stale.exists() and (out / "notes" / "readme.txt").is_file()
    cat = Catalogue.from_json((out / "catalogue.json").read_text())
    assert sorted(k.name for k in cat.kernels) == sorted(REPRESENTATIVE)
    assert f"pruned 1 stale kernel folder(s) from {out}\n  {manifest['name']}" in capsys.readouterr().out


def test_catalogue_indexes_the_build(built):
    cat = Catalogue.from_json((built["out"] / "catalogue.json").read_text())
    assert sorted(k.name for k in cat.kernels) == sorted(REPRESENTATIVE)
    for k in cat.kernels:
        assert (built["out"] / k.manifest).is_file()
    # Rewriting the catalogue is idempotent.
    again = write_catalogue(built["out"])
    assert again == cat


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_header_compiles_with_a_c_compiler(built, name, tmp_path):
    assert_kernel_header_compiles(built["out"], name, tmp_path)


def test_corrupt_cache_entry_is_rebuilt(built, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTEGEN_CACHE_DIR", str(built["cache"]))
    schedule = built["schedules"][0]
    from cutegen.gen.build import cache_key

    entry = built["cache"] / cache_key(schedule)
    (entry / "kernel.cubin").write_bytes(b"garbage")
    out = tmp_path / "out"
    report = build_schedules([schedule], out, jobs=1, progress=False)
    assert report.count("built") == 1, report.summary()
    m = KernelManifest.from_json((out / procedural_name(schedule) / "manifest.json").read_text())
    assert m.sha256 == hashlib.sha256((entry / "kernel.cubin").read_bytes()).hexdigest()


# The 128x256 cluster-2x1 BF16 kernel measured on the H200 (docs/perf/NOTES.md, 2026-11-30): its
# SASS opcode sequence is pinned, so a template change that alters the measured kernel shows here
# (and calls for a new measurement), while register renumbering does not.
MEASURED_BF16 = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8"
GOLDEN = Path(__file__).parent / "golden" / "sm90a_bf16_gemm_128x256x64_c2x1_s4.sass-opcodes"


def opcode_sequence(sass: str) -> list[str]:
    ops = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Za-z0-9_.]*)", line)
        if m:
            ops.append(m.group(1))
    return ops


def test_measured_bf16_kernel_is_unchanged(built):
    from cutegen.gen.sass import disassemble

    sass, _ = disassemble((built["out"] / MEASURED_BF16 / "kernel.cubin").read_bytes())
    assert opcode_sequence(sass) == GOLDEN.read_text().split(), (
        "the SASS of the kernel measured on the H200 changed; re-measure it and update the golden file"
    )


def test_unreadable_manifests_are_rebuilt_or_left_out_by_name(built, tmp_path, monkeypatch):
    """A kernel folder of the build with a corrupt manifest is replaced from the cache; a folder the
    build does not make, with a manifest of the wrong shape, is left out of the catalogue, named."""
    import shutil

    monkeypatch.setenv("CUTEGEN_CACHE_DIR", str(built["cache"]))
    out = tmp_path / "build"
    shutil.copytree(built["out"], out)
    schedule = built["schedules"][0]
    name = procedural_name(schedule)
    (out / name / "manifest.json").write_text("{ not json")
    (out / "stray").mkdir()
    (out / "stray" / "manifest.json").write_text("[1, 2, 3]")
    report = build_schedules([schedule], out, jobs=1, progress=False)
    assert report.ok and report.count("cached") == 1
    assert any(str(out / "stray" / "manifest.json") in line and "malformed manifest" in line
               for line in report.notices), report.notices
    cat = Catalogue.from_json((out / "catalogue.json").read_text())
    assert sorted(k.name for k in cat.kernels) == sorted(REPRESENTATIVE)
    assert all(k.manifest_sha256 == hashlib.sha256((out / k.manifest).read_bytes()).hexdigest() for k in cat.kernels)


def test_cache_entry_with_a_missing_file_is_rebuilt(built, tmp_path, monkeypatch):
    import shutil

    from cutegen.gen.build import cache_key

    cache = tmp_path / "cache"
    shutil.copytree(built["cache"], cache)
    monkeypatch.setenv("CUTEGEN_CACHE_DIR", str(cache))
    schedule = built["schedules"][1]
    (cache / cache_key(schedule) / "sass.txt").unlink()
    report = build_schedules([schedule], tmp_path / "out", jobs=1, progress=False)
    assert report.count("built") == 1, report.summary()
    assert (cache / cache_key(schedule) / "sass.txt").is_file()


def test_a_build_after_one_that_died_recovers_and_the_runtime_loads(built, tmp_path, monkeypatch):
    """The leftovers a build killed at each stage leaves (a staging folder in the cache and in the
    build folder, a kernel folder moved aside and not yet replaced, a catalogue being written):
    the next build repairs them and the runtime reads every kernel."""
    import shutil
    import subprocess
    import sys

    from cutegen.runtime.catalogue import KernelCatalogue

    pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True).stdout)  # a process that has exited
    cache = tmp_path / "cache"
    shutil.copytree(built["cache"], cache)
    monkeypatch.setenv("CUTEGEN_CACHE_DIR", str(cache))
    out = tmp_path / "build"
    shutil.copytree(built["out"], out)
    moved = REPRESENTATIVE[0]
    (out / moved).rename(out / f".{moved}.old.{pid}")
    shutil.copytree(out / REPRESENTATIVE[1], out / f".{REPRESENTATIVE[1]}.tmp.{pid}.x1")
    (out / f".catalogue.json.{pid}").write_text("{")
    some_entry = next(p for p in cache.iterdir() if p.is_dir())
    shutil.copytree(some_entry, cache / f".{some_entry.name}.tmp.{pid}.y2")
    assert KernelCatalogue.open(out).read_cubin(REPRESENTATIVE[1])  # the others still load meanwhile
    report = build_schedules(built["schedules"][1:2], out, jobs=1, progress=False)
    assert report.ok
    assert len(report.notices) == 4, report.notices
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".cutegen.lock"]
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [".cutegen.lock"]
    cat = KernelCatalogue.open(out)
    assert sorted(cat.names()) == sorted(REPRESENTATIVE)
    for name in REPRESENTATIVE:
        assert cat.read_cubin(name)


def test_concurrent_builds_into_one_folder_and_one_cache(built, tmp_path):
    """Three `cutegen build` processes at once, one empty cache, one build folder: each exits 0,
    one valid catalogue, one cubin (the same bytes as the fixture's), no stray folders."""
    import os
    import subprocess
    import sys

    name = REPRESENTATIVE[1]
    env = dict(os.environ, CUTEGEN_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "build"
    procs = [subprocess.Popen([sys.executable, "-m", "cutegen.gen.cli", "build", name, "-o", str(out), "-j", "1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    cat = Catalogue.from_json((out / "catalogue.json").read_text())
    assert [k.name for k in cat.kernels] == [name]
    cubin = (out / name / "kernel.cubin").read_bytes()
    assert cubin == (built["out"] / name / "kernel.cubin").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == [".cutegen.lock", "catalogue.json", name]
    assert not [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".") and p.name != ".cutegen.lock"]


@pytest.mark.slow
def test_accumulating_bf16_kernels_add_their_tiles_into_d(tmp_path):
    """The tma_store_add epilogue: where its storing twin (same tile, cluster, stages, D type)
    stores tiles with the TMA (UTMASTG), the kernel adds them into D (the PTX's
    cp.reduce.async.bulk.tensor .add, UTMAREDG.ADD) and stores nothing."""
    from cutegen.gen.build import _compile
    from cutegen.gen.sass import disassemble
    from cutegen.schedules.naming import parse_name

    adding = "cutegen_sm90a_gemm_bf16_bf16_f32_f32_nosf_64x128x64_c2x1_mcb_s8_wg1_r40x232_epiadd_rm_g8"
    names = (adding, adding.replace("_epiadd_", "_epitma_"))
    for n in names:
        (tmp_path / n).mkdir()
    arts = {n: _compile(parse_name(n), tmp_path / n) for n in names}
    (add_ptx, store_ptx), (add_cubin, store_cubin) = ([a[k] for a in arts.values()] for k in ("ptx", "cubin"))
    reduce_lines = [line for line in add_ptx.splitlines() if "cp.reduce.async.bulk.tensor" in line]
    assert reduce_lines and all(".add." in line for line in reduce_lines)
    assert "cp.reduce.async.bulk.tensor" not in store_ptx
    add_sass, _ = disassemble(add_cubin)
    store_sass, _ = disassemble(store_cubin)
    assert "UTMAREDG.2D.ADD" in add_sass and "UTMASTG" not in add_sass
    assert "UTMASTG.2D" in store_sass and "UTMAREDG" not in store_sass
