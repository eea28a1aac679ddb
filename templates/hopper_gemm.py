"""Hopper (sm_90a) warp-specialised persistent GEMM: D[M,N] = A[M,K] · B[N,K]ᵀ, one kernel for six ops.

`HopperGemmKernel.kernel` is the protocol: shared set-up, then each thread's role, the TMA producer
warp (`_producer_role`) or a math warpgroup (`_math_role`: main loop, fix-up, epilogue). What
varies between op families sits behind a few hooks, each family's code in a module of its own:

* locate a work unit (`_locate_tile`): dense, split K and the tail split (`hopper_split_k`),
  masked (`tile_order`), k-grouped (`hopper_k_grouped`); contiguous tiles take their group from
  m_indices (`hopper_contiguous`);
* stage a tile's loads (`_tile_loads`, `hopper_producer`);
* the main loop (`_tile_mainloop`, `hopper_mainloop`: plain WGMMA, or block-scaled promotion);
* the fix-up (contiguous padding rows, split-K reduction: `_math_role`);
* store (`hopper_epilogue`).

What the roles share is set up once per CTA into the named tuples of `hopper_state`. The kernel
classes at the end bind each op's entry (`gemm_entries`) to this kernel; `HopperGemmTemplate` is
what the registry builds. Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from cutegen.templates.dtypes import cute_dtype
from cutegen.templates.gemm_contract import (
    GemmContract,
    scale_vector_tma_binding,
    shape_binding,
    tma_binding,
    with_group_mode,
)
from cutegen.templates.gemm_entries import (
    Fp8GemmNtEntry,
    Fp8GemmNtSplitKEntry,
    MGroupedContiguousEntry,
    MGroupedMaskedEntry,
)
from cutegen.templates.hopper_contiguous import ContiguousFamily
from cutegen.templates.hopper_epilogue import HopperEpilogue
from cutegen.templates.hopper_k_grouped import KGroupedFamily
from cutegen.templates.hopper_mainloop import HopperMainloop
from cutegen.templates.hopper_producer import A_TAIL_SLICE_ROWS, HopperProducer, StageLoads
from cutegen.templates.hopper_state import (
    ClusterPosition,
    GemmArgs,
    GroupMetadata,
    LoadPartitions,
    MathFragments,
    ScaleTensors,
    StageBytes,
    TileWalk,
)
from cutegen.templates.hopper_split_k import SPLIT_K_MAX_READ_BATCH, SPLIT_K_READ_REGISTERS, SplitKFamily
from cutegen.templates.tile_order import TileOrder
from cutegen.schedules.spec import (
    SCALE_BLOCK,
    THREADS_PER_WARPGROUP,
    DType,
    Raster,
    ScaleFormat,
    Schedule,
    scale_stage_elems,
    sfb_boundaries,
)


class HopperGemmKernel(
    HopperProducer, HopperMainloop, HopperEpilogue, SplitKFamily, KGroupedFamily, ContiguousFamily, TileOrder
):
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


    # ---- the kernel: shared set-up, then each thread's role ------------------------------------
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
        """What every thread sets up (pipelines, shared memory, partitions, the tile walk), then
        its role: the TMA producer warp (`_producer_role`) or a math warpgroup (`_math_role`).
        The parameters are what `_launch` passes, in its order; the roles read them as `GemmArgs`."""
        args = GemmArgs(
            tma_atom_a, mA_mk, tma_atom_b, mB_nk, tma_atom_sfa, mSFA_mk, sfb_ptr, tma_atom_sfb, mSFB_nk,
            tma_atom_c, mC_mn, m_indices_ptr, zero_padding, masked_m_ptr, group_sizes_ptr, workspace_ptr,
            split_counters_ptr, split_partials_ptr, k_splits, a_base_ptr, b_base_ptr, tail_split,
            tma_atom_a_tail, a_smem_layout_staged, a_tail_layout_staged, b_smem_layout_staged,
            sfa_smem_layout_staged, sfb_smem_layout_staged, epi_smem_layout_staged,
        )
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            self._prefetch_descriptors(args)

        tiled_mma = self._make_tiled_mma()
        cluster = self._cluster_position()
        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        stage = self._stage_bytes(args)
        mainloop_pipeline = self._mainloop_pipeline(storage, stage.tma_copy_bytes, cluster.cta_layout_mnk)
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sC = storage.sC.get_tensor(
            epi_smem_layout_staged.outer, swizzle=epi_smem_layout_staged.inner
        )
        scales = self._scale_tensors(args, storage)
        metadata = self._group_metadata(args)
        loads = self._load_partitions(args, storage, sA, sB, cluster)

        warp_group_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        fragments = self._math_fragments(tiled_mma, sA, sB, loads.gC_mn, tidx, warp_group_idx)
        walk = self._tile_walk(args, loads.gA_mk, loads.gC_mn, metadata, cluster.coord_mnk)

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        is_producer_wg = warp_group_idx == 0
        if is_producer_wg:
            cute.arch.setmaxregister_decrease(self.producer_regs)

        if warp_idx == self.load_warp_id:
            self._producer_role(args, walk, metadata, loads, scales, stage, cluster, mainloop_pipeline)

        if not is_producer_wg:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self._math_role(
                args, walk, metadata, scales, fragments, tiled_mma, mainloop_pipeline, storage, sC, loads.gC_mn,
                tidx, warp_idx, warp_group_idx,
            )

    # ---- set-up shared by the roles -------------------------------------------------------------
    @cute.jit
    def _prefetch_descriptors(self, args: "GemmArgs"):
        """Warp 0: bring every TMA descriptor the kernel uses into the descriptor cache."""
        cpasync.prefetch_descriptor(args.tma_atom_a)
        cpasync.prefetch_descriptor(args.tma_atom_b)
        cpasync.prefetch_descriptor(args.tma_atom_c)
        if cutlass.const_expr(self.a_tail_slices > 0):
            cpasync.prefetch_descriptor(args.tma_atom_a_tail)
        if cutlass.const_expr(self.block_scaled):
            cpasync.prefetch_descriptor(args.tma_atom_sfa)
        if cutlass.const_expr(self.sfb_per_row):
            cpasync.prefetch_descriptor(args.tma_atom_sfb)

    @cute.jit
    def _cluster_position(self) -> "ClusterPosition":
        """This CTA's place in its cluster and the multicast masks of its A and B loads."""
        cm, cn = self.cluster_shape_mn
        cta_layout_mnk = cute.make_layout((cm, cn, 1))
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord_mnk = cta_layout_mnk.get_flat_coord(cta_rank_in_cluster)
        a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=1)
        b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=0)
        a_mcast_mask = a_mcast_mask if self.is_a_mcast else 0
        b_mcast_mask = b_mcast_mask if self.is_b_mcast else 0
        return ClusterPosition(cta_layout_mnk, cta_rank_in_cluster, cluster_coord_mnk, a_mcast_mask, b_mcast_mask)

    def _stage_bytes(self, args: "GemmArgs") -> "StageBytes":
        """The bytes a stage's TMA loads bring: an A tile, one 16-row A slice, and all operands."""
        tm, tn, tk = self.tile_shape_mnk
        a_smem_layout = cute.slice_(args.a_smem_layout_staged, (None, None, 0))
        b_smem_layout = cute.slice_(args.b_smem_layout_staged, (None, None, 0))
        a_tile_bytes = cute.size_in_bytes(self.a_dtype, a_smem_layout)
        a_slice_bytes = A_TAIL_SLICE_ROWS * tk * self.a_dtype.width // 8
        tma_copy_bytes = a_tile_bytes + cute.size_in_bytes(self.b_dtype, b_smem_layout)
        if cutlass.const_expr(self.block_scaled):
            tma_copy_bytes += tm * 4
        if cutlass.const_expr(self.sfb_per_row):
            tma_copy_bytes += tn * 4
        return StageBytes(a_tile_bytes, a_slice_bytes, tma_copy_bytes)

    @cute.jit
    def _mainloop_pipeline(self, storage, tma_copy_bytes, cta_layout_mnk):
        """The stages' full and empty barriers: one producer arrive with the stage's transaction
        bytes; every math warp of every CTA that multicasts into this CTA's stage releases it."""
        mcast_size = self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
        consumer_arrive_cnt = mcast_size * self.num_mma_warpgroups * 4
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mainloop_barriers.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrive_cnt),
            tx_count=tma_copy_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )

    @cute.jit
    def _scale_tensors(self, args: "GemmArgs", storage) -> "ScaleTensors":
        """SFA's stage buffers and TMA partition; SFB as a [⌈N/128⌉, ⌈K/128⌉] row-major view (per
        group: [G, ⌈N/128⌉, ⌈K/128⌉]), or per row of B staged by TMA like SFA (weight gradients)."""
        tm, tn, _ = self.tile_shape_mnk
        sSFA = None
        tSFAsSFA = None
        tSFAgSFA = None
        mSFB = None
        if cutlass.const_expr(self.block_scaled):
            sSFA = storage.sSFA.get_tensor(args.sfa_smem_layout_staged)
            tSFAsSFA, tSFAgSFA = self._partition_scale_vector(args.tma_atom_sfa, sSFA, args.mSFA_mk, tm)
            k_blocks = args.mSFA_mk.shape[1]
            n_blocks = (args.mC_mn.shape[1] + SCALE_BLOCK - 1) // SCALE_BLOCK
            if cutlass.const_expr(self.m_grouped):
                # SFB [G, ⌈N/128⌉, ⌈K/128⌉] row-major, viewed as (n block, k block, group).
                mSFB = cute.make_tensor(
                    args.sfb_ptr,
                    cute.make_layout(
                        (n_blocks, k_blocks, args.mB_nk.shape[2]),
                        stride=(k_blocks, 1, n_blocks * k_blocks),
                    ),
                )
            elif cutlass.const_expr(not self.sfb_per_row):
                mSFB = cute.make_tensor(
                    args.sfb_ptr, cute.make_layout((n_blocks, k_blocks), stride=(k_blocks, 1))
                )
        sSFB = None
        tSFBsSFB = None
        tSFBgSFB = None
        if cutlass.const_expr(self.sfb_per_row):
            sSFB = storage.sSFB.get_tensor(args.sfb_smem_layout_staged)
            tSFBsSFB, tSFBgSFB = self._partition_scale_vector(args.tma_atom_sfb, sSFB, args.mSFB_nk, tn)
        return ScaleTensors(sSFA, tSFAsSFA, tSFAgSFA, mSFB, sSFB, tSFBsSFB, tSFBgSFB)

    @cute.jit
    def _group_metadata(self, args: "GemmArgs") -> "GroupMetadata":
        """The grouped layouts' device-side metadata as tensors: m_indices [M] (contiguous),
        masked_m [G] (masked), group sizes [G] (k-grouped); None where the op has none."""
        mIdx = None
        mMasked = None
        mSizes = None
        if cutlass.const_expr(self.k_grouped):
            mSizes = cute.make_tensor(args.group_sizes_ptr, cute.make_layout(args.mC_mn.shape[2]))
        if cutlass.const_expr(self.masked):
            mMasked = cute.make_tensor(args.masked_m_ptr, cute.make_layout(args.mB_nk.shape[2]))
        elif cutlass.const_expr(self.m_grouped):
            mIdx = cute.make_tensor(args.m_indices_ptr, cute.make_layout(args.mC_mn.shape[0]))
        return GroupMetadata(mIdx, mMasked, mSizes)

    @cute.jit
    def _load_partitions(self, args: "GemmArgs", storage, sA, sB, cluster: "ClusterPosition") -> "LoadPartitions":
        """The operands' tiles ((bM, bK, RestM, RestK), (bN, bK, RestN, RestK), (bM, bN, RestM,
        RestN), each with a group mode where the op has one) and the TMA partitions of A and B
        between global and shared memory: A's tail slices, and the peer's half of B for pairs of
        tiles from two groups, where the schedule has them."""
        tm, tn, tk = self.tile_shape_mnk
        cm, _ = self.cluster_shape_mn
        if cutlass.const_expr(self.masked):
            gA_mk = cute.local_tile(args.mA_mk, (tm, tk), (None, None, None))
        else:
            gA_mk = cute.local_tile(args.mA_mk, (tm, tk), (None, None))
        if cutlass.const_expr(self.m_grouped):
            gB_nk = cute.local_tile(args.mB_nk, (tn, tk), (None, None, None))
        else:
            gB_nk = cute.local_tile(args.mB_nk, (tn, tk), (None, None))
        if cutlass.const_expr(self.d_grouped):
            gC_mn = cute.local_tile(args.mC_mn, (tm, tn), (None, None, None))
        else:
            gC_mn = cute.local_tile(args.mC_mn, (tm, tn), (None, None))

        a_cta_layout = cute.make_layout(cute.slice_(cluster.cta_layout_mnk, (0, None, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(
            args.tma_atom_a,
            cluster.coord_mnk[1],
            a_cta_layout,
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA_mk, 0, 2),
        )
        tAsA_tail = None
        tAgA_tail = None
        if cutlass.const_expr(self.a_tail_slices > 0):
            # (16, bK, RestM16, RestK): the tail tile's slices, never multicast, into sA's bytes.
            sA_tail = storage.sA.get_tensor(args.a_tail_layout_staged.outer, swizzle=args.a_tail_layout_staged.inner)
            gA_tail = cute.local_tile(args.mA_mk, (A_TAIL_SLICE_ROWS, tk), (None, None))
            tAsA_tail, tAgA_tail = cpasync.tma_partition(
                args.tma_atom_a_tail,
                0,
                cute.make_layout(1),
                cute.group_modes(sA_tail, 0, 2),
                cute.group_modes(gA_tail, 0, 2),
            )
        b_cta_layout = cute.make_layout(cute.slice_(cluster.cta_layout_mnk, (None, 0, 0)).shape)
        tBsB, tBgB = cpasync.tma_partition(
            args.tma_atom_b,
            cluster.coord_mnk[0],
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
                args.tma_atom_b,
                cm - 1 - cluster.coord_mnk[0],
                b_cta_layout,
                cute.group_modes(sB, 0, 2),
                cute.group_modes(gB_nk, 0, 2),
            )
            b_own_mask = cutlass.Int16(1) << cutlass.Int16(cluster.cta_rank)
        return LoadPartitions(
            gA_mk, gC_mn, tAsA, tAgA, tAsA_tail, tAgA_tail, tBsB, tBgB, tBsB_other, tBgB_other, b_own_mask
        )

    @cute.jit
    def _math_fragments(self, tiled_mma, sA, sB, gC_mn, tidx, warp_group_idx) -> "MathFragments":
        """A math warpgroup's WGMMA operand fragments and accumulators. The block-scaled path
        promotes each K block's WGMMA result into `promoted`; the epilogue stores whichever tensor
        holds the final sum."""
        tm, tn, _ = self.tile_shape_mnk
        mma_wg_layout = cute.make_layout(self.num_mma_warpgroups, stride=THREADS_PER_WARPGROUP)
        thr_mma = tiled_mma.get_slice(mma_wg_layout(warp_group_idx - 1))
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        tCgC = thr_mma.partition_C(gC_mn)
        accumulators = cute.make_rmem_tensor(tCgC.shape[:3], self.acc_dtype)
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
        return MathFragments(tCrA, tCrB, accumulators, promoted, accs, tCcC)

    @cute.jit
    def _tile_walk(self, args: "GemmArgs", gA_mk, gC_mn, metadata: "GroupMetadata", cluster_coord_mnk) -> "TileWalk":
        """The persistent walk both roles take: how many work units there are (cluster tiles;
        masked: those of each group's rows; k-grouped: over the groups; split K: tiles times
        splits; tail split: `_tail_plan`'s cursor bound), this cluster's first and the stride."""
        cm, cn = self.cluster_shape_mn
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
            num_cluster_tiles = self._masked_total(metadata.mMasked, args.mA_mk.shape[0], ct_n)
        if cutlass.const_expr(self.k_grouped):
            num_cluster_tiles = self._k_grouped_total(metadata.mSizes, num_cluster_tiles, k_tile_cnt)
        if cutlass.const_expr(self.split_k):
            # Work units: (cluster tile, split), the splits of a tile adjacent.
            num_cluster_tiles = num_cluster_tiles * args.k_splits
        _, _, first_tile = cute.arch.block_idx()
        _, _, tile_stride = cute.arch.grid_dim()
        tail = None
        if cutlass.const_expr(self.tail_split):
            tail, num_cluster_tiles = self._tail_plan(
                num_cluster_tiles, tile_stride, first_tile, k_tile_cnt, args.tail_split
            )
            first_tile = self._first_unit(first_tile, tail)
        return TileWalk(first_tile, tile_stride, num_cluster_tiles, ct_m, ct_n, k_tile_cnt, cluster_coord_mnk, tail)

    @cute.jit
    def _locate(self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", t):
        """`_locate_tile` for unit t of `walk`: (group, tile m, tile n, first K block, K blocks)."""
        return self._locate_tile(
            t, walk.ct_m, walk.ct_n, metadata.mMasked, args.mA_mk.shape[0], metadata.mSizes, walk.k_tile_cnt,
            walk.cluster_coord_mnk, args.k_splits, walk.tail,
        )


    # ---- the TMA producer warp -------------------------------------------------------------------
    @cute.jit
    def _producer_role(
        self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", loads: "LoadPartitions",
        scales: "ScaleTensors", stage: "StageBytes", cluster: "ClusterPosition", mainloop_pipeline,
    ):
        """Walk the tiles; per tile, per K block: wait for a free stage and issue its TMA loads."""
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
                args.workspace_ptr, cluster.cta_rank
            )
            with cute.arch.elect_one():
                cpasync.copy_tensormap(args.tma_atom_a, desc_a)
                cpasync.copy_tensormap(args.tma_atom_b, desc_b)
            cute.arch.sync_warp()
            cute.arch.fence_acq_rel_cta()
        current_group = cutlass.Int32(-1)
        load_policies = None
        if cutlass.const_expr(self.hints_streamed_b):
            load_policies = self._load_policies(args.mA_mk.shape[0])
        t = walk.first_tile
        while t < walk.num_cluster_tiles:
            group, tile_m, tile_n, first_block, tile_k_tiles = self._locate(args, walk, metadata, t)
            if cutlass.const_expr(self.k_grouped):
                if group != current_group:
                    self._point_descriptors_at_group(
                        args.tma_atom_a, args.tma_atom_b, args.a_base_ptr, args.b_base_ptr, args.mC_mn.shape[0],
                        args.mC_mn.shape[1], first_block, tile_k_tiles, desc_a, desc_b,
                    )
                    current_group = group
            tAgA_k, tile_k_tiles, stage_loads = self._tile_loads(
                args, walk, metadata, loads, scales, cluster, t, group, tile_m, tile_n, first_block, tile_k_tiles,
                load_desc_b, load_policies,
            )
            producer_state.reset_count()
            producer_state = self._produce_tile(
                args, loads, stage, cluster, mainloop_pipeline, producer_state, tile_m, tile_k_tiles, tAgA_k,
                load_desc_a, stage_loads,
            )
            t = self._next_unit(t, tile_k_tiles, walk.tile_stride, walk.tail)
        mainloop_pipeline.producer_tail(producer_state)

    @cute.jit
    def _tile_loads(
        self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", loads: "LoadPartitions",
        scales: "ScaleTensors", cluster: "ClusterPosition", t, group, tile_m, tile_n, first_block, tile_k_tiles,
        load_desc_b, load_policies,
    ):
        """The tile's A partition, its K block count (contiguous: none for a pair of padding tiles)
        and what its stages load besides A (`StageLoads`)."""
        if cutlass.const_expr(self.masked):
            tAgA_k = loads.tAgA[(None, tile_m, None, group)]
            tBgB_k = loads.tBgB[(None, tile_n, None, group)]
        elif cutlass.const_expr(self.m_grouped):
            tAgA_k = loads.tAgA[(None, tile_m, None)]
            group, peer_group = self._contiguous_groups(args, walk, metadata, t)
            # A tile of padding rows only is not loaded (nor computed).
            tile_k_tiles = walk.k_tile_cnt if group >= 0 else cutlass.Int32(0)
            tBgB_k = loads.tBgB[(None, tile_n, None, cutlass.max(group, 0))]
            if cutlass.const_expr(self.b_shared_per_tile):
                share_b, tile_k_tiles = self._pair_of_tiles(group, peer_group, walk.k_tile_cnt)
                tBgB_other_k = loads.tBgB_other[(None, tile_n, None, cutlass.max(group, 0))]
        else:
            tAgA_k = loads.tAgA[(None, tile_m, None)]
            tBgB_k = loads.tBgB[(None, tile_n, None)]
        # A and B are addressed from the unit's first K block, like the scales, except in
        # the k-grouped op, whose descriptors already start at the group's.
        ab_first_block = cutlass.Int32(0) if self.k_grouped else first_block
        stage_loads = StageLoads(
            args.tma_atom_b, tBgB_k, loads.tBsB, cluster.b_mcast_mask, load_desc_b, args.tma_atom_sfa,
            scales.tSFAgSFA, scales.tSFAsSFA, args.tma_atom_sfb, scales.tSFBgSFB, scales.tSFBsSFB, ab_first_block,
            first_block, tile_m, tile_n, group,
        )
        if cutlass.const_expr(self.hints_streamed_b):
            b_policy, a_policy = load_policies
            stage_loads = stage_loads._replace(b_cache_policy=b_policy, a_cache_policy=a_policy)
        if cutlass.const_expr(self.b_shared_per_tile):
            stage_loads = stage_loads._replace(
                share_b=share_b, tBgB_other_k=tBgB_other_k, tBsB_other=loads.tBsB_other, own_mask=loads.b_own_mask
            )
        return tAgA_k, tile_k_tiles, stage_loads

    @cute.jit
    def _produce_tile(
        self, args: "GemmArgs", loads: "LoadPartitions", stage: "StageBytes", cluster: "ClusterPosition",
        mainloop_pipeline, producer_state, tile_m, tile_k_tiles, tAgA_k, load_desc_a, stage_loads: StageLoads,
    ):
        """The tile's K loop. The tile that holds row M - 1 when M ends inside it loads only its A
        slices that start before M, through the tail map (`_produce_tail_tile`); a tile past M
        (the idle CTA of a 2x1 cluster at M <= 64) loads no A. The pair of a 1x2 A-multicast
        cluster shares the tile, so both take the same path. Whole tiles load one box. Returns
        the advanced state."""
        tm = self.tile_shape_mnk[0]
        if cutlass.const_expr(self.a_tail_slices > 0):
            rows_in = args.mA_mk.shape[0] - tile_m * tm
            if rows_in < tm:
                slices_in = (cutlass.max(rows_in, 0) + A_TAIL_SLICE_ROWS - 1) // A_TAIL_SLICE_ROWS
                producer_state = self._produce_tail_tile(
                    mainloop_pipeline, producer_state, tile_k_tiles, slices_in,
                    stage.tma_copy_bytes - stage.a_tile_bytes + slices_in * stage.a_slice_bytes,
                    args.tma_atom_a_tail, loads.tAgA_tail, loads.tAsA_tail, stage_loads,
                )
            else:
                producer_state = self._produce_whole_tile(
                    mainloop_pipeline, producer_state, tile_k_tiles, args.tma_atom_a, tAgA_k, loads.tAsA,
                    cluster.a_mcast_mask, load_desc_a, stage_loads,
                )
        else:
            producer_state = self._produce_whole_tile(
                mainloop_pipeline, producer_state, tile_k_tiles, args.tma_atom_a, tAgA_k, loads.tAsA,
                cluster.a_mcast_mask, load_desc_a, stage_loads,
            )
        return producer_state

    # ---- the math warpgroups ---------------------------------------------------------------------
    @cute.jit
    def _math_role(
        self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", scales: "ScaleTensors",
        fragments: "MathFragments", tiled_mma, mainloop_pipeline, storage, sC, gC_mn, tidx, warp_idx, warp_group_idx,
    ):
        """Walk the tiles; per tile: the main loop (WGMMA, with promotion where block-scaled), the
        grouped layouts' padding rows, split K's fix-up, then the epilogue's stores."""
        read_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.ab_stage
        )
        release_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.ab_stage
        )
        num_k_blocks = cute.size(fragments.tCrA, mode=[2])
        epi = self._epilogue_partitions(tiled_mma, fragments.promoted, sC, tidx)
        sync = self._epilogue_sync(warp_group_idx)

        tiles_done = cutlass.Int32(0)
        contiguous = self.contiguous
        t = walk.first_tile
        while t < walk.num_cluster_tiles:
            group, tile_m, tile_n, first_block, tile_k_tiles = self._locate(args, walk, metadata, t)
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
                group, peer_group = self._contiguous_groups(args, walk, metadata, t, sync.warpgroup_row)
                row_groups = self._row_groups(fragments.promoted, fragments.tCcC, metadata.mIdx, args.mB_nk.shape[2], tile_m)
                tile_k_tiles = walk.k_tile_cnt if group >= 0 else cutlass.Int32(0)
                sfb_group = cutlass.max(group, 0)
                if cutlass.const_expr(self.b_shared_per_tile):
                    # This CTA's padding rows are zeroed, or not written, after the main loop.
                    _, tile_k_tiles = self._pair_of_tiles(group, peer_group, walk.k_tile_cnt)
            read_state, release_state = self._tile_mainloop(
                args, walk, metadata, scales, fragments, tiled_mma, mainloop_pipeline, read_state, release_state,
                num_k_blocks, first_block, tile_k_tiles, tile_m, tile_n, group, sfb_group, sync.warpgroup_row,
            )
            if cutlass.const_expr(contiguous):
                # Padding rows of D are written as zeros unless the caller opted out; with
                # the opt-out, tiles of padding rows only are not written at all.
                if args.zero_padding != 0:
                    self._zero_padding_rows(fragments.promoted, row_groups)
                write_tile = cutlass.Int32(1) if (group >= 0) | (args.zero_padding != 0) else cutlass.Int32(0)
            if cutlass.const_expr(self.split_k):
                write_tile = self._split_k_fixup(
                    fragments.promoted, t % args.k_splits, tile_m * (walk.ct_n * self.cluster_shape_mn[1]) + tile_n,
                    args.k_splits, args.split_counters_ptr, args.split_partials_ptr,
                    cute.recast_ptr(storage.sSFB.data_ptr(), dtype=cutlass.Int32),
                    sync.epilogue_barrier, tidx - THREADS_PER_WARPGROUP,
                )
            self._store_tile(args, epi, sync, sC, gC_tile, tiles_done, write_tile, warp_idx)
            tiles_done += 1
            t = self._next_unit(t, tile_k_tiles, walk.tile_stride, walk.tail)

        sync.store_pipeline.producer_tail()

    @cute.jit
    def _tile_mainloop(
        self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", scales: "ScaleTensors",
        fragments: "MathFragments", tiled_mma, mainloop_pipeline, read_state, release_state, num_k_blocks,
        first_block, tile_k_tiles, tile_m, tile_n, group, sfb_group, warpgroup_row,
    ):
        """The tile's main loop: plain WGMMA accumulation, or the block-scaled promotion over the
        tile's K blocks (dense: every K block of the split; k-grouped: the group's blocks;
        contiguous: none for padding tiles). Returns the advanced (read, release) states."""
        promoted = fragments.promoted  # a local: the run-time branch below fills it
        tile_sfb = scales.mSFB
        if cutlass.const_expr(self.split_k):
            # SFB columns from the split's first K block on (stride 1 along K).
            tile_sfb = cute.make_tensor(scales.mSFB.iterator + first_block, scales.mSFB.layout)
        if cutlass.const_expr(self.block_scaled):
            tile_args = (
                fragments.accs, promoted, fragments.tCrA, fragments.tCrB, fragments.tCcC, scales.sSFA,
                tile_sfb, mainloop_pipeline,
            )
            loop_args = (tile_k_tiles, num_k_blocks, tile_n, sfb_group, scales.sSFB, self.contiguous)
            if cutlass.const_expr(self.skips_padding_warpgroups):
                # A warpgroup of padding rows only leaves the tensor cores to the other
                # one; its rows of D are zeros (or, with the opt-out, unspecified). The
                # branch builds its own tiled MMA (a field set inside a dynamic branch
                # must not be read after it).
                if self._warpgroup_rows_real(metadata.mIdx, args.mB_nk.shape[2], tile_m, warpgroup_row, group):
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
                tiled_mma, fragments.accumulators, fragments.tCrA, fragments.tCrB, mainloop_pipeline, read_state,
                release_state, walk.k_tile_cnt, num_k_blocks,
            )
        return read_state, release_state


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
