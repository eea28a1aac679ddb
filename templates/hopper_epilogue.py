"""The Hopper GEMM's epilogue: accumulators to D's type, stmatrix into swizzled sub-tile buffers, TMA stores.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync

from cutegen.schedules.spec import THREADS_PER_WARPGROUP
from cutegen.templates.hopper_state import GemmArgs

# Named barrier 0 is __syncthreads; 1 is the math warpgroups' epilogue barrier.
EPILOGUE_BARRIER_ID = 1


class EpiloguePartitions(NamedTuple):
    """The epilogue's register → shared memory copy and its register buffers."""

    tiled_copy_r2s: Any
    tRS_sD: Any
    tRS_rAcc: Any
    tRS_rD: Any
    tRS_rD_out: Any
    size_tRS_rD: Any


class EpilogueSync(NamedTuple):
    """The epilogue's barriers, storing warp and store pipeline (`_epilogue_sync`)."""

    epilogue_barrier: Any
    wg_offset: Any
    warpgroup_row: Any
    staged_barrier: Any
    staged_store_warp: Any
    store_pipeline: Any


class HopperEpilogue:
    """The epilogue stage of the math role: partitions, barriers and the stores of one tile."""

    def _staged_subtiles(self, epi_tile_num, epi_tile_layout, wg_offset):
        """(fragment chunk, buffer, tile coordinate) of each epilogue sub-tile this thread
        writes when the whole tile is staged: every sub-tile of the tile, or with per-warpgroup
        stores only its warpgroup's, in the order of its accumulator fragment (wave w, column
        block c: row block w · math_warpgroups + warpgroup)."""
        if not self.schedule.epilogue.per_warpgroup:
            return [(i, i, epi_tile_layout.get_hier_coord(i)) for i in range(epi_tile_num)]
        cols = self.tile_shape_mnk[1] // self.schedule.epi_tile[1]
        subtiles = []
        for i in range(self.schedule.waves * cols):
            row_block = (i // cols) * self.schedule.math_warpgroups + wg_offset
            subtiles.append((i, row_block * cols + i % cols, (row_block, i % cols)))
        return subtiles

    @cute.jit
    def _convert_subtile(self, tRS_rAcc, tRS_rD, tRS_rD_out, size_tRS_rD, epi_idx):
        """Epilogue sub-tile `epi_idx` of the tile's fp32 sum, converted to the output type into
        `tRS_rD_out` (registers), ready for the stmatrix into its shared-memory buffer."""
        for v in cutlass.range_constexpr(size_tRS_rD):
            tRS_rD[v] = tRS_rAcc[epi_idx * size_tRS_rD + v]
        tRS_rD_out.store(tRS_rD.load().to(self.c_dtype))

    @cute.jit
    def _epilogue_partitions(self, tiled_mma, promoted, sC, tidx) -> "EpiloguePartitions":
        """Registers → swizzled shared memory (stmatrix) → TMA store. With per-warpgroup stores,
        one warpgroup's stmatrix copy (64-row sub-tiles): a warpgroup's accumulator fragment is
        the same whatever the warpgroups beside it."""
        c_layout = self._d_layout()
        copy_atom_r2s = sm90_utils.sm90_get_smem_store_op(
            c_layout, elem_ty_d=self.c_dtype, elem_ty_acc=self.acc_dtype
        )
        copy_atom_c = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), self.c_dtype
        )
        epi_mma = tiled_mma
        epi_thread = tidx - THREADS_PER_WARPGROUP
        if cutlass.const_expr(self.schedule.epilogue.per_warpgroup):
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
        return EpiloguePartitions(tiled_copy_r2s, tRS_sD, tRS_rAcc, tRS_rD, tRS_rD_out, size_tRS_rD)

    @cute.jit
    def _epilogue_sync(self, warp_group_idx) -> "EpilogueSync":
        """The epilogue's barriers, storing warps and store pipeline. Per-warpgroup stores: a named
        barrier per math warpgroup (ids 1 and 2), and the warpgroup's first warp stores its
        sub-tiles. Whole-tile epilogues (a buffer per sub-tile): one bulk group per tile, and the
        buffers are free again once that group has been read (wait for 0 pending)."""
        epilogue_barrier = pipeline.NamedBarrier(
            barrier_id=EPILOGUE_BARRIER_ID, num_threads=self.num_mma_threads
        )
        wg_offset = warp_group_idx - 1
        # This math warpgroup's first row in the tile (its one wave of 64 rows).
        warpgroup_row = wg_offset * (self.tile_shape_mnk[0] // self.schedule.math_warpgroups)
        warpgroup_barrier = pipeline.NamedBarrier(
            barrier_id=EPILOGUE_BARRIER_ID + wg_offset, num_threads=THREADS_PER_WARPGROUP
        )
        wg_store_warp = self.epi_store_warp_id + 4 * wg_offset
        # The whole-tile epilogue's barrier and storing warp: the CTA's math threads and
        # warp epi_store_warp_id, or with per-warpgroup stores this warpgroup's.
        staged_barrier = epilogue_barrier
        staged_store_warp = self.epi_store_warp_id
        if cutlass.const_expr(self.schedule.epilogue.per_warpgroup):
            staged_barrier = warpgroup_barrier
            staged_store_warp = wg_store_warp
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=1 if self.schedule.epilogue_whole_tile else self.schedule.epilogue_stages,
            producer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_mma_threads
            ),
        )
        return EpilogueSync(
            epilogue_barrier, wg_offset, warpgroup_row, staged_barrier, staged_store_warp, store_pipeline
        )

    @cute.jit
    def _store_tile(
        self, args: "GemmArgs", epi: "EpiloguePartitions", sync: "EpilogueSync", sC, gC_tile, tiles_done,
        write_tile, warp_idx,
    ):
        """The epilogue of one tile: fp32 → D's type in registers, stmatrix into the sub-tile
        buffers, TMA stores (none where `write_tile` is 0: the barriers and commits still run)."""
        tCgC_epi = cute.zipped_divide(gC_tile, self.schedule.epi_tile)
        bSG_sD, bSG_gD = cpasync.tma_partition(
            args.tma_atom_c,
            0,
            cute.make_layout(1),
            cute.group_modes(sC, 0, 2),
            tCgC_epi,
        )
        epi_tile_num = cute.size(tCgC_epi, mode=[1])
        epi_tile_shape = tCgC_epi.shape[1]
        epi_tile_layout = cute.make_layout(epi_tile_shape, stride=(epi_tile_shape[1], 1))
        num_prev_epi_tiles = tiles_done * epi_tile_num
        convert_args = (epi.tRS_rAcc, epi.tRS_rD, epi.tRS_rD_out, epi.size_tRS_rD)
        # Locals, not fields: an object whose method a run-time branch calls is carried through it.
        store_pipeline = sync.store_pipeline
        if cutlass.const_expr(self.schedule.epilogue_whole_tile):
            # The previous tile's stores have read the buffers (issued a main loop ago,
            # so this rarely waits); then every sub-tile goes to its own buffer, one
            # barrier, and one warp issues all the stores as one bulk group (per
            # warpgroup: each its own sub-tiles, barrier and bulk group).
            subtiles = self._staged_subtiles(epi_tile_num, epi_tile_layout, sync.wg_offset)
            if warp_idx == sync.staged_store_warp:
                store_pipeline.producer_acquire()
            sync.staged_barrier.arrive_and_wait()
            for chunk, buffer, _ in subtiles:
                self._convert_subtile(*convert_args, chunk)
                cute.copy(epi.tiled_copy_r2s, epi.tRS_rD_out, epi.tRS_sD[(None, None, None, buffer)])
            # Make the stmatrix writes visible to the TMA unit before the stores.
            cute.arch.fence_proxy("async.shared", space="cta")
            sync.staged_barrier.arrive_and_wait()
            if warp_idx == sync.staged_store_warp:
                if write_tile != 0:
                    for _, buffer, gmem_coord in subtiles:
                        cute.copy(args.tma_atom_c, bSG_sD[(None, buffer)], bSG_gD[(None, gmem_coord)])
                store_pipeline.producer_commit()
        else:
            for epi_idx in cutlass.range_constexpr(epi_tile_num):
                self._convert_subtile(*convert_args, epi_idx)
                epi_buffer = (num_prev_epi_tiles + epi_idx) % self.schedule.epilogue_stages
                cute.copy(epi.tiled_copy_r2s, epi.tRS_rD_out, epi.tRS_sD[(None, None, None, epi_buffer)])
                # Make the stmatrix writes visible to the TMA unit before the store.
                cute.arch.fence_proxy("async.shared", space="cta")
                sync.epilogue_barrier.arrive_and_wait()
                gmem_coord = epi_tile_layout.get_hier_coord(epi_idx)
                if warp_idx == self.epi_store_warp_id:
                    if write_tile != 0:
                        cute.copy(args.tma_atom_c, bSG_sD[(None, epi_buffer)], bSG_gD[(None, gmem_coord)])
                    store_pipeline.producer_commit()
                    store_pipeline.producer_acquire()
                sync.epilogue_barrier.arrive_and_wait()
