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

What the roles share is set up once per CTA (`hopper_setup`) into the named tuples of
`hopper_state`; the host side (shared-memory layouts, TMA atoms, the launch, the parameters'
bindings) is `hopper_host`. The kernel classes at the end bind each op's entry (`gemm_entries`)
to this kernel; `HopperGemmTemplate` is what the registry builds. Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from cutegen.templates.dtypes import cute_dtype
from cutegen.templates.gemm_contract import GemmContract
from cutegen.templates.gemm_entries import (
    Fp8GemmNtEntry,
    Fp8GemmNtSplitKEntry,
    MGroupedContiguousEntry,
    MGroupedMaskedEntry,
    MGroupedMaskedSplitKEntry,
)
from cutegen.templates.hopper_contiguous import ContiguousFamily
from cutegen.templates.hopper_bias_activation import (
    Bf16GemmNtBiasEntry,
    Fp8GemmNtBiasEntry,
    HopperBiasActivationEpilogue,
)
from cutegen.templates.hopper_epilogue import HopperEpilogue
from cutegen.templates.hopper_host import HopperHost
from cutegen.templates.hopper_k_grouped import KGroupedFamily
from cutegen.templates.hopper_mainloop import HopperMainloop
from cutegen.templates.hopper_producer import A_TAIL_SLICE_ROWS, HopperProducer, StageLoads
from cutegen.templates.hopper_setup import HopperSetup
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
from cutegen.templates.hopper_swiglu import (
    Fp8GemmNtSwiGLUQuantEntry,
    HopperSwiGLUEpilogue,
    MGroupedContiguousSwiGLUQuantEntry,
    MGroupedMaskedSwiGLUQuantEntry,
)
from cutegen.templates.hopper_split_k import SPLIT_K_MAX_READ_BATCH, SPLIT_K_READ_REGISTERS, SplitKFamily
from cutegen.templates.tile_order import TileOrder
from cutegen.schedules.spec import SCALE_BLOCK, THREADS_PER_WARPGROUP, Op, Raster, Schedule, sfb_boundaries


class HopperGemmKernel(
    HopperHost, HopperSetup, HopperProducer, HopperMainloop, HopperEpilogue, HopperSwiGLUEpilogue,
    HopperBiasActivationEpilogue, SplitKFamily, KGroupedFamily, ContiguousFamily, TileOrder,
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

    Block-scaled path (`fp8_gemm_nt`, the grouped and weight-gradient ops): see `hopper_mainloop`.

    k-grouped weight gradient: see `hopper_k_grouped`; contiguous layout: see `hopper_contiguous`.

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
        """The kernel of `schedule`. Schedule facts (stages, epilogue, waves, accumulators, the op's
        family) are read from `self.schedule` where they are used; what is set here is this
        template's own: CuTe forms of the schedule's shapes and dtypes, and the design rules that
        choose between the template's code paths."""
        s = schedule
        self.schedule = s
        self.a_dtype = cute_dtype(s.a_dtype)
        self.b_dtype = cute_dtype(s.b_dtype)
        self.c_dtype = cute_dtype(s.c_dtype)
        self.acc_dtype = cute_dtype(s.acc_dtype)
        self.tile_shape_mnk = (s.tile_m, s.tile_n, s.tile_k)
        self.cluster_shape_mn = (s.cluster_m, s.cluster_n)
        self.atom_layout_mnk = (s.math_warpgroups, 1, 1)
        self.num_mma_threads = s.math_warpgroups * THREADS_PER_WARPGROUP
        self.threads_per_cta = s.threads_per_cta
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
        # row per box: with M < 64 every K block paid for up to 63 of them (up to 2.5x the time
        # of M = 64), while four small boxes instead of one cost 1.15-1.27x on whole tiles
        # (NOTES N30). Rows of skipped slices keep stale data; they only feed accumulator rows
        # past M, which are never stored. The tail tile's stages arrive with their own byte count
        # in one arrive-and-expect (a peer's multicast B may land before it; see
        # `_produce_tail_tile`). Only 64-row tiles: wider ones serve M of 128 and more, where one
        # partial tile matters little.
        dense = not (s.op.is_m_grouped or s.op.is_masked or s.op.is_k_grouped)
        # (Not for an MN-major A, whose swizzle atoms run 64 rows along M.)
        # (Nor with swapped operand roles, whose tile rows run along N.)
        a_tail = dense and s.tile_m == 64 and not s.layout.a_mn_major and not s.swaps_ab
        self.a_tail_slices = s.tile_m // A_TAIL_SLICE_ROWS if a_tail else 0
        # Dense GEMMs but the weight gradient (whose M is the wide side), and the masked layout
        # (from max_m, each group's B read by its own tile rows), choose their loads' L2 policies
        # at run time (STREAMED_B_MAX_TILE_ROWS). The contiguous layout measured no gain from them.
        # Not with swapped operand roles: the kernel's B is then the op's A, read by every tile row.
        self.hints_streamed_b = (dense or s.op.is_masked) and not s.op.scales_b_per_row and not s.swaps_ab
        # The masked and k-grouped layouts' D carries a group mode.
        self.d_grouped = s.op.is_masked or s.op.is_k_grouped
        # Split K: the splits whose partial tiles the fixup's last CTA loads before adding: 8 for
        # 64x16 tiles, 7 for 64x32, 3 for 64x64, 1 for 64x128 and 128x128.
        partial_regs = s.tile_m * s.tile_n // (THREADS_PER_WARPGROUP * s.math_warpgroups)
        self.split_k_read_batch = max(1, min(SPLIT_K_MAX_READ_BATCH, SPLIT_K_READ_REGISTERS // partial_regs))
        # A tile spans one or two 128-column blocks of SFB (see the scale_blocks_per_tile rule).
        self.single_sfb_block = SCALE_BLOCK % s.tile_n == 0
        # The column where a two-block tile's second SFB block begins takes few values (tile j
        # starts at j·tile_n): each gets its own copy of the main loop with the block of every
        # accumulator chunk fixed at compile time (see `_block_scaled_tile`).
        self.sfb_boundaries = sfb_boundaries(s.tile_n)
        # The contiguous layout locates its tiles with FastDivmod divisors made once per CTA
        # (`_make_raster_divisors`): 1.005-1.028x on DeepGEMM's six problems. Not the others:
        # making the divisors costs each CTA a 64-bit division before its first tile, and
        # fp8_gemm_nt at M = 64 and 128 (one short tile per CTA) ran 0.93-0.99x (NOTES N56).
        self.fast_raster = self.contiguous
        # Contiguous layout, one wave per warpgroup: a math warpgroup whose rows of the tile are
        # all padding issues no WGMMAs (it only walks the stages), so the tensor cores run the
        # other warpgroup's alone (`_warpgroup_rows_real`). The block-scaled path only: the
        # unscaled one (BF16) computes a tile's padding rows and zeroes them after.
        self.skips_padding_warpgroups = self.contiguous and s.waves == 1 and s.block_scaled
        self.group_size = s.group_size
        # A scheduled tile of the masked layout is a cluster tile: cluster_m CTA tiles of one group.
        self.masked_tile_rows = s.tile_m * s.cluster_m
        self.buffer_align_bytes = 1024
        self.load_warp_id = 0
        self.epi_store_warp_id = 4  # first warp of the first math warpgroup
        # Filled while tracing the host function.
        self.smem_bytes: int | None = None





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


    # ---- device side ------------------------------------------------------------------------




    @cute.jit
    def _locate_tile(
        self, t, ct_m, ct_n, mMasked, max_m, mSizes, k_tile_cnt, cluster_coord_mnk, k_splits=None, tail=None,
        last_wave=None,
    ):
        """Work unit t → (group, this CTA's tile m, tile n, the unit's first K block in the
        scales, its K block count); both roles walk the same sequence.

        The k-grouped layout has a group-dependent first block in the scales and K block count
        (A and B come through per-group descriptors, from block 0). With split K, t is (cluster
        tile t // k_splits, split t % k_splits) and the split's blocks are
        [split · ⌈KB/k_splits⌉, …) in 128-wide K blocks (two K tiles each at tile_k 64; the
        runtime passes a count that leaves no split empty). With
        a tail split, `tail` is `_tail_plan`'s: t below its first tail tile is a whole tile; from
        there on t - tail_start is a position in the tail's K blocks (tile after tile), and the
        piece runs to the end of that tile or of this cluster's share, whichever comes first. With
        split K for the last wave only, `last_wave` is `_last_wave_plan`'s."""
        cm, cn = self.cluster_shape_mn
        group = cutlass.Int32(0)
        first_block = cutlass.Int32(0)
        k_blocks = k_tile_cnt
        if cutlass.const_expr(self.schedule.op.is_masked and self.schedule.splits_k_last_wave):
            tile_t, first_block, k_blocks = self._last_wave_blocks(t, last_wave, k_tile_cnt)
            group, ctm, ctn = self._masked_locate(tile_t, mMasked, max_m, ct_n)
        elif cutlass.const_expr(self.schedule.op.is_masked):
            group, ctm, ctn = self._masked_locate(t, mMasked, max_m, ct_n)
        elif cutlass.const_expr(self.schedule.op.is_k_grouped):
            if cutlass.const_expr(self._k_tiles_per_block() == 1):
                group, local, first_block, k_blocks = self._k_grouped_locate(t, mSizes, ct_m * ct_n, k_tile_cnt)
            else:  # the group's 128-token blocks, as K tiles
                group, local, first_block, k_blocks = self._k_grouped_locate(
                    t, mSizes, ct_m * ct_n, k_tile_cnt // self._k_tiles_per_block()
                )
                k_blocks = k_blocks * self._k_tiles_per_block()
            ctm, ctn = self._cluster_tile_coord(local, ct_m, ct_n)
        elif cutlass.const_expr(self.schedule.splits_k_last_wave):
            tile_t, first_block, k_blocks = self._last_wave_blocks(t, last_wave, k_tile_cnt)
            ctm, ctn = self._cluster_tile_coord(tile_t, ct_m, ct_n)
        elif cutlass.const_expr(self.schedule.splits_k):
            tile_t = t // k_splits
            if cutlass.const_expr(self._k_tiles_per_block() == 1):
                per_split = (k_tile_cnt + k_splits - 1) // k_splits
                first_block = (t - tile_t * k_splits) * per_split
                k_blocks = cutlass.min(per_split, k_tile_cnt - first_block)
            else:  # splits of whole 128-wide K blocks, as the runtime counts them, in K tiles
                per_block = self._k_tiles_per_block()
                blocks = (k_tile_cnt + per_block - 1) // per_block
                per_split = (blocks + k_splits - 1) // k_splits
                first_block = (t - tile_t * k_splits) * per_split * per_block
                k_blocks = cutlass.min(per_split * per_block, k_tile_cnt - first_block)
            ctm, ctn = self._cluster_tile_coord(tile_t, ct_m, ct_n)
        elif cutlass.const_expr(self.schedule.splits_tail):
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
        d_sf,
        eps,
        bias,
    ):
        """What every thread sets up (pipelines, shared memory, partitions, the tile walk), then
        its role: the TMA producer warp (`_producer_role`) or a math warpgroup (`_math_role`).
        The parameters are what `_launch` passes, in its order; the roles read them as `GemmArgs`."""
        mD = mC_mn
        if cutlass.const_expr(self.schedule.stages_quantized_rows):
            # The roles walk the GEMM's tiles; the activation epilogue writes mD.
            mC_mn = self._tile_space(mD)
        args = GemmArgs(
            tma_atom_a, mA_mk, tma_atom_b, mB_nk, tma_atom_sfa, mSFA_mk, sfb_ptr, tma_atom_sfb, mSFB_nk,
            tma_atom_c, mC_mn, m_indices_ptr, zero_padding, masked_m_ptr, group_sizes_ptr, workspace_ptr,
            split_counters_ptr, split_partials_ptr, k_splits, a_base_ptr, b_base_ptr, tail_split,
            tma_atom_a_tail, a_smem_layout_staged, a_tail_layout_staged, b_smem_layout_staged,
            sfa_smem_layout_staged, sfb_smem_layout_staged, epi_smem_layout_staged, d_sf, eps, bias,
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
            cute.arch.setmaxregister_decrease(self.schedule.producer_regs)

        if warp_idx == self.load_warp_id:
            self._producer_role(args, walk, metadata, loads, scales, stage, cluster, mainloop_pipeline)

        if not is_producer_wg:
            cute.arch.setmaxregister_increase(self.schedule.consumer_regs)
            self._math_role(
                args, walk, metadata, scales, fragments, tiled_mma, mainloop_pipeline, storage, sC, loads.gC_mn,
                tidx, warp_idx, warp_group_idx, mD,
            )










    @cute.jit
    def _locate(self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", t):
        """`_locate_tile` for unit t of `walk`: (group, tile m, tile n, first K block, K blocks)."""
        return self._locate_tile(
            t, walk.ct_m, walk.ct_n, metadata.mMasked, args.mA_mk.shape[0], metadata.mSizes, walk.k_tile_cnt,
            walk.cluster_coord_mnk, args.k_splits, walk.tail, walk.last_wave,
        )


    # ---- the TMA producer warp -------------------------------------------------------------------
    @cute.jit
    def _producer_role(
        self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", loads: "LoadPartitions",
        scales: "ScaleTensors", stage: "StageBytes", cluster: "ClusterPosition", mainloop_pipeline,
    ):
        """Walk the tiles; per tile, per K block: wait for a free stage and issue its TMA loads."""
        producer_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.schedule.stages
        )
        desc_a = None
        desc_b = None
        load_desc_a = None
        load_desc_b = None
        if cutlass.const_expr(self.schedule.op.is_k_grouped):
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
            if cutlass.const_expr(self.schedule.op.is_k_grouped):
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
        if cutlass.const_expr(self.schedule.op.is_masked):
            tAgA_k = loads.tAgA[(None, tile_m, None, group)]
            tBgB_k = loads.tBgB[(None, tile_n, None, group)]
        elif cutlass.const_expr(self.schedule.op.is_m_grouped):
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
        ab_first_block = cutlass.Int32(0) if self.schedule.op.is_k_grouped else first_block
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
        mD,
    ):
        """Walk the tiles; per tile: the main loop (WGMMA, with promotion where block-scaled), the
        grouped layouts' padding rows, split K's fix-up, then the epilogue: a fused bias and
        activation applied to the sum in registers before the plain stores, or SwiGLU's quantized
        rows staged in shared memory and bulk-copied to D."""
        read_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.schedule.stages
        )
        release_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.schedule.stages
        )
        num_k_blocks = cute.size(fragments.tCrA, mode=[2])
        fused = self.schedule.stages_quantized_rows
        epi = None if fused else self._epilogue_partitions(tiled_mma, fragments.promoted, sC, tidx)
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
                row_groups = self._row_groups(
                    fragments.promoted, fragments.tCcC, metadata.mIdx, args.mB_nk.shape[2], tile_m
                )
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
            if cutlass.const_expr(self.schedule.splits_k_last_wave):
                # Split units only, each split tile's CTAs in their own counters and slots.
                _, index, split, split_unit = self._last_wave_unit(t, walk.last_wave)
                if split_unit:
                    cm, cn = self.cluster_shape_mn
                    write_tile = self._split_k_fixup(
                        fragments.promoted, split,
                        index * (cm * cn) + walk.cluster_coord_mnk[0] * cn + walk.cluster_coord_mnk[1],
                        walk.last_wave[1], args.split_counters_ptr, args.split_partials_ptr,
                        cute.recast_ptr(storage.sSFB.data_ptr(), dtype=cutlass.Int32),
                        sync.epilogue_barrier, tidx - THREADS_PER_WARPGROUP,
                    )
            elif cutlass.const_expr(self.schedule.splits_k):
                write_tile = self._split_k_fixup(
                    fragments.promoted, t % args.k_splits, tile_m * (walk.ct_n * self.cluster_shape_mn[1]) + tile_n,
                    args.k_splits, args.split_counters_ptr, args.split_partials_ptr,
                    cute.recast_ptr(storage.sSFB.data_ptr(), dtype=cutlass.Int32),
                    sync.epilogue_barrier, tidx - THREADS_PER_WARPGROUP,
                )
            if cutlass.const_expr(self.schedule.transforms_sum):
                self._bias_and_activation(fragments.promoted, fragments.tCcC, args.bias, tile_n)
            if cutlass.const_expr(fused):
                self._store_swiglu_tile(
                    fragments.promoted, fragments.tCcC, mD, args.d_sf, sC, sync.epilogue_barrier, tidx,
                    tile_m, tile_n, group, write_tile, args.eps,
                )
            else:
                self._store_tile(args, epi, sync, sC, gC_tile, tiles_done, write_tile, warp_idx)
            tiles_done += 1
            t = self._next_unit(t, tile_k_tiles, walk.tile_stride, walk.tail)

        sync.store_pipeline.producer_tail()
        if cutlass.const_expr(fused):
            self._quantized_rows_copied(tidx)

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
        if cutlass.const_expr(self.schedule.splits_k and self.schedule.block_scaled):
            # SFB columns from the split's first K block on (stride 1 along K).
            tile_sfb = cute.make_tensor(scales.mSFB.iterator + first_block, scales.mSFB.layout)
        if cutlass.const_expr(self.schedule.block_scaled):
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
        elif cutlass.const_expr(self.contiguous or self.schedule.op.is_k_grouped or self.schedule.splits_k):
            # A tile (or, in a 2x1 cluster, a pair) of padding rows only is neither loaded nor
            # computed: its accumulators are zeros; a k-grouped tile runs over its group's K tiles,
            # a split over its share (an empty split, none with the runtime's counts, adds zeros).
            # The branch builds its own tiled MMA (a field set inside a dynamic branch must not be
            # read after it).
            if tile_k_tiles > 0:
                read_state, release_state = self._mainloop(
                    self._make_tiled_mma(), fragments.accumulators, fragments.tCrA, fragments.tCrB,
                    mainloop_pipeline, read_state, release_state, tile_k_tiles, num_k_blocks,
                )
            else:
                fragments.accumulators.fill(0.0)
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


class HopperSplitKBf16GemmKernel(HopperGemmKernel):
    """`bf16_gemm_nt` on sm_90a with the K blocks of each tile split over `k_splits` CTAs, their fp32
    partial sums reduced as `Fp8GemmNtSplitKEntry` describes."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        split_counters: cute.Pointer,
        split_partials: cute.Pointer,
        k_splits: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, None, None, max_active_clusters, stream,
            split_counters=split_counters, split_partials=split_partials, k_splits=k_splits,
        )


class HopperMGroupedFp8GemmKernel(MGroupedContiguousEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_contiguous` on sm_90a."""


class HopperMaskedFp8GemmKernel(MGroupedMaskedEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_masked` on sm_90a."""


class HopperMGroupedBf16GemmKernel(HopperGemmKernel):
    """`m_grouped_bf16_gemm_nt_contiguous`: per row r of A, D[r] = A[r] · B[g]ᵀ with
    g = m_indices[r]; rows with g = -1 are padding."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        m_indices: cute.Pointer,
        zero_padding: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, None, None, max_active_clusters, stream, m_indices, zero_padding)


class HopperMaskedSplitKFp8GemmKernel(MGroupedMaskedSplitKEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_masked` on sm_90a with the last wave's tiles split along K."""


class HopperMaskedBf16GemmKernel(HopperGemmKernel):
    """`m_grouped_bf16_gemm_nt_masked`: for every group g and row r < masked_m[g],
    D[g, r] = A[g, r] · B[g]ᵀ."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        masked_m: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, None, None, max_active_clusters, stream, masked_m=masked_m)


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


class HopperKGroupedBf16GemmKernel(HopperGemmKernel):
    """`k_grouped_bf16_gemm_tn_contiguous`: for every group g with k_g > 0 tokens,
    D[g] (fp32) += A_gᵀ · B_g over the group's rows of A [Σk, M] and B [Σk, N] (tokens first,
    taken as the MN-major [M, Σk] and [N, Σk] views)."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        group_sizes: cute.Pointer,
        workspace: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, None, None, max_active_clusters, stream, group_sizes=group_sizes, workspace=workspace
        )


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


class HopperFp8GemmSwiGLUQuantKernel(Fp8GemmNtSwiGLUQuantEntry, HopperGemmKernel):
    """`fp8_gemm_nt_swiglu_quant` on sm_90a."""


class HopperMGroupedFp8GemmSwiGLUQuantKernel(MGroupedContiguousSwiGLUQuantEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_contiguous_swiglu_quant` on sm_90a."""


class HopperMaskedFp8GemmSwiGLUQuantKernel(MGroupedMaskedSwiGLUQuantEntry, HopperGemmKernel):
    """`m_grouped_fp8_gemm_nt_masked_swiglu_quant` on sm_90a."""


class HopperFp8GemmBiasKernel(Fp8GemmNtBiasEntry, HopperGemmKernel):
    """`fp8_gemm_nt_bias`, with SiLU or GELU after it (`fp8_gemm_nt_bias_silu`, `_bias_gelu`), on sm_90a."""


class HopperBf16GemmBiasKernel(Bf16GemmNtBiasEntry, HopperGemmKernel):
    """`bf16_gemm_nt_bias`, with SiLU or GELU after it (`bf16_gemm_nt_bias_silu`, `_bias_gelu`), on sm_90a."""


# The kernel class of each op whose epilogue applies SwiGLU and quantizes.
SWIGLU_QUANT_KERNELS = {
    Op.FP8_GEMM_NT: HopperFp8GemmSwiGLUQuantKernel,
    Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS: HopperMGroupedFp8GemmSwiGLUQuantKernel,
    Op.M_GROUPED_FP8_GEMM_NT_MASKED: HopperMaskedFp8GemmSwiGLUQuantKernel,
}


class HopperGemmTemplate(GemmContract):
    """The generator's view of the Hopper GEMM template: the kernel class of the schedule's op."""

    def __init__(self, schedule: Schedule):
        super().__init__(schedule)
        if schedule.stages_quantized_rows:
            self.kernel = SWIGLU_QUANT_KERNELS[schedule.op](schedule)
        elif schedule.adds_bias:
            self.kernel = (HopperFp8GemmBiasKernel if schedule.block_scaled else HopperBf16GemmBiasKernel)(schedule)
        elif schedule.op.is_k_grouped:
            k_grouped = HopperKGroupedFp8GemmKernel if schedule.block_scaled else HopperKGroupedBf16GemmKernel
            self.kernel = k_grouped(schedule)
        elif schedule.op.scales_b_per_row:
            self.kernel = HopperFp8WgradKernel(schedule)
        elif schedule.op.is_masked and schedule.splits_k:
            self.kernel = HopperMaskedSplitKFp8GemmKernel(schedule)
        elif schedule.op.is_masked:
            masked = HopperMaskedFp8GemmKernel if schedule.block_scaled else HopperMaskedBf16GemmKernel
            self.kernel = masked(schedule)
        elif schedule.op.is_m_grouped:
            contiguous = HopperMGroupedFp8GemmKernel if schedule.block_scaled else HopperMGroupedBf16GemmKernel
            self.kernel = contiguous(schedule)
        elif schedule.splits_k:
            split_k = HopperSplitKFp8GemmKernel if schedule.block_scaled else HopperSplitKBf16GemmKernel
            self.kernel = split_k(schedule)
        elif schedule.block_scaled:
            self.kernel = HopperFp8GemmKernel(schedule)
        else:
            self.kernel = HopperGemmKernel(schedule)
