"""Each op's contract: the arguments of its entry point in order, each operand with its dtype,
extent symbols, contiguous dimension, alignment and whether the kernel writes it or takes only its
address. The one statement of an op's interface: the templates derive the manifest's operands and
the fake arguments a kernel is traced with from it, and the CPU tier checks every kernel class's
entry point and the runtime's operand lists against it. Pure Python (no CuTe DSL)."""

from __future__ import annotations

import dataclasses

from cutegen.schedules.spec import Op, ScaleFormat, Schedule

# A TMA descriptor (CUtensorMap) is 128 bytes.
TENSORMAP_BYTES = 128


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument of an op's entry point, in entry order: an operand (a tensor the kernel reads
    or writes) or a scalar. Everything else about the op's interface derives from its list of
    these (`op_contract`): the manifest's operands, the fake arguments it is traced with, and the
    order a kernel class's `__call__` must take (checked by the CPU tier)."""

    name: str
    dtype: str  # the manifest's dtype ("bf16", "e4m3", "f32", "i32", "i64")
    shape: tuple[str, ...] = ()  # extent symbols in torch order; () for a scalar
    contiguous_mode: int = 0  # the torch dimension of stride 1 (-1: any strides)
    align_bytes: int = 16
    pointer: bool = False  # the kernel takes only its address
    written: bool = False  # no two elements may share memory
    exact_rows: bool = False  # row-major with rows exactly as long as the contiguous extent
    wide: tuple[str, ...] = ()  # extent symbols that are 64-bit (a flat operand past 2^31 elements)

    @property
    def scalar(self) -> bool:
        return not self.shape

    @property
    def packed(self) -> bool:
        """An operand of several dimensions of which the kernel takes only the address: it must be
        packed (row-major, no padding)."""
        return self.pointer and len(self.shape) > 1

    def manifest_operand(self) -> dict:
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
               "contiguous_mode": self.contiguous_mode, "align_bytes": self.align_bytes}
        if self.written:
            out["written"] = True
        if self.packed:
            out["packed"] = True
        return out


def op_contract(schedule: Schedule) -> list[Arg]:
    """The entry arguments of the schedule's op, in order, before `max_active_clusters` and the
    stream: the one statement of the op's interface, shared by every architecture."""
    s = schedule
    op = s.op
    if op.is_quantize:
        return _quantizer_contract(s)
    # UE8M0 scales: four exponent bytes per int32 along K, so the scale tensors have KW = ⌈KB/4⌉
    # int32 columns where fp32 scales have KB fp32 columns.
    ue8m0 = s.scale == ScaleFormat.UE8M0
    scale, kc = ("i32", "KW") if ue8m0 else ("f32", "KB")
    a, b, d = s.a_dtype.value, s.b_dtype.value, s.c_dtype.value
    if op.is_k_grouped and not s.block_scaled:
        return [
            # Tokens first (DeepGEMM's tn): [Σk, M] and [Σk, N] row-major, taken as the MN-major
            # [M, Σk] and [N, Σk] views (each group's k a multiple of 128).
            Arg("a", a, ("M", "KT"), 0, exact_rows=True),
            Arg("b", b, ("N", "KT"), 0, exact_rows=True),
            Arg("d", d, ("G", "M", "N"), 2, written=True),
            Arg("group_sizes", "i32", ("G",), 0, 4, pointer=True),
            Arg("workspace", "i64", ("W",), 0, TENSORMAP_BYTES, pointer=True, written=True),
        ]
    if op.is_k_grouped and s.mma_applies_scales:
        return [
            # Tokens first (DeepGEMM's SM100 tn): [Σk, M] and [Σk, N] row-major, taken as the
            # MN-major [M, KT] and [N, KT] views; each group's rows start at a 128-token block.
            Arg("a", a, ("M", "KT"), 0, exact_rows=True),
            # The MMA's blocked UE8M0 scales of every row and 128-token block (`requires`).
            Arg("sfa", "u8", ("SA",), 0, 16, pointer=True),
            Arg("b", b, ("N", "KT"), 0, exact_rows=True),
            Arg("sfb", "u8", ("SB",), 0, 16, pointer=True),
            Arg("d", d, ("G", "M", "N"), 2, written=True),
            Arg("group_sizes", "i32", ("G",), 0, 4, pointer=True),
        ]
    if op.is_k_grouped:
        return [
            # The groups' A_g [M, k_g] and B_g [N, k_g] one after another: [M, KT] and [N, KT].
            Arg("a", a, ("M", "KT"), 1, exact_rows=True),
            # Scales [Σ blocks, M] and [Σ blocks, N] row-major: (M, KB) and (N, KB) MN-major.
            Arg("sfa", "f32", ("M", "KB"), 0),
            Arg("b", b, ("N", "KT"), 1, exact_rows=True),
            Arg("sfb", "f32", ("N", "KB"), 0),
            Arg("d", d, ("G", "M", "N"), 2, written=True),
            Arg("group_sizes", "i32", ("G",), 0, 4, pointer=True),
            # Two 128-byte TMA descriptors per CTA of the grid (see `requires`).
            Arg("workspace", "i64", ("W",), 0, TENSORMAP_BYTES, pointer=True, written=True),
        ]
    grouped = ("G",) if op.is_masked else ()
    # An MN-major operand (`Schedule.layout`) is contiguous along its M (N) dimension.
    args = [Arg("a", a, (*grouped, "M", "K"), len(grouped) + (0 if s.layout.a_mn_major else 1))]
    if s.mma_applies_scales:
        # The MMA's blocked scales, 512-byte atoms of 128 rows by 4 scales (UE8M0 one per 32
        # elements, NVFP4's E4M3 one per 16), as bytes (`requires` gives their sizes).
        args.append(Arg("sfa", "u8", ("SA",), 0, 16, pointer=True))
    elif s.block_scaled:
        # SFA [M, KB] MN-major with a 16-byte aligned column stride (align(M, 4)).
        args.append(Arg("sfa", scale, (*grouped, "M", kc), len(grouped)))
    b_grouped = ("G",) if op.is_m_grouped else ()
    # FP4 beside FP8 is TMA-loaded unpacked (16U4_ALIGN16B), which needs a 32-byte aligned base.
    args.append(Arg("b", b, (*b_grouped, "N", "K"), len(b_grouped) + (0 if s.layout.b_mn_major else 1),
                    32 if b == "e2m1" and not s.fp4_packed_in_smem else 16))
    if s.mma_applies_scales:
        args.append(Arg("sfb", "u8", ("SB",), 0, 16, pointer=True))
    elif s.block_scaled:
        if op.scales_b_per_row:
            # The weight-gradient recipe: SFB [N, KB], MN-major and TMA-aligned like SFA.
            args.append(Arg("sfb", "f32", ("N", "KB"), 0))
        else:
            # Row-major and packed; the kernel derives its strides from N and K.
            args.append(Arg("sfb", scale, (*b_grouped, "NB", kc), len(b_grouped) + 1, 4, pointer=True))
    if s.stages_quantized_rows:
        # The activation's columns (I = N/2: gate and up pair up) quantized per token and 1x128
        # block: D e4m3 row-major, its scales [M, IB] MN-major and TMA-aligned like SFA (what
        # the down-projection takes as its A); eps as the per-token quantizer takes it.
        args += [
            Arg("d", d, (*grouped, "M", "I"), len(grouped) + 1, written=True),
            Arg("d_sf", "f32", (*grouped, "M", "IB"), len(grouped), written=True),
        ]
    else:
        args.append(Arg("d", d, (*grouped, "M", "N"), len(grouped) + 1, written=True))
    if op == Op.NVFP4_GEMM_NT:
        # NVFP4's per-tensor scales folded into one fp32 factor of D, read on the GPU.
        args.append(Arg("alpha", "f32", ("1",), 0, 4, pointer=True))
    if s.adds_bias:
        # One value per column of D, in D's type.
        args.append(Arg("bias", d, ("N",), 0))
    if op.is_masked:
        args.append(Arg("masked_m", "i32", ("G",), 0, 4, pointer=True))
    elif op.is_m_grouped:
        args += [Arg("m_indices", "i32", ("M",), 0, 4, pointer=True), Arg("zero_padding", "i32")]
    if s.epilogue.splits_k:
        # One counter per CTA tile of the cluster-padded tile grid (zero before a launch, left zero
        # after it) and K_SPLITS fp32 partial tiles per CTA tile (`requires`;
        # cutegen.runtime.split_k.workspace_extents).
        args += [
            Arg("split_counters", "i32", ("TILES",), 0, 4, pointer=True, written=True),
            Arg("split_partials", "f32", ("PARTIALS",), 0, 16, pointer=True, written=True),
            Arg("k_splits", "i32"),
        ]
    if op.splits_last_wave:
        args.append(Arg("tail_split", "i32"))
    if s.stages_quantized_rows:
        args.append(Arg("eps", "f32"))
    return args


# The manifest lists an op's operands A, B first, then the others in entry order (the exported C
# launcher takes them in this order).
MANIFEST_FIRST = ("a", "b")


def _quantizer_contract(s: Schedule) -> list[Arg]:
    """The quantizers: an input matrix (x per token, w per block) to q (e4m3, or FP4 codes packed
    two per byte) and a scale matrix whose strides are run-time values; the grouped transposed one
    from x [T, H] and device-side group sizes to q of the S 128-token blocks and scales [S, H], with
    a tile counter it leaves zero."""
    eps = Arg("eps", "f32")
    if s.op == Op.GROUPED_TRANSPOSED_QUANT_FP8:
        return [
            Arg("x", s.a_dtype.value, ("T", "H"), 1),
            Arg("group_sizes", "i32", ("G",), 0, 4),
            Arg("q", "e4m3", ("Q",), 0, written=True, wide=("Q",)),
            Arg("sf", "f32", ("S", "H"), 1, 8, written=True),
            Arg("tile_counter", "i32", ("1",), 0, 4, pointer=True, written=True),
            eps,
        ]
    per_token = s.op.quantizes_per_token
    name, rows = ("x", "M") if per_token else ("w", "N")
    scale_shape = ("SM", "SG") if per_token else ("SN", "SK")
    # UE8M0 scales: four per int32, packed along the groups of a row.
    scale = "i32" if per_token and s.scale == ScaleFormat.UE8M0 else "f32"
    q = Arg("q", "e4m3", (rows, "K"), 1, written=True)
    if s.op == Op.PER_TOKEN_QUANT_FP4:  # two e2m1 codes per byte: KB = K / 2 bytes a row
        q = Arg("q", "u8", (rows, "KB"), 1, written=True)
    return [
        Arg(name, s.a_dtype.value, (rows, "K"), 1),
        q,
        Arg("sf", scale, scale_shape, -1, 4, written=True),
        eps,
    ]
