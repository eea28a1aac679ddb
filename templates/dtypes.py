"""The one mapping from the schedule vocabulary's element types to CuTe DSL numeric types."""

from __future__ import annotations

import cutlass

from cutegen.schedules.spec import DType

_CUTE_DTYPES = {
    DType.BF16: cutlass.BFloat16,
    DType.F16: cutlass.Float16,
    DType.F32: cutlass.Float32,
    DType.E4M3: cutlass.Float8E4M3FN,
    DType.E2M1: cutlass.Float4E2M1FN,
}


def cute_dtype(dtype: DType):
    return _CUTE_DTYPES[dtype]
