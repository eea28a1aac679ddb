"""The Hopper GEMM's SwiGLU epilogue stage: SiLU(gate) · up from the tile's fp32 sum, quantized per token
and 1x128 block to e4m3 with fp32 scales, stored from registers; and the entry points of its three ops.

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
from cutlass import Float32, Int32

from cutegen.schedules.spec import OutputScale
from cutegen.templates.fp32_silu import silu_in_place
from cutegen.templates.hopper_quant import E4M3_NAN_WORD, INF_BITS, _abs_bits_max, _scale_from_amax

# A row's 128 activations lie with the four threads of a WGMMA accumulator quad (lanes 4k..4k+3):
# the row's amax is reduced over them with xor-shuffles 1 and 2.
QUAD_SHUFFLES = (1, 2)
# Values of one row slot in a thread's accumulator fragment ((2, 2, N/8) per WGMMA): element i
# lies in row slot (i // 2) % 2 (rows r and r + 8).
ROW_SLOTS = 2


class HopperSwiGLUEpilogue:
    """The epilogue stage of the math role for `Activation.SWIGLU`: the tile's two column waves hold
    gate (wave 0) and up (wave 1) of the same 128 activation columns."""

    @cute.jit
    def _store_swiglu_tile(self, promoted, tCcC, mD, mDSF, tile_m, tile_n, group, write_tile, eps):
        """SiLU(gate) · up of this thread's rows, quantized per row and stored with its scale (one
        per row and tile: the quad's first lane writes it). Rows past D's and tiles past its
        columns are not written; `write_tile` 0 writes nothing."""
        half = cute.size(promoted) // 2
        # Gate in column wave 0, up in wave 1, one row wave: element i + half is element i's up.
        assert cute.size(promoted, mode=[2]) == 2 and cute.size(promoted, mode=[1]) == 1
        silu_in_place(promoted, 0, half)
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
        row0 = tile_m * self.tile_shape_mnk[0]
        col0 = tile_n * (self.tile_shape_mnk[1] // 2)
        # A cluster's tile past N (I is whole tiles: all of a tile's columns or none) writes nothing.
        write_tile = write_tile * (col0 < mD.shape[1])
        d_tile = mD
        sf_tile = mDSF
        if cutlass.const_expr(self.schedule.op.is_masked):
            d_tile = mD[(None, None, group)]
            sf_tile = mDSF[(None, None, group)]
        lane = cute.arch.lane_idx()
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
                row = row0 + tCcC[i][0]
                col = col0 + tCcC[i][1]
                if (write_tile != 0) & (row < rows):
                    cute.autovec_copy(pair, cute.local_tile(d_tile, (1, 2), (row, col // 2))[0, None])
            row = row0 + tCcC[2 * slot][0]
            if (write_tile != 0) & (row < rows) & (lane % 4 == 0):
                sf_tile[row, tile_n] = s


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
