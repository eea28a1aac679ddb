"""Hopper (sm_90a) quantize templates: FP8 per-token 1x128, per-block 128x128 and grouped transposed;
FP4 per-token 1x32 (the per-token template with E2M1 codes and UE8M0 scales).

Importing this module imports the CuTe DSL; only the generator does that.

Numerics (identical in the three kernels; the executable specification is
`cutegen.runtime.quant_reference`):

* A group's amax is the maximum of |x| over its real elements, computed on the IEEE bit patterns
  (|x| as an unsigned integer is monotone in the value), so it is exact, denormals included.
* The group is *non-finite* when amax is +Inf or NaN (bits >= 0x7F800000).
* Finite group: ``s = max(amax, eps) / 448`` (``div.rn.f32``); with UE8M0 scales ``s`` is then
  rounded up to a power of two by integer arithmetic on its bits. ``inv = 1 / s``
  (``rcp.rn.f32``); ``q = cvt.rn.satfinite.e4m3x2.f32(x * inv)`` (round to nearest even,
  saturating to +-448).
* Non-finite group: the scale is the canonical NaN (0x7FC00000; UE8M0 byte 0xFF) and every real
  element's byte is 0x7F (e4m3 NaN). Padding bytes stay 0.
* FP4 (`per_token_quant_fp4`, the executable specification `cutegen.runtime.mx_reference.quant_fp4_ref`):
  1x32 groups, ``s = max(amax, eps) / 6`` rounded up to a power of two (UE8M0), each element the
  E2M1 code of ``x * (1 / s)`` (`_e2m1_code`: nearest, ties to the even code, saturating; bf16
  inputs two at a time in 16-bit lanes, `_e2m1_codes_bf16x2`, the same codes), two codes per
  byte, element 2i in the low nibble; a non-finite group's codes are all 7.

Every kernel is persistent: the grid is ``min(tiles, max_active_clusters)`` CTAs (the runtime's
occupancy query; clusters are 1x1, so that is the number of co-resident CTAs), and CTA ``b``
walks tiles ``b, b + grid, ...``. Kernel parameters are plain dynamic tensors (the DSL's C
struct ``{ptr, dynamic extents, dynamic strides}``) and one Float32 (eps).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.memory import SmemAllocator

from cutegen.templates.dtypes import cute_dtype
from cutegen.schedules.contract import op_contract
from cutegen.templates.gemm_contract import contract_fake_arguments, contract_operands, plain_binding, requirement
from cutegen.templates.gmem_vec import VEC_BYTES, vec16_at
from cutegen.schedules.spec import (
    PER_TOKEN_WARP_COLS,
    QUANT_GROUP,
    QUANT_MAX_GROUPS,
    THREADS_PER_WARPGROUP,
    DType,
    ScaleFormat,
    Schedule,
)

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# The E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 are steps of 0.5 below 2, of 1 below 4 and of 2
# above: from |y| at least `start`, the code is round(|y| · scale) + offset (ties to even, which
# is the even code), at most E2M1_MAX_CODE: (start, scale, offset), the first from 0.
E2M1_REGIONS = ((0.0, 2.0, 0), (2.0, 1.0, 2), (4.0, 0.5, 4))
E2M1_MAX_CODE = 7
# t + 1.5·2^23 (t < 2^22) rounds t to an integer, ties to even, held in the sum's low mantissa bits.
ROUND_MAGIC = 12582912.0
ROUND_MAGIC_BITS = 0x4B400000
E2M1_SIGN = 8
# The same rule on two bf16 at once, in 16-bit lanes of a word (`_e2m1_codes_bf16x2`): at |y| >= 1
# the code is |y| rounded to one mantissa bit (bits + 0x1F + bit 6, shifted down 6) less 252, the
# biased exponent of 1.0 twice; below 1 it is round(2|y|) (|y| · 2 + 192 in bf16 rounds to an
# integer, ties to even, held in the sum's low bits); the larger of the two, each capped, is the code.
BF16X2_ABS = 0x7FFF7FFF
BF16X2_ROUND_ONE_BIT = 0x001F001F
BF16X2_MANTISSA_TOP = 0x00010001
BF16X2_LANE_10_BITS = 0x03FF03FF
BF16X2_EXPONENT_OF_ONE = 0x00FC00FC
BF16X2_TWO = 0x40004000
BF16X2_ROUND_MAGIC = 0x43404340  # 192 = 1.5 · 2^7 in both lanes
BF16X2_CODE_BELOW_ONE_MAX = 0x00020002
BF16X2_CODE_MAX = 0x00070007
BF16X2_SIGN_TO_BIT_3 = 12  # bit 15 of a lane to bit 3
BF16X2_CODE_SIGN = 0x00080008
E2M1_NAN_CODE = E2M1_MAX_CODE  # a non-finite group's codes (6.0; its NaN scale makes them NaN)
E2M1_NAN_BYTE = E2M1_NAN_CODE | (E2M1_NAN_CODE << 4)
# The grouped quantizer's prefix sums of group sizes stop here: past every token count T (T · H <
# 2³¹ with H ≥ 8 keeps T < 2²⁸) and every block count S, and a sum of two stays below 2³¹.
PREFIX_CAP = 1 << 29
ABS_MASK = 0x7FFFFFFF
ABS_MASK_16X2 = 0x7FFF7FFF  # |x| of both 16-bit floats (bf16 or f16) of a word
INF_BITS = 0x7F800000  # |x| bits at or above this: +Inf or NaN
NAN_BITS = 0x7FC00000  # the canonical NaN the kernels store as a scale
EXP_MASK = 0x7F800000
MANT_MASK = 0x007FFFFF
E4M3_NAN_WORD = 0x7F7F7F7F  # four e4m3 NaN bytes
WARP = 32
# Co-resident CTAs per SM each kernel is compiled for (.minnctapersm caps the registers at
# 65536 / (CTAs x 256 threads)): per-token 4 (64 registers) with one tile per batch, 3 (85) with
# more (64 would spill), grouped 3 (85; 4 would spill), per-block 2 (128: a whole 128x128 block
# lives in registers, twice for 16-bit inputs).
MIN_CTAS_PER_SM = {"per_token": 4, "per_token_staged": 3, "grouped": 3, "per_block": 2}
# `preferred_smem_carveout` keeps the DSL from querying a GPU for its shared memory per SM when
# min_blocks_per_mp > 1 (it is a host-side launch hint; the runtime does not set it).
SMEM_CARVEOUT_PERCENT = 100
# The grouped kernel claims tiles from its counter when it has more than this many per CTA, and
# otherwise walks bidx, bidx + grid, ... (2 and 8 measured alike: NOTES N33).
DYNAMIC_TILES_PER_CTA = 2


# ------------------------------------------------------------------------------------------------
# Device helpers (traced inside the kernels)


@cute.jit
def _abs_bits_max(acc: Int32, x: Float32) -> Int32:
    """max(acc, |x| as bits): exact amax on the IEEE patterns, NaN/Inf sorting above all finites."""
    return cutlass.max(acc, x.bitcast(Int32) & ABS_MASK)


@cute.jit
def _scale_from_amax(
    amax_bits: Int32, eps: Float32, ue8m0: cutlass.Constexpr[bool], largest: cutlass.Constexpr[float] = E4M3_MAX
) -> Float32:
    """The group's scale: max(amax, eps)/largest (448, FP4's 6; rounded up to 2^k for UE8M0),
    NaN if non-finite."""
    amax = amax_bits.bitcast(Float32)
    s = cutlass.max(amax, eps) / Float32(largest)
    if cutlass.const_expr(ue8m0):
        bits = s.bitcast(Int32)
        s = ((bits + MANT_MASK) & EXP_MASK).bitcast(Float32)
    nan = Int32(NAN_BITS).bitcast(Float32)
    return nan if amax_bits >= INF_BITS else s


def _packed_op(instruction: str, *words: Int32, loc=None, ip=None) -> Int32:
    """One PTX instruction on 32-bit words holding two 16-bit lanes each."""
    operands = ", ".join(f"${i + 1}" for i in range(len(words)))
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [Int32(w).ir_value(loc=loc, ip=ip) for w in words],
            f"{instruction} $0, {operands};",
            "=r," + ",".join("r" for _ in words),
            has_side_effects=False,
            is_align_stack=False,
        )
    )


@dsl_user_op
def _max_u16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """Per-halfword unsigned maximum of two words (``max.u16x2``, sm_90)."""
    return _packed_op("max.u16x2", a, b, loc=loc, ip=ip)


@dsl_user_op
def _min_u16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """Per-halfword unsigned minimum of two words (``min.u16x2``, sm_90)."""
    return _packed_op("min.u16x2", a, b, loc=loc, ip=ip)


@dsl_user_op
def _mul_bf16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """Both bf16 of a times those of b, rounded to nearest even (``mul.rn.bf16x2``, sm_90)."""
    return _packed_op("mul.rn.bf16x2", a, b, loc=loc, ip=ip)


@dsl_user_op
def _fma_bf16x2(a: Int32, b: Int32, c: Int32, *, loc=None, ip=None) -> Int32:
    """a · b + c on both bf16 lanes, rounded once to nearest even (``fma.rn.bf16x2``)."""
    return _packed_op("fma.rn.bf16x2", a, b, c, loc=loc, ip=ip)


@cute.jit
def _quantize_vec(xf: cute.TensorSSA, inv: Float32, out: cute.Tensor):
    """out (e4m3 rmem, same size) <- satfinite RNE e4m3 of xf * inv."""
    out.store((xf * inv).to(cutlass.Float8E4M3FN))


@cute.jit
def _e2m1_code(y: Float32) -> Int32:
    """The FP4 E2M1 code of y: the nearest of ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, a tie to the even
    code, saturating at ±6, +0 for a zero result (as ``cvt.rn.satfinite.e2m1x2.f32``, written out
    so that the kernel runs on GPUs without that instruction too): |y| scaled to its region's
    step (`E2M1_REGIONS`), rounded by one addition of ROUND_MAGIC, read off the sum's bits."""
    a = (y.bitcast(Int32) & ABS_MASK).bitcast(Float32)
    _, first_scale, first_offset = E2M1_REGIONS[0]
    scale = Float32(first_scale)
    offset = Int32(first_offset)
    for start, step_scale, step_offset in E2M1_REGIONS[1:]:
        above = a >= Float32(start)
        scale = Float32(step_scale) if above else scale
        offset = Int32(step_offset) if above else offset
    rounded = (a * scale + Float32(ROUND_MAGIC)).bitcast(Int32) - ROUND_MAGIC_BITS
    code = cutlass.min(rounded + offset, Int32(E2M1_MAX_CODE))
    negative = (y.bitcast(Int32) < 0) & (code != 0)
    return code | (Int32(E2M1_SIGN) if negative else Int32(0))


@cute.jit
def _e2m1_codes_bf16x2(w: Int32, inv2: Int32) -> Int32:
    """The E2M1 codes of the two bf16 of w times inv (inv2: inv, a power of two, in both bf16
    lanes, so the product is exact), in bits 0-3 and 16-19: `_e2m1_code`'s rule (same codes),
    two elements an instruction (the constants above)."""
    y = _mul_bf16x2(w, inv2)
    a = y & BF16X2_ABS
    top = (a >> 6) & BF16X2_MANTISSA_TOP
    rounded = ((a + BF16X2_ROUND_ONE_BIT + top) >> 6) & BF16X2_LANE_10_BITS
    at_least_one = _min_u16x2(_max_u16x2(rounded, BF16X2_EXPONENT_OF_ONE) - BF16X2_EXPONENT_OF_ONE, BF16X2_CODE_MAX)
    below_one = _min_u16x2(_fma_bf16x2(a, BF16X2_TWO, BF16X2_ROUND_MAGIC) - BF16X2_ROUND_MAGIC, BF16X2_CODE_BELOW_ONE_MAX)
    code = _max_u16x2(at_least_one, below_one)
    # The sign of each lane, for codes other than 0 (a zero result is +0): code + 7 has bit 3 set
    # exactly when the code is 1-7.
    sign = (y >> BF16X2_SIGN_TO_BIT_3) & BF16X2_CODE_SIGN
    nonzero = (code + BF16X2_CODE_MAX) & BF16X2_CODE_SIGN
    return code | (sign & nonzero)


@cute.jit
def _quantize_vec_e2m1_bf16(words: cute.TensorSSA, inv: Float32, out: cute.Tensor, poisoned: Boolean):
    """out (uint8 rmem, one byte per word) <- the E2M1 code pairs of bf16 pairs `words` times inv
    (`_e2m1_codes_bf16x2`), element 2i in the low nibble; every code 7 where `poisoned`."""
    half = (inv.bitcast(Int32) >> 16) & 0xFFFF  # inv's bf16: exact, a power of two
    inv2 = half | (half << 16)
    for i in cutlass.range_constexpr(cute.size(out)):
        codes = _e2m1_codes_bf16x2(words[i], inv2)
        byte = (codes | (codes >> 12)) & 0xFF
        out[i] = cutlass.Uint8(Int32(E2M1_NAN_BYTE) if poisoned else byte)


@cute.jit
def _quantize_vec_e2m1(xf: cute.TensorSSA, inv: Float32, out: cute.Tensor, poisoned: Boolean):
    """out (uint8 rmem, half the size) <- the E2M1 codes of xf * inv, two per byte (element 2i in
    the low nibble); every code 7 where the group is `poisoned` (non-finite)."""
    for i in cutlass.range_constexpr(cute.size(out)):
        lo = _e2m1_code(xf[2 * i] * inv)
        hi = _e2m1_code(xf[2 * i + 1] * inv)
        byte = lo | (hi << 4)
        out[i] = cutlass.Uint8(Int32(E2M1_NAN_BYTE) if poisoned else byte)


@cute.jit
def _store_flat16(mQ: cute.Tensor, offset: Int64, frag: cute.Tensor):
    """16 e4m3 bytes to the flat tensor mQ at element `offset` (a multiple of 16): one 128-bit store."""
    dst = vec16_at(cutlass.Float8E4M3FN, mQ.iterator.toint(), offset)
    cute.autovec_copy(frag, dst)


@cute.jit
def _ue8m0_byte(s: Float32) -> Int32:
    """The biased exponent of a power-of-two scale (0xFF for the NaN scale)."""
    return (s.bitcast(Int32) >> 23) & 0xFF


@cute.jit
def _advance(r: Int32, c: Int32, step_r: Int32, step_c: Int32, cols: Int32):
    """The (row, column) cursor of tile ``r * cols + c + step`` given ``divmod(step, cols)`` =
    (step_r, step_c) and c < cols: an add with a carry instead of a division per tile."""
    r = r + step_r
    c = c + step_c
    if c >= cols:
        c = c - cols
        r = r + 1
    return r, c


def _batch_cursors(rt: Int32, ct: Int32, stages: int, step_r: Int32, step_c: Int32, cols: Int32):
    """The (row, column) cursors of a batch's ``stages`` tiles: (rt, ct), then each next one a
    grid further (`_advance`)."""
    cursors = [(rt, ct)]
    for _ in range(stages - 1):
        rt, ct = _advance(rt, ct, step_r, step_c, cols)
        cursors.append((rt, ct))
    return cursors


@cute.jit
def _walk_tiles(first: Int32, step: Int32, cols: Int32, rows: Int32, buffers, load, compute):
    """The persistent loop of the register-buffered quantize kernels: visit tiles first,
    first + step, ... of a rows x cols grid of tiles, each as its (row, column) cursor. With one
    register buffer each tile is loaded, then computed; with two, the next tile's loads are
    issued into the other buffer before the current tile is computed (the loop body handles two
    tiles, one per buffer). ``load(frags, r, c)`` issues a tile's loads; ``compute(frags, r, c,
    parity)`` uses them, parity alternating 0, 1, ... per tile (for state double-buffered by tile
    parity, such as shared partial maxima)."""
    step_r = step // cols
    step_c = step - step_r * cols
    r = first // cols
    c = first - r * cols
    parity = Int32(0)
    if cutlass.const_expr(len(buffers) == 1):
        while r < rows:
            load(buffers[0], r, c)
            compute(buffers[0], r, c, parity)
            parity = parity ^ 1
            r, c = _advance(r, c, step_r, step_c, cols)
    else:
        if r < rows:
            load(buffers[0], r, c)
        while r < rows:
            r, c, parity = _double_buffered_step(buffers[0], buffers[1], r, c, parity, step_r, step_c, cols, rows, load, compute)
            if r < rows:
                r, c, parity = _double_buffered_step(buffers[1], buffers[0], r, c, parity, step_r, step_c, cols, rows, load, compute)


@cute.jit
def _double_buffered_step(cur, nxt, r, c, parity, step_r, step_c, cols, rows, load, compute):
    """One tile of `_walk_tiles` with two register buffers: issue the next tile's loads into
    `nxt`, then compute the tile (r, c) held in `cur`; returns the next cursor and parity."""
    r_n, c_n = _advance(r, c, step_r, step_c, cols)
    if r_n < rows:
        load(nxt, r_n, c_n)
    compute(cur, r, c, parity)
    return r_n, c_n, parity ^ 1


# ------------------------------------------------------------------------------------------------
# Per-token 1x128


class PerTokenQuantKernel:
    """Per-token (1x128 along K) FP8 quantize: x [M, K] -> q [M, K] e4m3 and one scale per group;
    or (c_dtype e2m1, tile_k 32) FP4: x -> q [M, K/2] bytes of E2M1 code pairs and a packed UE8M0
    scale per 1x32 group (a warp's 512 columns are then 16 groups of 4 lanes (8 for fp32), and
    four packed scale words; a piece's V codes are V/2 bytes, one store).

    Threads: ``128 * math_warpgroups`` (256), no warp specialisation: every warp does the same
    work. Each warp covers 512 columns (4 groups) of one row of the CTA tile; the tile is
    ``tile_n`` = 512 or 1024 columns (``chunks`` = 1 or 2 warps side by side) x ``tile_m`` =
    warps / chunks rows. Warp ``w`` takes row ``w // chunks``, columns ``512 * (w % chunks)``
    onwards. A thread holds 16 elements of its warp's row as P 16-byte pieces (V = 8 elements for
    16-bit inputs, P = 2; V = 4 for fp32, P = 4): piece h of lane ``l`` is columns
    ``32*V*h + V*l .. +V`` of the warp's 512, so every load and store instruction of a warp
    covers 32*V contiguous elements, and a group's ``128/V`` lanes (16 or 32) are consecutive.

    Per thread and tile: the P pieces are loaded with 128-bit loads (zeros past the rows or K;
    K is a multiple of 16, so a piece is all in or all out); each piece's |x| bit-maximum is
    taken (bf16: on the packed pairs with ``max.u16x2``) and reduced over the group's lanes with
    xor-shuffles (bf16: both pieces' maxima in one word, 4 shuffles); the scale is computed; the
    values are converted to fp32, multiplied by ``1/s`` and converted with
    ``cvt.rn.satfinite.e4m3x2.f32``; each piece's V bytes are one store. ``stages`` tiles are
    loaded before the first is computed; for 16-bit inputs two register buffers alternate, so the
    next batch's loads are in flight while a batch is quantised and stored. Tiles are walked as
    (row, column) cursors advanced with a carry (no division per tile).

    Scales go through shared memory: the tile's scale words (fp32: one per group, written by the
    first lane of each group; UE8M0: one packed word per warp, gathered by lane 0 with shuffles)
    go to a [word, row, tile, parity] buffer, one ``bar.sync`` per batch, then the first
    ``rows x words`` threads store the batch's words with consecutive threads on consecutive
    addresses (consecutive rows for the MN-major layout, detected by its row stride 1;
    consecutive words of a row for K-major), in one store instruction per tile instead of one
    per warp. So that this store fills whole 32-byte sectors, the runtime takes 512-column tiles
    (8 rows of a scale column) for MN-major scales and 1024-column tiles (8 fp32 groups of a
    row) for K-major ones. The buffer alternates with the batch parity, so that one barrier
    suffices: a warp rewrites parity p only after every thread passed the next batch's barrier.
    Scales are written through the scale tensor's run-time strides, so one kernel serves the
    K-major layout ``[M, G]`` (strides ``(G, 1)``) and DeepGEMM's MN-major TMA-aligned layout
    (strides ``(1, align(M, 4))``). The scale tensor's row count ``SM`` may exceed ``M`` (the
    padding rows of the aligned layout): those rows are written with 0 (fp32 0.0, UE8M0 byte 0).
    UE8M0 scales are packed four exponent bytes per int32 (byte ``j`` of word ``(m, k)`` is
    group ``4k + j``; bytes of groups past ``ceil(K/128)`` are 0).

    Shared memory: the scale buffer, ``2 * stages * rows * words`` 32-bit words (words per tile
    row: groups for fp32, chunks for UE8M0). Barriers: one ``bar.sync`` per batch.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.in_dtype = cute_dtype(s.a_dtype)
        self.ue8m0 = s.scale == ScaleFormat.UE8M0
        self.threads = s.math_warpgroups * THREADS_PER_WARPGROUP
        self.warps = self.threads // WARP
        self.cols = s.tile_n  # 512 (4 groups) or 1024 (8 groups)
        self.chunks = self.cols // PER_TOKEN_WARP_COLS  # warps side by side along a tile row
        self.rows = s.tile_m  # warps // chunks
        self.stages = s.stages
        self.vec = VEC_BYTES // s.a_dtype.bytes  # elements per 16-byte piece: 8 or 4 (fp32)
        self.piece_cols = WARP * self.vec  # columns of one warp-wide piece: 256 or 128
        self.pieces = PER_TOKEN_WARP_COLS // self.piece_cols  # pieces per thread and tile: 2 or 4
        self.elems = self.pieces * self.vec  # 16 per thread and tile
        # FP8 1x128 groups of e4m3, or FP4 1x32 groups of e2m1 codes (two per byte).
        self.fp4 = s.c_dtype == DType.E2M1
        self.group = s.tile_k
        self.largest = E2M1_MAX if self.fp4 else E4M3_MAX
        self.lanes_per_group = self.group // self.vec  # FP8 16 or 32; FP4 4 or 8
        self.groups_per_piece = self.piece_cols // self.group  # FP8 2 or 1; FP4 8 or 4
        self.groups_per_warp = PER_TOKEN_WARP_COLS // self.group  # FP8 4, FP4 16
        self.groups_per_tile = self.cols // self.group
        # UE8M0 words of a warp (4 groups each): FP8 one, FP4 four.
        self.words_per_warp = self.groups_per_warp // 4
        # Scale words a tile row writes: fp32 one per group; UE8M0 one per 4 groups.
        self.words_per_row = self.chunks * self.words_per_warp if self.ue8m0 else self.groups_per_tile
        # 16-bit inputs double-buffer the batch in registers (fp32 inputs, twice the registers,
        # keep one buffer).
        self.double_buffer = s.a_dtype.bytes == 2
        self.smem_bytes = 0

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        q: cute.Tensor,
        sf: cute.Tensor,
        eps: Float32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        word = Int32 if self.ue8m0 else Float32

        @cute.struct
        class SharedStorage:
            # The scale words of a batch's tiles, by batch parity: [word, row, tile, parity]
            scales: cute.struct.MemRange[word, 2 * self.stages * self.rows * self.words_per_row]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        # Grid rule "blocks": min(ceil_div(max(M, SM), tile_m) * ceil_div(K, tile_n), max_active_clusters).
        rows = cutlass.max(x.shape[0], sf.shape[0])
        tiles = ((rows + self.rows - 1) // self.rows) * ((x.shape[1] + self.cols - 1) // self.cols)
        grid = cutlass.max(cutlass.min(tiles, max_active_clusters), 1)
        self.kernel(x, q, sf, eps).launch(
            grid=[grid, 1, 1],
            block=[self.threads, 1, 1],
            smem=self.smem_bytes,
            min_blocks_per_mp=MIN_CTAS_PER_SM["per_token" if self.stages == 1 else "per_token_staged"],
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT,
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, eps: Float32):
        E = self.elems
        U = self.stages
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nblk, _, _ = cute.arch.grid_dim()
        warp = tidx // WARP
        lane = tidx % WARP
        # A warp's place in the tile: row warp // chunks, column slice warp % chunks.
        spot = (warp // self.chunks, warp % self.chunks, lane)
        rows = cutlass.max(mX.shape[0], mS.shape[0])
        col_tiles = (mX.shape[1] + self.cols - 1) // self.cols
        row_tiles = (rows + self.rows - 1) // self.rows
        # The cursor step between the tiles of one batch: divmod(grid, col_tiles).
        step_r = nblk // col_tiles
        step_c = nblk - step_r * col_tiles

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sS = storage.scales.get_tensor(cute.make_layout((self.words_per_row, self.rows, U, 2)))
        # MN-major scales (row stride 1): consecutive threads store consecutive rows.
        mn_major = mS.stride[0] == 1

        buffers = [
            [cute.make_rmem_tensor((E,), self.in_dtype) for _ in range(U)]
            for _ in range(2 if self.double_buffer else 1)
        ]
        _walk_tiles(
            bidx,
            U * nblk,
            col_tiles,
            row_tiles,
            buffers,
            lambda frags, rt, ct: self._load_batch(mX, frags, rt, ct, step_r, step_c, col_tiles, row_tiles, spot),
            lambda frags, rt, ct, parity: self._quantize_batch(
                mQ, mS, sS, mn_major, frags, rt, ct, parity, step_r, step_c, col_tiles, row_tiles, tidx, spot, eps
            ),
        )

    @cute.jit
    def _load_batch(self, mX, frags, rt, ct, step_r, step_c, col_tiles, row_tiles, spot):
        """Issue this thread's loads of the batch's `stages` tiles, the first at cursor (rt, ct)
        and each next one a grid further (zeros past the rows, the columns or the last tile)."""
        V = self.vec
        row, chunk, lane = spot
        m_rows = mX.shape[0]
        k_cols = mX.shape[1]
        for u, (rt, ct) in enumerate(_batch_cursors(rt, ct, self.stages, step_r, step_c, col_tiles)):
            r = rt * self.rows + row
            row_ok = (rt < row_tiles) & (r < m_rows)
            for h in cutlass.range_constexpr(self.pieces):
                col = ct * self.cols + chunk * PER_TOKEN_WARP_COLS + h * self.piece_cols + lane * V
                part = cute.local_tile(frags[u], (V,), (h,))
                if row_ok & (col < k_cols):
                    src = cute.local_tile(mX, (1, V), (r, col // V))
                    cute.autovec_copy(src[0, None], part)
                else:
                    part.fill(0)

    @cute.jit
    def _piece_amax_bits(self, frag, h):
        """|x| bit-maximum of this thread's piece h: for 16-bit inputs the 16-bit pattern (low
        half; taken on the packed pairs with ``max.u16x2``), for fp32 the fp32 pattern."""
        V = self.vec
        part = cute.local_tile(frag, (V,), (h,))
        amax = Int32(0)
        if cutlass.const_expr(self.vec == 8):
            pairs = cute.recast_tensor(part, Int32)
            amax2 = Int32(0)
            for w in cutlass.range_constexpr(V // 2):
                amax2 = _max_u16x2(amax2, pairs[w] & ABS_MASK_16X2)
            amax = cutlass.max(amax2 >> 16, amax2 & 0xFFFF)
        else:
            xf = part.load().to(Float32)
            for i in cutlass.range_constexpr(V):
                amax = _abs_bits_max(amax, xf[i])
        return amax

    @cute.jit
    def _group_amaxes(self, frag):
        """The fp32 |x| bit-maximum of each piece's group, reduced over the group's lanes."""
        P = self.pieces
        lpg = self.lanes_per_group
        amaxes = [self._piece_amax_bits(frag, h) for h in range(P)]
        if cutlass.const_expr(self.vec == 8):
            # 16-bit inputs (P = 2): both pieces' patterns in one word, one shuffle per step.
            packed = amaxes[0] | (amaxes[1] << 16)
            for k in cutlass.range_constexpr(lpg.bit_length() - 1):
                packed = _max_u16x2(packed, cute.arch.shuffle_sync_bfly(packed, offset=1 << k))
            if cutlass.const_expr(self.in_dtype == cutlass.BFloat16):
                amaxes = [packed << 16, packed & Int32(-65536)]  # bf16 bits: fp32's top half
            else:
                # |x| patterns of f16 order like their values; convert the two maxima exactly.
                pair = cute.make_rmem_tensor((2,), self.in_dtype)
                cute.recast_tensor(pair, Int32)[0] = packed
                wide = pair.load().to(Float32)
                amaxes = [wide[0].bitcast(Int32), wide[1].bitcast(Int32)]
        else:
            amaxes = [
                cute.arch.warp_reduction(a, lambda x, y: cutlass.max(x, y), threads_in_group=lpg)
                for a in amaxes
            ]
        return amaxes

    @cute.jit
    def _quantize_batch(self, mQ, mS, sS, mn_major, frags, rt, ct, parity, step_r, step_c, col_tiles, row_tiles, tidx, spot, eps):
        """Quantise and store the batch's tiles, then their scales (through shared memory)."""
        V = self.vec
        P = self.pieces
        lpg = self.lanes_per_group
        row, chunk, lane = spot
        m_rows = mQ.shape[0]
        k_cols = mQ.shape[1] * 2 if cutlass.const_expr(self.fp4) else mQ.shape[1]  # FP4: K/2 bytes a row
        s_rows = mS.shape[0]
        s_cols = mS.shape[1]
        cursors = _batch_cursors(rt, ct, self.stages, step_r, step_c, col_tiles)
        for u, (rt, ct) in enumerate(cursors):
            r = rt * self.rows + row
            amaxes = self._group_amaxes(frags[u])
            scales = []
            for h in cutlass.range_constexpr(P):
                amax = amaxes[h]
                sc = _scale_from_amax(amax, eps, self.ue8m0, self.largest)
                scales.append(sc)
                piece = cute.local_tile(frags[u], (V,), (h,))
                if cutlass.const_expr(self.fp4):
                    # V codes in V/2 bytes, at byte col/2 of the row; bf16 two at a time.
                    qp = cute.make_rmem_tensor((V // 2,), cutlass.Uint8)
                    if cutlass.const_expr(self.in_dtype == cutlass.BFloat16):
                        words = cute.recast_tensor(piece, Int32).load()
                        _quantize_vec_e2m1_bf16(words, Float32(1.0) / sc, qp, amax >= INF_BITS)
                    else:
                        _quantize_vec_e2m1(piece.load().to(Float32), Float32(1.0) / sc, qp, amax >= INF_BITS)
                    col = ct * self.cols + chunk * PER_TOKEN_WARP_COLS + h * self.piece_cols + lane * V
                    if (rt < row_tiles) & (r < m_rows) & (col < k_cols):
                        dst = cute.local_tile(mQ, (1, V // 2), (r, col // V))
                        cute.autovec_copy(qp, dst[0, None])
                else:
                    qp = cute.make_rmem_tensor((V,), cutlass.Float8E4M3FN)
                    _quantize_vec(piece.load().to(Float32), Float32(1.0) / sc, qp)
                    if amax >= INF_BITS:
                        qw = cute.recast_tensor(qp, Int32)
                        for w in cutlass.range_constexpr(V // 4):
                            qw[w] = Int32(E4M3_NAN_WORD)
                    col = ct * self.cols + chunk * PER_TOKEN_WARP_COLS + h * self.piece_cols + lane * V
                    if (rt < row_tiles) & (r < m_rows) & (col < k_cols):
                        dst = cute.local_tile(mQ, (1, V), (r, col // V))
                        cute.autovec_copy(qp, dst[0, None])
            # The warp's scale words to shared memory first: the tile's words then leave in one
            # coalesced store per CTA (a warp alone would write scattered words).
            if cutlass.const_expr(self.ue8m0):
                # Lane 0 gathers each of the warp's packed words: four group bytes (groups
                # 4 wi .. 4 wi + 3 of the row, wi = (ct * chunks + chunk) * words_per_warp + w).
                for w in cutlass.range_constexpr(self.words_per_warp):
                    word = Int32(0)
                    for j in cutlass.range_constexpr(4):
                        h = (4 * w + j) // self.groups_per_piece
                        g = (ct * self.chunks + chunk) * self.groups_per_warp + 4 * w + j
                        byte = Int32(0)
                        if (r < m_rows) & (g * self.group < k_cols):
                            byte = _ue8m0_byte(scales[h])
                        lane_of_group = ((4 * w + j) % self.groups_per_piece) * lpg
                        word = word | (cute.arch.shuffle_sync(byte, offset=lane_of_group) << (8 * j))
                    if lane == 0:
                        if cutlass.const_expr(self.words_per_warp == 1):
                            sS[chunk, row, u, parity] = word
                        else:
                            sS[chunk * self.words_per_warp + w, row, u, parity] = word
            else:
                # Group g = groups_per_tile ct + jg of piece h, jg = 4 chunk + gpp h + lane // lpg.
                for h in cutlass.range_constexpr(P):
                    jg = chunk * self.groups_per_warp + h * self.groups_per_piece + lane // lpg
                    g = ct * self.groups_per_tile + jg
                    value = Float32(0.0)
                    if (r < m_rows) & (g * self.group < k_cols):
                        value = scales[h]
                    if lane % lpg == 0:
                        sS[jg, row, u, parity] = value
        # Buffers alternate by tile parity, so one barrier per batch suffices: a warp rewrites
        # parity p only after every thread passed the next batch's barrier.
        cute.arch.sync_threads()
        n_words = self.rows * self.words_per_row
        if tidx < n_words:
            # Consecutive threads store consecutive addresses: along a row for K-major scales,
            # down the rows for MN-major ones.
            srow = tidx // self.words_per_row
            jw = tidx % self.words_per_row
            if mn_major:
                srow = tidx % self.rows
                jw = tidx // self.rows
            for u, (rt, ct) in enumerate(cursors):
                r = rt * self.rows + srow
                g = ct * self.words_per_row + jw
                if (rt < row_tiles) & (r < s_rows) & (g < s_cols):
                    mS[r, g] = sS[jw, srow, u, parity]


# ------------------------------------------------------------------------------------------------
# Per-block 128x128


class PerBlockQuantKernel:
    """Per-block (128x128) FP8 quantize: w [N, K] -> q [N, K] e4m3, scales [ceil(N/128), ceil(K/128)] fp32.

    Threads: ``128 * math_warpgroups`` (256), every warp alike. One CTA quantises one 128x128
    block at a time (persistent over blocks). Warp ``w`` owns rows ``[w*128/warps, (w+1)*128/warps)``
    of the block; a row is 128 elements = ``128/V`` lanes of one 128-bit chunk (V = 8 for 16-bit
    inputs, 4 for fp32), so a warp covers ``32*V/128`` rows per load instruction and each thread
    issues all of its ``128*128/threads/V`` 128-bit loads (8 for bf16 with 256 threads) before
    reducing: the whole block is held in registers and read from memory once. Two register
    buffers (16-bit inputs; fp32 inputs have one) alternate between the CTA's consecutive blocks:
    the loads of block i+1 are issued before block i is reduced, quantised and stored, so every
    CTA keeps a block of loads in flight while it computes.

    Reduction: per-thread |x| bit-maximum, a full-warp xor-shuffle reduction, then one word per
    warp in shared memory and one ``bar.sync``; every thread then reads the ``warps`` partial
    maxima. The shared words are double-buffered by block parity, so one barrier per block
    suffices (a thread writes buffer p of block i+2 only after every thread passed the barrier
    of block i+1, i.e. finished reading buffer p of block i).

    Stores: each thread writes its ``V`` e4m3 bytes per chunk (8- or 4-byte stores, coalesced per
    row); thread 0 writes the block's scale. Rows past N and columns past K are neither read
    (they count as zeros) nor written.

    Shared memory: ``2 * warps`` fp32 words. Barriers: one ``bar.sync`` (id 0) per block.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.in_dtype = cute_dtype(s.a_dtype)
        self.threads = s.math_warpgroups * THREADS_PER_WARPGROUP
        self.warps = self.threads // WARP
        self.block_m = s.tile_m  # 128
        self.block_k = s.tile_n  # 128
        self.vec = VEC_BYTES // s.a_dtype.bytes
        self.lanes_per_row = self.block_k // self.vec
        self.rows_per_step = WARP // self.lanes_per_row
        self.rows_per_warp = self.block_m // self.warps
        self.steps = self.rows_per_warp // self.rows_per_step
        # 16-bit inputs double-buffer the block in registers; fp32 inputs (twice the registers
        # per block) keep one buffer, which compiles without spills.
        self.double_buffer = s.a_dtype.bytes == 2
        self.smem_bytes = None

    @cute.jit
    def __call__(
        self,
        w: cute.Tensor,
        q: cute.Tensor,
        sf: cute.Tensor,
        eps: Float32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        @cute.struct
        class SharedStorage:
            partial: cute.struct.MemRange[Int32, 2 * self.warps]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        # Grid rule "blocks": min(ceil_div(N, 128) * ceil_div(K, 128), max_active_clusters).
        blocks = ((w.shape[0] + self.block_m - 1) // self.block_m) * (
            (w.shape[1] + self.block_k - 1) // self.block_k
        )
        grid = cutlass.max(cutlass.min(blocks, max_active_clusters), 1)
        self.kernel(w, q, sf, eps).launch(
            grid=[grid, 1, 1],
            block=[self.threads, 1, 1],
            smem=self.smem_bytes,
            min_blocks_per_mp=MIN_CTAS_PER_SM["per_block"],
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT,
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, eps: Float32):
        V = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nblk, _, _ = cute.arch.grid_dim()
        warp = tidx // WARP
        lane = tidx % WARP
        col_chunk = lane % self.lanes_per_row
        row0 = warp * self.rows_per_warp + lane // self.lanes_per_row
        n_rows = mW.shape[0]
        k_cols = mW.shape[1]
        bk = (k_cols + self.block_k - 1) // self.block_k
        bn = (n_rows + self.block_m - 1) // self.block_m

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        partial = storage.partial.get_tensor(cute.make_layout((self.warps, 2)))

        buffers = [
            [cute.make_rmem_tensor((V,), self.in_dtype) for _ in range(self.steps)]
            for _ in range(2 if self.double_buffer else 1)
        ]
        _walk_tiles(
            bidx,
            nblk,
            bk,
            bn,
            buffers,
            lambda frags, br, bc: self._load_block(mW, frags, br, bc, row0, col_chunk, n_rows, k_cols),
            lambda frags, br, bc, parity: self._quantize_block(
                mQ, mS, frags, partial, parity, br, bc, row0, col_chunk, n_rows, k_cols, eps
            ),
        )

    @cute.jit
    def _load_block(self, mW, frags, br, bc, row0, col_chunk, n_rows, k_cols):
        """Issue this thread's 128-bit loads of block (br, bc) (zeros past N and K)."""
        V = self.vec
        chunk = bc * (self.block_k // V) + col_chunk
        col_ok = chunk * V < k_cols
        for i in cutlass.range_constexpr(self.steps):
            r = br * self.block_m + row0 + i * self.rows_per_step
            if col_ok & (r < n_rows):
                src = cute.local_tile(mW, (1, V), (r, chunk))
                cute.autovec_copy(src[0, None], frags[i])
            else:
                frags[i].fill(0)

    @cute.jit
    def _quantize_block(self, mQ, mS, frags, partial, parity, br, bc, row0, col_chunk, n_rows, k_cols, eps):
        """Reduce block (br, bc)'s |x| maximum over the CTA, then quantise and store it and its scale."""
        V = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        chunk = bc * (self.block_k // V) + col_chunk
        col_ok = chunk * V < k_cols
        amax = Int32(0)
        for i in cutlass.range_constexpr(self.steps):
            xf = frags[i].load().to(Float32)
            for e in cutlass.range_constexpr(V):
                amax = _abs_bits_max(amax, xf[e])
        amax = cute.arch.warp_reduction(amax, lambda a, b: cutlass.max(a, b))
        if lane == 0:
            partial[warp, parity] = amax
        cute.arch.sync_threads()
        amax = partial[0, parity]
        for wi in cutlass.range_constexpr(1, self.warps):
            amax = cutlass.max(amax, partial[wi, parity])
        s = _scale_from_amax(amax, eps, False)
        inv = Float32(1.0) / s
        for i in cutlass.range_constexpr(self.steps):
            r = br * self.block_m + row0 + i * self.rows_per_step
            qf = cute.make_rmem_tensor((V,), cutlass.Float8E4M3FN)
            _quantize_vec(frags[i].load().to(Float32), inv, qf)
            words = cute.recast_tensor(qf, Int32)
            if amax >= INF_BITS:
                for wd in cutlass.range_constexpr(V // 4):
                    words[wd] = Int32(E4M3_NAN_WORD)
            if col_ok & (r < n_rows):
                dst = cute.local_tile(mQ, (1, V), (r, chunk))
                cute.autovec_copy(qf, dst[0, None])
        if tidx == 0:
            mS[br, bc] = s


# ------------------------------------------------------------------------------------------------
# Grouped transposed per-token


class GroupedTransposedQuantKernel:
    """Grouped transposed FP8 quantize (MoE weight gradient): x [T, H] bf16, group_sizes int32 [G].

    Output, per group g with m_g tokens and ``P_g = 128 * ceil(m_g/128)``: the block
    ``x_g^T`` [H, P_g] (row h holds the group's tokens of hidden column h, the last ``P_g - m_g``
    bytes 0) quantised along tokens in 128-token blocks, at element offset ``128 * H * B_g`` of the
    flat output, ``B_g = sum_{j<g} ceil(m_j/128)``; scales [S, H] fp32 row-major, row ``B_g + b``
    for block b of group g. Rows of the scale tensor past ``B_G`` (the caller's upper bound S is
    larger) are blocks of zero tokens: q = 0 at ``128 * H * r + 128 * h``, scale ``eps/448``.

    Threads: ``128 * math_warpgroups`` (256), every warp alike. Tile: 128 tokens x 64 hidden
    columns (one scale row, 64 scales); tile ``tau`` is scale row ``tau // ceil(H/64)`` and hidden
    tile ``tau % ceil(H/64)``, so CTAs working at the same time read neighbouring 128-byte
    segments of the same token rows. Every input element is read exactly once.

    Tile walk: a CTA's first two tiles are ``bidx`` and ``bidx + grid``. With more than
    ``DYNAMIC_TILES_PER_CTA * grid`` tiles, later ones are claimed from ``tile_counter`` (one
    int32 in global memory): the n-th claim of the launch is tile ``2 * grid + n``, so a CTA that
    finishes its tiles early takes more of them (a static walk left SMs idle at the end while
    others still had a tile to do); otherwise the walk stays static (``bidx + k * grid``). Thread
    0 names each tile two tiles ahead (a claim is a relaxed atomic) and publishes it in shared
    memory before the barrier one tile ahead, so neither the atomic's latency nor the broadcast
    is waited for. The atomic is issued before the tile's loads: issued behind them it waited
    for them and the kernel ran 8% slower. Every thread works out a tile's coordinates and load
    parameters at the end of the tile before it, while that tile's loads are in flight. Every
    CTA claims until it gets a tile past the end, so a launch makes exactly ``tiles - grid``
    claims; the CTA whose claim is the last one (``old == tiles - grid - 1``)
    knows every other claim has been performed and sets the counter back to 0. So the counter
    must be 0 before a launch and is 0 after it; launches that run at the same time need their
    own counters. A CTA's tiles, hence its rows, only grow.

    Set-up (each CTA): warp 0 reads group_sizes and writes the exclusive prefix sums of
    ``min(max(m_g, 0), T)`` (token starts) and of their ``ceil(m_g/128)`` (block starts; both
    saturating at ``PREFIX_CAP``, so sizes from the GPU cannot overflow them) to shared memory,
    32 groups per step with ``shfl.up`` scans; one ``bar.sync``. A tile's group is found by
    scanning the block starts forward from the previous tile's group (the largest g with
    ``B_g <= row``, which skips empty groups; over a CTA's whole walk at most G steps), with no
    search per tile. Nothing is synchronised with the host.

    Per tile:
      1. load: thread ``t`` loads 16 bytes (8 hidden columns) of tokens ``t//8 + 32*i``,
         i = 0..3 (4 x 128-bit loads in flight; tokens past the group or past T and columns
         past H read as 0; a tile with none of those loads from one address plus multiples of
         the row stride, without predicates);
      2. ``st.shared.v4`` into a [128 tokens][32 words] buffer with an XOR swizzle: the 16-byte
         chunk c of token row t lives at chunk ``c ^ ((t >> 4) & 7)``;
      3. thread 0 publishes and claims; the next tile's loads (their addresses worked out at the
         end of the previous tile) are issued into the freed registers, so they are in flight
         during the barrier wait and this tile's computation; then ``bar.sync``; the shared
         buffers alternate between tiles, so one barrier per tile suffices;
      4. transpose-read: lane ``l`` of warp ``w`` owns the hidden pair ``(8w + 2(l%4), +1)`` and
         tokens ``16*(l//4) .. +15``: 16 ``ld.shared.b32``, each bf16 pair unpacked with a shift
         and a mask. With the swizzle, the 32 lanes of a warp hit 32 distinct banks on every
         read (bank = ``4*(w ^ l//4) + l%4``), and the quarter-warp of every 128-bit store
         writes one whole 128-byte row: no bank conflicts either way;
      5. amax of both columns at once (``max.u16x2`` on the |x| bits of the packed bf16 pairs)
         over the 16 local tokens, then over the 8 token segments with xor-shuffles 4, 8, 16;
         scale; ``cvt.rn.satfinite`` of 16 tokens per hidden column and one 128-bit store
         per column (a warp writes 8 x 128 contiguous bytes per column); lanes 0-3 store the
         scales of their two columns (8 bytes each).

    Shared memory: 2 x 16 KiB tile buffers + 2 x (QUANT_MAX_GROUPS + 1) int32 prefix sums + 2
    int32 claimed tiles (by tile parity). Barriers: ``bar.sync`` 0 once after the prefix sums and
    once per tile.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.threads = s.math_warpgroups * THREADS_PER_WARPGROUP
        self.warps = self.threads // WARP
        self.tile_t = s.tile_m  # 128 tokens
        self.tile_h = s.tile_n  # 64 hidden columns
        self.stages = s.stages  # 2 shared buffers
        self.words = self.tile_h // 2  # bf16 pairs per token row (32)
        self.chunks = self.tile_h * 2 // VEC_BYTES  # 16-byte chunks per token row (8)
        self.loads = self.tile_t * self.chunks // self.threads  # 4
        self.rows_per_load = self.threads // self.chunks  # 32
        self.segments = WARP // 4  # 8 token segments of 16
        self.seg_tokens = self.tile_t // self.segments  # 16
        self.max_groups = QUANT_MAX_GROUPS
        self.smem_bytes = None

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        group_sizes: cute.Tensor,
        q: cute.Tensor,
        sf: cute.Tensor,
        tile_counter: cute.Pointer,
        eps: Float32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        @cute.struct
        class SharedStorage:
            token_start: cute.struct.MemRange[Int32, self.max_groups + 1]
            block_start: cute.struct.MemRange[Int32, self.max_groups + 1]
            claimed: cute.struct.MemRange[Int32, 2]
            tile: cute.struct.Align[
                cute.struct.MemRange[Int32, self.stages * self.tile_t * self.words], 128
            ]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        # Grid rule "blocks": min(S * ceil_div(H, 64), max_active_clusters).
        tiles = sf.shape[0] * ((x.shape[1] + self.tile_h - 1) // self.tile_h)
        grid = cutlass.max(cutlass.min(tiles, max_active_clusters), 1)
        self.kernel(x, group_sizes, q, sf, tile_counter, eps).launch(
            grid=[grid, 1, 1],
            block=[self.threads, 1, 1],
            smem=self.smem_bytes,
            min_blocks_per_mp=MIN_CTAS_PER_SM["grouped"],
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT,
            stream=stream,
        )

    @cute.jit
    def _advance_group(self, g, r, s_total, sB, n_groups):
        """The group of scale row r, scanning forward from group g (the group of a row at or
        before r): the largest g' >= g with ``B_g' <= r``, skipping empty groups. A CTA's rows
        only grow, so over its whole walk the scans add up to at most the number of groups."""
        if r < s_total:
            nxt = sB[cutlass.min(g + 1, n_groups)]
            while nxt <= r:
                g = g + 1
                nxt = sB[cutlass.min(g + 1, n_groups)]
        return g

    @cute.jit
    def _next_tile(self, tile, r, g, h_tiles, s_rows, s_total, sT, sB, n_groups, hidden):
        """(scale row, hidden tile, group, load parameters (h0, token start, token count)) of
        tile number `tile`, which comes after the tile of row r and group g."""
        r_n = tile // h_tiles
        hi_n = tile - r_n * h_tiles
        g_n = self._advance_group(g, r_n, s_total, sB, n_groups)
        h0_n = Int32(0)
        tok0_n = Int32(0)
        count_n = Int32(0)
        if r_n < s_rows:
            h0_n, _, _, tok0_n, count_n = self._tile_at(r_n, hi_n, g_n, s_total, sT, sB, hidden)
        return r_n, hi_n, g_n, (h0_n, tok0_n, count_n)

    @cute.jit
    def _tile_at(self, r, hi, g, s_total, sT, sB, hidden):
        """(h0, q base, row pitch P, token start, token count) of the tile of scale row r and
        hidden tile hi, whose group is g."""
        h0 = hi * self.tile_h
        # A row past the real blocks: a block of zero tokens with its own 128-wide rows.
        base = Int64(r) * (self.tile_t * hidden)
        pitch = Int64(self.tile_t)
        tok0 = Int32(0)
        count = Int32(0)
        if r < s_total:
            b0 = sB[g]
            b = r - b0
            base = Int64(b0) * (self.tile_t * hidden) + Int64(b) * self.tile_t
            pitch = Int64(sB[g + 1] - b0) * self.tile_t
            tok0 = sT[g] + b * self.tile_t
            count = cutlass.min(sT[g + 1] - tok0, self.tile_t)
        return h0, base, pitch, tok0, count

    @cute.jit
    def _load_whole_tile(self, mX, frags, tidx, h0, tok0):
        """Loads of a tile whose every row and column is real (the common case): one address,
        the other rows at constant multiples of the row stride, no predicates, no zero fill."""
        chunk = tidx % self.chunks
        t0 = tidx // self.chunks
        row_bytes = Int64(mX.stride[0]) * 2
        first = Int64(tok0 + t0) * row_bytes + (h0 + chunk * 8) * 2
        for i in cutlass.range_constexpr(self.loads):
            row = first + row_bytes * (i * self.rows_per_load)
            src = vec16_at(cutlass.BFloat16, mX.iterator.toint(), row)
            cute.autovec_copy(src, frags[i])

    @cute.jit
    def _load_tile(self, mX, frags, tidx, h0, tok0, count):
        chunk = tidx % self.chunks
        t0 = tidx // self.chunks
        # Group sizes live on the GPU and are not checked against T, hence the last term.
        whole = (
            (count == self.tile_t)
            & (h0 + self.tile_h <= mX.shape[1])
            & (tok0 + self.tile_t <= mX.shape[0])
        )
        if whole:
            self._load_whole_tile(mX, frags, tidx, h0, tok0)
        else:
            col_ok = h0 + chunk * 8 < mX.shape[1]
            for i in cutlass.range_constexpr(self.loads):
                t = t0 + i * self.rows_per_load
                tok = tok0 + t
                if col_ok & (t < count) & (tok < mX.shape[0]):
                    src = cute.local_tile(mX, (1, 8), (tok, h0 // 8 + chunk))
                    cute.autovec_copy(src[0, None], frags[i])
                else:
                    frags[i].fill(0)

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mG: cute.Tensor,
        mQ: cute.Tensor,
        mS: cute.Tensor,
        counter_ptr: cute.Pointer,
        eps: Float32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nblk, _, _ = cute.arch.grid_dim()
        warp = tidx // WARP
        lane = tidx % WARP
        hidden = mX.shape[1]
        n_groups = mG.shape[0]
        s_rows = mS.shape[0]
        q_size = mQ.shape[0]

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sT = storage.token_start.get_tensor(cute.make_layout(self.max_groups + 1))
        sB = storage.block_start.get_tensor(cute.make_layout(self.max_groups + 1))
        sClaim = storage.claimed.get_tensor(cute.make_layout(2))
        # [word, token row, buffer]
        sTile = storage.tile.get_tensor(
            cute.make_layout(
                (self.words, self.tile_t, self.stages),
                stride=(1, self.words, self.words * self.tile_t),
            )
        )

        h_tiles = (hidden + self.tile_h - 1) // self.tile_h
        tiles = s_rows * h_tiles
        frags = [cute.make_rmem_tensor((8,), cutlass.BFloat16) for _ in range(self.loads)]
        # A CTA's first two tiles are bidx and bidx + grid; thread 0 names each later one two
        # tiles ahead (a claim from the tile counter, or the static walk's next tile) and passes
        # it to the CTA through shared memory one barrier ahead.
        dynamic = tiles > DYNAMIC_TILES_PER_CTA * nblk
        claim = bidx + 2 * nblk
        if (tidx == 0) & dynamic:
            claim = 2 * nblk + cute.arch.atomic_add(counter_ptr, Int32(1), sem="relaxed", scope="gpu")

        # ---- prefix sums of the group sizes (warp 0) --------------------------------------
        if warp == 0:
            carry_t = Int32(0)
            carry_b = Int32(0)
            for c in cutlass.range((n_groups + WARP - 1) // WARP):
                g = c * WARP + lane
                m = Int32(0)
                if g < n_groups:
                    m = cutlass.min(cutlass.max(mG[g], 0), mX.shape[0])
                nb = m // self.tile_t + cutlass.min(m % self.tile_t, 1)  # ceil(m/128), no overflow
                inc_t = m
                inc_b = nb
                # Sums saturate at PREFIX_CAP (past every T and S), so that no sizes overflow.
                for k in cutlass.range_constexpr(5):
                    off = 1 << k
                    up_t = cute.arch.shuffle_sync_up(inc_t, offset=off)
                    up_b = cute.arch.shuffle_sync_up(inc_b, offset=off)
                    if lane >= off:
                        inc_t = cutlass.min(inc_t + up_t, PREFIX_CAP)
                        inc_b = cutlass.min(inc_b + up_b, PREFIX_CAP)
                if g < n_groups:
                    sT[g] = cutlass.min(carry_t + inc_t - m, PREFIX_CAP)
                    sB[g] = cutlass.min(carry_b + inc_b - nb, PREFIX_CAP)
                carry_t = cutlass.min(carry_t + cute.arch.shuffle_sync(inc_t, offset=WARP - 1), PREFIX_CAP)
                carry_b = cutlass.min(carry_b + cute.arch.shuffle_sync(inc_b, offset=WARP - 1), PREFIX_CAP)
            if lane == 0:
                sT[n_groups] = carry_t
                sB[n_groups] = carry_b
        cute.arch.sync_threads()

        s_total = sB[n_groups]

        # Transpose-read coordinates of this thread.
        pair = warp * 4 + lane % 4  # word index within a token row
        seg = lane // 4  # token segment
        col = pair * 2  # first of the two hidden columns, within the tile
        read_word = pair ^ (seg * 4)  # swizzled word for every token row of the segment

        r = bidx // h_tiles
        hi = bidx - r * h_tiles
        g = self._advance_group(Int32(0), r, s_total, sB, n_groups)
        if r < s_rows:
            h0, _, _, tok0, count = self._tile_at(r, hi, g, s_total, sT, sB, hidden)
            self._load_tile(mX, frags, tidx, h0, tok0, count)
        # The next tile's coordinates and load parameters are known a tile ahead, so its loads
        # go out right after this tile's registers are stored.
        r_n, hi_n, g_n, load_n = self._next_tile(bidx + nblk, r, g, h_tiles, s_rows, s_total, sT, sB, n_groups, hidden)
        buf = Int32(0)
        while r < s_rows:
            # 2. registers -> swizzled shared buffer `buf`
            chunk = tidx % self.chunks
            for i in cutlass.range_constexpr(self.loads):
                t = tidx // self.chunks + i * self.rows_per_load
                slot = chunk ^ ((t >> 4) & 7)
                dst = cute.local_tile(sTile, (4, 1, 1), (slot, t, buf))
                cute.autovec_copy(cute.recast_tensor(frags[i], Int32), dst[None, 0, 0])
            # 3. thread 0's claim, then the next tile's loads: they go out as soon as the
            #    registers are free, before the barrier, and stay in flight while this tile is
            #    computed (a claim issued behind them waited for them: 8% slower)
            if tidx == 0:
                sClaim[buf] = claim
                if not dynamic:
                    claim = claim + nblk
                elif claim < tiles:
                    claim = 2 * nblk + cute.arch.atomic_add(counter_ptr, Int32(1), sem="relaxed", scope="gpu")
                elif claim == tiles + nblk - 1:
                    # The last of all claims (each CTA makes exactly one past the end): every
                    # other claim has been performed, so the counter can be zeroed for the next launch.
                    counter = cute.make_tensor(counter_ptr, cute.make_layout(1))
                    counter[0] = Int32(0)
            if r_n < s_rows:
                self._load_tile(mX, frags, tidx, *load_n)
            cute.arch.sync_threads()
            tile_nn = sClaim[buf]
            # Only (r, hi, g) live across the loop; the rest is re-read from shared memory.
            h0, base, pitch, tok0, count = self._tile_at(r, hi, g, s_total, sT, sB, hidden)
            # 4. transpose-read 16 tokens x 2 hidden columns
            pairs = cute.make_rmem_tensor((self.seg_tokens,), Int32)
            # |x| bits of both bf16 halves at once: as 16-bit unsigned integers they order like
            # the values (Inf and NaN above every finite value), so one max.u16x2 per word.
            amax2 = Int32(0)
            for i in cutlass.range_constexpr(self.seg_tokens):
                word = sTile[read_word, seg * self.seg_tokens + i, buf]
                pairs[i] = word
                amax2 = _max_u16x2(amax2, word & ABS_MASK_16X2)
            for k in cutlass.range_constexpr(3):
                off = 4 << k
                amax2 = _max_u16x2(amax2, cute.arch.shuffle_sync_bfly(amax2, offset=off))
            # Back to the fp32 bit patterns of the two columns' amax (bf16 bits are fp32's top half).
            amax_lo = amax2 << 16
            amax_hi = amax2 & Int32(-65536)
            s_lo = _scale_from_amax(amax_lo, eps, False)
            s_hi = _scale_from_amax(amax_hi, eps, False)
            # 5. quantise and store; bytes of padding tokens stay 0 even in a NaN block
            n_real = cutlass.max(cutlass.min(count - seg * self.seg_tokens, self.seg_tokens), 0)
            h = h0 + col
            row_off = base + Int64(h) * pitch + seg * self.seg_tokens
            for half in cutlass.range_constexpr(2):
                s = s_lo if half == 0 else s_hi
                amax = amax_lo if half == 0 else amax_hi
                vals = cute.make_rmem_tensor((self.seg_tokens,), Float32)
                for i in cutlass.range_constexpr(self.seg_tokens):
                    # bf16 -> fp32 is exact: the bf16 bits are the fp32's top half.
                    if cutlass.const_expr(half == 0):
                        vals[i] = (pairs[i] << 16).bitcast(Float32)
                    else:
                        vals[i] = (pairs[i] & Int32(-65536)).bitcast(Float32)
                qf = cute.make_rmem_tensor((self.seg_tokens,), cutlass.Float8E4M3FN)
                _quantize_vec(vals.load(), Float32(1.0) / s, qf)
                words = cute.recast_tensor(qf, Int32)
                if amax >= INF_BITS:
                    for wd in cutlass.range_constexpr(self.seg_tokens // 4):
                        real = cutlass.max(cutlass.min(n_real - wd * 4, 4), 0)
                        keep = Int32(-1)
                        if real < 4:
                            keep = (Int32(1) << (real * 8)) - 1
                        words[wd] = Int32(E4M3_NAN_WORD) & keep
                off = row_off + half * pitch
                if (h + half < hidden) & (off + self.seg_tokens <= q_size):
                    _store_flat16(mQ, off, qf)
            if (seg == 0) & (h < hidden) & (r < s_rows):
                pair_sf = cute.make_rmem_tensor((2,), Float32)
                pair_sf[0] = s_lo
                pair_sf[1] = s_hi
                dst_sf = cute.local_tile(mS, (1, 2), (r, h // 2))
                cute.autovec_copy(pair_sf, dst_sf[0, None])
            # The tile after next: its coordinates while the next tile's loads are in flight.
            r = r_n
            hi = hi_n
            g = g_n
            r_n, hi_n, g_n, load_n = self._next_tile(tile_nn, r, g, h_tiles, s_rows, s_total, sT, sB, n_groups, hidden)
            buf = buf ^ 1


# ------------------------------------------------------------------------------------------------
# The generator's view of the templates


class _QuantTemplateBase:
    """Common adapter: fake arguments, launch facts and the ABI of a quantize kernel."""

    kernel_class: type = PerTokenQuantKernel

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.contract = op_contract(schedule)
        self.kernel = self.kernel_class(schedule)

    def fake_arguments(self) -> tuple:
        return contract_fake_arguments(self.contract)

    def operands(self) -> list[dict]:
        return contract_operands(self.contract)

    def param_bindings(self) -> list[dict]:
        """Every argument taken as it is (`plain_binding`): tensors with run-time strides, the
        tile counter as a pointer, eps within `EPS_RANGE`."""
        return [plain_binding(arg, EPS_RANGE if arg.name == "eps" else None) for arg in self.contract]

    def launch_facts(self) -> dict:
        s = self.schedule
        smem = self.kernel.smem_bytes
        if smem is None:
            raise RuntimeError("launch_facts() is only known after the kernel has been traced")
        return {
            "block": [s.math_warpgroups * THREADS_PER_WARPGROUP, 1, 1],
            "cluster": [1, 1, 1],
            "smem_bytes": int(smem),
            "pdl": False,
            "cooperative": False,
        }


# The eps the kernels take: from the smallest that keeps eps/448 a normal fp32 (so that 1/scale
# is finite) to fp32's largest.
EPS_RANGE = (1e-30, 3.4028234663852886e38)


class _MatrixQuantTemplate(_QuantTemplateBase):
    """The per-token and per-block templates: one matrix [ROWS, K] in, q e4m3 [ROWS, K] and a
    scale matrix out (its strides are run-time values), as their contract names them; subclasses
    give the rows the grid covers and the scale rows the kernel writes."""

    grid_rows: str  # rows the grid covers (an expression over the symbols)
    scale_rows: str  # scale rows the kernel writes at least (an expression over the symbols)

    def grid_rule(self) -> dict:
        s = self.schedule
        return {
            "kind": "blocks",
            "blocks": [
                f"min(ceil_div({self.grid_rows}, {s.tile_m}) * ceil_div(K, {s.tile_n}), max_active_clusters)",
                "1",
                "1",
            ],
        }

    def requires(self) -> list[dict]:
        """Room in the scale matrix for every row's (or block row's) scales: the kernel writes
        ⌈K/group⌉ (packed UE8M0: ⌈K/(4 group)⌉) columns of `scale_rows` rows; packed FP4 rows
        are K/2 bytes."""
        sf = next(arg for arg in self.contract if arg.name == "sf")
        rows, cols = sf.shape
        per_column = self.schedule.tile_k * (4 if sf.dtype == "i32" else 1)
        packed = [requirement("KB", "==", "K // 2")] if self.schedule.c_dtype == DType.E2M1 else []
        return [
            requirement(rows, ">=", self.scale_rows),
            requirement(cols, ">=", f"ceil_div(K, {per_column})"),
            *packed,
        ]


class PerTokenQuantTemplate(_MatrixQuantTemplate):
    kernel_class = PerTokenQuantKernel
    scale_rows = "M"
    # The TMA-aligned MN-major scale layout may have more rows than x (padding rows get written).
    grid_rows = "max(M, SM)"


class PerBlockQuantTemplate(_MatrixQuantTemplate):
    kernel_class = PerBlockQuantKernel
    scale_rows = f"ceil_div(N, {QUANT_GROUP})"
    grid_rows = "N"


class GroupedTransposedQuantTemplate(_QuantTemplateBase):
    kernel_class = GroupedTransposedQuantKernel

    def grid_rule(self) -> dict:
        s = self.schedule
        return {
            "kind": "blocks",
            "blocks": [f"min(S * ceil_div(H, {s.tile_n}), max_active_clusters)", "1", "1"],
        }

    def requires(self) -> list[dict]:
        """q holds the S blocks of 128 tokens by H columns."""
        return [requirement("Q", ">=", f"{QUANT_GROUP} * H * S")]

