"""Export built kernels into a self-contained folder that another project links against.

``cutegen export PATTERN... -o DIR`` copies the chosen kernels out of a build folder (cubin,
manifest, C header, SASS summary), indexes them in ``DIR/catalogue.json`` (so ``DIR`` is also a
build folder the Python runtime can use) and generates, from each manifest, a C launcher that needs
only the CUDA driver API (``cuda.h``, ``libcuda``):

``cutegen_launcher.h`` / ``cutegen_launcher.c``
    The common part: `cutegen_kernel` (a loaded kernel), loading a cubin (``cuModuleLoadData``,
    sha256 check, architecture and shared-memory checks, max dynamic shared memory, non-portable
    clusters, the driver's parameter layout compared with the manifest's, ``max active clusters``
    from ``cuOccupancyMaxActiveClusters``), TMA encoding (``cuTensorMapEncodeTiled``), the
    ``persistent_clusters`` grid and the launch (``cuLaunchKernelEx`` with the cluster attribute).
``<name>/launcher.c``
    Per kernel: ``<name>_prepare`` (checks the operands, encodes the TMA descriptors, packs the
    parameters into the header's struct, computes the grid) and ``<name>_launch``.
``cutegen_<op>.c``
    Per op: ``cutegen_<op>_prepare`` / ``cutegen_<op>_launch`` taking any exported kernel of the op.
``cutegen_kernels.h`` / ``cutegen_kernels.c``
    The public header (declares everything above) and the index of the exported kernels.
``cutegen.cmake``, ``cutegen.mk``, ``README.md``
    A CMake snippet adding a library target, a make fragment, and usage.

The C code mirrors the Python runtime exactly (`cutegen.runtime.params.normalize_operand`,
`tma_args_from_binding`, `pack_params`, `cutegen.runtime.launch.persistent_grid`,
`cutegen.runtime.driver.LoadedKernel`); the CPU tests link it against a recording stub of the
driver and compare. Anything a manifest asks for that the C launcher cannot do (a binding kind,
a grid rule, an expression symbol, a scalar type) is refused here, at export time, by name.

Nothing here imports the CuTe DSL.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from cutegen.runtime.version import __version__ as CUTEGEN_VERSION
from cutegen.runtime.catalogue import required_capability
from cutegen.runtime.errors import ArtifactError, KernelLoadError
from cutegen.runtime.manifest import Catalogue, KernelManifest, ManifestError, adds_into_d
from cutegen.runtime.params import DTYPE_BITS, TMA_FP4_PACKED, check_manifest, compile_expr

CATALOGUE_FILE = "catalogue.json"
MANIFEST_FILE = "manifest.json"
EXPORT_MARKER = ".cutegen-export"
KERNEL_FILES = ("kernel.cubin", "manifest.json", "kernel.h")
OPTIONAL_KERNEL_FILES = ("sass.txt", "sass_summary.json")
LAUNCHER_FILE = "launcher.c"
COMMON_HEADER = "cutegen_launcher.h"
COMMON_SOURCE = "cutegen_launcher.c"
INDEX_HEADER = "cutegen_kernels.h"
INDEX_SOURCE = "cutegen_kernels.c"
CMAKE_FILE = "cutegen.cmake"
MAKE_FILE = "cutegen.mk"
README_FILE = "README.md"

# Symbols the C launcher binds besides the extents (as the Python runtime's launch.prepare does).
DERIVED_SYMBOLS = ("sm_count", "max_active_clusters", "tiles_m", "tiles_n", "cluster_tiles", "num_clusters")
# Symbols of kernels with the ``blocks`` grid rule (launch.prepare binds no tile counts for them).
BLOCKS_SYMBOLS = ("sm_count", "max_active_clusters")
SUPPORTED_BINDINGS = ("tma", "shape", "zeros", "scalar", "pointer", "tensor")
SUPPORTED_GRID_RULES = ("persistent_clusters", "blocks")
MAX_TMA_RANK = 5
MAX_OPERAND_RANK = 8
# Extent symbols are passed as int32_t (the TMA coordinate tensors hold 32-bit extents).
EXTENT_CTYPE = "int32_t"

# The header's C types of scalar bindings (kernel.h.j2) and their value ranges (params._pack_scalar).
SCALAR_CTYPES = {"i32": "int32_t", "i64": "int64_t", "f32": "float"}

# Manifest names -> cuda.h enumerators; the same tables as cutegen.runtime.tma.
TMA_DTYPE_ENUMS = {
    "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
    "f64": "CU_TENSOR_MAP_DATA_TYPE_FLOAT64",
    "tf32": "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32",
    "e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "e5m2": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    # CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B by value: cuda.h has the name from CUDA 12.8 only.
    "e2m1": "CUTEGEN_TMA_DTYPE_FP4_UNPACKED",
    # CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B by value (packed in shared memory too: NVFP4).
    TMA_FP4_PACKED: "CUTEGEN_TMA_DTYPE_FP4_PACKED",
    "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "i8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "u16": "CU_TENSOR_MAP_DATA_TYPE_UINT16",
    "i32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
    "u32": "CU_TENSOR_MAP_DATA_TYPE_UINT32",
    "i64": "CU_TENSOR_MAP_DATA_TYPE_INT64",
    "u64": "CU_TENSOR_MAP_DATA_TYPE_UINT64",
}
TMA_SWIZZLE_ENUMS = {
    "none": "CU_TENSOR_MAP_SWIZZLE_NONE",
    "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
    "64B": "CU_TENSOR_MAP_SWIZZLE_64B",
    "128B": "CU_TENSOR_MAP_SWIZZLE_128B",
}
TMA_L2_ENUMS = {
    "none": "CU_TENSOR_MAP_L2_PROMOTION_NONE",
    "64B": "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
    "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
    "256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
}
TMA_OOB_ENUMS = {
    "none": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
    "nan_request_zero_fma": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA",
}
TMA_INTERLEAVE_ENUMS = {
    "none": "CU_TENSOR_MAP_INTERLEAVE_NONE",
    "16B": "CU_TENSOR_MAP_INTERLEAVE_16B",
    "32B": "CU_TENSOR_MAP_INTERLEAVE_32B",
}

_C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool true false _Bool _Alignas _Alignof _Atomic _Generic
    _Noreturn _Static_assert _Thread_local class new delete this template typename namespace
    operator private public protected virtual friend""".split()
)
# Names the generated functions use for themselves.
_RESERVED_ARGS = frozenset({"kernel", "plan", "stream", "p", "r", "v", "bad", "info"})
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ExportError(ValueError):
    """A kernel that cannot be exported, or a bad export request; the message says which and why.

    ``usage`` is true for a bad request (no catalogue, unknown name, an output folder that must not
    be replaced), false for a kernel that cannot be exported (corrupt or unsupported).
    """

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# ---- expressions -------------------------------------------------------------------------------


def c_expr(text: str | int | float, symbols: Iterable[str], what: str = "expression") -> str:
    """Translate a manifest expression into a C ``int64_t`` expression over ``s_<symbol>`` locals.

    The language is the runtime's (`cutegen.runtime.params.Expr`): integers, symbols, ``+ - *``,
    floor division ``//`` and Python's ``%`` (both through helpers that also report a division by
    zero in the local ``bad``), unary minus, ``ceil_div``, ``min`` and ``max``.
    """
    allowed = set(symbols)
    try:
        compile_expr(text)  # the runtime's own parser: the same accepted language
    except KernelLoadError as exc:
        raise ExportError(f"{what}: {exc}") from None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        node: ast.AST = ast.Constant(text)
    else:
        node = ast.parse(str(text).strip(), mode="eval").body
    return _c_node(node, str(text), allowed, what)


def _c_node(node: ast.AST, text: str, allowed: set[str], what: str) -> str:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, float):
            raise ExportError(
                f"{what}: {text!r} uses the float literal {node.value!r}; the C launcher evaluates "
                "expressions in int64 (a float scalar may only be a plain number)"
            )
        value = int(node.value)
        if not -(1 << 63) < value < (1 << 63):
            raise ExportError(f"{what}: literal {value} does not fit in int64")
        return f"INT64_C({value})"
    if isinstance(node, ast.Name):
        if node.id not in allowed:
            raise ExportError(
                f"{what}: {text!r} uses symbol {node.id!r}, which the C launcher cannot bind "
                f"(it binds {', '.join(sorted(allowed))})"
            )
        return f"s_{node.id}"
    if isinstance(node, ast.BinOp):
        left = _c_node(node.left, text, allowed, what)
        right = _c_node(node.right, text, allowed, what)
        if isinstance(node.op, ast.Add):
            return f"({left} + {right})"
        if isinstance(node.op, ast.Sub):
            return f"({left} - {right})"
        if isinstance(node.op, ast.Mult):
            return f"({left} * {right})"
        if isinstance(node.op, ast.FloorDiv):
            return f"cutegen__floordiv({left}, {right}, &bad)"
        if isinstance(node.op, ast.Mod):
            return f"cutegen__mod({left}, {right}, &bad)"
    if isinstance(node, ast.UnaryOp):
        inner = _c_node(node.operand, text, allowed, what)
        return f"(-{inner})" if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_c_node(a, text, allowed, what) for a in node.args]
        if node.func.id == "ceil_div":
            return f"cutegen__ceil_div({args[0]}, {args[1]}, &bad)"
        fn = "cutegen__min" if node.func.id == "min" else "cutegen__max"
        out = args[-1]
        for arg in reversed(args[:-1]):
            out = f"{fn}({arg}, {out})"
        return out
    raise ExportError(f"{what}: {text!r} cannot be translated to C")  # pragma: no cover


# ---- the C view of one manifest ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CArg:
    ctype: str
    name: str
    doc: str
    kind: str = "extent"  # operand | stride | extent | scalar


@dataclasses.dataclass
class OperandView:
    name: str
    rank: int
    contiguous_mode: int
    elem_bits: int
    align_bytes: int
    shape: list[str]  # C expressions, one per mode
    strides: list[str]  # C expressions (argument names or 1), one per mode
    written: bool = False  # the kernel writes it: no two elements may share memory
    packed: bool = False  # the kernel reads it as a packed row-major array


@dataclasses.dataclass
class ParamView:
    index: int
    name: str
    kind: str
    offset: int
    size: int
    comment: str
    code: list[str]  # C statements filling the param (none for zeros)
    recipe: dict[str, Any] | None = None  # tma: the static recipe's initialiser fields


@dataclasses.dataclass
class KernelView:
    manifest: KernelManifest
    name: str
    ident: str
    args: list[CArg]
    extents: list[str]
    operands: list[OperandView]
    params: list[ParamView]
    cc_major: int
    cc_minor: int
    arch_rule: str
    cubin_bytes: int
    signature_key: tuple[tuple[str, str], ...]
    grid_exprs: list[str] = dataclasses.field(default_factory=list)  # blocks: C expressions x, y, z
    int_scalars: list[str] = dataclasses.field(default_factory=list)  # caller scalars used in expressions
    # The manifest's ``requires``: (symbol, relation, bound expression, each as written and as C).
    requirements: list[tuple[str, str, str, str, str]] = dataclasses.field(default_factory=list)

    @property
    def grid(self) -> Any:
        return self.manifest.grid

    @property
    def c_params(self) -> str:
        """The argument list between the kernel and the stream/plan: ``CUdeviceptr a, ...``."""
        return ", ".join(f"{a.ctype} {a.name}" for a in self.args)

    @property
    def c_call_args(self) -> str:
        return ", ".join(a.name for a in self.args)


def _check_ident(name: str, what: str) -> None:
    if not _IDENT.match(name) or name in _C_KEYWORDS:
        raise ExportError(f"{what} {name!r} is not a usable C identifier")


def _static_extent(symbol: Any) -> int | None:
    if isinstance(symbol, int):
        return symbol
    if isinstance(symbol, str) and symbol.isdigit():
        return int(symbol)
    return None


def _stride_arg_name(operand: str, rank: int, mode: int, contiguous_mode: int = 1) -> str:
    """``ld<operand>`` for a 2-D operand with one unit-stride mode, else ``<operand>_stride<mode>``."""
    if rank == 2 and 0 <= contiguous_mode < 2:
        return f"ld{operand}"
    return f"{operand}_stride{mode}"


def kernel_view(manifest: KernelManifest, cubin_bytes: int = 0) -> KernelView:
    """The C launcher's model of one manifest; raises ExportError for anything it cannot launch."""
    where = f"kernel {manifest.name}"
    try:
        check_manifest(manifest)
    except KernelLoadError as exc:
        raise ExportError(f"{where}: the manifest is inconsistent: {exc}") from None
    _check_ident(manifest.name, f"{where}: the kernel name")
    _check_ident(manifest.op, f"{where}: the op name")
    try:
        cc_major, cc_minor, rule = required_capability(manifest.arch)
    except ArtifactError as exc:
        raise ExportError(f"{where}: {exc}") from None

    # Extents: every symbol of the operand shapes, grid extents first (M, N), then first appearance.
    extents: list[str] = []
    for spec in manifest.operands:
        for symbol in spec.shape:
            if _static_extent(symbol) is None and symbol not in extents:
                extents.append(str(symbol))
    rule_ = manifest.grid
    if rule_.kind not in SUPPORTED_GRID_RULES:
        raise ExportError(f"{where}: grid rule {rule_.kind!r} is not supported by the C launcher")
    grid_exprs: list[str] = []
    if rule_.kind == "persistent_clusters":
        for ext in (rule_.extent_m, rule_.extent_n):
            if ext not in extents:
                raise ExportError(
                    f"{where}: the grid rule's extent {ext!r} is not an extent of any operand "
                    f"({extents}); the C launcher cannot bind it"
                )
        head = [rule_.extent_m] + ([rule_.extent_n] if rule_.extent_n != rule_.extent_m else [])
        extents = head + [e for e in extents if e not in head]
        own = DERIVED_SYMBOLS
    else:
        own = BLOCKS_SYMBOLS
    clash = set(extents) & set(DERIVED_SYMBOLS)
    if clash:
        raise ExportError(f"{where}: extent symbol(s) {sorted(clash)} clash with the launcher's own")
    symbols = set(extents) | set(own)
    # Symbols no operand binds (e.g. a quantizer's "eps") are given by the caller, as the Python
    # runtime's `extents`: float when only ever a plain f32 scalar, else int64_t.
    scalars = _caller_scalars(manifest, symbols)
    symbols |= {n for n, t in scalars.items() if t == "int64_t"}
    if rule_.kind == "blocks":
        grid_exprs = [c_expr(e, symbols, f"{where}: grid expression {i}") for i, e in enumerate(rule_.blocks or [])]

    args: list[CArg] = []
    operands: list[OperandView] = []
    for spec in manifest.operands:
        _check_ident(spec.name, f"{where}: operand name")
        if spec.name in _RESERVED_ARGS:
            raise ExportError(f"{where}: operand name {spec.name!r} is reserved by the C launcher")
        rank = len(spec.shape)
        if not 1 <= rank <= MAX_OPERAND_RANK:
            raise ExportError(f"{where}: operand {spec.name!r} has rank {rank}; the C launcher takes 1..8")
        elem = DTYPE_BITS[spec.dtype]
        args.append(
            CArg("CUdeviceptr", spec.name, f"{spec.dtype} [{', '.join(map(str, spec.shape))}], "
                 f"{spec.align_bytes}-byte aligned", "operand")
        )
        shape_c, stride_c = [], []
        for mode, symbol in enumerate(spec.shape):
            static = _static_extent(symbol)
            shape_c.append(f"INT64_C({static})" if static is not None else f"s_{symbol}")
            if mode == spec.contiguous_mode:
                stride_c.append("INT64_C(1)")
            else:
                arg = _stride_arg_name(spec.name, rank, mode, spec.contiguous_mode)
                args.append(
                    CArg("int64_t", arg, f"stride of {spec.name} mode {mode} ({symbol}) in elements", "stride")
                )
                stride_c.append(arg)
        operands.append(
            OperandView(spec.name, rank, spec.contiguous_mode, elem, spec.align_bytes, shape_c, stride_c, spec.written, spec.packed)
        )
    for ext in extents:
        _check_ident(ext, f"{where}: extent symbol")
        args.append(CArg(EXTENT_CTYPE, ext, "extent", "extent"))
    for name, ctype in scalars.items():
        _check_ident(name, f"{where}: scalar symbol")
        args.append(CArg(ctype, name, "scalar given by the caller", "scalar"))
    seen: set[str] = set()
    for a in args:
        if a.name in seen or a.name in _RESERVED_ARGS:
            raise ExportError(f"{where}: the C launcher's argument {a.name!r} is ambiguous or reserved")
        seen.add(a.name)

    floats = {n for n, t in scalars.items() if t == "float"}
    params = [_param_view(manifest, p, symbols, floats) for p in manifest.params]
    requirements = [
        (r.symbol, r.relation, r.expr, c_expr(r.symbol, symbols, f"{where}: requirement {r}"),
         c_expr(r.expr, symbols, f"{where}: requirement {r}"))
        for r in manifest.requires
    ]
    return KernelView(
        manifest=manifest,
        name=manifest.name,
        ident=manifest.name.upper(),
        args=args,
        extents=extents,
        operands=operands,
        params=params,
        cc_major=cc_major,
        cc_minor=cc_minor,
        arch_rule=rule,
        cubin_bytes=cubin_bytes,
        # The arguments, the operands' element types and contiguous modes, and whether D is added
        # to: kernels that differ in any of them cannot serve one call of the op's dispatcher.
        signature_key=(
            *((a.ctype, a.name) for a in args),
            *((f"operand {spec.name}", f"{spec.dtype}, contiguous mode {spec.contiguous_mode}") for spec in manifest.operands),
            ("adds into d", str(adds_into_d(manifest.schedule))),
        ),
        grid_exprs=grid_exprs,
        int_scalars=[n for n, t in scalars.items() if t == "int64_t"],
        requirements=requirements,
    )


def _expr_names(text: Any) -> list[str]:
    if isinstance(text, (int, float)):
        return []
    try:
        tree = ast.parse(str(text).strip(), mode="eval")
    except SyntaxError:
        return []  # check_manifest reports it
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in ("ceil_div", "min", "max") and node.id not in names:
            names.append(node.id)
    return names


def _caller_scalars(manifest: KernelManifest, bound: set[str]) -> dict[str, str]:
    """Unbound expression symbols in order of appearance, each with its C argument type."""
    plain_float: dict[str, bool] = {}
    for p in manifest.params:
        b = p.binding
        kind = b["kind"]
        if kind == "scalar":
            texts = [b.get("expr")]
        elif kind == "shape":
            texts = list(b.get("values", []))
        elif kind == "tensor":
            texts = list(b.get("shape", []))
        else:
            texts = []
        for text in texts:
            names = _expr_names(text)
            bare = kind == "scalar" and b.get("dtype") == "f32" and str(text).strip() in names
            for name in names:
                if name in bound:
                    continue
                plain_float[name] = plain_float.get(name, True) and bare
    if manifest.grid.kind == "blocks":
        for text in manifest.grid.blocks or []:
            for name in _expr_names(text):
                if name not in bound:
                    plain_float[name] = False
    return {n: ("float" if f else "int64_t") for n, f in plain_float.items()}


def _param_view(manifest: KernelManifest, param: Any, symbols: set[str], floats: set[str] = frozenset()) -> ParamView:
    b = param.binding
    kind = b["kind"]
    where = f"kernel {manifest.name} param {param.index} {param.name!r}"
    _check_ident(param.name, f"{where}: the param name")
    q = json.dumps  # C string literals of plain ASCII names
    code: list[str] = []
    recipe = None
    comment = kind
    if kind not in SUPPORTED_BINDINGS:  # pragma: no cover - Param refuses unknown kinds
        raise ExportError(f"{where}: binding kind {kind!r} is not supported by the C launcher")
    if kind == "tma":
        spec = manifest.operand(b["operand"])
        rank = len(b["modes"])
        if rank > MAX_TMA_RANK:
            raise ExportError(f"{where}: TMA rank {rank} is above {MAX_TMA_RANK}")
        for field, table in (
            ("dtype", TMA_DTYPE_ENUMS),
            ("swizzle", TMA_SWIZZLE_ENUMS),
            ("l2_promotion", TMA_L2_ENUMS),
            ("oob_fill", TMA_OOB_ENUMS),
            ("interleave", TMA_INTERLEAVE_ENUMS),
        ):
            default = {"swizzle": "none", "l2_promotion": "128B", "oob_fill": "none", "interleave": "none"}
            value = b.get(field, default.get(field))
            if value not in table:
                raise ExportError(f"{where}: TMA {field} {value!r} has no cuda.h enumerator here")
        element_strides = [int(s) for s in b.get("element_strides", [1] * rank)]
        recipe = {
            "dtype": TMA_DTYPE_ENUMS[b["dtype"]],
            "rank": rank,
            "modes": [int(m) for m in b["modes"]],
            "box": [int(x) for x in b["box"]],
            "element_strides": element_strides,
            "interleave": TMA_INTERLEAVE_ENUMS[b.get("interleave", "none")],
            "swizzle": TMA_SWIZZLE_ENUMS[b.get("swizzle", "none")],
            "l2_promotion": TMA_L2_ENUMS[b.get("l2_promotion", "128B")],
            "oob_fill": TMA_OOB_ENUMS[b.get("oob_fill", "none")],
            "elem_bits": DTYPE_BITS[spec.dtype],
        }
        comment = (
            f"tma of {b['operand']}: modes {b['modes']}, box {b['box']}, {b['dtype']}, "
            f"swizzle {b.get('swizzle', 'none')}"
        )
        code.append(
            f"r = cutegen__encode_tma(CUTEGEN_THIS, {q(param.name)}, "
            f"&{manifest.name}_{param.name}_recipe, &op_{b['operand']}, p->{param.name});"
        )
        code.append("if (r != CUDA_SUCCESS) goto fail;")
    elif kind == "shape":
        width = int(b.get("width", 32))
        values = list(b["values"])
        comment = f"shape of {b.get('operand', '?')}: {values} as int{width}"
        for i, value in enumerate(values):
            expr = c_expr(value, symbols, f"{where} value {i}")
            code.append(f"v = {expr};")
            code.append(
                f"r = cutegen__put_int(CUTEGEN_THIS, {q(param.name)}, {i}, &p->{param.name}[{i}], "
                f"{width}, 0, v, bad);"
            )
            code.append("if (r != CUDA_SUCCESS) goto fail;")
    elif kind == "pointer":
        comment = f"address of {b['operand']}"
        code.append(f"p->{param.name} = (uint64_t){b['operand']};")
    elif kind == "scalar":
        dtype = b["dtype"]
        if dtype not in SCALAR_CTYPES:
            raise ExportError(
                f"{where}: scalar dtype {dtype!r} is not supported by the C launcher "
                f"(supported: {', '.join(SCALAR_CTYPES)})"
            )
        comment = f"scalar {dtype} = {b['expr']}"
        text = b["expr"]
        plain = _plain_number(text)
        if dtype == "f32":
            if str(text).strip() in floats:
                value = str(text).strip()
            elif plain is not None:
                value = f"(float){float(plain)!r}"
            else:
                code.append(f"v = {c_expr(text, symbols, f'{where} expression')};")
                code.append(
                    f"if (bad) {{ r = cutegen__put_int(CUTEGEN_THIS, {q(param.name)}, -1, "
                    f"NULL, 64, 1, 0, bad); goto fail; }}"
                )
                value = "(float)v"
            if "range" in b:  # NaN fails both comparisons
                low, high = (float(x) for x in b["range"])
                code.append(
                    f"r = cutegen__check_range(CUTEGEN_THIS, {q(param.name)}, {q(str(text))}, (double){value}, "
                    f"{low!r}, {high!r});"
                )
                code.append("if (r != CUDA_SUCCESS) goto fail;")
            code.append(f"p->{param.name} = {value};")
        else:
            width = 32 if dtype == "i32" else 64
            expr = c_expr(text, symbols, f"{where} expression")
            code.append(f"v = {expr};")
            code.append(
                f"r = cutegen__put_int(CUTEGEN_THIS, {q(param.name)}, -1, &p->{param.name}, "
                f"{width}, 1, v, bad);"
            )
            code.append("if (r != CUDA_SUCCESS) goto fail;")
    elif kind == "tensor":
        from cutegen.runtime.params import tensor_struct_layout

        operand = b["operand"]
        shape = list(b.get("shape", []))
        strides = [int(m) for m in b.get("strides", [])]
        shape_widths = [int(w) for w in b.get("shape_widths", [32] * len(shape))]
        stride_widths = [int(w) for w in b.get("stride_widths", [64] * len(strides))]
        offsets, _, _ = tensor_struct_layout(b)
        comment = f"tensor {operand}: {{data; extents {shape}; strides of modes {strides}}}"
        code.append(
            f"r = cutegen__put_int(CUTEGEN_THIS, {q(param.name)}, -1, p->{param.name} + 0, 64, 0, "
            f"(int64_t)op_{operand}.ptr, 0);"
        )
        code.append("if (r != CUDA_SUCCESS) goto fail;")
        fields = [(c_expr(v, symbols, f"{where} extent {i}"), w) for i, (v, w) in enumerate(zip(shape, shape_widths))]
        fields += [(f"op_{operand}.strides[{m}]", w) for m, w in zip(strides, stride_widths)]
        for i, ((expr, width), offset) in enumerate(zip(fields, offsets[1:])):
            code.append(f"v = {expr};")
            code.append(
                f"r = cutegen__put_int(CUTEGEN_THIS, {q(param.name)}, {i}, p->{param.name} + {offset}, "
                f"{width}, 0, v, bad);"
            )
            code.append("if (r != CUDA_SUCCESS) goto fail;")
    elif kind == "zeros":
        comment = f"{param.size} zero bytes"
    return ParamView(param.index, param.name, kind, param.offset, param.size, comment, code, recipe)


def _plain_number(text: Any) -> float | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    try:
        node = ast.parse(str(text).strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float)):
            return -float(inner.value)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


# ---- rendering ---------------------------------------------------------------------------------


def _env() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("cutegen.templates", "artifacts"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@dataclasses.dataclass
class OpGroup:
    """An op's exported kernels. `cutegen_<op>_launch` dispatches over `dispatched`: the kernels
    of one signature (arguments, operand types and majorness, adding into D), those storing D before those
    adding into it, those without split K before those with it, then the most common, then the first in name order (e.g. the fp8_gemm_nt
    kernels without split K, the bf16_gemm_nt kernels writing a bf16 D); the others take other
    arguments (a split-K kernel's workspace and split count) or operand types and are launched
    through their own `<name>_launch`."""

    op: str
    kernels: list[KernelView]
    dispatched: list[KernelView]

    @property
    def dispatch(self) -> bool:
        return bool(self.dispatched)

    @property
    def first(self) -> KernelView:
        return self.dispatched[0]

    @property
    def others(self) -> list[KernelView]:
        return [k for k in self.kernels if k not in self.dispatched]


def _takes_split_workspace(signature_key: tuple[tuple[str, str], ...]) -> bool:
    """A split-K kernel's signature: its workspace and split count are the caller's to pass."""
    return any(name == "split_counters" for _, name in signature_key)


def op_groups(views: Sequence[KernelView]) -> list[OpGroup]:
    groups: dict[str, list[KernelView]] = {}
    for v in views:
        groups.setdefault(v.manifest.op, []).append(v)
    out = []
    for op, kernels in sorted(groups.items()):
        counts = collections.Counter(k.signature_key for k in kernels)
        first_seen = {key: i for i, key in reversed(list(enumerate(k.signature_key for k in kernels)))}
        common = min(counts, key=lambda key: (
            dict(key).get("adds into d") == "True", _takes_split_workspace(key), -counts[key], first_seen[key]
        ))
        out.append(OpGroup(op, kernels, [k for k in kernels if k.signature_key == common]))
    return out


def param_buffer_bytes(views: Sequence[KernelView]) -> int:
    need = max([v.manifest.param_bytes for v in views] + [64])
    return -(-need // 64) * 64


def _sha256_constants() -> tuple[list[int], list[int]]:
    """SHA-256's initial hash values and round constants (FIPS 180-4, section 4.2.2 / 5.3.3):
    the first 32 bits of the fractional parts of the square / cube roots of the first primes."""
    primes: list[int] = []
    n = 2
    while len(primes) < 64:
        if all(n % p for p in primes if p * p <= n):
            primes.append(n)
        n += 1

    def iroot(x: int, k: int) -> int:
        lo, hi = 0, 1 << (x.bit_length() // k + 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid**k <= x:
                lo = mid
            else:
                hi = mid - 1
        return lo

    h = [iroot(p << 64, 2) & 0xFFFFFFFF for p in primes[:8]]
    k = [iroot(p << 96, 3) & 0xFFFFFFFF for p in primes]
    return h, k


def render_files(views: Sequence[KernelView], title: str = "") -> dict[str, str]:
    """Every generated text file of an export, keyed by its path relative to the export folder."""
    if not views:
        raise ExportError("nothing to export")
    env = _env()
    groups = op_groups(views)
    sources = [COMMON_SOURCE, INDEX_SOURCE]
    sources += [f"cutegen_{g.op}.c" for g in groups if g.dispatch]
    sources += [f"{v.name}/{LAUNCHER_FILE}" for v in views]
    sha_h, sha_k = _sha256_constants()
    ctx = {
        "sources": sources,
        "sha256_h": sha_h,
        "sha256_k": sha_k,
        "views": views,
        "groups": groups,
        "version": CUTEGEN_VERSION,
        "param_buffer_bytes": param_buffer_bytes(views),
        "max_params": max([len(v.manifest.params) for v in views] + [1]),
        "max_tma_rank": MAX_TMA_RANK,
        "max_operand_rank": MAX_OPERAND_RANK,
        "title": title,
    }
    files = {
        COMMON_HEADER: env.get_template("export_launcher.h.j2").render(**ctx),
        COMMON_SOURCE: env.get_template("export_launcher.c.j2").render(**ctx),
        INDEX_HEADER: env.get_template("export_kernels.h.j2").render(**ctx),
        INDEX_SOURCE: env.get_template("export_kernels.c.j2").render(**ctx),
        CMAKE_FILE: env.get_template("export_cutegen.cmake.j2").render(**ctx),
        MAKE_FILE: env.get_template("export_cutegen.mk.j2").render(**ctx),
        README_FILE: env.get_template("export_README.md.j2").render(**ctx),
    }
    for group in groups:
        if group.dispatch:
            files[f"cutegen_{group.op}.c"] = env.get_template("export_op.c.j2").render(g=group, **ctx)
    kernel_tpl = env.get_template("export_kernel_launcher.c.j2")
    for v in views:
        files[f"{v.name}/{LAUNCHER_FILE}"] = kernel_tpl.render(v=v, **ctx)
    return files


def c_sources(files: Iterable[str]) -> list[str]:
    """The .c files of an export (relative paths), in a stable order."""
    return sorted(f for f in files if f.endswith(".c"))


# ---- the export --------------------------------------------------------------------------------


@dataclasses.dataclass
class ExportReport:
    out_dir: Path
    kernels: list[str]
    files: list[str]
    # (op, kernels outside cutegen_<op>_launch): kernels whose signature (arguments, operand types
    # and majorness, adding into D) is not the op's common one
    skipped_dispatch: list[tuple[str, list[str]]]

    def summary(self) -> str:
        lines = [f"exported {len(self.kernels)} kernel(s) to {self.out_dir}:"]
        lines += [f"  {n}" for n in self.kernels]
        srcs = c_sources(self.files)
        lines.append(f"C sources ({len(srcs)}): {', '.join(srcs[:4])}{' ...' if len(srcs) > 4 else ''}")
        for op, names in self.skipped_dispatch:
            lines.append(
                f"note: {len(names)} {op} kernel(s) take other arguments or operand types than cutegen_{op}_launch "
                f"(e.g. {names[0]}); launch them with their own <name>_launch"
            )
        lines.append(f"usage: {self.out_dir / README_FILE}")
        return "\n".join(lines)


def read_build_catalogue(build_dir: Path) -> Catalogue:
    path = Path(build_dir) / CATALOGUE_FILE
    if not path.is_file():
        raise ExportError(
            f"no kernel catalogue at {path}: build kernels first (`cutegen build -o {build_dir}`) "
            "or pass --build-dir",
            usage=True,
        )
    try:
        return Catalogue.from_json(path.read_text())
    except (ManifestError, OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"{path} cannot be used: {exc}", usage=True) from None


def load_built_kernel(build_dir: Path, manifest_rel: str) -> tuple[KernelManifest, Path, bytes]:
    """The manifest, kernel folder and verified cubin bytes of one catalogue entry."""
    mpath = Path(build_dir) / manifest_rel
    try:
        manifest = KernelManifest.from_json(mpath.read_text())
    except OSError as exc:
        raise ExportError(f"{mpath}: cannot read the manifest: {exc.strerror or exc}") from None
    except ManifestError as exc:
        raise ExportError(f"{mpath}: {exc}") from None
    kdir = mpath.parent
    cubin_path = kdir / manifest.cubin
    try:
        cubin = cubin_path.read_bytes()
    except OSError as exc:
        raise ExportError(f"{cubin_path}: cannot read the cubin: {exc.strerror or exc}") from None
    digest = hashlib.sha256(cubin).hexdigest()
    if digest != manifest.sha256:
        raise ExportError(
            f"{cubin_path}: sha256 {digest[:16]}... differs from the manifest's "
            f"{manifest.sha256[:16]}...; rebuild the kernel (`cutegen build {manifest.name} --force`)"
        )
    return manifest, kdir, cubin


def export_kernels(
    build_dir: str | os.PathLike[str], names: Sequence[str], out_dir: str | os.PathLike[str]
) -> ExportReport:
    """Export the built kernels ``names`` of ``build_dir`` into ``out_dir`` (replaced atomically).

    ``out_dir`` must not exist, or be empty, or be an earlier export (which is then replaced as a
    whole); any other existing folder is refused, never overwritten.
    """
    build_dir = Path(build_dir)
    out_dir = Path(out_dir)
    if not names:
        raise ExportError("nothing to export: no kernel names given", usage=True)
    cat = read_build_catalogue(build_dir)
    by_name = {e.name: e for e in cat.kernels}
    views: list[KernelView] = []
    sources: list[tuple[KernelManifest, Path]] = []
    for name in names:
        entry = by_name.get(name)
        if entry is None:
            raise ExportError(f"kernel {name!r} is not in {build_dir / CATALOGUE_FILE}", usage=True)
        manifest, kdir, cubin = load_built_kernel(build_dir, entry.manifest)
        views.append(kernel_view(manifest, len(cubin)))
        sources.append((manifest, kdir))
    resolved_out = out_dir.resolve()
    if resolved_out == build_dir.resolve() or resolved_out in build_dir.resolve().parents:
        raise ExportError(
            f"the export folder {out_dir} must not be the build folder or contain it", usage=True
        )
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ExportError(f"{out_dir} exists and is not a folder", usage=True)
        if any(out_dir.iterdir()) and not (out_dir / EXPORT_MARKER).is_file():
            raise ExportError(
                f"{out_dir} exists, is not empty and is not a cutegen export (no {EXPORT_MARKER}); "
                "choose another folder or remove it",
                usage=True,
            )
    files = render_files(views, title=", ".join(sorted({v.manifest.op for v in views})))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for manifest, kdir in sources:
            dest = tmp / manifest.name
            dest.mkdir()
            for fname in KERNEL_FILES:
                src = kdir / (manifest.cubin if fname == "kernel.cubin" else fname)
                if not src.is_file():
                    raise ExportError(f"{src} is missing; rebuild the kernel")
                shutil.copy2(src, dest / fname)
            for fname in OPTIONAL_KERNEL_FILES:
                if (kdir / fname).is_file():
                    shutil.copy2(kdir / fname, dest / fname)
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        from cutegen.gen.build import write_catalogue  # imports no CuTe DSL

        write_catalogue(tmp)
        (tmp / EXPORT_MARKER).write_text(
            json.dumps({"cutegen": CUTEGEN_VERSION, "kernels": [v.name for v in views]}, indent=2) + "\n"
        )
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old.{os.getpid()}"
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    written = sorted(
        str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file() and p.name != EXPORT_MARKER
    )
    skipped = [(g.op, [k.name for k in g.others]) for g in op_groups(views) if g.others]
    return ExportReport(out_dir=out_dir, kernels=[v.name for v in views], files=written, skipped_dispatch=skipped)


__all__ = [
    "ExportError",
    "ExportReport",
    "KernelView",
    "c_expr",
    "c_sources",
    "export_kernels",
    "kernel_view",
    "load_built_kernel",
    "read_build_catalogue",
    "render_files",
]
