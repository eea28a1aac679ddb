"""The manifest schema: the launch contract of one built kernel, written by the generator and read here.

A manifest states everything needed to launch a cubin without the CuTe DSL: the entry symbol, the
launch facts (block, cluster, dynamic shared memory, PDL, grid rule) and, for every `.param` of the
entry, its offset, size, alignment and a *binding* that says how the runtime fills it from the
call's operands. Both the generator (writer) and the runtime (reader) use these classes, so the two
cannot drift. This module imports nothing beyond the standard library.

Bindings (``Param.binding["kind"]``):

``tma``
    A 128-byte ``CUtensorMap`` for operand ``operand``, encoded with ``cuTensorMapEncodeTiled``:
    ``modes`` lists the operand's modes in TMA dimension order (contiguous mode first); global dims
    are the operand's extents in that order and global strides (dims 1..) its strides in bytes;
    ``box`` is the shared-memory box per TMA dimension; ``swizzle`` is one of ``none``, ``32B``,
    ``64B``, ``128B``; ``dtype`` names the TMA element type; ``l2_promotion`` and ``oob_fill`` as
    named.
``shape``
    The dynamic extents of an operand (a TMA coordinate tensor's shape leaves), ``values`` being a
    list of extent symbols (``"M"``, ``"N"``, ``"K"``) packed as ``width``-bit integers.
``zeros``
    ``size`` zero bytes (a DSL object with no run-time content, such as a Hopper ``TiledMma``).
``scalar``
    One scalar of ``dtype`` (``i32``, ``i64``, ``f32``) whose value is the expression ``expr`` over
    the extent symbols.
    A float scalar may state ``range``: ``[low, high]``, the values the kernel takes (a launch
    with another value, NaN included, is refused).
``pointer``
    The 64-bit device address of operand ``operand``.
``tensor``
    A plain global-memory tensor passed by value: the C struct the DSL declares for a dynamic
    ``cute.Tensor`` argument, ``{void *data; shape leaves...; stride leaves...}``. ``operand``
    names the tensor (the struct's ``data`` is its 64-bit address); ``shape`` lists the dynamic
    extents as expressions over the extent symbols, packed as ``shape_widths``-bit integers;
    ``strides`` lists, for each dynamic stride leaf, the operand mode whose stride (in elements)
    it is, packed as ``stride_widths``-bit integers. Fields follow one another in that order,
    each at its natural alignment; the struct is padded to its largest alignment (8). A fully
    static tensor has empty lists (the pointer alone). See `params.tensor_struct_layout`.

``requires`` lists relations between the extent symbols that the operands' shapes cannot state
and that the kernel relies on to stay within its operands (``KB == ceil_div(K, 128)``: one scale
column per 128-wide K block; ``SN >= ceil_div(N, 128)``: room for every block's scale). Every
launcher refuses a launch that breaks one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# 2: the schedule's derived facts under `facts` (they replace `wgmma_accumulators` and
# `column_scales_early`).
SCHEMA_VERSION = 2

BINDING_KINDS = ("tma", "shape", "zeros", "scalar", "pointer", "tensor")
GRID_RULES = ("persistent_clusters", "blocks")


# The schedule epilogues (``schedule["epilogue"]``) whose kernels add their tiles into D (D = C +
# A·Bᵀ with D holding C): whole tiles, or split along K with the last CTA of a tile adding the sum
# (the generator's `Epilogue.adds_into_d`, checked equal by the CPU tests).
ADDING_EPILOGUES = frozenset({"tma_store_add", "split_k_tma_store_add"})


def adds_into_d(schedule: dict[str, Any]) -> bool:
    """Whether a manifest's schedule adds its tiles into D (`ADDING_EPILOGUES`)."""
    return schedule.get("epilogue") in ADDING_EPILOGUES


class ManifestError(ValueError):
    """A manifest or catalogue that cannot be used: missing, malformed or of another schema."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One `.param` of the kernel entry."""

    index: int
    name: str
    offset: int
    size: int
    align: int
    binding: dict[str, Any]

    def __post_init__(self) -> None:
        kind = self.binding.get("kind")
        if kind not in BINDING_KINDS:
            raise ManifestError(f"param {self.name!r}: unknown binding kind {kind!r}")


@dataclasses.dataclass(frozen=True)
class OperandSpec:
    """What the kernel expects of one tensor operand."""

    name: str
    dtype: str
    # Symbolic extents, e.g. ["M", "K"]; the runtime binds the symbols from the actual tensors.
    shape: list[str]
    # Index of the mode with unit stride (the contiguous one); -1: no mode must have unit stride
    # (the kernel takes every stride at run time), only the alignment rule applies.
    contiguous_mode: int
    # Required alignment of the base address and of the non-unit strides, in bytes.
    align_bytes: int
    # Whether the kernel writes it: then no two of its elements may share memory (False in
    # manifests written before the field existed).
    written: bool = False
    # Whether the kernel takes only its address and reads it as a packed row-major array: then
    # its strides must be exactly those (False in manifests written before the field existed).
    packed: bool = False


@dataclasses.dataclass(frozen=True)
class Requirement:
    """``symbol relation expr``: an extent symbol against an expression over the launch symbols."""

    symbol: str
    relation: str  # one of RELATIONS
    expr: str

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ManifestError(f"requirement on {self.symbol!r}: unknown relation {self.relation!r}")

    def __str__(self) -> str:
        return f"{self.symbol} {self.relation} {self.expr}"


RELATIONS = ("==", ">=")


@dataclasses.dataclass(frozen=True)
class GridRule:
    """How the runtime computes the launch grid.

    ``persistent_clusters``: the output [extent_m, extent_n] is cut into tile_m x tile_n tiles,
    grouped into cluster_m x cluster_n cluster tiles; the grid is
    (cluster_m, cluster_n, min(cluster tiles, max active clusters)) and each cluster walks the
    cluster tiles in a persistent loop.

    ``blocks``: the grid is ``blocks``, three expressions (x, y, z) over the launch symbols (the
    operands' extents, given extents, ``sm_count`` and ``max_active_clusters``, which for a
    kernel without clusters is the number of co-resident CTAs on the device), evaluated by the
    runtime's expression evaluator, e.g. ``["min(ceil_div(M, 8) * ceil_div(K, 512),
    max_active_clusters)", "1", "1"]`` for a persistent kernel over tiles. A dimension that
    evaluates to 0 or less means there is nothing to do: nothing is launched. The tile and
    cluster fields are unused (0).
    """

    kind: str
    tile_m: int = 0
    tile_n: int = 0
    cluster_m: int = 0
    cluster_n: int = 0
    extent_m: str = "M"
    extent_n: str = "N"
    blocks: list[str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in GRID_RULES:
            raise ManifestError(f"unknown grid rule {self.kind!r}")
        if self.kind == "blocks" and (not isinstance(self.blocks, list) or len(self.blocks) != 3):
            raise ManifestError(f"grid rule 'blocks' needs three expressions, got {self.blocks!r}")

    @property
    def rows_along_n(self) -> bool:
        """The tiles' rows run along N and their columns along M (a kernel whose MMA takes B's
        rows as its M side)."""
        return self.extent_m == "N"


@dataclasses.dataclass(frozen=True)
class KernelManifest:
    """Everything needed to launch one cubin."""

    name: str
    op: str
    arch: str
    entry: str
    cubin: str
    sha256: str
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem_bytes: int
    pdl: bool
    cooperative: bool
    grid: GridRule
    operands: list[OperandSpec]
    params: list[Param]
    schedule: dict[str, Any]
    toolchain: dict[str, str]
    registers: int | None = None
    # What the schedule implies, derived once by the generator (`Schedule.facts`: waves, WGMMA
    # accumulators, scale layout, epilogue staging, K splits, modelled shared memory...): the
    # runtime's heuristic reads these instead of deriving them from `schedule` again.
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Relations between extent symbols the launch must satisfy.
    requires: list[Requirement] = dataclasses.field(default_factory=list)
    schema: int = SCHEMA_VERSION

    @property
    def param_bytes(self) -> int:
        if not self.params:
            return 0
        last = max(self.params, key=lambda p: p.offset)
        return last.offset + last.size

    def fact(self, name: str) -> Any:
        """The derived schedule fact `name` (see `facts`)."""
        if name not in self.facts:
            raise ManifestError(f"kernel {self.name}: its manifest records no fact {name!r}; rebuild the kernel")
        return self.facts[name]

    def operand(self, name: str) -> OperandSpec:
        for op in self.operands:
            if op.name == name:
                return op
        raise ManifestError(f"kernel {self.name}: no operand {name!r}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "KernelManifest":
        if not isinstance(data, dict):
            raise ManifestError(f"malformed manifest: a JSON object was expected, got {type(data).__name__}")
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise ManifestError(
                f"manifest schema {schema!r} is not the supported version {SCHEMA_VERSION}; "
                "rebuild the kernels with this version of cutegen"
            )
        try:
            return cls(
                name=data["name"],
                op=data["op"],
                arch=data["arch"],
                entry=data["entry"],
                cubin=data["cubin"],
                sha256=data["sha256"],
                block=tuple(data["block"]),  # type: ignore[arg-type]
                cluster=tuple(data["cluster"]),  # type: ignore[arg-type]
                smem_bytes=int(data["smem_bytes"]),
                pdl=bool(data["pdl"]),
                cooperative=bool(data["cooperative"]),
                grid=GridRule(**data["grid"]),
                operands=[OperandSpec(**o) for o in data["operands"]],
                params=[Param(**p) for p in data["params"]],
                schedule=dict(data["schedule"]),
                toolchain=dict(data["toolchain"]),
                registers=data.get("registers"),
                facts=dict(data["facts"]),
                requires=[Requirement(**r) for r in data["requires"]],
                schema=schema,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"malformed manifest: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> "KernelManifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


@dataclasses.dataclass(frozen=True)
class CatalogueEntry:
    """One line of ``catalogue.json``: a built kernel and where its files are (relative paths)."""

    name: str
    op: str
    arch: str
    manifest: str
    schedule: dict[str, Any]
    manifest_sha256: str | None = None  # the manifest file's sha256 (older catalogues have none)


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """The index of a build folder."""

    kernels: list[CatalogueEntry]
    toolchain: dict[str, str]
    schema: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Catalogue":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"catalogue is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ManifestError(f"malformed catalogue: a JSON object was expected, got {type(data).__name__}")
        if data.get("schema") != SCHEMA_VERSION:
            raise ManifestError(
                f"catalogue schema {data.get('schema')!r} is not the supported version "
                f"{SCHEMA_VERSION}; rebuild the kernels with this version of cutegen"
            )
        try:
            return cls(
                kernels=[CatalogueEntry(**k) for k in data["kernels"]],
                toolchain=dict(data.get("toolchain", {})),
                schema=data["schema"],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"malformed catalogue: {type(exc).__name__}: {exc}") from exc
