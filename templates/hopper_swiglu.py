"""The Hopper GEMM's SwiGLU epilogue stage (SiLU(gate) · up quantized per token to e4m3, its rows bulk-copied to D) and the entry points of its three ops.

The tile's fp32 sums become SiLU(gate) · up, quantized per token and 1x128 block with fp32
scales; the e4m3 rows are staged in shared memory and each copied to D by one bulk copy.

Importing this module imports the CuTe DSL; only the generator does that.

Numerics (the executable specification is `cutegen.runtime.fused_reference`): for an output row r
and activation column j of a tile, with g and u its gate and up sums (fp32, promoted exactly as
the plain GEMM promotes them):

* ``a = g / (1 + exp(-g)) · u`` in fp32 (``exp`` the accurate single-precision exponential, the
  IEEE division: `cutegen.templates.fp32_silu`), as ``torch.nn.functional.silu(g) * u`` computes
  it on the GPU;
* the 128 activations of the row are one group of the per-token quantizer
  (`cutegen.templates.hopper_quant`): the amax on the bit patterns, ``s = max(amax, eps) / 448``
  (rounded up to a power of two for `OutputScale.UE8M0`), ``q = cvt.rn.satfinite.e4m3(a · (1 / s))``;
  a non-finite group writes the NaN scale and 0x7F bytes.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from cutegen.schedules.spec import THREADS_PER_WARPGROUP, OutputScale
from cutegen.templates.fp32_silu import silu_in_place
from cutegen.templates.hopper_quant import E4M3_NAN_WORD, INF_BITS, _abs_bits_max, _scale_from_amax

# A row's 128 activations lie with the four threads of a WGMMA accumulator quad (lanes 4k..4k+3):
# the row's amax is reduced over them with xor-shuffles 1 and 2.
QUAD_SHUFFLES = (1, 2)
# Values of one row slot in a thread's accumulator fragment ((2, 2, N/8) per WGMMA): element i
# lies in row slot (i // 2) % 2 (rows r and r + 8).
ROW_SLOTS = 2


@dsl_user_op
def _bulk_copy_to_global(dst: Int64, src: Int32, size: int, *, loc=None, ip=None) -> None:
    """`size` bytes from shared memory at `src` to global memory at `dst` (both 16-byte aligned),
    asynchronously, in this thread's current bulk group."""
    llvm.inline_asm(
        None,
        [Int64(dst).ir_value(loc=loc, ip=ip), Int32(src).ir_value(loc=loc, ip=ip)],
        f"cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], {size};",
        "l,r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
    )


class HopperSwiGLUEpilogue:
    """The epilogue stage of the math role for `Activation.SWIGLU`: the tile's two column waves hold
    gate (wave 0) and up (wave 1) of the same 128 activation columns."""

    @cute.jit
    def _store_swiglu_tile(
        self, promoted, tCcC, mD, mDSF, sRows, barrier, tidx, tile_m, tile_n, group, write_tile, eps,
    ):
        """SiLU(gate) · up of this thread's rows, quantized per row: the e4m3 values staged in
        `sRows` (one row of the tile each), then each row copied to D by one bulk copy from one
        math thread, and the scales stored from registers (one per row and tile: the quad's
        first lane writes it). Rows past D's and tiles past its columns are not written;
        `write_tile` 0 writes nothing (the barriers still run)."""
        half = cute.size(promoted) // 2
        # Gate in column wave 0, up in wave 1, one row wave: element i + half is element i's up.
        assert cute.size(promoted, mode=[2]) == 2 and cute.size(promoted, mode=[1]) == 1
        silu_in_place(promoted, half)  # the gate wave
        act = cute.make_rmem_tensor(half, Float32)
        for i in cutlass.range_constexpr(half):
            act[i] = promoted[i] * promoted[i + half]
        # Per row slot: the amax over this thread's values, then over its quad.
        amax = [Int32(0)] * ROW_SLOTS
        for i in cutlass.range_constexpr(half):
            slot = (i // 2) % ROW_SLOTS
            amax[slot] = _abs_bits_max(amax[slot], act[i])
        for slot in cutlass.range_constexpr(ROW_SLOTS):
            for offset in QUAD_SHUFFLES:
                amax[slot] = cutlass.max(amax[slot], cute.arch.shuffle_sync_bfly(amax[slot], offset=offset))
        rows = mD.shape[0]
        tile_rows = self.tile_shape_mnk[0]
        row0 = tile_m * tile_rows
        col0 = tile_n * (self.tile_shape_mnk[1] // 2)
        # A cluster's tile past N (I is whole tiles: all of a tile's columns or none) writes nothing.
        write_tile = write_tile * (col0 < mD.shape[1])
        d_tile = mD
        sf_tile = mDSF
        if cutlass.const_expr(self.schedule.op.is_masked):
            d_tile = mD[(None, None, group)]
            sf_tile = mDSF[(None, None, group)]
        lane = cute.arch.lane_idx()
        # The math thread that copies row `copier` of the tile.
        copier = tidx - THREADS_PER_WARPGROUP
        # The previous tile's copies have read the staged rows before they are written again.
        self._quantized_rows_copied(tidx)
        barrier.arrive_and_wait()
        for slot in cutlass.range_constexpr(ROW_SLOTS):
            s = _scale_from_amax(amax[slot], eps, self.schedule.d_scale == OutputScale.UE8M0)
            inv = Float32(1.0) / s
            # Elements 4j + 2·slot and 4j + 2·slot + 1: adjacent columns of one row.
            for j in cutlass.range_constexpr(half // 4):
                i = 4 * j + 2 * slot
                pair = cute.make_rmem_tensor(2, cutlass.Float8E4M3FN)
                values = cute.make_rmem_tensor(2, Float32)
                values[0] = act[i]
                values[1] = act[i + 1]
                pair.store((values.load() * inv).to(cutlass.Float8E4M3FN))
                if amax[slot] >= INF_BITS:
                    cute.recast_tensor(pair, cutlass.Int16)[0] = cutlass.Int16(E4M3_NAN_WORD & 0xFFFF)
                cute.autovec_copy(pair, cute.local_tile(sRows, (1, 2), (tCcC[i][0], tCcC[i][1] // 2))[0, None])
            row = row0 + tCcC[2 * slot][0]
            if (write_tile != 0) & (row < rows) & (lane % 4 == 0):
                sf_tile[row, tile_n] = s
        # The staged rows visible to the bulk copies (the async proxy), then one copy per row.
        cute.arch.fence_proxy("async.shared", space="cta")
        barrier.arrive_and_wait()
        row = row0 + copier
        if (copier < tile_rows) & (write_tile != 0) & (row < rows):
            row_bytes = self.tile_shape_mnk[1] // 2
            dst = cute.local_tile(d_tile, (1, row_bytes), (row, tile_n)).iterator.toint()
            src = cute.local_tile(sRows, (1, row_bytes), (copier, 0)).iterator.toint()
            _bulk_copy_to_global(dst, src, row_bytes)
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _quantized_rows_copied(self, tidx):
        """This thread's row copies so far have read shared memory (before the rows are written
        again, and before the CTA exits)."""
        if tidx - THREADS_PER_WARPGROUP < self.tile_shape_mnk[0]:
            cute.arch.cp_async_bulk_wait_group(0, read=True)


class Fp8GemmNtSwiGLUQuantEntry:
    """`fp8_gemm_nt_swiglu_quant`: D, sf_d = per-token quantized SiLU(gate) · up of
    (A · sfa) · (B · sfb)ᵀ, B's gate and up rows interleaved in 128-row blocks."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        d_sf: cute.Tensor,
        eps: cutlass.Float32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, d_sf=d_sf, eps=eps)


class MGroupedContiguousSwiGLUQuantEntry:
    """`m_grouped_fp8_gemm_nt_contiguous_swiglu_quant`: per row r of A with group g = m_indices[r],
    the SwiGLU activations of (A[r] · sfa[r]) · (B[g] · sfb[g])ᵀ quantized per token; padding rows
    (g = -1) are written as zeros (scale eps/448) unless zero_padding is 0."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        d_sf: cute.Tensor,
        m_indices: cute.Pointer,
        zero_padding: cutlass.Int32,
        eps: cutlass.Float32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, sfa, sfb, max_active_clusters, stream, m_indices, zero_padding, d_sf=d_sf, eps=eps
        )


class MGroupedMaskedSwiGLUQuantEntry:
    """`m_grouped_fp8_gemm_nt_masked_swiglu_quant`: for every group g and row r < masked_m[g], the
    SwiGLU activations of (A[g, r] · sfa[g, r]) · (B[g] · sfb[g])ᵀ quantized per token."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        d_sf: cute.Tensor,
        masked_m: cute.Pointer,
        eps: cutlass.Float32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, masked_m=masked_m, d_sf=d_sf, eps=eps)
