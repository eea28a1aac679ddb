"""CPU tier: the in-run DeepGEMM anchor's build side (configuration choice, generated source, nvcc
command, errors). Compiling for real needs nvcc and DeepGEMM and CUTLASS checkouts: set
CUTEGEN_TEST_DEEPGEMM and CUTEGEN_TEST_CUTLASS to run that test."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from cutegen.gen import cli
from cutegen.bench import deepgemm_anchor as dga
from cutegen.bench.run import DEEPGEMM_FP8_TFLOPS


# What DeepGEMM's SM90 heuristic picks on 132 SMs (its cost model, re-implemented by
# `choose_config`); the in-run timings of 2026-12-01 used exactly these.
EXPECTED = {
    (64, 2112, 7168): (64, 16, 1, 1, 16),
    (64, 24576, 1536): (64, 96, 2, 1, 10),
    (64, 7168, 16384): (64, 64, 1, 1, 13),
    (128, 24576, 1536): (128, 192, 1, 1, 4),
    (128, 32768, 512): (128, 128, 1, 2, 5),
    (128, 7168, 16384): (64, 112, 1, 1, 9),
    (4096, 2112, 7168): (128, 192, 2, 1, 4),
    (4096, 7168, 16384): (256, 128, 1, 2, 3),
    (4096, 32768, 512): (256, 128, 1, 2, 3),
}


@pytest.mark.parametrize("shape", sorted(EXPECTED), ids=lambda s: "x".join(map(str, s)))
def test_choice_matches_deepgemms_heuristic(shape):
    c = dga.choose_config(*shape)
    assert (c.block_m, c.block_n, c.cluster_m, c.cluster_n, c.stages) == EXPECTED[shape]


def test_every_candidate_fits_shared_memory_and_names_are_one_to_one():
    for m, n, k in DEEPGEMM_FP8_TFLOPS:
        cands = dga.candidates(m, n, k, 132)
        assert cands
        assert all(c.smem_bytes <= dga.SMEM_CAPACITY and c.stages >= 3 for c in cands)
        names = [c.name for c in cands]
        assert len(set(names)) == len(names)


def test_no_cluster_for_a_single_wave():
    """DeepGEMM's model never multicasts when the tiles fit in one wave (64 x 2112: 132 tiles)."""
    c = dga.choose_config(64, 2112, 7168)
    assert c.cluster_size == 1
    assert dga.modelled_cycles(dga.DeepGemmConfig(64, 2112, 7168, 64, 16, 1, 2, 16, 0), 132) == 2**63 - 1


def test_kernel_source_instantiates_the_chosen_configuration():
    c = dga.choose_config(4096, 7168, 16384)
    src = dga.kernel_source(c, sms=132)
    assert "#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>" in src
    # N and K compiled in, M at run time; 256x128 tiles, 3 stages, 128 TMA and 256 math threads,
    # a cluster of two multicasting A, 132 SMs.
    assert "cute::UMMA::Major::K, 0, 7168, 16384, 1," in src
    assert "256, 128, 128, 128, 128, 128," in src
    assert "3, 128, 256," in src and "2, true," in src and "132, GemmType::Normal" in src
    assert c.threads == 384 and c.swizzle_d == 128 and c.multicast_on_a


def test_nvcc_command_uses_the_checkouts_and_sm90a(tmp_path):
    cmd = dga.nvcc_command("nvcc", tmp_path / "k.cu", tmp_path / "k.cubin", Path("/dg"), Path("/cutlass"))
    assert "--gpu-architecture=sm_90a" in cmd and "-std=c++20" in cmd and "-cubin" in cmd
    assert "-I/dg/deep_gemm/include" in cmd and "-I/cutlass/include" in cmd


def test_ptx_version_mismatch_gets_a_hint():
    stderr = "ptxas /tmp/x.ptx, line 9; fatal   : Unsupported .version 9.5; current version is '9.0'"
    assert "pin nvidia-nvvm" in dga.compile_error_hint(stderr)
    assert dga.compile_error_hint("x.cu(5): error: identifier \"foo\" is undefined") == ""


def test_missing_checkouts_name_the_argument(tmp_path):
    with pytest.raises(dga.DeepGemmBuildError, match="--deepgemm"):
        dga.build([(64, 2112, 7168)], tmp_path / "nope", tmp_path, tmp_path / "out")
    (tmp_path / "dg" / Path(dga.KERNEL_HEADER).parent).mkdir(parents=True)
    (tmp_path / "dg" / dga.KERNEL_HEADER).write_text("")
    with pytest.raises(dga.DeepGemmBuildError, match="--cutlass"):
        dga.build([(64, 2112, 7168)], tmp_path / "dg", tmp_path / "nope", tmp_path / "out")


def test_cli_reports_bad_checkouts_and_folders(tmp_path, capsys):
    rc = cli.main(["deepgemm-build", "--deepgemm", str(tmp_path), "--cutlass", str(tmp_path), "-o", str(tmp_path / "o")])
    assert rc == 2 and "--deepgemm" in capsys.readouterr().err
    rc = cli.main(["bench", "--deepgemm", str(tmp_path)])
    assert rc == 2 and "deepgemm.json" in capsys.readouterr().err


def test_anchor_folder_without_its_index_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="deepgemm-build"):
        dga.DeepGemmAnchor(tmp_path)
    (tmp_path / dga.CONFIG_FILE).write_text(json.dumps({"kernels": [{"m": 1, "n": 2, "k": 3, "name": "x"}]}))
    anchor = dga.DeepGemmAnchor(tmp_path)
    assert anchor.config(1, 2, 3)["name"] == "x" and anchor.config(1, 2, 4) is None


@pytest.mark.skipif(
    not (os.environ.get("CUTEGEN_TEST_DEEPGEMM") and os.environ.get("CUTEGEN_TEST_CUTLASS") and shutil.which("nvcc")),
    reason="needs nvcc and CUTEGEN_TEST_DEEPGEMM / CUTEGEN_TEST_CUTLASS checkouts",
)
def test_build_compiles_deepgemms_kernel(tmp_path):
    pytest.importorskip("cutegen.gen.sass")
    problems = [(4096, 7168, 16384), dga.DeepGemmProblem(dga.DeepGemmKernel.CONTIGUOUS_1D2D, 30720, 4096, 7168, 4),
                dga.DeepGemmProblem(dga.DeepGemmKernel.WGRAD_1D1D, 7168, 2112, 4096),
                dga.DeepGemmProblem(dga.DeepGemmKernel.K_GROUPED_1D1D, 2048, 7168, 5248, 8),
                dga.DeepGemmProblem(dga.DeepGemmKernel.MASKED_1D2D, 256, 4096, 7168, 4)]
    entries = dga.build(problems, Path(os.environ["CUTEGEN_TEST_DEEPGEMM"]),
                        Path(os.environ["CUTEGEN_TEST_CUTLASS"]), tmp_path, jobs=2)
    assert [e["kernel"] for e in entries] == ["1d2d", "contiguous_1d2d", "1d1d", "k_grouped_1d1d", "masked_1d2d"]
    for e in entries:
        assert (tmp_path / e["cubin"]).stat().st_size > 0 and dga.DeepGemmKernel(e["kernel"]).symbol in e["entry"]
    meta = json.loads((tmp_path / dga.CONFIG_FILE).read_text())
    assert [k["name"] for k in meta["kernels"]] == [e["name"] for e in entries]
    anchor = dga.DeepGemmAnchor(tmp_path)
    assert anchor.config(30720, 4096, 7168, dga.DeepGemmKernel.CONTIGUOUS_1D2D, 4)["config"] == "128x192 c2x1 s4"


# DeepGEMM's choices for the contiguous benchmark problems (total rows of 128-aligned groups) and
# the dense weight-gradient ones; the in-run timings of 2026-12-02 used exactly these.
def test_contiguous_and_weight_gradient_choices():
    from cutegen.bench.run import DEEPGEMM_GROUPED_CONTIGUOUS, DEEPGEMM_WGRAD, WGRAD_KS, deepgemm_problems

    problems = deepgemm_problems(["m_grouped_fp8_gemm_nt_contiguous", "fp8_wgrad_gemm_nt"])
    assert len(problems) == len(DEEPGEMM_GROUPED_CONTIGUOUS) + len(DEEPGEMM_WGRAD) * len(WGRAD_KS)
    for p in problems:
        c = p.config()
        assert (c.block_m, c.block_n, c.cluster_m, c.cluster_n, c.stages) == (
            (128, 192, 2, 1, 4) if p.kernel is dga.DeepGemmKernel.CONTIGUOUS_1D2D else (128, 152, 2, 1, 4))
        assert c.smem_bytes <= dga.SMEM_CAPACITY
    contiguous = [p for p in problems if p.kernel is dga.DeepGemmKernel.CONTIGUOUS_1D2D]
    assert all(p.m % dga.CONTIGUOUS_ALIGNMENT == 0 and p.groups > 1 for p in contiguous)
    assert {p.groups for p in contiguous} == {4, 8, 32}


def test_problem_sets_per_op():
    from cutegen.bench.run import DEEPGEMM_FP8_TFLOPS, FP8_SHAPES, deepgemm_problems

    assert len(deepgemm_problems(["fp8_gemm_nt"])) == len(DEEPGEMM_FP8_TFLOPS)
    assert len(deepgemm_problems(["fp8_gemm_nt"], all_shapes=True)) == len(FP8_SHAPES)


def test_candidates_follow_each_kernels_rules():
    dense = dga.candidates(4096, 7168, 16384, 132)
    contiguous = dga.candidates(32768, 4096, 7168, 132, dga.DeepGemmKernel.CONTIGUOUS_1D2D, 4)
    wgrad = dga.candidates(7168, 2112, 4096, 132, dga.DeepGemmKernel.WGRAD_1D1D)
    assert {c.block_m for c in dense} == {64, 128, 256}
    assert {c.block_m for c in contiguous} == {128}
    # fp32 D: no 256-row tiles, N blocks of 16 and 24 + 16i up to 160.
    assert {c.block_m for c in wgrad} == {64, 128}
    assert sorted({c.block_n for c in wgrad}) == [16, 24, 40, 56, 72, 88, 104, 120, 136, 152]
    stages, smem = dga.pipeline(7168, 2112, 4096, 128, 152, dga.DeepGemmKernel.WGRAD_1D1D)
    # D tile 128x152 fp32 (76 KB), the barriers, then A, B, SFA and SFB per stage.
    assert stages == 4 and smem == 77824 + 256 + 4 * (16384 + 19456 + 512 + 640)
    names = [c.name for c in dense + contiguous + wgrad]
    assert len(set(names)) == len(names)
    assert contiguous[0].name.startswith("deepgemm_contiguous_1d2d_g4_32768x4096x7168_")
    assert wgrad[0].name.startswith("deepgemm_1d1d_7168x2112x4096_")


def test_kernel_sources_of_the_grouped_and_1d1d_kernels():
    c = dga.choose_config(30720, 4096, 7168, 132, dga.DeepGemmKernel.CONTIGUOUS_1D2D, 4)
    src = dga.kernel_source(c)
    assert "#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>" in src
    assert "cute::UMMA::Major::K, 0, 4096, 7168, 4," in src and "GemmType::MGroupedContiguous" in src
    c = dga.choose_config(7168, 2112, 4096, 132, dga.DeepGemmKernel.WGRAD_1D1D)
    src = dga.kernel_source(c)
    assert "#include <deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh>" in src and "sm90_fp8_gemm_1d1d_impl<" in src
    assert "0, 2112, 4096, 1," in src and "128, 152, 128, 128, 128," in src
    assert "4, 128, 256," in src and "2, false," in src and "132, GemmType::Normal, float>" in src
    assert c.swizzle_d == 0 and c.store_block_m == 64 and c.kernel.accumulates


def test_k_grouped_choices_and_source():
    """DeepGEMM's k-grouped 1D1D kernel: its heuristic counts every group's tiles at the largest
    group's K (padded to 128 tokens), multicasts for at most four groups, keeps shared memory for
    its tensor maps; the source compiles M and N in, K at run time, KGroupedContiguous."""
    from cutegen.bench.run import DEEPGEMM_K_GROUPED, deepgemm_problems, k_grouped_expected_k, k_grouped_sizes

    kg = dga.DeepGemmKernel.K_GROUPED_1D1D
    assert kg.op == "k_grouped_fp8_gemm_nt_contiguous" and kg.is_1d1d and kg.is_grouped and kg.accumulates
    problems = deepgemm_problems(["k_grouped_fp8_gemm_nt_contiguous"])
    assert [(p.groups, p.m, p.n) for p in problems] == [(g, m, n) for g, m, n, _ in DEEPGEMM_K_GROUPED]
    for p, (groups, m, n, mean) in zip(problems, DEEPGEMM_K_GROUPED):
        assert p.kernel is kg and p.k == k_grouped_expected_k(groups, mean)
        assert p.k % 128 == 0 and p.k - 128 < max(k_grouped_sizes(groups, mean)) <= p.k
        c = p.config()
        cluster = (2, 1) if groups <= dga.K_GROUPED_MULTICAST_MAX_GROUPS else (1, 1)
        assert (c.block_m, c.block_n, (c.cluster_m, c.cluster_n), c.stages) == (128, 152, cluster, 4)
    assert all(c.cluster_size == 1 for c in dga.candidates(7168, 4096, 5248, 132, kg, 8))
    assert any(c.cluster_size == 2 for c in dga.candidates(7168, 4096, 5248, 132, kg, 4))
    stages, smem = dga.pipeline(7168, 4096, 5248, 128, 152, kg)
    assert stages == 4 and smem == 77824 + 256 + dga.K_GROUPED_TENSOR_MAP_BYTES + 4 * (16384 + 19456 + 512 + 640)
    # Four groups' tiles at K 5248 cost what one problem of four times the tiles does.
    one = dga.DeepGemmConfig(7168, 4096, 5248, 128, 152, 1, 1, 4, smem, kg, 1)
    four = dataclasses.replace(one, groups=4)
    assert dga.modelled_cycles(four, 132) > 3 * dga.modelled_cycles(one, 132)
    c = dga.choose_config(7168, 4096, 5248, 132, kg, 4)
    assert c.name == "deepgemm_k_grouped_1d1d_g4_7168x4096x5248_128x152_c2x1_s4"
    src = dga.kernel_source(c)
    assert "sm90_fp8_gemm_1d1d_impl<" in src and "7168, 4096, 0, 4," in src
    assert "GemmType::KGroupedContiguous, float>" in src and "2, false," in src


def test_anchor_looks_kernels_up_by_kind(tmp_path):
    kernels = [{"m": 64, "n": 2112, "k": 7168, "name": "legacy"},  # a folder from before the kinds
               {"kernel": "contiguous_1d2d", "groups": 4, "m": 30720, "n": 4096, "k": 7168, "name": "c"},
               {"kernel": "1d1d", "m": 7168, "n": 2112, "k": 4096, "name": "w"}]
    (tmp_path / dga.CONFIG_FILE).write_text(json.dumps({"kernels": kernels}))
    anchor = dga.DeepGemmAnchor(tmp_path)
    assert anchor.config(64, 2112, 7168)["name"] == "legacy"
    assert anchor.config(30720, 4096, 7168, dga.DeepGemmKernel.CONTIGUOUS_1D2D, 4)["name"] == "c"
    assert anchor.config(30720, 4096, 7168, dga.DeepGemmKernel.CONTIGUOUS_1D2D, 8) is None
    assert anchor.config(7168, 2112, 4096, dga.DeepGemmKernel.WGRAD_1D1D)["name"] == "w"
    assert anchor.config(7168, 2112, 4096) is None
    with pytest.raises(KeyError, match="no DeepGEMM 1d1d kernel built for 1x2x3"):
        anchor._entry(1, 2, 3, dga.DeepGemmKernel.WGRAD_1D1D)


def test_cli_build_takes_ops(tmp_path, capsys):
    rc = cli.main(["deepgemm-build", "--deepgemm", str(tmp_path), "--cutlass", str(tmp_path), "--op", "nope"])
    assert rc == 2 and "invalid choice" in capsys.readouterr().err


def test_entry_name_is_read_from_the_cubins_section_names(tmp_path):
    """A built DeepGEMM cubin's entry is found by its `.text.<mangled>` section name (each section of
    a kernel repeats it); no other entry and no disassembler is involved."""
    from cutegen.bench.deepgemm_anchor import DeepGemmBuildError, _entry_name

    mangled = "_ZN9deep_gemm23sm90_fp8_gemm_1d2d_implILj128EEEvPf"
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF\x00" + b"".join(f"{s}{mangled}\x00".encode() for s in (".text.", ".rela.text.", ".nv.info."))
                      + b".text._Z5otherv\x00")
    assert _entry_name(cubin) == mangled
    cubin.write_bytes(b"\x7fELF\x00.text._Z5otherv\x00")
    with pytest.raises(DeepGemmBuildError, match="expected one sm90_fp8_gemm_1d2d_impl entry"):
        _entry_name(cubin)


def test_masked_choices_and_source():
    """DeepGEMM's masked 1D2D kernel: 64- or 128-row tiles, a cluster only where it divides the N
    tiles, every group's tiles of the expected rows counted; the source compiles N, K and the
    group count in (M, the buffers' max_m, at run time), MGroupedMasked."""
    from cutegen.bench.run import DEEPGEMM_GROUPED_MASKED, deepgemm_problems

    masked = dga.DeepGemmKernel.MASKED_1D2D
    assert masked.op == "m_grouped_fp8_gemm_nt_masked" and masked.is_grouped and masked.counts_every_group
    assert not masked.is_1d1d and masked.gemm_type == "MGroupedMasked"
    problems = deepgemm_problems(["m_grouped_fp8_gemm_nt_masked"])
    assert [(p.groups, p.m, p.n, p.k) for p in problems] == list(DEEPGEMM_GROUPED_MASKED)
    for p in problems:
        cands = dga.candidates(p.m, p.n, p.k, 132, masked, p.groups)
        assert {c.block_m for c in cands} <= {64, 128}
        assert all(-(-p.n // c.block_n) % c.cluster_size == 0 for c in cands)
        c = p.config()
        assert c in cands and c.smem_bytes <= dga.SMEM_CAPACITY
        assert dga.modelled_cycles(c, 132) == min(dga.modelled_cycles(x, 132) for x in cands)
    one = dga.DeepGemmConfig(256, 4096, 7168, 128, 128, 1, 1, 5, 0, masked, 4)
    dense = dataclasses.replace(one, m=1024, kernel=dga.DeepGemmKernel.DENSE_1D2D, groups=1)
    assert dga.modelled_cycles(one, 132) == dga.modelled_cycles(dense, 132)  # 4 groups x 2 tiles = 8 tiles
    c = dga.choose_config(256, 4096, 7168, 132, masked, 4)
    src = dga.kernel_source(c)
    assert "cute::UMMA::Major::K, 0, 4096, 7168, 4," in src and "GemmType::MGroupedMasked" in src
    assert c.name.startswith("deepgemm_masked_1d2d_g4_256x4096x7168_")


def test_masked_benchmark_draws_groups_as_deepgemms_test():
    """Ragged groups: masked_m drawn 0.7-1.3x the expected rows (truncated), the same every run,
    within the max_m buffers; the full-group condition runs beside it."""
    from cutegen.bench import run

    assert run.MASKED_CONDITIONS == ("ragged", "full") and run.MASKED_MAX_M == 4096
    for groups, expected, _, _ in run.DEEPGEMM_GROUPED_MASKED:
        sizes = run.masked_group_sizes(groups, expected)
        assert sizes == run.masked_group_sizes(groups, expected) and len(sizes) == groups
        assert all(int(0.7 * expected) <= s <= int(1.3 * expected) <= run.MASKED_MAX_M for s in sizes)
    many = run.masked_group_sizes(64, 1000)
    assert len(set(many)) > 32  # drawn, not constant
