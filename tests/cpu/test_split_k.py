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
    tiles, partials = split_k.workspace_extents(m, 64, 576, 7, 66)
    assert tiles == 1 * 10 and partials == tiles * 7 * 64 * 64
    tiles, _ = split_k.workspace_extents(m, 65, 577, 2, 66)
    assert tiles == 2 * 10


LAST_WAVE = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c1x2_mca_s4_wg2_r40x232_episkw_rm_g8"
LAST_WAVE_PLAIN = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c1x1_mc0_s4_wg2_r40x232_epitma_rm_g8"


def test_last_wave_split_names_rule_and_workspace():
    from cutegen.runtime import split_k

    s = parse_name(LAST_WAVE)
    assert s.epilogue == Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE and procedural_name(s) == LAST_WAVE
    assert s.splits_k and s.splits_k_last_wave and violations(s) == []
    assert not parse_name(SPLIT).splits_k_last_wave
    last_wave = dataclasses.replace(parse_name(SPLIT), epilogue=Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE)
    masked = dataclasses.replace(last_wave, op=Op.M_GROUPED_FP8_GEMM_NT_MASKED, raster=parse_name(SPLIT).raster)
    assert "split_k_only_dense" not in {v.name for v in violations(masked)}
    contiguous = dataclasses.replace(last_wave, op=Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS)
    assert "split_k_only_dense" in {v.name for v in violations(contiguous)}
    # One counter and one partial tile per CTA of the largest launch: 66 clusters of 2.
    m = split_k_manifest_from_name(LAST_WAVE)
    for shape in ((333, 12288, 16), (100, 512, 3)):
        tiles, partials = split_k.workspace_extents(m, *shape, 66)
        assert tiles == 66 * 2 and partials == tiles * 128 * 256


def test_heuristic_splits_the_last_wave_where_clusters_idle():
    split, plain = split_k_manifest_from_name(LAST_WAVE), manifest_from_name(LAST_WAVE_PLAIN)
    # 333 x 12288: 3 x 24 cluster tiles on 66 clusters, a last wave of 6 that leaves 60 idle.
    tail = heuristics.score(split, 333, 12288, 5120, H200_SMS)
    whole = heuristics.score(plain, 333, 12288, 5120, H200_SMS)
    assert tail.k_splits > 1 and tail.estimated_us < 0.7 * whole.estimated_us
    # A dense problem takes the kernel only where it splits a last wave after one to
    # LAST_WAVE_MAX_WAVES - 1 whole ones: not at 4096 x 8192 (512 cluster tiles, eight waves), nor
    # where every tile is in the one wave (the split-K kernels' case), nor where the last wave
    # leaves too few clusters idle to split into (256 x 45056: 176 cluster tiles, a last of 44).
    for shape in ((4096, 8192, 4096), (128, 4096, 7168), (256, 4096 * 11, 4096)):
        assert heuristics.score(split, *shape, H200_SMS).estimated_us == float("inf"), shape
    # Masked groups, whose tile count only the GPU knows: the mean over the spread of the row
    # counts, each unsplit where its last wave would not split (here the expected rows fill
    # exactly the tiles of whole waves), launched with the candidate's split count.
    masked = heuristics.score(split, 8 * 512, 4096, 7168, H200_SMS, rows_per_group=512, max_rows_per_group=4096)
    assert masked.estimated_us < float("inf") and masked.k_splits > 1


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
