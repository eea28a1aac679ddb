"""128-bit global-memory accesses for the CuTe DSL kernel templates.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

VEC_BYTES = 16  # one 128-bit access


def vec16_at(dtype, base: Int64, offset_bytes: Int64) -> cute.Tensor:
    """The 16 bytes of global memory at ``base + offset_bytes`` (both 16-byte aligned) as a
    tensor of `dtype`: one 128-bit access."""
    return cute.make_tensor(
        cute.make_ptr(
            dtype,
            base + cute.assume(offset_bytes, divby=VEC_BYTES),
            cute.AddressSpace.gmem,
            assumed_align=VEC_BYTES,
        ),
        cute.make_layout(VEC_BYTES * 8 // dtype.width),
    )
