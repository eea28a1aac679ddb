"""SiLU in fp32 exactly as torch computes it on the GPU, x / (1 + exp(-x)) with an IEEE division, without a branch per element.

Importing this module imports the CuTe DSL; only the generator does that.

``div.rn.f32`` compiles to a reciprocal, two Newton steps and a range check (FCHK) guarding a
called slow path; the call makes every division its own branch region, so a tile's divisions run
one after another. Here every element takes the same fast sequence as straight-line code, and the
rare elements outside the range where that sequence is exact (tiny, huge or non-finite x, or
1 + exp(-x) past 2^64) take the IEEE division afterwards: the result is the same bits.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cutegen.templates.fast_division import (
    ABS_MASK, HIGHEST_DIVIDEND_BITS, HIGHEST_DIVISOR, LOWEST_DIVIDEND_BITS, div_fast_ptx,
)

# Elements per straight-line pass: one bit each in a 32-bit word of the ones left to the IEEE division.
CHUNK = 32


def _mask_bit(k: int) -> int:
    """Bit k of a signed 32-bit word."""
    bit = 1 << k
    return bit - (1 << 32) if k == 31 else bit


@dsl_user_op
def _div_fast_sequence(x: Float32, d: Float32, *, loc=None, ip=None) -> Float32:
    """x / d by the reciprocal and Newton sequence ``div.rn.f32`` takes when FCHK passes."""
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(x).ir_value(loc=loc, ip=ip), Float32(d).ir_value(loc=loc, ip=ip)],
            div_fast_ptx("$0", "$1", "$2"),
            "=f,f,f",
            has_side_effects=False,
            is_align_stack=False,
        )
    )


@cute.jit
def _fast_division_exact(x: Float32, d: Float32) -> cutlass.Boolean:
    """Whether `_div_fast_sequence(x, d)` is the IEEE quotient (bar the sign of a zero x)."""
    ax = x.bitcast(Int32) & ABS_MASK
    in_range = (ax >= LOWEST_DIVIDEND_BITS) & (ax <= HIGHEST_DIVIDEND_BITS) & (d <= Float32(HIGHEST_DIVISOR))
    # d = 1 + exp(-x) is at least 1 here, the sequence's lowest divisor.
    return (ax == 0) | in_range


@cute.jit
def silu_in_place(frag: cute.Tensor, count: cutlass.Constexpr[int]):
    """frag[i] <- frag[i] / (1 + exp(-frag[i])) for i < count, bit for bit the IEEE expression: per
    chunk of 32 elements (few enough to keep the math warps' registers), the common ones as one
    straight-line pass, then the rare ones the fast sequence cannot take."""
    for chunk in cutlass.range_constexpr(0, count, CHUNK):
        size = min(CHUNK, count - chunk)
        slow = Int32(0)
        for k in cutlass.range_constexpr(size):
            x = frag[chunk + k]
            d = Float32(1.0) + cute.math.exp(-x)
            q = _div_fast_sequence(x, d)
            exact = _fast_division_exact(x, d)
            # ±0 / d is x itself (the sequence would lose a negative zero's sign).
            frag[chunk + k] = (x if x == Float32(0.0) else q) if exact else x
            slow = slow | (Int32(0) if exact else Int32(_mask_bit(k)))
        if slow != 0:
            for k in cutlass.range_constexpr(size):
                if (slow >> k) & 1 != 0:
                    x = frag[chunk + k]
                    frag[chunk + k] = x / (Float32(1.0) + cute.math.exp(-x))
