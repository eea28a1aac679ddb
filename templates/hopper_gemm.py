"""Hopper (sm_90a) warp-specialised persistent GEMM templates: D[M,N] = A[M,K] · B[N,K]ᵀ.

Two ops share one kernel: `bf16_gemm_nt` (bf16 operands, fp32 accumulation) and `fp8_gemm_nt`
(e4m3 operands with DeepSeek-V3 block scales: fp32 per 1x128 of A, per 128x128 of B, promoted into
fp32 registers after every 128-wide K block). D is bf16.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cutlass.tensor_utils.tensormap import TensorMapManager, TensorMapUpdateMode
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from cutegen.templates.dtypes import cute_dtype
from cutegen.templates.gemm_contract import (
    TENSORMAP_BYTES,
    TENSORMAP_WORDS,
    GemmContract,
    scale_vector_tma_binding,
    shape_binding,
    tma_binding,
    with_group_mode,
)
from cutegen.templates.gmem_vec import vec16_at
from cutegen.templates.gemm_entries import (
    Fp8GemmNtEntry,
    Fp8GemmNtSplitKEntry,
    MGroupedContiguousEntry,
    MGroupedMaskedEntry,
)
from cutegen.templates.tile_order import TileOrder
from cutegen.schedules.spec import (
    SCALE_BLOCK,
    TAIL_SPLIT_MAX_FILL,
    TAIL_SPLIT_MIN_SAVED_BLOCKS,
    THREADS_PER_WARPGROUP,
    DType,
    Raster,
    ScaleFormat,
    Schedule,
    scale_stage_elems,
    sfb_boundaries,
)

# Named barrier 0 is __syncthreads; 1 is the math warpgroups' epilogue barrier.
EPILOGUE_BARRIER_ID = 1
# Rows of one box of A's tail tensor map (see `a_tail_slices` in __init__): a multiple of the
# 128-byte swizzle atom's 8 rows, so a slice of a stage's A buffer keeps the stage's layout.
A_TAIL_SLICE_ROWS = 16
# L2 eviction priorities of TMA loads (the 64-bit cache policies of `createpolicy`, as CUTLASS's
# CacheHintSm90 spells them); a load without a policy passes 0.
L2_EVICT_FIRST = 0x12F0000000000000
L2_EVICT_LAST = 0x14F0000000000000
# Dense GEMMs (and masked groups) with at most this many rows of output tiles read each B tile
# from every tile row at about the same time and never again. Their B loads are marked
# evict-first and their A loads evict-last, so that streaming B replaces B's own earlier lines,
# not A and not what other kernels left in L2 (dirty lines there would be written back during
# the GEMM). On an H200: M <= 128 ran 1.00-1.13x faster; masked groups of max_m 256 and 512 ran
# 1.01-1.06x faster; M = 4096, where later tile rows read every B tile again, lost 1.5% with the
# same policies (NOTES.md).
STREAMED_B_MAX_TILE_ROWS = 2
# K blocks per chunk of the tile's SFB held in warp registers (one per lane) by the block-scaled
# main loop.
SFB_CHUNK_BLOCKS = 32
# Split-K fixup: registers per math thread for the partial tiles loaded in one batch (with 128,
# batches of two 64-register partials spilled in the 64x128 and 128x128 kernels), and the most
# splits one batch holds.
SPLIT_K_READ_REGISTERS = 112
SPLIT_K_MAX_READ_BATCH = 8


@dsl_user_op
def _opaque(x: cutlass.Float32, *, loc=None, ip=None) -> cutlass.Float32:
    """x, through a register move the compiler cannot look through (keeps a value it would
    otherwise rematerialise or sink where it was written)."""
    return cutlass.Float32(
        llvm.inline_asm(
            T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=f,f",
            has_side_effects=False, is_align_stack=False,
        )
    )


class StaticStage(pipeline.PipelineState):
    """A consumer pipeline state whose stage index is a constant of the traced code (the phase
    stays a run-time bit): shared-memory addresses, WGMMA descriptors and barrier addresses of
    its stage are then immediates. `advance` moves the index at trace time and flips the phase on
    wrapping. Never loop-carried: a loop carries the phase and rebuilds the state."""

    def __init__(self, stages: int, index: int, phase):
        super().__init__(stages, cutlass.Int32(0), index, phase)

    def clone(self, *, loc=None, ip=None) -> "StaticStage":
        return StaticStage(self._stages, self._index, self._phase)

    def advance(self, count: int = 1, *, loc=None, ip=None) -> None:
        assert count == 1, "a static stage advances one block at a time"
        self._index += 1
        if self._index == self._stages:
            self._index = 0
            self._phase = self._phase ^ 1


class StageLoads(NamedTuple):
    """What the producer needs, besides A, to load a stage of one tile: B, SFA and per-row SFB
    (their TMA atoms, partitions and multicast), and the tile's coordinates."""

    tma_atom_b: Any
    tBgB_k: Any
    tBsB: Any
    b_mcast_mask: Any
    load_desc_b: Any
    tma_atom_sfa: Any
    tSFAgSFA: Any
    tSFAsSFA: Any
    tma_atom_sfb: Any
    tSFBgSFB: Any
    tSFBsSFB: Any
    ab_first_block: Any  # A and B are addressed from here (the split's or piece's first K block)
    first_block: Any  # the scales from here (the k-grouped op's group start, or as above)
    tile_m: Any
    tile_n: Any
    group: Any
    # Contiguous layout with B multicast (2x1 clusters): whether the pair's tiles share B (same
    # group); when they do not, this CTA loads both halves of its own group's B (`tBgB_other_k`
    # into `tBsB_other`), each multicast to itself only (`own_mask`).
    share_b: Any = None
    tBgB_other_k: Any = None
    tBsB_other: Any = None
    own_mask: Any = None
    # L2 policies of the B and A loads (None: the default; see STREAMED_B_MAX_TILE_ROWS).
    b_cache_policy: Any = None
    a_cache_policy: Any = None


class HopperGemmKernel(TileOrder):
    """Persistent warp-specialised WGMMA GEMM with TMA loads, TMA multicast and a TMA-store epilogue.

    Operands (all K-major, "NT"): A [M, K], B [N, K], D [M, N] row-major. M, N, K and the leading
    strides are run-time values; out-of-range rows, columns and K are handled by the TMA unit
    (zero fill on load, clipping on store).

    Warp roles (threads = 128 · (1 + math_warpgroups)):
      - warpgroup 0, warp 0 — **TMA producer**: walks the same tile sequence as the math warpgroups
        and, per K block, waits for a free stage, then issues the TMA loads of A and B into it
        (multicast to the peer CTA of the cluster for the shared operand). In the dense GEMMs with
        64-row tiles, the tile that holds row M - 1 when M ends inside it loads A through a second
        tensor map of 16-row boxes, only the slices that start before M, never multicast (a tile
        past M loads no A): rows past M in a TMA box cost time even though they are zero-filled.
        Where the output has at most STREAMED_B_MAX_TILE_ROWS tile rows (dense GEMMs but the
        weight gradient; masked groups by max_m), B's loads are marked L2 evict-first and A's
        evict-last. Warpgroup 0 lowers its register budget to `producer_regs` with setmaxnreg; its warps 1–3
        idle.
      - warpgroups 1..math_warpgroups — **math (consumers)**: raise their budget to
        `consumer_regs`, issue WGMMA on each stage (warpgroup w owns rows
        [64·(w-1)·tile_m/(64·math_warpgroups) …) of the tile), keep one WGMMA batch in flight,
        release the previous stage, then run the epilogue: fp32 → bf16 in registers, stmatrix into
        swizzled shared-memory sub-tile buffers, one elected warp issues their TMA stores. With a
        buffer per sub-tile (`Schedule.epilogue_whole_tile`: single-wave tiles where it fits, and
        tiles of the `tma_store_whole_tile` and `tma_store_per_warpgroup` epilogues) the whole
        tile is written between two barriers and stored as one bulk group; otherwise the
        sub-tiles cycle through a ring of `epilogue_stages` buffers with two barriers each. With
        `tma_store_per_warpgroup` the sub-tiles are 64 rows, one warpgroup's rows of a wave: each
        math warpgroup writes, synchronises (its own named barrier) and stores (its first warp,
        its own bulk group) only its sub-tiles, so the two warpgroups never wait for each other
        and one's epilogue overlaps the other's main loop.

    Block-scaled path (`fp8_gemm_nt` and the grouped / weight-gradient ops, scale = f32; tile_k =
    128, one scale block; `fp8_gemm_nt` also takes K not a multiple of 128: its last K block reads
    zeros past K and its own, partial scale block): each stage also holds the tile's column of
    SFA (tile_m fp32, loaded by TMA with A from the MN-major, TMA-aligned SFA [M, ⌈K/128⌉]; each
    stage's column starts 128-byte aligned); SFB [⌈N/128⌉, ⌈K/128⌉] is read from global memory by the math threads (one
    or two values per K block: a tile spans at most two 128-column scale blocks, and the main
    loop is compiled once per column where the second block can begin, so that each accumulator
    chunk's scale is fixed at compile time), or, for the weight gradient, staged per row of B by
    TMA like SFA. The tile's rows are computed in `waves` of 64 rows per math warpgroup
    (tile_m=256 with two warpgroups: two waves), or a 256-wide tile's columns in two waves of 128
    (`Schedule.column_waves`: each wave's WGMMAs take its half of B and the same A, and its
    promotion its own SFB block). Per K
    block and wave a math warpgroup issues its WGMMAs into one accumulator from zero
    (ACCUMULATE=False on the first), reads its rows' SFA from the stage while they run, waits for
    them and promotes: final[wave] += acc · sfa[row] · sfb[col block]; after the last wave it
    releases the stage and, before promoting that wave, probes the next stage's full barrier
    with a try-wait (the next block's wait is skipped when it has arrived). SFB is held in warp
    registers, SFB_CHUNK_BLOCKS K blocks at a time (lane i holds block 32c + i of chunk c, the
    next chunk loaded while this one runs) and read per block with one shuffle; the K loop runs
    chunk by chunk, unrolled twice within a chunk, or (`Schedule.static_stage_rounds`) in rounds
    of one block per stage whose stage indices are constants, so that the stages' WGMMA
    descriptors, SFA addresses and full/empty barriers are immediates. The two math warpgroups own
    different rows, so one can promote while the other's WGMMAs run on the tensor cores.
    Single-wave tiles whose registers allow it cycle through a ring of D =
    `Schedule.wgmma_accumulators` WGMMA accumulators (2 for 128-row tiles, up to 4 for small
    ones): block kb+D-1's WGMMAs are issued before the warpgroup waits for block kb
    (wait_group(D-1)) and promotes it (two-accumulator rings of tiles within one
    SFB block probe the next block's stage before the promotion, like the waves above); the
    ring reads each block's SFB from global memory when it issues the block, D - 1 blocks
    before its promotion needs it.

    k-grouped weight gradient (`k_grouped_fp8_gemm_nt_contiguous`): the tile sequence runs over
    the groups with at least one token (D carries a group mode); before its first tile of a new
    group the producer warp rewrites this CTA's TMA descriptors of A and B in the global
    workspace (copied from the host's descriptors once, then address, extents and stride
    replaced with `tensormap.replace`, released and acquired through the tensormap proxy fence);
    the scales are TMA-loaded at the group's first block plus the K block.

    Contiguous layout (`m_grouped_fp8_gemm_nt_contiguous`) in 2x1 clusters with B multicast: the
    two CTAs hold M tiles that may belong to two groups. Both read both tiles' groups at the
    tile's start; where they are one group, each loads its half of B and multicasts it to the pair;
    otherwise each loads both halves of its own group's B, multicast to itself alone. The pair
    loads and computes unless both tiles are padding, so both CTAs walk the same stages (each
    CTA's consumers release the other's); a padding tile computed beside its pair's tile has its
    rows zeroed, or is not written with the opt-out. A math warpgroup whose 64 rows of the tile
    are all padding (padding being a tile's tail, exactly when its first row is) issues no
    WGMMAs: it waits for each stage and releases it, and its rows are written as zeros, so the
    tensor cores run the other warpgroup's WGMMAs alone (DeepGEMM's kernel skips such
    warpgroups too).

    Pipelines:
      - **mainloop** (PipelineTmaAsync, `stages` slots of A+B(+SFA)): producer = the TMA warp (one
        arrive per stage with the transaction byte count of A+B, completed by the TMA unit; the
        tail tile above arrives with its own count, the A slices it loads plus B and SFA);
        consumers = every math warp of every CTA that receives the stage through multicast: the
        empty barrier expects `mcast_size · 4 · math_warpgroups` warp arrivals, where
        mcast_size = cluster_m + cluster_n − 1 (the CTAs that write into this CTA's stage).
      - **epilogue store** (PipelineTmaStore): producer = the math threads (commit groups of TMA
        stores: one per sub-tile in a ring of `epilogue_stages` slots, or one per tile when the
        whole tile is staged), drained with `producer_tail` before exit.

    Barriers: mbarriers of the mainloop pipeline (full and empty, per stage) initialised by
    warp 0 and made visible cluster-wide (init arrive/wait) before first use; named barrier
    EPILOGUE_BARRIER_ID over the math threads around each epilogue sub-tile, or around the
    whole tile (previous stores have read the buffers → smem written → fence.proxy.async → TMA
    stores issued); with `tma_store_per_warpgroup`, named barriers EPILOGUE_BARRIER_ID and
    EPILOGUE_BARRIER_ID + 1 over one math warpgroup each, in the same order.

    Persistent scheduling: the grid is (cluster_m, cluster_n, P) with cluster (cluster_m,
    cluster_n, 1); cluster z walks cluster tiles z, z+P, … Cluster tiles are ordered in bands of
    `group_size` cluster-tile rows (raster along M) or columns (raster along N) for L2 reuse (the
    contiguous layout divides by the band with FastDivmod divisors made once per CTA). A CTA
    whose tile lies past M or N still loads (zeros; no A for the 64-row dense tiles) and takes part
    in multicast, and its stores are clipped, so the cluster's barriers stay balanced. Dense weight
    gradients launched with `tail_split` = 1 run as many clusters as the GPU holds, walk the
    whole waves so, then, where it pays (a last or only wave at most 4/5 full and long enough in
    K), split the K blocks of its tiles evenly among all the clusters (`_tail_plan`): each
    cluster computes a piece of every tail tile its share touches (one or two) and reduce-adds
    each into D.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.a_dtype = cute_dtype(s.a_dtype)
        self.b_dtype = cute_dtype(s.b_dtype)
        self.c_dtype = cute_dtype(s.c_dtype)
        self.acc_dtype = cute_dtype(s.acc_dtype)
        self.tile_shape_mnk = (s.tile_m, s.tile_n, s.tile_k)
        self.cluster_shape_mn = (s.cluster_m, s.cluster_n)
        self.atom_layout_mnk = (s.math_warpgroups, 1, 1)
        self.num_mma_warpgroups = s.math_warpgroups
        self.num_mma_threads = s.math_warpgroups * THREADS_PER_WARPGROUP
        self.threads_per_cta = s.threads_per_cta
        self.ab_stage = s.stages
        self.epi_stage = s.epilogue_stages
        self.epi_tile = s.epi_tile
        # A buffer per sub-tile (the whole output tile) or a ring (`Schedule.epilogue_whole_tile`).
        self.epi_whole_tile = s.epilogue_whole_tile
        # Each math warpgroup stores its own 64-row sub-tiles, synchronised within itself only
        # (`Epilogue.TMA_STORE_PER_WARPGROUP`), so the two never wait for each other.
        self.epi_per_warpgroup = s.epilogue.per_warpgroup
        self.producer_regs = s.producer_regs
        self.consumer_regs = s.consumer_regs
        self.num_mcast_ctas_a = s.cluster_n
        self.num_mcast_ctas_b = s.cluster_m
        self.is_a_mcast = s.multicast.covers_a and s.cluster_n > 1
        self.is_b_mcast = s.multicast.covers_b and s.cluster_m > 1
        # The contiguous layout (M-grouped, not masked), as the Blackwell template names it.
        self.contiguous = s.op.is_m_grouped and not s.op.is_masked
        # The contiguous layout's 2x1 clusters hold two M tiles that may belong to two groups:
        # they share B only when they are one group's (`_pair_of_tiles`).
        self.b_shared_per_tile = self.is_b_mcast and self.contiguous
        self.raster_along_m = s.raster == Raster.ALONG_M
        # 64-row tiles of the dense GEMMs load the tile that holds row M - 1, when M ends inside
        # it, through a second tensor map of A with A_TAIL_SLICE_ROWS-row boxes, skipping the
        # slices that start at or past M; every other tile loads one whole box (multicast where
        # the schedule says). Rows of a box past M are zero-filled by the TMA unit at ~3 ns per
        # row per box on an H200: with M < 64 every K block paid for up to 63 of them (up to 2.5x
        # the time of M = 64), while four small boxes instead of one cost 1.15-1.27x on whole
        # tiles (NOTES.md). Rows of skipped slices keep stale data; they only feed accumulator rows
        # past M, which are never stored. The tail tile's stages arrive with their own byte count
        # in one arrive-and-expect (a peer's multicast B may land before it; see
        # `_produce_tail_tile`). Only 64-row tiles: wider ones serve M of 128 and more, where one
        # partial tile matters little.
        dense = not (s.op.is_m_grouped or s.op.is_masked or s.op.is_k_grouped)
        self.a_tail_slices = s.tile_m // A_TAIL_SLICE_ROWS if dense and s.tile_m == 64 else 0
        # Dense GEMMs but the weight gradient (whose M is the wide side), and the masked layout
        # (from max_m, each group's B read by its own tile rows), choose their loads' L2 policies
        # at run time (STREAMED_B_MAX_TILE_ROWS). The contiguous layout measured no gain from them.
        self.hints_streamed_b = (dense or s.op.is_masked) and not s.op.scales_b_per_row
        self.block_scaled = s.scale != ScaleFormat.NONE
        # M-grouped (MoE, contiguous layout): B and SFB have a group mode; m_indices maps rows to
        # groups, and a tile takes the group of its first row (segments are tile-aligned).
        self.m_grouped = s.op.is_m_grouped
        # Masked layout: A, SFA and D carry the group mode too; masked_m[g] rows are real and the
        # scheduler walks each group's tiles (N fastest), skipping everything past masked_m[g].
        self.masked = s.op.is_masked
        # Weight-gradient recipe: SFB per 1x128 of B (per row), staged by TMA like SFA, and D
        # accumulated in fp32 by a TMA reduce-add store.
        self.sfb_per_row = s.op.scales_b_per_row
        # k-grouped (MoE weight gradient): groups split K; A_g, B_g are stored one group after
        # another with row stride 128·⌈k_g/128⌉, so each group needs its own TMA descriptors of A
        # and B, which the producer writes into this CTA's workspace slot on the GPU. D carries a
        # group mode; the scales are one [Σ blocks, M|N] tensor indexed by the group's first block.
        self.k_grouped = s.op.is_k_grouped
        self.d_grouped = self.masked or self.k_grouped
        # Split K (fp8_gemm_nt): a tile's K blocks are shared by `k_splits` CTAs (a launch
        # argument); the last to finish adds the others' fp32 partials (see `_split_k_fixup`).
        self.split_k = s.epilogue.splits_k
        # Splits whose partial tiles the fixup's last CTA loads before adding: 8 for 64x16
        # tiles, 7 for 64x32, 3 for 64x64, 1 for 64x128 and 128x128.
        partial_regs = s.tile_m * s.tile_n // (THREADS_PER_WARPGROUP * s.math_warpgroups)
        self.split_k_read_batch = max(1, min(SPLIT_K_MAX_READ_BATCH, SPLIT_K_READ_REGISTERS // partial_regs))
        # Tail split (`Op.splits_last_wave`; the `tail_split` launch argument, 0 = off): the K
        # blocks of the last, partial wave's cluster tiles are shared evenly by all the clusters
        # the GPU holds (the grid is all of them), each adding its partial sums into D with the
        # TMA reduce-add a whole tile uses, so it needs no workspace and no fixup (see
        # `_tail_plan`). The order of a split tile's fp32 additions then varies between runs.
        self.tail_split = s.op.splits_last_wave
        # A tile spans one or two 128-column blocks of SFB (see the scale_blocks_per_tile rule).
        self.single_sfb_block = SCALE_BLOCK % s.tile_n == 0
        # The column where a two-block tile's second SFB block begins takes few values (tile j
        # starts at j·tile_n): each gets its own copy of the main loop with the block of every
        # accumulator chunk fixed at compile time (see `_block_scaled_tile`).
        self.sfb_boundaries = sfb_boundaries(s.tile_n)
        # Block-scaled ops: the tile's rows are computed in waves of 64 per math warpgroup, each
        # wave's WGMMAs into one accumulator that is promoted before the next wave.
        # 256-wide tiles are computed in column waves of 128 instead (`Schedule.column_waves`):
        # `all_waves` counts every wave of the tile, `row_waves` the row blocks alone.
        self.row_waves = s.waves
        self.column_waves = s.column_waves
        self.all_waves = s.all_waves
        self.wave_columns = s.wave_columns
        # Single-wave tiles may cycle through a ring of WGMMA accumulators: block kb+D-1's WGMMAs
        # are issued before block kb is promoted, so D-1 blocks are always in flight.
        self.wgmma_accumulators = s.wgmma_accumulators
        # The contiguous layout locates its tiles with FastDivmod divisors made once per CTA
        # (`_make_raster_divisors`): on an H200 1.005-1.028x on DeepGEMM's six problems, most at
        # K = 2048. Not the others: making the divisors costs each CTA a 64-bit division before
        # its first tile, and fp8_gemm_nt at M = 64 and 128 (one short tile per CTA) ran
        # 0.93-0.99x; at M = 4096 it gained under 1%, the weight gradients nothing (NOTES.md).
        self.fast_raster = self.contiguous
        # Per-row SFB read from the stage while the WGMMAs run (`Schedule.column_scales_early`).
        self.column_scales_early = s.column_scales_early
        # Single-accumulator K blocks in rounds of one per stage (`Schedule.static_stage_rounds`).
        self.static_stage_rounds = s.static_stage_rounds
        # Contiguous layout, one wave per warpgroup: a math warpgroup whose rows of the tile are
        # all padding issues no WGMMAs (it only walks the stages), so the tensor cores run the
        # other warpgroup's alone (`_warpgroup_rows_real`).
        self.skips_padding_warpgroups = self.contiguous and s.waves == 1
        self.group_size = s.group_size
        # Masked clusters are one CTA tall: a scheduled tile covers tile_m rows of a group.
        self.masked_tile_rows = s.tile_m
        self.buffer_align_bytes = 1024
        self.load_warp_id = 0
        self.epi_store_warp_id = 4  # first warp of the first math warpgroup
        # Filled while tracing the host function.
        self.smem_bytes: int | None = None

    # ---- layouts ----------------------------------------------------------------------------
    def _make_smem_layouts(self):
        tm, tn, tk = self.tile_shape_mnk
        k_major = LayoutEnum.ROW_MAJOR  # K contiguous for A [M,K] and B [N,K]
        a_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(k_major, self.a_dtype, tk), self.a_dtype
        )
        a_staged = cute.tile_to_shape(a_atom, (tm, tk, self.ab_stage), order=(0, 1, 2))
        # The same bytes as a_tail_slices slices per stage: slice j of stage i is buffer
        # i·a_tail_slices + j (the swizzle atom spans 8 rows: a slice is a contiguous run).
        a_tail_staged = None
        if self.a_tail_slices:
            a_tail_staged = cute.tile_to_shape(
                a_atom, (A_TAIL_SLICE_ROWS, tk, self.a_tail_slices * self.ab_stage), order=(0, 1, 2)
            )
        b_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(k_major, self.b_dtype, tk), self.b_dtype
        )
        b_staged = cute.tile_to_shape(b_atom, (tn, tk, self.ab_stage), order=(0, 1, 2))
        em, en = self.epi_tile
        c_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.c_dtype, en),
            self.c_dtype,
        )
        epi_staged = cute.tile_to_shape(c_atom, (em, en, self.epi_stage), order=(0, 1, 2))
        return a_staged, a_tail_staged, b_staged, epi_staged

    def _make_tiled_mma(self, atom_layout_mnk=None):
        """The kernel's tiled WGMMA (its math warpgroups stacked along M; its atom as wide as
        the tile, or as one column wave), or one over `atom_layout_mnk` warpgroups (the
        per-warpgroup epilogue's copy takes one)."""
        return sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            self.acc_dtype,
            atom_layout_mnk or self.atom_layout_mnk,
            tiler_mn=(64, self.wave_columns),
        )

    def _staged_subtiles(self, epi_tile_num, epi_tile_layout, wg_offset):
        """(fragment chunk, buffer, tile coordinate) of each epilogue sub-tile this thread
        writes when the whole tile is staged: every sub-tile of the tile, or with per-warpgroup
        stores only its warpgroup's, in the order of its accumulator fragment (wave w, column
        block c: row block w · math_warpgroups + warpgroup)."""
        if not self.epi_per_warpgroup:
            return [(i, i, epi_tile_layout.get_hier_coord(i)) for i in range(epi_tile_num)]
        cols = self.tile_shape_mnk[1] // self.epi_tile[1]
        subtiles = []
        for i in range(self.row_waves * cols):
            row_block = (i // cols) * self.num_mma_warpgroups + wg_offset
            subtiles.append((i, row_block * cols + i % cols, (row_block, i % cols)))
        return subtiles

    # ---- launch contract ----------------------------------------------------------------------
    def param_bindings(self) -> list[dict]:
        """The kernel's parameters in order, each with the binding the runtime fills it from.

        Valid after tracing (the swizzles are read off the shared-memory layouts the DSL built).
        One entry per `.param`: TMA atom → 128-byte tensor map; TMA coordinate tensor → its
        dynamic extents as 32-bit integers.
        """
        if self.smem_bytes is None:
            raise RuntimeError("param_bindings() is only known after the kernel has been traced")
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        em, en = self.epi_tile
        s = self.schedule

        def tma(operand: str, dtype: DType, box_rows: int, box_cols: int) -> dict:
            return tma_binding(operand, dtype.value, box_rows, box_cols, self.smem_swizzles[operand])

        shape = shape_binding
        scale_vector_tma = scale_vector_tma_binding

        # With multicast over n CTAs each CTA loads 1/n of the box (cut along the last TMA dim).
        a_rows = tm // cn if self.is_a_mcast else tm
        b_rows = tn // cm if self.is_b_mcast else tn
        # A [G, max_m, K] (masked) and B [G, N, K] (M-grouped) carry a group mode. The k-grouped
        # op's flat A and B are viewed as [M, KT] and [N, KT] (KT = 128 · Σ blocks): only a
        # template; the kernel rewrites address, extents and stride per group.
        k_extent = "KT" if self.k_grouped else "K"
        params = [
            {"name": "tma_a", **with_group_mode(tma("a", s.a_dtype, a_rows, tk), self.masked)},
            {"name": "extents_a", **shape("a", ["M", k_extent], self.masked)},
            {"name": "tma_b", **with_group_mode(tma("b", s.b_dtype, b_rows, tk), self.m_grouped)},
            {"name": "extents_b", **shape("b", ["N", k_extent], self.m_grouped)},
        ]
        if self.block_scaled:
            params += [
                {"name": "tma_sfa", **with_group_mode(scale_vector_tma("sfa", tm), self.masked)},
                {"name": "extents_sfa", **shape("sfa", ["M", "KB"], self.masked)},
            ]
            if self.sfb_per_row:  # SFB [N, KB] per 1x128 of B, staged like SFA
                params += [
                    {"name": "tma_sfb", **scale_vector_tma("sfb", tn)},
                    {"name": "extents_sfb", **shape("sfb", ["N", "KB"])},
                ]
            else:
                params.append({"name": "sfb", "kind": "pointer", "operand": "sfb"})
        params += [
            {"name": "tma_d", **with_group_mode(tma("d", s.c_dtype, em, en), self.d_grouped)},
            {"name": "extents_d", **shape("d", ["M", "N"], self.d_grouped)},
        ]
        if self.masked:
            params.append({"name": "masked_m", "kind": "pointer", "operand": "masked_m"})
        elif self.k_grouped:
            params += [
                {"name": "group_sizes", "kind": "pointer", "operand": "group_sizes"},
                {"name": "workspace", "kind": "pointer", "operand": "workspace"},
                # A and B again as plain pointers: the per-group descriptors start from them.
                {"name": "a_base", "kind": "pointer", "operand": "a"},
                {"name": "b_base", "kind": "pointer", "operand": "b"},
            ]
        elif self.m_grouped:
            params += [
                {"name": "m_indices", "kind": "pointer", "operand": "m_indices"},
                {"name": "zero_padding", "kind": "scalar", "dtype": "i32", "expr": "ZERO_PADDING"},
            ]
        if self.split_k:
            params += [
                {"name": "split_counters", "kind": "pointer", "operand": "split_counters"},
                {"name": "split_partials", "kind": "pointer", "operand": "split_partials"},
                {"name": "k_splits", "kind": "scalar", "dtype": "i32", "expr": "K_SPLITS"},
            ]
        if self.tail_split:
            params.append({"name": "tail_split", "kind": "scalar", "dtype": "i32", "expr": "TAIL_SPLIT"})
        if self.a_tail_slices:
            # A again, in A_TAIL_SLICE_ROWS-row boxes: the tile that holds row M - 1.
            params.append({"name": "tma_a_tail", **tma("a", s.a_dtype, A_TAIL_SLICE_ROWS, tk)})
        return params

    # ---- host side --------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """`bf16_gemm_nt`: D = A · Bᵀ."""
        self._launch(a, b, d, None, None, max_active_clusters, stream)

    @cute.jit
    def _launch(
        self, a, b, c, sfa, sfb, max_active_clusters, stream, m_indices=None, zero_padding=None,
        masked_m=None, group_sizes=None, workspace=None, split_counters=None, split_partials=None,
        k_splits=None, tail_split=None,
    ):
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        a_staged, a_tail_staged, b_staged, epi_staged = self._make_smem_layouts()
        self.smem_swizzles = {
            "a": str(a_staged.inner),
            "b": str(b_staged.inner),
            "d": str(epi_staged.inner),
        }

        a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.is_a_mcast else cpasync.CopyBulkTensorTileG2SOp()
        b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.is_b_mcast else cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_a_tail = None
        if cutlass.const_expr(self.a_tail_slices > 0):
            tma_atom_a_tail, _ = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(),
                a,
                cute.slice_(a_tail_staged, (None, None, 0)),
                (A_TAIL_SLICE_ROWS, tk),
            )
        tma_atom_a, tma_tensor_a = cpasync.make_tiled_tma_atom(
            a_op,
            a,
            cute.slice_(a_staged, (None, None, 0)),
            (tm, tk),
            num_multicast=cn if self.is_a_mcast else 1,
        )
        tma_atom_b, tma_tensor_b = cpasync.make_tiled_tma_atom(
            b_op,
            b,
            cute.slice_(b_staged, (None, None, 0)),
            (tn, tk),
            num_multicast=cm if self.is_b_mcast else 1,
        )
        # D += tile (TMA reduce-add) for the weight-gradient recipe, else a plain TMA store.
        store_op = (
            cpasync.CopyReduceBulkTensorTileS2GOp()
            if self.sfb_per_row
            else cpasync.CopyBulkTensorTileS2GOp()
        )
        tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            store_op,
            c,
            cute.slice_(epi_staged, (None, None, 0)),
            self.epi_tile,
        )
        # SFA: one column of tile_m scales per stage, contiguous along M (no swizzle); each stage
        # starts 128-byte aligned, as a TMA destination must.
        sfa_stride = scale_stage_elems(tm)
        sfa_staged = cute.make_layout((tm, 1, self.ab_stage), stride=(1, 0, sfa_stride))
        tma_atom_sfa = None
        tma_tensor_sfa = None
        if cutlass.const_expr(self.block_scaled):
            tma_atom_sfa, tma_tensor_sfa = self._scale_vector_tma(sfa, tm)
        sfa_elems = sfa_stride * self.ab_stage if self.block_scaled else 1
        # SFB per row (weight gradients): 112- or 144-wide tiles pad each stage to 128 bytes.
        sfb_stride = scale_stage_elems(tn)
        sfb_staged = cute.make_layout((tn, 1, self.ab_stage), stride=(1, 0, sfb_stride))
        tma_atom_sfb = None
        tma_tensor_sfb = None
        sfb_arg = sfb
        if cutlass.const_expr(self.sfb_per_row):
            tma_atom_sfb, tma_tensor_sfb = self._scale_vector_tma(sfb, tn)
            sfb_arg = None
        sfb_elems = sfb_stride * self.ab_stage if self.sfb_per_row else 1

        @cute.struct
        class SharedStorage:
            mainloop_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stage * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(a_staged)],
                self.buffer_align_bytes,
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(b_staged)],
                self.buffer_align_bytes,
            ]
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(epi_staged)],
                self.buffer_align_bytes,
            ]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sfa_elems], 128]
            # Without per-row SFB its one word holds the split-K arrival count that a tile's first
            # math thread read, for the others (split-K kernels only).
            sSFB: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sfb_elems], 128]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

        persistent = self._persistent_clusters(c, self.d_grouped, max_active_clusters, k_splits)
        if cutlass.const_expr(self.tail_split):
            # Every cluster the GPU holds when the last wave may be split: with fewer tiles than
            # clusters, the idle ones take shares of the tiles' K blocks.
            persistent = cutlass.min(persistent + tail_split * max_active_clusters, max_active_clusters)

        kernel_call = self.kernel(
            tma_atom_a,
            tma_tensor_a,
            tma_atom_b,
            tma_tensor_b,
            tma_atom_sfa,
            tma_tensor_sfa,
            sfb_arg,
            tma_atom_sfb,
            tma_tensor_sfb,
            tma_atom_c,
            tma_tensor_c,
            m_indices,
            zero_padding,
            masked_m,
            group_sizes,
            workspace,
            split_counters,
            split_partials,
            k_splits,
            a.iterator if self.k_grouped else None,
            b.iterator if self.k_grouped else None,
            tail_split,
            tma_atom_a_tail,
            a_staged,
            a_tail_staged,
            b_staged,
            sfa_staged,
            sfb_staged,
            epi_staged,
        )
        self._launch_persistent(kernel_call, persistent, stream)

    # ---- device side ------------------------------------------------------------------------
    @cute.jit
    def _mainloop(
        self, tiled_mma, acc, tCrA, tCrB, pipe, read_state, release_state, k_tile_cnt, num_k_blocks
    ):
        """Unscaled mainloop: accumulate every K block into `acc`, one WGMMA batch in flight.
        Returns the advanced pipeline states (the caller must rebind them)."""
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.fence()
        pipe.consumer_wait(read_state)
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, read_state.index)
            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
        warpgroup.commit_group()
        read_state.advance()
        for k_tile in range(1, k_tile_cnt):
            pipe.consumer_wait(read_state)
            for kb in cutlass.range_constexpr(num_k_blocks):
                coord = (None, None, kb, read_state.index)
                cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
            warpgroup.commit_group()
            # The previous batch is done once at most one group is pending.
            warpgroup.wait_group(1)
            pipe.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
        warpgroup.wait_group(0)
        pipe.consumer_release(release_state)
        release_state.advance()
        return read_state, release_state

    @cute.jit
    def _mainloop_block_scaled(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group=None, sSFB=None, boundary_at=None,
    ):
        """Block-scaled mainloop: per 128-wide K block, WGMMA into `acc` from zero, then
        promoted += acc · sfa[row] · sfb[column block] in fp32 registers, wave by wave (see the
        class docstring). `boundary_at`: the tile's SFB boundary when known at compile time.
        Returns the advanced pipeline state (the caller must rebind it)."""
        nb0, nb1, boundary = self._tile_sfb_blocks(mSFB, tile_n)
        if cutlass.const_expr(boundary_at is not None):
            boundary = boundary_at
        promoted.fill(0.0)
        mma_state = read_state.clone()
        # SFB in warp registers: lane i holds the tile's SFB for K block 32c + i of the current
        # chunk c (`chunk0`, `chunk1` for the second scale block) and of the next (`ahead0`,
        # `ahead1`), loaded a chunk ahead; a block's value is one shuffle. A global load per
        # block, with the address arithmetic ptxas redoes for it each time, made 256x128 tiles
        # at M = 4096 2.5-3% slower and 128x192 ones 8% (NOTES.md).
        rows = self._sfb_rows(mSFB, nb0, nb1, group)
        chunk0, chunk1 = self._lane_sfb(rows, 0, k_tile_cnt)
        ahead0, ahead1 = self._lane_sfb(rows, SFB_CHUNK_BLOCKS, k_tile_cnt)
        next_stage_ready = cutlass.Boolean(False)
        # Unrolled twice: the loop's pipeline-state and address updates of two blocks share one
        # branch (4096x4096x7168, 256x128: 1.05x the rolled loop with the peek below). Per-row
        # SFB (weight gradients) is read from the stage by the promotion, after the wait, unless
        # the schedule reads it while the WGMMAs run (`Schedule.column_scales_early`); only then
        # is the stage done with before the promotion and the loop unrolled.
        early_columns = self.column_scales_early
        stage_done_before_promotion = not self.sfb_per_row or early_columns
        unroll = 2 if stage_done_before_promotion else 1
        if cutlass.const_expr(rows is None):  # per-row SFB comes from the stages: one chunk
            read_state, mma_state, next_stage_ready = self._mainloop_chunk(
                tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                next_stage_ready, 0, k_tile_cnt, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
                unroll, early_columns, stage_done_before_promotion,
            )
        else:
            chunks = (k_tile_cnt + SFB_CHUNK_BLOCKS - 1) // SFB_CHUNK_BLOCKS
            for chunk in cutlass.range(chunks, unroll=1):
                first = chunk * SFB_CHUNK_BLOCKS
                if chunk > 0:
                    chunk0 = ahead0
                    chunk1 = ahead1
                    ahead0, ahead1 = self._lane_sfb(rows, first + SFB_CHUNK_BLOCKS, k_tile_cnt)
                read_state, mma_state, next_stage_ready = self._mainloop_chunk(
                    tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                    next_stage_ready, first, cutlass.min(SFB_CHUNK_BLOCKS, k_tile_cnt - first), k_tile_cnt,
                    num_k_blocks, chunk0, chunk1, boundary, unroll, early_columns, stage_done_before_promotion,
                )
        return read_state

    @cute.jit
    def _mainloop_chunk(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, first, blocks, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        unroll: int, early_columns: bool, stage_done_before_promotion: bool,
    ):
        """K blocks first .. first + blocks - 1 of `_mainloop_block_scaled`, whose SFB lane j of
        `chunk0` / `chunk1` holds for block first + j. Returns (read_state, mma_state,
        next_stage_ready).

        With `Schedule.static_stage_rounds`, the blocks from the first one in stage 0 run in
        rounds of one block per stage, each round's stages unrolled with `StaticStage` states: the
        stage index is then a constant, so the WGMMA descriptors, the SFA addresses and the
        barrier addresses of each block are immediates and only the phase is carried (DeepGEMM's
        kernels get the same from a K known at compile time). The blocks before stage 0 comes
        round and those after the last round run the loop with run-time stage indices."""
        args = (acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe)
        rest = (first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary, early_columns, stage_done_before_promotion)
        if cutlass.const_expr(not self.static_stage_rounds):
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                tiled_mma, *args, read_state, mma_state, next_stage_ready, 0, blocks, unroll, *rest
            )
        else:
            stages = read_state.stages
            # Each loop below sets the ACCUMULATE field of a tiled MMA of its own: a field set
            # inside a loop must not be read after it.
            head = cutlass.min(blocks, (stages - read_state.index) % stages)
            rounds = (blocks - head) // stages
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                tiled_mma, *args, read_state, mma_state, next_stage_ready, 0, head, 1, *rest
            )
            phase = read_state.phase
            round_mma = self._make_tiled_mma()
            for r in cutlass.range(rounds, unroll=1):
                static_read = StaticStage(stages, 0, phase)
                static_mma = static_read.clone()
                for s in cutlass.range_constexpr(stages):
                    static_read, static_mma, next_stage_ready = self._mainloop_block(
                        round_mma, *args, static_read, static_mma, next_stage_ready, head + r * stages + s, *rest
                    )
                phase = static_read.phase
            # Rounds leave the stage index where they found it (0 when there were any).
            read_state = pipeline.PipelineState(
                stages, read_state.count + rounds * stages, read_state.index, phase
            )
            mma_state = read_state.clone()
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                self._make_tiled_mma(), *args, read_state, mma_state, next_stage_ready,
                head + rounds * stages, blocks, unroll, *rest
            )
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _mainloop_blocks(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, j0, j1, unroll: int, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        early_columns: bool, stage_done_before_promotion: bool,
    ):
        """Blocks first + j0 .. first + j1 - 1 of a chunk with run-time stage indices.
        Returns (read_state, mma_state, next_stage_ready)."""
        for j in cutlass.range(j0, j1, unroll=unroll):
            read_state, mma_state, next_stage_ready = self._mainloop_block(
                tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                next_stage_ready, j, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
                early_columns, stage_done_before_promotion,
            )
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _mainloop_block(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, j, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        early_columns: bool, stage_done_before_promotion: bool,
    ):
        """K block first + j of a chunk: its waves' WGMMAs, scales, waits and promotions.
        Returns (read_state, mma_state, next_stage_ready)."""
        k_tile = first + j
        sfb0, sfb1 = self._chunk_sfb(chunk0, chunk1, j)
        for wave in cutlass.range_constexpr(self.all_waves):
            mma_state = self._issue_wave(
                tiled_mma, acc, tCrA, tCrB, pipe, mma_state, num_k_blocks, wave, next_stage_ready
            )
            p0, p1 = self._wave_scales(tCcC, sSFA, read_state, sfb0, sfb1, wave)
            sfb_col = None
            if cutlass.const_expr(early_columns):
                sfb_col = self._stage_sfb_columns(tCcC, sSFB, read_state, wave)
            warpgroup.wait_group(0)
            last_wave = wave == self.all_waves - 1
            if cutlass.const_expr(last_wave and stage_done_before_promotion):
                read_state, next_stage_ready = self._release_and_probe(
                    pipe, read_state, None, k_tile, k_tile_cnt
                )
            read_state = self._promote_wave(
                acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave,
                released=stage_done_before_promotion, sfb_col=sfb_col,
            )
            if cutlass.const_expr(last_wave and not stage_done_before_promotion):
                # Per-row SFB is read from the stage by the promotion, so the stage is
                # released (and the next one probed) only after it.
                next_stage_ready = self._peek_next_stage(pipe, read_state, k_tile, k_tile_cnt)
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _release_and_probe(self, pipe, read_state, next_state, k_tile, k_tile_cnt):
        """Hand the stage of `read_state` back to the producer, advance the state, and probe the
        stage of `next_state` (None: the advanced `read_state`), block k_tile + 1, before the
        promotion (`_peek_next_stage`). Returns (state, whether the probed stage has arrived)."""
        pipe.consumer_release(read_state)
        read_state.advance()
        probed = next_state
        if cutlass.const_expr(next_state is None):
            probed = read_state
        return read_state, self._peek_next_stage(pipe, probed, k_tile, k_tile_cnt)

    @cute.jit
    def _peek_next_stage(self, pipe, state, k_tile, k_tile_cnt):
        """Whether the stage of `state` (block k_tile + 1 of this tile) has arrived, probed with
        a try-wait issued before the promotion so that its latency hides behind the FFMAs
        (DeepGEMM's 1D2D kernel has the same order); the next wave-0 issue skips its wait when
        it is true. Not probed after the tile's last block: the next tile's first stage is often
        still loading, and a try-wait that finds its phase incomplete suspends the warp (for up
        to a system-dependent time) before the promotion: probing it made K <= 4096 1-3% slower."""
        ready = cutlass.Boolean(False)
        if k_tile + 1 < k_tile_cnt:
            ready = pipe.consumer_try_wait(state)
        return ready

    @cute.jit
    def _block_scaled_tile(
        self, tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool,
    ):
        """One tile's block-scaled main loop (`_block_scaled_tile_at`). A tile spanning two SFB
        blocks takes the copy of the loop compiled for its boundary column, chosen by the chain
        if boundary == b0 … else … over `sfb_boundaries` (the last one unconditional: tiles wholly
        past N, whose stores are clipped, take it whatever their boundary). With the boundary a
        constant, each accumulator chunk's scale is fixed at compile time; a run-time boundary
        costs a compare and a select per chunk and row in every promotion, which made 112- to
        192-wide tiles slower than 128-wide ones. Returns the advanced pipeline state."""
        if cutlass.const_expr(self.single_sfb_block or self.sfb_per_row):
            read_state = self._block_scaled_tile_at(
                tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty, None,
            )
        else:
            _, _, boundary = self._tile_sfb_blocks(mSFB, tile_n)
            read_state = self._block_scaled_tile_from(
                0, boundary, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty,
            )
        return read_state

    @cute.jit
    def _block_scaled_tile_from(
        self, case: int, boundary, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool,
    ):
        """The boundary chain of `_block_scaled_tile` from candidate `case` on. Each branch
        builds its own tiled MMA: a field set inside a dynamic branch must not be read after it."""
        args = (accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe)
        rest = (k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty)
        candidate = self.sfb_boundaries[case]
        if cutlass.const_expr(case == len(self.sfb_boundaries) - 1):
            read_state = self._block_scaled_tile_at(self._make_tiled_mma(), *args, read_state, *rest, candidate)
        else:
            if boundary == candidate:
                read_state = self._block_scaled_tile_at(self._make_tiled_mma(), *args, read_state, *rest, candidate)
            else:
                read_state = self._block_scaled_tile_from(case + 1, boundary, *args, read_state, *rest)
        return read_state

    @cute.jit
    def _block_scaled_tile_at(
        self, tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool, boundary_at,
    ):
        """One tile's block-scaled main loop: through the ring of WGMMA accumulators `accs` when
        the schedule has more than one, else wave by wave. The ring needs len(accs) - 1 K blocks
        to fill; a tile with fewer (`may_be_empty`: possibly none, then its sum is zero; deeper
        rings: any short K) takes the wave-by-wave loop. `boundary_at`: the tile's SFB boundary
        as a constant, or None (one SFB block, or per-row SFB). Returns the advanced pipeline
        state (the caller must rebind it)."""
        depth = len(accs)
        if cutlass.const_expr(depth == 1):
            read_state = self._mainloop_block_scaled(
                tiled_mma, accs[0], promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
            )
        elif cutlass.const_expr(depth == 2 and not may_be_empty):
            read_state = self._mainloop_accumulator_ring(
                accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
            )
        else:
            if k_tile_cnt >= max(depth - 1, 1):
                read_state = self._mainloop_accumulator_ring(
                    accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                    k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
                )
            else:
                # A tiled MMA of this region sets its own ACCUMULATE field (a field set inside a
                # dynamic branch must not be read after it).
                read_state = self._mainloop_block_scaled(
                    self._make_tiled_mma(), accs[0], promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe,
                    read_state, k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
                )
        return read_state

    @cute.jit
    def _tile_sfb_blocks(self, mSFB, tile_n):
        """(nb0, nb1, boundary): the 128-column SFB blocks an N tile spans (a tile spans at most
        two; nb1 = nb0 for per-row SFB) and the tile column where nb1 begins.

        A CTA of a cluster whose tile lies wholly past N (its stores are clipped) may start past
        the last SFB block (e.g. 160-wide tiles in 1x2 clusters at N = 7168: tile 45 starts at
        column 7200, SFB has 56 blocks): its blocks are clamped to the last one, so that it never
        reads past SFB (it did, 512 bytes at K = 16384, and faulted where that crossed the end of
        a mapping)."""
        n0 = tile_n * self.tile_shape_mnk[1]
        nb0 = n0 // SCALE_BLOCK
        nb1 = nb0
        if cutlass.const_expr(not self.sfb_per_row):
            nb0 = cutlass.min(nb0, mSFB.shape[0] - 1)
            nb1 = cutlass.min(nb0 + 1, mSFB.shape[0] - 1)
        # Columns of this tile before `boundary` belong to scale block nb0, the rest to nb1.
        boundary = (nb0 + 1) * SCALE_BLOCK - n0
        return nb0, nb1, boundary

    @cute.jit
    def _mainloop_accumulator_ring(
        self, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group=None, sSFB=None, boundary_at=None,
    ):
        """Block-scaled mainloop of single-wave tiles through a ring of D = len(accs) WGMMA
        accumulators (at least D - 1 K blocks): block kb + D - 1 is issued into the free
        accumulator before block kb is waited for and promoted, so D - 1 blocks' WGMMAs are in
        flight while the math threads promote. Small tiles are bound by each block's latency
        (stage wait, WGMMAs, wait, promotion), not by the tensor cores, and overlap D - 1 blocks.
        Block b lives in accs[b % D]; its scales in slot b % D of a register ring.
        Returns the advanced pipeline state (the caller must rebind it)."""
        depth = len(accs)
        # A tiled MMA of this call sets its own ACCUMULATE field: the caller may run it inside a
        # dynamic branch, and a field set there must not be read after it.
        tiled_mma = self._make_tiled_mma()
        nb0, nb1, boundary = self._tile_sfb_blocks(mSFB, tile_n)
        if cutlass.const_expr(boundary_at is not None):
            boundary = boundary_at
        promoted.fill(0.0)
        mma_state = read_state.clone()
        # A block's scales are read when its WGMMAs are issued, D - 1 blocks ahead of its
        # promotion (SFB from global memory, its two SFA rows from the stage), so neither
        # latency is on the promotion's path: slot b % D holds (sfb0, sfb1, sfa row, row + 8).
        # SFB is not held in warp registers as in `_mainloop_block_scaled`: its load is already
        # off the critical path here, and a per-block chunk check measured 0.95-0.99x (NOTES.md).
        scales = cute.make_rmem_tensor(4 * depth, cutlass.Float32)
        rows = self._sfb_rows(mSFB, nb0, nb1, group)
        for j in cutlass.range_constexpr(depth - 1):
            mma_state = self._issue_ring_block(
                tiled_mma, accs, j, scales, j, tCrA, tCrB, tCcC, sSFA, rows, pipe, mma_state, num_k_blocks,
            )
        k_tile = cutlass.Int32(0)
        # The next block's stage is probed before each promotion on two-accumulator rings of
        # tiles within one SFB block (128x128, 64x128, 64x64: 1.00-1.07x at 11 shapes); the
        # 112-wide tiles (a loop copy per SFB boundary) and four-deep rings (64x16, 64x32)
        # measured 0.95-0.99x with it and keep the plain wait at issue. Never with per-row SFB:
        # the probing promotion hands the stage back before promoting, and per-row SFB is read
        # from the stage by the promotion (the default catalogue has no per-row ring; a
        # schedule that had one computed wrong sums with the probe).
        probe_next_stage = depth == 2 and self.single_sfb_block and not self.sfb_per_row
        next_stage_ready = cutlass.Boolean(False)
        for _ in range((k_tile_cnt - (depth - 1)) // depth):
            for j in cutlass.range_constexpr(depth):
                mma_state = self._issue_ring_block(
                    tiled_mma, accs, (j + depth - 1) % depth, scales, k_tile + depth - 1, tCrA, tCrB,
                    tCcC, sSFA, rows, pipe, mma_state, num_k_blocks, next_stage_ready,
                )
                if cutlass.const_expr(probe_next_stage):
                    # Block k_tile + D is the next to be issued: its stage is probed before this
                    # promotion's FFMAs (see _peek_next_stage).
                    read_state, next_stage_ready = self._promote_ring_slot_probing(
                        accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary,
                        depth - 1, mma_state, k_tile + depth - 1, k_tile_cnt,
                    )
                else:
                    read_state = self._promote_ring_slot(
                        accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, depth - 1
                    )
                k_tile += 1
        # Blocks k_tile .. k_tile + D - 2 are in flight in accs[0 .. D - 2]; `left` more (< D)
        # remain. Each value of `left` gets its own straight-line tail: the WGMMA wait counts must
        # be immediates, and ptxas serialises every WGMMA of a kernel whose waits it cannot
        # follow (an empty commit group in one branch was enough).
        left = k_tile_cnt - k_tile - (depth - 1)
        read_state = self._ring_tail_from(
            0, left, accs, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe,
            read_state, mma_state, scales, k_tile, num_k_blocks, boundary,
        )
        return read_state

    @cute.jit
    def _ring_tail_from(
        self, case: int, left, accs, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe, read_state,
        mma_state, scales, k_tile, num_k_blocks, boundary,
    ):
        """`_ring_tail` for the dynamic `left`, as the chain if left == case … else … over the
        cases case .. D - 1, the last one unconditional: ptxas must see every path wait for
        the WGMMAs in flight, or it serialises them all. Returns the read state."""
        args = (promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe)
        if cutlass.const_expr(case == len(accs) - 1):
            read_state = self._ring_tail(
                accs, case, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary
            )
        else:
            if left == case:
                read_state = self._ring_tail(
                    accs, case, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary
                )
            else:
                read_state = self._ring_tail_from(
                    case + 1, left, accs, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary,
                )
        return read_state

    @cute.jit
    def _ring_tail(
        self, accs, left: int, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe, read_state,
        mma_state, scales, k_tile, num_k_blocks, boundary,
    ):
        """End of the accumulator ring with `left` (a constant) blocks still to issue: blocks
        k_tile .. k_tile + D - 2 are in flight in accs[0 .. D - 2]. Promotes the in-flight
        blocks, issuing the remaining ones into the accumulators they free, then promotes those.
        Returns the advanced read state (the caller must rebind it)."""
        depth = len(accs)
        # A tiled MMA and a pipeline state of this region: the caller runs it inside a dynamic
        # branch, and values set there must not be read after it (the next tail's branch).
        tiled_mma = self._make_tiled_mma()
        mma_state = mma_state.clone()
        for j in cutlass.range_constexpr(depth - 1):
            if cutlass.const_expr(j < left):
                mma_state = self._issue_ring_block(
                    tiled_mma, accs, (j + depth - 1) % depth, scales, k_tile + depth - 1 + j, tCrA,
                    tCrB, tCcC, sSFA, rows, pipe, mma_state, num_k_blocks,
                )
            # Groups issued after block k_tile + j: the in-flight ones behind it and the tail's.
            pending = (depth - 2 - j) + min(j + 1, left)
            read_state = self._promote_ring_slot(
                accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending
            )
        for i in cutlass.range_constexpr(left):
            read_state = self._promote_ring_slot(
                accs, (depth - 1 + i) % depth, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state,
                boundary, left - 1 - i,
            )
        return read_state

    @cute.jit
    def _issue_ring_block(
        self, tiled_mma, accs, slot: int, scales, k_tile, tCrA, tCrB, tCcC, sSFA, rows, pipe, mma_state,
        num_k_blocks, stage_ready=None,
    ):
        """Issue K block k_tile into accs[slot] and read its scales into the ring's slot: the SFB
        pair (global loads from `_sfb_rows`' rows) and this thread's two SFA rows from the stage,
        once it has arrived. Returns the advanced state (the caller must rebind it)."""
        scales[4 * slot], scales[4 * slot + 1] = self._row_sfb(rows, k_tile)
        stage = mma_state.index
        mma_state = self._issue_wave(
            tiled_mma, accs[slot], tCrA, tCrB, pipe, mma_state, num_k_blocks, 0, stage_ready
        )
        coords = tCcC[(None, 0, 0)]
        # m64nNk32 accumulator fragment: elements 0, 1 are on row r, elements 2, 3 on row r + 8.
        scales[4 * slot + 2] = sSFA[(coords[0][0], 0, stage)]
        scales[4 * slot + 3] = sSFA[(coords[2][0], 0, stage)]
        return mma_state

    @cute.jit
    def _promote_ring_slot(
        self, accs, slot: int, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending: int
    ):
        """Wait until at most `pending` WGMMA groups are in flight and promote accs[slot] with
        the scales of the ring's slot. Returns the state (the caller must rebind it)."""
        return self._wait_and_promote(
            accs[slot], promoted, tCcC, sSFA, sSFB, pipe, read_state, scales[4 * slot], scales[4 * slot + 1],
            boundary, 0, pending, sfa_rows=(scales[4 * slot + 2], scales[4 * slot + 3]),
        )

    @cute.jit
    def _promote_ring_slot_probing(
        self, accs, slot: int, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending: int,
        next_state, issued_k_tile, k_tile_cnt,
    ):
        """`_promote_ring_slot` that releases the stage and probes `next_state`'s (the next block
        to issue, issued_k_tile + 1) before the FFMAs. Returns (state, whether it has arrived)."""
        acc = accs[slot]
        p0, p1 = self._wave_scales(
            tCcC, sSFA, read_state, scales[4 * slot], scales[4 * slot + 1], 0,
            (scales[4 * slot + 2], scales[4 * slot + 3]),
        )
        warpgroup.wait_group(pending)
        read_state, ready = self._release_and_probe(pipe, read_state, next_state, issued_k_tile, k_tile_cnt)
        read_state = self._promote_wave(
            acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, 0, released=True
        )
        return read_state, ready

    @cute.jit
    def _sfb_rows(self, mSFB, nb0, nb1, group):
        """The tile's SFB rows over K (scale blocks nb0 and nb1, of `group` in the grouped
        layouts); None when SFB is per row (those scales come from the stage)."""
        rows = None
        if cutlass.const_expr(not self.sfb_per_row):
            if cutlass.const_expr(self.m_grouped):
                rows = (mSFB[(nb0, None, group)], mSFB[(nb1, None, group)])
            else:
                rows = (mSFB[(nb0, None)], mSFB[(nb1, None)])
        return rows

    @cute.jit
    def _row_sfb(self, rows, k_tile):
        """(sfb of nb0, of nb1) of K block k_tile from `_sfb_rows`; 1.0 when SFB is per row."""
        sfb0 = cutlass.Float32(1.0)
        sfb1 = sfb0
        if cutlass.const_expr(rows is not None):
            sfb0 = rows[0][k_tile]
            sfb1 = sfb0
            if cutlass.const_expr(not self.single_sfb_block):
                sfb1 = rows[1][k_tile]
        return sfb0, sfb1

    @cute.jit
    def _chunk_sfb(self, chunk0, chunk1, in_chunk):
        """(sfb0, sfb1) of the block `in_chunk` of the current chunk: lane in_chunk's values."""
        sfb0 = chunk0
        sfb1 = chunk1
        if cutlass.const_expr(not self.sfb_per_row):
            sfb0 = cute.arch.shuffle_sync(chunk0, in_chunk)
            sfb1 = sfb0
            if cutlass.const_expr(not self.single_sfb_block):
                sfb1 = cute.arch.shuffle_sync(chunk1, in_chunk)
        return sfb0, sfb1

    @cute.jit
    def _lane_sfb(self, rows, first, k_tile_cnt):
        """(sfb of nb0, of nb1) in lane i for K block first + i, clamped into the tile's blocks
        0 .. k_tile_cnt - 1 (a tile of no blocks, e.g. a contiguous padding tile, reads block 0
        of its clamped group, never before the row)."""
        lane = cute.arch.lane_idx()
        return self._row_sfb(rows, cutlass.max(cutlass.min(first + lane, k_tile_cnt - 1), 0))

    def _wave_rc(self, wave: int) -> tuple[int, int]:
        """(row block, column block) of wave `wave` in a math warpgroup's accumulator fragment."""
        if self.column_waves > 1:
            return 0, wave
        return wave, 0

    @cute.jit
    def _issue_wave(
        self, tiled_mma, acc, tCrA, tCrB, pipe, mma_state, num_k_blocks, wave: int, stage_ready=None
    ):
        """Issue the WGMMAs of one wave (this warpgroup's 64 rows of row block `wave`, or its
        rows' column block `wave` with column waves) of the stage of `mma_state` into `acc`
        (from zero) as one commit group. The first wave waits for the stage (unless
        `stage_ready`, a try-wait's result, says it has arrived); the last advances the state,
        which is returned."""
        if cutlass.const_expr(wave == 0):
            pipe.consumer_wait(mma_state, stage_ready)
        warpgroup.fence()
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        row, col = self._wave_rc(wave)
        for kb in cutlass.range_constexpr(num_k_blocks):
            # (V, 1) x (V, 1) -> (V, 1, 1): this wave's rows (A's row block `row`) and columns
            # (B's column block `col`). The WGMMA atom spans one wave's columns: the tile's N, or
            # a column wave's, so B has one column block per column wave.
            a_frag = cute.append_ones(tCrA[(None, row, kb, mma_state.index)], 2)
            b_frag = cute.append_ones(tCrB[(None, col, kb, mma_state.index)], 2)
            cute.gemm(tiled_mma, acc, a_frag, b_frag, acc)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        if cutlass.const_expr(wave == self.all_waves - 1):
            mma_state.advance()
        return mma_state

    @cute.jit
    def _wait_and_promote(
        self, acc, promoted, tCcC, sSFA, sSFB, pipe, read_state, sfb0, sfb1, boundary, wave: int, pending: int,
        sfa_rows=None,
    ):
        """Right after issuing WGMMAs: form the scales of the block of `read_state` (its SFA read
        from the stage, or `sfa_rows` when already read), wait until at most `pending` WGMMA
        batches are in flight (so `acc` is complete), and promote it. Returns the state (the
        caller must rebind it)."""
        p0, p1 = self._wave_scales(tCcC, sSFA, read_state, sfb0, sfb1, wave, sfa_rows)
        warpgroup.wait_group(pending)
        return self._promote_wave(acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave)

    @cute.jit
    def _wave_scales(self, tCcC, sSFA, state, sfb0, sfb1, wave: int, sfa_rows=None):
        """(p0, p1): per accumulator element of this thread in `wave`, sfa[row] · sfb0 and
        sfa[row] · sfb1 for the block of `state`'s stage (sfa alone, twice, when SFB is per row).

        Called between issuing a wave's WGMMAs and waiting for them, so the shared-memory loads
        and the products complete behind the tensor cores instead of delaying the promotion
        (Nsight Compute on the 256x128 tile: the promotion's first multiply stalled on these
        loads). A thread's elements cover two rows, so the loads and products are per row, not
        per element (the compiler merges the repeats). `sfa_rows`: the two rows' SFA, already
        read (the accumulator ring reads them when it issues the block)."""
        coords = tCcC[(None, *self._wave_rc(wave))]
        p0 = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        p1 = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(coords)):
            if cutlass.const_expr(sfa_rows is None):
                sfa = sSFA[(coords[i][0], 0, state.index)]
            else:
                # Read ahead by the accumulator ring: row r for elements 0, 1 (mod 4), r + 8 else.
                sfa = sfa_rows[(i // 2) % 2]
            if cutlass.const_expr(self.sfb_per_row):
                p0[i] = sfa
            else:
                # _opaque: formed here, once per row; without it the compiler sinks the
                # products below the per-element block choice in `_promote_wave`.
                p0[i] = _opaque(sfa * sfb0)
                if cutlass.const_expr(not self.single_sfb_block):
                    p1[i] = _opaque(sfa * sfb1)
        return p0, p1

    @cute.jit
    def _stage_sfb_columns(self, tCcC, sSFB, state, wave: int):
        """This thread's per-column SFB of wave `wave`, read from the stage of `state` (one per
        accumulator element; elements of one column share their load)."""
        coords = tCcC[(None, *self._wave_rc(wave))]
        sfb_col = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(coords)):
            sfb_col[i] = sSFB[(coords[i][1], 0, state.index)]
        return sfb_col

    @cute.jit
    def _promote_wave(
        self, acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave: int, released=False,
        sfb_col=None,
    ):
        """promoted[wave] += acc · scale for the completed wave of the block of `read_state`, with
        the scales of `_wave_scales` (times each column's SFB when SFB is per row: `sfb_col` when
        the caller read it earlier, else read from the stage here); after the last wave the stage
        is handed back to the producer and the state advanced, unless the caller has done so
        (`released`). Returns the state."""
        row, col = self._wave_rc(wave)
        promoted_w = promoted[(None, row, col)]
        # A column wave's elements start at its first column of the tile.
        wave_col0 = col * self.wave_columns
        coords = tCcC[(None, row, col)]
        if cutlass.const_expr(self.sfb_per_row and sfb_col is None):
            # One scale per column (row of B); identical columns share one load. Read after the
            # wait: two-wave tiles have no room to hold a thread's 32 column scales across it.
            sfb_col = self._stage_sfb_columns(tCcC, sSFB, read_state, wave)
        if cutlass.const_expr(wave == self.all_waves - 1 and not released):
            pipe.consumer_release(read_state)
            read_state.advance()
        # WGMMA accumulator layout (PTX ISA, m64nNk32 D fragment): element i of a thread is column
        # c0 + 8*(i//4) + i%2 with c0 = coords[0] even and < 8; the SFB boundary is a multiple of
        # 16, so element i lies before it exactly when its 8-column chunk does: 8*(i//4) <
        # boundary, which `_block_scaled_tile` makes a compile-time constant.
        if cutlass.const_expr(not self.single_sfb_block and not self.sfb_per_row):
            assert isinstance(boundary, int), "two-block tiles promote with a constant boundary"
        for i in cutlass.range_constexpr(cute.size(acc)):
            scale = p0[i]
            if cutlass.const_expr(self.sfb_per_row):
                scale = p0[i] * sfb_col[i]
            elif cutlass.const_expr(not self.single_sfb_block):
                scale = p0[i] if cutlass.const_expr(wave_col0 + 8 * (i // 4) < boundary) else p1[i]
            promoted_w[i] = promoted_w[i] + acc[i] * scale
        return read_state

    @cute.jit
    def _convert_subtile(self, tRS_rAcc, tRS_rD, tRS_rD_out, size_tRS_rD, epi_idx):
        """Epilogue sub-tile `epi_idx` of the tile's fp32 sum, converted to the output type into
        `tRS_rD_out` (registers), ready for the stmatrix into its shared-memory buffer."""
        for v in cutlass.range_constexpr(size_tRS_rD):
            tRS_rD[v] = tRS_rAcc[epi_idx * size_tRS_rD + v]
        tRS_rD_out.store(tRS_rD.load().to(self.c_dtype))

    def _scale_vector_tma(self, scales, rows: int):
        """TMA load of one K block's column of `rows` fp32 scales (contiguous along M or N)."""
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), scales, cute.make_layout((rows, 1)), (rows, 1)
        )

    @cute.jit
    def _partition_scale_vector(self, tma_atom, s_staged, m_scales, rows: int):
        """(stage buffers, global tiles) of a scale vector for its TMA copy; the global side is
        (TMA, tiles, K blocks[, groups]) — a group mode when the scales have one (masked SFA)."""
        tiler = (None,) * cute.rank(m_scales)
        g_tiles = cute.local_tile(m_scales, (rows, 1), tiler)
        return cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(s_staged, 0, 2), cute.group_modes(g_tiles, 0, 2)
        )

    @cute.jit
    def _locate_tile(
        self, t, ct_m, ct_n, mMasked, max_m, mSizes, k_tile_cnt, cluster_coord_mnk, k_splits=None, tail=None
    ):
        """Work unit t → (group, this CTA's tile m, tile n, the unit's first K block in the
        scales, its K block count); both roles walk the same sequence.

        The k-grouped layout has a group-dependent first block in the scales and K block count
        (A and B come through per-group descriptors, from block 0). With split K, t is (cluster
        tile t // k_splits, split t % k_splits) and the split's blocks are
        [split · ⌈KB/k_splits⌉, …) (the runtime passes a count that leaves no split empty). With
        a tail split, `tail` is `_tail_plan`'s: t below its first tail tile is a whole tile; from
        there on t - tail_start is a position in the tail's K blocks (tile after tile), and the
        piece runs to the end of that tile or of this cluster's share, whichever comes first."""
        cm, cn = self.cluster_shape_mn
        group = cutlass.Int32(0)
        first_block = cutlass.Int32(0)
        k_blocks = k_tile_cnt
        if cutlass.const_expr(self.masked):
            group, ctm, ctn = self._masked_locate(t, mMasked, max_m, ct_n)
        elif cutlass.const_expr(self.k_grouped):
            group, local, first_block, k_blocks = self._k_grouped_locate(t, mSizes, ct_m * ct_n, k_tile_cnt)
            ctm, ctn = self._cluster_tile_coord(local, ct_m, ct_n)
        elif cutlass.const_expr(self.split_k):
            tile_t = t // k_splits
            per_split = (k_tile_cnt + k_splits - 1) // k_splits
            first_block = (t - tile_t * k_splits) * per_split
            k_blocks = cutlass.min(per_split, k_tile_cnt - first_block)
            ctm, ctn = self._cluster_tile_coord(tile_t, ct_m, ct_n)
        elif cutlass.const_expr(self.tail_split):
            tail_start, _, share_end = tail
            in_tail = t >= tail_start
            position = cutlass.max(t - tail_start, 0)
            tail_tile = position // k_tile_cnt
            tile_t = tail_start + tail_tile if in_tail else t
            first_block = position - tail_tile * k_tile_cnt
            ctm, ctn = self._cluster_tile_coord(tile_t, ct_m, ct_n)
            k_blocks = (
                cutlass.min(k_tile_cnt - first_block, share_end - position) if in_tail else k_tile_cnt
            )
        else:
            ctm, ctn = self._cluster_tile_coord(t, ct_m, ct_n)
        return group, ctm * cm + cluster_coord_mnk[0], ctn * cn + cluster_coord_mnk[1], first_block, k_blocks

    @cute.jit
    def _tail_plan(self, cluster_tiles, clusters, cluster, k_tile_cnt, enabled):
        """How a tail split walks `cluster_tiles` over `clusters` persistent clusters. The tiles
        up to a whole number of waves are whole, cluster c taking c, c + clusters, …; the K
        blocks of the remaining (tail) tiles, tile after tile, are cut into `clusters` contiguous
        shares of equal size ±1, and cluster c computes share c, one piece per tile it touches
        (at most two), each added into D. So the last wave takes about tail/clusters of a tile's
        time instead of a whole one. Only where that pays (`TAIL_SPLIT_MAX_FILL`,
        `TAIL_SPLIT_MIN_SAVED_BLOCKS`): a fuller last wave or a short K leaves too little to save
        beside the pieces' extra pipeline fills and reduce-adds (equal tiles with the last wave
        88% and 94% full measured 1.5% and 3% slower split). Without `enabled` every tile is
        whole. Returns ((first tail tile, this cluster's share start and end), the cursor bound):
        cursor values from the first tail tile on are that tile plus a block position."""
        fill_num, fill_den = TAIL_SPLIT_MAX_FILL
        tail_tiles = cluster_tiles % clusters if enabled != 0 else cutlass.Int32(0)
        tail_tiles = tail_tiles if tail_tiles * fill_den <= clusters * fill_num else cutlass.Int32(0)
        saved = k_tile_cnt * (clusters - tail_tiles)
        tail_tiles = tail_tiles if saved >= TAIL_SPLIT_MIN_SAVED_BLOCKS * clusters else cutlass.Int32(0)
        tail_start = cluster_tiles - tail_tiles
        tail_blocks = tail_tiles * k_tile_cnt
        share_start = cluster * tail_blocks // clusters
        share_end = (cluster + 1) * tail_blocks // clusters
        return (tail_start, share_start, share_end), tail_start + share_end

    @cute.jit
    def _first_unit(self, cluster, tail):
        """The cursor of `cluster`'s first work unit (`_tail_plan`): its first whole tile, or its
        share of the tail when it has none."""
        tail_start, share_start, _ = tail
        return cluster if cluster < tail_start else tail_start + share_start

    @cute.jit
    def _next_unit(self, t, k_blocks, clusters, tail):
        """The cursor after unit t (of k_blocks blocks): the next tile, t + clusters; with a tail
        split (`tail`, `_tail_plan`'s), the start of this cluster's share of the tail after the
        whole tiles, then its next piece there."""
        whole = t + clusters
        if cutlass.const_expr(tail is None):
            return whole
        tail_start, share_start, _ = tail
        whole = tail_start + share_start if whole >= tail_start else whole
        return t + k_blocks if t >= tail_start else whole

    def _streams_b(self, m):
        """Whether B is streamed: at most STREAMED_B_MAX_TILE_ROWS rows of output tiles for M rows."""
        return (m + self.tile_shape_mnk[0] - 1) // self.tile_shape_mnk[0] <= STREAMED_B_MAX_TILE_ROWS

    @cute.jit
    def _load_policies(self, m):
        """(B's, A's) L2 policy for M rows: evict-first and evict-last where B is streamed, else
        the default (0) for both."""
        b_policy = cutlass.Int64(0)
        a_policy = cutlass.Int64(0)
        if self._streams_b(m):
            b_policy = cutlass.Int64(L2_EVICT_FIRST)
            a_policy = cutlass.Int64(L2_EVICT_LAST)
        return b_policy, a_policy

    @cute.jit
    def _produce_whole_tile(
        self, pipe, state, k_tiles, tma_atom_a, tAgA_k, tAsA, a_mcast_mask, load_desc_a, loads: StageLoads
    ):
        """The producer's K loop for a tile whose A box lies within M: each stage gets the
        pipeline's acquire (its arrive expects every operand's bytes), one A box (multicast where
        the schedule says), B and the scales. Returns the advanced state."""
        for _ in range(k_tiles):
            pipe.producer_acquire(state)
            barrier = pipe.producer_get_barrier(state)
            cute.copy(
                tma_atom_a,
                tAgA_k[(None, loads.ab_first_block + state.count)],
                tAsA[(None, state.index)],
                tma_bar_ptr=barrier,
                mcast_mask=a_mcast_mask,
                tma_desc_ptr=load_desc_a,
                cache_policy=loads.a_cache_policy,
            )
            self._load_b_and_scales(state, barrier, loads)
            pipe.producer_commit(state)
            state.advance()
        return state

    @cute.jit
    def _produce_tail_tile(
        self, pipe, state, k_tiles, slices_in, tx_bytes, tma_atom_a_tail, tAgA_tail, tAsA_tail,
        loads: StageLoads,
    ):
        """The producer's K loop for the tile that holds row M - 1 when M ends inside it: A as
        its first `slices_in` A_TAIL_SLICE_ROWS-row slices (none for a tile past M), never
        multicast. Each stage's arrive expects `tx_bytes`, those slices' bytes with the other
        operands', in one arrive-and-expect after the empty wait (a peer's multicast B may land
        before it). Returns the advanced state."""
        for _ in range(k_tiles):
            pipe.sync_object_empty.wait(state.index, state.phase)
            barrier = pipe.producer_get_barrier(state)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(barrier, tx_bytes)
            for j in cutlass.range_constexpr(self.a_tail_slices):
                if j < slices_in:
                    cute.copy(
                        tma_atom_a_tail,
                        tAgA_tail[
                            (None, loads.tile_m * self.a_tail_slices + j, loads.ab_first_block + state.count)
                        ],
                        tAsA_tail[(None, state.index * self.a_tail_slices + j)],
                        tma_bar_ptr=barrier,
                        cache_policy=loads.a_cache_policy,
                    )
            self._load_b_and_scales(state, barrier, loads)
            pipe.producer_commit(state)
            state.advance()
        return state

    @cute.jit
    def _load_b_and_scales(self, state, barrier, loads: StageLoads):
        """Issue a stage's loads of B, SFA and (weight gradients) per-row SFB."""
        b_block = loads.ab_first_block + state.count
        b_mask = loads.b_mcast_mask
        if cutlass.const_expr(self.b_shared_per_tile):
            # This CTA's half of B to the pair when it shares B, else to itself (`_pair_of_tiles`).
            b_mask = loads.b_mcast_mask if loads.share_b else loads.own_mask
        cute.copy(
            loads.tma_atom_b,
            loads.tBgB_k[(None, b_block)],
            loads.tBsB[(None, state.index)],
            tma_bar_ptr=barrier,
            mcast_mask=b_mask,
            tma_desc_ptr=loads.load_desc_b,
            cache_policy=loads.b_cache_policy,
        )
        if cutlass.const_expr(self.b_shared_per_tile):
            if not loads.share_b:
                # The peer's half of this CTA's own group's B.
                cute.copy(
                    loads.tma_atom_b, loads.tBgB_other_k[(None, b_block)], loads.tBsB_other[(None, state.index)],
                    tma_bar_ptr=barrier, mcast_mask=loads.own_mask,
                )
        if cutlass.const_expr(self.block_scaled):
            if cutlass.const_expr(self.masked):
                sfa_src = loads.tSFAgSFA[(None, loads.tile_m, state.count, loads.group)]
            else:
                sfa_src = loads.tSFAgSFA[(None, loads.tile_m, loads.first_block + state.count)]
            cute.copy(loads.tma_atom_sfa, sfa_src, loads.tSFAsSFA[(None, state.index)], tma_bar_ptr=barrier)
        if cutlass.const_expr(self.sfb_per_row):
            cute.copy(
                loads.tma_atom_sfb,
                loads.tSFBgSFB[(None, loads.tile_n, loads.first_block + state.count)],
                loads.tSFBsSFB[(None, state.index)],
                tma_bar_ptr=barrier,
            )

    @cute.jit
    def _split_k_fixup(
        self, promoted, split, tile, k_splits, counters_ptr, partials_ptr, arrivals_ptr, barrier, mtid
    ):
        """Split K: make `promoted` the tile's full sum in the CTA that finishes the tile last.

        Every split writes its partial sum to its slot of the workspace with 128-bit stores
        (elements 4v .. 4v + 3 of math thread j at (v · threads + j) · 4: a warp's store covers
        512 contiguous bytes); after the math threads' barrier the first math thread counts the
        split in the tile's counter with one acq_rel atomic at GPU scope (its release is
        cumulative over the stores the barrier ordered before it, its acquire over the other
        splits' stores; the pattern of CUTLASS's split-K semaphore). The split that brings the
        count to k_splits adds every slot in split order (the sum does not depend on which CTA
        finished last) and resets the counter to zero for the next launch. It loads a batch of
        `split_k_read_batch` slots before adding any of them: one round trip to L2 per batch,
        not per split (one per split cost ~0.5 µs each on 64x32 tiles).
        Returns 1 in that CTA (it stores the tile), else 0."""
        threads = self.num_mma_threads
        frag = cute.size(promoted)
        vecs = frag // 4
        tile_elems = threads * frag
        tile_base = cutlass.Int64(tile) * k_splits * tile_elems
        partials = partials_ptr.toint()
        # Byte offsets: the tile's first slot, and this thread's first vector in a slot.
        tile_bytes = tile_base * 4
        thread_bytes = cutlass.Int64(mtid * 16)

        piece = cute.make_rmem_tensor(4, cutlass.Float32)
        for v in cutlass.range_constexpr(vecs):
            for e in cutlass.range_constexpr(4):
                piece[e] = promoted[4 * v + e]
            cute.autovec_copy(piece, self._split_slot_vec(partials, tile_bytes, thread_bytes, split, v, tile_elems))
        barrier.arrive_and_wait()
        arrivals = cute.make_tensor(arrivals_ptr, cute.make_layout(1))
        if mtid == 0:
            arrivals[0] = cute.arch.atomic_add(counters_ptr + tile, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        barrier.arrive_and_wait()
        last = cutlass.Int32(0)
        if arrivals[0] == k_splits - 1:
            last = cutlass.Int32(1)
            batch = self.split_k_read_batch
            total = cute.make_rmem_tensor(promoted.shape, cutlass.Float32)
            total.fill(0.0)
            got = cute.make_rmem_tensor(batch * frag, cutlass.Float32)
            for first in range(0, k_splits, batch):
                # Every load of the batch first, then the adds in split order. This CTA's own
                # partial is read back too: keeping it in registers across the loads made the
                # 64x128 and 128x128 kernels spill.
                for b in cutlass.range_constexpr(batch):
                    if first + b < k_splits:
                        for v in cutlass.range_constexpr(vecs):
                            cute.autovec_copy(
                                self._split_slot_vec(partials, tile_bytes, thread_bytes, first + b, v, tile_elems), piece
                            )
                            for e in cutlass.range_constexpr(4):
                                got[b * frag + 4 * v + e] = piece[e]
                for b in cutlass.range_constexpr(batch):
                    if first + b < k_splits:
                        for i in cutlass.range_constexpr(frag):
                            total[i] = total[i] + got[b * frag + i]
            for i in cutlass.range_constexpr(frag):
                promoted[i] = total[i]
            if mtid == 0:
                counters = cute.make_tensor(counters_ptr, cute.make_layout(tile + 1))
                counters[tile] = cutlass.Int32(0)
        return last

    def _split_slot_vec(self, partials, tile_bytes, thread_bytes, split, v, tile_elems: int):
        """This thread's v-th 128-bit vector in split `split`'s slot of a tile's partials."""
        offset = tile_bytes + cutlass.Int64(split) * (tile_elems * 4) + (v * self.num_mma_threads * 16 + thread_bytes)
        return vec16_at(cutlass.Float32, partials, offset)

    @cute.jit
    def _k_grouped_blocks(self, mSizes, g, blocks_before, s_blocks):
        """Group g's 128-token blocks in the k-grouped layout, ⌈group_sizes[g]/128⌉ read on the
        GPU and cut to the blocks the operands hold past the groups before it (`s_blocks` = S
        in all): sizes past them are never read beyond A, B or their scales, and a group wholly
        past them has none."""
        size = mSizes[g]
        # ⌈size/128⌉ without overflow; a negative size comes out at most 0, then 0.
        blocks = size // SCALE_BLOCK + cutlass.min(size % SCALE_BLOCK, 1)
        return cutlass.max(cutlass.min(blocks, s_blocks - blocks_before), 0)

    @cute.jit
    def _k_grouped_total(self, mSizes, per_group, s_blocks):
        """Cluster tiles of the k-grouped layout: every group with at least one block
        (`_k_grouped_blocks`) has `per_group` of them; the others have none (their D is left as
        it is)."""
        total = cutlass.Int32(0)
        blocks_before = cutlass.Int32(0)
        for g in range(cute.size(mSizes)):
            blocks = self._k_grouped_blocks(mSizes, g, blocks_before, s_blocks)
            if blocks > 0:
                total += per_group
            blocks_before += blocks
        return total

    @cute.jit
    def _k_grouped_locate(self, t, mSizes, per_group, s_blocks):
        """Cluster tile t of the k-grouped layout → (group, cluster tile within the group, the
        group's first 128-token block, its block count `_k_grouped_blocks`)."""
        group = cutlass.Int32(0)
        local = t
        before = cutlass.Int32(0)
        blocks_before = cutlass.Int32(0)
        first_block = cutlass.Int32(0)
        k_blocks = cutlass.Int32(0)
        found = cutlass.Int32(0)
        for g in range(cute.size(mSizes)):
            blocks = self._k_grouped_blocks(mSizes, g, blocks_before, s_blocks)
            if found == 0:
                if blocks > 0:
                    if t < before + per_group:
                        group = cutlass.Int32(g)
                        local = t - before
                        first_block = blocks_before
                        k_blocks = blocks
                        found = cutlass.Int32(1)
                    before += per_group
            blocks_before += blocks
        return group, local, first_block, k_blocks

    @cute.jit
    def _group_descriptor_slots(self, workspace_ptr, cta_rank_in_cluster):
        """This CTA's two 128-byte descriptor slots (A, B) in the workspace, as tensor-map pointers."""
        cm, cn = self.cluster_shape_mn
        _, _, cluster_idx = cute.arch.block_idx()
        slot = (cluster_idx * (cm * cn) + cta_rank_in_cluster) * 2
        manager = TensorMapManager(TensorMapUpdateMode.GMEM, TENSORMAP_BYTES)
        desc_a = manager.get_tensormap_ptr(workspace_ptr + slot * TENSORMAP_WORDS)
        desc_b = manager.get_tensormap_ptr(workspace_ptr + (slot + 1) * TENSORMAP_WORDS)
        # The TMA copies take the descriptors as generic addresses.
        load_a = manager.get_tensormap_ptr(desc_a, cute.AddressSpace.generic)
        load_b = manager.get_tensormap_ptr(desc_b, cute.AddressSpace.generic)
        return desc_a, desc_b, load_a, load_b

    @cute.jit
    def _point_descriptors_at_group(
        self, tma_atom_a, tma_atom_b, a_base_ptr, b_base_ptr, m, n, first_block, k_blocks, desc_a, desc_b
    ):
        """Rewrite this CTA's descriptors of A and B for one group (run by the whole producer warp).

        Group g's A is [M, 128·⌈k_g/128⌉] row-major starting 128·M·(first block) elements into the
        flat A (B likewise with N). The TMA loads issued with the old descriptors must have read
        them before they change: the bulk-async wait below is the fence CUTLASS uses for that."""
        tk = self.tile_shape_mnk[2]
        k = k_blocks * tk
        first = cutlass.Int64(first_block) * tk
        a_group = cute.make_tensor(a_base_ptr + first * m, cute.make_layout((m, k), stride=(k, 1)))
        b_group = cute.make_tensor(b_base_ptr + first * n, cute.make_layout((n, k), stride=(k, 1)))
        with cute.arch.elect_one():
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.sync_warp()
        cpasync.update_tma_descriptor(tma_atom_a, a_group, desc_a)
        cpasync.update_tma_descriptor(tma_atom_b, b_group, desc_b)
        cute.arch.sync_warp()
        cpasync.fence_tma_desc_release()
        cpasync.fence_tma_desc_acquire(desc_a)
        cpasync.fence_tma_desc_acquire(desc_b)

    @cute.jit
    def _m_tile_of_cluster_tile(self, t, ct_m, ct_n, cluster_coord_mnk, peer: bool):
        """Contiguous layout: the M tile of this CTA in cluster tile t; with `peer`, that of the
        other CTA of a 2x1 cluster."""
        cta_m = cluster_coord_mnk[0]
        if cutlass.const_expr(peer):
            cta_m = self.cluster_shape_mn[0] - 1 - cluster_coord_mnk[0]
        ctm, _ = self._cluster_tile_coord(t, ct_m, ct_n)
        return ctm * self.cluster_shape_mn[0] + cta_m

    @cute.jit
    def _group_of_cluster_tile(
        self, mIdx, num_groups, t, num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk, peer: bool = False
    ):
        """Contiguous layout: the group of this CTA's tile in cluster tile t (-1 for padding); with
        `peer`, that of the other CTA's tile of a 2x1 cluster. Both roles read it at the tile's
        start, from L1: `_prefetch_group_of_cluster_tile` asked for it a tile before."""
        group = cutlass.Int32(-1)
        if t < num_cluster_tiles:
            tile_m = self._m_tile_of_cluster_tile(t, ct_m, ct_n, cluster_coord_mnk, peer)
            group = self._tile_group(mIdx, tile_m, num_groups)
        return group

    @cute.jit
    def _prefetch_group_of_cluster_tile(
        self, mIdx, t, num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk, peer: bool = False, warpgroup_row=None
    ):
        """Prefetch into L1 what `_group_of_cluster_tile` will read for cluster tile t (nothing
        past the tile sequence), and with `warpgroup_row` what `_warpgroup_rows_real` will."""
        if t < num_cluster_tiles:
            tile_m = self._m_tile_of_cluster_tile(t, ct_m, ct_n, cluster_coord_mnk, peer)
            self._prefetch_tile_group(mIdx, tile_m)
            if cutlass.const_expr(warpgroup_row is not None):
                self._prefetch_tile_group(mIdx, tile_m, warpgroup_row)

    @cute.jit
    def _warpgroup_rows_real(self, mIdx, num_groups, tile_m, warpgroup_row, group):
        """Contiguous layout: whether the math warpgroup whose rows of M tile `tile_m` start
        `warpgroup_row` rows into it has any real row. Padding rows are the tail of a tile (a
        group's segment is tile-aligned), so it has one exactly when its first row is real;
        the first warpgroup's first row is the tile's (`group`)."""
        real = group >= 0
        if warpgroup_row > 0:
            real = self._tile_group(mIdx, tile_m, num_groups, warpgroup_row) >= 0
        return real

    @cute.jit
    def _walk_stages(self, pipe, read_state, k_tiles):
        """A math warpgroup that computes nothing of a tile (`_warpgroup_rows_real`): wait for
        each of the tile's stages and release it, as the producer and the other consumers
        expect. Returns the advanced state (the caller must rebind it)."""
        for _ in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(read_state)
            pipe.consumer_release(read_state)
            read_state.advance()
        return read_state

    @cute.jit
    def _groups_of_contiguous_tile(
        self, mIdx, num_groups, t, tile_stride, num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk, warpgroup_row=None
    ):
        """Contiguous layout: (the group of this CTA's tile in cluster tile t, that of its 2x1
        cluster peer's tile, or -1 without a peer), and the lines holding the groups of the tiles
        at t + tile_stride prefetched into L1 for the next call (with `warpgroup_row`, also the
        line `_warpgroup_rows_real` reads). Both roles call it at each tile's start."""
        tile_args = (num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk)
        self._prefetch_group_of_cluster_tile(mIdx, t + tile_stride, *tile_args, warpgroup_row=warpgroup_row)
        if cutlass.const_expr(self.b_shared_per_tile):
            self._prefetch_group_of_cluster_tile(mIdx, t + tile_stride, *tile_args, peer=True)
        group = self._group_of_cluster_tile(mIdx, num_groups, t, *tile_args)
        peer_group = cutlass.Int32(-1)
        if cutlass.const_expr(self.b_shared_per_tile):
            peer_group = self._group_of_cluster_tile(mIdx, num_groups, t, *tile_args, peer=True)
        return group, peer_group

    @cute.jit
    def _pair_of_tiles(self, group, peer_group, k_tile_cnt):
        """Contiguous layout, 2x1 clusters: (whether the pair shares B, the K blocks both CTAs
        walk) for tiles of `group` and `peer_group`. They share B when they are one group's; the
        pair loads and computes unless both tiles are padding, so that both CTAs walk the same
        stages (each CTA's consumers release the other's). Both roles take it from here."""
        share_b = (group == peer_group) & (group >= 0)
        k_tiles = k_tile_cnt if (group >= 0) | (peer_group >= 0) else cutlass.Int32(0)
        return share_b, k_tiles

    @cute.jit
    def _row_groups(self, promoted, tCcC, mIdx, num_groups, tile_m):
        """m_indices of the row of each of this thread's accumulator elements (a few distinct
        loads: the elements share rows), read at the tile's start so that the loads' latency is
        hidden behind its main loop; `_zero_padding_rows` uses them after it."""
        row0 = tile_m * self.tile_shape_mnk[0]
        last = cute.size(mIdx) - 1
        groups = cute.make_rmem_tensor(cute.size(promoted), cutlass.Int32)
        for i in cutlass.range_constexpr(cute.size(promoted)):
            groups[i] = self._group_or_padding(mIdx[cutlass.min(row0 + tCcC[i][0], last)], num_groups)
        return groups

    @cute.jit
    def _zero_padding_rows(self, promoted, row_groups):
        """Zero this thread's accumulator rows that are padding (`_group_or_padding`). Padding
        rows are the tail of a group's last tile, so most tiles have none: one test over the
        thread's rows (a few distinct values) skips the per-element selects there."""
        any_padding = row_groups[0] < 0
        for i in cutlass.range_constexpr(1, cute.size(promoted)):
            any_padding = any_padding | (row_groups[i] < 0)
        if any_padding:
            for i in cutlass.range_constexpr(cute.size(promoted)):
                promoted[i] = promoted[i] if row_groups[i] >= 0 else cutlass.Float32(0.0)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA_mk: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nk: cute.Tensor,
        tma_atom_sfa,
        mSFA_mk,
        sfb_ptr,
        tma_atom_sfb,
        mSFB_nk,
        tma_atom_c: cute.CopyAtom,
        mC_mn: cute.Tensor,
        m_indices_ptr,
        zero_padding,
        masked_m_ptr,
        group_sizes_ptr,
        workspace_ptr,
        split_counters_ptr,
        split_partials_ptr,
        k_splits,
        a_base_ptr,
        b_base_ptr,
        tail_split,
        tma_atom_a_tail,
        a_smem_layout_staged: cute.ComposedLayout,
        a_tail_layout_staged,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        epi_smem_layout_staged: cute.ComposedLayout,
    ):
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_c)
            if cutlass.const_expr(self.a_tail_slices > 0):
                cpasync.prefetch_descriptor(tma_atom_a_tail)
            if cutlass.const_expr(self.block_scaled):
                cpasync.prefetch_descriptor(tma_atom_sfa)
            if cutlass.const_expr(self.sfb_per_row):
                cpasync.prefetch_descriptor(tma_atom_sfb)

        tiled_mma = self._make_tiled_mma()
        cta_layout_mnk = cute.make_layout((cm, cn, 1))
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord_mnk = cta_layout_mnk.get_flat_coord(cta_rank_in_cluster)
        a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=1)
        b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=0)
        a_mcast_mask = a_mcast_mask if self.is_a_mcast else 0
        b_mcast_mask = b_mcast_mask if self.is_b_mcast else 0

        a_smem_layout = cute.slice_(a_smem_layout_staged, (None, None, 0))
        b_smem_layout = cute.slice_(b_smem_layout_staged, (None, None, 0))
        a_tile_bytes = cute.size_in_bytes(self.a_dtype, a_smem_layout)
        a_slice_bytes = A_TAIL_SLICE_ROWS * tk * self.a_dtype.width // 8
        tma_copy_bytes = a_tile_bytes + cute.size_in_bytes(self.b_dtype, b_smem_layout)
        if cutlass.const_expr(self.block_scaled):
            tma_copy_bytes += tm * 4
        if cutlass.const_expr(self.sfb_per_row):
            tma_copy_bytes += tn * 4

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        mcast_size = self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
        consumer_arrive_cnt = mcast_size * self.num_mma_warpgroups * 4
        mainloop_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mainloop_barriers.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrive_cnt),
            tx_count=tma_copy_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sC = storage.sC.get_tensor(
            epi_smem_layout_staged.outer, swizzle=epi_smem_layout_staged.inner
        )

        # SFA stage buffers and their TMA partition; SFB as a [⌈N/128⌉, ⌈K/128⌉] row-major view.
        sSFA = None
        tSFAsSFA = None
        tSFAgSFA = None
        mSFB = None
        if cutlass.const_expr(self.block_scaled):
            sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
            tSFAsSFA, tSFAgSFA = self._partition_scale_vector(tma_atom_sfa, sSFA, mSFA_mk, tm)
            k_blocks = mSFA_mk.shape[1]
            n_blocks = (mC_mn.shape[1] + SCALE_BLOCK - 1) // SCALE_BLOCK
            if cutlass.const_expr(self.m_grouped):
                # SFB [G, ⌈N/128⌉, ⌈K/128⌉] row-major, viewed as (n block, k block, group).
                mSFB = cute.make_tensor(
                    sfb_ptr,
                    cute.make_layout(
                        (n_blocks, k_blocks, mB_nk.shape[2]),
                        stride=(k_blocks, 1, n_blocks * k_blocks),
                    ),
                )
            elif cutlass.const_expr(not self.sfb_per_row):
                mSFB = cute.make_tensor(
                    sfb_ptr, cute.make_layout((n_blocks, k_blocks), stride=(k_blocks, 1))
                )
        sSFB = None
        tSFBsSFB = None
        tSFBgSFB = None
        if cutlass.const_expr(self.sfb_per_row):
            sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)
            tSFBsSFB, tSFBgSFB = self._partition_scale_vector(tma_atom_sfb, sSFB, mSFB_nk, tn)
        mIdx = None
        mMasked = None
        mSizes = None
        if cutlass.const_expr(self.k_grouped):
            mSizes = cute.make_tensor(group_sizes_ptr, cute.make_layout(mC_mn.shape[2]))
        if cutlass.const_expr(self.masked):
            mMasked = cute.make_tensor(masked_m_ptr, cute.make_layout(mB_nk.shape[2]))
        elif cutlass.const_expr(self.m_grouped):
            mIdx = cute.make_tensor(m_indices_ptr, cute.make_layout(mC_mn.shape[0]))

        # (bM, bK, RestM, RestK), (bN, bK, RestN, RestK), (bM, bN, RestM, RestN)
        if cutlass.const_expr(self.masked):
            # (bM, bK, RestM, RestK, G) and (bM, bN, RestM, RestN, G)
            gA_mk = cute.local_tile(mA_mk, (tm, tk), (None, None, None))
        else:
            gA_mk = cute.local_tile(mA_mk, (tm, tk), (None, None))
        if cutlass.const_expr(self.m_grouped):
            # (bN, bK, RestN, RestK, G)
            gB_nk = cute.local_tile(mB_nk, (tn, tk), (None, None, None))
        else:
            gB_nk = cute.local_tile(mB_nk, (tn, tk), (None, None))
        if cutlass.const_expr(self.d_grouped):
            gC_mn = cute.local_tile(mC_mn, (tm, tn), (None, None, None))
        else:
            gC_mn = cute.local_tile(mC_mn, (tm, tn), (None, None))

        a_cta_layout = cute.make_layout(cute.slice_(cta_layout_mnk, (0, None, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a,
            cluster_coord_mnk[1],
            a_cta_layout,
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA_mk, 0, 2),
        )
        tAsA_tail = None
        tAgA_tail = None
        if cutlass.const_expr(self.a_tail_slices > 0):
            # (16, bK, RestM16, RestK): the tail tile's slices, never multicast, into sA's bytes.
            sA_tail = storage.sA.get_tensor(a_tail_layout_staged.outer, swizzle=a_tail_layout_staged.inner)
            gA_tail = cute.local_tile(mA_mk, (A_TAIL_SLICE_ROWS, tk), (None, None))
            tAsA_tail, tAgA_tail = cpasync.tma_partition(
                tma_atom_a_tail,
                0,
                cute.make_layout(1),
                cute.group_modes(sA_tail, 0, 2),
                cute.group_modes(gA_tail, 0, 2),
            )
        b_cta_layout = cute.make_layout(cute.slice_(cta_layout_mnk, (None, 0, 0)).shape)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b,
            cluster_coord_mnk[0],
            b_cta_layout,
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB_nk, 0, 2),
        )
        tBsB_other = None
        tBgB_other = None
        b_own_mask = None
        if cutlass.const_expr(self.b_shared_per_tile):
            # The peer's half of B (its multicast slice), which this CTA loads itself for tiles
            # whose pair belongs to two groups; a multicast to this CTA alone.
            tBsB_other, tBgB_other = cpasync.tma_partition(
                tma_atom_b,
                cm - 1 - cluster_coord_mnk[0],
                b_cta_layout,
                cute.group_modes(sB, 0, 2),
                cute.group_modes(gB_nk, 0, 2),
            )
            b_own_mask = cutlass.Int16(1) << cutlass.Int16(cta_rank_in_cluster)

        warp_group_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        mma_wg_layout = cute.make_layout(self.num_mma_warpgroups, stride=THREADS_PER_WARPGROUP)
        thr_mma = tiled_mma.get_slice(mma_wg_layout(warp_group_idx - 1))
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        tCgC = thr_mma.partition_C(gC_mn)
        accumulators = cute.make_rmem_tensor(tCgC.shape[:3], self.acc_dtype)
        # The block-scaled path promotes each K block's WGMMA result into `promoted`; the
        # epilogue stores whichever tensor holds the final sum.
        promoted = accumulators
        accs = None
        tCcC = None
        if cutlass.const_expr(self.block_scaled):
            # The ring of WGMMA accumulators of one wave (64 rows per warpgroup); `promoted`
            # holds the tile's sum.
            accs = tuple(
                cute.make_rmem_tensor((tCgC.shape[0], 1, 1), self.acc_dtype)
                for _ in range(self.wgmma_accumulators)
            )
            promoted = cute.make_rmem_tensor(tCgC.shape[:3], self.acc_dtype)
            # Tile-local (row, column) of every accumulator element of *this thread* (thr_mma is
            # the warpgroup's slice, which the WGMMA needs; coordinates need the thread's).
            thr_mma_own = tiled_mma.get_slice(tidx - THREADS_PER_WARPGROUP)
            tCcC = thr_mma_own.partition_C(cute.make_identity_tensor((tm, tn)))

        k_tile_cnt = cute.size(gA_mk, mode=[3])
        tiles_m = cute.size(gC_mn, mode=[2])
        tiles_n = cute.size(gC_mn, mode=[3])
        ct_m = (tiles_m + cm - 1) // cm
        ct_n = (tiles_n + cn - 1) // cn
        num_cluster_tiles = ct_m * ct_n
        if cutlass.const_expr(self.fast_raster):
            # Every role locates its tiles with these divisors (`_cluster_tile_coord`).
            self.raster_divisors = self._make_raster_divisors(ct_m, ct_n)
        if cutlass.const_expr(self.masked):
            num_cluster_tiles = self._masked_total(mMasked, mA_mk.shape[0], ct_n)
        if cutlass.const_expr(self.k_grouped):
            num_cluster_tiles = self._k_grouped_total(mSizes, num_cluster_tiles, k_tile_cnt)
        if cutlass.const_expr(self.split_k):
            # Work units: (cluster tile, split), the splits of a tile adjacent.
            num_cluster_tiles = num_cluster_tiles * k_splits
        _, _, first_tile = cute.arch.block_idx()
        _, _, tile_stride = cute.arch.grid_dim()
        tail = None
        if cutlass.const_expr(self.tail_split):
            tail, num_cluster_tiles = self._tail_plan(
                num_cluster_tiles, tile_stride, first_tile, k_tile_cnt, tail_split
            )
            first_tile = self._first_unit(first_tile, tail)

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        is_producer_wg = warp_group_idx == 0
        if is_producer_wg:
            cute.arch.setmaxregister_decrease(self.producer_regs)

        if warp_idx == self.load_warp_id:
            producer_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Producer, self.ab_stage
            )
            desc_a = None
            desc_b = None
            load_desc_a = None
            load_desc_b = None
            if cutlass.const_expr(self.k_grouped):
                # Start from the host's descriptors (swizzle, box, dtype); only address, extents
                # and strides change per group.
                desc_a, desc_b, load_desc_a, load_desc_b = self._group_descriptor_slots(
                    workspace_ptr, cta_rank_in_cluster
                )
                with cute.arch.elect_one():
                    cpasync.copy_tensormap(tma_atom_a, desc_a)
                    cpasync.copy_tensormap(tma_atom_b, desc_b)
                cute.arch.sync_warp()
                cute.arch.fence_acq_rel_cta()
            current_group = cutlass.Int32(-1)
            load_policies = None
            if cutlass.const_expr(self.hints_streamed_b):
                load_policies = self._load_policies(mA_mk.shape[0])
            t = first_tile
            while t < num_cluster_tiles:
                group, tile_m, tile_n, first_block, tile_k_tiles = self._locate_tile(
                    t, ct_m, ct_n, mMasked, mA_mk.shape[0], mSizes, k_tile_cnt, cluster_coord_mnk, k_splits, tail
                )
                if cutlass.const_expr(self.k_grouped):
                    if group != current_group:
                        self._point_descriptors_at_group(
                            tma_atom_a, tma_atom_b, a_base_ptr, b_base_ptr, mC_mn.shape[0],
                            mC_mn.shape[1], first_block, tile_k_tiles, desc_a, desc_b,
                        )
                        current_group = group
                if cutlass.const_expr(self.masked):
                    tAgA_k = tAgA[(None, tile_m, None, group)]
                    tBgB_k = tBgB[(None, tile_n, None, group)]
                elif cutlass.const_expr(self.m_grouped):
                    tAgA_k = tAgA[(None, tile_m, None)]
                    group, peer_group = self._groups_of_contiguous_tile(
                        mIdx, mB_nk.shape[2], t, tile_stride, num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk
                    )
                    # A tile of padding rows only is not loaded (nor computed).
                    tile_k_tiles = k_tile_cnt if group >= 0 else cutlass.Int32(0)
                    tBgB_k = tBgB[(None, tile_n, None, cutlass.max(group, 0))]
                    if cutlass.const_expr(self.b_shared_per_tile):
                        share_b, tile_k_tiles = self._pair_of_tiles(group, peer_group, k_tile_cnt)
                        tBgB_other_k = tBgB_other[(None, tile_n, None, cutlass.max(group, 0))]
                else:
                    tAgA_k = tAgA[(None, tile_m, None)]
                    tBgB_k = tBgB[(None, tile_n, None)]
                # A and B are addressed from the unit's first K block, like the scales, except in
                # the k-grouped op, whose descriptors already start at the group's.
                ab_first_block = cutlass.Int32(0) if self.k_grouped else first_block
                # The tile that holds row M - 1 when M ends inside it loads only its A slices that
                # start before M, through the tail map (`_produce_tail_tile`); a tile past M (the
                # idle CTA of a 2x1 cluster at M <= 64) loads no A. The pair of a 1x2 A-multicast
                # cluster shares the tile, so both take the same path. Whole tiles load one box.
                stage_loads = StageLoads(
                    tma_atom_b, tBgB_k, tBsB, b_mcast_mask, load_desc_b, tma_atom_sfa, tSFAgSFA,
                    tSFAsSFA, tma_atom_sfb, tSFBgSFB, tSFBsSFB, ab_first_block, first_block,
                    tile_m, tile_n, group,
                )
                if cutlass.const_expr(self.hints_streamed_b):
                    b_policy, a_policy = load_policies
                    stage_loads = stage_loads._replace(b_cache_policy=b_policy, a_cache_policy=a_policy)
                if cutlass.const_expr(self.b_shared_per_tile):
                    stage_loads = stage_loads._replace(
                        share_b=share_b, tBgB_other_k=tBgB_other_k, tBsB_other=tBsB_other, own_mask=b_own_mask
                    )
                producer_state.reset_count()
                if cutlass.const_expr(self.a_tail_slices > 0):
                    rows_in = mA_mk.shape[0] - tile_m * tm
                    if rows_in < tm:
                        slices_in = (cutlass.max(rows_in, 0) + A_TAIL_SLICE_ROWS - 1) // A_TAIL_SLICE_ROWS
                        producer_state = self._produce_tail_tile(
                            mainloop_pipeline, producer_state, tile_k_tiles, slices_in,
                            tma_copy_bytes - a_tile_bytes + slices_in * a_slice_bytes,
                            tma_atom_a_tail, tAgA_tail, tAsA_tail, stage_loads,
                        )
                    else:
                        producer_state = self._produce_whole_tile(
                            mainloop_pipeline, producer_state, tile_k_tiles, tma_atom_a, tAgA_k, tAsA,
                            a_mcast_mask, load_desc_a, stage_loads,
                        )
                else:
                    producer_state = self._produce_whole_tile(
                        mainloop_pipeline, producer_state, tile_k_tiles, tma_atom_a, tAgA_k, tAsA,
                        a_mcast_mask, load_desc_a, stage_loads,
                    )
                t = self._next_unit(t, tile_k_tiles, tile_stride, tail)
            mainloop_pipeline.producer_tail(producer_state)

        if not is_producer_wg:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            read_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.ab_stage
            )
            release_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.ab_stage
            )
            num_k_blocks = cute.size(tCrA, mode=[2])

            # Epilogue partitions: registers → swizzled smem (stmatrix) → TMA store.
            c_layout = LayoutEnum.ROW_MAJOR
            copy_atom_r2s = sm90_utils.sm90_get_smem_store_op(
                c_layout, elem_ty_d=self.c_dtype, elem_ty_acc=self.acc_dtype
            )
            copy_atom_c = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), self.c_dtype
            )
            # Per-warpgroup epilogue: the stmatrix copy of one warpgroup (64-row sub-tiles); a
            # warpgroup's accumulator fragment is the same whatever the warpgroups beside it.
            epi_mma = tiled_mma
            epi_thread = tidx - THREADS_PER_WARPGROUP
            if cutlass.const_expr(self.epi_per_warpgroup):
                epi_mma = self._make_tiled_mma((1, 1, 1))
                epi_thread = tidx % THREADS_PER_WARPGROUP
            tiled_copy_c_atom = cute.make_tiled_copy_C_atom(copy_atom_c, epi_mma)
            tiled_copy_r2s = cute.make_tiled_copy_S(copy_atom_r2s, tiled_copy_c_atom)
            thr_copy_r2s = tiled_copy_r2s.get_slice(epi_thread)
            tRS_sD = thr_copy_r2s.partition_D(sC)
            tRS_rAcc = tiled_copy_r2s.retile(promoted)
            rD_shape = cute.shape(thr_copy_r2s.partition_S(sC))
            tRS_rD = cute.make_rmem_tensor(rD_shape[:3], self.acc_dtype)
            tRS_rD_out = cute.make_rmem_tensor(rD_shape[:3], self.c_dtype)
            size_tRS_rD = cute.size(tRS_rD)

            epilogue_barrier = pipeline.NamedBarrier(
                barrier_id=EPILOGUE_BARRIER_ID, num_threads=self.num_mma_threads
            )
            # Per-warpgroup epilogue: a named barrier per math warpgroup (ids 1 and 2), and the
            # warpgroup's first warp stores its sub-tiles.
            wg_offset = warp_group_idx - 1
            # This math warpgroup's first row in the tile (its one wave of 64 rows).
            warpgroup_row = wg_offset * (self.tile_shape_mnk[0] // self.num_mma_warpgroups)
            warpgroup_barrier = pipeline.NamedBarrier(
                barrier_id=EPILOGUE_BARRIER_ID + wg_offset, num_threads=THREADS_PER_WARPGROUP
            )
            wg_store_warp = self.epi_store_warp_id + 4 * wg_offset
            # The whole-tile epilogue's barrier and storing warp: the CTA's math threads and
            # warp epi_store_warp_id, or with per-warpgroup stores this warpgroup's.
            staged_barrier = epilogue_barrier
            staged_store_warp = self.epi_store_warp_id
            if cutlass.const_expr(self.epi_per_warpgroup):
                staged_barrier = warpgroup_barrier
                staged_store_warp = wg_store_warp
            # Whole-tile epilogue (a buffer per sub-tile): one bulk group per tile, and the
            # buffers are free again once that group has been read (wait for 0 pending).
            store_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=1 if self.epi_whole_tile else self.epi_stage,
                producer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, self.num_mma_threads
                ),
            )

            tiles_done = cutlass.Int32(0)
            contiguous = self.contiguous
            t = first_tile
            while t < num_cluster_tiles:
                group, tile_m, tile_n, first_block, tile_k_tiles = self._locate_tile(
                    t, ct_m, ct_n, mMasked, mA_mk.shape[0], mSizes, k_tile_cnt, cluster_coord_mnk, k_splits, tail
                )
                if cutlass.const_expr(self.d_grouped):
                    gC_tile = gC_mn[(None, None, tile_m, tile_n, group)]
                else:
                    gC_tile = gC_mn[(None, None, tile_m, tile_n)]

                read_state.reset_count()
                release_state.reset_count()
                # The helpers advance the pipeline states; assigning them back is what makes
                # the DSL carry the states across iterations of this persistent loop (state
                # merely passed to a call is not loop-carried, and the next tile would hang).
                write_tile = cutlass.Int32(1)
                sfb_group = group
                if cutlass.const_expr(contiguous):
                    # The tile's group from its first row; tiles of padding rows only have none.
                    # The rows' groups for the padding rows of D are read now too and used after
                    # the main loop.
                    group, peer_group = self._groups_of_contiguous_tile(
                        mIdx, mB_nk.shape[2], t, tile_stride, num_cluster_tiles, ct_m, ct_n, cluster_coord_mnk,
                        warpgroup_row,
                    )
                    row_groups = self._row_groups(promoted, tCcC, mIdx, mB_nk.shape[2], tile_m)
                    tile_k_tiles = k_tile_cnt if group >= 0 else cutlass.Int32(0)
                    sfb_group = cutlass.max(group, 0)
                    if cutlass.const_expr(self.b_shared_per_tile):
                        # This CTA's padding rows are zeroed, or not written, after the main loop.
                        _, tile_k_tiles = self._pair_of_tiles(group, peer_group, k_tile_cnt)
                tile_sfb = mSFB
                if cutlass.const_expr(self.split_k):
                    # SFB columns from the split's first K block on (stride 1 along K).
                    tile_sfb = cute.make_tensor(mSFB.iterator + first_block, mSFB.layout)
                if cutlass.const_expr(self.block_scaled):
                    # Dense: every K block (of the split); k-grouped: the group's blocks;
                    # contiguous: none for padding tiles.
                    tile_args = (accs, promoted, tCrA, tCrB, tCcC, sSFA, tile_sfb, mainloop_pipeline)
                    loop_args = (tile_k_tiles, num_k_blocks, tile_n, sfb_group, sSFB, contiguous)
                    if cutlass.const_expr(self.skips_padding_warpgroups):
                        # A warpgroup of padding rows only leaves the tensor cores to the other
                        # one; its rows of D are zeros (or, with the opt-out, unspecified). The
                        # branch builds its own tiled MMA (a field set inside a dynamic branch
                        # must not be read after it).
                        if self._warpgroup_rows_real(mIdx, mB_nk.shape[2], tile_m, warpgroup_row, group):
                            read_state = self._block_scaled_tile(
                                self._make_tiled_mma(), *tile_args, read_state, *loop_args
                            )
                        else:
                            promoted.fill(0.0)
                            read_state = self._walk_stages(mainloop_pipeline, read_state, tile_k_tiles)
                    else:
                        read_state = self._block_scaled_tile(tiled_mma, *tile_args, read_state, *loop_args)
                else:
                    read_state, release_state = self._mainloop(
                        tiled_mma, accumulators, tCrA, tCrB, mainloop_pipeline, read_state,
                        release_state, k_tile_cnt, num_k_blocks,
                    )
                if cutlass.const_expr(contiguous):
                    # Padding rows of D are written as zeros unless the caller opted out; with
                    # the opt-out, tiles of padding rows only are not written at all.
                    if zero_padding != 0:
                        self._zero_padding_rows(promoted, row_groups)
                    write_tile = cutlass.Int32(1) if (group >= 0) | (zero_padding != 0) else cutlass.Int32(0)
                if cutlass.const_expr(self.split_k):
                    write_tile = self._split_k_fixup(
                        promoted, t % k_splits, tile_m * (ct_n * cn) + tile_n, k_splits,
                        split_counters_ptr, split_partials_ptr, cute.recast_ptr(storage.sSFB.data_ptr(), dtype=cutlass.Int32),
                        epilogue_barrier, tidx - THREADS_PER_WARPGROUP,
                    )

                # Epilogue.
                tCgC_epi = cute.zipped_divide(gC_tile, self.epi_tile)
                bSG_sD, bSG_gD = cpasync.tma_partition(
                    tma_atom_c,
                    0,
                    cute.make_layout(1),
                    cute.group_modes(sC, 0, 2),
                    tCgC_epi,
                )
                epi_tile_num = cute.size(tCgC_epi, mode=[1])
                epi_tile_shape = tCgC_epi.shape[1]
                epi_tile_layout = cute.make_layout(epi_tile_shape, stride=(epi_tile_shape[1], 1))
                num_prev_epi_tiles = tiles_done * epi_tile_num
                convert_args = (tRS_rAcc, tRS_rD, tRS_rD_out, size_tRS_rD)
                if cutlass.const_expr(self.epi_whole_tile):
                    # The previous tile's stores have read the buffers (issued a main loop ago,
                    # so this rarely waits); then every sub-tile goes to its own buffer, one
                    # barrier, and one warp issues all the stores as one bulk group (per
                    # warpgroup: each its own sub-tiles, barrier and bulk group).
                    subtiles = self._staged_subtiles(epi_tile_num, epi_tile_layout, wg_offset)
                    if warp_idx == staged_store_warp:
                        store_pipeline.producer_acquire()
                    staged_barrier.arrive_and_wait()
                    for chunk, buffer, _ in subtiles:
                        self._convert_subtile(*convert_args, chunk)
                        cute.copy(tiled_copy_r2s, tRS_rD_out, tRS_sD[(None, None, None, buffer)])
                    # Make the stmatrix writes visible to the TMA unit before the stores.
                    cute.arch.fence_proxy("async.shared", space="cta")
                    staged_barrier.arrive_and_wait()
                    if warp_idx == staged_store_warp:
                        if write_tile != 0:
                            for _, buffer, gmem_coord in subtiles:
                                cute.copy(tma_atom_c, bSG_sD[(None, buffer)], bSG_gD[(None, gmem_coord)])
                        store_pipeline.producer_commit()
                else:
                    for epi_idx in cutlass.range_constexpr(epi_tile_num):
                        self._convert_subtile(*convert_args, epi_idx)
                        epi_buffer = (num_prev_epi_tiles + epi_idx) % self.epi_stage
                        cute.copy(tiled_copy_r2s, tRS_rD_out, tRS_sD[(None, None, None, epi_buffer)])
                        # Make the stmatrix writes visible to the TMA unit before the store.
                        cute.arch.fence_proxy("async.shared", space="cta")
                        epilogue_barrier.arrive_and_wait()
                        gmem_coord = epi_tile_layout.get_hier_coord(epi_idx)
                        if warp_idx == self.epi_store_warp_id:
                            if write_tile != 0:
                                cute.copy(tma_atom_c, bSG_sD[(None, epi_buffer)], bSG_gD[(None, gmem_coord)])
                            store_pipeline.producer_commit()
                            store_pipeline.producer_acquire()
                        epilogue_barrier.arrive_and_wait()

                tiles_done += 1
                t = self._next_unit(t, tile_k_tiles, tile_stride, tail)

            store_pipeline.producer_tail()


class HopperFp8GemmKernel(Fp8GemmNtEntry, HopperGemmKernel):
    """`fp8_gemm_nt` on sm_90a."""


class HopperSplitKFp8GemmKernel(Fp8GemmNtSplitKEntry, HopperGemmKernel):
    """`fp8_gemm_nt` on sm_90a with the K blocks of each tile split over CTAs."""


class HopperMGroupedFp8GemmKernel(MGroupedContiguousEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_contiguous` on sm_90a."""


class HopperMaskedFp8GemmKernel(MGroupedMaskedEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_masked` on sm_90a."""


class HopperFp8WgradKernel(HopperGemmKernel):
    """`fp8_wgrad_gemm_nt`: D (fp32) += (A · sfa) · (B · sfb)ᵀ, both scaled per 1x128 along K."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Tensor,
        d: cute.Tensor,
        tail_split: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, tail_split=tail_split)


class HopperKGroupedFp8GemmKernel(HopperGemmKernel):
    """`k_grouped_fp8_gemm_nt_contiguous`: for every group g with k_g > 0 tokens,
    D[g] (fp32) += (A_g · sfa_g) · (B_g · sfb_g)ᵀ, the groups' A_g [M, k_g] and B_g [N, k_g] stored
    one after another (each padded to whole 128-token blocks) with scales [Σ blocks, M | N]."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Tensor,
        d: cute.Tensor,
        group_sizes: cute.Pointer,
        workspace: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, sfa, sfb, max_active_clusters, stream, group_sizes=group_sizes, workspace=workspace
        )


class HopperGemmTemplate(GemmContract):
    """The generator's view of the Hopper GEMM template: the kernel class of the schedule's op."""

    def __init__(self, schedule: Schedule):
        super().__init__(schedule)
        if self.k_grouped:
            self.kernel = HopperKGroupedFp8GemmKernel(schedule)
        elif self.sfb_per_row:
            self.kernel = HopperFp8WgradKernel(schedule)
        elif self.masked:
            self.kernel = HopperMaskedFp8GemmKernel(schedule)
        elif self.m_grouped:
            self.kernel = HopperMGroupedFp8GemmKernel(schedule)
        elif self.split_k:
            self.kernel = HopperSplitKFp8GemmKernel(schedule)
        elif self.block_scaled:
            self.kernel = HopperFp8GemmKernel(schedule)
        else:
            self.kernel = HopperGemmKernel(schedule)
