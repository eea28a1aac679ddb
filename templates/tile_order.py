"""The order in which persistent GEMM kernels walk their output tiles, shared by the Hopper and
Blackwell templates: the persistent launch, banded rasterisation, the masked layout's walk over
groups on the GPU and the contiguous layout's tile-to-group lookup.

A kernel class that mixes `TileOrder` in provides ``group_size``, ``raster_along_m``,
``tile_shape_mnk`` (the CTA tile), ``cluster_shape_mn``, ``threads_per_cta``, ``smem_bytes`` and
``masked_tile_rows`` (rows of A one scheduled tile of the masked layout covers: the cluster's
tile rows on Hopper, the MMA tile of a CTA pair on Blackwell).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


class TileOrder:
    """Tile-sequence helpers; every role of a kernel calls them with the same arguments, so the
    producer, the MMA issuer and the epilogue walk the same tiles without talking to each other."""

    @cute.jit
    def _persistent_clusters(self, d, grouped: bool, max_active_clusters, units_per_tile=None):
        """Clusters to launch (host side), the grid rule the runtime computes too: cluster tiles
        of D (every group counted full when D has a group mode: masked_m and group sizes stay on
        the GPU, and idle clusters exit at once; times `units_per_tile` work units each when
        given: split K), at most max_active_clusters, at least 1."""
        tm, tn = self.tile_shape_mnk[0], self.tile_shape_mnk[1]
        cm, cn = self.cluster_shape_mn
        tiles_m = (d.shape[0] + tm - 1) // tm
        tiles_n = (d.shape[1] + tn - 1) // tn
        cluster_tiles = ((tiles_m + cm - 1) // cm) * ((tiles_n + cn - 1) // cn)
        if cutlass.const_expr(grouped):
            cluster_tiles = cluster_tiles * d.shape[2]
        if cutlass.const_expr(units_per_tile is not None):
            cluster_tiles = cluster_tiles * units_per_tile
        return cutlass.max(cutlass.min(cluster_tiles, max_active_clusters), 1)

    def _launch_persistent(self, kernel_call, clusters, stream):
        """Launch `kernel_call` (what ``self.kernel(...)`` returns) over `clusters` persistent
        clusters (`_persistent_clusters`): grid (cluster_m, cluster_n, clusters), one CTA per SM."""
        cm, cn = self.cluster_shape_mn
        kernel_call.launch(
            grid=[cm, cn, clusters],
            block=[self.threads_per_cta, 1, 1],
            cluster=[cm, cn, 1],
            smem=self.smem_bytes,
            min_blocks_per_mp=1,
            stream=stream,
        )

    # The banded raster's divisors as FastDivmod divisors (`_make_raster_divisors`), made by a
    # kernel at trace time before it walks tiles; None: `_cluster_tile_coord` divides plainly.
    raster_divisors = None

    @cute.jit
    def _make_raster_divisors(self, ct_m, ct_n):
        """(cluster tiles per band, tile rows (raster along N: columns) of the last band) as
        FastDivmod divisors, for `_cluster_tile_coord`. A 32-bit division by a run-time value
        compiles to a chain of about 25 dependent instructions (IABS, I2F, MUFU.RCP, F2I, fix-ups);
        each tile's start located its tile and prefetched the next one's group with three of
        them in a row, before its first WGMMA (Nsight Compute: 170 instructions per math warp and
        tile). A FastDivmod divisor divides with a multiply-high and a shift; it is made once per
        CTA."""
        g = self.group_size
        across = ct_m if cutlass.const_expr(self.raster_along_m) else ct_n
        per_band = (ct_n if cutlass.const_expr(self.raster_along_m) else ct_m) * g
        last_band = across - (across - 1) // g * g
        return cute.fast_divmod_create_divisor_v2(per_band), cute.fast_divmod_create_divisor_v2(last_band)

    @cute.jit
    def _cluster_tile_coord(self, t, ct_m, ct_n):
        """Linear cluster-tile index → (cluster-tile m, cluster-tile n), banded by group_size.
        With `raster_divisors`, the band through a FastDivmod divisor, and the position within
        it by the constant group_size, or (the last band, when narrower) by its own divisor."""
        g = self.group_size
        if cutlass.const_expr(self.raster_divisors is not None):
            per_band, last_band = self.raster_divisors
            band, local = divmod(t, per_band)
            first = band * g
            across = ct_m if cutlass.const_expr(self.raster_along_m) else ct_n
            quotient = local // g
            remainder = local - quotient * g
            if across - first < g:
                quotient, remainder = divmod(local, last_band)
            if cutlass.const_expr(self.raster_along_m):
                return first + remainder, quotient
            return quotient, first + remainder
        if cutlass.const_expr(self.raster_along_m):
            per_band = ct_n * g
            band = t // per_band
            first = band * g
            rows = cutlass.min(ct_m - first, g)
            local = t - band * per_band
            return first + local % rows, local // rows
        else:
            per_band = ct_m * g
            band = t // per_band
            first = band * g
            cols = cutlass.min(ct_n - first, g)
            local = t - band * per_band
            return local // cols, first + local % cols

    @cute.jit
    def _masked_tiles(self, mMasked, g, max_m, ct_n):
        """Cluster tiles of group g in the masked layout: ⌈masked_m[g] / rows⌉ · ct_n, rows =
        `masked_tile_rows`, with masked_m[g] read on the GPU and taken into [0, max_m] (a value
        past the rows A and D hold computes those rows only)."""
        tm = self.masked_tile_rows
        return (cutlass.min(cutlass.max(mMasked[g], 0), max_m) + tm - 1) // tm * ct_n

    @cute.jit
    def _masked_total(self, mMasked, max_m, ct_n):
        """Cluster tiles of the masked layout: Σ_g `_masked_tiles`."""
        total = cutlass.Int32(0)
        for g in range(cute.size(mMasked)):
            total += self._masked_tiles(mMasked, g, max_m, ct_n)
        return total

    @cute.jit
    def _masked_locate(self, t, mMasked, max_m, ct_n):
        """Cluster tile t of the masked layout → (group, cluster-tile m, cluster-tile n). Within a
        group the tiles run along N (a row of tiles after another), or with `raster_along_m` down
        each column of tiles first: the group's rows of one column block run side by side and read
        its block of B once, where a group's B is larger than the L2 (BF16 experts of 6144x7168)."""
        group = cutlass.Int32(0)
        local = t
        rows = cutlass.Int32(1)
        before = cutlass.Int32(0)
        found = cutlass.Int32(0)
        for g in range(cute.size(mMasked)):
            count = self._masked_tiles(mMasked, g, max_m, ct_n)
            if found == 0:
                if t < before + count:
                    group = cutlass.Int32(g)
                    local = t - before
                    rows = count // ct_n
                    found = cutlass.Int32(1)
            before += count
        if cutlass.const_expr(self.raster_along_m):
            return group, local % rows, local // rows
        return group, local // ct_n, local % ct_n

    @cute.jit
    def _tile_group(self, mIdx, tile_m, num_groups, row_offset=0):
        """The group of an M tile: m_indices of its first row, or of the row `row_offset` rows
        into it (`_group_or_padding`; -1 past the rows)."""
        row = tile_m * self.tile_shape_mnk[0] + row_offset
        g = cutlass.Int32(-1)
        if row < cute.size(mIdx):
            g = self._group_or_padding(mIdx[row], num_groups)
        return g

    @cute.jit
    def _group_or_padding(self, index, num_groups):
        """An m_indices value as a group, or -1 (padding) when it names none of the `num_groups`
        groups: B and its scales are indexed with real groups only."""
        g = cutlass.Int32(-1)
        if (index >= 0) & (index < num_groups):
            g = index
        return g

    @cute.jit
    def _prefetch_tile_group(self, mIdx, tile_m, row_offset=0):
        """Bring the line of `_tile_group(mIdx, tile_m, row_offset)` into L1 without waiting for
        it. A kernel reads a tile's group as a uniform value, and the compiler converts the loaded
        register to a uniform one right after the load, so the load's whole latency stalls the
        warp there; prefetched a tile earlier, the load hits L1."""
        row = tile_m * self.tile_shape_mnk[0] + row_offset
        if row < cute.size(mIdx):
            cute.arch.prefetch((mIdx.iterator + row).llvm_ptr, cache_level="L1")
