"""Launching a loaded kernel: operands -> TMA descriptors -> parameter blob -> grid -> launch.

`launch` is the framework-neutral entry: operands are torch tensors (duck-typed, torch is not
imported) or ``(ptr, shape, strides, dtype)`` records or `OperandInfo`s, keyed by the manifest's
operand names. Everything derived from the operands (checks, TMA encodings, packed blob, pointer
array, grid, launch config) is prepared once per distinct (shapes, strides, dtypes, device,
extents, SM budget, calling thread) and cached on the kernel as a plan that does not depend on
the operands' addresses: a call with other addresses only writes them into the plan's blob (the
pointer params, the data field of tensor structs and the global address of each TMA descriptor,
its first 8 bytes, a layout checked against the driver's encoder once per process). Each thread
has plans of its own, so two threads never write one blob. The launch itself calls the driver's
``cuLaunchKernelEx`` through ctypes with the plan's prebuilt configuration (`raw_launch`), or
through cuda-bindings where that is unavailable or ``CUTEGEN_LAUNCHER=cuda-bindings`` asks for it.

Symbols available to manifest expressions: the operands' extents (``M``, ``N``, ``K`` ...), any
``extents`` passed in, and ``max_active_clusters``, ``sm_count``, ``cluster_tiles``, ``tiles_m``,
``tiles_n`` and ``num_clusters`` (the grid's persistent dimension); ``sm_count`` and
``max_active_clusters`` are within the SM budget of `sm_budget.set_num_sms`. Kernels with the ``blocks``
grid rule get their grid from its expressions over the same symbols; a dimension of 0 launches
nothing.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import threading
from typing import Any, Mapping, Sequence

from . import raw_launch, sm_budget
from .driver import LoadedKernel, check, cu, launch_config
from .errors import InputError, KernelLoadError
from .manifest import GridRule, KernelManifest
from .params import (
    TMA_GLOBAL_ALIGN,
    OperandInfo,
    bind_operands,
    ceil_div,
    check_requirements,
    evaluate,
    kernel_param_pointers,
    pack_params,
    tma_args_from_binding,
)
from .tma import encode_tiled

LAUNCH_CACHE_SIZE = 256

# torch dtype (by its str) -> manifest dtype name; torch itself is never imported here.
TORCH_DTYPES: dict[str, str] = {
    "torch.bfloat16": "bf16",
    "torch.float16": "f16",
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float8_e4m3fn": "e4m3",
    "torch.float8_e5m2": "e5m2",
    "torch.uint8": "u8",
    "torch.int8": "i8",
    "torch.int16": "i16",
    "torch.int32": "i32",
    "torch.int64": "i64",
}


def operand_info(value: Any, name: str = "?", device: int | None = None) -> OperandInfo:
    """An `OperandInfo` from a torch tensor, a ``(ptr, shape, strides, dtype)`` record, or itself.

    For a tensor, ``device`` (when given) is the CUDA device ordinal it must be on.
    """
    if isinstance(value, OperandInfo):
        return value
    if hasattr(value, "data_ptr") and hasattr(value, "stride"):
        if not getattr(value, "is_cuda", False):
            raise InputError(f"operand {name!r} must be a CUDA tensor, got one on {value.device}")
        if device is not None and value.device.index != device:
            raise InputError(
                f"operand {name!r} must be on cuda:{device} (the kernel's device), got {value.device}"
            )
        dtype = TORCH_DTYPES.get(str(value.dtype), str(value.dtype))
        return OperandInfo(int(value.data_ptr()), tuple(value.shape), tuple(value.stride()), dtype)
    if isinstance(value, (tuple, list)) and len(value) == 4:
        ptr, shape, strides, dtype = value
        return OperandInfo(int(ptr), tuple(int(s) for s in shape), tuple(int(s) for s in strides), str(dtype))
    raise InputError(
        f"operand {name!r} must be a tensor or a (ptr, shape, strides, dtype) record, "
        f"got {type(value).__name__}"
    )


def persistent_grid(
    rule: GridRule, m: int, n: int, max_active_clusters: int
) -> tuple[tuple[int, int, int], dict[str, int]]:
    """The ``persistent_clusters`` grid and the derived counts (see `GridRule`)."""
    tiles_m = ceil_div(m, rule.tile_m)
    tiles_n = ceil_div(n, rule.tile_n)
    cluster_tiles = ceil_div(tiles_m, rule.cluster_m) * ceil_div(tiles_n, rule.cluster_n)
    num_clusters = max(1, min(cluster_tiles, max(1, max_active_clusters)))
    grid = (rule.cluster_m, rule.cluster_n, num_clusters)
    derived = {
        "tiles_m": tiles_m,
        "tiles_n": tiles_n,
        "cluster_tiles": cluster_tiles,
        "num_clusters": num_clusters,
    }
    return grid, derived


def blocks_grid(rule: GridRule, env: Mapping[str, Any]) -> tuple[int, int, int]:
    """The ``blocks`` grid: its three expressions evaluated over ``env`` (see `GridRule`)."""
    exprs = list(rule.blocks or [])
    if len(exprs) != 3:
        raise KernelLoadError(f"grid rule 'blocks' needs three expressions, got {exprs!r}")
    x, y, z = (int(evaluate(e, env)) for e in exprs)
    return (x, y, z)


def compute_grid(
    manifest: KernelManifest, extents: Mapping[str, int], max_active_clusters: int
) -> tuple[tuple[int, int, int], dict[str, int]]:
    rule = manifest.grid
    if rule.kind == "blocks":
        env = dict(extents)
        env.setdefault("max_active_clusters", max_active_clusters)
        return blocks_grid(rule, env), {}
    if rule.kind != "persistent_clusters":  # pragma: no cover - GridRule refuses others
        raise KernelLoadError(f"kernel {manifest.name}: unsupported grid rule {rule.kind!r}")
    try:
        m = int(extents[rule.extent_m])
        n = int(extents[rule.extent_n])
    except KeyError as exc:
        raise InputError(
            f"kernel {manifest.name}: the grid needs extent {exc.args[0]!r}, not bound by the "
            f"operands or extents (bound: {sorted(extents)})"
        ) from None
    return persistent_grid(rule, m, n, max_active_clusters)


@dataclasses.dataclass
class PreparedLaunch:
    """Everything one distinct call needs; the blob and pointer array stay alive in here."""

    grid: tuple[int, int, int]
    skip: bool
    config: Any = None
    attrs: Any = None
    blob: Any = None
    pointers: Any = None
    params_address: int = 0
    env: dict[str, int] = dataclasses.field(default_factory=dict)
    # The operands whose addresses the blob holds, in this order everywhere below.
    operand_order: tuple[str, ...] = ()
    # Where each address lives in the blob: (index into operand_order, 8-byte word index,
    # alignment the address needs, operand name).
    sites: tuple[tuple[int, int, int, str], ...] = ()
    # The addresses the blob holds now, in operand_order; None when a relaunch wrote them.
    current: list[int] | None = dataclasses.field(default_factory=list)
    words: Any = None  # the blob's whole 8-byte words (a ctypes uint64 array over it)
    stream: int | None = None  # the stream config.hStream names
    raw: raw_launch.RawLaunch | None = None  # the ctypes launch, when the driver library is loaded


def address_sites(manifest: KernelManifest) -> tuple[tuple[str, int, int], ...]:
    """Every place a param holds an operand's address: a pointer param, the data pointer of a
    tensor struct, the global address of a TMA descriptor (all at the param's first 8 bytes)."""
    align = {spec.name: max(1, spec.align_bytes) for spec in manifest.operands}
    sites = []
    for param in manifest.params:
        kind = param.binding["kind"]
        if kind not in ("pointer", "tensor", "tma"):
            continue
        operand = param.binding["operand"]
        need = max(align.get(operand, 1), TMA_GLOBAL_ALIGN if kind == "tma" else 1)
        sites.append((operand, param.offset // 8, need))
    return tuple(sites)


_PATCHABLE: bool | None = None
_patch_lock = threading.Lock()


def tma_address_patchable() -> bool:
    """True when a TMA descriptor's global address is its first 8 bytes and nothing else in it
    depends on the address: two encodings at different addresses then differ only there. Checked
    once per process against ``cuTensorMapEncodeTiled``; if it fails, new addresses re-encode."""
    global _PATCHABLE
    if _PATCHABLE is None:
        with _patch_lock:
            if _PATCHABLE is None:
                _PATCHABLE = _check_tma_address_layout()
    return _PATCHABLE


def _check_tma_address_layout() -> bool:
    from .params import TmaArgs

    def encoded(address: int) -> bytes:
        return encode_tiled(TmaArgs(
            dtype="bf16", rank=2, global_address=address, global_dims=(4096, 512), global_strides=(8192,),
            box=(64, 128), element_strides=(1, 1), interleave="none", swizzle="128B", l2_promotion="128B",
            oob_fill="none",
        ))

    try:
        first, second = encoded(0x7F0000000000), encoded(0x7F0000123400)
    except Exception:  # noqa: BLE001 - no driver: the slow path stays correct
        return False
    patched = bytearray(first)
    patched[0:8] = (0x7F0000123400).to_bytes(8, "little")
    return bytes(patched) == second and first[0:8] == (0x7F0000000000).to_bytes(8, "little")


def prepare(
    kernel: LoadedKernel,
    operands: Mapping[str, OperandInfo],
    extents: Mapping[str, int] | None = None,
) -> PreparedLaunch:
    """Check the operands, bind extents, encode TMA maps, pack the params, compute the grid."""
    manifest = kernel.manifest
    normalized, bound = bind_operands(manifest, operands, extents)
    rule = manifest.grid
    if rule.kind == "persistent_clusters" and (
        int(bound.get(rule.extent_m, 1)) == 0 or int(bound.get(rule.extent_n, 1)) == 0
    ):
        return PreparedLaunch(grid=(0, 0, 0), skip=True, env=bound)
    env = dict(bound)
    env.setdefault("sm_count", sm_budget.usable_sms(kernel.device.sm_count))
    env.setdefault(
        "max_active_clusters", sm_budget.usable_clusters(kernel.max_active_clusters(), kernel.cluster_size)
    )
    grid, derived = compute_grid(manifest, env, int(env["max_active_clusters"]))
    if min(grid) <= 0:
        return PreparedLaunch(grid=grid, skip=True, env=env)
    check_requirements(manifest, env)
    for key, value in derived.items():
        env.setdefault(key, value)
    tensor_maps: dict[str, bytes] = {}
    for param in manifest.params:
        if param.binding["kind"] != "tma":
            continue
        operand = param.binding["operand"]
        info = normalized[operand]
        args = tma_args_from_binding(
            param.binding, info.shape, info.strides, info.elem_bits, info.ptr, operand
        )
        tensor_maps[param.name] = encode_tiled(args)
    blob = pack_params(manifest, env, normalized, tensor_maps)
    pointers = kernel_param_pointers(blob)
    config, attrs = launch_config(manifest, grid)
    params_address = ctypes.addressof(pointers) if manifest.params else 0
    order = tuple(normalized)
    index = {name: i for i, name in enumerate(order)}
    points = raw_launch.entry_points()
    return PreparedLaunch(
        grid=grid,
        skip=False,
        config=config,
        attrs=attrs,
        blob=blob,
        pointers=pointers,
        params_address=params_address,
        env=env,
        operand_order=order,
        sites=tuple((index[name], word, need, name) for name, word, need in address_sites(manifest)),
        current=[normalized[name].ptr for name in order],
        # Every address site is 8-byte aligned and ends within the blob, so it lies in its whole words.
        words=(ctypes.c_uint64 * (len(blob.data) // 8)).from_buffer(blob.data),
        raw=None if points is None else raw_launch.RawLaunch(points, config, kernel.function, params_address),
    )


def _operands_key(operands: Mapping[str, Any]) -> tuple[tuple, dict[str, int]]:
    """The plan-cache key of the operands and their addresses: a tensor's (name, shape, strides,
    dtype, device) read straight off it, any other record's `OperandInfo` without its address.
    Cheaper per call than building an `OperandInfo` per tensor; a plan exists only for operands
    that passed `operand_info`'s checks, and the device is part of the key, so a hit re-checks
    only the new addresses' alignment."""
    parts = []
    addresses = {}
    for name, value in operands.items():
        if hasattr(value, "data_ptr") and hasattr(value, "stride"):
            parts.append((name, value.shape, value.stride(), value.dtype, value.device))
            addresses[name] = value.data_ptr()
        else:
            info = operand_info(value, name)
            parts.append((name, info.shape, info.strides, info.dtype))
            addresses[name] = info.ptr
    return tuple(parts), addresses


def retarget(kernel: LoadedKernel, prepared: PreparedLaunch, pointers: list[int]) -> bool:
    """Write the operands' new addresses (``pointers``, in ``prepared.operand_order``) into the
    plan's blob; False when the plan cannot be patched (the TMA layout check failed), so the
    caller prepares afresh."""
    if pointers == prepared.current:
        return True
    if not _patch(kernel, prepared, prepared.sites, pointers):
        return False
    prepared.current = pointers
    return True


def _patch(kernel: LoadedKernel, prepared: PreparedLaunch, sites: Sequence[tuple[int, int, int, str]],
           pointers: Sequence[int]) -> bool:
    """Write ``pointers[i]`` at each site ``(i, word, need, operand)``; False when addresses cannot
    be patched. Leaves ``prepared.current`` unknown (None) until its caller states it."""
    if not (_PATCHABLE or tma_address_patchable()):
        return False
    prepared.current = None  # a refusal below may leave the blob half written
    words = prepared.words
    for i, word, need, operand in sites:
        ptr = pointers[i]
        if ptr % need:
            raise InputError(
                f"kernel {kernel.name}: operand {operand!r} base address must be {need}-byte aligned, got "
                f"0x{ptr:x} (misaligned by {ptr % need} bytes)"
            )
        words[word] = ptr
    return True


def _cache(kernel: LoadedKernel) -> "collections.OrderedDict[Any, PreparedLaunch]":
    cache = kernel.launch_cache
    if cache is None:
        cache = kernel.launch_cache = collections.OrderedDict()
    return cache


def launch(
    kernel: LoadedKernel,
    operands: Mapping[str, Any],
    extents: Mapping[str, int] | None = None,
    stream: int = 0,
) -> PreparedLaunch:
    """Launch ``kernel`` on ``stream`` (a ``CUstream`` handle as int; 0 is the legacy stream).

    Nothing is launched when the grid rule's M or N extent is 0. Returns the prepared launch
    (grid, packed params) for inspection.
    """
    shapes, addresses = _operands_key(operands)
    key = (
        shapes, tuple(sorted(extents.items())) if extents else (), sm_budget.budget(), threading.get_ident()
    )
    cache = _cache(kernel)
    prepared = cache.get(key)
    if prepared is not None and not prepared.skip and not retarget(
        kernel, prepared, [addresses[name] for name in prepared.operand_order]
    ):
        prepared = None
    if prepared is not None:
        try:
            cache.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile; the plan itself stays valid
            pass
    if prepared is None:
        ordinal = kernel.device.ordinal
        infos = {name: operand_info(value, name, ordinal) for name, value in operands.items()}
        prepared = prepare(kernel, infos, extents)
        cache[key] = prepared
        while len(cache) > LAUNCH_CACHE_SIZE:
            try:
                cache.popitem(last=False)
            except KeyError:  # another thread emptied it first
                break
    if prepared.skip:
        return prepared
    _issue(kernel, prepared, stream)
    return prepared


def relaunch(
    kernel: LoadedKernel, prepared: PreparedLaunch, sites: Sequence[tuple[int, int, int, str]], pointers: Sequence[int],
    stream: int,
) -> bool:
    """Launch an earlier call's plan again, each address site ``(i, word, need, operand)`` of
    ``sites`` (`PreparedLaunch.sites` by the caller's numbering) set to ``pointers[i]``; False,
    launching nothing, when the plan cannot be retargeted. Every site is written on every call,
    which costs less than comparing the addresses first."""
    if prepared.skip or not _patch(kernel, prepared, sites, pointers):
        return False
    _issue(kernel, prepared, stream)
    return True


def _issue(kernel: LoadedKernel, prepared: PreparedLaunch, stream: int) -> None:
    if prepared.stream != stream:
        prepared.config.hStream = cu.CUstream(int(stream))
        prepared.stream = stream
    raw = prepared.raw
    # Launched in whatever context is current: when it is not the kernel's (or there is none),
    # the driver refuses the launch, and the checked path below makes the kernel's current.
    if raw is not None and not raw.launch_kernel_ex(raw.config, raw.function, raw.params, None):
        return
    issue_through_bindings(kernel, prepared)


def issue_through_bindings(kernel: LoadedKernel, prepared: PreparedLaunch) -> None:
    """Launch through cuda-bindings, making the kernel's context current for the call if it is not."""
    current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    pushed = current is None or int(current) != int(kernel.context)
    if pushed:
        check(cu.cuCtxPushCurrent(kernel.context), "cuCtxPushCurrent")
    try:
        check(
            cu.cuLaunchKernelEx(prepared.config, kernel.function, prepared.params_address, 0),
            "cuLaunchKernelEx",
            detail=f"kernel {kernel.name}, grid {prepared.grid}",
        )
    finally:
        if pushed:
            cu.cuCtxPopCurrent()


__all__ = [
    "PreparedLaunch",
    "TORCH_DTYPES",
    "blocks_grid",
    "compute_grid",
    "launch",
    "operand_info",
    "persistent_grid",
    "prepare",
    "relaunch",
    "retarget",
]
