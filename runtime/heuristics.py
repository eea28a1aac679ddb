"""Kernel choice: a deterministic analytic cost model, overridden by an optional tuning table.

Pure Python, no GPU. For GEMM-like ops (``bf16_gemm_nt``, ``fp8_gemm_nt``: D[M,N] = A[M,K] B[N,K]^T) each
candidate manifest is scored from its grid rule (tile and cluster shape) and its schedule's
multicast:

* ``tiles = ceil(M/tile_m) * ceil(N/tile_n)``; ``cluster_tiles`` groups them by the cluster shape.
* ``usable SMs = num_sms`` rounded down to a multiple of the cluster size; a wave is
  ``usable / cluster_size`` clusters; ``waves = ceil(cluster_tiles / clusters per wave)``;
  ``wave efficiency = tiles / (waves * usable)`` (reported, not used directly).
* Per tile (one CTA, roofline): compute time ``2*tile_m*tile_n*K / per-SM FLOP rate`` (twice the
  bf16 rate for 8-bit operands); memory time
  ``bytes / per-SM bandwidth`` with ``bytes = (tile_m*a_bytes/mc_a + tile_n*b_bytes/mc_b)*K +
  tile_m*tile_n*d_bytes``. ``mc_a``/``mc_b`` are the multicast factors that actually share data
  (A is multicast along the cluster's N side, B along its M side, capped by the tile counts, so a
  2x1 cluster with a single M tile shares nothing). The per-SM bandwidth is the operand bandwidth
  shared by the CTAs working in a wave, capped by what one SM can pull.
* Block-scaled kernels: a per-K-block latency floor, ``K/128 * block_latency_s[accumulators]``
  (the WGMMA accumulators the schedule's main loop cycles through), which bounds small tiles.
  Their compute time is multiplied by `CostModel.split_scale_block_slowdown` where a tile spans
  two 128-column SFB blocks, and by `CostModel.accumulator_ring_slowdown` where the main loop
  cycles through a ring of accumulators (measured slower than the single-accumulator loop at
  compute-bound shapes).
* Two-wave kernels that stage the whole output tile (epilogue ``tma_store_whole_tile`` or
  ``tma_store_per_warpgroup``): compute times `CostModel.whole_tile_short_k_factor` (below 1)
  where K has at most `CostModel.whole_tile_max_k_blocks` blocks, else
  `CostModel.whole_tile_long_k_factor`, so they rank before their ring twins at short K only.
  Tiles computed in column waves (256 wide as two 128-wide halves): compute times
  `CostModel.column_wave_short_k_slowdown` where K has at most that many blocks.
* Masked M-grouped kernels (``rows_per_group``: the expected rows of a group; each group pads
  its rows to whole cluster tiles): the rows a group really holds are only known on the GPU and
  spread around the expected count. Scored at the expected rows alone, a tile that fills
  exactly one wave there wins and then runs a second, nearly empty wave whenever the groups are
  a little larger, so the estimate is the mean over `MASKED_ROWS_SPREAD` times the expected
  rows, each cut to the most a group holds (``max_rows_per_group``, the layout's max_m; groups
  that cannot grow are scored at the expected rows). Smaller groups only shorten the tiles.
* Contiguous M-grouped kernels: a fixed cost per tile (`CostModel.grouped_tile_overhead_s`: the
  tile's group lookup, padding rows and store), which favours fewer, wider tiles.
* Kernels with swapped operand roles (a grid rule whose tile rows run along N: B's rows are the
  MMA's M side) are scored with M and N (and A and B) exchanged, their estimate times
  `CostModel.swapped_roles_slowdown`.
* ``estimated time = waves * (max(compute, memory, latency) + tile overhead)``; for kernels that
  split a last (or only) partial wave over every cluster the GPU holds where it pays (the dense
  weight gradient's `tail_split`; `tail_split_pays`), waves is fractional there:
  ``cluster_tiles / clusters per wave``.
* Split-K kernels (epilogues ``split_k_tma_store`` and ``split_k_tma_store_add``) are scored for
  every split count S from 2 to `MAX_K_SPLITS` that leaves each split at least `MIN_SPLIT_BLOCKS`
  K blocks: S work units per tile, each with K/S, plus per wave of units `CostModel.split_fixup_s`
  and the partial tiles' traffic; the best S is the kernel's score (`Score.k_splits`) and what the
  runtime launches with (`split_k_count`). Where K is too short to split, S = 1 still pays the
  fixup (the kernel runs it whatever the count), so the same tile without split K always ranks
  first.
* Last-wave split-K kernels (epilogue ``split_k_last_wave_tma_store``) split only the r cluster
  tiles of a partial last wave, each into S = min(split count, clusters // r) units: the whole
  waves at the tile's time, then one unit of K/S plus the fix-up of S partial tiles
  (`_last_wave_score`). A dense problem takes one only where it splits a last wave after one to
  `LAST_WAVE_MAX_WAVES` - 1 whole waves; the masked layout's, whose tile count is the GPU's,
  score as the plain tile at the row counts of the spread where nothing splits.

Ties (within 0.5%) go to the larger tile, then to more useful multicast, then to the smaller
cluster, then to the name, so the choice is total and stable. Where memory or latency bounds the
tile, multicast counts as useful there only when it shares the operand with more bytes in all (B
where N >= M, else A), and such a cluster goes first: 128x4096x7168, 64x64 tiles, measured 16.7 µs
in a 2x1 cluster against 17.9 unclustered and 18.3 in a 1x2 cluster (the 64-row tiles at M <= 128
ran 0-10% slower with A multicast than without). Among compute-bound tiles, the cluster whose
multicast shares the larger of the tile's two boxes goes first, as it saves the more L2 traffic:
A for 256x128 (4096x7168x16384: 687.3 µs in a 1x2 cluster against 703.7 in a 2x1 one), B for
128x192 (2x1 clusters 1.01-1.09x faster than 1x2 at the dense M = 4096 shapes); where the boxes
are equal, the operand with more bytes in all, as for memory-bound tiles (BF16 256x4096x7168,
128x128 split two ways: 31.9 µs in a 2x1 cluster against 34.1 in a 1x2 one, an H100).

The constants in `CostModel` are the H200's measured rates (KINDS.md / anchors: ~790 TFLOP/s bf16
dense, 4.3 TB/s copy) with an assumed L2 reuse factor for operand traffic; they rank candidates,
they do not predict times.

A tuning table (JSON, ``{"bf16_gemm_nt": {"M,N,K": "kernel_name"}}``) found at
``$CUTEGEN_TUNING`` or ``<build_dir>/tuning.json`` takes precedence when it names one of the
candidates for the exact shape; a split-K kernel's entry is ``"kernel_name@SPLITS"`` and fixes the
split count too (`tuned_split_count`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import ArtifactError
from .manifest import KernelManifest
from .params import DTYPE_BITS, SCALE_BLOCK, ceil_div

TUNING_ENV = "CUTEGEN_TUNING"
TUNING_FILE = "tuning.json"
DEFAULT_NUM_SMS = 132
TIE_TOLERANCE = 0.005
# Real rows per masked group as multiples of the expected rows, from the expected count up to the
# most DeepGEMM's tests and engines' decode batches draw (0.7-1.3x).
MASKED_ROWS_SPREAD = (1.0, 1.1, 1.2, 1.3)
# Split counts the model considers for split-K kernels, and the fewest K blocks a split keeps.
MAX_K_SPLITS = 16
MIN_SPLIT_BLOCKS = 2
# When a tail-splitting kernel splits its last wave (`tail_split_pays`): the same values as
# `cutegen.schedules.spec.TAIL_SPLIT_*`, which the kernels were built with (the runtime imports
# nothing of the generator; tests/cpu/test_heuristic_calibration.py checks that they agree).
TAIL_SPLIT_MAX_FILL = (4, 5)
TAIL_SPLIT_MIN_SAVED_BLOCKS = 8
# Dense problems a last-wave split-K kernel is a candidate for: at most this many waves, the last
# one split. Beside the heuristic's choice without them on the BF16 bench's shapes (an H100, NOTES
# N90), they gained 1.02x at 333x12288x5120 (three waves), lost 0.67x at 8192x5120x25600 (twenty:
# a 128x128 tile scored as if its split paid) and 0.89x at 512x2112x7168 (every tile split, the
# split-K kernels' case).
LAST_WAVE_MAX_WAVES = 4
# Split K (every tile split) only where the work units fit in this many waves: a second wave of
# units streams the same operands again beside the fix-ups, which the model does not see. Kernel
# durations of the BF16 GEMM on an H100 (tests/data/2026-12-06-h100-bf16-kernel-timings.json):
# 256x5120x25600 ran 1.35x slower as two waves of 128x128 units split three ways (the model's
# pick) than as one wave of 128x80 tiles; the rule lowers the heuristic's regret there and over
# the BF16 shapes on both GPUs, and leaves the FP8 GEMM's choices as they were.
SPLIT_MAX_WAVES = 1
CONTIGUOUS_OP = "m_grouped_fp8_gemm_nt_contiguous"
# The contiguous layout's GEMMs (a schedule's op, whatever epilogue its entry fuses): each tile
# reads its rows' groups (`CostModel.grouped_tile_overhead_s`).
CONTIGUOUS_OPS = frozenset({CONTIGUOUS_OP, "m_grouped_bf16_gemm_nt_contiguous"})


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Machine rates for the ranking (defaults: one H200)."""

    # Dense bf16 tensor-core rate of the whole GPU, FLOP/s (measured torch.matmul ~790 TFLOP/s).
    peak_flops: float = 790e12
    # SMs the peak rate is spread over.
    reference_sms: int = 132
    # Operand bytes per second the memory system feeds all SMs together: HBM copy bandwidth
    # (4.3 TB/s) times an assumed L2 reuse of ~2.3 for GEMM operand tiles.
    operand_bandwidth: float = 10e12
    # What one SM can pull on its own (bounds the share of a nearly idle GPU).
    sm_bandwidth_cap: float = 200e9
    # Block-scaled tiles whose columns straddle two 128-column SFB blocks (tile_n 112, 144, 160,
    # 192) form two scale products per row; each chunk's is chosen at compile time (one copy of
    # the main loop per boundary column). Any factor from 1.0 to 1.03 ranks the 21 DeepGEMM
    # shapes best (tests/data/*-fp8-kernel-timings.json, tests/cpu/test_heuristic_calibration.py).
    split_scale_block_slowdown: float = 1.03
    # Block-scaled tiles that cycle through a ring of WGMMA accumulators (`wgmma_accumulators` >=
    # 2: the 64-row tiles, 128x112, 128x128) run slower per FLOP than the single-accumulator loop
    # at compute-bound shapes. An empirical factor: the ring's per-block SFB load is not the cause
    # (the ring with SFB held in warp registers measured 0.95-1.01x, NOTES N49).
    # Kernel durations on an H200 at 4096x2112x7168 (tests/data/2026-12-02-h200-fp8-kernel-
    # timings.json): 128x112 in a 2x1 cluster 106.5 µs, 128x192 99.2-100.4 µs, two tiles the
    # model otherwise scores alike. Any factor from 1.04 to 1.15 ranks the 24 timed shapes the
    # same (tests/cpu/test_heuristic_calibration.py); only compute-bound shapes feel it.
    accumulator_ring_slowdown: float = 1.06
    # Weight-gradient kernels (SFB per row of B) spend twice the promotion work per accumulator
    # (sfa·sfb per element). A tile computed in one wave per math warpgroup (tile_m = 64 x
    # warpgroups) whose main loop reads each block's column scales only after the WGMMA wait
    # (`_rolled_per_row_loop`: 1x1 clusters, k-grouped tiles not a multiple of 128 wide under 240
    # registers) leaves the tensor cores idle for that; the others read them while the WGMMAs run.
    # 128x128 in a 1x1 cluster measured ~1.12x the time of the same tile in a 2x1 cluster.
    rolled_per_row_loop_slowdown: float = 1.12
    # Two-wave per-row tiles (256 rows: the columns are read after the wait, the loop is rolled)
    # against single-wave tiles that read them early: 1.09 ranks the dense kernels re-timed with
    # tail splits (tests/data/2026-12-01-h200-wgrad-kernel-timings.json; 2048x7168x4096: 256x128
    # 152.5 µs in 3.4 waves against 128x128 in a 2x1 cluster 141.7 µs in 7 whole waves).
    two_wave_per_row_scale_slowdown: float = 1.09
    # Per-row-scaled kernels in a 2-CTA cluster sharing A or B, against a 1x1 cluster: below 1,
    # as those are the kernels that read their column scales early. The three per-row factors
    # were fitted on the weight-gradient kernel timings of 2026-11-30 (12 dense + 4 k-grouped
    # shapes, `cutegen tune --timings-out`; in-sample); they still rank the dense kernels re-timed
    # with tail splits in tests/data/2026-12-01-h200-wgrad-kernel-timings.json, which keeps the
    # k-grouped timings of 2026-11-30 (tests/cpu/test_heuristic_calibration.py).
    per_row_scale_multicast_slowdown: float = 0.97
    # The same where the cluster shares B (a 2x1 cluster): 128x128 tiles with tail-split last
    # waves measured 0.983-1.000x (mean 0.99x) the time of the 1x2 twin at equal tile counts
    # (tests/data/2026-12-01-h200-wgrad-kernel-timings.json).
    per_row_scale_b_multicast_slowdown: float = 0.96
    # Seconds a block-scaled tile spends per 128-wide K block at least, whatever its size (wait,
    # WGMMA chain, promotion), by the WGMMA accumulators it cycles through: the floor that bounds
    # small-M tiles: 64x16 tiles (four accumulators) at M=64, N=576 take ~100 ns per K block
    # after a fixed ~2.4 µs (NOTES N18). The constants are fitted, monotonic in the accumulator
    # count, to rank the 21 DeepGEMM shapes' measured kernels best (an earlier build's timings:
    # in-sample; tests/data/2026-12-02-h200-fp8-kernel-timings.json holds the current build's).
    block_latency_s: Mapping[int, float] = dataclasses.field(
        default_factory=lambda: {1: 0.18e-6, 2: 0.16e-6, 3: 0.13e-6, 4: 0.1e-6}
    )
    # Split K: what each wave of work units pays for the split beyond its share of K (the partial
    # tile written, the release fence and the counting atomic, the last CTA's acquire, its own
    # pipeline fill). Fitted on kernel durations of every split-K kernel at 2-12 splits on the 21
    # DeepGEMM shapes (an earlier build's, in-sample): 64x16 tiles at M=64, N=576, K=7168 measured
    # 6.9 µs at 3 splits against 8.0 µs for the best unsplit kernel, and splitting lost wherever
    # the tiles already filled the GPU. Since the fixup loads its partials in batches (64x32 tiles
    # at 7 splits 7.8 -> 6.6 µs), values down to 1 µs rank the re-measured kernels
    # (tests/data/2026-12-02-h200-fp8-kernel-timings.json) worse, not better: 3 µs stays.
    split_fixup_s: float = 3e-6
    # A last-wave split (`_last_wave_score`) pays beyond `split_fixup_s` what its units' short
    # main loops cost on top of their share of K (each fills the pipeline for a few K blocks).
    # Fitted on DeepGEMM's masked problems (an H100, 8 ragged draws each, NOTES N90): the split
    # kernels ran 4-7% slower than their unsplit twins at K 2048 (16 blocks) where the model
    # without it saw a 1-2% gain, and 5-12% faster at K 7168, as it saw.
    last_wave_split_s: float = 3.5e-6
    # Seconds every tile of the contiguous M-grouped op costs beyond its main loop, in each
    # wave: the tile's group is read from L1 (prefetched a tile before) and its rows' m_indices
    # while the main loop runs, but the padding-row selects and the store remain, and the term
    # stands for what the model does not see of the wider tiles' advantage. It favours fewer,
    # wider tiles (160, 192, 256 columns), most where K is short (but see
    # `column_wave_short_k_slowdown`). Fitted on kernel durations of every
    # contiguous kernel on DeepGEMM's six shapes (an earlier build's timings, in-sample): 6-8 µs
    # choose within 1.001x of the fastest (geometric mean), 1-4 µs 1.004x; on the current kernels
    # (tests/data/2026-12-02-h200-contiguous-kernel-timings.json) 1.001x.
    grouped_tile_overhead_s: float = 6e-6
    # Two-wave (256-row) tiles whose epilogue stages the whole output tile (`tma_store_whole_tile`,
    # `tma_store_per_warpgroup`) against the same tile moving it through a ring of sub-tiles:
    # faster where K has at most `whole_tile_max_k_blocks` blocks, slower above (256x128,
    # per-warpgroup stores: 1.04-1.08x at K <= 1024, 0.97-0.98x at K >= 7168; NOTES N32).
    whole_tile_max_k_blocks: int = 16
    whole_tile_short_k_factor: float = 0.97
    whole_tile_long_k_factor: float = 1.03
    # Tiles computed in column waves (`column_waves` > 1: a 256-wide tile as two 128-wide halves
    # over one A) where K has at most `whole_tile_max_k_blocks` blocks. The contiguous 128x256
    # tile (2x1 clusters) ran 0.99-1.01x the time of 128x192 at K 2048 (N 7168) on an H200 and
    # 1.02-1.04x on an H100, and 0.93-1.01x at K 7168 on both, where `grouped_tile_overhead_s`
    # scores it 11-13% faster at K 2048: this factor takes that back at short K only. 1.25-1.35
    # choose 128x192 at K 2048 and 128x256 at K 7168 (tests/data: 2026-12-03-h200-contiguous-
    # 128x256-timings.json, 2026-12-07-h100-contiguous-kernel-timings.json; within 1.001x and
    # 1.004x of the fastest kernel, from 1.004x and 1.016x) and change no other op's choice.
    column_wave_short_k_slowdown: float = 1.3
    # Kernels with swapped operand roles (B's rows as the MMA's M side: a grid rule whose tile rows
    # run along N) store D transposed, 64 columns per TMA box. Without a factor the model chose a
    # swapped 128x176 tile at 512x4096x7168 that ran 1.13x slower than the best other kernel; any
    # factor from 1.01 to 1.06 chooses swapped tiles at the five M = 333 shapes of the BF16 bench
    # and nowhere else among those timed (an H100, tests/data/2026-12-06-h100-bf16-swapped-kernel-
    # timings.json, tests/cpu/test_heuristic_calibration.py).
    swapped_roles_slowdown: float = 1.03

    @property
    def flops_per_sm(self) -> float:
        return self.peak_flops / self.reference_sms


DEFAULT_MODEL = CostModel()


@dataclasses.dataclass(frozen=True)
class Score:
    """One candidate's row of the `explain` table."""

    name: str
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    multicast: str
    tiles: int
    cluster_tiles: int
    waves: int
    wave_efficiency: float
    compute_us: float
    memory_us: float
    estimated_us: float
    useful_multicast: int
    source: str = "model"
    # Work units per tile: the K split count a split-K kernel is launched with (else 1).
    k_splits: int = 1
    # Bound by memory or latency, with a useful multicast that shares the operand with more bytes
    # in all (B where N >= M, else A).
    shares_larger_operand: bool = False
    # Compute-bound, with a cluster whose multicast shares the larger of the tile's two operand
    # boxes (B where the tile is wider than tall, A where taller): each CTA pair loads those
    # bytes once from L2 instead of twice. What breaks ties between compute-bound clusters.
    multicasts_larger_box: bool = False
    # Compute is the largest of its time terms.
    compute_bound: bool = True
    # One wave whose time is the chain of K-block latencies (neither compute nor memory).
    latency_bound: bool = False
    # Launched with the split-K workspace (per-stream scratch): among ties, the twin without wins.
    uses_workspace: bool = False
    # Math warpgroups sharing the tile: among compute-bound ties, more of them win.
    math_warpgroups: int = 1
    # A or B MN-major (layouts nn, tn, tt): ties are not broken by idle cluster CTAs or math
    # warpgroups there (`_rank`).
    reads_mn_major: bool = False

    @property
    def idle_cluster_ctas(self) -> int:
        """CTAs launched in clusters whose tiles lie past the problem's edge (a 2x1 cluster over
        an odd count of tile rows): they run the main loop on nothing."""
        return self.cluster_tiles * self.cluster_m * self.cluster_n - self.tiles

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _multicast(manifest: KernelManifest) -> str:
    value = str(manifest.schedule.get("multicast", "none")).lower()
    return value if value in ("none", "a", "b", "ab") else "none"


def _operand_bytes(manifest: KernelManifest, name: str, default: float = 2) -> float:
    """Bytes per element of an operand in global memory (FP4: a half)."""
    for operand in manifest.operands:
        if operand.name == name:
            return DTYPE_BITS.get(operand.dtype, 8 * default) / 8
    return default


# Tensor-core rate relative to bf16: 8-bit operands run at twice the rate.
_RATE_BY_ELEMENT_BYTES = {1: 2.0, 2: 1.0, 4: 0.5}


def _straddles_scale_blocks(manifest: KernelManifest) -> bool:
    """A kernel with one SFB per 128-row block of B whose tiles can span two of those blocks."""
    return manifest.fact("straddles_scale_blocks")


def _block_scaled_ring(manifest: KernelManifest) -> bool:
    """A kernel with one SFB per 128-row block of B whose main loop cycles through a ring of WGMMA
    accumulators."""
    return manifest.fact("sfb_per_block") and manifest.fact("wgmma_accumulators") >= 2


def _per_row_scales(manifest: KernelManifest) -> bool:
    """A block-scaled kernel with one SFB per row of B (weight gradients)."""
    return manifest.fact("sfb_per_row")


def _single_wave_per_row_scales(manifest: KernelManifest) -> bool:
    """A per-row-scaled kernel whose tile is computed in a single wave per math warpgroup."""
    return _per_row_scales(manifest) and manifest.fact("single_wave_tile")


def _rolled_per_row_loop(manifest: KernelManifest) -> bool:
    """A single-wave per-row-scaled kernel whose main loop reads each K block's column scales
    after the WGMMA wait, rolled (`Schedule.column_scales_early` false)."""
    return _single_wave_per_row_scales(manifest) and not manifest.fact("column_scales_early")


def _whole_tile_epilogue(manifest: KernelManifest) -> bool:
    """A two-wave tile whose epilogue stages the whole output tile (`tma_store_whole_tile`, or
    `tma_store_per_warpgroup`, which also does for single-wave tiles: those have no ring twin)."""
    return not manifest.fact("single_wave_tile") and manifest.fact("epilogue_stages_whole_tile")


def _column_waves(manifest: KernelManifest) -> bool:
    """A block-scaled tile computed in column waves (two 128-wide halves over one A)."""
    return manifest.fact("column_waves") > 1


def splits_tail(manifest: KernelManifest) -> bool:
    """A kernel that shares the K blocks of its last, partial wave's tiles among all its clusters
    (a `tail_split` launch argument: the dense weight gradient)."""
    return manifest.fact("splits_tail")


def tail_split_pays(tail_tiles: int, clusters: int, k: int) -> bool:
    """Whether a tail-splitting kernel splits a last wave of `tail_tiles` cluster tiles over
    `clusters` clusters at this K: the wave is at most TAIL_SPLIT_MAX_FILL full and each cluster
    is spared at least TAIL_SPLIT_MIN_SAVED_BLOCKS K blocks (the kernel's rule, `_tail_plan`)."""
    fill_num, fill_den = TAIL_SPLIT_MAX_FILL
    k_blocks = ceil_div(k, SCALE_BLOCK)
    return (
        0 < tail_tiles
        and tail_tiles * fill_den <= clusters * fill_num
        and k_blocks * (clusters - tail_tiles) >= TAIL_SPLIT_MIN_SAVED_BLOCKS * clusters
    )


def splits_k(manifest: KernelManifest) -> bool:
    """A kernel that shares each tile's K blocks among CTAs (launched with a split count)."""
    return manifest.fact("splits_k")


def splits_k_last_wave(manifest: KernelManifest) -> bool:
    """A split-K kernel that splits only the tiles of its last, partial wave (epilogue
    ``split_k_last_wave_tma_store``), each into min(split count, idle clusters) units."""
    return manifest.fact("splits_k_last_wave")


def normalize_splits(k: int, k_splits: int) -> int:
    """The split count a launch uses for ``k_splits`` requested: splits of ⌈KB/k_splits⌉ blocks
    (KB = ⌈K/128⌉), as many as it takes to cover KB, so that no split is empty."""
    k_blocks = max(1, ceil_div(int(k), SCALE_BLOCK))
    per_split = ceil_div(k_blocks, max(1, min(int(k_splits), k_blocks)))
    return ceil_div(k_blocks, per_split)


def _split_candidates(k: int) -> list[int]:
    k_blocks = max(1, ceil_div(int(k), SCALE_BLOCK))
    most = min(MAX_K_SPLITS, k_blocks // MIN_SPLIT_BLOCKS)
    return sorted({normalize_splits(k, s) for s in range(2, most + 1)} - {1}) or [1]


def score(
    manifest: KernelManifest,
    m: int,
    n: int,
    k: int,
    num_sms: int = DEFAULT_NUM_SMS,
    model: CostModel = DEFAULT_MODEL,
    rows_per_group: int | None = None,
    max_rows_per_group: int | None = None,
) -> Score:
    """Score one candidate for the problem (M, N, K); see the module docstring. With
    ``rows_per_group`` (masked grouped GEMMs), M is ceil(M / rows_per_group) groups of about
    that many rows (at most ``max_rows_per_group``), whose tiles do not span groups: each group
    pads its rows to the tile height; the estimate is the mean over `MASKED_ROWS_SPREAD` and the
    other fields are those at the expected rows. A split-K kernel's score is that of its best
    split count."""

    last_wave = splits_k(manifest) and splits_k_last_wave(manifest)
    unsplit: dict[int | None, Score] = {}  # a last-wave kernel's whole-tile score, per row count

    def at(rows: int | None, k_splits: int) -> Score:
        m_rows = ceil_div(max(int(m), 1), rows_per_group) * rows if rows_per_group else m
        if last_wave:
            if rows not in unsplit:
                unsplit[rows] = _score(manifest, m_rows, n, k, num_sms, model, rows, 1)
            return _last_wave_score(manifest, unsplit[rows], k, num_sms, model, k_splits, must_split=not rows_per_group)
        return _score(manifest, m_rows, n, k, num_sms, model, rows, k_splits)

    def spread(k_splits: int) -> Score:
        if not rows_per_group:
            return at(None, k_splits)
        rows_drawn = [round(f * rows_per_group) for f in MASKED_ROWS_SPREAD]
        if max_rows_per_group:
            rows_drawn = [max(1, min(max_rows_per_group, rows)) for rows in rows_drawn]
        # Each row count scored once (a cut spread repeats the largest).
        scored = {rows: at(rows, k_splits) for rows in {*rows_drawn, rows_per_group}}
        mean = sum(scored[rows].estimated_us for rows in rows_drawn) / len(rows_drawn)
        # The count launched is the candidate's: whether a last wave splits is the GPU's to see.
        return dataclasses.replace(scored[rows_per_group], estimated_us=mean, k_splits=k_splits)

    counts = _split_candidates(k) if splits_k(manifest) else [1]
    return min((spread(s) for s in counts), key=lambda s: (s.estimated_us, s.k_splits))


def _last_wave_score(
    manifest: KernelManifest, whole: Score, k: int, num_sms: int, model: CostModel, k_splits: int,
    must_split: bool,
) -> Score:
    """A last-wave split-K kernel launched with ``k_splits``, from its score as whole tiles
    (``whole``): the whole waves at the tile's time, then, when the last wave's r cluster tiles
    leave clusters idle, one unit of K / S with S = min(k_splits, clusters // r) (the kernel's
    rule, `_last_wave_plan`), the fix-up of S partial tiles and `CostModel.last_wave_split_s`.
    With ``must_split`` (a dense problem, whose tile count is known here) the kernel is a
    candidate only where that rule splits a last wave after at least one and at most
    `LAST_WAVE_MAX_WAVES` - 1 whole waves: elsewhere the split-K kernels (every tile split) or the
    plain ones serve, and the model is not trusted to rank the kernel as a plain tile."""
    rule = manifest.grid
    cluster_size = max(1, rule.cluster_m * rule.cluster_n)
    clusters = max(1, num_sms // cluster_size)
    last = whole.cluster_tiles % clusters
    splits = min(k_splits, clusters // last) if last else 1
    if must_split and not (splits > 1 and 2 <= whole.waves <= LAST_WAVE_MAX_WAVES):
        return dataclasses.replace(whole, k_splits=1, estimated_us=math.inf)
    if splits <= 1:  # no idle clusters to fill: the plain tile, launched unsplit
        return dataclasses.replace(whole, k_splits=1)
    per_tile = whole.estimated_us / whole.waves
    k_blocks = max(1, ceil_div(k, SCALE_BLOCK))
    unit = per_tile * ceil_div(k_blocks, splits) / k_blocks
    fixup = (
        model.split_fixup_s + model.last_wave_split_s + splits * rule.tile_m * rule.tile_n * 4 / model.sm_bandwidth_cap
    ) * 1e6
    return dataclasses.replace(
        whole, k_splits=k_splits, estimated_us=(whole.waves - 1) * per_tile + unit + fixup,
        wave_efficiency=whole.tiles / ((whole.waves - 1 + 1 / splits) * clusters * cluster_size),
    )


def split_k_count(
    manifest: KernelManifest, m: int, n: int, k: int, num_sms: int = DEFAULT_NUM_SMS,
    model: CostModel = DEFAULT_MODEL, rows_per_group: int | None = None, max_rows_per_group: int | None = None,
) -> int:
    """The split count the runtime launches a split-K kernel with for (M, N, K) (masked groups:
    see `score`): the model's best."""
    return score(manifest, m, n, k, num_sms, model, rows_per_group, max_rows_per_group).k_splits


def _score(
    manifest: KernelManifest,
    m: int,
    n: int,
    k: int,
    num_sms: int,
    model: CostModel,
    rows_per_group: int | None,
    k_splits: int,
) -> Score:
    rule = manifest.grid
    tm, tn, cm, cn = rule.tile_m, rule.tile_n, rule.cluster_m, rule.cluster_n
    cluster_size = max(1, cm * cn)
    m, n, k = max(int(m), 1), max(int(n), 1), max(int(k), 1)
    # Swapped operand roles: the tiles' rows run along N (B's rows), their columns along M.
    swapped = rule.rows_along_n
    a_name, b_name = ("b", "a") if swapped else ("a", "b")
    if swapped:
        m, n = n, m
    tiles_m, tiles_n = ceil_div(m, tm), ceil_div(n, tn)
    cluster_rows = ceil_div(tiles_m, cm)
    if rows_per_group:
        # A masked cluster's CTAs share one group: each group pads to whole cluster tiles.
        groups = ceil_div(m, rows_per_group)
        cluster_rows = groups * ceil_div(rows_per_group, tm * cm)
        tiles_m = cluster_rows * cm
    tiles = tiles_m * tiles_n
    cluster_tiles = cluster_rows * ceil_div(tiles_n, cn)
    # Split K: k_splits work units per tile, each over its share of K.
    tiles *= k_splits
    cluster_tiles *= k_splits
    k = ceil_div(ceil_div(k, SCALE_BLOCK), k_splits) * SCALE_BLOCK if k_splits > 1 else k
    usable = max(cluster_size, (num_sms // cluster_size) * cluster_size)
    clusters_per_wave = usable // cluster_size
    waves = ceil_div(cluster_tiles, clusters_per_wave)
    efficiency = tiles / (waves * usable)

    multicast = _multicast(manifest)
    mc_a = min(cn, tiles_n) if multicast in ("a", "ab") else 1
    mc_b = min(cm, tiles_m) if multicast in ("b", "ab") else 1
    a_bytes, b_bytes, d_bytes = (_operand_bytes(manifest, name) for name in (a_name, b_name, "d"))
    tile_bytes = (tm * a_bytes / mc_a + tn * b_bytes / mc_b) * k + tm * tn * d_bytes
    active = max(1, min(tiles, clusters_per_wave * cluster_size))
    sm_bandwidth = min(model.operand_bandwidth / active, model.sm_bandwidth_cap)
    compute = 2.0 * tm * tn * k / (model.flops_per_sm * _RATE_BY_ELEMENT_BYTES.get(a_bytes, 1.0))
    if _straddles_scale_blocks(manifest):
        compute *= model.split_scale_block_slowdown
    if _block_scaled_ring(manifest):
        compute *= model.accumulator_ring_slowdown
    if _rolled_per_row_loop(manifest):
        compute *= model.rolled_per_row_loop_slowdown
    elif _per_row_scales(manifest) and not _single_wave_per_row_scales(manifest):
        compute *= model.two_wave_per_row_scale_slowdown
    if mc_a * mc_b > 1 and _per_row_scales(manifest):
        compute *= model.per_row_scale_b_multicast_slowdown if mc_b > 1 else model.per_row_scale_multicast_slowdown
    short_k = ceil_div(k, SCALE_BLOCK) <= model.whole_tile_max_k_blocks
    if _whole_tile_epilogue(manifest):
        compute *= model.whole_tile_short_k_factor if short_k else model.whole_tile_long_k_factor
    if short_k and _column_waves(manifest):
        compute *= model.column_wave_short_k_slowdown
    memory = tile_bytes / sm_bandwidth
    latency = 0.0
    if manifest.fact("block_scaled"):
        ring = manifest.fact("wgmma_accumulators")
        latency = ceil_div(k, SCALE_BLOCK) * model.block_latency_s.get(ring, model.block_latency_s[1])
    compute_bound = compute >= max(memory, latency)
    latency_bound = waves == 1 and latency > max(compute, memory)
    # The multicast shares the operand with more bytes in all (B where N >= M, else A).
    shares_larger = (mc_b > 1 and n >= m) or (mc_a > 1 and m > n)
    # The larger of the tile's boxes (A's tm rows, B's tn); of equal boxes, the larger operand's.
    larger_box = (mc_b > 1 and tn > tm) or (mc_a > 1 and tm > tn) or (tn == tm and shares_larger)
    tile_overhead = model.grouped_tile_overhead_s if manifest.schedule.get("op") in CONTIGUOUS_OPS else 0.0
    # A tail split spreads a last (or only) partial wave over every cluster where it pays: it
    # costs its fraction of a wave.
    wave_time = float(waves)
    if splits_tail(manifest) and tail_split_pays(cluster_tiles % clusters_per_wave, clusters_per_wave, k):
        wave_time = cluster_tiles / clusters_per_wave
    estimated = wave_time * (max(compute, memory, latency) + tile_overhead)
    if swapped:
        estimated *= model.swapped_roles_slowdown
    if splits_k(manifest) and not splits_k_last_wave(manifest):
        # Every work unit writes its partial tile and counts itself, and the last of a tile reads
        # the other S - 1 alone, at one SM's rate. Each wave of units pays that.
        partial_bytes = k_splits * tm * tn * 4
        estimated += waves * (model.split_fixup_s + partial_bytes / model.sm_bandwidth_cap)
        if k_splits > 1 and waves > SPLIT_MAX_WAVES:
            estimated = math.inf  # no candidate at this count (see SPLIT_MAX_WAVES)
    return Score(
        name=manifest.name,
        tile_m=tm,
        tile_n=tn,
        cluster_m=cm,
        cluster_n=cn,
        multicast=multicast,
        tiles=tiles,
        cluster_tiles=cluster_tiles,
        waves=waves,
        wave_efficiency=efficiency,
        compute_us=compute * 1e6,
        memory_us=memory * 1e6,
        estimated_us=estimated * 1e6,
        useful_multicast=mc_a * mc_b,
        k_splits=k_splits,
        shares_larger_operand=not compute_bound and shares_larger,
        multicasts_larger_box=compute_bound and larger_box,
        compute_bound=compute_bound,
        latency_bound=latency_bound,
        uses_workspace=splits_k(manifest),
        math_warpgroups=int(manifest.schedule.get("math_warpgroups", 1)),
        reads_mn_major=manifest.schedule.get("layout", "nt") != "nt",
    )


def _rank(scores: Iterable[Score]) -> list[Score]:
    scores = list(scores)
    if not scores:
        return []
    best = min(s.estimated_us for s in scores)
    # Everything within the tolerance of the best is a tie, broken by the stable preferences:
    # the larger tile (fewer bytes in all), except where one wave's K-block latencies bound the
    # time: there the smaller tile, whose more CTAs each wait for fewer bytes per K block
    # (64x7168x576 ran 1.10x faster in 64x64 tiles than in 64x128: NOTES N42).
    # Then the cluster that multicasts: where memory or latency bounds the tile, the operand with
    # more bytes in all; where compute does, the larger of the tile's two boxes. H200 kernel
    # durations: 128x192 tiles in 2x1 clusters sharing B ran 1.01-1.09x faster than in 1x2
    # clusters sharing A at the eight dense M = 4096 shapes and 0.99-1.02x (five of six faster)
    # on DeepGEMM's contiguous ones; 256x128 tiles in 1x2 clusters 1.005-1.02x faster than in
    # 2x1 (tests/data/2026-12-02-h200-fp8-kernel-timings.json, -contiguous-kernel-timings.json).
    # Before the multicast, two preferences among tiles of one area. In one wave, the cluster
    # with fewer idle CTAs (tiles past the problem's edge): the model counts a wave's time, which
    # they do not lengthen, yet over the 849 one-wave pairs of the dense kernel timings in
    # tests/data a 2x1 or 1x2 cluster with idle CTAs ran 1.03-1.11x the time of its 1x1 twin
    # (geometric means per file; 1.3x for BF16 128x128 at M = 333 on an H200). Where compute
    # bounds the tile, more math warpgroups: 128x128 of two ran 1.09-1.12x faster than 64x256 of
    # one at 512x4096x7168, and 1.29x at 256x7168x2048 (tests/cpu/test_heuristic_calibration.py).
    # Neither preference holds for MN-major operands: 128x192 tn tiles ran 1.12-1.17x faster in
    # 2x1 clusters with idle CTAs than in 1x1 at M = 576, and 192-row tiles (not built) 0.81-1.23x
    # the speed of their 128-row ties (tests/data/2026-12-07-h100-bf16-mn-major-and-adding-timings.json).
    def key(s: Score) -> tuple:
        tied = s.estimated_us <= best * (1 + TIE_TOLERANCE)
        area = s.tile_m * s.tile_n
        return (
            0 if tied else 1,
            s.estimated_us if not tied else 0.0,
            area if s.latency_bound else -area,
            s.idle_cluster_ctas if s.waves == 1 and not s.reads_mn_major else 0,
            -s.math_warpgroups if s.compute_bound and not s.reads_mn_major else 0,
            -(s.useful_multicast if s.compute_bound or s.shares_larger_operand else 1),
            0 if s.shares_larger_operand else 1,
            0 if s.multicasts_larger_box else 1,
            s.cluster_m * s.cluster_n,
            s.uses_workspace,
            s.name,
        )

    return sorted(scores, key=key)


# ------------------------------------------------------------------------------------------------
# Tuning table

_tuning_cache: dict[tuple[str, float], dict[str, dict[str, str]]] = {}


def tuning_path(build_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """``$CUTEGEN_TUNING`` if set, else ``<build_dir>/tuning.json`` (None without a build dir)."""
    env = os.environ.get(TUNING_ENV)
    if env:
        return Path(env)
    if build_dir is not None:
        return Path(build_dir) / TUNING_FILE
    return None


def shape_key(m: int, n: int, k: int) -> str:
    return f"{int(m)},{int(n)},{int(k)}"


def load_tuning_table(
    build_dir: str | os.PathLike[str] | None = None, path: str | os.PathLike[str] | None = None
) -> dict[str, dict[str, str]]:
    """The tuning table ``{op: {"M,N,K": kernel_name}}``; empty when there is none.

    Cached by path and modification time. A table that exists but cannot be parsed is an
    `ArtifactError` (a silent fallback would hide a broken deployment).
    """
    where = Path(path) if path is not None else tuning_path(build_dir)
    if where is None or not where.is_file():
        return {}
    stamp = where.stat().st_mtime
    cached = _tuning_cache.get((str(where), stamp))
    if cached is not None:
        return cached
    try:
        raw = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"tuning table {where} cannot be read: {exc}") from exc
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ArtifactError(
            f"tuning table {where} must map op names to {{\"M,N,K\": kernel_name}} objects"
        )
    table = {
        str(op): {str(key).replace(" ", ""): str(name) for key, name in shapes.items()}
        for op, shapes in raw.items()
    }
    _tuning_cache[(str(where), stamp)] = table
    return table


def parse_tuned(entry: str) -> tuple[str, int | None]:
    """A tuning-table entry → (kernel name, split count or None): "NAME" or "NAME@SPLITS"."""
    name, _, splits = str(entry).partition("@")
    if not splits:
        return name, None
    if not splits.isdigit() or int(splits) < 1:
        raise ArtifactError(f"tuning-table entry {entry!r}: the split count after '@' must be a positive integer")
    return name, int(splits)


def tuned_split_count(
    op: str, name: str, m: int, n: int, k: int, build_dir: str | os.PathLike[str] | None = None,
    tuning: Mapping[str, Any] | None = None,
) -> int | None:
    """The split count the tuning table gives kernel ``name`` for this shape, if it does."""
    table = load_tuning_table(build_dir) if tuning is None else tuning
    entry = table.get(op, {}).get(shape_key(m, n, k))
    if entry is None:
        return None
    tuned_name, splits = parse_tuned(entry)
    return splits if tuned_name == name else None


def _tuned(
    op: str, candidates: list[KernelManifest], m: int, n: int, k: int, tuning: Mapping[str, Any]
) -> KernelManifest | None:
    entry = tuning.get(op, {}).get(shape_key(m, n, k))
    if entry is None:
        return None
    name, _ = parse_tuned(entry)
    for candidate in candidates:
        if candidate.name == name:
            return candidate
    return None  # a table naming a kernel that is not available here falls back to the model


# ------------------------------------------------------------------------------------------------
# Entry points


def _candidates(op: str, candidates: Iterable[KernelManifest]) -> list[KernelManifest]:
    matching = [c for c in candidates if c.op == op]
    if not matching:
        raise ArtifactError(
            f"no kernel for {op} among the candidates; build some with `cutegen build` for this GPU"
        )
    return matching


def explain(
    op: str,
    candidates: Iterable[KernelManifest],
    m: int,
    n: int,
    k: int,
    num_sms: int = DEFAULT_NUM_SMS,
    *,
    tuning: Mapping[str, Any] | None = None,
    build_dir: str | os.PathLike[str] | None = None,
    model: CostModel = DEFAULT_MODEL,
    rows_per_group: int | None = None,
    max_rows_per_group: int | None = None,
) -> list[Score]:
    """Every candidate's score, best first; a tuning-table pick comes first with source 'tuning'."""
    matching = _candidates(op, candidates)
    ranked = _rank(score(c, m, n, k, num_sms, model, rows_per_group, max_rows_per_group) for c in matching)
    table = load_tuning_table(build_dir) if tuning is None else tuning
    tuned = _tuned(op, matching, m, n, k, table)
    if tuned is not None:
        first = next(s for s in ranked if s.name == tuned.name)
        ranked = [dataclasses.replace(first, source="tuning")] + [
            s for s in ranked if s.name != tuned.name
        ]
    return ranked


def choose(
    op: str,
    candidates: Iterable[KernelManifest],
    m: int,
    n: int,
    k: int,
    num_sms: int = DEFAULT_NUM_SMS,
    *,
    tuning: Mapping[str, Any] | None = None,
    build_dir: str | os.PathLike[str] | None = None,
    model: CostModel = DEFAULT_MODEL,
    rows_per_group: int | None = None,
    max_rows_per_group: int | None = None,
) -> KernelManifest:
    """The candidate to run for (M, N, K): the tuning table's if it names one, else the model's.

    ``tuning`` given explicitly replaces the table lookup (pass ``{}`` to ignore any table);
    ``rows_per_group``, ``max_rows_per_group``: see `score`.
    """
    matching = _candidates(op, candidates)
    table = load_tuning_table(build_dir) if tuning is None else tuning
    tuned = _tuned(op, matching, m, n, k, table)
    if tuned is not None:
        return tuned
    best = _rank(score(c, m, n, k, num_sms, model, rows_per_group, max_rows_per_group) for c in matching)[0]
    return next(c for c in matching if c.name == best.name)


def format_table(scores: Iterable[Score]) -> str:
    """A fixed-width text rendering of `explain`'s rows."""
    rows = [
        "name  tile  cluster  mc  splits  tiles  waves  eff  compute_us  memory_us  est_us  source",
    ]
    for s in scores:
        rows.append(
            f"{s.name}  {s.tile_m}x{s.tile_n}  {s.cluster_m}x{s.cluster_n}  {s.multicast}  {s.k_splits}  "
            f"{s.tiles}  {s.waves}  {s.wave_efficiency:.2f}  {s.compute_us:.2f}  "
            f"{s.memory_us:.2f}  {s.estimated_us:.2f}  {s.source}"
        )
    return "\n".join(rows)


__all__ = [
    "CostModel",
    "DEFAULT_MODEL",
    "MASKED_ROWS_SPREAD",
    "Score",
    "choose",
    "explain",
    "format_table",
    "load_tuning_table",
    "normalize_splits",
    "parse_tuned",
    "score",
    "shape_key",
    "split_k_count",
    "splits_k",
    "splits_k_last_wave",
    "tuned_split_count",
    "tuning_path",
]
