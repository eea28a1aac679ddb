"""The `cutegen` command line (CPU only; the builder is replaced by a fake)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cutegen.gen import cli
from cutegen.gen.cli import main
from cutegen.runtime.manifest import GridRule, KernelManifest, OperandSpec, Param
from cutegen.schedules import all_expanded, default_schedules, procedural_name
from cutegen.schedules.evidence import hardware_evidence
from schedule_files import ONE_CTA_CLUSTER, bf16_family  # noqa: E402

# Every bf16_gemm_nt schedule, and those of its first family (bf16 D, stored): the ones that ran on an H200.
ALL_NAMES = [procedural_name(s) for s in default_schedules(op="bf16_gemm_nt")]
# The base family's kernels (hopper_bf16_gemm): bf16 D stored, K-major operands, its four tiles.
NAMES = [
    n for n in ALL_NAMES if "_bf16_bf16_bf16_f32_" in n and n.endswith("_epitma_rm_g8")
    and any(f"_{tile}_" in n for tile in ("128x128x64", "128x256x64", "64x128x64", "64x256x64"))
]
NAME = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def with_invalid(tmp_path, monkeypatch):
    """Make the CLI read a schedule file with valid and invalid points."""
    p = tmp_path / "mixed.toml"
    p.write_text(
        bf16_family(
            "mixed",
            sweep="tile = [ {tile_m = 128, tile_n = 128, math_warpgroups = 2},\n"
            "         {tile_m = 96, tile_n = 128, math_warpgroups = 2} ]",
            base_extra=ONE_CTA_CLUSTER,
        )
    )
    monkeypatch.setattr(cli, "_load", lambda arch, op, *_: all_expanded(arch, op, paths=[p]))
    return p


# ---- list --------------------------------------------------------------------------------------


def test_list_defaults(capsys):
    rc, out, err = run(capsys, "list")
    assert rc == 0, err
    for n in NAMES:
        assert n in out
    assert "NAME" in out and "SMEM_KIB" in out
    assert "227.0" in out  # smem KiB of the 128x128 / 128x256 schedules
    assert out.count(" ok") >= len(NAMES)


def test_list_json_and_names(capsys):
    rc, out, _ = run(capsys, "list", "--json", "--op", "bf16_gemm_nt")
    assert rc == 0
    data = json.loads(out)
    assert [d["name"] for d in data] == ALL_NAMES
    assert all(d["valid"] and d["violations"] == [] for d in data)
    assert data[0]["derived"]["smem_bytes"] == default_schedules(op="bf16_gemm_nt")[0].smem_bytes
    rc, out, _ = run(capsys, "list", "--names")
    assert rc == 0 and out.split() == [procedural_name(s) for s in default_schedules()]


def test_list_patterns(capsys):
    rc, out, _ = run(capsys, "list", "--names", "--op", "bf16_gemm_nt", "cutegen_*_c2x1_*")
    assert rc == 0 and out.split() == [n for n in ALL_NAMES if "_c2x1_" in n]
    rc, out, _ = run(capsys, "list", "--names", "--op", "bf16_gemm_nt", "128x256")  # substring
    assert rc == 0 and out.split() == [n for n in ALL_NAMES if "128x256" in n]
    rc, out, _ = run(capsys, "list", "--names", "--op", "bf16_gemm_nt", "128x256", "64x256x64")  # union
    assert rc == 0 and out.split() == [n for n in ALL_NAMES if "128x256" in n or "64x256x64" in n]
    rc, out, _ = run(capsys, "list", "--names", "--op", "bf16_gemm_nt", "MCB")  # case-insensitive
    assert rc == 0 and out.split() == [n for n in ALL_NAMES if "_mcb_" in n]
    rc, out, _ = run(capsys, "list", "--names", "hopper_bf16_gemm")  # a family name
    assert rc == 0 and out.split() == NAMES


def test_list_pattern_matching_nothing(capsys):
    rc, out, err = run(capsys, "list", "nothing_like_this")
    assert rc == 1
    assert "nothing_like_this" in err and "Traceback" not in err
    # a glob must match the whole name
    rc, _, err = run(capsys, "list", "*c2x1")
    assert rc == 1 and "*c2x1" in err
    # one bad pattern among good ones is still an error
    rc, _, err = run(capsys, "list", "128x256", "zzz")
    assert rc == 1 and "zzz" in err


def test_list_filters(capsys):
    rc, out, _ = run(capsys, "list", "--names", "--arch", "sm_90a", "--op", "bf16_gemm_nt")
    assert rc == 0 and out.split() == ALL_NAMES
    rc, out, err = run(capsys, "list", "--arch", "sm_100a")
    assert rc == 0 and "cutegen_sm100a_fp8gemm_" in out and "compiled only" in out
    rc, out, err = run(capsys, "list", "--arch", "sm_100a", "--op", "bf16_gemm_nt")
    assert rc == 1 and "sm_100a" in err
    rc, _, err = run(capsys, "list", "--arch", "sm_80")
    assert rc == 2 and "sm_80" in err


def test_list_all_shows_invalid(capsys, with_invalid):
    rc, out, _ = run(capsys, "list")
    assert rc == 0
    assert "128x128x64" in out and "96x128x64" not in out
    assert "1 invalid hidden" in out
    rc, out, _ = run(capsys, "list", "--all")
    assert rc == 0
    assert "96x128x64" in out and "tile_m_wgmma" in out and "tile_m=96" in out
    rc, out, _ = run(capsys, "list", "--all", "--json")
    data = {d["name"]: d for d in json.loads(out)}
    (bad,) = [d for d in data.values() if not d["valid"]]
    assert bad["violations"][0]["name"] == "tile_m_wgmma"
    # a pattern that matches only invalid schedules points at --all
    rc, _, err = run(capsys, "list", "96x128")
    assert rc == 1 and "--all" in err
    rc, out, _ = run(capsys, "list", "--all", "96x128")
    assert rc == 0 and "tile_m_wgmma" in out


def test_list_hardware_is_per_schedule_point(capsys, tmp_path):
    """Only the shipped catalogue's points carry their architecture's hardware evidence: a point
    that only a user's schedule file names, or that the rules refuse, has run nowhere."""
    extra = tmp_path / "mine.toml"
    extra.write_text(bf16_family(
        "mine",
        sweep="tile = [ {tile_m = 128, tile_n = 48, math_warpgroups = 2},\n"
        "         {tile_m = 96, tile_n = 128, math_warpgroups = 2} ]",
        base_extra=ONE_CTA_CLUSTER,
    ))
    rc, out, err = run(capsys, "list", "--all", "--json", "--op", "bf16_gemm_nt", "--schedules", str(extra))
    assert rc == 0, err
    data = json.loads(out)
    by_name = {d["name"]: d for d in data}
    # The catalogue's points: each its schedule's evidence (the base family's ran on the H200).
    assert all(by_name[procedural_name(s)]["hardware"] == hardware_evidence(s) for s in default_schedules(op="bf16_gemm_nt"))
    assert all(by_name[n]["hardware"] == "ran on H200" for n in NAMES)
    mine = [d for d in data if d["source"] == str(extra)]
    assert {d["hardware"] for d in mine if d["valid"]} == {"none (not in catalogue)"}
    assert {d["hardware"] for d in mine if not d["valid"]} == {"none (invalid)"}
    rc, out, _ = run(capsys, "list", "--schedules", str(extra), "128x48x64")
    assert rc == 0 and "none (not in catalogue)" in out and "ran on H200" not in out


# ---- show --------------------------------------------------------------------------------------


def test_show(capsys, tmp_path):
    rc, out, err = run(capsys, "show", NAME, "--build-dir", str(tmp_path))
    assert rc == 0, err
    assert out.splitlines()[0] == NAME
    for word in ("hopper_bf16_gemm", "smem_bytes", "232448", "stage_bytes", "49152", "epi_tile",
                 "128x32", "accumulators_per_thread", "threads_per_cta", "384", "(auto)",
                 "smem_fits", "multicast_box_divisible", "not built", "ran on H200"):
        assert word in out, word
    assert "mma_ctas" not in out


def test_show_epilogue_buffers(capsys, tmp_path):
    """`show` says whether the epilogue stages the whole tile or cycles a ring of sub-tiles."""
    whole = "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x192x128_c1x1_mc0_s4_wg2_r40x232_epitma_rm_g8"
    ring = "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c1x2_mca_s3_wg2_r40x232_epitma_rm_g8"
    rc, out, err = run(capsys, "show", whole, "--build-dir", str(tmp_path))
    assert rc == 0, err
    assert "epilogue_bytes          49152 (6 sub-tile buffers: the whole tile)" in out
    assert "wgmma_accumulators      1" in out
    rc, out, err = run(capsys, "show", ring, "--build-dir", str(tmp_path))
    assert rc == 0, err
    assert "epilogue_bytes          32768 (4 sub-tile buffers: a ring)" in out
    assert "waves                   2 (2 of 64 rows per math warpgroup x 1 of 128 columns)" in out


def test_show_column_waves(capsys, tmp_path):
    """`show` gives a block-scaled Hopper tile's waves: the 256-wide contiguous tile runs two
    column waves of 128 and rings two epilogue sub-tiles, so that four operand stages fit."""
    wide = "cutegen_sm90a_mgfp8gemmc_e4m3_e4m3_bf16_f32_sff32_128x256x128_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8"
    rc, out, err = run(capsys, "show", wide, "--build-dir", str(tmp_path))
    assert rc == 0, err
    assert "waves                   2 (1 of 64 rows per math warpgroup x 2 of 128 columns)" in out
    assert "epilogue_bytes          16384 (2 sub-tile buffers: a ring)" in out
    assert "= 4 stages x 49664" in out
    rc, out, err = run(capsys, "show", "--json", wide, "--build-dir", str(tmp_path))
    assert rc == 0, err
    derived = json.loads(out)["derived"]
    assert (derived["row_waves"], derived["column_waves"]) == (1, 2)


def test_show_blackwell(capsys, tmp_path):
    name = "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c2x1_mcb_s8_wg1_r96x256_epitma_rm_g8"
    rc, out, err = run(capsys, "show", name, "--build-dir", str(tmp_path))
    assert rc == 0, err
    for word in ("blackwell_fp8_gemm", "compiled only", "mma_ctas                2",
                 "tmem_columns            512 (4 accumulator stages x 128", "cta_pair_shape"):
        assert word in out, word


def test_show_json(capsys, tmp_path):
    rc, out, _ = run(capsys, "show", NAME, "--json", "--build-dir", str(tmp_path))
    assert rc == 0
    data = json.loads(out)
    assert data["name"] == NAME and data["valid"]
    assert data["schedule"]["tile_n"] == 256
    assert data["derived"]["epi_tile"] == [128, 32]
    assert {r["status"] for r in data["rules"]} - {"n/a"} == {"ok"}  # quantize-only rules: n/a
    assert data["manifest"] is None and data["sass"] is None


def test_show_unknown_suggests(capsys):
    typo = NAME.replace("_g8", "_g8x")
    rc, out, err = run(capsys, "show", typo)
    assert rc == 2 and out == ""
    assert "unknown schedule" in err and NAME in err and "Traceback" not in err
    rc, _, err = run(capsys, "show", "gemm_thing")
    assert rc == 2 and "gemm_thing" in err


def test_show_decodes_names_not_in_files(capsys, tmp_path):
    other = NAME.replace("_s4_", "_s5_")
    rc, out, _ = run(capsys, "show", other, "--build-dir", str(tmp_path))
    assert rc == 0
    assert "decoded from the name" in out and "INVALID" in out and "smem_fits" in out


def test_show_unique_fragment(capsys, tmp_path):
    rc, out, _ = run(capsys, "show", "gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_nn", "--build-dir", str(tmp_path))
    assert rc == 0 and out.splitlines()[0] == f"{NAME}_nn"
    rc, _, err = run(capsys, "show", "gemm_bf16_bf16_f32_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epiadd")
    assert rc == 2 and "matches 2" in err


def _manifest(name: str) -> KernelManifest:
    return KernelManifest(
        name=name,
        op="bf16_gemm_nt",
        arch="sm_90a",
        entry="kernel_entry_symbol",
        cubin="kernel.cubin",
        sha256="ab" * 32,
        block=(384, 1, 1),
        cluster=(2, 1, 1),
        smem_bytes=230400,
        pdl=False,
        cooperative=False,
        grid=GridRule(kind="persistent_clusters", tile_m=128, tile_n=256, cluster_m=2, cluster_n=1),
        operands=[OperandSpec("a", "bf16", ["M", "K"], 1, 16)],
        params=[
            Param(0, "tma_a", 0, 128, 64, {"kind": "tma", "operand": "a", "box": [64, 128]}),
            Param(1, "extents_a", 128, 8, 4, {"kind": "shape", "operand": "a", "values": ["M", "K"], "width": 32}),
        ],
        schedule={},
        toolchain={"cutegen": "0.1.0"},
        registers=168,
    )


def test_show_with_build(capsys, tmp_path):
    kdir = tmp_path / NAME
    kdir.mkdir()
    (kdir / "manifest.json").write_text(_manifest(NAME).to_json())
    (kdir / "sass.txt").write_text("SASS summary\nHGMMA.64x256x16.F32.BF16 8\n")
    rc, out, err = run(capsys, "show", NAME, "--build-dir", str(tmp_path))
    assert rc == 0, err
    for word in ("kernel_entry_symbol", "(384, 1, 1)", "(2, 1, 1)", "230400", "persistent_clusters",
                 "tma_a", "extents_a", "OFFSET", "shape", "HGMMA.64x256x16", "registers"):
        assert word in out, word
    rc, out, _ = run(capsys, "show", NAME, "--build-dir", str(tmp_path), "--json")
    data = json.loads(out)
    assert data["manifest"]["entry"] == "kernel_entry_symbol"
    assert "HGMMA" in data["sass"]


def test_show_broken_manifest(capsys, tmp_path):
    kdir = tmp_path / NAME
    kdir.mkdir()
    (kdir / "manifest.json").write_text("{not json")
    rc, out, err = run(capsys, "show", NAME, "--build-dir", str(tmp_path))
    assert rc == 1 and NAME in out and "manifest" in err and "Traceback" not in err


# ---- build -------------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeReport:
    ok: bool
    n: int

    def summary(self) -> str:
        return f"FAKE SUMMARY {self.n} kernels"


@pytest.fixture
def fake_build(monkeypatch):
    calls: list[dict] = []
    state = {"ok": True}

    def build_schedules(schedules, *, out_dir, jobs, force):
        calls.append({"schedules": list(schedules), "out_dir": out_dir, "jobs": jobs, "force": force})
        return FakeReport(state["ok"], len(schedules))

    mod = types.ModuleType("cutegen.gen.build")
    mod.build_schedules = build_schedules  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cutegen.gen.build", mod)
    return calls, state


def test_build_defaults(capsys, fake_build):
    calls, _ = fake_build
    rc, out, _ = run(capsys, "build", "--op", "bf16_gemm_nt")
    assert rc == 0
    assert f"FAKE SUMMARY {len(ALL_NAMES)} kernels" in out
    (call,) = calls
    assert [procedural_name(s) for s in call["schedules"]] == ALL_NAMES
    assert call["out_dir"] == Path("build")
    assert call["jobs"] == (os.cpu_count() or 1)
    assert call["force"] is False


def test_build_options(capsys, fake_build, tmp_path):
    calls, state = fake_build
    rc, out, _ = run(capsys, "build", "c2x1", "-o", str(tmp_path), "-j", "3", "--force", "--arch", "sm_90a", "--op", "bf16_gemm_nt")
    assert rc == 0
    (call,) = calls
    assert all(s.cluster_m == 2 for s in call["schedules"])
    assert len(call["schedules"]) == len([n for n in ALL_NAMES if "_c2x1_" in n])
    assert call["out_dir"] == tmp_path and call["jobs"] == 3 and call["force"] is True
    state["ok"] = False
    rc, _, _ = run(capsys, "build", NAME)
    assert rc == 1


def test_build_errors(capsys, fake_build, monkeypatch):
    calls, _ = fake_build
    rc, _, err = run(capsys, "build", "zzz")
    assert rc == 1 and "zzz" in err
    rc, _, err = run(capsys, "build", "-j", "0")
    assert rc == 2 and "-j" in err
    assert calls == []
    monkeypatch.setitem(sys.modules, "cutegen.gen.build", None)  # import fails
    rc, _, err = run(capsys, "build", NAME)
    assert rc == 2 and "cutegen[gen]" in err and "Traceback" not in err


def test_an_op_or_family_name_selects_its_schedules(capsys, fake_build, tmp_path):
    rc, out, _ = run(capsys, "list", "bf16_gemm_nt", "--json")
    assert rc == 0 and sorted(e["name"] for e in json.loads(out)) == sorted(ALL_NAMES)
    p = tmp_path / "fam.toml"
    p.write_text(bf16_family("my_family", sweep="tile = [ {tile_m = 128, tile_n = 240, math_warpgroups = 2} ]",
                             base_extra=ONE_CTA_CLUSTER))
    rc, out, _ = run(capsys, "list", "--schedules", str(p), "my_family", "--json")
    assert rc == 0 and [e["family"] for e in json.loads(out)] == ["my_family"]
    calls, _ = fake_build
    rc, _, _ = run(capsys, "build", "--schedules", str(p), "my_family", "-o", str(tmp_path / "b"))
    assert rc == 0 and len(calls[-1]["schedules"]) == 1


def test_build_says_which_points_of_a_schedule_file_are_skipped(capsys, fake_build, tmp_path):
    p = tmp_path / "mixed.toml"
    p.write_text(bf16_family(
        "mixed", sweep="tile = [ {tile_m = 128, tile_n = 240, math_warpgroups = 2},\n"
        "         {tile_m = 96, tile_n = 128, math_warpgroups = 2} ]", base_extra=ONE_CTA_CLUSTER))
    rc, _, err = run(capsys, "build", "--schedules", str(p), "mixed", "-o", str(tmp_path / "b"))
    assert rc == 0 and f"1 point(s) of {p} are invalid and not built" in err and "list --all --schedules" in err


def test_show_hint_names_the_schedule_file(capsys, tmp_path):
    p = tmp_path / "fam.toml"
    p.write_text(bf16_family("my_family", sweep="tile = [ {tile_m = 128, tile_n = 240, math_warpgroups = 2} ]",
                             base_extra=ONE_CTA_CLUSTER))
    rc, out, _ = run(capsys, "list", "--schedules", str(p), "my_family", "--json")
    (name,) = [e["name"] for e in json.loads(out)]
    rc, out, _ = run(capsys, "show", "--schedules", str(p), name, "--build-dir", str(tmp_path / "nowhere"))
    assert rc == 0 and f"`cutegen build --schedules {p} {name} -o {tmp_path / 'nowhere'}`" in out


# ---- env and misc ------------------------------------------------------------------------------


def test_env(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CUTEGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "gpu_info", lambda: "none (test)")
    rc, out, _ = run(capsys, "env")
    assert rc == 0
    for word in ("python", "cutegen", "nvidia-cutlass-dsl", "cuda-bindings", "torch", "numpy",
                 "cuobjdump", "gpu", "none (test)", str(tmp_path / "cache")):
        assert word in out, word
    rc, out, _ = run(capsys, "env", "--json")
    data = json.loads(out)
    assert data["cache"] == str(tmp_path / "cache")
    assert set(cli.DISTRIBUTIONS) <= set(data)


def test_env_real_gpu_probe():
    info = cli.gpu_info()
    assert isinstance(info, (str, list))


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("CUTEGEN_CACHE_DIR", raising=False)
    assert cli.cache_dir() == Path.home() / ".cache" / "cutegen"


def test_usage_errors(capsys):
    rc, _, err = run(capsys)
    assert rc == 2 and "usage" in err
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "list" in out
    rc, _, err = run(capsys, "frobnicate")
    assert rc == 2


def test_list_does_not_import_cutlass():
    code = (
        "import sys; from cutegen.gen.cli import main; rc = main(['list']);"
        "assert rc == 0, rc;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('cutlass', 'torch') or m == 'cutegen.gen.build'];"
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert NAME in proc.stdout
