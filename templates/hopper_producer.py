"""The Hopper GEMM's TMA producer warp: per K block of a tile, wait for a free stage and issue its loads.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute

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
# the GEMM). Measured: M <= 128 1.00-1.13x faster, masked groups of max_m 256-512 1.01-1.06x;
# M = 4096, where later tile rows read every B tile again, lost up to 1.5% with them (NOTES N40).
STREAMED_B_MAX_TILE_ROWS = 2


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


class HopperProducer:
    """The producer's K loops: whole tiles, the tail tile of 16-row A slices, B and the scales, L2 hints."""

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
        if cutlass.const_expr(self.schedule.block_scaled):
            if cutlass.const_expr(self.schedule.op.is_masked and self.schedule.splits_k_last_wave):
                sfa_src = loads.tSFAgSFA[(None, loads.tile_m, loads.first_block + state.count, loads.group)]
            elif cutlass.const_expr(self.schedule.op.is_masked):
                sfa_src = loads.tSFAgSFA[(None, loads.tile_m, state.count, loads.group)]
            else:
                sfa_src = loads.tSFAgSFA[(None, loads.tile_m, loads.first_block + state.count)]
            cute.copy(loads.tma_atom_sfa, sfa_src, loads.tSFAsSFA[(None, state.index)], tma_bar_ptr=barrier)
        if cutlass.const_expr(self.schedule.op.scales_b_per_row):
            cute.copy(
                loads.tma_atom_sfb,
                loads.tSFBgSFB[(None, loads.tile_n, loads.first_block + state.count)],
                loads.tSFBsSFB[(None, state.index)],
                tma_bar_ptr=barrier,
            )
