"""The Hopper GEMM kernel's set-up: what every thread prepares once per CTA for both roles (the
named tuples of `hopper_state`).

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

from cutegen.schedules.spec import SCALE_BLOCK, THREADS_PER_WARPGROUP
from cutegen.templates.hopper_producer import A_TAIL_SLICE_ROWS
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


class HopperSetup:
    """Descriptors, the cluster position, the mainloop pipeline, scales, metadata, partitions,
    fragments and the tile walk."""

    @cute.jit
    def _prefetch_descriptors(self, args: "GemmArgs"):
        """Warp 0: bring every TMA descriptor the kernel uses into the descriptor cache."""
        cpasync.prefetch_descriptor(args.tma_atom_a)
        cpasync.prefetch_descriptor(args.tma_atom_b)
        if cutlass.const_expr(not self.schedule.stages_quantized_rows):
            cpasync.prefetch_descriptor(args.tma_atom_c)
        if cutlass.const_expr(self.a_tail_slices > 0):
            cpasync.prefetch_descriptor(args.tma_atom_a_tail)
        if cutlass.const_expr(self.schedule.block_scaled):
            cpasync.prefetch_descriptor(args.tma_atom_sfa)
        if cutlass.const_expr(self.schedule.op.scales_b_per_row):
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
        if cutlass.const_expr(self.schedule.block_scaled):
            tma_copy_bytes += tm * 4
        if cutlass.const_expr(self.schedule.op.scales_b_per_row):
            tma_copy_bytes += tn * 4
        return StageBytes(a_tile_bytes, a_slice_bytes, tma_copy_bytes)

    @cute.jit
    def _mainloop_pipeline(self, storage, tma_copy_bytes, cta_layout_mnk):
        """The stages' full and empty barriers: one producer arrive with the stage's transaction
        bytes; every math warp of every CTA that multicasts into this CTA's stage releases it."""
        mcast_size = self.schedule.cluster_n + self.schedule.cluster_m - 1
        consumer_arrive_cnt = mcast_size * self.schedule.math_warpgroups * 4
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mainloop_barriers.data_ptr(),
            num_stages=self.schedule.stages,
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
        if cutlass.const_expr(self.schedule.block_scaled):
            sSFA = storage.sSFA.get_tensor(args.sfa_smem_layout_staged)
            tSFAsSFA, tSFAgSFA = self._partition_scale_vector(args.tma_atom_sfa, sSFA, args.mSFA_mk, tm)
            k_blocks = args.mSFA_mk.shape[1]
            n_blocks = (args.mC_mn.shape[1] + SCALE_BLOCK - 1) // SCALE_BLOCK
            if cutlass.const_expr(self.schedule.op.is_m_grouped):
                # SFB [G, ⌈N/128⌉, ⌈K/128⌉] row-major, viewed as (n block, k block, group).
                mSFB = cute.make_tensor(
                    args.sfb_ptr,
                    cute.make_layout(
                        (n_blocks, k_blocks, args.mB_nk.shape[2]),
                        stride=(k_blocks, 1, n_blocks * k_blocks),
                    ),
                )
            elif cutlass.const_expr(not self.schedule.op.scales_b_per_row):
                mSFB = cute.make_tensor(
                    args.sfb_ptr, cute.make_layout((n_blocks, k_blocks), stride=(k_blocks, 1))
                )
        sSFB = None
        tSFBsSFB = None
        tSFBgSFB = None
        if cutlass.const_expr(self.schedule.op.scales_b_per_row):
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
        if cutlass.const_expr(self.schedule.op.is_k_grouped):
            mSizes = cute.make_tensor(args.group_sizes_ptr, cute.make_layout(args.mC_mn.shape[2]))
        if cutlass.const_expr(self.schedule.op.is_masked):
            mMasked = cute.make_tensor(args.masked_m_ptr, cute.make_layout(args.mB_nk.shape[2]))
        elif cutlass.const_expr(self.schedule.op.is_m_grouped):
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
        if cutlass.const_expr(self.schedule.op.is_masked):
            gA_mk = cute.local_tile(args.mA_mk, (tm, tk), (None, None, None))
        else:
            gA_mk = cute.local_tile(args.mA_mk, (tm, tk), (None, None))
        if cutlass.const_expr(self.schedule.op.is_m_grouped):
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
        mma_wg_layout = cute.make_layout(self.schedule.math_warpgroups, stride=THREADS_PER_WARPGROUP)
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
        if cutlass.const_expr(self.schedule.block_scaled):
            # The ring of WGMMA accumulators of one wave (64 rows per warpgroup); `promoted`
            # holds the tile's sum.
            accs = tuple(
                cute.make_rmem_tensor((tCgC.shape[0], 1, 1), self.acc_dtype)
                for _ in range(self.schedule.wgmma_accumulators)
            )
            promoted = cute.make_rmem_tensor(tCgC.shape[:3], self.acc_dtype)
        if cutlass.const_expr(self.schedule.block_scaled or self.contiguous or self.schedule.transforms_sum):
            # Tile-local (row, column) of every accumulator element of *this thread* (thr_mma is
            # the warpgroup's slice, which the WGMMA needs; coordinates need the thread's): the
            # columns' scales and bias, the rows' groups (contiguous layout).
            thr_mma_own = tiled_mma.get_slice(tidx - THREADS_PER_WARPGROUP)
            tCcC = thr_mma_own.partition_C(cute.make_identity_tensor((tm, tn)))
        return MathFragments(tCrA, tCrB, accumulators, promoted, accs, tCcC)

    @cute.jit
    def _tile_walk(self, args: "GemmArgs", gA_mk, gC_mn, metadata: "GroupMetadata", cluster_coord_mnk) -> "TileWalk":
        """The persistent walk both roles take: how many work units there are (cluster tiles;
        masked: those of each group's rows; k-grouped: over the groups; split K: tiles times
        splits, or for the last wave only `_last_wave_plan`'s count; tail split: `_tail_plan`'s
        cursor bound), this cluster's first and the stride."""
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
        if cutlass.const_expr(self.schedule.op.is_masked):
            num_cluster_tiles = self._masked_total(metadata.mMasked, args.mA_mk.shape[0], ct_n)
        if cutlass.const_expr(self.schedule.op.is_k_grouped):
            s_blocks = k_tile_cnt if cutlass.const_expr(self._k_tiles_per_block() == 1) else k_tile_cnt // self._k_tiles_per_block()
            num_cluster_tiles = self._k_grouped_total(metadata.mSizes, num_cluster_tiles, s_blocks)
        if cutlass.const_expr(self.schedule.splits_k and not self.schedule.splits_k_last_wave):
            # Work units: (cluster tile, split), the splits of a tile adjacent.
            num_cluster_tiles = num_cluster_tiles * args.k_splits
        _, _, first_tile = cute.arch.block_idx()
        _, _, tile_stride = cute.arch.grid_dim()
        last_wave = None
        if cutlass.const_expr(self.schedule.splits_k_last_wave):
            # Work units: the whole waves' tiles, then (last-wave tile, split) pairs.
            last_wave, num_cluster_tiles = self._last_wave_plan(num_cluster_tiles, tile_stride, args.k_splits)
        tail = None
        if cutlass.const_expr(self.schedule.splits_tail):
            tail, num_cluster_tiles = self._tail_plan(
                num_cluster_tiles, tile_stride, first_tile, k_tile_cnt, args.tail_split
            )
            first_tile = self._first_unit(first_tile, tail)
        return TileWalk(
            first_tile, tile_stride, num_cluster_tiles, ct_m, ct_n, k_tile_cnt, cluster_coord_mnk, tail, last_wave
        )
