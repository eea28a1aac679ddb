"""The launch contract of the GEMM templates, shared by Hopper and Blackwell: the fake arguments a
kernel is traced with, its operands, its grid rule and its launch facts. Kernels of one op take the
same torch operands on every architecture; only the parameter bindings (how each operand reaches
the kernel: TMA descriptor, plain tensor, pointer) are the kernel's own.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cutegen.schedules.contract import MANIFEST_FIRST, TENSORMAP_BYTES, Arg, op_contract
from cutegen.schedules.spec import MX_ATOM_BYTES, MX_ATOM_ROWS, MX_ATOM_SCALES, SCALE_BLOCK, DType, ScaleFormat, Schedule

# The k-grouped kernels keep two TMA descriptors per CTA (A and B) in a global workspace, as 16
# Int64 words each.
TENSORMAP_WORDS = TENSORMAP_BYTES // 8


# Each shared-memory swizzle functor as CuTe prints it, with its TMA swizzle mode and the bytes of
# one swizzle atom's contiguous side (a TMA box along that side spans at most one atom).
_SWIZZLES = {"S<3,4,3>": ("128B", 128), "S<2,4,3>": ("64B", 64), "S<1,4,3>": ("32B", 32), "S<0,4,3>": ("none", 16)}
_ATOM_BYTES = dict(_SWIZZLES.values())


def tma_swizzle_mode(swizzle: str) -> str:
    """The TMA swizzle mode of a CuTe swizzle functor as printed ("S<3,4,3>" -> "128B")."""
    if swizzle not in _SWIZZLES:
        raise ValueError(f"shared-memory swizzle {swizzle} has no TMA swizzle mode")
    return _SWIZZLES[swizzle][0]


def swizzle_atom_elems(tma_swizzle: str, dtype_bytes: int) -> int:
    """Elements of one swizzle atom's contiguous side at TMA swizzle mode ``tma_swizzle``."""
    return _ATOM_BYTES[tma_swizzle] // dtype_bytes


# ---- parameter-binding recipes (the manifest's `binding` of one kernel parameter) -------------


def tma_binding(
    operand: str, dtype: str, box_rows: int, box_cols: int, smem_swizzle: str, mn_major: bool = False
) -> dict:
    """A 2-D TMA descriptor of a K-major (or N-major, for D) operand: its contiguous mode is TMA
    dimension 0; the box is one CTA's share; the swizzle is read off the shared-memory layout.
    With ``mn_major`` the operand is contiguous along its rows (M or N) instead: those are TMA
    dimension 0, and a box spans at most one swizzle atom of them, copied once per atom."""
    swizzle = tma_swizzle_mode(smem_swizzle)
    if mn_major:
        modes, box = [0, 1], [min(box_rows, swizzle_atom_elems(swizzle, DType(dtype).bytes)), box_cols]
    else:
        modes, box = [1, 0], [box_cols, box_rows]
    return {
        "kind": "tma",
        "operand": operand,
        "dtype": dtype,
        "modes": modes,
        "box": box,
        "swizzle": swizzle,
        "interleave": "none",
        "l2_promotion": "128B",
        "oob_fill": "none",
    }


def scale_vector_tma_binding(operand: str, rows: int) -> dict:
    """A TMA descriptor of an MN-major fp32 scale tensor [rows, KB]: one column of `rows` scales
    per box, contiguous along the rows (TMA dimension 0)."""
    return {
        "kind": "tma",
        "operand": operand,
        "dtype": "f32",
        "modes": [0, 1],
        "box": [rows, 1],
        "swizzle": "none",
        "interleave": "none",
        "l2_promotion": "128B",
        "oob_fill": "none",
    }


def with_group_mode(recipe: dict, grouped: bool) -> dict:
    """A torch operand [G, X, Y] is the kernel's (X, Y, G): torch dims shift by one and the group
    is the last TMA dimension, one per box."""
    if not grouped:
        return recipe
    return dict(recipe, modes=[m + 1 for m in recipe["modes"]] + [0], box=recipe["box"] + [1])


def shape_binding(operand: str, values: list[str], grouped: bool = False) -> dict:
    """The dynamic extents of a TMA coordinate tensor, as 32-bit integers (plus G when grouped)."""
    return {"kind": "shape", "operand": operand, "values": values + ["G"] * grouped, "width": 32}


def requirement(symbol: str, relation: str, expr: str) -> dict:
    """One entry of a manifest's ``requires`` (`cutegen.runtime.manifest.Requirement`)."""
    return {"symbol": symbol, "relation": relation, "expr": expr}


# A manifest dtype's CuTe DSL type (by name) and bits.
_ELEMENTS = {"bf16": ("BFloat16", 16), "f16": ("Float16", 16), "e4m3": ("Float8E4M3FN", 8), "f32": ("Float32", 32),
             "e2m1": ("Float4E2M1FN", 4), "i32": ("Int32", 32), "i64": ("Int64", 64), "u8": ("Uint8", 8)}


def contract_fake_arguments(contract: list[Arg]) -> tuple:
    """Arguments for `cute.compile`, one per contract argument, then `max_active_clusters` and the
    stream: one symbol per extent (made first, in order of appearance; a digit is a constant), free
    strides aligned as the operand is, bare pointers where the kernel takes only an address."""
    from cutlass.cute.runtime import make_fake_tensor, make_ptr
    from cutlass.runtime import make_fake_stream

    extents: dict[str, object] = {}
    for arg in contract:
        for symbol in arg.shape if not arg.pointer else ():
            if symbol not in extents:
                extents[symbol] = (
                    int(symbol) if symbol.isdigit()
                    else cute.sym_int64(symbol=symbol) if symbol in arg.wide
                    else cute.sym_int32(symbol=symbol)
                )
    out = []
    for arg in contract:
        ctype = getattr(cutlass, _ELEMENTS[arg.dtype][0])
        if arg.scalar:
            out.append(ctype(1e-4) if arg.dtype == "f32" else ctype(1))
        elif arg.pointer:
            out.append(make_ptr(ctype, 0, cute.AddressSpace.gmem, assumed_align=arg.align_bytes))
        else:
            out.append(make_fake_tensor(ctype, *_kernel_layout(arg, extents), assumed_align=arg.align_bytes))
    return (*out, cutlass.Int32(1), make_fake_stream())


def _kernel_dims(arg: Arg) -> list[int]:
    """The torch dimensions of a tensor operand in the kernel's mode order: a leading group last."""
    dims = list(range(len(arg.shape)))
    return dims[1:] + [0] if arg.shape[0] == "G" and len(dims) > 1 else dims


def _kernel_layout(arg: Arg, extents: dict[str, object]) -> tuple[tuple, tuple]:
    """The kernel's (shape, stride) of a tensor operand: torch's dimensions with a leading group
    moved last; stride 1 along the contiguous dimension, the others free strides of the operand's
    alignment (or, with `exact_rows`, the row length)."""
    dims = _kernel_dims(arg)
    divisibility = max(1, arg.align_bytes * 8 // _ELEMENTS[arg.dtype][1])
    shape, stride = [], []
    for dim in dims:
        shape.append(extents[arg.shape[dim]])
        if dim == arg.contiguous_mode:
            stride.append(1)
        elif arg.exact_rows:
            stride.append(extents[arg.shape[arg.contiguous_mode]])
        else:
            stride.append(cute.sym_int64(divisibility=divisibility))
    return tuple(shape), tuple(stride)


def plain_binding(arg: Arg, value_range: tuple[float, float] | None = None) -> dict:
    """How a kernel that takes `arg` as it is (no TMA descriptor) receives it: a tensor as its
    address, extents (64-bit where the contract says `wide`) and run-time strides (every
    dimension but the contiguous one, by torch dimension); a pointer as its address; a scalar as
    its value, within `value_range` when given."""
    if arg.scalar:
        out = {"name": arg.name, "kind": "scalar", "dtype": arg.dtype, "expr": arg.name}
        return {**out, "range": list(value_range)} if value_range is not None else out
    if arg.pointer:
        return {"name": arg.name, "kind": "pointer", "operand": arg.name}
    # The kernel's modes: torch's, with a leading group moved last (as `_kernel_layout` traces them).
    dims = _kernel_dims(arg)
    strides = [d for d in dims if d != arg.contiguous_mode]
    return {
        "name": arg.name,
        "kind": "tensor",
        "operand": arg.name,
        "shape": [arg.shape[d] for d in dims],
        "shape_widths": [64 if arg.shape[d] in arg.wide else 32 for d in dims],
        "strides": strides,
        "stride_widths": [64] * len(strides),
    }


def contract_entry_names(contract: list[Arg]) -> list[str]:
    """The parameters a kernel class's `__call__` takes, in order (the stream last)."""
    return [arg.name for arg in contract] + ["max_active_clusters", "stream"]


def contract_operands(contract: list[Arg]) -> list[dict]:
    """The manifest's operands: the contract's, A and B first (`MANIFEST_FIRST`)."""
    operands = [arg for arg in contract if not arg.scalar]
    ordered = [a for name in MANIFEST_FIRST for a in operands if a.name == name]
    ordered += [a for a in operands if a.name not in MANIFEST_FIRST]
    return [a.manifest_operand() for a in ordered]


class GemmContract:
    """The generator's view of a GEMM template: fake arguments, operands, grid rule, launch facts
    and the kernel's parameter bindings, all from the op's contract (`op_contract`). A subclass
    sets ``self.kernel`` (a traced kernel object with ``smem_bytes`` and ``param_bindings()``)."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.contract = op_contract(schedule)
        self.ue8m0 = schedule.scale == ScaleFormat.UE8M0
        self.scale_columns = "KW" if self.ue8m0 else "KB"
        self.kernel = None

    def fake_arguments(self) -> tuple:
        return contract_fake_arguments(self.contract)

    def operands(self) -> list[dict]:
        return contract_operands(self.contract)


    def requires(self) -> list[dict]:
        """Relations between the operands' extent symbols that the kernel relies on (the
        manifest's ``requires``): the scale tensors' block counts, the workspaces' sizes."""
        s = self.schedule
        if self.schedule.op.is_k_grouped and self.schedule.mma_applies_scales:
            # One blocked atom per 128 rows (of A, of B) and 128-token block of the KT tokens.
            atoms_k = f"ceil_div(KT, {SCALE_BLOCK})"
            return [requirement("SA", ">=", f"ceil_div(M, {MX_ATOM_ROWS}) * {atoms_k} * {MX_ATOM_BYTES}"),
                    requirement("SB", ">=", f"ceil_div(N, {MX_ATOM_ROWS}) * {atoms_k} * {MX_ATOM_BYTES}")]
        if self.schedule.op.is_k_grouped:
            # A and B are [rows, 128·S], their scales [rows, S]; two descriptors per CTA.
            words = f"{2 * TENSORMAP_WORDS * s.cluster_m * s.cluster_n} * max_active_clusters"
            if not self.schedule.block_scaled:  # no scales: the groups' blocks are the runtime's to check
                return [requirement("W", ">=", words)]
            return [requirement("KT", "==", f"KB * {SCALE_BLOCK}"), requirement("W", ">=", words)]
        out = []
        if self.schedule.activation.pairs_columns:
            # Gate and up columns pair up: I = N/2 activation columns, whole quantization groups
            # (stated before the relations that read N).
            out += [requirement("I", "==", f"IB * {SCALE_BLOCK}"), requirement("N", "==", "2 * I")]
        if self.schedule.mma_applies_scales:
            # One blocked atom per 128 rows (of A, of B) and 4 scales along K (128 elements of
            # MX, 64 of NVFP4).
            atoms_k = f"ceil_div(K, {MX_ATOM_SCALES * self.schedule.scale.mma_vector})"
            # Grouped: SFB's atoms for every group (and, masked, SFA's), one group after another.
            groups_a = "G * " if self.schedule.op.is_masked else ""
            groups_b = "G * " if self.schedule.op.is_m_grouped else ""
            out += [requirement("SA", ">=", f"{groups_a}ceil_div(M, {MX_ATOM_ROWS}) * {atoms_k} * {MX_ATOM_BYTES}"),
                    requirement("SB", ">=", f"{groups_b}ceil_div(N, {MX_ATOM_ROWS}) * {atoms_k} * {MX_ATOM_BYTES}")]
        elif self.schedule.block_scaled:
            out.append(requirement(self.scale_columns, "==", f"ceil_div(K, {SCALE_BLOCK * (4 if self.ue8m0 else 1)})"))
            if not self.schedule.op.scales_b_per_row:
                out.append(requirement("NB", "==", f"ceil_div(N, {SCALE_BLOCK})"))
        if self.schedule.splits_k:
            # cutegen.runtime.split_k.workspace_extents: a counter per CTA tile of the
            # cluster-padded grid and K_SPLITS partial tiles each; with the last wave split
            # only, its split units fill at most one wave: a counter and a partial tile per CTA
            # of the launch.
            if self.schedule.splits_k_last_wave:
                tiles = f"{self.grid_rule()['blocks'][2]} * {s.cluster_m * s.cluster_n}"
                slots = tiles
            else:
                tiles = (
                    f"ceil_div(ceil_div(M, {s.tile_m}), {s.cluster_m}) * {s.cluster_m} * "
                    f"ceil_div(ceil_div(N, {s.tile_n}), {s.cluster_n}) * {s.cluster_n}"
                )
                slots = f"{tiles} * K_SPLITS"
            out += [
                requirement("TILES", ">=", tiles),
                requirement("PARTIALS", ">=", f"{slots} * {s.tile_m * s.tile_n}"),
            ]
        return out

    def grid_rule(self) -> dict:
        s = self.schedule
        tiles = {"tile_m": s.tile_m, "tile_n": s.tile_n, "cluster_m": s.cluster_m, "cluster_n": s.cluster_n}
        cluster_tiles = (
            f"ceil_div(ceil_div(M, {s.tile_m}), {s.cluster_m}) * ceil_div(ceil_div(N, {s.tile_n}), {s.cluster_n})"
        )
        if self.schedule.splits_k:
            # K_SPLITS work units per cluster tile (of every group counted full, masked).
            units = f"{cluster_tiles} * K_SPLITS"
            if self.schedule.op.is_masked:
                units = f"G * {units}"
        elif s.op.splits_last_wave:
            # With TAIL_SPLIT = 1, every cluster the GPU holds (fewer tiles than clusters: the
            # idle ones take shares of the tiles' K blocks), else one per cluster tile.
            units = f"{cluster_tiles} + TAIL_SPLIT * max_active_clusters"
        elif self.schedule.op.is_masked or self.schedule.op.is_k_grouped:
            # Every group counted full (the host never reads masked_m or the group sizes); idle
            # clusters exit at once. The tile fields feed the heuristic.
            units = f"G * {cluster_tiles}"
        else:
            extent_m, extent_n = s.tile_extents
            return {"kind": "persistent_clusters", **tiles, "extent_m": extent_m, "extent_n": extent_n}
        clusters = f"max(min({units}, max_active_clusters), 1)"
        return {"kind": "blocks", **tiles, "blocks": [str(s.cluster_m), str(s.cluster_n), clusters]}

    def launch_facts(self) -> dict:
        s = self.schedule
        if self.kernel.smem_bytes is None:
            raise RuntimeError("launch_facts() is only known after the kernel has been traced")
        return {
            "block": [s.threads_per_cta, 1, 1],
            "cluster": [s.cluster_m, s.cluster_n, 1],
            "smem_bytes": int(self.kernel.smem_bytes),
            "pdl": False,
            "cooperative": False,
        }

    def param_bindings(self) -> list[dict]:
        return self.kernel.param_bindings()
