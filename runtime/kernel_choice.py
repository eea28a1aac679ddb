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
from .manifest import adds_into_d

_CHOICE_CACHE_SIZE = 4096

_lock = threading.RLock()
_catalogue: KernelCatalogue | None = None
_build_dir: str | os.PathLike[str] | None = None
# (op, device, M, N, K, scale, B dtype, D dtype, adds, layout, rows per group, SM budget) -> kernel name.
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


def _filters(
    scale: str | None, b_dtype: str | None, d_dtype: str | None, adds: bool | None, layout: str | None = None,
) -> list[tuple]:
    """(what a kernel must take, how its schedule says what it takes, the value wanted) for each
    requested kernel property."""
    out = []
    if layout is not None:
        out.append(("layout", lambda s: s.get("layout", "nt"), layout))
    if scale is not None:
        out.append(("scales", lambda s: s.get("scale", "none"), scale))
    if b_dtype is not None:
        out.append(("B", lambda s: s.get("b_dtype", "?"), b_dtype))
    if d_dtype is not None:
        out.append(("D", lambda s: s.get("c_dtype", "?"), d_dtype))
    if adds is not None:
        out.append(("adding into D", adds_into_d, adds))
    return out


def _runnable(op: str, ordinal: int, filters: list[tuple]) -> list[Any]:
    """The manifests of the catalogue's ``op`` kernels that run on GPU ``ordinal`` and pass
    ``filters`` (`_filters`), which are applied to the catalogue's lines: only those kernels'
    manifests are read."""
    info = driver.device_info(ordinal)

    def wanted(schedule: dict) -> bool:
        return all(value_of(schedule) == value for _, value_of, value in filters)

    return [m for m in catalogue().compatible(op, info.capability, wanted) if m.smem_bytes <= info.smem_optin]


def candidates(
    op: str, ordinal: int, scale: str | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
) -> list[Any]:
    """The catalogue's ``op`` kernels that run on GPU ``ordinal``; with ``scale`` ("f32",
    "ue8m0", "mx"), only those taking block scales in that format; with ``b_dtype`` ("e4m3",
    "e2m1"), only those whose B has that element type; with ``d_dtype`` ("bf16", "f32"), only
    those writing D of that type; with ``adds``, only those that add their tiles into D (True)
    or store them (False); with ``layout`` ("nt", "nn", "tn", "tt"), only those reading A and B
    with that majorness."""
    filters = _filters(scale, b_dtype, d_dtype, adds, layout)
    runnable = _runnable(op, ordinal, filters)
    if runnable:
        return runnable
    # None: the errors below say what the catalogue has instead, from every manifest of the op.
    cat = catalogue()
    info = driver.device_info(ordinal)
    runnable = _runnable(op, ordinal, [])
    if not runnable:
        built = sorted({f"{e.arch}" for e in cat.entries(op)}) or ["none"]
        raise ArtifactError(
            f"{op}: no kernel in the catalogue at {cat.build_dir} runs on {info.arch} "
            f"({info.name}); kernels of this op are built for: {', '.join(built)}"
        )
    wanted = []
    for what, value_of, value in filters:
        found = sorted({str(value_of(m.schedule)) for m in runnable})
        runnable = [m for m in runnable if value_of(m.schedule) == value]
        wanted.append(f"{what} {value}")
        if not runnable:
            raise ArtifactError(
                f"{op}: no kernel with {', '.join(wanted)} runs on {info.arch} ({info.name}); the catalogue's "
                f"kernels for this GPU that remain have {what}: {', '.join(found)}"
            )
    return runnable


def runnable_kernels(
    op: str, device: int = 0, scale: str | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
) -> list[str]:
    """Names of the catalogue's ``op`` kernels that run on GPU ``device`` (its architecture and
    shared memory), optionally only those with the properties `candidates` filters on; kernels
    built for other architectures, e.g. sm_100a on a Hopper GPU, are left out. Empty when none
    run there."""
    try:
        return [m.name for m in _runnable(op, device, _filters(scale, b_dtype, d_dtype, adds, layout))]
    except ArtifactError:
        return []


def choose_kernel(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
    max_rows_per_group: int | None = None,
) -> str:
    """The name of the kernel the heuristic (or tuning table) picks for this problem and GPU
    among those with the properties `candidates` filters on (``scale``, ``b_dtype``, ``d_dtype``,
    ``adds``, when given); ``rows_per_group``: M is groups of about that many rows (at most
    ``max_rows_per_group``), as the masked grouped GEMM's groups, see `heuristics.score`."""
    key = (op, int(device), int(m), int(n), int(k), scale, b_dtype, d_dtype, adds, layout, rows_per_group,
           max_rows_per_group, sm_budget.budget())
    name = _choices.get(key)
    if name is None:
        info = driver.device_info(device)
        manifest = heuristics.choose(
            op, candidates(op, device, scale, b_dtype, d_dtype=d_dtype, adds=adds, layout=layout), m, n, k,
            sm_budget.usable_sms(info.sm_count),
            build_dir=catalogue().build_dir,
            rows_per_group=rows_per_group,
            max_rows_per_group=max_rows_per_group,
        )
        name = manifest.name
        if len(_choices) >= _CHOICE_CACHE_SIZE:
            _choices.clear()
        _choices[key] = name
    return name


def explain(
    op: str, m: int, n: int, k: int, device: int = 0, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
    max_rows_per_group: int | None = None,
) -> list[heuristics.Score]:
    """The heuristic's scored table for this problem on this GPU, best first: the candidates
    `choose_kernel` weighs, scored as it does, with the same arguments."""
    info = driver.device_info(device)
    return heuristics.explain(
        op, candidates(op, device, scale, b_dtype, d_dtype=d_dtype, adds=adds, layout=layout), m, n, k,
        sm_budget.usable_sms(info.sm_count),
        build_dir=catalogue().build_dir,
        rows_per_group=rows_per_group,
        max_rows_per_group=max_rows_per_group,
    )


def forced_manifest(
    op: str, forced: str, scale: str | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
) -> Any:
    """The manifest of the kernel a caller forced by name; InputError unless it is an `op` kernel
    with the properties asked for (`candidates`' filters, when given)."""
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
    if d_dtype is not None and manifest.schedule.get("c_dtype") != d_dtype:
        raise InputError(
            f"{op}: argument 'kernel' names {forced!r}, which writes a {manifest.schedule.get('c_dtype')} D, "
            f"but the D passed is {d_dtype}"
        )
    if layout is not None and manifest.schedule.get("layout", "nt") != layout:
        raise InputError(
            f"{op}: argument 'kernel' names {forced!r}, which reads layout {manifest.schedule.get('layout', 'nt')}, "
            f"but the operands passed are {layout}"
        )
    if adds is not None and adds_into_d(manifest.schedule) != adds:
        does = "adds its tiles into D" if not adds else "stores its tiles"
        wants = "C is given" if adds else "no C is given"
        raise InputError(f"{op}: argument 'kernel' names {forced!r}, which {does}, but {wants}")
    return manifest


def masked_rows_per_group(expected_m: int, max_m: int) -> int:
    """The rows per group the heuristic plans a masked call for: ``expected_m`` taken into
    [1, max_m] (the tile count itself is the GPU's, from masked_m)."""
    return max(1, min(int(expected_m), max_m))


def kernel_for(
    op: str, m: int, n: int, k: int, device: int, forced: str, scale: str | None = None,
    rows_per_group: int | None = None, b_dtype: str | None = None, *,
    d_dtype: str | None = None, adds: bool | None = None, layout: str | None = None,
    max_rows_per_group: int | None = None,
) -> Any:
    """The loaded kernel for a call: the one forced by name, or the heuristic's choice."""
    name = (
        forced_manifest(op, forced, scale, b_dtype, d_dtype=d_dtype, adds=adds, layout=layout).name if forced
        else choose_kernel(op, m, n, k, device, scale, rows_per_group, b_dtype, d_dtype=d_dtype, adds=adds,
                           layout=layout, max_rows_per_group=max_rows_per_group)
    )
    return catalogue().load(name, device)


__all__ = [
    "candidates",
    "catalogue",
    "choose_kernel",
    "explain",
    "forced_manifest",
    "kernel_for",
    "masked_rows_per_group",
    "runnable_kernels",
    "set_build_dir",
]
