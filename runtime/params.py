"""Parameter packing: from a manifest and the call's operands to the bytes the kernel receives.

Pure Python and numpy, so everything here is tested on a CPU. The driver-facing code (TMA encoding,
launch) lives in `tma.py` and `launch.py` and consumes what this module computes:

* `OperandInfo`: what the runtime knows about one tensor operand (address, extents, strides in
  elements, dtype name), whatever the caller's framework.
* `bind_operands`: checks the operands against the manifest's `OperandSpec`s (dtype, rank,
  contiguous mode, alignment) and binds the extent symbols (``M``, ``N``, ``K`` ...).
* `tma_args_from_binding`: the exact arguments of ``cuTensorMapEncodeTiled`` for a ``tma`` binding.
* `tensor_struct_layout` / `pack_tensor_struct`: the C struct of a ``tensor`` binding (a plain
  dynamic tensor passed by value: pointer, dynamic extents, dynamic strides).
* `pack_params`: the 64-byte aligned parameter blob, each `.param` at its manifest offset, and
  `kernel_param_pointers`, the ``void*[]`` that ``cuLaunchKernelEx`` takes as ``kernelParams``.
* `check_manifest`: the static consistency of a manifest's parameter layout and bindings, checked
  once when a kernel is loaded.

Expressions (``scalar`` bindings, ``shape`` values) are evaluated by a tiny evaluator over a
whitelisted Python syntax subset: integer and float literals, extent symbols, ``+ - * // %``,
unary minus, and the functions ``ceil_div(a, b)``, ``min`` and ``max``. Nothing is ever ``eval``'d.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .errors import InputError, KernelLoadError
from .manifest import KernelManifest, OperandSpec, Param

# Bytes per element of the dtype names used in manifests.
# Block-scaled ops: one fp32 scale per 128 elements along K (and per 128 rows of B, per block).
SCALE_BLOCK = 128

DTYPE_BITS: dict[str, int] = {
    "bf16": 16,
    "f16": 16,
    "f32": 32,
    "f64": 64,
    "tf32": 32,
    "e4m3": 8,
    "e5m2": 8,
    # FP4, two elements per byte (element 2i in the low nibble); extents and strides count elements.
    "e2m1": 4,
    "u8": 8,
    "i8": 8,
    "u16": 16,
    "i16": 16,
    "u32": 32,
    "i32": 32,
    "u64": 64,
    "i64": 64,
}
# Bytes per element of the whole-byte dtypes.
DTYPE_BYTES: dict[str, int] = {name: bits // 8 for name, bits in DTYPE_BITS.items() if bits >= 8}

# FP4 of an e2m1 operand that stays packed two per byte in shared memory too (16U4_ALIGN8B, what
# NVFP4's kind::mxf4nvf4 reads); a ``tma`` binding's "e2m1" unpacks it to a byte each (16U4_ALIGN16B).
TMA_FP4_PACKED = "e2m1_packed"
# The data type names a ``tma`` binding may use (every manifest dtype but i16, which
# cuTensorMapEncodeTiled has no type for, and packed FP4), with their element bits.
TMA_DTYPE_BITS: dict[str, int] = {
    **{name: bits for name, bits in DTYPE_BITS.items() if name != "i16"}, TMA_FP4_PACKED: 4,
}
# FP4 through TMA, either way: a 32-byte aligned base and row strides, and rows a whole number of
# 128 elements.
TMA_FP4_DTYPES = ("e2m1", TMA_FP4_PACKED)
TMA_FP4_ALIGN = 32
TMA_FP4_ROW_ELEMENTS = 128
TMA_SWIZZLE_BYTES: dict[str, int] = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
TMA_L2_PROMOTIONS = ("none", "64B", "128B", "256B")
TMA_OOB_FILLS = ("none", "nan_request_zero_fma")
TMA_INTERLEAVES = ("none", "16B", "32B")
TMA_DESCRIPTOR_BYTES = 128
TMA_DESCRIPTOR_ALIGN = 64
TMA_MAX_BOX = 256
TMA_MAX_RANK = 5
TMA_GLOBAL_ALIGN = 16
TMA_MAX_STRIDE_BYTES = 1 << 40
TMA_MAX_DIM = 1 << 32

# numpy formats of the ``scalar`` binding dtypes (little-endian, as the GPU reads them).
SCALAR_FORMATS: dict[str, str] = {
    "i32": "<i4",
    "u32": "<u4",
    "i64": "<i8",
    "u64": "<u8",
    "f32": "<f4",
    "f64": "<f8",
}
SHAPE_WIDTHS = (8, 16, 32, 64)
BLOB_ALIGN = 64


# ------------------------------------------------------------------------------------------------
# Operands


@dataclasses.dataclass(frozen=True)
class OperandInfo:
    """One tensor operand as the runtime sees it: framework-neutral, hashable (a cache key).

    ``strides`` are in elements, like torch's ``Tensor.stride()``.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.strides):
            raise InputError(
                f"operand record has {len(self.shape)} extents but {len(self.strides)} strides"
            )

    @property
    def elem_bits(self) -> int:
        try:
            return DTYPE_BITS[self.dtype]
        except KeyError:
            raise InputError(
                f"unknown dtype {self.dtype!r}; expected one of {sorted(DTYPE_BITS)}"
            ) from None


def normalize_operand(kernel: str, spec: OperandSpec, info: OperandInfo) -> OperandInfo:
    """Check ``info`` against ``spec`` and return it in the kernel's mode order.

    Checks dtype, rank, the unit stride of the contiguous mode and the alignment of the base
    address and of the other strides (``spec.align_bytes``); refuses a NULL address, negative
    strides, other strides than the packed ones for an operand the kernel reads as a packed
    array, and, for an operand the kernel writes, elements that share memory. A tensor with fewer modes than the
    spec gets trailing unit modes (e.g. a 2-D tensor for a kernel written for [M, K, L]). The
    stride of any mode of extent 1 does not address memory, so it is replaced by a canonical one
    (the operand's span, rounded up to 16 bytes) that satisfies TMA's stride rules.
    """
    where = f"kernel {kernel}: operand {spec.name!r}"
    if info.dtype != spec.dtype:
        raise InputError(f"{where} must have dtype {spec.dtype}, got {info.dtype}")
    rank = len(spec.shape)
    if len(info.shape) > rank:
        raise InputError(
            f"{where} must have rank {rank} (extents {spec.shape}), got shape {list(info.shape)}"
        )
    shape = list(info.shape)
    strides = list(info.strides)
    if any(e < 0 for e in shape):
        raise InputError(f"{where} has a negative extent: shape {list(info.shape)}")
    if any(s < 0 for e, s in zip(shape, strides) if e > 1):
        raise InputError(f"{where} has a negative stride: strides {list(info.strides)}")
    if info.ptr == 0 and 0 not in shape:
        raise InputError(f"{where} is at address 0 (NULL)")
    packed = packed_strides(shape) if spec.packed else None
    if packed and any(e > 1 and s != p for e, s, p in zip(shape, strides, packed)):
        raise InputError(
            f"{where} is read as a packed row-major array (strides {list(packed)} for shape "
            f"{list(info.shape)}), got strides {list(info.strides)}"
        )
    if spec.written and overlaps_itself(shape, strides):
        raise InputError(
            f"{where} is written by the kernel, so no two of its elements may share memory: shape "
            f"{list(info.shape)} strides {list(info.strides)} (a row stride under the row's width?)"
        )
    bits = info.elem_bits
    span = max([1] + [e * abs(s) for e, s in zip(shape, strides) if e > 0])
    gran = max(1, TMA_GLOBAL_ALIGN * 8 // bits)
    canonical = -(-span // gran) * gran
    while len(shape) < rank:
        shape.append(1)
        strides.append(canonical)
    for mode, extent in enumerate(shape):
        if extent == 1 and mode != spec.contiguous_mode:
            strides[mode] = canonical
    cm = spec.contiguous_mode  # -1: no unit-stride mode required
    if cm >= 0 and shape[cm] > 1 and strides[cm] != 1:
        raise InputError(
            f"{where} must be contiguous along mode {cm} ({spec.shape[cm]}): expected stride 1, "
            f"got strides {list(info.strides)}"
        )
    if cm >= 0 and shape[cm] == 1:
        strides[cm] = 1
    align = max(1, spec.align_bytes)
    if info.ptr % align:
        raise InputError(
            f"{where} base address must be {align}-byte aligned, got 0x{info.ptr:x} "
            f"(misaligned by {info.ptr % align} bytes)"
        )
    for mode, (extent, stride) in enumerate(zip(shape, strides)):
        if mode == cm or extent <= 1:
            continue
        if (stride * bits) % (align * 8):
            raise InputError(
                f"{where}: stride of mode {mode} ({spec.shape[mode]}) must be a multiple of "
                f"{align * 8 // bits} elements ({align} bytes), got {stride} elements "
                f"({stride * bits / 8:g} bytes)"
            )
    return OperandInfo(info.ptr, tuple(shape), tuple(strides), info.dtype)


def bind_operands(
    manifest: KernelManifest,
    operands: Mapping[str, OperandInfo],
    extents: Mapping[str, int] | None = None,
) -> tuple[dict[str, OperandInfo], dict[str, int]]:
    """Normalise every operand the manifest names and bind the extent symbols from them.

    ``extents`` may pre-bind symbols (or bind symbols no operand carries); an operand that
    disagrees with an already bound symbol is refused with both sources named.
    """
    bound: dict[str, int] = dict(extents or {})
    source: dict[str, str] = {k: "the given extents" for k in bound}
    normalized: dict[str, OperandInfo] = {}
    for spec in manifest.operands:
        if spec.name not in operands:
            raise InputError(
                f"kernel {manifest.name}: operand {spec.name!r} is missing; expected operands "
                f"{[o.name for o in manifest.operands]}, got {sorted(operands)}"
            )
        info = normalize_operand(manifest.name, spec, operands[spec.name])
        normalized[spec.name] = info
        for mode, (symbol, extent) in enumerate(zip(spec.shape, info.shape)):
            here = f"operand {spec.name!r} mode {mode}"
            static = _static_extent(symbol)
            if static is not None:
                if extent != static:
                    raise InputError(
                        f"kernel {manifest.name}: {here} must have extent {static}, got {extent}"
                    )
                continue
            if symbol in bound and bound[symbol] != extent:
                raise InputError(
                    f"kernel {manifest.name}: extent {symbol} is {extent} from {here} but "
                    f"{bound[symbol]} from {source[symbol]}"
                )
            bound.setdefault(symbol, extent)
            source.setdefault(symbol, here)
    unknown = set(operands) - set(normalized)
    if unknown:
        raise InputError(
            f"kernel {manifest.name}: unexpected operands {sorted(unknown)}; expected "
            f"{[o.name for o in manifest.operands]}"
        )
    return normalized, bound


def _static_extent(symbol: Any) -> int | None:
    if isinstance(symbol, int):
        return symbol
    if isinstance(symbol, str) and symbol.isdigit():
        return int(symbol)
    return None


# ------------------------------------------------------------------------------------------------
# Expressions


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


_FUNCTIONS: dict[str, Callable[..., Any]] = {"ceil_div": _ceil_div, "min": min, "max": max}
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


class Expr:
    """A parsed, validated integer expression over extent symbols (see the module docstring)."""

    def __init__(self, text: str | int | float) -> None:
        self.text = str(text)
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            self._node: ast.AST = ast.Constant(text)
        else:
            try:
                tree = ast.parse(str(text).strip(), mode="eval")
            except SyntaxError as exc:
                raise KernelLoadError(f"expression {text!r} is not valid: {exc.msg}") from None
            self._node = tree.body
        self.symbols: frozenset[str] = frozenset(self._check(self._node))

    def _check(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise KernelLoadError(f"expression {self.text!r}: literal {node.value!r} not allowed")
            return set()
        if isinstance(node, ast.Name):
            if node.id in _FUNCTIONS:
                raise KernelLoadError(f"expression {self.text!r}: {node.id} must be called")
            return {node.id}
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self._check(node.left) | self._check(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self._check(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            want = 2 if node.func.id == "ceil_div" else None
            if (want is not None and len(node.args) != want) or not node.args:
                raise KernelLoadError(
                    f"expression {self.text!r}: {node.func.id} takes "
                    f"{want if want else 'one or more'} arguments, got {len(node.args)}"
                )
            out: set[str] = set()
            for arg in node.args:
                out |= self._check(arg)
            return out
        raise KernelLoadError(
            f"expression {self.text!r}: {ast.dump(node)[:60]} is not allowed; use integers, "
            "extent symbols, + - * // %, unary minus, ceil_div(a, b), min, max"
        )

    def __call__(self, env: Mapping[str, int]) -> Any:
        return self._eval(self._node, env)

    def _eval(self, node: ast.AST, env: Mapping[str, int]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            try:
                return env[node.id]
            except KeyError:
                raise InputError(
                    f"expression {self.text!r} needs extent {node.id!r}, which was not given "
                    f"(known: {sorted(env)})"
                ) from None
        if isinstance(node, ast.BinOp):
            left = self._eval(node.left, env)
            right = self._eval(node.right, env)
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise InputError(
                    f"expression {self.text!r} divides by zero with {dict(env)}"
                ) from None
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, env)
            return -value if isinstance(node.op, ast.USub) else value
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        args = [self._eval(a, env) for a in node.args]
        try:
            return _FUNCTIONS[node.func.id](*args)
        except ZeroDivisionError:
            raise InputError(f"expression {self.text!r} divides by zero with {dict(env)}") from None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


@functools.lru_cache(maxsize=1024)
def compile_expr(text: str | int | float) -> Expr:
    """Parse and validate an expression once; cached by its text."""
    return Expr(text)


def evaluate(text: str | int | float, env: Mapping[str, int]) -> Any:
    return compile_expr(text)(env)


# ------------------------------------------------------------------------------------------------
# Manifest checks


def _param_error(manifest: KernelManifest, param: Param, what: str) -> KernelLoadError:
    return KernelLoadError(f"kernel {manifest.name}: param {param.index} {param.name!r}: {what}")


def check_manifest(manifest: KernelManifest) -> None:
    """Check that the parameter layout and bindings are self-consistent; raise KernelLoadError.

    Run once per kernel at load time (cheap), so that a malformed manifest fails with a message
    about the manifest rather than as a wrong launch.
    """
    operand_names = {o.name for o in manifest.operands}
    for spec in manifest.operands:
        if spec.dtype not in DTYPE_BITS:
            raise KernelLoadError(
                f"kernel {manifest.name}: operand {spec.name!r} has unknown dtype {spec.dtype!r}"
            )
        if not -1 <= spec.contiguous_mode < len(spec.shape):
            raise KernelLoadError(
                f"kernel {manifest.name}: operand {spec.name!r} contiguous_mode "
                f"{spec.contiguous_mode} is out of range for shape {spec.shape}"
            )
    end = 0
    for position, param in enumerate(manifest.params):
        if param.index != position:
            raise _param_error(manifest, param, f"expected index {position} (params in order)")
        if param.size < 0 or param.align < 1 or param.align & (param.align - 1):
            raise _param_error(manifest, param, f"bad size {param.size} / align {param.align}")
        if param.offset % param.align:
            raise _param_error(
                manifest, param, f"offset {param.offset} is not a multiple of align {param.align}"
            )
        if param.offset < end:
            raise _param_error(
                manifest, param, f"offset {param.offset} overlaps the previous param (ends at {end})"
            )
        end = param.offset + param.size
        binding = param.binding
        kind = binding["kind"]
        if kind in ("tma", "pointer", "tensor"):
            operand = binding.get("operand")
            if operand not in operand_names:
                raise _param_error(
                    manifest, param, f"binds unknown operand {operand!r} (have {sorted(operand_names)})"
                )
        if kind == "pointer" and param.size != 8:
            raise _param_error(manifest, param, f"a pointer is 8 bytes, manifest says {param.size}")
        elif kind == "scalar":
            dtype = binding.get("dtype")
            if dtype not in SCALAR_FORMATS:
                raise _param_error(
                    manifest, param, f"scalar dtype {dtype!r} is not one of {sorted(SCALAR_FORMATS)}"
                )
            if param.size != np.dtype(SCALAR_FORMATS[dtype]).itemsize:
                raise _param_error(manifest, param, f"size {param.size} does not fit dtype {dtype}")
            if "expr" not in binding:
                raise _param_error(manifest, param, "scalar binding has no 'expr'")
            compile_expr(binding["expr"])
            if "range" in binding and not (
                dtype.startswith("f") and len(binding["range"]) == 2
                and all(isinstance(v, (int, float)) for v in binding["range"])
            ):
                raise _param_error(manifest, param, f"'range' must be [low, high] of a float scalar, got {binding['range']!r}")
        elif kind == "shape":
            width = int(binding.get("width", 32))
            values = binding.get("values")
            if width not in SHAPE_WIDTHS or not isinstance(values, list):
                raise _param_error(
                    manifest, param, f"shape binding needs 'values' (a list) and width in {SHAPE_WIDTHS}"
                )
            if len(values) * width // 8 > param.size:
                raise _param_error(
                    manifest,
                    param,
                    f"{len(values)} values of {width} bits do not fit in {param.size} bytes",
                )
            for value in values:
                compile_expr(value)
        elif kind == "tensor":
            try:
                _, size, align = tensor_struct_layout(binding)
            except ValueError as exc:
                raise _param_error(manifest, param, str(exc)) from None
            if param.size != size or param.align % align:
                raise _param_error(
                    manifest,
                    param,
                    f"the tensor struct is {size} bytes aligned to {align}, the param is "
                    f"{param.size} bytes aligned to {param.align}",
                )
            rank = len(manifest.operand(binding["operand"]).shape)
            bad = [m for m in binding.get("strides", []) if not 0 <= int(m) < rank]
            if bad:
                raise _param_error(manifest, param, f"stride modes {bad} out of range for rank {rank}")
            for value in binding.get("shape", []):
                compile_expr(value)
        elif kind == "tma":
            if param.size != TMA_DESCRIPTOR_BYTES or param.offset % TMA_DESCRIPTOR_ALIGN:
                raise _param_error(
                    manifest,
                    param,
                    f"a CUtensorMap is {TMA_DESCRIPTOR_BYTES} bytes at a multiple of "
                    f"{TMA_DESCRIPTOR_ALIGN}, got size {param.size} at offset {param.offset}",
                )
            spec = manifest.operand(binding["operand"])
            try:
                check_tma_recipe(binding, len(spec.shape), DTYPE_BITS[spec.dtype])
            except ValueError as exc:
                raise _param_error(manifest, param, str(exc)) from None
    if manifest.grid.kind == "blocks":
        for expr in manifest.grid.blocks or []:
            compile_expr(expr)
    for requirement in manifest.requires:
        compile_expr(requirement.symbol)
        compile_expr(requirement.expr)


def check_requirements(manifest: KernelManifest, env: Mapping[str, Any]) -> None:
    """InputError naming the first of the manifest's ``requires`` that the launch symbols in
    ``env`` break (the kernel would read or write past an operand)."""
    for requirement in manifest.requires:
        value = evaluate(requirement.symbol, env)
        bound = evaluate(requirement.expr, env)
        if not (value == bound if requirement.relation == "==" else value >= bound):
            raise InputError(
                f"kernel {manifest.name}: extent {requirement.symbol} must be {requirement.relation} "
                f"{requirement.expr} = {bound}, got {value}"
            )


def check_tma_recipe(binding: Mapping[str, Any], operand_rank: int, operand_elem_bits: int) -> None:
    """Static checks of a ``tma`` binding; raises ValueError with what is wrong."""
    modes = list(binding.get("modes", []))
    box = list(binding.get("box", []))
    rank = len(modes)
    if not 1 <= rank <= TMA_MAX_RANK or sorted(modes) != list(range(operand_rank)):
        raise ValueError(
            f"modes {modes} must be a permutation of the operand's {operand_rank} modes (rank <= 5)"
        )
    if len(box) != rank or any(not 1 <= int(b) <= TMA_MAX_BOX for b in box):
        raise ValueError(f"box {box} must have {rank} entries in 1..{TMA_MAX_BOX}")
    dtype = binding.get("dtype")
    if dtype not in TMA_DTYPE_BITS:
        raise ValueError(f"TMA dtype {dtype!r} is not one of {sorted(TMA_DTYPE_BITS)}")
    bits = TMA_DTYPE_BITS[dtype]
    if bits != operand_elem_bits:
        raise ValueError(f"TMA dtype {dtype} has {bits}-bit elements, operand has {operand_elem_bits}")
    swizzle = binding.get("swizzle", "none")
    if swizzle not in TMA_SWIZZLE_BYTES:
        raise ValueError(f"swizzle {swizzle!r} is not one of {list(TMA_SWIZZLE_BYTES)}")
    if dtype in TMA_FP4_DTYPES and (swizzle not in ("none", "128B") or int(box[0]) % TMA_FP4_ROW_ELEMENTS):
        raise ValueError(f"FP4 is loaded in boxes of whole {TMA_FP4_ROW_ELEMENTS}-element rows with no "
                         f"swizzle or 128B, got box {box}, swizzle {swizzle}")
    # In shared memory: FP4 is unpacked to a byte per element, unless it stays packed.
    smem_bits = bits if dtype == TMA_FP4_PACKED else max(bits, 8)
    inner = int(box[0]) * smem_bits // 8
    if inner % 16:
        raise ValueError(f"inner box {box[0]} x {smem_bits} bits = {inner} B is not a multiple of 16 bytes")
    if TMA_SWIZZLE_BYTES[swizzle] and inner > TMA_SWIZZLE_BYTES[swizzle]:
        raise ValueError(f"inner box {inner} B exceeds the {swizzle} swizzle span")
    if binding.get("l2_promotion", "128B") not in TMA_L2_PROMOTIONS:
        raise ValueError(f"l2_promotion {binding.get('l2_promotion')!r} not in {TMA_L2_PROMOTIONS}")
    if binding.get("oob_fill", "none") not in TMA_OOB_FILLS:
        raise ValueError(f"oob_fill {binding.get('oob_fill')!r} not in {TMA_OOB_FILLS}")
    if binding.get("interleave", "none") not in TMA_INTERLEAVES:
        raise ValueError(f"interleave {binding.get('interleave')!r} not in {TMA_INTERLEAVES}")
    strides = binding.get("element_strides")
    if strides is not None and (len(strides) != rank or any(not 1 <= int(s) <= 8 for s in strides)):
        raise ValueError(f"element_strides {strides} must have {rank} entries in 1..8")


# ------------------------------------------------------------------------------------------------
# TMA arguments


@dataclasses.dataclass(frozen=True)
class TmaArgs:
    """The arguments of one ``cuTensorMapEncodeTiled`` call (hashable: the encoding cache key).

    Names are the manifest's (``dtype`` "bf16", ``swizzle`` "128B" ...); `tma.py` maps them to the
    driver's enums. ``global_strides`` are in bytes, for dims 1..rank-1.
    """

    dtype: str
    rank: int
    global_address: int
    global_dims: tuple[int, ...]
    global_strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: str = "none"
    swizzle: str = "none"
    l2_promotion: str = "128B"
    oob_fill: str = "none"


def tma_args_from_binding(
    binding: Mapping[str, Any],
    shape: tuple[int, ...] | list[int],
    strides: tuple[int, ...] | list[int],
    elem_bits: int,
    ptr: int,
    operand: str | None = None,
) -> TmaArgs:
    """Compute the ``cuTensorMapEncodeTiled`` arguments of a ``tma`` binding for one operand.

    ``shape`` and ``strides`` (in elements) are the operand's, in its own mode order; the binding's
    ``modes`` reorders them, contiguous mode first. ``box`` is passed as written in the manifest:
    it is the per-CTA box, already cut for multicast by the generator. Raises InputError naming the
    operand when the tensor cannot be described by TMA (misaligned address or stride, a
    non-contiguous first mode, an extent of 0 or above 2**32).
    """
    name = operand or binding.get("operand", "?")
    where = f"operand {name!r}"
    try:
        check_tma_recipe(binding, len(shape), elem_bits)
    except ValueError as exc:
        raise KernelLoadError(f"TMA binding of {where}: {exc}") from None
    modes = [int(m) for m in binding["modes"]]
    dims = tuple(int(shape[m]) for m in modes)
    fp4 = binding["dtype"] in TMA_FP4_DTYPES
    base_align, stride_align = (TMA_FP4_ALIGN, TMA_FP4_ALIGN) if fp4 else (TMA_GLOBAL_ALIGN, TMA_GLOBAL_ALIGN)
    if ptr % base_align:
        raise InputError(
            f"{where}: TMA needs a {base_align}-byte aligned base address, got 0x{ptr:x}"
        )
    if fp4 and dims[0] % TMA_FP4_ROW_ELEMENTS:
        raise InputError(
            f"{where}: FP4 rows must be a multiple of {TMA_FP4_ROW_ELEMENTS} elements for TMA, got {dims[0]}"
        )
    for mode, dim in zip(modes, dims):
        if not 1 <= dim <= TMA_MAX_DIM:
            raise InputError(f"{where}: extent of mode {mode} must be in 1..2**32 for TMA, got {dim}")
    if dims[0] > 1 and int(strides[modes[0]]) != 1:
        raise InputError(
            f"{where}: mode {modes[0]} must have unit stride for TMA, got strides {list(strides)}"
        )
    global_strides = []
    for mode in modes[1:]:
        stride_bits = int(strides[mode]) * elem_bits
        stride_bytes = stride_bits // 8
        if stride_bits <= 0 or stride_bits % (8 * stride_align) or stride_bytes >= TMA_MAX_STRIDE_BYTES:
            raise InputError(
                f"{where}: stride of mode {mode} must be a positive multiple of {stride_align} bytes below "
                f"2**40 for TMA, got {strides[mode]} elements ({stride_bits / 8:g} bytes)"
            )
        global_strides.append(stride_bytes)
    rank = len(modes)
    element_strides = tuple(int(s) for s in binding.get("element_strides", [1] * rank))
    return TmaArgs(
        dtype=str(binding["dtype"]),
        rank=rank,
        global_address=int(ptr),
        global_dims=dims,
        global_strides=tuple(global_strides),
        box=tuple(int(b) for b in binding["box"]),
        element_strides=element_strides,
        interleave=str(binding.get("interleave", "none")),
        swizzle=str(binding.get("swizzle", "none")),
        l2_promotion=str(binding.get("l2_promotion", "128B")),
        oob_fill=str(binding.get("oob_fill", "none")),
    )


# ------------------------------------------------------------------------------------------------
# Packing


@dataclasses.dataclass
class ParamBlob:
    """A packed parameter buffer: ``data`` (uint8, 64-byte aligned) and each param's offset.

    Keep the blob (and the pointer array made from it) alive for as long as a launch may read it:
    ``cuLaunchKernelEx`` copies the bytes at the call, so "until the call returns" suffices.
    """

    data: np.ndarray
    offsets: tuple[int, ...]

    @property
    def address(self) -> int:
        return int(self.data.ctypes.data)

    def tobytes(self) -> bytes:
        return self.data.tobytes()


def aligned_zeros(nbytes: int, align: int = BLOB_ALIGN) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` whose first byte is ``align``-byte aligned."""
    raw = np.zeros(max(nbytes, 1) + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes]


def _pack_int(value: Any, width: int, what: str) -> bytes:
    if isinstance(value, float):
        if not value.is_integer():
            raise InputError(f"{what} must be an integer, got {value}")
        value = int(value)
    value = int(value)
    if not -(1 << (width - 1)) <= value < (1 << width):
        raise InputError(f"{what} = {value} does not fit in {width} bits")
    return (value & ((1 << width) - 1)).to_bytes(width // 8, "little")


def _pack_scalar(value: Any, dtype: str, what: str) -> bytes:
    fmt = SCALAR_FORMATS[dtype]
    if dtype.startswith("f"):
        return np.array([value], dtype=fmt).tobytes()
    width = 8 * np.dtype(fmt).itemsize
    if isinstance(value, float):
        if not value.is_integer():
            raise InputError(f"{what} must be an integer, got {value}")
        value = int(value)
    value = int(value)
    low, high = (0, 1 << width) if dtype.startswith("u") else (-(1 << (width - 1)), 1 << (width - 1))
    if not low <= value < high:
        raise InputError(f"{what} = {value} does not fit in {dtype}")
    return (value & ((1 << width) - 1)).to_bytes(width // 8, "little")


def pack_params(
    manifest: KernelManifest,
    extents: Mapping[str, int],
    operands: Mapping[str, OperandInfo],
    tensor_maps: Mapping[str, bytes],
) -> ParamBlob:
    """Write every `.param` of ``manifest`` per its binding into a fresh, zeroed, aligned blob.

    ``extents`` binds the symbols of ``scalar`` and ``shape`` expressions; ``operands`` gives the
    pointers of ``pointer`` bindings; ``tensor_maps`` holds the 128 encoded bytes of each ``tma``
    param, keyed by the param's name.
    """
    data = aligned_zeros(manifest.param_bytes)
    for param in manifest.params:
        binding = param.binding
        kind = binding["kind"]
        what = f"kernel {manifest.name} param {param.name!r}"
        if kind == "zeros":
            continue
        if kind == "tma":
            blob = tensor_maps.get(param.name)
            if blob is None:
                raise InputError(f"{what}: no encoded tensor map given")
            if len(blob) != TMA_DESCRIPTOR_BYTES:
                raise InputError(f"{what}: a tensor map is 128 bytes, got {len(blob)}")
            payload = bytes(blob)
        elif kind == "pointer":
            operand = binding["operand"]
            if operand not in operands:
                raise InputError(f"{what}: operand {operand!r} was not given")
            payload = _pack_int(operands[operand].ptr, 64, f"{what} (address of {operand!r})")
        elif kind == "scalar":
            value = evaluate(binding["expr"], extents)
            if "range" in binding:
                low, high = binding["range"]
                if not low <= value <= high:  # NaN too
                    raise InputError(f"{what}: {binding['expr']} must be in [{low}, {high}], got {value!r}")
            payload = _pack_scalar(value, binding["dtype"], f"{what} ({binding['expr']})")
        elif kind == "shape":
            width = int(binding.get("width", 32))
            payload = b"".join(
                _pack_int(evaluate(v, extents), width, f"{what} value {v!r}") for v in binding["values"]
            )
        elif kind == "tensor":
            operand = binding["operand"]
            if operand not in operands:
                raise InputError(f"{what}: operand {operand!r} was not given")
            payload = pack_tensor_struct(binding, operands[operand], extents, what)
        else:  # pragma: no cover - Param.__post_init__ refuses other kinds
            raise KernelLoadError(f"{what}: unknown binding kind {kind!r}")
        if len(payload) > param.size:
            raise KernelLoadError(f"{what}: {len(payload)} bytes do not fit in {param.size}")
        data[param.offset : param.offset + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    return ParamBlob(data=data, offsets=tuple(p.offset for p in manifest.params))


def tensor_struct_layout(binding: Mapping[str, Any]) -> tuple[list[int], int, int]:
    """Byte offsets of the fields of a ``tensor`` binding's C struct, its size and alignment.

    Fields in order: the 64-bit data pointer, one integer per ``shape`` entry
    (``shape_widths``), one per ``strides`` entry (``stride_widths``), each at its natural
    alignment; the size is rounded up to the largest alignment (the pointer's 8). Raises
    ValueError for a malformed binding.
    """
    shape = list(binding.get("shape", []))
    strides = list(binding.get("strides", []))
    shape_widths = [int(w) for w in binding.get("shape_widths", [32] * len(shape))]
    stride_widths = [int(w) for w in binding.get("stride_widths", [64] * len(strides))]
    if len(shape_widths) != len(shape) or len(stride_widths) != len(strides):
        raise ValueError(
            f"tensor binding: {len(shape)} shape values with {len(shape_widths)} widths, "
            f"{len(strides)} strides with {len(stride_widths)} widths"
        )
    for width in shape_widths + stride_widths:
        if width not in (32, 64):
            raise ValueError(f"tensor binding: field width {width} is not 32 or 64")
    offsets = [0]
    end = 8
    for width in shape_widths + stride_widths:
        size = width // 8
        start = -(-end // size) * size
        offsets.append(start)
        end = start + size
    align = 8
    return offsets, -(-end // align) * align, align


def pack_tensor_struct(
    binding: Mapping[str, Any], info: OperandInfo, extents: Mapping[str, Any], what: str = "tensor"
) -> bytes:
    """The bytes of a ``tensor`` binding's C struct for operand ``info`` (see `tensor_struct_layout`).

    Shape values are the binding's expressions evaluated over ``extents``; stride values are the
    operand's strides (in elements) of the listed modes. Padding bytes are zero.
    """
    try:
        offsets, size, _ = tensor_struct_layout(binding)
    except ValueError as exc:
        raise KernelLoadError(f"{what}: {exc}") from None
    shape = list(binding.get("shape", []))
    strides = [int(m) for m in binding.get("strides", [])]
    shape_widths = [int(w) for w in binding.get("shape_widths", [32] * len(shape))]
    stride_widths = [int(w) for w in binding.get("stride_widths", [64] * len(strides))]
    out = bytearray(size)
    out[0:8] = _pack_int(info.ptr, 64, f"{what} (address)")
    fields = [
        (evaluate(v, extents), w, f"{what} extent {v!r}") for v, w in zip(shape, shape_widths)
    ] + [
        (info.strides[m], w, f"{what} stride of mode {m}") for m, w in zip(strides, stride_widths)
    ]
    for offset, (value, width, label) in zip(offsets[1:], fields):
        out[offset : offset + width // 8] = _pack_int(value, width, label)
    return bytes(out)


def kernel_param_pointers(blob: ParamBlob) -> ctypes.Array:
    """The ``void*[]`` for ``kernelParams``: one pointer per param, into ``blob`` at its offset.

    The array holds addresses, not references: keep ``blob`` alive while the array is used.
    """
    base = blob.address
    array_type = ctypes.c_void_p * max(len(blob.offsets), 1)
    return array_type(*[base + off for off in blob.offsets])


def byte_span(shape: Sequence[int], strides: Sequence[int], elem_bits: int) -> int:
    """Bytes from a tensor's first element to just past its last (0 when it has none)."""
    if any(int(size) == 0 for size in shape):
        return 0
    elements = 1 + sum((int(size) - 1) * int(stride) for size, stride in zip(shape, strides))
    return -(-elements * elem_bits // 8)


def overlaps_itself(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when two elements of a tensor of this layout may share memory: a mode of extent > 1
    with stride 0 (broadcast), or modes whose strides interleave (a row stride under the width)."""
    modes = sorted((abs(int(stride)), int(size)) for size, stride in zip(shape, strides) if int(size) > 1)
    reach = 0  # elements spanned by the modes with smaller strides
    for stride, size in modes:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def packed_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a packed row-major array of ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    """a rounded up to a multiple of b."""
    return ceil_div(a, b) * b


__all__ = [
    "DTYPE_BITS",
    "DTYPE_BYTES",
    "Expr",
    "OperandInfo",
    "ParamBlob",
    "TmaArgs",
    "align",
    "aligned_zeros",
    "bind_operands",
    "byte_span",
    "ceil_div",
    "check_manifest",
    "check_requirements",
    "check_tma_recipe",
    "compile_expr",
    "evaluate",
    "kernel_param_pointers",
    "normalize_operand",
    "overlaps_itself",
    "pack_params",
    "pack_tensor_struct",
    "packed_strides",
    "tensor_struct_layout",
    "tma_args_from_binding",
]
