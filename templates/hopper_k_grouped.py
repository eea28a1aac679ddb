"""The Hopper GEMM's k-grouped family: groups along K, per-group TMA descriptors rewritten in a
global workspace.

k-grouped weight gradient (`k_grouped_fp8_gemm_nt_contiguous`): the tile sequence runs over
the groups with at least one token (D carries a group mode); before its first tile of a new
group the producer warp rewrites this CTA's TMA descriptors of A and B in the global
workspace (copied from the host's descriptors once, then address, extents and stride
replaced with `tensormap.replace`, released and acquired through the tensormap proxy fence);
the scales are TMA-loaded at the group's first block plus the K block.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils.tensormap import TensorMapManager, TensorMapUpdateMode

from cutegen.schedules.spec import SCALE_BLOCK
from cutegen.templates.gemm_contract import TENSORMAP_BYTES, TENSORMAP_WORDS

class KGroupedFamily:
    """The k-grouped weight gradient's tile walk over the groups and its per-group descriptors."""

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

    def _k_tiles_per_block(self) -> int:
        """K tiles per 128-token block: 1 at tile_k 128 (FP8), 2 at 64 (BF16)."""
        return SCALE_BLOCK // self.tile_shape_mnk[2]

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
        """Rewrite this CTA's descriptors of A and B for one group (run by the whole producer warp);
        `first_block` counts 128-token blocks, `k_blocks` the group's K tiles.

        Group g's A is [M, 128·⌈k_g/128⌉] row-major starting 128·M·(first block) elements into the
        flat A (B likewise with N); tokens first (BF16), its rows [first, first + k_g) of [Σk, M]. The TMA loads issued with the old descriptors must have read
        them before they change: the bulk-async wait below is the fence CUTLASS uses for that."""
        tk = self.tile_shape_mnk[2]
        k = k_blocks * tk
        first = cutlass.Int64(first_block) * SCALE_BLOCK
        if cutlass.const_expr(self.schedule.layout.a_mn_major):
            # Tokens first (BF16, tn): the group's rows of [Σk, M] and [Σk, N], M (N) contiguous.
            a_group = cute.make_tensor(a_base_ptr + first * m, cute.make_layout((m, k), stride=(1, m)))
            b_group = cute.make_tensor(b_base_ptr + first * n, cute.make_layout((n, k), stride=(1, n)))
        else:
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
