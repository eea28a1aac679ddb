"""Decode (and encode) the 128-byte Hopper TMA descriptor (``CUtensorMap``), tiled mode.

The bit layout below was measured, not taken from any NVIDIA source:

* by encoding known tensors through the CuTe DSL 4.8.1 host code (``make_tiled_tma_atom``;
  the DSL bit-packs descriptors itself) and diffing the captured bytes
  (see :mod:`abi_probe`), and
* by calling the real ``cuTensorMapEncodeTiled`` (driver 580.159.04 / CUDA 13.0, H200)
  on the same inputs plus inputs the DSL never produces (L2 promotion, OOB fill,
  interleave, element strides, 40-bit strides, 2^32 extents).

Bit offsets are in the little-endian 1024-bit descriptor (byte ``b`` bit ``i`` is bit
``8*b + i``):

====================  =========  =====================================================
field                 bits       encoding
====================  =========  =====================================================
global address        0..63      byte address (the driver requires 16 B alignment)
(flags, low)          64..67     0 from the driver; the DSL writes 0b0010 (bit 65)
rank                  68..70     rank - 1
data type             71..74     hardware format: U8 0, U16 1, U32 2, S32 3, U64 4,
                                 S64 5, F16 6, F32 7, F32_FTZ 8, F64 9, BF16 10
interleave            75..76     0 none, 1 16B, 2 32B (CUtensorMapInterleave)
swizzle               77..78     0 none, 1 32B, 2 64B, 3 128B (CUtensorMapSwizzle)
OOB fill              79         1 = NAN_REQUEST_ZERO_FMA
TF32                  80         1 for TFLOAT32 (format F32) / TFLOAT32_FTZ (F32_FTZ)
L2 promotion          81..82     0 none, 1 64B, 2 128B, 3 256B (the DSL always uses 2)
(flags, high)         83..95     0 from the driver; the DSL sets bit 85 when rank >= 2
global stride i       96..127    stride[i] >> 4, low 32 bits, i = 1 (stride of dim 1)
  (i = 1..4)          128..223   ... dims 2, 3, 4 at bytes 16, 20, 24
stride high nibbles   224..239   bits 32..35 of (stride[i] >> 4), 4 bits each, i = 1..4
global dim i          256..415   dim[i] - 1, u32 each at bytes 32 + 4 i (i = 0..4)
element stride i      416..430   elementStride[i] - 1, 3 bits each
box dim i             440..479   boxDim[i] - 1, u8 each at bytes 55 + i
(driver-derived)      512..1023  the driver writes derived values here (e.g. bytes 64..71
                                 = bytes of one box); the DSL leaves bytes 64..127
                                 unwritten (uninitialised stack in the launch params)
====================  =========  =====================================================

Global strides are in bytes and must be multiples of 16; there are ``rank - 1`` of them
(dim 0 is contiguous).  Entries past ``rank`` are zero.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

__all__ = [
    "HW_FORMATS",
    "CU_DTYPE_TO_HW",
    "decode_tensor_map",
    "encode_tensor_map",
    "tensor_map_semantic_diff",
    "DSL_FLAG_BITS",
]

# hardware format code -> (name, element bytes)
HW_FORMATS: dict[int, tuple[str, int]] = {
    0: ("U8", 1),
    1: ("U16", 2),
    2: ("U32", 4),
    3: ("S32", 4),
    4: ("U64", 8),
    5: ("S64", 8),
    6: ("F16", 2),
    7: ("F32", 4),
    8: ("F32_FTZ", 4),
    9: ("F64", 8),
    10: ("BF16", 2),
    11: ("16U4_ALIGN8B", 0),  # FP4 packed: sixteen 4-bit elements per 8 bytes in shared memory too
    12: ("16U4_ALIGN16B", 0),  # FP4, sixteen 4-bit elements per 16-byte shared-memory chunk
}

# CUtensorMapDataType -> (hardware format, tf32 bit)   (measured against the driver)
CU_DTYPE_TO_HW: dict[int, tuple[int, int]] = {
    0: (0, 0),  # UINT8
    1: (1, 0),  # UINT16
    2: (2, 0),  # UINT32
    3: (3, 0),  # INT32
    4: (4, 0),  # UINT64
    5: (5, 0),  # INT64
    6: (6, 0),  # FLOAT16
    7: (7, 0),  # FLOAT32
    8: (9, 0),  # FLOAT64
    9: (10, 0),  # BFLOAT16
    10: (8, 0),  # FLOAT32_FTZ
    11: (7, 1),  # TFLOAT32
    12: (8, 1),  # TFLOAT32_FTZ
    # 16U4_ALIGN16B: the code the CuTe DSL's own encoder writes (its dims in elements, strides in
    # bytes); not yet measured against a driver.
    13: (11, 0),  # 16U4_ALIGN8B, likewise the DSL's code
    14: (12, 0),
}
_CU_NAMES = {
    0: "UINT8", 1: "UINT16", 2: "UINT32", 3: "INT32", 4: "UINT64", 5: "INT64", 6: "FLOAT16",
    7: "FLOAT32", 8: "FLOAT64", 9: "BFLOAT16", 10: "FLOAT32_FTZ", 11: "TFLOAT32", 12: "TFLOAT32_FTZ",
    13: "16U4_ALIGN8B", 14: "16U4_ALIGN16B",
}
_HW_TO_CU = {v: k for k, v in CU_DTYPE_TO_HW.items()}

_SWIZZLE = {0: "none", 1: "32B", 2: "64B", 3: "128B"}
_INTERLEAVE = {0: "none", 1: "16B", 2: "32B", 3: "reserved"}
_L2 = {0: "none", 1: "64B", 2: "128B", 3: "256B"}
_OOB = {0: "none", 1: "nan_request_zero_fma"}

# Bits of word 1 (bytes 8..15) the CuTe DSL 4.8.1 sets and the driver does not.
DSL_FLAG_BITS = (1, 21)

# word-1 bit fields
_F_FLAGS_LO = (0, 4)
_F_RANK = (4, 3)
_F_DTYPE = (7, 4)
_F_INTERLEAVE = (11, 2)
_F_SWIZZLE = (13, 2)
_F_OOB = (15, 1)
_F_TF32 = (16, 1)
_F_L2 = (17, 2)
_F_FLAGS_HI = (19, 13)


def _get(w: int, f: tuple[int, int]) -> int:
    return (w >> f[0]) & ((1 << f[1]) - 1)


def _put(v: int, f: tuple[int, int]) -> int:
    if v < 0 or v >= 1 << f[1]:
        raise ValueError(f"value {v} does not fit in {f[1]} bits")
    return v << f[0]


def decode_tensor_map(b: bytes) -> dict[str, Any]:
    """Decode a tiled-mode CUtensorMap (at least the first 64 bytes).

    Returns a dict with ``global_address``, ``rank``, ``dtype`` (CUtensorMapDataType
    name, or ``"HW<n>"``), ``dtype_hw``, ``elem_bytes``, ``global_dims`` (elements),
    ``global_strides`` (bytes, ``rank - 1`` entries, dims 1..rank-1), ``box_dims``,
    ``element_strides``, ``interleave``, ``swizzle``, ``l2_promotion``, ``oob_fill``
    (names) with the raw codes under ``*_code``, plus ``flags_lo``/``flags_hi`` (bits
    of word 1 whose meaning is unknown; the DSL sets some, see :data:`DSL_FLAG_BITS`),
    ``aux`` (the driver-derived bytes 64..79 as two u64, when present) and
    ``extra_nonzero`` (bit offsets outside every known field that are set, for
    positions past ``rank``).
    """
    b = bytes(b)
    if len(b) < 64:
        raise ValueError(f"a CUtensorMap has 128 bytes (at least 64 needed), got {len(b)}")
    q = struct.unpack_from("<8Q", b, 0)
    w1 = q[1]
    rank = _get(w1, _F_RANK) + 1
    hw = _get(w1, _F_DTYPE)
    tf32 = _get(w1, _F_TF32)
    cu = _HW_TO_CU.get((hw, tf32))
    name = _CU_NAMES[cu] if cu is not None else f"HW{hw}" + ("+TF32" if tf32 else "")
    elem = HW_FORMATS.get(hw, ("?", 0))[1]

    lo = [w1 >> 32] + list(struct.unpack_from("<3I", b, 16))  # stride[1..4] >> 4, low 32
    hi_bits = struct.unpack_from("<H", b, 28)[0]
    strides = []
    for i in range(4):
        v = lo[i] | (((hi_bits >> (4 * i)) & 0xF) << 32)
        strides.append(v << 4)
    dims = [x + 1 for x in struct.unpack_from("<5I", b, 32)]
    es_bits = struct.unpack_from("<H", b, 52)[0]
    estr = [((es_bits >> (3 * i)) & 7) + 1 for i in range(5)]
    box = [x + 1 for x in b[55:60]]

    # set bits outside the known fields, or in fields past `rank`
    extra = []
    def _check(byte_lo: int, byte_hi: int) -> None:
        for bi in range(byte_lo, byte_hi):
            for bit in range(8):
                if b[bi] >> bit & 1:
                    extra.append(8 * bi + bit)
    _check(30, 32)  # bits 240..255
    _check(54, 55)  # bits 432..439
    _check(60, 64)  # bits 480..511
    if es_bits >> 15:
        extra.append(431)
    for i in range(rank, 5):  # dims/box/estride past rank should be zero
        if dims[i] != 1 or box[i] != 1 or estr[i] != 1:
            extra.append(("past_rank", i))
    for i in range(rank - 1, 4):
        if strides[i] != 0:
            extra.append(("stride_past_rank", i + 1))

    out: dict[str, Any] = {
        "global_address": q[0],
        "rank": rank,
        "dtype": name,
        "dtype_hw": hw,
        "tf32": tf32,
        "elem_bytes": elem,
        "global_dims": dims[:rank],
        "global_strides": strides[: rank - 1],
        "box_dims": box[:rank],
        "element_strides": estr[:rank],
        "interleave": _INTERLEAVE[_get(w1, _F_INTERLEAVE)],
        "interleave_code": _get(w1, _F_INTERLEAVE),
        "swizzle": _SWIZZLE[_get(w1, _F_SWIZZLE)],
        "swizzle_code": _get(w1, _F_SWIZZLE),
        "l2_promotion": _L2[_get(w1, _F_L2)],
        "l2_promotion_code": _get(w1, _F_L2),
        "oob_fill": _OOB[_get(w1, _F_OOB)],
        "oob_fill_code": _get(w1, _F_OOB),
        "flags_lo": _get(w1, _F_FLAGS_LO),
        "flags_hi": _get(w1, _F_FLAGS_HI),
        "extra_nonzero": extra,
    }
    if len(b) >= 80:
        out["aux"] = struct.unpack_from("<2Q", b, 64)
    return out


def encode_tensor_map(
    global_address: int,
    dtype: int,
    global_dims: Sequence[int],
    global_strides: Sequence[int],
    box_dims: Sequence[int],
    element_strides: Sequence[int] | None = None,
    *,
    interleave: int = 0,
    swizzle: int = 0,
    l2_promotion: int = 2,
    oob_fill: int = 0,
    dsl_flags: bool = True,
) -> bytes:
    """Bytes 0..63 of a tiled CUtensorMap, followed by 64 zero bytes.

    ``dtype`` and the enums use the driver's CUtensorMap* codes; strides are in bytes
    (``rank - 1`` of them).  With ``dsl_flags`` the two flag bits the CuTe DSL writes
    (:data:`DSL_FLAG_BITS`; bit 21 only for rank >= 2) are set too, so that bytes 0..63
    equal what the DSL's host code produces; without them they equal the driver's.
    Bytes 64..127 are *not* what the driver writes (it stores derived values there).
    """
    rank = len(global_dims)
    if not 1 <= rank <= 5:
        raise ValueError("rank must be 1..5")
    if len(global_strides) != rank - 1 or len(box_dims) != rank:
        raise ValueError("need rank - 1 strides and rank box dims")
    es = list(element_strides) if element_strides is not None else [1] * rank
    hw, tf32 = CU_DTYPE_TO_HW[dtype]
    w1 = (
        _put(rank - 1, _F_RANK) | _put(hw, _F_DTYPE) | _put(interleave, _F_INTERLEAVE)
        | _put(swizzle, _F_SWIZZLE) | _put(oob_fill, _F_OOB) | _put(tf32, _F_TF32)
        | _put(l2_promotion, _F_L2)
    )
    if dsl_flags:
        w1 |= 1 << DSL_FLAG_BITS[0]
        if rank >= 2:
            w1 |= 1 << DSL_FLAG_BITS[1]
    buf = bytearray(128)
    struct.pack_into("<Q", buf, 0, global_address)
    lo, hi = [0] * 4, 0
    for i, s in enumerate(global_strides):
        if s % 16 or s < 0 or s >> 4 >= 1 << 36:
            raise ValueError(f"stride {s} must be a multiple of 16 below 2^40")
        v = s >> 4
        lo[i] = v & 0xFFFFFFFF
        hi |= (v >> 32) << (4 * i)
    w1 |= lo[0] << 32
    struct.pack_into("<Q", buf, 8, w1)
    struct.pack_into("<3I", buf, 16, *lo[1:])
    struct.pack_into("<H", buf, 28, hi)
    for i, d in enumerate(global_dims):
        if not 1 <= d <= 1 << 32:
            raise ValueError(f"dim {d} out of range")
        struct.pack_into("<I", buf, 32 + 4 * i, d - 1)
    e = 0
    for i, s in enumerate(es):
        if not 1 <= s <= 8:
            raise ValueError(f"element stride {s} out of range 1..8")
        e |= (s - 1) << (3 * i)
    struct.pack_into("<H", buf, 52, e)
    for i, x in enumerate(box_dims):
        if not 1 <= x <= 256:
            raise ValueError(f"box dim {x} out of range 1..256")
        buf[55 + i] = x - 1
    return bytes(buf)


_SEMANTIC_KEYS = (
    "global_address", "rank", "dtype", "global_dims", "global_strides", "box_dims",
    "element_strides", "interleave", "swizzle", "l2_promotion", "oob_fill",
)


def tensor_map_semantic_diff(a: bytes, b: bytes) -> dict[str, tuple[Any, Any]]:
    """Fields (of :func:`decode_tensor_map`) that differ between two descriptors,
    ignoring the flag bits and the driver-derived/undefined bytes 64..127."""
    da, db = decode_tensor_map(a), decode_tensor_map(b)
    return {k: (da[k], db[k]) for k in _SEMANTIC_KEYS if da[k] != db[k]}
