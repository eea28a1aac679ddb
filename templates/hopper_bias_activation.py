"""The Hopper GEMM's fused bias and elementwise activation: applied to the tile's fp32 sum in registers before the plain epilogue stores it; and the entry points of the dense GEMMs that take a bias.

Importing this module imports the CuTe DSL; only the generator does that.

Numerics (the executable specification is `cutegen.runtime.fused_reference.bias_activation_ref`):
for an element of the sum x (fp32, as the plain GEMM would store it) in column n,

* ``x + bias[n]``, the bias read in D's type and widened to fp32 (`Bias.COLUMN`);
* SiLU ``x / (1 + exp(-x))`` or GELU ``0.5 · x · (1 + erf(x · √½))`` in fp32 (`Activation`);
* then the plain epilogue's conversion to D's type (round to nearest even).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from cutegen.schedules.spec import Activation
from cutegen.templates.fp32_silu import silu_in_place

SQRT_HALF = 0.7071067811865476


class HopperBiasActivationEpilogue:
    """The epilogue stage of the math role for `Schedule.transforms_sum`: bias, then activation,
    in place on the tile's sum (the next tile's main loop starts its sum afresh)."""

    @cute.jit
    def _bias_and_activation(self, promoted, tCcC, mBias, tile_n):
        """Every element of this thread's part of the sum: plus its column's bias, through the
        activation. Columns past D's (a tile over N's edge) read the last column's bias: the TMA
        store clips them."""
        col0 = tile_n * self.tile_shape_mnk[1]
        for i in cutlass.range_constexpr(cute.size(promoted)):
            x = promoted[i]
            if cutlass.const_expr(self.schedule.adds_bias):
                col = cutlass.min(col0 + tCcC[i][1], mBias.shape[0] - 1)
                x = x + Float32(mBias[col])
            if cutlass.const_expr(self.schedule.activation == Activation.GELU):
                x = Float32(0.5) * x * (Float32(1.0) + cute.math.erf(x * Float32(SQRT_HALF)))
            promoted[i] = x
        if cutlass.const_expr(self.schedule.activation == Activation.SILU):
            silu_in_place(promoted, cute.size(promoted))


class Fp8GemmNtBiasEntry:
    """`fp8_gemm_nt_bias[_silu|_gelu]`: D = act((A · sfa) · (B · sfb)ᵀ + bias), bias [N] in D's type."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        bias: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, bias=bias)


class Bf16GemmNtBiasEntry:
    """`bf16_gemm_nt_bias[_silu|_gelu]`: D = act(A · Bᵀ + bias), bias [N] in D's type."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        bias: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, None, None, max_active_clusters, stream, bias=bias)
