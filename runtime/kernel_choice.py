"""Which kernel runs a call: the process-wide catalogue, the heuristic's choice (cached) and kernels forced by name.

Torch is not imported here. The catalogue is read once per process from ``$CUTEGEN_BUILD_DIR``,
``./build`` or the installed runtime wheel's prebuilt kernels
(`cutegen.runtime.catalogue.resolve_build_dir`); `set_build_dir` changes it and forgets every
remembered call (`call_cache.forget_all`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from . import driver, heuristics, sm_budget
from .call_cache import forget_all
from .catalogue import KernelCatalogue, load_catalogue
from .errors import ArtifactError, InputError

_CHOICE_CACHE_SIZE = 4096

_lock = threading.RLock()
_catalogue: KernelCatalogue | None = None
_build_dir: str | os.PathLike[str] | None = None
# (op, device, M, N, K, scale, B dtype, rows per group, SM budget) -> kernel name.
_choices: dict[tuple, str] = {}


def set_build_dir(build_dir: str | os.PathLike[str] | None) -> None:
    """Use kernels from ``build_dir`` from now on (None: `catalogue.resolve_build_dir`)."""
    global _catalogue, _build_dir
    with _lock:
        _build_dir = build_dir
        _catalogue = None
        _choices.clear()
        forget_all()


def catalogue() -> KernelCatalogue:
    """The process-wide catalogue, opened on first use."""
    global _catalogue
    cat = _catalogue
    if cat is None:
        with _lock:
            if _catalogue is None:
                _catalogue = load_catalogue(_build_dir)
            cat = _catalogue
    return cat


def candidates(op: str, ordinal: int, scale: str | None = None, b_dtype: str | None = None) -> list[Any]:
    """The catalogue's ``op`` kernels that run on GPU ``ordinal``; with ``scale`` ("f32",
    "ue8m0", "mx"), only those taking block scales in that format; with ``b_dtype`` ("e4m3",
    "e2m1"), only those whose B has that element type."""
    cat = catalogue()
    info = driver.device_info(ordinal)
    runnable = [m for m in cat.compatible(op, info.capability) if m.smem_bytes <= info.smem_optin]
    if not runnable:
        built = sorted({f"{e.arch}" for e in cat.entries(op)}) or ["none"]
        raise ArtifactError(
            f"{op}: no kernel in the catalogue at {cat.build_dir} runs on {info.arch} "
            f"({info.name}); kernels of this op are built for: {', '.join(built)}"
        )
    if scale is not None:
        formats = sorted({m.schedule.get("scale", "none") for m in runnable})
        runnable = [m for m in runnable if m.schedule.get("scale") == scale]
        if not runnable:
            raise ArtifactError(
                f"{op}: no kernel taking {scale} scales runs on {info.arch} ({info.name}); the "
                f"catalogue's kernels for this GPU take: {', '.join(formats)}"
            )
    if b_dtype is not None:
        types = sorted({m.schedule.get("b_dtype", "?") for m in runnable})
        runnable = [m for m in runnable if m.schedule.get("b_dtype") == b_dtype]
        if not runnable:
            raise ArtifactError(
                f"{op}: no kernel with {b_dtype} B{f' and {scale} scales' if scale else ''} runs on {info.arch} "
                f"({info.name}); the catalogue's kernels for this GPU take B in: {', '.join(types)}"
            )
    return runnable


def runnable_kernels(op: str, device: int = 0, scale: str | None = None, b_dtype: str | None = None) -> list[str]:
    """Names of the catalogue's ``op`` kernels that run on GPU ``device`` (its architecture and
    shared memory), optionally only those taking ``scale`` block scales; kernels built for other
    architectures, e.g. sm_100a on a Hopper GPU, are left out (and, with ``b_dtype``, those whose B
    has another element type). Empty when none run there."""
    try:
        return [m.name for m in candidates(op, device, scale, b_dtype)]
    except ArtifactError:
        return []


def choose_kernel(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None,
) -> str:
    """The name of the kernel the heuristic (or tuning table) picks for this problem and GPU
    (among those taking ``scale`` block scales, when given; ``rows_per_group``: M is that many
    rows per group, as the masked grouped GEMM's groups, see `heuristics.score`; ``b_dtype``: only
    kernels whose B has that element type)."""
    key = (op, int(device), int(m), int(n), int(k), scale, b_dtype, rows_per_group, sm_budget.budget())
    name = _choices.get(key)
    if name is None:
        info = driver.device_info(device)
        manifest = heuristics.choose(
            op, candidates(op, device, scale, b_dtype), m, n, k, sm_budget.usable_sms(info.sm_count),
            build_dir=catalogue().build_dir,
            rows_per_group=rows_per_group,
        )
        name = manifest.name
        if len(_choices) >= _CHOICE_CACHE_SIZE:
            _choices.clear()
        _choices[key] = name
    return name


def explain(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None,
) -> list[heuristics.Score]:
    """The heuristic's scored table for this problem on this GPU, best first: the candidates
    `choose_kernel` weighs, scored as it does, with the same ``scale``, ``rows_per_group`` and
    ``b_dtype``."""
    info = driver.device_info(device)
    return heuristics.explain(
        op, candidates(op, device, scale, b_dtype), m, n, k, sm_budget.usable_sms(info.sm_count),
        build_dir=catalogue().build_dir,
        rows_per_group=rows_per_group,
    )


def forced_manifest(op: str, forced: str, scale: str | None = None, b_dtype: str | None = None) -> Any:
    """The manifest of the kernel a caller forced by name; InputError unless it is an `op` kernel
    (taking ``scale`` block scales and ``b_dtype`` B, when given)."""
    cat = catalogue()
    if forced not in cat:
        known = ", ".join(cat.names(op)) or "none"
        raise InputError(
            f"{op}: argument 'kernel' must name a kernel of the catalogue at {cat.build_dir} "
            f"(known {op} kernels: {known}), got {forced!r}"
        )
    manifest = cat.manifest(forced)
    if manifest.op != op:
        raise InputError(f"{op}: argument 'kernel' names {forced!r}, a {manifest.op} kernel")
    if scale is not None and manifest.schedule.get("scale") != scale:
        raise InputError(
            f"{op}: argument 'kernel' names {forced!r}, which takes {manifest.schedule.get('scale')} "
            f"scales, but the scales passed are {scale}"
        )
    if b_dtype is not None and manifest.schedule.get("b_dtype") != b_dtype:
        raise InputError(
            f"{op}: argument 'kernel' names {forced!r}, whose B is {manifest.schedule.get('b_dtype')}, "
            f"but the B passed is {b_dtype}"
        )
    return manifest


def kernel_for(
    op: str, m: int, n: int, k: int, device: int, forced: str, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None,
) -> Any:
    name = (
        forced_manifest(op, forced, scale, b_dtype).name if forced
        else choose_kernel(op, m, n, k, device, scale, rows_per_group, b_dtype)
    )
    return catalogue().load(name, device)


__all__ = [
    "candidates",
    "catalogue",
    "choose_kernel",
    "explain",
    "forced_manifest",
    "kernel_for",
    "runnable_kernels",
    "set_build_dir",
]
