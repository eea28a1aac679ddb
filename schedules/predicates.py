"""Validity rules of schedules: one named predicate per rule.

Each rule is a function ``rule_name(s: Schedule) -> str | None`` that returns ``None`` when the
schedule satisfies it, or a reason of the form ``"field=value: what is expected"``. The rules are
collected, in order, in `PREDICATES`; a rule may be restricted to some architectures or ops (it is
then *not applicable* to the others and is skipped).

To add a rule, write a function below and decorate it with ``@_rule(...)``; its docstring becomes
the predicate's ``doc``. To support a new arch/op, extend the tables at the top.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterable

from .spec import (
    FP4_QUANT_GROUP,
    PER_TOKEN_TILE_COLS,
    PER_TOKEN_WARP_COLS,
    QUANT_GROUP,
    QUANT_NEUTRAL,
    SCALE_BLOCK,
    SM90_REGISTERS_PER_SM,
    SM100_TMEM_COLUMNS,
    SWIGLU_BLOCK,
    THREADS_PER_WARPGROUP,
    Activation,
    Arch,
    DType,
    Epilogue,
    Layout,
    Multicast,
    Op,
    OutputScale,
    ScaleFormat,
    Schedule,
)

# ---- tables the rules read (extend these for new archs / ops) ----------------------------------

# Architectures each op has a template for.
OP_ARCHS: dict[Op, frozenset[Arch]] = {
    Op.BF16_GEMM_NT: frozenset({Arch.SM90A}),
    Op.FP8_GEMM_NT: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.M_GROUPED_FP8_GEMM_NT_MASKED: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.FP8_WGRAD_GEMM_NT: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.K_GROUPED_FP8_GEMM_NT_CONTIGUOUS: frozenset({Arch.SM90A}),
    Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS: frozenset({Arch.SM90A}),
    Op.M_GROUPED_BF16_GEMM_NT_MASKED: frozenset({Arch.SM90A}),
    Op.K_GROUPED_BF16_GEMM_TN_CONTIGUOUS: frozenset({Arch.SM90A}),
    Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS: frozenset({Arch.SM100A}),
    Op.NVFP4_GEMM_NT: frozenset({Arch.SM100A}),
    # The quantize templates use no tensor-core or Hopper-only instruction: sm_100a too.
    Op.PER_TOKEN_QUANT_FP8: frozenset({Arch.SM90A, Arch.SM100A}),
    # FP4 weights are for Blackwell's block-scaled GEMMs; any GPU may quantize them.
    Op.PER_TOKEN_QUANT_FP4: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.PER_BLOCK_QUANT_FP8: frozenset({Arch.SM90A, Arch.SM100A}),
    Op.GROUPED_TRANSPOSED_QUANT_FP8: frozenset({Arch.SM90A}),
}

# (a_dtype, b_dtype, c_dtype, acc_dtype) each op is written for, or a set of such tuples.
# Quantize ops: a = b = the input dtype, c = the output (e4m3, or e2m1 for FP4), acc = f32 (the math).
_QUANT_IN = lambda *dts, out=DType.E4M3: frozenset((d, d, out, DType.F32) for d in dts)  # noqa: E731
OP_DTYPES: dict[Op, tuple[DType, DType, DType, DType] | frozenset[tuple[DType, DType, DType, DType]]] = {
    # bf16 or fp32 D (DeepGEMM's bf16_gemm_nt takes both).
    Op.BF16_GEMM_NT: frozenset({(DType.BF16, DType.BF16, DType.BF16, DType.F32),
                                (DType.BF16, DType.BF16, DType.F32, DType.F32)}),
    # FP8 x FP4 (e2m1 weights) on the block-scaled MMA only (`fp4_on_block_scaled_mma`).
    Op.FP8_GEMM_NT: frozenset({(DType.E4M3, DType.E4M3, DType.BF16, DType.F32),
                               (DType.E4M3, DType.E2M1, DType.BF16, DType.F32)}),
    Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS: frozenset({(DType.E4M3, DType.E4M3, DType.BF16, DType.F32),
                                                    (DType.E4M3, DType.E2M1, DType.BF16, DType.F32)}),
    Op.M_GROUPED_FP8_GEMM_NT_MASKED: frozenset({(DType.E4M3, DType.E4M3, DType.BF16, DType.F32),
                                                (DType.E4M3, DType.E2M1, DType.BF16, DType.F32)}),
    # Weight gradients accumulate into an fp32 output.
    Op.FP8_WGRAD_GEMM_NT: (DType.E4M3, DType.E4M3, DType.F32, DType.F32),
    Op.K_GROUPED_FP8_GEMM_NT_CONTIGUOUS: (DType.E4M3, DType.E4M3, DType.F32, DType.F32),
    Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS: (DType.BF16, DType.BF16, DType.BF16, DType.F32),
    Op.M_GROUPED_BF16_GEMM_NT_MASKED: (DType.BF16, DType.BF16, DType.BF16, DType.F32),
    Op.K_GROUPED_BF16_GEMM_TN_CONTIGUOUS: (DType.BF16, DType.BF16, DType.F32, DType.F32),
    Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS: (DType.E4M3, DType.E4M3, DType.F32, DType.F32),
    Op.NVFP4_GEMM_NT: (DType.E2M1, DType.E2M1, DType.BF16, DType.F32),
    Op.PER_TOKEN_QUANT_FP8: _QUANT_IN(DType.BF16, DType.F16, DType.F32),
    Op.PER_TOKEN_QUANT_FP4: _QUANT_IN(DType.BF16, DType.F16, DType.F32, out=DType.E2M1),
    Op.PER_BLOCK_QUANT_FP8: _QUANT_IN(DType.BF16, DType.F16, DType.F32),
    Op.GROUPED_TRANSPOSED_QUANT_FP8: _QUANT_IN(DType.BF16),
}

# Scale formats each op accepts (NONE for unscaled ops).
OP_SCALES: dict[Op, frozenset[ScaleFormat]] = {
    Op.BF16_GEMM_NT: frozenset({ScaleFormat.NONE}),
    # fp32 scales; UE8M0 (packed four per int32) is also taken by the sm_100a kernels, which also
    # let the tensor cores apply them (MX).
    Op.FP8_GEMM_NT: frozenset({ScaleFormat.F32, ScaleFormat.UE8M0, ScaleFormat.MX}),
    # The grouped GEMMs also let Blackwell's tensor cores apply UE8M0 scales (MX).
    Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS: frozenset({ScaleFormat.F32, ScaleFormat.MX}),
    Op.M_GROUPED_FP8_GEMM_NT_MASKED: frozenset({ScaleFormat.F32, ScaleFormat.MX}),
    # On sm_100a with the scales applied by the MMA (MX).
    Op.FP8_WGRAD_GEMM_NT: frozenset({ScaleFormat.F32, ScaleFormat.MX}),
    Op.K_GROUPED_FP8_GEMM_NT_CONTIGUOUS: frozenset({ScaleFormat.F32}),
    Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS: frozenset({ScaleFormat.NONE}),
    Op.M_GROUPED_BF16_GEMM_NT_MASKED: frozenset({ScaleFormat.NONE}),
    Op.K_GROUPED_BF16_GEMM_TN_CONTIGUOUS: frozenset({ScaleFormat.NONE}),
    Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS: frozenset({ScaleFormat.MX}),
    # NVFP4: E4M3 scales per 16 elements, applied by the tensor cores.
    Op.NVFP4_GEMM_NT: frozenset({ScaleFormat.NV}),
    # The per-token quantize also writes UE8M0 (packed four per int32) for Blackwell GEMMs.
    Op.PER_TOKEN_QUANT_FP8: frozenset({ScaleFormat.F32, ScaleFormat.UE8M0}),
    # FP4 scales are UE8M0, packed four per int32 (what the block-scaled GEMMs take for an FP4 B).
    Op.PER_TOKEN_QUANT_FP4: frozenset({ScaleFormat.UE8M0}),
    Op.PER_BLOCK_QUANT_FP8: frozenset({ScaleFormat.F32}),
    Op.GROUPED_TRANSPOSED_QUANT_FP8: frozenset({ScaleFormat.F32}),
}

# Epilogues each architecture's templates implement.
ARCH_EPILOGUES: dict[Arch, frozenset[Epilogue]] = {
    Arch.SM90A: frozenset({
        Epilogue.TMA_STORE, Epilogue.TMA_STORE_WHOLE_TILE, Epilogue.TMA_STORE_PER_WARPGROUP,
        Epilogue.SPLIT_K_TMA_STORE, Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE, Epilogue.TMA_STORE_ADD,
        Epilogue.SPLIT_K_TMA_STORE_ADD,
    }),
    Arch.SM100A: frozenset({Epilogue.TMA_STORE}),
}

# One K block of an operand is one 128-byte swizzle row.
SWIZZLE_ROW_BYTES = 128
# TMA: the inner box extent and global strides must be multiples of 16 bytes.
TMA_ALIGN_BYTES = 16
# Rows each expert's segment of the contiguous layout is aligned to (the runtime's
# `grouped_ops.contiguous_alignment()`, DeepGEMM's M block).
CONTIGUOUS_SEGMENT_ROWS = 128
# Cluster extents the templates support.
CLUSTER_EXTENTS = (1, 2)
# A 2x2 cluster compiles and runs correctly, but only 30 four-CTA clusters fit on an H200 (120 of
# its 132 SMs): the best 2x2 kernel was 6-25% slower than the best two-CTA one, for 0-5% more
# per SM (NOTES N62).
MAX_CLUSTER_SIZE = 2
# WGMMA (sm_90a): M per warpgroup, legal CTA tile_m, N range and step.
WGMMA_M_PER_WARPGROUP = 64
# The tile three math warpgroups compute, and the only one of that height.
THREE_WARPGROUP_TILE_M = 192
WGMMA_TILE_M = (64, 128, THREE_WARPGROUP_TILE_M, 256)
WGMMA_N_STEP = 16
WGMMA_N_MIN = 16
WGMMA_N_MAX = 256
MATH_WARPGROUPS = (1, 2, 3)
# Three math warpgroups (192-row tiles, 512 threads): ptxas compiles the whole kernel at
# 65536 / 512 = 128 registers a thread whatever setmaxnreg grants later, so the accumulators
# must leave this many of those for addresses and loop state (192x192, 96 accumulators, compiles
# without local memory; 192x224, 112, is refused by ptxas: "Insufficient registers").
THREE_WARPGROUP_LAUNCH_HEADROOM = 32
# The ops whose kernels have run with three math warpgroups (the plain BF16 GEMM's tma_store
# epilogue; the block-scaled promotion, split K and the fused epilogues assume one or two).
THREE_WARPGROUP_OPS = frozenset({Op.BF16_GEMM_NT})
# setmaxnreg: multiple of 8 in [24, 256].
SETMAXNREG_STEP = 8
SETMAXNREG_MIN = 24
SETMAXNREG_MAX = 256
# Registers a math thread needs beside its accumulators (addresses, loop state, epilogue, scales):
# 256x128 block-scaled tiles (192 accumulator registers at consumer_regs=232) compile without
# local memory (`cutegen verify`).
REGISTER_HEADROOM = 40
# Smallest box a multicast slice may have along its split mode.
MIN_MULTICAST_SLICE = 8

# tcgen05 (sm_100a): the templates give each CTA 128 accumulator rows (one per TMEM lane and
# accumulator-update thread); a CTA pair's MMA is 256 rows. N: a multiple of 16 in [16, 256].
UMMA_TILE_M = 128
UMMA_N_STEP = 16
UMMA_N_MIN = 16
UMMA_N_MAX = 256
SM100_MATH_WARPGROUPS = (1,)

_SM90 = frozenset({Arch.SM90A})
_SM100 = frozenset({Arch.SM100A})
# Quantize ops (no MMA): the GEMM rules below do not apply to them; the quant_* rules do.
_QUANT_OPS = frozenset(op for op in Op if op.is_quantize)
_GEMM_OPS = frozenset(Op) - _QUANT_OPS
# The sm_100a GEMMs (the tcgen05 rules apply to them).
_SM100_OPS = frozenset(op for op, archs in OP_ARCHS.items() if Arch.SM100A in archs) & _GEMM_OPS
# Quantize templates: the group, the CTA tile per op, warpgroups, stages (see the quant_* rules).
QUANT_TILES: dict[Op, tuple[int, int]] = {
    # (tile_m, tile_n) of the ops with one CTA tile; per-token tiles are PER_TOKEN_TILE_COLS.
    Op.PER_BLOCK_QUANT_FP8: (128, 128),
    Op.GROUPED_TRANSPOSED_QUANT_FP8: (128, 64),
}
# The quantisation group along K (tile_k), elements.
QUANT_GROUPS: dict[Op, int] = {
    Op.PER_TOKEN_QUANT_FP8: QUANT_GROUP,
    Op.PER_TOKEN_QUANT_FP4: FP4_QUANT_GROUP,
    Op.PER_BLOCK_QUANT_FP8: QUANT_GROUP,
    Op.GROUPED_TRANSPOSED_QUANT_FP8: QUANT_GROUP,
}
QUANT_WARPGROUPS: dict[Op, tuple[int, ...]] = {
    Op.PER_TOKEN_QUANT_FP8: (1, 2),
    Op.PER_TOKEN_QUANT_FP4: (1, 2),
    Op.PER_BLOCK_QUANT_FP8: (1, 2),
    Op.GROUPED_TRANSPOSED_QUANT_FP8: (2,),
}
QUANT_STAGES: dict[Op, tuple[int, ...]] = {
    Op.PER_TOKEN_QUANT_FP8: (1, 2, 3, 4),  # tiles each thread loads before computing the first
    Op.PER_TOKEN_QUANT_FP4: (1, 2, 3, 4),
    Op.PER_BLOCK_QUANT_FP8: (1,),  # the whole 128x128 block is held in registers
    Op.GROUPED_TRANSPOSED_QUANT_FP8: (2,),  # double-buffered shared-memory tile
}


# ---- the registry ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Predicate:
    """One validity rule.

    ``check(s)`` returns None when the rule holds, else the reason. ``archs``/``ops`` restrict the
    rule to those architectures / ops (None: all); elsewhere it is not applicable.
    """

    name: str
    check: Callable[[Schedule], "str | None"]
    doc: str
    archs: frozenset[Arch] | None = None
    ops: frozenset[Op] | None = None

    def applies(self, s: Schedule) -> bool:
        if self.archs is not None and s.arch not in self.archs:
            return False
        if self.ops is not None and s.op not in self.ops:
            return False
        return True

    def evaluate(self, s: Schedule) -> str | None:
        """The reason the rule fails for `s`, or None if it holds or does not apply."""
        if not self.applies(s):
            return None
        try:
            return self.check(s)
        except Exception as exc:  # a rule must never crash the listing of schedules
            return f"rule could not be evaluated: {type(exc).__name__}: {exc}"


@dataclasses.dataclass(frozen=True)
class Violation:
    """A rule `name` that a schedule breaks, and why."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class PredicateResult:
    """The outcome of one rule on one schedule: status is "ok", "fail" or "n/a"."""

    name: str
    status: str
    reason: str | None
    doc: str


class ScheduleError(ValueError):
    """A schedule that breaks one or more validity rules."""

    def __init__(self, schedule: Schedule, found: list[Violation]) -> None:
        self.schedule = schedule
        self.violations = found
        try:
            from .naming import procedural_name

            label = procedural_name(schedule)
        except Exception:
            label = repr(schedule)
        lines = "\n".join(f"  - {v}" for v in found)
        super().__init__(f"invalid schedule {label}:\n{lines}")


_REGISTRY: list[Predicate] = []


def _rule(
    archs: Iterable[Arch] | None = None, ops: Iterable[Op] | None = None
) -> Callable[[Callable[[Schedule], "str | None"]], Callable[[Schedule], "str | None"]]:
    arch_set = frozenset(archs) if archs is not None else None
    op_set = frozenset(ops) if ops is not None else None

    def register(fn: Callable[[Schedule], "str | None"]) -> Callable[[Schedule], "str | None"]:
        doc = " ".join((fn.__doc__ or "").split())

        # The rule holds (None) for schedules of other architectures or ops, also when it is
        # called directly rather than through `Predicate.evaluate`.
        @functools.wraps(fn)
        def check(s: Schedule) -> "str | None":
            if (arch_set is not None and s.arch not in arch_set) or (op_set is not None and s.op not in op_set):
                return None
            return fn(s)

        _REGISTRY.append(Predicate(name=fn.__name__, check=check, doc=doc, archs=arch_set, ops=op_set))
        return check

    return register


# ---- the rules, in the order they are reported -------------------------------------------------


@_rule()
def op_supported_on_arch(s: Schedule) -> str | None:
    """The op has a kernel template for the schedule's architecture."""
    archs = OP_ARCHS.get(s.op, frozenset())
    if s.arch in archs:
        return None
    known = ", ".join(sorted(a.value for a in archs)) or "none"
    return f"arch={s.arch.value}: op {s.op.value} has templates only for arch {known}"


# The outputs each activation's epilogue writes (`activation_output`): SwiGLU's activations
# quantized to e4m3 per token and 1x128 block, the elementwise ones in bf16.
ACTIVATION_OUTPUTS: dict[Activation, frozenset[DType]] = {
    Activation.SWIGLU: frozenset({DType.E4M3}),
    Activation.SILU: frozenset({DType.BF16}),
    Activation.GELU: frozenset({DType.BF16}),
}


@_rule()
def dtypes_for_op(s: Schedule) -> str | None:
    """The operand and accumulator dtypes are the ones the op is written for (the output's, where
    the epilogue applies an activation, is `activation_output`'s)."""
    want = OP_DTYPES.get(s.op)
    if want is None:
        return None
    if s.stages_quantized_rows:
        # Compared as if the sum were written: the output type is the activation's rule.
        plain = {w for w in (want if isinstance(want, frozenset) else {want})}
        s = dataclasses.replace(s, c_dtype=next(iter(plain))[2])
    have = (s.a_dtype, s.b_dtype, s.c_dtype, s.acc_dtype)
    names = ("a_dtype", "b_dtype", "c_dtype", "acc_dtype")
    if isinstance(want, frozenset):
        if have in want:
            return None
        options = " or ".join(
            "(" + ", ".join(d.value for d in w) + ")" for w in sorted(want, key=lambda w: [d.value for d in w])
        )
        return (
            ", ".join(f"{n}={h.value}" for n, h in zip(names, have))
            + f": op {s.op.value} takes ({', '.join(names)}) = {options}"
        )
    bad = [f"{n}={h.value} (expected {w.value})" for n, h, w in zip(names, have, want) if h != w]
    if not bad:
        return None
    return f"{', '.join(bad)}: op {s.op.value} needs " + ", ".join(
        f"{n}={w.value}" for n, w in zip(names, want)
    )


@_rule()
def scale_format_for_op(s: Schedule) -> str | None:
    """The block-scale format is one the op is written for (none for unscaled ops)."""
    want = OP_SCALES.get(s.op)
    if want is None or s.scale in want:
        return None
    return (
        f"scale={s.scale.value}: op {s.op.value} takes scale "
        + " or ".join(sorted(w.value for w in want))
    )


@_rule(ops=_GEMM_OPS)
def ue8m0_gemm_on_blackwell(s: Schedule) -> str | None:
    """GEMMs take UE8M0 scales (promoted, or applied by the MMA) on sm_100a only (the Hopper
    templates promote with fp32)."""
    if s.scale not in (ScaleFormat.UE8M0, ScaleFormat.MX, ScaleFormat.NV) or s.arch == Arch.SM100A:
        return None
    return f"scale={s.scale.value}: the {s.arch.value} GEMM templates take fp32 scales (scale=f32)"


# The block-scaled MMA template: tiles of one or two whole scale atoms wide.
MX_TILE_N = (128, 256)
# The ops whose block-scaled template runs a CTA pair (the k-grouped layout's MN-major operands and
# the contiguous layout's 128-row experts stay on one CTA per MMA).
MX_CTA_PAIR_OPS = frozenset({Op.FP8_GEMM_NT, Op.FP8_WGRAD_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_MASKED, Op.NVFP4_GEMM_NT})


@_rule(archs=_SM100, ops=_SM100_OPS)
def mx_whole_atoms(s: Schedule) -> str | None:
    """With scales applied by the MMA (scale=mx): tile_n one or two whole 128-column scale atoms
    (the template loads whole blocked atoms per K tile)."""
    if not s.mma_applies_scales or s.tile_n in MX_TILE_N:
        return None
    return f"tile_n={s.tile_n}: the block-scaled MMA template takes tile_n in {list(MX_TILE_N)}"


@_rule(archs=_SM100, ops=_SM100_OPS)
def mx_cta_pair_ops(s: Schedule) -> str | None:
    """With scales applied by the MMA, a CTA pair runs the dense GEMM, the weight gradient and the
    masked layout only."""
    if not s.mma_applies_scales or s.mma_ctas == 1 or s.op in MX_CTA_PAIR_OPS:
        return None
    return (
        f"cluster_m={s.cluster_m}: the block-scaled MMA template runs a CTA pair for "
        f"{sorted(op.value for op in MX_CTA_PAIR_OPS)} only; use cluster 1x1"
    )


@_rule(ops=_GEMM_OPS)
def fp4_on_block_scaled_mma(s: Schedule) -> str | None:
    """FP4 (e2m1) operands only where the MMA applies the scales (scale=mx or nv): the promoting
    templates have no FP4 path, and FP4 needs the scale of each 32 (or 16) elements."""
    if DType.E2M1 not in (s.a_dtype, s.b_dtype) or s.mma_applies_scales:
        return None
    return f"scale={s.scale.value}: FP4 (e2m1) operands run on the block-scaled MMA only (scale=mx or nv)"


@_rule(ops=_GEMM_OPS)
def stages_at_least_two(s: Schedule) -> str | None:
    """At least two pipeline stages, so TMA loads overlap the math."""
    if s.stages >= 2:
        return None
    return f"stages={s.stages}: the load/math pipeline needs at least 2 stages"


@_rule()
def smem_fits(s: Schedule) -> str | None:
    """The dynamic shared memory fits the architecture's per-CTA opt-in limit."""
    limit = s.arch.smem_opt_in_bytes
    total = s.smem_bytes
    if total <= limit:
        return None
    fixed = total - s.stages * s.stage_bytes
    fit = (limit - fixed) // s.stage_bytes if s.stage_bytes > 0 else 0
    hint = f"at most {fit} stages fit this tile" if fit >= 1 else "no stage count fits this tile"
    return (
        f"stages={s.stages}: smem_bytes={total} exceeds the {s.arch.value} opt-in limit of "
        f"{limit} bytes (stages={s.stages} x stage_bytes={s.stage_bytes} + "
        f"epilogue_bytes={s.epilogue_bytes} + reserved/alignment {fixed - s.epilogue_bytes}); "
        f"{hint}"
    )


@_rule(ops=_GEMM_OPS)
def tile_k_matches_dtype(s: Schedule) -> str | None:
    """tile_k spans exactly one 128-byte swizzle row of each operand (bf16: tile_k=64; FP4 packed
    two per byte in shared memory, NVFP4: tile_k=256)."""
    for field, dt in (("a_dtype", s.a_dtype), ("b_dtype", s.b_dtype)):
        bits = s.smem_bits(dt)
        if s.tile_k * bits != 8 * SWIZZLE_ROW_BYTES:
            return (
                f"tile_k={s.tile_k}: one K block must be one {SWIZZLE_ROW_BYTES}-byte swizzle "
                f"row, so tile_k x {field} bits in shared memory ({dt.value}: {bits}) must be "
                f"{8 * SWIZZLE_ROW_BYTES} (tile_k={8 * SWIZZLE_ROW_BYTES // bits})"
            )
    return None


@_rule(archs=_SM90, ops=_GEMM_OPS)
def math_warpgroups_range(s: Schedule) -> str | None:
    """One, two or three math (consumer) warpgroups (three: `three_math_warpgroups`)."""
    if s.math_warpgroups in MATH_WARPGROUPS:
        return None
    return f"math_warpgroups={s.math_warpgroups}: expected one of {list(MATH_WARPGROUPS)}"


@_rule(archs=_SM90, ops=_GEMM_OPS)
def tile_m_wgmma(s: Schedule) -> str | None:
    """tile_m is 64, 128, 192 (three math warpgroups only) or 256 and a multiple of 64 per math
    warpgroup (WGMMA M=64)."""
    if s.tile_m not in WGMMA_TILE_M:
        return (
            f"tile_m={s.tile_m}: WGMMA tiles need tile_m in {list(WGMMA_TILE_M)} "
            f"(a multiple of {WGMMA_M_PER_WARPGROUP} per math warpgroup)"
        )
    if s.tile_m == THREE_WARPGROUP_TILE_M and s.math_warpgroups != 3:
        return f"tile_m={s.tile_m}: only with math_warpgroups=3 (one 64-row wave each), not {s.math_warpgroups}"
    if s.math_warpgroups >= 1:
        step = WGMMA_M_PER_WARPGROUP * s.math_warpgroups
        if s.tile_m % step:
            return (
                f"tile_m={s.tile_m}: WGMMA needs tile_m to be a multiple of "
                f"{WGMMA_M_PER_WARPGROUP} per math warpgroup "
                f"(math_warpgroups={s.math_warpgroups} → multiple of {step})"
            )
    return None


@_rule(archs=_SM90, ops=_GEMM_OPS)
def tile_n_wgmma(s: Schedule) -> str | None:
    """tile_n is a multiple of 16 in [16, 256] (the WGMMA N range)."""
    if s.tile_n % WGMMA_N_STEP == 0 and WGMMA_N_MIN <= s.tile_n <= WGMMA_N_MAX:
        return None
    return (
        f"tile_n={s.tile_n}: WGMMA needs tile_n to be a multiple of {WGMMA_N_STEP} "
        f"in [{WGMMA_N_MIN}, {WGMMA_N_MAX}]"
    )


@_rule(ops=_GEMM_OPS)
def register_budget(s: Schedule) -> str | None:
    """setmaxnreg values are multiples of 8 in [24, 256] and the CTA's registers fit the SM."""
    for field in ("producer_regs", "consumer_regs"):
        v = getattr(s, field)
        if v % SETMAXNREG_STEP or not SETMAXNREG_MIN <= v <= SETMAXNREG_MAX:
            return (
                f"{field}={v}: setmaxnreg needs a multiple of {SETMAXNREG_STEP} "
                f"in [{SETMAXNREG_MIN}, {SETMAXNREG_MAX}]"
            )
    if s.math_warpgroups < 1:
        return None  # math_warpgroups_range reports it
    total = THREADS_PER_WARPGROUP * (s.producer_regs + s.math_warpgroups * s.consumer_regs)
    if total <= SM90_REGISTERS_PER_SM:
        return None
    return (
        f"consumer_regs={s.consumer_regs}: the CTA needs 128 x producer_regs={s.producer_regs} + "
        f"128 x math_warpgroups={s.math_warpgroups} x consumer_regs={s.consumer_regs} = {total} "
        f"registers, more than the {SM90_REGISTERS_PER_SM} of an SM"
    )


@_rule(archs=_SM90, ops=_GEMM_OPS)
def accumulator_registers(s: Schedule) -> str | None:
    """The accumulators leave REGISTER_HEADROOM registers under consumer_regs (block-scaled ops
    hold the promoted sum of the tile and the WGMMA accumulator of one wave)."""
    if s.math_warpgroups < 1:
        return None  # math_warpgroups_range reports it
    acc = s.accumulator_registers
    room = s.consumer_regs - REGISTER_HEADROOM
    if acc <= room:
        return None
    sets = " x 2 accumulator sets" if s.block_scaled else ""
    return (
        f"tile_m={s.tile_m}, tile_n={s.tile_n}: {acc} accumulator registers per math thread "
        f"(tile_m x tile_n / (128 x math_warpgroups={s.math_warpgroups}){sets}) exceed "
        f"consumer_regs={s.consumer_regs} - {REGISTER_HEADROOM} headroom = {room}"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def accumulator_update_warpgroups(s: Schedule) -> str | None:
    """One accumulator-update warpgroup: its 128 threads own the 128 TMEM lanes (rows) of the
    CTA's accumulator."""
    if s.math_warpgroups in SM100_MATH_WARPGROUPS:
        return None
    return (
        f"math_warpgroups={s.math_warpgroups}: the sm_100a templates run one accumulator-update "
        f"warpgroup (expected one of {list(SM100_MATH_WARPGROUPS)})"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def tile_m_umma(s: Schedule) -> str | None:
    """tile_m is 128: one tcgen05 accumulator row per TMEM lane (a CTA pair's MMA is 256 rows)."""
    if s.tile_m == UMMA_TILE_M:
        return None
    return (
        f"tile_m={s.tile_m}: the sm_100a templates compute {UMMA_TILE_M} rows per CTA (the MMA "
        f"is M={UMMA_TILE_M}, or M={2 * UMMA_TILE_M} for a CTA pair)"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def tile_n_umma(s: Schedule) -> str | None:
    """tile_n is a multiple of 16 in [16, 256] (the tcgen05 MMA N range for M = 128 and 256)."""
    if s.tile_n % UMMA_N_STEP == 0 and UMMA_N_MIN <= s.tile_n <= UMMA_N_MAX:
        return None
    return (
        f"tile_n={s.tile_n}: tcgen05 MMA needs N to be a multiple of {UMMA_N_STEP} "
        f"in [{UMMA_N_MIN}, {UMMA_N_MAX}]"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def tmem_columns_fit(s: Schedule) -> str | None:
    """The accumulator stages and scale columns fit the 512 tensor-memory columns of an SM."""
    if s.tmem_columns <= SM100_TMEM_COLUMNS:
        return None
    return (
        f"tile_n={s.tile_n}: {s.tmem_accumulator_stages} accumulator stages x {s.tile_n} columns "
        f"+ {s.tmem_scale_columns} scale columns = {s.tmem_columns} exceed the "
        f"{SM100_TMEM_COLUMNS} tensor-memory columns"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def promoted_sum_registers(s: Schedule) -> str | None:
    """An accumulator-update thread holds its row's promoted sum and one tensor-memory chunk in
    registers, REGISTER_HEADROOM under consumer_regs."""
    acc = s.accumulator_registers
    room = s.consumer_regs - REGISTER_HEADROOM
    if acc <= room:
        return None
    return (
        f"tile_n={s.tile_n}: {acc} accumulator registers per thread (the row's tile_n promoted "
        f"values + one tensor-memory chunk) exceed consumer_regs={s.consumer_regs} - "
        f"{REGISTER_HEADROOM} headroom = {room}"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def sfb_one_block_per_tile(s: Schedule) -> str | None:
    """Promoting kernels: tile_n divides 128, so a tile lies in one 128-column block of SFB (one
    weight scale per K block and tile)."""
    if s.mma_applies_scales or (s.tile_n > 0 and SCALE_BLOCK % s.tile_n == 0):
        return None
    return (
        f"tile_n={s.tile_n}: the sm_100a templates apply one SFB value per tile and K block, so "
        f"tile_n must divide {SCALE_BLOCK}"
    )


@_rule(archs=_SM100, ops=_SM100_OPS)
def cta_pair_shape(s: Schedule) -> str | None:
    """A cluster is one CTA or a CTA pair along M (cluster 2x1, multicast b: the 2-CTA tcgen05
    MMA shares B between the pair)."""
    if (s.cluster_m, s.cluster_n, s.multicast) in ((1, 1, Multicast.NONE), (2, 1, Multicast.B)):
        return None
    return (
        f"cluster_m={s.cluster_m}, cluster_n={s.cluster_n}, multicast={s.multicast.value}: the "
        f"sm_100a templates take cluster 1x1 (multicast none) or a CTA pair 2x1 (multicast b)"
    )


@_rule(archs=_SM100, ops=frozenset({Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS}))
def contiguous_single_cta_mma(s: Schedule) -> str | None:
    """The contiguous layout aligns experts to 128 rows, so a CTA pair's 256 rows could span two
    experts (two B matrices): one CTA per MMA."""
    if s.mma_ctas == 1:
        return None
    return (
        f"cluster_m={s.cluster_m}: a CTA pair's 256-row MMA may cover two experts of the "
        f"contiguous layout (segments are aligned to {CONTIGUOUS_SEGMENT_ROWS} rows); use cluster 1x1"
    )


@_rule(archs=_SM90, ops=frozenset({Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS}))
def contiguous_tile_within_one_expert(s: Schedule) -> str | None:
    """The contiguous layout aligns experts to 128 rows and the Hopper template computes all of a
    tile's rows with the B of its first row's expert, so a tile has at most 128 rows."""
    if s.tile_m <= CONTIGUOUS_SEGMENT_ROWS:
        return None
    return (
        f"tile_m={s.tile_m}: a tile may cover two experts of the contiguous layout (segments are "
        f"aligned to {CONTIGUOUS_SEGMENT_ROWS} rows) and is computed with one expert's B; use tile_m "
        f"<= {CONTIGUOUS_SEGMENT_ROWS}"
    )


@_rule(ops=_GEMM_OPS)
def epilogue_tile_divides(s: Schedule) -> str | None:
    """The epilogue's sub-tile divides the CTA tile, so every sub-tile is a full TMA store."""
    em, en = s.epi_tile
    if em <= 0 or en <= 0:
        return None  # the tile rules report it
    if s.tile_m % em == 0 and s.tile_n % en == 0:
        return None
    return (
        f"tile_n={s.tile_n}, tile_m={s.tile_m}: the epilogue stores {em}x{en} sub-tiles, which "
        f"must divide the tile (tile_n a multiple of 16)"
    )


@_rule(ops=_GEMM_OPS)
def scale_blocks_per_tile(s: Schedule) -> str | None:
    """A promoted block-scaled tile spans at most two 128-column blocks of SFB wherever it starts
    (tile_n - gcd(tile_n, 128) <= 128), and tile_k is one 128-wide scale block. (Scales the MMA
    applies come in whole atoms: `mx_whole_atoms`, `tile_k_matches_dtype`.)"""
    if not s.block_scaled or s.mma_applies_scales:
        return None
    if s.tile_k != SCALE_BLOCK:
        return f"tile_k={s.tile_k}: block-scaled ops promote per {SCALE_BLOCK}-wide K block, so tile_k must be {SCALE_BLOCK}"
    if s.tile_n <= 0 or s.op.scales_b_per_row:
        return None  # tile_n_wgmma reports it; per-row SFB has no 128-column blocks
    span = s.tile_n - math.gcd(s.tile_n, SCALE_BLOCK)
    if span <= SCALE_BLOCK:
        return None
    return (
        f"tile_n={s.tile_n}: a tile can start {SCALE_BLOCK - math.gcd(s.tile_n, SCALE_BLOCK)} columns "
        f"into a {SCALE_BLOCK}-column scale block and then spans three SFB blocks; the kernel "
        f"selects between two (tile_n - gcd(tile_n, {SCALE_BLOCK}) must be <= {SCALE_BLOCK})"
    )


@_rule(ops=_GEMM_OPS)
def cluster_shape(s: Schedule) -> str | None:
    """cluster_m and cluster_n are 1 or 2, and the cluster has at most 2 CTAs (MAX_CLUSTER_SIZE)."""
    for field in ("cluster_m", "cluster_n"):
        v = getattr(s, field)
        if v not in CLUSTER_EXTENTS:
            return f"{field}={v}: expected one of {list(CLUSTER_EXTENTS)}"
    if s.cluster_size > MAX_CLUSTER_SIZE:
        return (
            f"cluster_m={s.cluster_m}, cluster_n={s.cluster_n}: cluster size {s.cluster_size} "
            f"exceeds {MAX_CLUSTER_SIZE} CTAs: four-CTA clusters leave 12 of an H200's 132 SMs "
            f"idle (30 fit) and measured 6-25% slower than two-CTA ones"
        )
    return None


@_rule(ops=_GEMM_OPS)
def multicast_matches_cluster(s: Schedule) -> str | None:
    """Multicast A needs cluster_n > 1, B needs cluster_m > 1; a cluster extent > 1 must multicast."""
    mc = s.multicast
    if mc.covers_a and s.cluster_n <= 1:
        return (
            f"multicast={mc.value}: A is shared along cluster_n, so multicasting A needs "
            f"cluster_n > 1 (cluster_n={s.cluster_n})"
        )
    if mc.covers_b and s.cluster_m <= 1:
        return (
            f"multicast={mc.value}: B is shared along cluster_m, so multicasting B needs "
            f"cluster_m > 1 (cluster_m={s.cluster_m})"
        )
    if s.cluster_m > 1 and not mc.covers_b:
        return (
            f"multicast={mc.value}: cluster_m={s.cluster_m} without multicast of B only costs; "
            f"use multicast=b or ab"
        )
    if s.cluster_n > 1 and not mc.covers_a:
        return (
            f"multicast={mc.value}: cluster_n={s.cluster_n} without multicast of A only costs; "
            f"use multicast=a or ab"
        )
    return None


@_rule(ops=_GEMM_OPS)
def multicast_box_divisible(s: Schedule) -> str | None:
    """A multicast operand's TMA box splits evenly over the CTAs sharing it, >= 8 rows each."""
    checks = (
        (s.multicast.covers_a, "tile_m", s.tile_m, "cluster_n", s.cluster_n, "A"),
        (s.multicast.covers_b, "tile_n", s.tile_n, "cluster_m", s.cluster_m, "B"),
    )
    for covered, tfield, tile, cfield, ctas, operand in checks:
        if not covered or ctas < 1:
            continue
        if tile % ctas or tile // ctas < MIN_MULTICAST_SLICE:
            return (
                f"{tfield}={tile}: multicasting {operand} over {cfield}={ctas} CTAs splits its "
                f"TMA box, so {tfield} must be divisible by {ctas} with at least "
                f"{MIN_MULTICAST_SLICE} rows per CTA"
            )
    return None


@_rule(ops=_GEMM_OPS)
def tma_alignment(s: Schedule) -> str | None:
    """The output tile's and epilogue tile's rows are multiples of 16 bytes (TMA rule)."""
    b = s.c_dtype.bytes
    if (s.tile_n * b) % TMA_ALIGN_BYTES:
        return (
            f"tile_n={s.tile_n}: a row of C is tile_n x {b} bytes ({s.c_dtype.value}) = "
            f"{s.tile_n * b}, not a multiple of the TMA's {TMA_ALIGN_BYTES} bytes"
        )
    en = s.epi_tile[1]
    if (en * b) % TMA_ALIGN_BYTES:
        return (
            f"tile_n={s.tile_n}: the epilogue tile's N extent {en} x {b} bytes "
            f"({s.c_dtype.value}) = {en * b} is not a multiple of the TMA's "
            f"{TMA_ALIGN_BYTES} bytes"
        )
    return None


@_rule(ops=_GEMM_OPS)
def group_size_positive(s: Schedule) -> str | None:
    """The raster swizzle group has at least one tile."""
    if s.group_size >= 1:
        return None
    return f"group_size={s.group_size}: expected at least 1"


@_rule()
def epilogue_supported(s: Schedule) -> str | None:
    """The epilogue is one the architecture's templates implement (tma_store)."""
    ok = ARCH_EPILOGUES.get(s.arch, frozenset())
    if s.epilogue in ok:
        return None
    known = ", ".join(sorted(e.value for e in ok)) or "none"
    return f"epilogue={s.epilogue.value}: {s.arch.value} templates implement only {known}"


# Ops whose kernels take the split-K epilogue: the dense GEMMs writing D (the grouped ops' tiles
# already fill the GPU, and the weight gradients accumulate into D with a TMA reduce-add); the
# last-wave split also the masked FP8 GEMM, whose tile count is only known on the GPU.
SPLIT_K_OPS = frozenset({Op.FP8_GEMM_NT, Op.BF16_GEMM_NT})
LAST_WAVE_SPLIT_K_OPS = SPLIT_K_OPS | {Op.M_GROUPED_FP8_GEMM_NT_MASKED}


@_rule()
def split_k_only_dense(s: Schedule) -> str | None:
    """The split-K epilogue serves the dense GEMMs that write D (`SPLIT_K_OPS`); the last-wave
    split also the masked FP8 GEMM (`LAST_WAVE_SPLIT_K_OPS`)."""
    ops = LAST_WAVE_SPLIT_K_OPS if s.epilogue.splits_last_wave_only else SPLIT_K_OPS
    if not s.epilogue.splits_k or s.op in ops:
        return None
    return f"epilogue={s.epilogue.value}: only ops {', '.join(sorted(op.value for op in ops))} split K, not {s.op.value}"


# Ops whose Hopper kernels apply each activation in their epilogue (`Activation`): SwiGLU in the
# FP8 GEMMs of a mixture-of-experts up-projection, dense and both M-grouped layouts; SiLU and GELU
# in the dense GEMMs, FP8 and BF16.
DENSE_GEMMS = frozenset({Op.FP8_GEMM_NT, Op.BF16_GEMM_NT})
ACTIVATION_OPS: dict[Activation, frozenset[Op]] = {
    Activation.SWIGLU: frozenset({Op.FP8_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, Op.M_GROUPED_FP8_GEMM_NT_MASKED}),
    Activation.SILU: DENSE_GEMMS,
    Activation.GELU: DENSE_GEMMS,
}
# Ops whose Hopper kernels add a bias per output column (`Bias`), with bf16 D.
BIAS_OPS = DENSE_GEMMS
# The scale formats whose Hopper kernels hold the tile's fp32 sum in registers for the epilogue:
# fp32 block scales (promoted) and none (the WGMMA's accumulators).
EPILOGUE_SUM_SCALES = frozenset({ScaleFormat.F32, ScaleFormat.NONE})


@_rule()
def activation_ops(s: Schedule) -> str | None:
    """An activation is fused only into the ops that have it (`ACTIVATION_OPS`), on sm_90a with
    fp32 block scales or none (`EPILOGUE_SUM_SCALES`): the epilogue reads the tile's fp32 sum
    from registers."""
    if s.activation == Activation.NONE:
        return None
    ops = ACTIVATION_OPS[s.activation]
    if s.op in ops and s.arch == Arch.SM90A and s.scale in EPILOGUE_SUM_SCALES:
        return None
    names = ", ".join(sorted(o.value for o in ops))
    return (f"activation={s.activation.value}: fused only into ops {names} on sm_90a with fp32 scales or none, "
            f"not op={s.op.value} on {s.arch.value} with scale={s.scale.value}")


@_rule()
def bias_ops(s: Schedule) -> str | None:
    """A bias is added only by the dense GEMMs (`BIAS_OPS`) on sm_90a with fp32 block scales or
    none, into bf16 D, and not with an activation that pairs columns (a bias per column of the
    GEMM's sum is a bias of gate and up)."""
    if not s.adds_bias:
        return None
    if (s.op in BIAS_OPS and s.arch == Arch.SM90A and s.scale in EPILOGUE_SUM_SCALES
            and s.c_dtype == DType.BF16 and not s.activation.pairs_columns):
        return None
    names = ", ".join(sorted(o.value for o in BIAS_OPS))
    return (f"bias={s.bias.value}: added only by ops {names} on sm_90a with fp32 scales or none, into "
            f"c_dtype=bf16 and without a column-pairing activation, not op={s.op.value} on {s.arch.value} "
            f"with scale={s.scale.value}, c_dtype={s.c_dtype.value}, activation={s.activation.value}")


@_rule()
def activation_output(s: Schedule) -> str | None:
    """The output type is one the activation's epilogue writes (`ACTIVATION_OUTPUTS`)."""
    if s.activation == Activation.NONE:
        return None
    allowed = ACTIVATION_OUTPUTS[s.activation]
    if s.c_dtype in allowed:
        return None
    return (f"c_dtype={s.c_dtype.value}: the {s.activation.value} epilogue writes "
            f"{', '.join(sorted(d.value for d in allowed))}")


@_rule()
def rounded_scales_quantized_output(s: Schedule) -> str | None:
    """Output scales are rounded (`OutputScale`) only where the epilogue quantizes D to e4m3 with
    scales of its own: an activation's quantized output."""
    if s.d_scale == OutputScale.F32:
        return None
    if s.c_dtype == DType.E4M3 and s.activation != Activation.NONE:
        return None
    return (f"d_scale={s.d_scale.value}: only an epilogue quantizing its activation to e4m3 writes scales, "
            f"not c_dtype={s.c_dtype.value} with activation={s.activation.value}")


@_rule()
def swiglu_tile_pairs_gate_and_up(s: Schedule) -> str | None:
    """A SwiGLU tile is 2·SWIGLU_BLOCK columns (gate, then the matching up columns) in one row
    wave (tile_m = 64 per math warpgroup): each thread then holds every gate value's up value,
    one column wave apart, and its rows' whole 1x128 quantization group."""
    if not s.activation.pairs_columns:
        return None
    if s.tile_n == 2 * SWIGLU_BLOCK and s.tile_m == 64 * s.math_warpgroups:
        return None
    return (f"tile_m={s.tile_m}, tile_n={s.tile_n}: a {s.activation.value} tile is {2 * SWIGLU_BLOCK} "
            f"columns wide and 64 rows per math warpgroup ({64 * s.math_warpgroups})")


@_rule()
def fused_epilogue_stores(s: Schedule) -> str | None:
    """A fused epilogue (a bias, an activation) applies to K-major operands' whole sums: not split
    K (a bias or activation of a partial sum is not the sum's). An activation whose stores replace
    the TMA stores takes the plain tma_store epilogue; a bias and an elementwise activation may add
    their result into D (tma_store_add: D = C + act(A·Bᵀ + bias), a residual)."""
    if not s.fused_epilogue:
        return None
    if s.layout == Layout.NT and not s.epilogue.splits_k and (
        s.epilogue == Epilogue.TMA_STORE or not s.stages_quantized_rows
    ):
        return None
    what = "tma_store" if s.stages_quantized_rows else "an epilogue that does not split K"
    return (f"epilogue={s.epilogue.value}, layout={s.layout.value}: bias={s.bias.value}, "
            f"activation={s.activation.value} take {what} and layout=nt")


# The layouts (`Layout`: which operands are MN-major) each op's kernels read, where not nt alone,
# per architecture. Hopper: the dense BF16 GEMM every one, the contiguous M-grouped one MN-major
# experts too (DeepGEMM's nn), the k-grouped one tokens first (tn) only. Blackwell: the FP8
# k-grouped weight gradient tokens first (DeepGEMM's SM100 tn form), which the block-scaled
# tcgen05 MMA reads MN-major.
OP_LAYOUTS: dict[Arch, dict[Op, frozenset[Layout]]] = {
    Arch.SM90A: {
        Op.BF16_GEMM_NT: frozenset(Layout),
        Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS: frozenset({Layout.NT, Layout.NN}),
        Op.K_GROUPED_BF16_GEMM_TN_CONTIGUOUS: frozenset({Layout.TN}),
    },
    Arch.SM100A: {
        Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS: frozenset({Layout.TN}),
    },
}


@_rule()
def mn_major_operands(s: Schedule) -> str | None:
    """The layout (which of A and B is MN-major) is one the op reads on its architecture
    (`OP_LAYOUTS`; nt for the others): the WGMMA reads MN-major operands of 16-bit types only,
    and the other ops read K-major operands."""
    allowed = OP_LAYOUTS[s.arch].get(s.op, frozenset({Layout.NT}))
    if s.layout in allowed:
        return None
    return (f"layout={s.layout.value}: op {s.op.value} on {s.arch.value} reads layouts "
            f"{', '.join(sorted(x.value for x in allowed))}")


# Ops whose kernels take the adding epilogues (D = C + A·Bᵀ with D holding C): the BF16 GEMM, and
# the FP8 GEMM's fused epilogues (a residual; DeepGEMM's FP8 GEMM takes no C into bf16).
STORE_ADD_OPS = frozenset({Op.BF16_GEMM_NT, Op.FP8_GEMM_NT})


@_rule()
def store_add_ops(s: Schedule) -> str | None:
    """The adding epilogues (`Epilogue.adds_into_d`) serve the ops that take C (`STORE_ADD_OPS`);
    the weight gradients add into D whatever their epilogue."""
    if not s.epilogue.adds_into_d or s.op in STORE_ADD_OPS:
        return None
    ops = ", ".join(sorted(o.value for o in STORE_ADD_OPS))
    return f"epilogue={s.epilogue.value}: only ops {ops} add their tiles into D, not op={s.op.value}"


@_rule()
def whole_tile_epilogue_16bit_output(s: Schedule) -> str | None:
    """The epilogues that stage the whole output tile (tma_store_whole_tile,
    tma_store_per_warpgroup) store a 16-bit output: fp32 outputs take a ring of sub-tiles."""
    if not s.epilogue.stages_whole_tile or s.c_dtype.bytes == 2:
        return None
    return f"epilogue={s.epilogue.value}: needs a 16-bit output, c_dtype={s.c_dtype.value}"


@_rule()
def whole_tile_epilogue_two_wave(s: Schedule) -> str | None:
    """The tma_store_whole_tile epilogue is for two-wave (256-row) tiles: single-wave tiles
    already stage their whole tile with tma_store when it fits (the same kernel under two names
    otherwise)."""
    if s.epilogue != Epilogue.TMA_STORE_WHOLE_TILE:
        return None
    if s.waves < 2:
        return (
            f"epilogue={s.epilogue.value}: tile_m={s.tile_m} with {s.math_warpgroups} math "
            f"warpgroup(s) is computed in one wave, and its tma_store epilogue already stages the "
            f"whole tile when it fits; use tma_store"
        )
    return None


# Ops whose kernels have run with the per-warpgroup epilogue (bitwise equal to their CTA-wide twins).
PER_WARPGROUP_EPILOGUE_OPS = frozenset({Op.FP8_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS})


# What `_stores_plain_bf16_from_k_major` requires, as the rules that use it say it.
PLAIN_BF16_STORE = "storing a bf16 D (epilogue=tma_store, no activation or bias) from K-major operands (layout=nt)"


def _stores_plain_bf16_from_k_major(s: Schedule) -> bool:
    """The plain BF16 store: epilogue tma_store with no activation or bias, a bf16 D, K-major
    operands (what three math warpgroups and swapped operand roles have run with)."""
    plain = s.epilogue == Epilogue.TMA_STORE and s.activation == Activation.NONE and not s.adds_bias
    return plain and s.layout == Layout.NT and s.c_dtype == DType.BF16


@_rule(archs=_SM90, ops=_GEMM_OPS)
def three_math_warpgroups(s: Schedule) -> str | None:
    """Three math warpgroups stack three 64-row waves into a 192-row tile (a 333-row problem in
    two tile rows instead of three, a whole wave where 128-row tiles leave a thin second one):
    only for the ops in THREE_WARPGROUP_OPS with the plain tma_store epilogue, and with
    accumulators that fit the 128 registers a thread ptxas compiles a 512-thread kernel for."""
    if s.math_warpgroups != 3:
        return None
    if s.op not in THREE_WARPGROUP_OPS or not _stores_plain_bf16_from_k_major(s):
        ops = ", ".join(sorted(o.value for o in THREE_WARPGROUP_OPS))
        return (f"math_warpgroups=3: only ops {ops} {PLAIN_BF16_STORE}, not op={s.op.value}, epilogue={s.epilogue.value}, "
                f"activation={s.activation.value}, c_dtype={s.c_dtype.value}, layout={s.layout.value}")
    launch_regs = SM90_REGISTERS_PER_SM // s.threads_per_cta
    if s.accumulator_registers + THREE_WARPGROUP_LAUNCH_HEADROOM <= launch_regs:
        return None
    return (f"tile_m={s.tile_m}, tile_n={s.tile_n}: {s.accumulator_registers} accumulator registers per math "
            f"thread leave fewer than {THREE_WARPGROUP_LAUNCH_HEADROOM} of the {launch_regs} a {s.threads_per_cta}-thread "
            f"kernel is compiled for")


# The ops whose kernels may take B's rows as the MMA's M side (`OperandRoles.BA`).
SWAPPED_ROLES_OPS = frozenset({Op.BF16_GEMM_NT})
# The swapped kernels' tile widths run along M in steps of the epilogue's 16-column sub-tiles.
SWAPPED_TILE_N_STEP = 16


@_rule()
def swapped_operand_roles(s: Schedule) -> str | None:
    """B's rows as the MMA's M side (operand_roles=ba): the kernel stores Dᵀ through a column-major
    view of D, so only ops in SWAPPED_ROLES_OPS on sm_90a, storing a bf16 D from K-major operands
    with the plain tma_store epilogue (no activation, bias or split), tile_n a multiple of
    SWAPPED_TILE_N_STEP (the epilogue's sub-tiles along M)."""
    if not s.swaps_ab:
        return None
    if s.arch != Arch.SM90A or s.op not in SWAPPED_ROLES_OPS or not _stores_plain_bf16_from_k_major(s):
        ops = ", ".join(sorted(o.value for o in SWAPPED_ROLES_OPS))
        return (f"operand_roles=ba: only ops {ops} on sm_90a {PLAIN_BF16_STORE}, not arch={s.arch.value}, "
                f"op={s.op.value}, epilogue={s.epilogue.value}, c_dtype={s.c_dtype.value}, layout={s.layout.value}")
    if s.tile_n % SWAPPED_TILE_N_STEP:
        return f"operand_roles=ba: tile_n={s.tile_n} must be a multiple of {SWAPPED_TILE_N_STEP}"
    return None


@_rule()
def per_warpgroup_epilogue_two_warpgroups(s: Schedule) -> str | None:
    """The tma_store_per_warpgroup epilogue stages the whole tile and lets each of two math
    warpgroups store its own rows: with one math warpgroup there is nothing to decouple. Only the
    ops whose kernels have run with it on an H200 (`PER_WARPGROUP_EPILOGUE_OPS`) accept it."""
    if not s.epilogue.per_warpgroup:
        return None
    if s.math_warpgroups != 2:
        return f"epilogue={s.epilogue.value}: needs two math warpgroups, math_warpgroups={s.math_warpgroups}"
    if s.op not in PER_WARPGROUP_EPILOGUE_OPS:
        ops = ", ".join(sorted(o.value for o in PER_WARPGROUP_EPILOGUE_OPS))
        return f"epilogue={s.epilogue.value}: only ops {ops}, not op={s.op.value}"
    return None


@_rule(ops=_QUANT_OPS)
def quant_unused_fields_neutral(s: Schedule) -> str | None:
    """Fields a quantize kernel does not use hold their neutral values (`QUANT_NEUTRAL`: acc_dtype
    f32, cluster 1x1, multicast none, producer_regs = consumer_regs = 0, epilogue tma_store, raster
    along_m, group_size 1) and b_dtype = a_dtype."""
    if s.b_dtype != s.a_dtype:
        return f"b_dtype={s.b_dtype.value}: a quantize kernel does not use it; it must be the input dtype (a_dtype)"
    for field, want in QUANT_NEUTRAL.items():
        have = getattr(s, field)
        if have != want:
            shown = have.value if hasattr(have, "value") else have
            text = want.value if hasattr(want, "value") else want
            return f"{field}={shown}: a quantize kernel does not use it; it must be {text}"
    return None


@_rule(ops=_QUANT_OPS)
def quant_group(s: Schedule) -> str | None:
    """tile_k is the op's quantisation group (`QUANT_GROUPS`): 128 elements (1x128 per token,
    128x128 per block), FP4 32 (1x32 per token)."""
    group = QUANT_GROUPS[s.op]
    if s.tile_k == group:
        return None
    return f"tile_k={s.tile_k}: the quantisation group of op {s.op.value} is {group} elements, so tile_k must be {group}"


@_rule(ops=_QUANT_OPS)
def quant_warpgroups(s: Schedule) -> str | None:
    """math_warpgroups (every thread of a quantize CTA, 128 each) is one the template supports."""
    ok = QUANT_WARPGROUPS.get(s.op, ())
    if s.math_warpgroups in ok:
        return None
    return f"math_warpgroups={s.math_warpgroups}: op {s.op.value} runs with {' or '.join(map(str, ok))} warpgroups"


@_rule(ops=_QUANT_OPS)
def quant_tile(s: Schedule) -> str | None:
    """The CTA tile is one the template supports: per-block 128x128, grouped transposed 128
    tokens x 64 hidden columns, per-token 512 or 1024 columns x (warps / (tile_n / 512)) rows
    (each warp covers 512 columns of one row)."""
    if s.op.quantizes_per_token:
        if s.tile_n not in PER_TOKEN_TILE_COLS:
            cols = " or ".join(map(str, PER_TOKEN_TILE_COLS))
            return f"tile_n={s.tile_n}: op {s.op.value} tiles {cols} columns"
        warps = 4 * s.math_warpgroups
        want_m = warps // (s.tile_n // PER_TOKEN_WARP_COLS)
        if s.tile_m != want_m:
            return (
                f"tile_m={s.tile_m}: op {s.op.value} with tile_n={s.tile_n} tiles {want_m} rows "
                f"({warps} warps, {s.tile_n // PER_TOKEN_WARP_COLS} side by side per row)"
            )
        return None
    want_m, want_n = QUANT_TILES.get(s.op, (s.tile_m, s.tile_n))
    if s.tile_m != want_m:
        return f"tile_m={s.tile_m}: op {s.op.value} tiles {want_m} rows"
    if s.tile_n != want_n:
        return f"tile_n={s.tile_n}: op {s.op.value} tiles {want_n} columns"
    return None


@_rule(ops=_QUANT_OPS)
def quant_stages(s: Schedule) -> str | None:
    """stages is one the template supports: per-token 1-4 tiles in flight per thread,
    per-block 1 (the block is held in registers), grouped transposed 2 (double-buffered tile)."""
    ok = QUANT_STAGES.get(s.op, ())
    if s.stages in ok:
        return None
    return f"stages={s.stages}: op {s.op.value} supports stages {' or '.join(map(str, ok))}"


PREDICATES: tuple[Predicate, ...] = tuple(_REGISTRY)
PREDICATES_BY_NAME: dict[str, Predicate] = {p.name: p for p in PREDICATES}


# ---- the public checks -------------------------------------------------------------------------


def violations(s: Schedule) -> list[Violation]:
    """Every rule `s` breaks, in registry order (empty when valid)."""
    out: list[Violation] = []
    for p in PREDICATES:
        reason = p.evaluate(s)
        if reason is not None:
            out.append(Violation(p.name, reason))
    return out


def predicate_results(s: Schedule) -> list[PredicateResult]:
    """The outcome of every rule on `s`: "ok", "fail" (with reason) or "n/a"."""
    out: list[PredicateResult] = []
    for p in PREDICATES:
        if not p.applies(s):
            out.append(PredicateResult(p.name, "n/a", None, p.doc))
            continue
        reason = p.evaluate(s)
        out.append(PredicateResult(p.name, "ok" if reason is None else "fail", reason, p.doc))
    return out


def is_valid(s: Schedule) -> bool:
    return not violations(s)


def check(s: Schedule) -> Schedule:
    """Return `s` if valid, else raise `ScheduleError` listing every violation."""
    found = violations(s)
    if found:
        raise ScheduleError(s, found)
    return s


__all__ = [
    "PREDICATES",
    "PREDICATES_BY_NAME",
    "Predicate",
    "PredicateResult",
    "ScheduleError",
    "Violation",
    "check",
    "is_valid",
    "predicate_results",
    "violations",
]
