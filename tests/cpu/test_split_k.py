"""CPU tier: split-K FP8 GEMM kernels — the split arithmetic the kernel and the runtime share, the
workspace sizes, the heuristic's split count, and the schedule rule."""

from __future__ import annotations

import dataclasses

import pytest

from cutegen.runtime import heuristics
from cutegen.schedules import Epilogue, Op, parse_name, procedural_name, violations

from test_heuristic_calibration import H200_SMS, manifest_from_name, split_k_manifest_from_name

SPLIT = "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_64x64x128_c1x2_mca_s8_wg1_r40x232_episk_rm_g8"
PLAIN = "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_64x64x128_c1x2_mca_s12_wg1_r40x232_epitma_rm_g8"


def kernel_splits(k_blocks: int, k_splits: int) -> list[tuple[int, int]]:
    """(first block, blocks) of every split, as `HopperGemmKernel._locate_tile` computes them."""
    per = -(-k_blocks // k_splits)
    return [(s * per, min(per, k_blocks - s * per)) for s in range(k_splits)]


@pytest.mark.parametrize("k_blocks", [1, 2, 3, 7, 12, 16, 56, 57, 128])
def test_normalized_splits_cover_k_once_and_none_is_empty(k_blocks):
    for requested in range(1, 40):
        s = heuristics.normalize_splits(k_blocks * 128, requested)
        assert 1 <= s <= min(requested, k_blocks)
        parts = kernel_splits(k_blocks, s)
        assert all(count >= 1 for _, count in parts), (k_blocks, requested, parts)
        covered = [b for first, count in parts for b in range(first, first + count)]
        assert covered == list(range(k_blocks))


def test_names_and_rule():
    s = parse_name(SPLIT)
    assert s.epilogue == Epilogue.SPLIT_K_TMA_STORE and procedural_name(s) == SPLIT
    assert violations(s) == []
    masked = dataclasses.replace(s, op=Op.M_GROUPED_FP8_GEMM_NT_MASKED)
    assert "split_k_only_dense" in {v.name for v in violations(masked)}


def test_workspace_extents_cover_the_cluster_padded_grid():
    from cutegen.runtime import split_k

    m = split_k_manifest_from_name(SPLIT)
    # 64x64 tiles in 1x2 clusters: N = 576 has 9 tile columns, padded to 10.
    tiles, partials = split_k.workspace_extents(m, 64, 576, 7)
    assert tiles == 1 * 10 and partials == tiles * 7 * 64 * 64
    tiles, _ = split_k.workspace_extents(m, 65, 577, 2)
    assert tiles == 2 * 10


def test_heuristic_splits_small_m_and_not_large_m():
    split, plain = split_k_manifest_from_name(SPLIT), manifest_from_name(PLAIN)
    # N = 576 at M = 64: 9 tiles for 132 SMs; the model splits K.
    small = heuristics.score(split, 64, 576, 7168, H200_SMS)
    assert small.k_splits > 1
    assert small.estimated_us < heuristics.score(plain, 64, 576, 7168, H200_SMS).estimated_us
    assert heuristics.split_k_count(split, 64, 576, 7168, H200_SMS) == small.k_splits
    # 4096 x 7168: 448 tiles already fill the GPU several times over.
    big = heuristics.score(split, 4096, 7168, 7168, H200_SMS)
    assert big.estimated_us > heuristics.score(plain, 4096, 7168, 7168, H200_SMS).estimated_us
    # Every split keeps at least MIN_SPLIT_BLOCKS K blocks; too short a K is scored unsplit but
    # with the fixup, so the same tile without split K ranks first.
    assert heuristics.score(split, 1, 128, 512, H200_SMS).k_splits == 2
    short = heuristics.score(split, 64, 576, 256, H200_SMS)
    assert short.k_splits == 1 and short.estimated_us > heuristics.score(plain, 64, 576, 256, H200_SMS).estimated_us
    table = heuristics.format_table([small])
    assert "splits" in table.splitlines()[0]


def test_tuning_table_entries_fix_the_split_count():
    from cutegen.runtime.errors import ArtifactError

    split, plain = split_k_manifest_from_name(SPLIT), manifest_from_name(PLAIN)
    table = {"fp8_gemm_nt": {"64,576,7168": f"{SPLIT}@3", "64,2112,7168": PLAIN}}
    assert heuristics.parse_tuned(f"{SPLIT}@3") == (SPLIT, 3)
    assert heuristics.parse_tuned(PLAIN) == (PLAIN, None)
    with pytest.raises(ArtifactError, match="split count"):
        heuristics.parse_tuned(f"{SPLIT}@x")
    chosen = heuristics.choose("fp8_gemm_nt", [split, plain], 64, 576, 7168, H200_SMS, tuning=table)
    assert chosen.name == SPLIT
    assert heuristics.tuned_split_count("fp8_gemm_nt", SPLIT, 64, 576, 7168, tuning=table) == 3
    assert heuristics.tuned_split_count("fp8_gemm_nt", SPLIT, 64, 2112, 7168, tuning=table) is None
    assert heuristics.choose("fp8_gemm_nt", [split, plain], 64, 2112, 7168, H200_SMS, tuning=table).name == PLAIN
