"""The fast path of the IEEE fp32 division as PTX, and the operands for which it is the IEEE quotient: shared by the SiLU epilogue and its GPU check (imports no CuTe DSL)."""

from __future__ import annotations

ABS_MASK = 0x7FFFFFFF
# |x| in [2^-40, 2^64] (or zero) and a divisor d in [1, 2^64]: no step under- or overflows (the
# quotient is at least 2^-104), so the remainder's FMA is exact and the correction rounds to the
# IEEE quotient; tests/gpu/test_fast_division.py checks the bits against `div.rn.f32` there.
LOWEST_DIVIDEND_BITS = (127 - 40) << 23
HIGHEST_DIVIDEND_BITS = (127 + 64) << 23
LOWEST_DIVISOR = 1.0
HIGHEST_DIVISOR = float(2**64)


def div_fast_ptx(out: str, x: str, d: str) -> str:
    """A PTX block writing x / d to `out` by the reciprocal, Newton and remainder steps that
    `div.rn.f32` compiles to when its check passes (a zero x comes out +0)."""
    return (
        "{\n.reg .f32 nd, r, e, q, rem;\n"
        f"neg.f32 nd, {d};\n"
        f"rcp.approx.ftz.f32 r, {d};\n"
        "fma.rn.f32 e, nd, r, 0f3F800000;\n"
        "fma.rn.f32 r, r, e, r;\n"
        f"fma.rn.f32 q, {x}, r, 0f00000000;\n"
        f"fma.rn.f32 rem, nd, q, {x};\n"
        f"fma.rn.f32 {out}, rem, r, q;\n}}"
    )
