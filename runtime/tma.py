"""TMA descriptor encoding: `TmaArgs` (computed in `params.py`) to the 128 bytes of a CUtensorMap.

``cuTensorMapEncodeTiled`` is a host-only driver call (no GPU work, no stream), but it needs the
driver library and a device of compute capability 9.0 or above. Results are cached by the full
argument tuple (address, dims, strides, box, recipe), so a call with the same tensors re-encodes
nothing.
"""

from __future__ import annotations

import ctypes
import functools

from .driver import check, cu
from .params import TMA_DESCRIPTOR_BYTES, TMA_FP4_PACKED, TmaArgs


def _enum_tables() -> tuple[dict, dict, dict, dict, dict]:
    dt = cu.CUtensorMapDataType
    dtypes = {
        "bf16": dt.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "f16": dt.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "f32": dt.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        "f64": dt.CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        "tf32": dt.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        "e4m3": dt.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        "e5m2": dt.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        # FP4, unpacked to a byte per element in shared memory (what kind::mxf8f6f4 reads).
        "e2m1": dt.CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B,
        # FP4 packed two per byte in shared memory too (NVFP4's operands).
        TMA_FP4_PACKED: dt.CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B,
        "u8": dt.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        "i8": dt.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        "u16": dt.CU_TENSOR_MAP_DATA_TYPE_UINT16,
        "i32": dt.CU_TENSOR_MAP_DATA_TYPE_INT32,
        "u32": dt.CU_TENSOR_MAP_DATA_TYPE_UINT32,
        "i64": dt.CU_TENSOR_MAP_DATA_TYPE_INT64,
        "u64": dt.CU_TENSOR_MAP_DATA_TYPE_UINT64,
    }
    sw = cu.CUtensorMapSwizzle
    swizzles = {
        "none": sw.CU_TENSOR_MAP_SWIZZLE_NONE,
        "32B": sw.CU_TENSOR_MAP_SWIZZLE_32B,
        "64B": sw.CU_TENSOR_MAP_SWIZZLE_64B,
        "128B": sw.CU_TENSOR_MAP_SWIZZLE_128B,
    }
    l2 = cu.CUtensorMapL2promotion
    promotions = {
        "none": l2.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        "64B": l2.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        "128B": l2.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        "256B": l2.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    }
    oob = cu.CUtensorMapFloatOOBfill
    fills = {
        "none": oob.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        "nan_request_zero_fma": oob.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
    }
    il = cu.CUtensorMapInterleave
    interleaves = {
        "none": il.CU_TENSOR_MAP_INTERLEAVE_NONE,
        "16B": il.CU_TENSOR_MAP_INTERLEAVE_16B,
        "32B": il.CU_TENSOR_MAP_INTERLEAVE_32B,
    }
    return dtypes, swizzles, promotions, fills, interleaves


_TABLES: tuple[dict, dict, dict, dict, dict] | None = None


def _tables() -> tuple[dict, dict, dict, dict, dict]:
    global _TABLES
    if _TABLES is None:
        _TABLES = _enum_tables()
    return _TABLES


def tensor_map_bytes(tensor_map: object) -> bytes:
    """The 128 raw bytes of a ``cuda.bindings.driver.CUtensorMap``."""
    return ctypes.string_at(tensor_map.getPtr(), TMA_DESCRIPTOR_BYTES)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=4096)
def encode_tiled(args: TmaArgs) -> bytes:
    """Encode ``args`` with ``cuTensorMapEncodeTiled``; returns the descriptor's 128 bytes."""
    dtypes, swizzles, promotions, fills, interleaves = _tables()
    result = cu.cuTensorMapEncodeTiled(
        dtypes[args.dtype],
        args.rank,
        args.global_address,
        [cu.cuuint64_t(d) for d in args.global_dims],
        [cu.cuuint64_t(s) for s in args.global_strides],
        [cu.cuuint32_t(b) for b in args.box],
        [cu.cuuint32_t(e) for e in args.element_strides],
        interleaves[args.interleave],
        swizzles[args.swizzle],
        promotions[args.l2_promotion],
        fills[args.oob_fill],
    )
    tensor_map = check(result, "cuTensorMapEncodeTiled", detail=repr(args))
    return tensor_map_bytes(tensor_map)


def clear_cache() -> None:
    encode_tiled.cache_clear()


__all__ = ["clear_cache", "encode_tiled", "tensor_map_bytes"]
