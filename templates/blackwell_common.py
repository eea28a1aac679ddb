"""What the sm_100a GEMM templates share: warp roles and barrier ids, the operand and accumulator
pipelines with the tensor-memory allocator, and the epilogue's copies out of tensor memory.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.memory import TmemAllocator
from cutlass.tensor_utils import LayoutEnum

# Named barrier 0 is __syncthreads; 1: the epilogue warpgroup around each epilogue sub-tile; 2: the
# TMEM allocation handshake (allocating warp → MMA warp and epilogue warps).
EPILOGUE_BARRIER_ID = 1
TMEM_ALLOC_BARRIER_ID = 2
THREADS_PER_WARP = 32
# Warp roles: warps 0-3 are the epilogue warpgroup (warp w reads TMEM lanes 32w..32w+31, i.e. rows
# of the CTA's accumulator; with promotion it also updates the accumulator); warpgroup 1 holds the
# load (TMA) warp and the MMA warp; in a CTA pair the block-scaled template's warp 6 tells the
# leader that this CTA's scale atoms have landed (warp 7 idles).
EPILOGUE_WARPS = 4
LOAD_WARP = 4
MMA_WARP = 5
SCALE_RELAY_WARP = 6


class BlackwellRoles:
    """Set-up steps both sm_100a templates take, in the same order."""

    @cute.jit
    def _pipelines(self, storage, stages, tma_bytes, acc_stages, acc_consumers, cluster_layout_vmnk,
                   two_cta=False, dealloc_barrier=None):
        """(operands, accumulators, tensor-memory allocator): `stages` slots of TMA loads of
        `tma_bytes` consumed by the MMA warp's commits; `acc_stages` accumulator stages released by
        `acc_consumers` warps; the allocator of warp 0 (a CTA pair frees through `dealloc_barrier`)."""
        operands = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.operand_barriers.data_ptr(),
            num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=tma_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        accumulators = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.accumulator_barriers.data_ptr(),
            num_stages=acc_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, acc_consumers),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = TmemAllocator(
            storage.tmem_address.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=TMEM_ALLOC_BARRIER_ID, num_threads=THREADS_PER_WARP * (1 + EPILOGUE_WARPS)
            ),
            allocator_warp_id=0,
            is_two_cta=two_cta,
            two_cta_tmem_dealloc_mbar_ptr=dealloc_barrier,
        )
        return operands, accumulators, tmem

    @cute.jit
    def _cluster_coordinates(self, cluster_layout_vmnk):
        """(this CTA's V coordinate in its MMA, whether it leads the MMA, its (V, M, N, K)
        coordinate in the cluster): in a CTA pair the leader (V 0) issues the pair's MMAs."""
        bidx, _, _ = cute.arch.block_idx()
        mma_coord_v = bidx % self.mma_ctas
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        return mma_coord_v, mma_coord_v == 0, cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)

    @cute.jit
    def _cluster_tma_partitions(self, tma_atom_a, tma_atom_b, sA, sB, tCgA, tCgB, cluster_layout_vmnk,
                                cluster_coord_vmnk):
        """(tAsA, tAgA, tBsB, tBgB): this CTA's share of the cluster's A and B loads (a pair's
        CTA: its own rows of A, half of the tile's rows of B)."""
        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, cluster_coord_vmnk[2], a_cta_layout, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3)
        )
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, cluster_coord_vmnk[1], b_cta_layout, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3)
        )
        return tAsA, tAgA, tBsB, tBgB

    @cute.jit
    def _pair_multicast_masks(self, cluster_layout_vmnk, cluster_coord_vmnk):
        """(A's, B's) TMA multicast masks of a CTA pair's loads; (None, None) for one CTA."""
        a_mask = None
        b_mask = None
        if cutlass.const_expr(self.mma_ctas == 2):
            a_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, cluster_coord_vmnk, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, cluster_coord_vmnk, mcast_mode=1)
        return a_mask, b_mask

    @cute.jit
    def _tmem_loads(self, tCtAcc, tidx, two_cta=False):
        """TMEM → registers per epilogue sub-tile: (the tiled copy, this thread's slice of it, the
        accumulator stages partitioned as (T2R, T2R_M, T2R_N, EPI_M, EPI_N, STAGE), the sub-tiles)."""
        t2r_atom = sm100_utils.get_tmem_load_op(
            self.tile_shape_mnk, LayoutEnum.ROW_MAJOR, self.c_dtype, self.acc_dtype, self.schedule.epi_tile, two_cta
        )
        tAcc_epi = cute.flat_divide(tCtAcc[((None, None), 0, 0, None)], self.schedule.epi_tile)
        tiled_t2r = tcgen05.make_tmem_copy(t2r_atom, tAcc_epi[(None, None, 0, 0, 0)])
        thr_t2r = tiled_t2r.get_slice(tidx)
        return tiled_t2r, thr_t2r, thr_t2r.partition_S(tAcc_epi)

    @cute.jit
    def _smem_stores(self, tiled_t2r, sC, chunk, tidx):
        """Registers → swizzled smem (the store matching the TMEM load's layout): (the tiled copy,
        this thread's destinations in the sub-tile ring, a D-typed chunk and its source view)."""
        r2s_atom = sm100_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, self.c_dtype, self.acc_dtype, tiled_t2r)
        tiled_r2s = cute.make_tiled_copy_D(r2s_atom, tiled_t2r)
        tRS_sC = tiled_r2s.get_slice(tidx).partition_D(sC)
        out_chunk = cute.make_rmem_tensor(chunk.shape, self.c_dtype)
        return tiled_r2s, tRS_sC, out_chunk, tiled_r2s.retile(out_chunk)
