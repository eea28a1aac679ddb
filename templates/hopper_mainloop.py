"""The Hopper GEMM's math main loops: plain WGMMA accumulation and the block-scaled promotion
(waves, accumulator rings, SFB in registers).

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

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op

from cutegen.schedules.spec import SCALE_BLOCK

# K blocks per chunk of the tile's SFB held in warp registers (one per lane) by the block-scaled
# main loop.
SFB_CHUNK_BLOCKS = 32


@dsl_user_op
def _opaque(x: cutlass.Float32, *, loc=None, ip=None) -> cutlass.Float32:
    """x, through a register move the compiler cannot look through (keeps a value it would
    otherwise rematerialise or sink where it was written)."""
    return cutlass.Float32(
        llvm.inline_asm(
            T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=f,f",
            has_side_effects=False, is_align_stack=False,
        )
    )


class StaticStage(pipeline.PipelineState):
    """A consumer pipeline state whose stage index is a constant of the traced code (the phase
    stays a run-time bit): shared-memory addresses, WGMMA descriptors and barrier addresses of
    its stage are then immediates. `advance` moves the index at trace time and flips the phase on
    wrapping. Never loop-carried: a loop carries the phase and rebuilds the state."""

    def __init__(self, stages: int, index: int, phase):
        super().__init__(stages, cutlass.Int32(0), index, phase)

    def clone(self, *, loc=None, ip=None) -> "StaticStage":
        return StaticStage(self._stages, self._index, self._phase)

    def advance(self, count: int = 1, *, loc=None, ip=None) -> None:
        assert count == 1, "a static stage advances one block at a time"
        self._index += 1
        if self._index == self._stages:
            self._index = 0
            self._phase = self._phase ^ 1


class HopperMainloop:
    """The math warpgroups' K loops over a tile's stages (see HopperGemmKernel's docstring)."""

    @cute.jit
    def _mainloop(
        self, tiled_mma, acc, tCrA, tCrB, pipe, read_state, release_state, k_tile_cnt, num_k_blocks
    ):
        """Unscaled mainloop: accumulate every K block into `acc`, one WGMMA batch in flight.
        Returns the advanced pipeline states (the caller must rebind them)."""
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.fence()
        pipe.consumer_wait(read_state)
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, read_state.index)
            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
        warpgroup.commit_group()
        read_state.advance()
        for k_tile in range(1, k_tile_cnt):
            pipe.consumer_wait(read_state)
            for kb in cutlass.range_constexpr(num_k_blocks):
                coord = (None, None, kb, read_state.index)
                cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
            warpgroup.commit_group()
            # The previous batch is done once at most one group is pending.
            warpgroup.wait_group(1)
            pipe.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
        warpgroup.wait_group(0)
        pipe.consumer_release(release_state)
        release_state.advance()
        return read_state, release_state

    @cute.jit
    def _mainloop_block_scaled(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group=None, sSFB=None, boundary_at=None,
    ):
        """Block-scaled mainloop: per 128-wide K block, WGMMA into `acc` from zero, then
        promoted += acc · sfa[row] · sfb[column block] in fp32 registers, wave by wave (see the
        class docstring). `boundary_at`: the tile's SFB boundary when known at compile time.
        Returns the advanced pipeline state (the caller must rebind it)."""
        nb0, nb1, boundary = self._tile_sfb_blocks(mSFB, tile_n)
        if cutlass.const_expr(boundary_at is not None):
            boundary = boundary_at
        promoted.fill(0.0)
        mma_state = read_state.clone()
        # SFB in warp registers: lane i holds the tile's SFB for K block 32c + i of the current
        # chunk c (`chunk0`, `chunk1` for the second scale block) and of the next (`ahead0`,
        # `ahead1`), loaded a chunk ahead; a block's value is one shuffle. A global load per
        # block, with the address arithmetic ptxas redoes for it each time, made 256x128 tiles
        # at M = 4096 2.5-3% slower and 128x192 ones 8% (NOTES N46).
        rows = self._sfb_rows(mSFB, nb0, nb1, group)
        chunk0, chunk1 = self._lane_sfb(rows, 0, k_tile_cnt)
        ahead0, ahead1 = self._lane_sfb(rows, SFB_CHUNK_BLOCKS, k_tile_cnt)
        next_stage_ready = cutlass.Boolean(False)
        # Unrolled twice: the loop's pipeline-state and address updates of two blocks share one
        # branch (4096x4096x7168, 256x128: 1.05x the rolled loop with the peek below). Per-row
        # SFB (weight gradients) is read from the stage by the promotion, after the wait, unless
        # the schedule reads it while the WGMMAs run (`Schedule.column_scales_early`); only then
        # is the stage done with before the promotion and the loop unrolled.
        early_columns = self.schedule.column_scales_early
        stage_done_before_promotion = not self.schedule.op.scales_b_per_row or early_columns
        unroll = 2 if stage_done_before_promotion else 1
        if cutlass.const_expr(rows is None):  # per-row SFB comes from the stages: one chunk
            read_state, mma_state, next_stage_ready = self._mainloop_chunk(
                tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                next_stage_ready, 0, k_tile_cnt, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
                unroll, early_columns, stage_done_before_promotion,
            )
        else:
            chunks = (k_tile_cnt + SFB_CHUNK_BLOCKS - 1) // SFB_CHUNK_BLOCKS
            for chunk in cutlass.range(chunks, unroll=1):
                first = chunk * SFB_CHUNK_BLOCKS
                if chunk > 0:
                    chunk0 = ahead0
                    chunk1 = ahead1
                    ahead0, ahead1 = self._lane_sfb(rows, first + SFB_CHUNK_BLOCKS, k_tile_cnt)
                read_state, mma_state, next_stage_ready = self._mainloop_chunk(
                    tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                    next_stage_ready, first, cutlass.min(SFB_CHUNK_BLOCKS, k_tile_cnt - first), k_tile_cnt,
                    num_k_blocks, chunk0, chunk1, boundary, unroll, early_columns, stage_done_before_promotion,
                )
        return read_state

    @cute.jit
    def _mainloop_chunk(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, first, blocks, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        unroll: int, early_columns: bool, stage_done_before_promotion: bool,
    ):
        """K blocks first .. first + blocks - 1 of `_mainloop_block_scaled`, whose SFB lane j of
        `chunk0` / `chunk1` holds for block first + j. Returns (read_state, mma_state,
        next_stage_ready).

        With `Schedule.static_stage_rounds`, the blocks from the first one in stage 0 run in
        rounds of one block per stage, each round's stages unrolled with `StaticStage` states: the
        stage index is then a constant, so the WGMMA descriptors, the SFA addresses and the
        barrier addresses of each block are immediates and only the phase is carried (DeepGEMM's
        kernels get the same from a K known at compile time). The blocks before stage 0 comes
        round and those after the last round run the loop with run-time stage indices."""
        args = (acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe)
        rest = (first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary, early_columns, stage_done_before_promotion)
        if cutlass.const_expr(not self.schedule.static_stage_rounds):
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                tiled_mma, *args, read_state, mma_state, next_stage_ready, 0, blocks, unroll, *rest
            )
        else:
            stages = read_state.stages
            # Each loop below sets the ACCUMULATE field of a tiled MMA of its own: a field set
            # inside a loop must not be read after it.
            head = cutlass.min(blocks, (stages - read_state.index) % stages)
            rounds = (blocks - head) // stages
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                tiled_mma, *args, read_state, mma_state, next_stage_ready, 0, head, 1, *rest
            )
            phase = read_state.phase
            round_mma = self._make_tiled_mma()
            for r in cutlass.range(rounds, unroll=1):
                static_read = StaticStage(stages, 0, phase)
                static_mma = static_read.clone()
                for s in cutlass.range_constexpr(stages):
                    static_read, static_mma, next_stage_ready = self._mainloop_block(
                        round_mma, *args, static_read, static_mma, next_stage_ready, head + r * stages + s, *rest
                    )
                phase = static_read.phase
            # Rounds leave the stage index where they found it (0 when there were any).
            read_state = pipeline.PipelineState(
                stages, read_state.count + rounds * stages, read_state.index, phase
            )
            mma_state = read_state.clone()
            read_state, mma_state, next_stage_ready = self._mainloop_blocks(
                self._make_tiled_mma(), *args, read_state, mma_state, next_stage_ready,
                head + rounds * stages, blocks, unroll, *rest
            )
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _mainloop_blocks(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, j0, j1, unroll: int, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        early_columns: bool, stage_done_before_promotion: bool,
    ):
        """Blocks first + j0 .. first + j1 - 1 of a chunk with run-time stage indices.
        Returns (read_state, mma_state, next_stage_ready)."""
        for j in cutlass.range(j0, j1, unroll=unroll):
            read_state, mma_state, next_stage_ready = self._mainloop_block(
                tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
                next_stage_ready, j, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
                early_columns, stage_done_before_promotion,
            )
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _mainloop_block(
        self, tiled_mma, acc, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, pipe, read_state, mma_state,
        next_stage_ready, j, first, k_tile_cnt, num_k_blocks, chunk0, chunk1, boundary,
        early_columns: bool, stage_done_before_promotion: bool,
    ):
        """K block first + j of a chunk: its waves' WGMMAs, scales, waits and promotions.
        Returns (read_state, mma_state, next_stage_ready)."""
        k_tile = first + j
        sfb0, sfb1 = self._chunk_sfb(chunk0, chunk1, j)
        for wave in cutlass.range_constexpr(self.schedule.all_waves):
            mma_state = self._issue_wave(
                tiled_mma, acc, tCrA, tCrB, pipe, mma_state, num_k_blocks, wave, next_stage_ready
            )
            p0, p1 = self._wave_scales(tCcC, sSFA, read_state, sfb0, sfb1, wave)
            sfb_col = None
            if cutlass.const_expr(early_columns):
                sfb_col = self._stage_sfb_columns(tCcC, sSFB, read_state, wave)
            warpgroup.wait_group(0)
            last_wave = wave == self.schedule.all_waves - 1
            if cutlass.const_expr(last_wave and stage_done_before_promotion):
                read_state, next_stage_ready = self._release_and_probe(
                    pipe, read_state, None, k_tile, k_tile_cnt
                )
            read_state = self._promote_wave(
                acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave,
                released=stage_done_before_promotion, sfb_col=sfb_col,
            )
            if cutlass.const_expr(last_wave and not stage_done_before_promotion):
                # Per-row SFB is read from the stage by the promotion, so the stage is
                # released (and the next one probed) only after it.
                next_stage_ready = self._peek_next_stage(pipe, read_state, k_tile, k_tile_cnt)
        return read_state, mma_state, next_stage_ready

    @cute.jit
    def _release_and_probe(self, pipe, read_state, next_state, k_tile, k_tile_cnt):
        """Hand the stage of `read_state` back to the producer, advance the state, and probe the
        stage of `next_state` (None: the advanced `read_state`), block k_tile + 1, before the
        promotion (`_peek_next_stage`). Returns (state, whether the probed stage has arrived)."""
        pipe.consumer_release(read_state)
        read_state.advance()
        probed = next_state
        if cutlass.const_expr(next_state is None):
            probed = read_state
        return read_state, self._peek_next_stage(pipe, probed, k_tile, k_tile_cnt)

    @cute.jit
    def _peek_next_stage(self, pipe, state, k_tile, k_tile_cnt):
        """Whether the stage of `state` (block k_tile + 1 of this tile) has arrived, probed with
        a try-wait issued before the promotion so that its latency hides behind the FFMAs
        (DeepGEMM's 1D2D kernel has the same order); the next wave-0 issue skips its wait when
        it is true. Not probed after the tile's last block: the next tile's first stage is often
        still loading, and a try-wait that finds its phase incomplete suspends the warp (for up
        to a system-dependent time) before the promotion: probing it made K <= 4096 1-3% slower."""
        ready = cutlass.Boolean(False)
        if k_tile + 1 < k_tile_cnt:
            ready = pipe.consumer_try_wait(state)
        return ready

    @cute.jit
    def _block_scaled_tile(
        self, tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool,
    ):
        """One tile's block-scaled main loop (`_block_scaled_tile_at`). A tile spanning two SFB
        blocks takes the copy of the loop compiled for its boundary column, chosen by the chain
        if boundary == b0 … else … over `sfb_boundaries` (the last one unconditional: tiles wholly
        past N, whose stores are clipped, take it whatever their boundary). With the boundary a
        constant, each accumulator chunk's scale is fixed at compile time; a run-time boundary
        costs a compare and a select per chunk and row in every promotion, which made 112- to
        192-wide tiles slower than 128-wide ones. Returns the advanced pipeline state."""
        if cutlass.const_expr(self.single_sfb_block or self.schedule.op.scales_b_per_row):
            read_state = self._block_scaled_tile_at(
                tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty, None,
            )
        else:
            _, _, boundary = self._tile_sfb_blocks(mSFB, tile_n)
            read_state = self._block_scaled_tile_from(
                0, boundary, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty,
            )
        return read_state

    @cute.jit
    def _block_scaled_tile_from(
        self, case: int, boundary, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool,
    ):
        """The boundary chain of `_block_scaled_tile` from candidate `case` on. Each branch
        builds its own tiled MMA: a field set inside a dynamic branch must not be read after it."""
        args = (accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe)
        rest = (k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty)
        candidate = self.sfb_boundaries[case]
        if cutlass.const_expr(case == len(self.sfb_boundaries) - 1):
            read_state = self._block_scaled_tile_at(self._make_tiled_mma(), *args, read_state, *rest, candidate)
        else:
            if boundary == candidate:
                read_state = self._block_scaled_tile_at(self._make_tiled_mma(), *args, read_state, *rest, candidate)
            else:
                read_state = self._block_scaled_tile_from(case + 1, boundary, *args, read_state, *rest)
        return read_state

    @cute.jit
    def _block_scaled_tile_at(
        self, tiled_mma, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group, sSFB, may_be_empty: bool, boundary_at,
    ):
        """One tile's block-scaled main loop: through the ring of WGMMA accumulators `accs` when
        the schedule has more than one, else wave by wave. The ring needs len(accs) - 1 K blocks
        to fill; a tile with fewer (`may_be_empty`: possibly none, then its sum is zero; deeper
        rings: any short K) takes the wave-by-wave loop. `boundary_at`: the tile's SFB boundary
        as a constant, or None (one SFB block, or per-row SFB). Returns the advanced pipeline
        state (the caller must rebind it)."""
        depth = len(accs)
        if cutlass.const_expr(depth == 1):
            read_state = self._mainloop_block_scaled(
                tiled_mma, accs[0], promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
            )
        elif cutlass.const_expr(depth == 2 and not may_be_empty):
            read_state = self._mainloop_accumulator_ring(
                accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
            )
        else:
            if k_tile_cnt >= max(depth - 1, 1):
                read_state = self._mainloop_accumulator_ring(
                    accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
                    k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
                )
            else:
                # A tiled MMA of this region sets its own ACCUMULATE field (a field set inside a
                # dynamic branch must not be read after it).
                read_state = self._mainloop_block_scaled(
                    self._make_tiled_mma(), accs[0], promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe,
                    read_state, k_tile_cnt, num_k_blocks, tile_n, group, sSFB, boundary_at,
                )
        return read_state

    @cute.jit
    def _tile_sfb_blocks(self, mSFB, tile_n):
        """(nb0, nb1, boundary): the 128-column SFB blocks an N tile spans (a tile spans at most
        two; nb1 = nb0 for per-row SFB) and the tile column where nb1 begins.

        A CTA of a cluster whose tile lies wholly past N (its stores are clipped) may start past
        the last SFB block (e.g. 160-wide tiles in 1x2 clusters at N = 7168: tile 45 starts at
        column 7200, SFB has 56 blocks): its blocks are clamped to the last one, so that it never
        reads past SFB (it did, 512 bytes at K = 16384, and faulted where that crossed the end of
        a mapping)."""
        n0 = tile_n * self.tile_shape_mnk[1]
        nb0 = n0 // SCALE_BLOCK
        nb1 = nb0
        if cutlass.const_expr(not self.schedule.op.scales_b_per_row):
            nb0 = cutlass.min(nb0, mSFB.shape[0] - 1)
            nb1 = cutlass.min(nb0 + 1, mSFB.shape[0] - 1)
        # Columns of this tile before `boundary` belong to scale block nb0, the rest to nb1.
        boundary = (nb0 + 1) * SCALE_BLOCK - n0
        return nb0, nb1, boundary

    @cute.jit
    def _mainloop_accumulator_ring(
        self, accs, promoted, tCrA, tCrB, tCcC, sSFA, mSFB, pipe, read_state,
        k_tile_cnt, num_k_blocks, tile_n, group=None, sSFB=None, boundary_at=None,
    ):
        """Block-scaled mainloop of single-wave tiles through a ring of D = len(accs) WGMMA
        accumulators (at least D - 1 K blocks): block kb + D - 1 is issued into the free
        accumulator before block kb is waited for and promoted, so D - 1 blocks' WGMMAs are in
        flight while the math threads promote. Small tiles are bound by each block's latency
        (stage wait, WGMMAs, wait, promotion), not by the tensor cores, and overlap D - 1 blocks.
        Block b lives in accs[b % D]; its scales in slot b % D of a register ring.
        Returns the advanced pipeline state (the caller must rebind it)."""
        depth = len(accs)
        # A tiled MMA of this call sets its own ACCUMULATE field: the caller may run it inside a
        # dynamic branch, and a field set there must not be read after it.
        tiled_mma = self._make_tiled_mma()
        nb0, nb1, boundary = self._tile_sfb_blocks(mSFB, tile_n)
        if cutlass.const_expr(boundary_at is not None):
            boundary = boundary_at
        promoted.fill(0.0)
        mma_state = read_state.clone()
        # A block's scales are read when its WGMMAs are issued, D - 1 blocks ahead of its
        # promotion (SFB from global memory, its two SFA rows from the stage), so neither
        # latency is on the promotion's path: slot b % D holds (sfb0, sfb1, sfa row, row + 8).
        # SFB is not held in warp registers as in `_mainloop_block_scaled`: its load is already
        # off the critical path here, and a per-block chunk check measured 0.95-0.99x (NOTES N49).
        scales = cute.make_rmem_tensor(4 * depth, cutlass.Float32)
        rows = self._sfb_rows(mSFB, nb0, nb1, group)
        for j in cutlass.range_constexpr(depth - 1):
            mma_state = self._issue_ring_block(
                tiled_mma, accs, j, scales, j, tCrA, tCrB, tCcC, sSFA, rows, pipe, mma_state, num_k_blocks,
            )
        k_tile = cutlass.Int32(0)
        # The next block's stage is probed before each promotion on two-accumulator rings of
        # tiles within one SFB block (128x128, 64x128, 64x64: 1.00-1.07x at 11 shapes); the
        # 112-wide tiles (a loop copy per SFB boundary) and four-deep rings (64x16, 64x32)
        # measured 0.95-0.99x with it and keep the plain wait at issue. Never with per-row SFB:
        # the probing promotion hands the stage back before promoting, and per-row SFB is read
        # from the stage by the promotion (the default catalogue has no per-row ring; a
        # schedule that had one computed wrong sums with the probe).
        probe_next_stage = depth == 2 and self.single_sfb_block and not self.schedule.op.scales_b_per_row
        next_stage_ready = cutlass.Boolean(False)
        for _ in range((k_tile_cnt - (depth - 1)) // depth):
            for j in cutlass.range_constexpr(depth):
                mma_state = self._issue_ring_block(
                    tiled_mma, accs, (j + depth - 1) % depth, scales, k_tile + depth - 1, tCrA, tCrB,
                    tCcC, sSFA, rows, pipe, mma_state, num_k_blocks, next_stage_ready,
                )
                if cutlass.const_expr(probe_next_stage):
                    # Block k_tile + D is the next to be issued: its stage is probed before this
                    # promotion's FFMAs (see _peek_next_stage).
                    read_state, next_stage_ready = self._promote_ring_slot_probing(
                        accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary,
                        depth - 1, mma_state, k_tile + depth - 1, k_tile_cnt,
                    )
                else:
                    read_state = self._promote_ring_slot(
                        accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, depth - 1
                    )
                k_tile += 1
        # Blocks k_tile .. k_tile + D - 2 are in flight in accs[0 .. D - 2]; `left` more (< D)
        # remain. Each value of `left` gets its own straight-line tail: the WGMMA wait counts must
        # be immediates, and ptxas serialises every WGMMA of a kernel whose waits it cannot
        # follow (an empty commit group in one branch was enough).
        left = k_tile_cnt - k_tile - (depth - 1)
        read_state = self._ring_tail_from(
            0, left, accs, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe,
            read_state, mma_state, scales, k_tile, num_k_blocks, boundary,
        )
        return read_state

    @cute.jit
    def _ring_tail_from(
        self, case: int, left, accs, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe, read_state,
        mma_state, scales, k_tile, num_k_blocks, boundary,
    ):
        """`_ring_tail` for the dynamic `left`, as the chain if left == case … else … over the
        cases case .. D - 1, the last one unconditional: ptxas must see every path wait for
        the WGMMAs in flight, or it serialises them all. Returns the read state."""
        args = (promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe)
        if cutlass.const_expr(case == len(accs) - 1):
            read_state = self._ring_tail(
                accs, case, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary
            )
        else:
            if left == case:
                read_state = self._ring_tail(
                    accs, case, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary
                )
            else:
                read_state = self._ring_tail_from(
                    case + 1, left, accs, *args, read_state, mma_state, scales, k_tile, num_k_blocks, boundary,
                )
        return read_state

    @cute.jit
    def _ring_tail(
        self, accs, left: int, promoted, tCrA, tCrB, tCcC, sSFA, sSFB, rows, pipe, read_state,
        mma_state, scales, k_tile, num_k_blocks, boundary,
    ):
        """End of the accumulator ring with `left` (a constant) blocks still to issue: blocks
        k_tile .. k_tile + D - 2 are in flight in accs[0 .. D - 2]. Promotes the in-flight
        blocks, issuing the remaining ones into the accumulators they free, then promotes those.
        Returns the advanced read state (the caller must rebind it)."""
        depth = len(accs)
        # A tiled MMA and a pipeline state of this region: the caller runs it inside a dynamic
        # branch, and values set there must not be read after it (the next tail's branch).
        tiled_mma = self._make_tiled_mma()
        mma_state = mma_state.clone()
        for j in cutlass.range_constexpr(depth - 1):
            if cutlass.const_expr(j < left):
                mma_state = self._issue_ring_block(
                    tiled_mma, accs, (j + depth - 1) % depth, scales, k_tile + depth - 1 + j, tCrA,
                    tCrB, tCcC, sSFA, rows, pipe, mma_state, num_k_blocks,
                )
            # Groups issued after block k_tile + j: the in-flight ones behind it and the tail's.
            pending = (depth - 2 - j) + min(j + 1, left)
            read_state = self._promote_ring_slot(
                accs, j, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending
            )
        for i in cutlass.range_constexpr(left):
            read_state = self._promote_ring_slot(
                accs, (depth - 1 + i) % depth, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state,
                boundary, left - 1 - i,
            )
        return read_state

    @cute.jit
    def _issue_ring_block(
        self, tiled_mma, accs, slot: int, scales, k_tile, tCrA, tCrB, tCcC, sSFA, rows, pipe, mma_state,
        num_k_blocks, stage_ready=None,
    ):
        """Issue K block k_tile into accs[slot] and read its scales into the ring's slot: the SFB
        pair (global loads from `_sfb_rows`' rows) and this thread's two SFA rows from the stage,
        once it has arrived. Returns the advanced state (the caller must rebind it)."""
        scales[4 * slot], scales[4 * slot + 1] = self._row_sfb(rows, k_tile)
        stage = mma_state.index
        mma_state = self._issue_wave(
            tiled_mma, accs[slot], tCrA, tCrB, pipe, mma_state, num_k_blocks, 0, stage_ready
        )
        coords = tCcC[(None, 0, 0)]
        # m64nNk32 accumulator fragment: elements 0, 1 are on row r, elements 2, 3 on row r + 8.
        scales[4 * slot + 2] = sSFA[(coords[0][0], 0, stage)]
        scales[4 * slot + 3] = sSFA[(coords[2][0], 0, stage)]
        return mma_state

    @cute.jit
    def _promote_ring_slot(
        self, accs, slot: int, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending: int
    ):
        """Wait until at most `pending` WGMMA groups are in flight and promote accs[slot] with
        the scales of the ring's slot. Returns the state (the caller must rebind it)."""
        return self._wait_and_promote(
            accs[slot], promoted, tCcC, sSFA, sSFB, pipe, read_state, scales[4 * slot], scales[4 * slot + 1],
            boundary, 0, pending, sfa_rows=(scales[4 * slot + 2], scales[4 * slot + 3]),
        )

    @cute.jit
    def _promote_ring_slot_probing(
        self, accs, slot: int, scales, promoted, tCcC, sSFA, sSFB, pipe, read_state, boundary, pending: int,
        next_state, issued_k_tile, k_tile_cnt,
    ):
        """`_promote_ring_slot` that releases the stage and probes `next_state`'s (the next block
        to issue, issued_k_tile + 1) before the FFMAs. Returns (state, whether it has arrived)."""
        acc = accs[slot]
        p0, p1 = self._wave_scales(
            tCcC, sSFA, read_state, scales[4 * slot], scales[4 * slot + 1], 0,
            (scales[4 * slot + 2], scales[4 * slot + 3]),
        )
        warpgroup.wait_group(pending)
        read_state, ready = self._release_and_probe(pipe, read_state, next_state, issued_k_tile, k_tile_cnt)
        read_state = self._promote_wave(
            acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, 0, released=True
        )
        return read_state, ready

    @cute.jit
    def _sfb_rows(self, mSFB, nb0, nb1, group):
        """The tile's SFB rows over K (scale blocks nb0 and nb1, of `group` in the grouped
        layouts); None when SFB is per row (those scales come from the stage)."""
        rows = None
        if cutlass.const_expr(not self.schedule.op.scales_b_per_row):
            if cutlass.const_expr(self.schedule.op.is_m_grouped):
                rows = (mSFB[(nb0, None, group)], mSFB[(nb1, None, group)])
            else:
                rows = (mSFB[(nb0, None)], mSFB[(nb1, None)])
        return rows

    @cute.jit
    def _row_sfb(self, rows, k_tile):
        """(sfb of nb0, of nb1) of K block k_tile from `_sfb_rows`; 1.0 when SFB is per row."""
        sfb0 = cutlass.Float32(1.0)
        sfb1 = sfb0
        if cutlass.const_expr(rows is not None):
            sfb0 = rows[0][k_tile]
            sfb1 = sfb0
            if cutlass.const_expr(not self.single_sfb_block):
                sfb1 = rows[1][k_tile]
        return sfb0, sfb1

    @cute.jit
    def _chunk_sfb(self, chunk0, chunk1, in_chunk):
        """(sfb0, sfb1) of the block `in_chunk` of the current chunk: lane in_chunk's values."""
        sfb0 = chunk0
        sfb1 = chunk1
        if cutlass.const_expr(not self.schedule.op.scales_b_per_row):
            sfb0 = cute.arch.shuffle_sync(chunk0, in_chunk)
            sfb1 = sfb0
            if cutlass.const_expr(not self.single_sfb_block):
                sfb1 = cute.arch.shuffle_sync(chunk1, in_chunk)
        return sfb0, sfb1

    @cute.jit
    def _lane_sfb(self, rows, first, k_tile_cnt):
        """(sfb of nb0, of nb1) in lane i for K block first + i, clamped into the tile's blocks
        0 .. k_tile_cnt - 1 (a tile of no blocks, e.g. a contiguous padding tile, reads block 0
        of its clamped group, never before the row)."""
        lane = cute.arch.lane_idx()
        return self._row_sfb(rows, cutlass.max(cutlass.min(first + lane, k_tile_cnt - 1), 0))

    def _wave_rc(self, wave: int) -> tuple[int, int]:
        """(row block, column block) of wave `wave` in a math warpgroup's accumulator fragment."""
        if self.schedule.column_waves > 1:
            return 0, wave
        return wave, 0

    @cute.jit
    def _issue_wave(
        self, tiled_mma, acc, tCrA, tCrB, pipe, mma_state, num_k_blocks, wave: int, stage_ready=None
    ):
        """Issue the WGMMAs of one wave (this warpgroup's 64 rows of row block `wave`, or its
        rows' column block `wave` with column waves) of the stage of `mma_state` into `acc`
        (from zero) as one commit group. The first wave waits for the stage (unless
        `stage_ready`, a try-wait's result, says it has arrived); the last advances the state,
        which is returned."""
        if cutlass.const_expr(wave == 0):
            pipe.consumer_wait(mma_state, stage_ready)
        warpgroup.fence()
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        row, col = self._wave_rc(wave)
        for kb in cutlass.range_constexpr(num_k_blocks):
            # (V, 1) x (V, 1) -> (V, 1, 1): this wave's rows (A's row block `row`) and columns
            # (B's column block `col`). The WGMMA atom spans one wave's columns: the tile's N, or
            # a column wave's, so B has one column block per column wave.
            a_frag = cute.append_ones(tCrA[(None, row, kb, mma_state.index)], 2)
            b_frag = cute.append_ones(tCrB[(None, col, kb, mma_state.index)], 2)
            cute.gemm(tiled_mma, acc, a_frag, b_frag, acc)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        if cutlass.const_expr(wave == self.schedule.all_waves - 1):
            mma_state.advance()
        return mma_state

    @cute.jit
    def _wait_and_promote(
        self, acc, promoted, tCcC, sSFA, sSFB, pipe, read_state, sfb0, sfb1, boundary, wave: int, pending: int,
        sfa_rows=None,
    ):
        """Right after issuing WGMMAs: form the scales of the block of `read_state` (its SFA read
        from the stage, or `sfa_rows` when already read), wait until at most `pending` WGMMA
        batches are in flight (so `acc` is complete), and promote it. Returns the state (the
        caller must rebind it)."""
        p0, p1 = self._wave_scales(tCcC, sSFA, read_state, sfb0, sfb1, wave, sfa_rows)
        warpgroup.wait_group(pending)
        return self._promote_wave(acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave)

    @cute.jit
    def _wave_scales(self, tCcC, sSFA, state, sfb0, sfb1, wave: int, sfa_rows=None):
        """(p0, p1): per accumulator element of this thread in `wave`, sfa[row] · sfb0 and
        sfa[row] · sfb1 for the block of `state`'s stage (sfa alone, twice, when SFB is per row).

        Called between issuing a wave's WGMMAs and waiting for them, so the shared-memory loads
        and the products complete behind the tensor cores instead of delaying the promotion
        (Nsight Compute on the 256x128 tile: the promotion's first multiply stalled on these
        loads). A thread's elements cover two rows, so the loads and products are per row, not
        per element (the compiler merges the repeats). `sfa_rows`: the two rows' SFA, already
        read (the accumulator ring reads them when it issues the block)."""
        coords = tCcC[(None, *self._wave_rc(wave))]
        p0 = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        p1 = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(coords)):
            if cutlass.const_expr(sfa_rows is None):
                sfa = sSFA[(coords[i][0], 0, state.index)]
            else:
                # Read ahead by the accumulator ring: row r for elements 0, 1 (mod 4), r + 8 else.
                sfa = sfa_rows[(i // 2) % 2]
            if cutlass.const_expr(self.schedule.op.scales_b_per_row):
                p0[i] = sfa
            else:
                # _opaque: formed here, once per row; without it the compiler sinks the
                # products below the per-element block choice in `_promote_wave`.
                p0[i] = _opaque(sfa * sfb0)
                if cutlass.const_expr(not self.single_sfb_block):
                    p1[i] = _opaque(sfa * sfb1)
        return p0, p1

    @cute.jit
    def _stage_sfb_columns(self, tCcC, sSFB, state, wave: int):
        """This thread's per-column SFB of wave `wave`, read from the stage of `state` (one per
        accumulator element; elements of one column share their load)."""
        coords = tCcC[(None, *self._wave_rc(wave))]
        sfb_col = cute.make_rmem_tensor(cute.size(coords), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(coords)):
            sfb_col[i] = sSFB[(coords[i][1], 0, state.index)]
        return sfb_col

    @cute.jit
    def _promote_wave(
        self, acc, promoted, tCcC, sSFB, pipe, read_state, p0, p1, boundary, wave: int, released=False,
        sfb_col=None,
    ):
        """promoted[wave] += acc · scale for the completed wave of the block of `read_state`, with
        the scales of `_wave_scales` (times each column's SFB when SFB is per row: `sfb_col` when
        the caller read it earlier, else read from the stage here); after the last wave the stage
        is handed back to the producer and the state advanced, unless the caller has done so
        (`released`). Returns the state."""
        row, col = self._wave_rc(wave)
        promoted_w = promoted[(None, row, col)]
        # A column wave's elements start at its first column of the tile.
        wave_col0 = col * self.schedule.wave_columns
        if cutlass.const_expr(self.schedule.op.scales_b_per_row and sfb_col is None):
            # One scale per column (row of B); identical columns share one load. Read after the
            # wait: two-wave tiles have no room to hold a thread's 32 column scales across it.
            sfb_col = self._stage_sfb_columns(tCcC, sSFB, read_state, wave)
        if cutlass.const_expr(wave == self.schedule.all_waves - 1 and not released):
            pipe.consumer_release(read_state)
            read_state.advance()
        # WGMMA accumulator layout (PTX ISA, m64nNk32 D fragment): element i of a thread is column
        # c0 + 8*(i//4) + i%2 with c0 = coords[0] even and < 8; the SFB boundary is a multiple of
        # 16, so element i lies before it exactly when its 8-column chunk does: 8*(i//4) <
        # boundary, which `_block_scaled_tile` makes a compile-time constant.
        if cutlass.const_expr(not self.single_sfb_block and not self.schedule.op.scales_b_per_row):
            assert isinstance(boundary, int), "two-block tiles promote with a constant boundary"
        for i in cutlass.range_constexpr(cute.size(acc)):
            scale = p0[i]
            if cutlass.const_expr(self.schedule.op.scales_b_per_row):
                scale = p0[i] * sfb_col[i]
            elif cutlass.const_expr(not self.single_sfb_block):
                scale = p0[i] if cutlass.const_expr(wave_col0 + 8 * (i // 4) < boundary) else p1[i]
            promoted_w[i] = promoted_w[i] + acc[i] * scale
        return read_state
