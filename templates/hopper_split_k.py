"""The Hopper GEMM's K splits: split-K work units and their fix-up, and the weight gradient's tail split.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cutegen.schedules.spec import TAIL_SPLIT_MAX_FILL, TAIL_SPLIT_MIN_SAVED_BLOCKS
from cutegen.templates.gmem_vec import vec16_at

# Split-K fixup: registers per math thread for the partial tiles loaded in one batch (with 128,
# batches of two 64-register partials spilled in the 64x128 and 128x128 kernels), and the most
# splits one batch holds.
SPLIT_K_READ_REGISTERS = 112


SPLIT_K_MAX_READ_BATCH = 8


class SplitKFamily:
    """Split K (a tile's K blocks over several CTAs, reduced by the last to arrive) and the tail
    split (the last wave's K blocks shared by every cluster, reduce-added into D)."""

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
    def _last_wave_plan(self, cluster_tiles, clusters, k_splits):
        """Split K for the last wave only (`Epilogue.splits_last_wave_only`): the tiles of the
        whole waves (a multiple of `clusters`) stay whole; each of the r remaining tiles is split
        into S = min(k_splits, clusters // r) units, so that r · S units fill at most one wave
        (S = 1: no split). Cluster c then takes units c, c + clusters, …: its whole tiles, then at
        most one split unit. Returns ((whole tiles, S), work units)."""
        last = cluster_tiles % clusters
        splits = cutlass.min(k_splits, clusters // cutlass.max(last, 1))
        splits = cutlass.max(splits, 1) if last > 0 else cutlass.Int32(1)
        whole = cluster_tiles - last if splits > 1 else cluster_tiles
        return (whole, splits), whole + (cluster_tiles - whole) * splits

    @cute.jit
    def _last_wave_unit(self, t, last_wave):
        """Unit t of `_last_wave_plan`'s walk → (cluster tile, its index among the split tiles
        (0 for a whole one), split, whether it is split)."""
        whole, splits = last_wave
        split_unit = t >= whole
        position = cutlass.max(t - whole, 0)
        index = position // splits
        tile_t = whole + index if split_unit else t
        return tile_t, index, position - index * splits, split_unit

    @cute.jit
    def _last_wave_blocks(self, t, last_wave, k_tile_cnt):
        """Unit t of `_last_wave_plan`'s walk → (cluster tile, first K tile, K tiles): a whole
        tile's every K tile, a split unit's balanced share of the tile's whole 128-wide K blocks
        (in K tiles; S <= the runtime's normalised count leaves no share empty)."""
        tile_t, _, split, split_unit = self._last_wave_unit(t, last_wave)
        first_block = cutlass.Int32(0)
        k_blocks = k_tile_cnt
        if split_unit:
            splits = last_wave[1]
            per_block = self._k_tiles_per_block()
            blocks = (k_tile_cnt + per_block - 1) // per_block
            first_block = split * blocks // splits * per_block
            k_blocks = cutlass.min((split + 1) * blocks // splits * per_block, k_tile_cnt) - first_block
        return tile_t, first_block, k_blocks

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
