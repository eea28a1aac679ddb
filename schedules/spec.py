"""The schedule vocabulary: enums and the frozen `Schedule` dataclass every kernel is built from.

Nothing here imports the CuTe DSL or any other part of the project, so that listing and validating
schedules is instant on any machine.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any


class Arch(str, enum.Enum):
    """Target architecture; the value is the `CUTE_DSL_ARCH` string."""

    SM90A = "sm_90a"
    SM100A = "sm_100a"

    @property
    def tag(self) -> str:
        return {"sm_90a": "sm90a", "sm_100a": "sm100a"}[self.value]

    @property
    def compute_capability(self) -> tuple[int, int]:
        return {"sm_90a": (9, 0), "sm_100a": (10, 0)}[self.value]

    @property
    def smem_opt_in_bytes(self) -> int:
        """Largest dynamic shared memory one CTA may opt in to on this architecture."""
        return {"sm_90a": SM90_SMEM_OPT_IN_BYTES, "sm_100a": SM100_SMEM_OPT_IN_BYTES}[self.value]


class Op(str, enum.Enum):
    """The operation a kernel implements; the value is the torch entry point's name."""

    BF16_GEMM_NT = "bf16_gemm_nt"
    FP8_GEMM_NT = "fp8_gemm_nt"
    M_GROUPED_FP8_GEMM_NT_CONTIGUOUS = "m_grouped_fp8_gemm_nt_contiguous"
    M_GROUPED_FP8_GEMM_NT_MASKED = "m_grouped_fp8_gemm_nt_masked"
    FP8_WGRAD_GEMM_NT = "fp8_wgrad_gemm_nt"
    K_GROUPED_FP8_GEMM_NT_CONTIGUOUS = "k_grouped_fp8_gemm_nt_contiguous"
    M_GROUPED_BF16_GEMM_NT_CONTIGUOUS = "m_grouped_bf16_gemm_nt_contiguous"
    M_GROUPED_BF16_GEMM_NT_MASKED = "m_grouped_bf16_gemm_nt_masked"
    K_GROUPED_BF16_GEMM_TN_CONTIGUOUS = "k_grouped_bf16_gemm_tn_contiguous"
    K_GROUPED_FP8_GEMM_TN_CONTIGUOUS = "k_grouped_fp8_gemm_tn_contiguous"
    NVFP4_GEMM_NT = "nvfp4_gemm_nt"
    PER_TOKEN_QUANT_FP8 = "per_token_quant_fp8"
    PER_TOKEN_QUANT_FP4 = "per_token_quant_fp4"
    PER_BLOCK_QUANT_FP8 = "per_block_quant_fp8"
    GROUPED_TRANSPOSED_QUANT_FP8 = "grouped_transposed_quant_fp8"

    @property
    def tag(self) -> str:
        return {
            "bf16_gemm_nt": "gemm",
            "fp8_gemm_nt": "fp8gemm",
            "m_grouped_fp8_gemm_nt_contiguous": "mgfp8gemmc",
            "m_grouped_fp8_gemm_nt_masked": "mgfp8gemmm",
            "fp8_wgrad_gemm_nt": "fp8wgrad",
            "k_grouped_fp8_gemm_nt_contiguous": "kgfp8wgrad",
            "m_grouped_bf16_gemm_nt_contiguous": "mgbf16gemmc",
            "m_grouped_bf16_gemm_nt_masked": "mgbf16gemmm",
            "k_grouped_bf16_gemm_tn_contiguous": "kgbf16wgrad",
            "k_grouped_fp8_gemm_tn_contiguous": "kgfp8wgradtn",
            "nvfp4_gemm_nt": "nvfp4gemm",
            "per_token_quant_fp8": "ptquant",
            "per_token_quant_fp4": "ptquant4",
            "per_block_quant_fp8": "pbquant",
            "grouped_transposed_quant_fp8": "gtquant",
        }[self.value]

    @property
    def is_m_grouped(self) -> bool:
        """A mixture-of-experts GEMM: B (and SFB) carry a group mode, rows of A belong to groups."""
        return self.value in (
            "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
            "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked",
        )

    @property
    def scales_b_per_row(self) -> bool:
        """The weight-gradient recipe: B scaled per 1x128 along K (per row), like A."""
        return self.value in ("fp8_wgrad_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous")

    @property
    def is_k_grouped(self) -> bool:
        """The MoE weight gradient: groups split K (tokens); A, B and their scales are stored one
        group after another, D carries a group mode."""
        return self.value in (
            "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_tn_contiguous"
        )

    @property
    def accumulates(self) -> bool:
        """The weight gradients: D += A·Bᵀ, each tile added into D by the TMA's reduce-add."""
        return self.scales_b_per_row or self.is_k_grouped

    @property
    def splits_last_wave(self) -> bool:
        """The op's kernels take a `tail_split` launch argument: they may share the K blocks of
        their last, partial wave's tiles among all the clusters the GPU holds, each adding its
        part into D. The dense weight gradient, whose TMA reduce-add into D needs no fixup; not
        the k-grouped one, whose tiles' K differs by group, so that its clusters do not finish
        their whole tiles together and the pieces could land on the busiest ones (measured up to
        1.35x slower)."""
        return self.value == "fp8_wgrad_gemm_nt"

    @property
    def is_masked(self) -> bool:
        """The masked M-grouped layout: A and D carry a group mode, masked_m[g] rows are real."""
        return self.value in ("m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked")

    @property
    def is_quantize(self) -> bool:
        """A quantize op: no MMA, no producer warpgroup; see `QUANT_*` below for its field mapping."""
        return self.value in _QUANT_OPS

    @property
    def quantizes_per_token(self) -> bool:
        """The per-token quantizers (FP8 1x128, FP4 1x32): one template, its group and output
        type from the schedule."""
        return self.value in ("per_token_quant_fp8", "per_token_quant_fp4")


class DType(str, enum.Enum):
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    E4M3 = "e4m3"
    # FP4 E2M1, two per byte in global memory; taken only by the block-scaled MMA.
    E2M1 = "e2m1"

    @property
    def bits(self) -> int:
        return {"bf16": 16, "f16": 16, "f32": 32, "e4m3": 8, "e2m1": 4}[self.value]

    @property
    def bytes(self) -> int:
        """Bytes per element; a sub-byte type has none (see `smem_bytes`)."""
        if self.bits < 8:
            raise ValueError(f"{self.value} elements are {self.bits} bits: they have no whole bytes")
        return self.bits // 8

    @property
    def smem_bytes(self) -> int:
        """Bytes an element takes in shared memory: FP4 beside an FP8 operand is unpacked to one
        byte per element (the TMA's 16U4_ALIGN16B type), as the mxf8f6f4 MMA reads it."""
        return max(1, self.bits // 8)


# The manifest's TMA dtype of FP4 kept packed two per byte in shared memory (the TMA's
# 16U4_ALIGN8B type; `Schedule.fp4_packed_in_smem`), beside "e2m1", unpacked there.
TMA_FP4_PACKED = "e2m1_packed"


class ScaleFormat(str, enum.Enum):
    """How block scales of quantised operands are stored and applied (none for unscaled ops).

    ``f32`` and ``ue8m0`` (packed four per int32) scales are applied by promotion: each 128-wide K
    block's MMA result is scaled and summed on the CUDA cores. ``mx``: UE8M0 scales applied by the
    tensor cores (Blackwell's block-scaled MMA, one scale per 32 elements along K, in tensor
    memory), read in the MMA's blocked layout (`cutegen.runtime.mx_reference.to_blocked`). ``nv``:
    NVFP4's E4M3 scales, one per 16 elements along K, applied by the tensor cores in the same
    layout (``kind::mxf4nvf4``), beside a per-tensor fp32 scale the epilogue applies."""

    NONE = "none"
    F32 = "f32"
    UE8M0 = "ue8m0"
    MX = "mx"
    NV = "nv"

    @property
    def tag(self) -> str:
        return {"none": "nosf", "f32": "sff32", "ue8m0": "sfue8m0", "mx": "sfmx", "nv": "sfnv"}[self.value]

    @property
    def mma_vector(self) -> int:
        """Elements along K one scale covers where the tensor cores apply the scales (0 elsewhere)."""
        return {"mx": MX_SCALE_VECTOR, "nv": NV_SCALE_VECTOR}.get(self.value, 0)


class Multicast(str, enum.Enum):
    """Which operand's TMA loads are multicast across the CTAs of a cluster.

    A is shared by the CTAs of a cluster row (same M tile, different N tiles), so multicasting A
    needs cluster_n > 1; B is shared along cluster_m.
    """

    NONE = "none"
    A = "a"
    B = "b"
    AB = "ab"

    @property
    def tag(self) -> str:
        return {"none": "mc0", "a": "mcA", "b": "mcB", "ab": "mcAB"}[self.value]

    @property
    def covers_a(self) -> bool:
        return self in (Multicast.A, Multicast.AB)

    @property
    def covers_b(self) -> bool:
        return self in (Multicast.B, Multicast.AB)


class Epilogue(str, enum.Enum):
    """How the accumulator reaches global memory.

    ``tma_store``: the tile goes through shared memory to TMA stores, sub-tile by sub-tile; a
    single-wave Hopper tile stages the whole tile there when it fits (`Schedule.epilogue_whole_tile`).

    ``tma_store_whole_tile``: the same, with the whole tile staged for two-wave (256-row) Hopper
    tiles too, which `tma_store` moves through a ring of sub-tile buffers. Two barriers per tile
    instead of two per sub-tile: faster where K is short (a tile's main loop is then short
    beside its store: up to 1.11x at K 512), slower at long K (0.96-0.98x at K >= 7168 in 2-CTA
    clusters; NOTES N31), so the runtime's cost model prefers it only at short K.

    ``tma_store_per_warpgroup``: the whole tile staged too, but each math warpgroup converts,
    synchronises and stores its own 64-row sub-tiles (named barrier per warpgroup, one storing
    warp per warpgroup) instead of the two warpgroups meeting at CTA-wide barriers; so one
    warpgroup's epilogue and next tile's start overlap the other's main loop (Hopper, two math
    warpgroups, 16-bit output).

    ``tma_store_add``: the ``tma_store`` path with the TMA's reduce-add: each tile is added into
    D (D += A·Bᵀ, one fp32 or bf16 addition per element, by the one CTA that computed the tile),
    so D = C + A·Bᵀ takes D holding C. The weight gradients add into D with any epilogue.

    ``split_k_tma_store``: the K blocks of a tile are split over several CTAs (the split count is
    a launch argument); each CTA writes its fp32 partial sum to a global workspace and the last one
    to finish a tile adds the others' and stores the tile with TMA. Small-M problems whose few
    tiles cannot occupy every SM use it.

    ``split_k_last_wave_tma_store``: split K as ``split_k_tma_store`` (the same workspace and
    launch arguments), but only for the tiles of the last, partial wave: the whole waves' tiles
    are computed whole and stored directly, and the remaining tiles' K blocks are split over the
    clusters that would otherwise idle (at most ``K_SPLITS`` ways, as many as the idle clusters
    allow), so the last wave costs about 1/splits of a tile instead of a whole one. With fewer
    tiles than clusters every tile is in the last wave.

    ``split_k_tma_store_add``: split K as ``split_k_tma_store``, the last CTA of a tile adding its
    whole fp32 sum into D with the TMA's reduce-add as ``tma_store_add`` does (D = C + A·Bᵀ with D
    holding C, one addition per element in D's type): small-M problems that take C.
    """

    TMA_STORE = "tma_store"
    TMA_STORE_WHOLE_TILE = "tma_store_whole_tile"
    TMA_STORE_PER_WARPGROUP = "tma_store_per_warpgroup"
    SPLIT_K_TMA_STORE = "split_k_tma_store"
    SPLIT_K_LAST_WAVE_TMA_STORE = "split_k_last_wave_tma_store"
    TMA_STORE_ADD = "tma_store_add"
    SPLIT_K_TMA_STORE_ADD = "split_k_tma_store_add"

    @property
    def tag(self) -> str:
        return {
            "tma_store": "epitma", "tma_store_whole_tile": "epitmaw", "tma_store_per_warpgroup": "epiwg",
            "split_k_tma_store": "episk", "split_k_last_wave_tma_store": "episkw", "tma_store_add": "epiadd",
            "split_k_tma_store_add": "episkadd",
        }[self.value]

    @property
    def splits_k(self) -> bool:
        """Tiles' K blocks split over CTAs through the split-K workspace (every tile, or the last
        wave's only)."""
        return self in (Epilogue.SPLIT_K_TMA_STORE, Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE, Epilogue.SPLIT_K_TMA_STORE_ADD)

    @property
    def adds_into_d(self) -> bool:
        """Each tile's sum is added into D by the TMA's reduce-add (D = C + A·Bᵀ with D holding C)."""
        return self in (Epilogue.TMA_STORE_ADD, Epilogue.SPLIT_K_TMA_STORE_ADD)

    @property
    def splits_last_wave_only(self) -> bool:
        return self == Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE

    @property
    def per_warpgroup(self) -> bool:
        return self == Epilogue.TMA_STORE_PER_WARPGROUP

    @property
    def stages_whole_tile(self) -> bool:
        """An epilogue that stages the whole output tile whatever the number of waves."""
        return self in (Epilogue.TMA_STORE_WHOLE_TILE, Epilogue.TMA_STORE_PER_WARPGROUP)


class Layout(str, enum.Enum):
    """Which dimension of A and of B is contiguous, in DeepGEMM's letters: ``nt`` (the default),
    A [M, K] and B [N, K] both K-major; ``nn``: B MN-major (DeepGEMM's B given as [K, N]); ``tn``:
    A and B MN-major (A given as [K, M], B as [K, N]: a weight gradient); ``tt``: A MN-major.
    The kernel reads the MN-major operand through its TMA descriptor as it lies (no copy); the
    WGMMA reads MN-major operands of 16-bit types only."""

    NT = "nt"
    NN = "nn"
    TN = "tn"
    TT = "tt"

    @property
    def a_mn_major(self) -> bool:
        return self in (Layout.TN, Layout.TT)

    @property
    def b_mn_major(self) -> bool:
        return self in (Layout.NN, Layout.TN)


class OperandRoles(str, enum.Enum):
    """Which operand's rows are the MMA's M side. ``ab`` (the default): A's, so a tile's rows run
    along D's rows. ``ba`` (named ``swapab``): B's rows are the MMA's M and A's rows its N — the
    kernel computes Dᵀ = B·Aᵀ and stores it through a column-major view of D. The tile's rows
    (tile_m, 64 per math warpgroup) then run along N and its columns (tile_n, a multiple of 16)
    along M, so a few hundred rows of A are covered in steps of 16 rather than 64: M = 333 in three
    112-wide tiles (336 rows) where 128- and 192-row tiles compute 384."""

    AB = "ab"
    BA = "ba"

    @property
    def tag(self) -> str:
        return "swapab" if self == OperandRoles.BA else "ab"


class Activation(str, enum.Enum):
    """What the epilogue computes from the tile's fp32 sum before it is written (the schedule's
    epilogue description, beside `c_dtype`, the output's type).

    ``none``: the sum itself (plus C where the epilogue adds into D).

    ``silu``: x · sigmoid(x), as ``x / (1 + exp(-x))`` in fp32. ``gelu``: the exact GELU,
    ``0.5 · x · (1 + erf(x / √2))`` in fp32 (``torch.nn.functional.gelu``'s default). Both write
    the sum's type-converted activation where the plain epilogue writes the sum.

    ``swiglu``: SiLU(gate) · up for a mixture-of-experts up-projection whose weights hold gate and
    up rows interleaved in blocks of SWIGLU_BLOCK (`cutegen.runtime.fused_ops.interleave_gate_up`):
    a 2·SWIGLU_BLOCK-wide tile's first half is gate, its second half the matching up columns, so
    the tile yields SWIGLU_BLOCK activation columns. With an e4m3 `c_dtype` they are quantized per
    token and 1x128 block, the scale written MN-major and TMA-aligned: what the down-projection's
    FP8 GEMM takes as its A."""

    NONE = "none"
    SWIGLU = "swiglu"
    SILU = "silu"
    GELU = "gelu"

    @property
    def pairs_columns(self) -> bool:
        """The activation combines two output columns (gate, up) into one."""
        return self == Activation.SWIGLU


class Bias(str, enum.Enum):
    """What the epilogue adds to the tile's fp32 sum before its activation: nothing, or ``column``
    (named ``bias``), a vector of one value per output column in D's type (``y = act(A·Bᵀ + bias)``,
    the bias read as fp32)."""

    NONE = "none"
    COLUMN = "column"

    @property
    def tag(self) -> str:
        return "bias" if self == Bias.COLUMN else "none"


class OutputScale(str, enum.Enum):
    """How the per-token 1x128 scales of a quantized (e4m3) output are rounded; stored as fp32
    either way, in the layout the next FP8 GEMM reads as its sfa.

    ``f32``: ``s = max(amax, eps) / 448``, as `per_token_quant_fp8` computes it (never named).
    ``ue8m0``: that s rounded up to a power of two, ``2^ceil(log2 s)``, a value the 8-bit exponent
    format UE8M0 holds exactly, and the values quantized with it: the scales of models whose FP8
    recipe uses UE8M0 scales (DeepGEMM's ``use_ue8m0``), as fp32 for Hopper's FP8 GEMMs."""

    F32 = "f32"
    UE8M0 = "ue8m0"


class Raster(str, enum.Enum):
    """Order in which the persistent scheduler walks output tiles (within a swizzle group)."""

    ALONG_M = "along_m"
    ALONG_N = "along_n"

    @property
    def tag(self) -> str:
        return {"along_m": "rm", "along_n": "rn"}[self.value]


# The fields a quantize kernel does not use (no MMA, cluster, producer warpgroup or epilogue), at
# the values its schedules hold (and b_dtype = a_dtype); its procedural name leaves them out.
QUANT_NEUTRAL: dict[str, Any] = {
    "acc_dtype": DType.F32,
    "cluster_m": 1,
    "cluster_n": 1,
    "multicast": Multicast.NONE,
    "producer_regs": 0,
    "consumer_regs": 0,
    "epilogue": Epilogue.TMA_STORE,
    "raster": Raster.ALONG_M,
    "group_size": 1,
    "layout": Layout.NT,
    "operand_roles": OperandRoles.AB,
}

# Hardware facts used by the validity rules.
SM90_SMEM_OPT_IN_BYTES = 232448
SM100_SMEM_OPT_IN_BYTES = 232448
SM90_REGISTERS_PER_SM = 65536
THREADS_PER_WARPGROUP = 128
# Shared memory the templates reserve beside the operand stages: mbarriers, scheduler
# scratch and the alignment padding of the 1024-byte aligned buffers.
SMEM_RESERVED_BYTES = 1024
SMEM_BUFFER_ALIGN_BYTES = 1024
EPILOGUE_STAGES = 4
# The epilogue ring of column-wave tiles (`Schedule.column_waves`): two sub-tile buffers leave
# room for a fourth operand stage of 128x256 (4 x 48.5 KB): 1.00-1.07x 128x192 at K 7168, where
# three stages ran 0.99-1.04x (NOTES N66).
COLUMN_WAVE_EPILOGUE_STAGES = 2
# Accumulator registers (promoted sum + the ring of WGMMA accumulators) up to which a single-wave
# block-scaled tile keeps more than one WGMMA accumulator: 128x128 with two math warpgroups
# (64 + 2 x 64) fits under consumer_regs=232 without local memory.
DOUBLE_ACCUMULATOR_REGISTERS = 192
# Deepest accumulator ring, for tiles with at most DEEP_RING_MAX_ACCUMULATORS accumulators per
# thread (64x16, 64x32): their K loop is bound by each block's latency (stage wait, WGMMAs, wait,
# promotion), and three blocks in flight instead of one measured 1.12-1.16x faster, 64x64 0.87x,
# so wider tiles keep two (NOTES N16; two accumulators per block did not help, NOTES N21).
MAX_WGMMA_ACCUMULATORS = 4
DEEP_RING_MAX_ACCUMULATORS = 16
# Static-stage rounds (`Schedule.static_stage_rounds`) copy the main loop once per stage; loops
# already copied once per SFB boundary more than this many times lost to the code size.
STATIC_ROUNDS_MAX_LOOP_COPIES = 2
# Per-thread accumulators above which a tile that holds its column scales early spilled with
# static-stage rounds (128x176 weight gradient: 88; 128x160's 80 did not).
STATIC_ROUNDS_MAX_EARLY_COLUMN_ACCUMULATORS = 80
# Math-warpgroup register budget from which a k-grouped tile not a multiple of 128 wide holds its
# column scales early: 128x112 spilled at 232 (2 local loads and stores); 128x160 at 240 did not.
K_GROUPED_EARLY_COLUMNS_MIN_REGS = 240
# Three 8 KiB fp32 sub-tiles: what lets a 256x128 weight-gradient tile keep 4 operand stages.
F32_EPILOGUE_STAGES = 3
# Blackwell (sm_100a): tensor memory is 128 lanes x 512 fp32 columns per SM; an accumulator
# stage of a tcgen05 tile takes tile_n columns. Up to four stages let the MMA warp run that many
# K blocks ahead of the warps that promote them.
SM100_TMEM_COLUMNS = 512
# The block-scaled MMA's scales: one per MX_SCALE_VECTOR elements along K, in 512-byte blocked
# atoms of 128 rows x 4 scales (a 128-wide K tile), 4 tensor-memory columns each; an accumulator stage per tile in
# flight (two let the epilogue of one tile run beside the next tile's MMAs).
MX_SCALE_VECTOR = 32
# NVFP4 (`ScaleFormat.NV`): one E4M3 scale per 16 elements, in the same atoms.
NV_SCALE_VECTOR = 16
MX_ATOM_ROWS = 128
MX_ATOM_SCALES = 4
MX_ATOM_BYTES = 512
MX_ATOM_TMEM_COLUMNS = 4
MX_ACCUMULATOR_STAGES = 2
SM100_MAX_ACCUMULATOR_STAGES = 4
# Blackwell epilogue: 128-row sub-tiles (one row per TMEM lane and thread), two in flight; the
# update warps load the accumulator from tensor memory in chunks of one sub-tile's columns.
SM100_EPILOGUE_STAGES = 2
SM100_EPILOGUE_COLUMNS = 32
# Quantize ops: the group (1x128 per token, 128x128 per block; FP4 1x32, the block-scaled MMA's
# scale vector) and the most groups the grouped transposed kernel's shared-memory prefix sums hold.
_QUANT_OPS = frozenset({"per_token_quant_fp8", "per_token_quant_fp4", "per_block_quant_fp8", "grouped_transposed_quant_fp8"})
QUANT_GROUP = 128
FP4_QUANT_GROUP = MX_SCALE_VECTOR
QUANT_MAX_GROUPS = 1024
# Columns of a per-token quantize tile one warp covers (16 elements per lane, 4 groups); a tile is
# 1 or 2 of them wide.
PER_TOKEN_WARP_COLS = 512
PER_TOKEN_TILE_COLS = (512, 1024)
# Block-scaled ops: one scale per 128 elements along K (and per 128 rows of B).
SCALE_BLOCK = 128
# Width of a column wave of a block-scaled Hopper tile (`Schedule.column_waves`): one SFB block.
COLUMN_WAVE_WIDTH = SCALE_BLOCK
# A tail split (`Op.splits_last_wave`) shares the last wave's K blocks only where it pays: that
# wave is at most TAIL_SPLIT_MAX_FILL full, and each cluster is spared at least
# TAIL_SPLIT_MIN_SAVED_BLOCKS of the K blocks a whole tile would have cost it (a piece costs a
# pipeline fill and a reduce-add of its tile, ~2.5 µs; splits saving 4 and 8 K blocks measured
# 0.84x and 0.96x: NOTES N36). The runtime's heuristic mirrors both.
TAIL_SPLIT_MAX_FILL = (4, 5)
TAIL_SPLIT_MIN_SAVED_BLOCKS = 8
# SwiGLU epilogues: gate and up rows of the weights interleave in blocks of this many, one
# per-token quantization group of activation columns per 2·SWIGLU_BLOCK-wide tile.
SWIGLU_BLOCK = 128
# Padding after each staged row of quantized activations: a warp's quads write 8 rows at once,
# which a 16-byte pad per 128-byte row spreads over distinct banks (16-byte aligned for the
# bulk copies).
QUANTIZED_ROW_PAD_BYTES = 16
# A TMA tensor copy's shared-memory destination must be 128-byte aligned, so each stage of a
# TMA-staged scale vector starts on a 128-byte boundary.
TMA_SMEM_ALIGN_BYTES = 128


def scale_stage_elems(rows: int) -> int:
    """fp32 slots one pipeline stage of a TMA-staged scale vector of ``rows`` scales occupies:
    ``rows`` rounded up so that the next stage starts 128-byte aligned (112 -> 128, 144 -> 160)."""
    per_line = TMA_SMEM_ALIGN_BYTES // 4
    return -(-rows // per_line) * per_line


def sfb_boundaries(tile_n: int) -> tuple[int, ...]:
    """Where in an N tile the second 128-column SFB block begins, over every tile position:
    tile j starts at column j·tile_n, so its boundary is 128 - (j·tile_n mod 128). Largest
    first: (128, 64) for 192-wide tiles, (128, 96, 64, 32) for 160, eight values for 112 and
    144; (128,) for tiles that divide 128 and so lie in one block wherever they start."""
    if SCALE_BLOCK % tile_n == 0:
        return (SCALE_BLOCK,)
    step = math.gcd(tile_n, SCALE_BLOCK)
    return tuple(range(SCALE_BLOCK, 0, -step))


@dataclasses.dataclass(frozen=True, order=True)
class Schedule:
    """One fully resolved kernel configuration.

    Every field takes part in the procedural name (see `naming.py`), so two schedules are the
    same kernel exactly when they are equal.
    """

    arch: Arch
    op: Op
    a_dtype: DType
    b_dtype: DType
    c_dtype: DType
    acc_dtype: DType
    scale: ScaleFormat
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    multicast: Multicast
    stages: int
    math_warpgroups: int
    producer_regs: int
    consumer_regs: int
    epilogue: Epilogue
    raster: Raster
    group_size: int
    # Named only when not the default (`naming`): every kernel before it is "nt".
    layout: Layout = Layout.NT
    # Named only when not the default (`naming`): every kernel before it writes the sum.
    activation: Activation = Activation.NONE
    # Named only when not the default (`naming`), before the activation.
    bias: Bias = Bias.NONE
    # Named only when not the default (`naming`), after the output scale rounding.
    d_scale: OutputScale = OutputScale.F32
    # Named only when not the default (`naming`), last: which operand feeds the MMA's M side.
    operand_roles: OperandRoles = OperandRoles.AB

    # ---- derived facts, one definition each -------------------------------------------------
    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def swaps_ab(self) -> bool:
        """B's rows are the MMA's M side (`OperandRoles.BA`): tile_m runs along N, tile_n along M."""
        return self.operand_roles == OperandRoles.BA

    @property
    def tile_extents(self) -> tuple[str, str]:
        """The extent symbols a tile's rows and columns run along (the grid rule's extent_m and
        extent_n): M and N, or N and M where the operand roles are swapped."""
        return ("N", "M") if self.swaps_ab else ("M", "N")

    @property
    def mma_ctas(self) -> int:
        """CTAs one MMA instruction spans: 2 for a Blackwell CTA pair (sm_100a with cluster_m=2:
        the tcgen05 MMA of M = 2 x tile_m reads each CTA's own A rows and half of B from each CTA,
        which is how the pair shares B — the schedule's ``multicast = "b"``), else 1."""
        if self.arch == Arch.SM100A and self.cluster_m == 2:
            return 2
        return 1

    @property
    def tmem_accumulator_stages(self) -> int:
        """Blackwell: tensor-memory accumulator stages, as many as fit in SM100_TMEM_COLUMNS beside
        the scale columns: one per K block in flight (promotion), at most
        SM100_MAX_ACCUMULATOR_STAGES; one per tile in flight, at most MX_ACCUMULATOR_STAGES, when
        the MMA applies the scales. 0 on Hopper."""
        if self.arch != Arch.SM100A or self.tile_n <= 0:
            return 0
        most = MX_ACCUMULATOR_STAGES if self.mma_applies_scales else SM100_MAX_ACCUMULATOR_STAGES
        return max(1, min(most, (SM100_TMEM_COLUMNS - self.tmem_scale_columns) // self.tile_n))

    @property
    def mma_applies_scales(self) -> bool:
        """The tensor cores apply the block scales (`ScaleFormat.MX`, `ScaleFormat.NV`): no promotion."""
        return self.scale.mma_vector > 0

    @property
    def mx_atoms_per_k_tile(self) -> int:
        """Blocked scale atoms one 128-row block holds per K tile (each covers 4 scales along K):
        1 for MX (128 elements), 4 for NVFP4 (256 elements in 16-element vectors); 0 unless the
        MMA applies the scales."""
        vector = self.scale.mma_vector
        return self.tile_k // (MX_ATOM_SCALES * vector) if vector else 0

    @property
    def mx_scale_atoms(self) -> tuple[int, int]:
        """Blocked scale atoms (128 rows x 4 scales, MX_ATOM_BYTES) a stage of a tile holds: (SFA's,
        SFB's); (0, 0) unless the MMA applies the scales."""
        per_rows = self.mx_atoms_per_k_tile
        return (-(-self.tile_m // MX_ATOM_ROWS) * per_rows, -(-self.tile_n // MX_ATOM_ROWS) * per_rows)

    @property
    def fp4_packed_in_smem(self) -> bool:
        """Both operands FP4: shared memory holds them packed, two per byte (`kind::mxf4nvf4` reads
        them so); FP4 beside FP8 is unpacked to a byte each (`DType.smem_bytes`)."""
        return self.a_dtype == self.b_dtype == DType.E2M1

    def smem_bits(self, dtype: DType) -> int:
        """Bits one element of an operand of `dtype` takes in shared memory."""
        return dtype.bits if self.fp4_packed_in_smem else 8 * dtype.smem_bytes

    @property
    def tmem_columns(self) -> int:
        """Blackwell: tensor-memory columns the kernel uses: its accumulator stages (tile_n fp32
        columns each) plus the columns of scale factors held in tensor memory (none: the fp32
        scales are applied outside the MMA, in registers); 0 on Hopper."""
        return self.tmem_accumulator_stages * self.tile_n + self.tmem_scale_columns

    @property
    def tmem_scale_columns(self) -> int:
        """Blackwell: tensor-memory columns of MMA scale factors: MX_ATOM_TMEM_COLUMNS per blocked
        atom of a stage when the MMA applies the scales (kind::mxf8f6f4 reads them there); none
        when they are applied by promotion, in registers."""
        return MX_ATOM_TMEM_COLUMNS * sum(self.mx_scale_atoms)

    @property
    def threads_per_cta(self) -> int:
        if self.op.is_quantize:  # no producer warpgroup: math_warpgroups counts every thread
            return self.math_warpgroups * THREADS_PER_WARPGROUP
        # One producer warpgroup (one TMA warp working, three idle) plus the math warpgroups.
        return (1 + self.math_warpgroups) * THREADS_PER_WARPGROUP

    @property
    def adds_into_d(self) -> bool:
        """Tiles are added into D by the TMA's reduce-add instead of stored: the weight
        gradients (`Op.accumulates`) and the adding epilogues (`Epilogue.adds_into_d`)."""
        return self.op.accumulates or self.epilogue.adds_into_d

    @property
    def block_scaled(self) -> bool:
        return self.scale != ScaleFormat.NONE

    @property
    def quant_neutral(self) -> bool:
        """A quantize schedule whose unused fields hold their neutral values (`QUANT_NEUTRAL`, and
        b_dtype = a_dtype): its name is the quantizer's short form."""
        return (
            self.op.is_quantize
            and self.b_dtype == self.a_dtype
            and all(getattr(self, field) == value for field, value in QUANT_NEUTRAL.items())
        )

    @property
    def stage_bytes(self) -> int:
        """Shared memory of one pipeline stage: A and B tiles, plus the tile's SFA column when scaled.
        Quantize ops: one shared tile buffer (grouped transposed: tile_m x tile_n inputs; else 0)."""
        if self.op.is_quantize:
            if self.op == Op.GROUPED_TRANSPOSED_QUANT_FP8:
                return self.tile_m * self.tile_n * self.a_dtype.bytes
            return 0
        # A Blackwell CTA pair loads half of B in each CTA.
        b_rows = self.tile_n // self.mma_ctas
        ab = self.tile_k * (self.tile_m * self.smem_bits(self.a_dtype) + b_rows * self.smem_bits(self.b_dtype)) // 8
        if self.arch == Arch.SM100A:
            # Promotion reads the scales from global memory: stages hold A, B; the block-scaled
            # MMA's stages hold its blocked scale atoms too.
            return ab + MX_ATOM_BYTES * sum(self.mx_scale_atoms)
        scales = 4 * scale_stage_elems(self.tile_m) if self.block_scaled else 0
        if self.op.scales_b_per_row:
            scales += 4 * scale_stage_elems(self.tile_n)
        return ab + scales

    @property
    def epi_tile(self) -> tuple[int, int]:
        """The (M, N) sub-tile one epilogue step moves through shared memory with one TMA store."""
        # 32 columns per step when they divide the tile, else 16 (tiles such as 112 or 144 wide);
        # fp32 outputs always take 16, the bytes of a 32-column bf16 sub-tile.
        en = 32 if self.tile_n % 32 == 0 and self.c_dtype.bits <= 16 else 16
        if self.arch == Arch.SM100A:
            # One thread per TMEM lane: the sub-tile spans all the CTA's rows.
            return (self.tile_m, min(self.tile_n, en))
        if self.epilogue.per_warpgroup:
            # One warpgroup's rows of one wave: each sub-tile is written and stored by one.
            return (64, min(self.tile_n, en))
        return (min(self.tile_m, 64 * self.math_warpgroups), min(self.tile_n, en))

    @property
    def epilogue_bytes(self) -> int:
        if self.op.is_quantize:  # the quantizers store straight from registers to global memory
            return 0
        if self.stages_quantized_rows:
            return self.tile_m * self.quantized_row_bytes
        em, en = self.epi_tile
        return self.epilogue_stages * em * en * self.c_dtype.bytes

    @property
    def epilogue_subtiles(self) -> int:
        """Sub-tiles (`epi_tile`) that make up one output tile."""
        em, en = self.epi_tile
        return (self.tile_m // em) * (self.tile_n // en) if em and en else 0

    @property
    def epilogue_whole_tile(self) -> bool:
        """Whether the Hopper epilogue stages the whole output tile in shared memory (one buffer
        per sub-tile: two barriers per tile instead of two per sub-tile, see the template): for
        16-bit outputs of single-wave tiles (tile_m = 64 x math warpgroups), when it fits beside
        this schedule's operand stages. `stages = "auto"` takes the most stages that fit with the
        EPILOGUE_STAGES ring first, so staging the whole tile never costs an operand stage.
        Measured: 128-row tiles 1.00-1.11x faster with it; 256-row tiles 0.96-0.98x at long K in
        2-CTA clusters, so they keep the ring (NOTES N20, N31) unless the epilogue is
        `tma_store_whole_tile` (whose fit the `smem_fits` rule checks)."""
        if self.arch != Arch.SM90A or self.op.is_quantize or self.c_dtype.bytes != 2:
            return False
        if self.epilogue.stages_whole_tile:
            return True
        if self.waves != 1:
            return False
        em, en = self.epi_tile
        whole = self.epilogue_subtiles * em * en * self.c_dtype.bytes
        fixed = SMEM_RESERVED_BYTES + 2 * SMEM_BUFFER_ALIGN_BYTES
        return self.stages * self.stage_bytes + whole + fixed <= SM90_SMEM_OPT_IN_BYTES

    @property
    def epilogue_stages(self) -> int:
        """Sub-tile buffers of the epilogue in shared memory: every sub-tile of the tile when
        `epilogue_whole_tile`, else a ring of EPILOGUE_STAGES (COLUMN_WAVE_EPILOGUE_STAGES for
        column-wave tiles), or F32_EPILOGUE_STAGES for fp32 outputs (weight gradients), whose
        tiles need the room for operand stages; SM100_EPILOGUE_STAGES for Blackwell's 128-row
        sub-tiles."""
        if self.arch == Arch.SM100A:
            return SM100_EPILOGUE_STAGES
        if self.epilogue_whole_tile:
            return self.epilogue_subtiles
        if self.column_waves > 1:
            return COLUMN_WAVE_EPILOGUE_STAGES
        return F32_EPILOGUE_STAGES if self.c_dtype == DType.F32 else EPILOGUE_STAGES

    @property
    def barrier_bytes(self) -> int:
        # Full and empty mbarrier per stage, 8 bytes each (and per accumulator stage on sm_100a).
        return 2 * 8 * (self.stages + self.tmem_accumulator_stages)

    @property
    def smem_bytes(self) -> int:
        """The shared memory the `smem_fits` rule budgets: for a GEMM, an upper bound of the traced
        kernel's dynamic plus static shared memory, at most two buffer alignments above it (for
        a quantizer, exactly its dynamic shared memory); `tests/cpu/test_default_catalogue.py`
        relates the two for every default kernel."""
        if self.op.is_quantize:
            return self.quant_smem_bytes
        return (
            self.stages * self.stage_bytes
            + self.epilogue_bytes
            + SMEM_RESERVED_BYTES
            + 2 * SMEM_BUFFER_ALIGN_BYTES
        )

    @property
    def quant_smem_bytes(self) -> int:
        """Shared memory of a quantize kernel: the grouped transposed kernel's prefix sums and
        claimed tiles (2 x (QUANT_MAX_GROUPS + 1) + 2 int32, padded to 128 bytes) and `stages`
        tile buffers; the per-block kernel's 2 x warps partial maxima; the per-token kernel's
        scale words of a batch by parity (2 x stages x rows x words per tile row: one per group
        for fp32, one per 4 groups packed for UE8M0)."""
        if self.op == Op.GROUPED_TRANSPOSED_QUANT_FP8:
            prefix = -(-4 * (2 * (QUANT_MAX_GROUPS + 1) + 2) // 128) * 128
            return prefix + self.stages * self.stage_bytes
        if self.op == Op.PER_BLOCK_QUANT_FP8:
            return 2 * 4 * self.threads_per_cta // 32
        if self.op.quantizes_per_token:
            groups_per_word = 4 if self.scale == ScaleFormat.UE8M0 else 1
            return 2 * 4 * self.stages * self.tile_m * (self.tile_n // self.tile_k // groups_per_word)
        return 0

    @property
    def accumulators_per_thread(self) -> int:
        return self.tile_m * self.tile_n // (self.math_warpgroups * THREADS_PER_WARPGROUP)

    @property
    def accumulator_registers(self) -> int:
        """fp32 registers per math thread that hold accumulators: the block-scaled path keeps
        the promoted sum of the whole tile and `wgmma_accumulators` WGMMA accumulators of one wave.
        Blackwell: one thread per row holds the row's promoted sum (tile_n / math_warpgroups) and
        one SM100_EPILOGUE_COLUMNS chunk loaded from tensor memory."""
        if self.arch == Arch.SM100A:
            if self.mma_applies_scales:  # no promoted sum: one chunk at a time
                return SM100_EPILOGUE_COLUMNS
            return self.tile_n // max(1, self.math_warpgroups) + SM100_EPILOGUE_COLUMNS
        if self.block_scaled_gemm:
            per_wave = self.accumulators_per_thread // self.all_waves
            return self.accumulators_per_thread + per_wave * self.wgmma_accumulators
        return self.accumulators_per_thread

    @property
    def wgmma_accumulators(self) -> int:
        """WGMMA accumulators a block-scaled math warpgroup cycles through (a ring: the WGMMAs of
        the next D-1 K blocks run while one block is promoted): for tiles computed in one wave,
        the most whose promoted sum and accumulators (and per-row SFB) fit in
        DOUBLE_ACCUMULATOR_REGISTERS, up to MAX_WGMMA_ACCUMULATORS for the smallest tiles and
        two for the others; else one."""
        if not self.block_scaled_gemm or self.all_waves != 1 or self.arch == Arch.SM100A:
            return 1
        per_thread = self.accumulators_per_thread
        # The promotion of per-row SFB also holds one scale per column of the thread: half its
        # accumulators (the dense 128x128 weight-gradient tile spilled without this term).
        held = per_thread + (per_thread // 2 if self.op.scales_b_per_row else 0)
        fitting = (DOUBLE_ACCUMULATOR_REGISTERS - held) // per_thread
        if fitting < 2:
            return 1
        deepest = MAX_WGMMA_ACCUMULATORS if per_thread <= DEEP_RING_MAX_ACCUMULATORS else 2
        return min(deepest, fitting)

    @property
    def column_scales_early(self) -> bool:
        """Whether the Hopper main loop of a per-row-scaled op (weight gradients: one SFB per row
        of B) reads each K block's column scales from the stage while the block's WGMMAs run,
        hands the stage back before the promotion and unrolls its K loop twice, instead of
        reading them after the WGMMA wait in a rolled loop. Single-wave tiles in multicast
        clusters only. Measured: 128x128 in 2x1 and 1x2 clusters 1.04-1.08x (dense), 1.11-1.17x
        (k-grouped), 0.94x in a 1x1 cluster, which ptxas schedules differently (NOTES N27).
        Two-wave tiles have no room for a thread's 32 column scales (256x128 spilled unrolled), and
        k-grouped tiles not a multiple of 128 wide spilled with them held under 232 registers; with
        K_GROUPED_EARLY_COLUMNS_MIN_REGS they fit (the k-grouped 128x160 tile, NOTES N57)."""
        k_grouped_crowded = (
            self.op.is_k_grouped
            and self.tile_n % SCALE_BLOCK != 0
            and self.consumer_regs < K_GROUPED_EARLY_COLUMNS_MIN_REGS
        )
        return (
            self.arch == Arch.SM90A
            and self.op.scales_b_per_row
            and self.waves == 1
            and self.cluster_size > 1
            and not k_grouped_crowded
        )

    @property
    def static_stage_rounds(self) -> bool:
        """Whether the Hopper single-accumulator block-scaled main loop runs the K blocks from a
        stage-0 block on in rounds of one block per stage, each stage's index a constant of the
        code (so its WGMMA descriptors, SFA and barrier addresses are immediates: about 138
        instructions per K block and math warp instead of 184 for 128x192, as in DeepGEMM's
        kernels), the blocks before and after the rounds with run-time stage indices. Measured:
        1.00-1.05x on 128x192 and 256x128, up to 1.10x on weight gradients (NOTES N50). Not for
        accumulator rings, nor where the loop is already copied per SFB boundary more than
        STATIC_ROUNDS_MAX_LOOP_COPIES times (112- and 144-wide tiles lost 0.92-0.97x to the code
        size), nor for tiles holding their column scales early with more than
        STATIC_ROUNDS_MAX_EARLY_COLUMN_ACCUMULATORS accumulators per thread (128x176 weight
        gradient spilled, 0.93x)."""
        loop_copies = 1 if self.op.scales_b_per_row else len(sfb_boundaries(self.tile_n))
        early_columns_crowded = (
            self.column_scales_early and self.accumulators_per_thread > STATIC_ROUNDS_MAX_EARLY_COLUMN_ACCUMULATORS
        )
        return (
            self.arch == Arch.SM90A
            and self.block_scaled_gemm
            and self.wgmma_accumulators == 1
            and loop_copies <= STATIC_ROUNDS_MAX_LOOP_COPIES
            and not early_columns_crowded
        )

    @property
    def fused_epilogue(self) -> bool:
        """The epilogue adds a bias (`Bias`) or applies an activation (`Activation`) before it
        writes D."""
        return self.adds_bias or self.activation != Activation.NONE

    @property
    def adds_bias(self) -> bool:
        """The epilogue adds a bias per column of D (`Bias`)."""
        return self.bias != Bias.NONE

    @property
    def stages_quantized_rows(self) -> bool:
        """The epilogue of the activation that pairs gate and up columns: quantized in registers,
        its e4m3 rows staged in shared memory (`quantized_row_bytes` apart) and each copied to D
        by one bulk copy, its scales stored from registers (not the stmatrix + TMA-store path)."""
        return self.activation.pairs_columns

    @property
    def quantized_row_bytes(self) -> int:
        """Shared-memory bytes from one staged row of quantized activations to the next: the
        tile's tile_n / 2 outputs and `QUANTIZED_ROW_PAD_BYTES`."""
        return self.tile_n // 2 * self.c_dtype.bytes + QUANTIZED_ROW_PAD_BYTES

    @property
    def transforms_sum(self) -> bool:
        """The plain epilogue stores the tile's sum after a bias and an elementwise activation
        have been applied to it in registers."""
        return self.fused_epilogue and not self.stages_quantized_rows

    @property
    def entry(self) -> str:
        """The runtime entry point (and the manifest's op) of this schedule's kernels: the op's
        name, followed where the epilogue is fused by ``bias``, the activation's name and
        ``quant`` for an e4m3 output, then ``ue8m0`` where its scales are rounded to powers of
        two (``m_grouped_fp8_gemm_nt_masked_swiglu_quant``, ``fp8_gemm_nt_swiglu_quant_ue8m0``,
        ``fp8_gemm_nt_bias_gelu``)."""
        parts = [self.op.value]
        if self.adds_bias:
            parts.append("bias")
        if self.activation != Activation.NONE:
            parts.append(self.activation.value)
        if self.fused_epilogue and self.c_dtype == DType.E4M3:
            parts.append("quant")
        if self.d_scale != OutputScale.F32:
            parts.append(self.d_scale.value)
        return "_".join(parts)

    @property
    def output_columns_per_tile(self) -> int:
        """Columns of D one tile writes: tile_n, or half of it where the activation pairs gate
        and up columns."""
        return self.tile_n // 2 if self.activation.pairs_columns else self.tile_n

    @property
    def block_scaled_gemm(self) -> bool:
        """A GEMM with fp32 block scales (promotes per K block), as opposed to a quantize op."""
        return self.block_scaled and not self.op.is_quantize

    @property
    def sfb_per_block(self) -> bool:
        """A block-scaled GEMM with one SFB per 128x128 block of B."""
        return self.block_scaled_gemm and not self.op.scales_b_per_row

    @property
    def sfb_per_row(self) -> bool:
        """A block-scaled GEMM with one SFB per row of B and 128 K (the weight gradients)."""
        return self.block_scaled_gemm and self.op.scales_b_per_row

    @property
    def straddles_scale_blocks(self) -> bool:
        """Per-block SFB and tiles that can span two 128-column SFB blocks (`sfb_boundaries`)."""
        return self.sfb_per_block and SCALE_BLOCK % self.tile_n != 0

    @property
    def single_wave_tile(self) -> bool:
        """A tile whose rows the math warpgroups cover in one pass of 64 rows each."""
        return self.tile_m <= 64 * self.math_warpgroups

    @property
    def epilogue_stages_whole_tile(self) -> bool:
        """An epilogue kind that stages the whole output tile (`Epilogue.stages_whole_tile`)."""
        return self.epilogue.stages_whole_tile

    @property
    def splits_k(self) -> bool:
        """Each tile's K blocks shared among CTAs, with a launch-time split count."""
        return self.epilogue.splits_k

    @property
    def splits_k_last_wave(self) -> bool:
        """Split K for the last partial wave's tiles only (`Epilogue.splits_last_wave_only`)."""
        return self.epilogue.splits_last_wave_only

    @property
    def splits_tail(self) -> bool:
        """The last partial wave's K blocks shared among all clusters (`Op.splits_last_wave`)."""
        return self.op.splits_last_wave

    def facts(self) -> dict[str, Any]:
        """The derived facts a kernel's manifest records (`FACTS`), so that the runtime reads them
        instead of deriving them again from the schedule's fields."""
        out: dict[str, Any] = {}
        for name in FACTS:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def waves(self) -> int:
        """Row blocks of 64 per math warpgroup that a block-scaled tile is computed in, one
        after the other through a single WGMMA accumulator (tile_m=256 with two warpgroups: 2)."""
        if not self.block_scaled_gemm or self.arch == Arch.SM100A:
            return 1
        return max(1, self.tile_m // (64 * self.math_warpgroups))

    @property
    def column_waves(self) -> int:
        """Column blocks of COLUMN_WAVE_WIDTH that a single-row-wave block-scaled Hopper tile is
        computed in, one after the other through a single WGMMA accumulator of that width: a
        256-wide tile takes two, since its promoted sum and a whole-width accumulator (2 x 128
        registers per math thread at 128x256) would not fit under consumer_regs, while the sum
        and one wave's accumulator (128 + 64) do. Each wave's WGMMAs read the stage's A again
        (the row waves of 256x128 tiles read B again), and each wave lies in one SFB block. Not
        for per-row SFB (weight gradients), whose column scales would not fit beside them."""
        if not self.block_scaled_gemm or self.arch == Arch.SM100A or self.waves != 1 or self.op.scales_b_per_row:
            return 1
        if self.tile_n > COLUMN_WAVE_WIDTH and self.tile_n % COLUMN_WAVE_WIDTH == 0:
            return self.tile_n // COLUMN_WAVE_WIDTH
        return 1

    @property
    def all_waves(self) -> int:
        """Waves of a block-scaled tile, row and column waves together."""
        return self.waves * self.column_waves

    @property
    def wave_columns(self) -> int:
        """Columns of one wave: the tile's width, or a column wave's."""
        return self.tile_n // self.column_waves

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, enum.Enum) else v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Schedule":
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                raise ValueError(f"schedule field {f.name!r} is missing")
            kwargs[f.name] = _FIELD_TYPES[f.name](data[f.name])
        unknown = set(data) - set(kwargs)
        if unknown:
            raise ValueError(f"unknown schedule fields: {sorted(unknown)}")
        return cls(**kwargs)


# The derived facts (`Schedule` properties) a manifest records under `facts`.
FACTS = (
    "threads_per_cta",
    "block_scaled",
    "sfb_per_block",
    "sfb_per_row",
    "straddles_scale_blocks",
    "waves",
    "column_waves",
    "single_wave_tile",
    "wgmma_accumulators",
    "column_scales_early",
    "static_stage_rounds",
    "epi_tile",
    "epilogue_stages",
    "epilogue_whole_tile",
    "epilogue_stages_whole_tile",
    "splits_k",
    "splits_k_last_wave",
    "splits_tail",
    "mma_applies_scales",
    "smem_bytes",
    "tmem_columns",
)

_FIELD_TYPES: dict[str, Any] = {
    "arch": Arch,
    "op": Op,
    "a_dtype": DType,
    "b_dtype": DType,
    "c_dtype": DType,
    "acc_dtype": DType,
    "scale": ScaleFormat,
    "tile_m": int,
    "tile_n": int,
    "tile_k": int,
    "cluster_m": int,
    "cluster_n": int,
    "multicast": Multicast,
    "stages": int,
    "math_warpgroups": int,
    "producer_regs": int,
    "consumer_regs": int,
    "epilogue": Epilogue,
    "raster": Raster,
    "group_size": int,
    "layout": Layout,
    "activation": Activation,
    "bias": Bias,
    "d_scale": OutputScale,
    "operand_roles": OperandRoles,
}
