"""The Hopper GEMM's contiguous M-grouped family: each tile's group from m_indices, pairs of
tiles sharing B, padding rows.

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

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cutegen.templates.hopper_state import GemmArgs, GroupMetadata, TileWalk

class ContiguousFamily:
    """Group lookups of the contiguous layout for both roles, and what padding rows and warpgroups do."""

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

    @cute.jit
    def _contiguous_groups(self, args: "GemmArgs", walk: "TileWalk", metadata: "GroupMetadata", t, warpgroup_row=None):
        """Contiguous layout: `_groups_of_contiguous_tile` for unit t of `walk`."""
        return self._groups_of_contiguous_tile(
            metadata.mIdx, args.mB_nk.shape[2], t, walk.tile_stride, walk.num_cluster_tiles, walk.ct_m, walk.ct_n,
            walk.cluster_coord_mnk, warpgroup_row,
        )
