"""The global workspace of split-K GEMM kernels (fp8_gemm_nt, bf16_gemm_nt): per-tile arrival counters and fp32 partial tiles.

A split-K kernel (epilogue ``split_k_tma_store``) shares each CTA tile's 128-wide K blocks among
``K_SPLITS`` CTAs. Each writes its fp32 partial tile into ``split_partials`` and counts itself in
the tile's int32 slot of ``split_counters``; the CTA that brings the count to ``K_SPLITS`` adds the
partials in split order, stores the tile and sets the counter back to zero. So the counters must
be zero before a launch and are zero after it, and one workspace serves every launch on a stream
(two launches running at once on different streams need different workspaces). A launch captured
in a CUDA graph gets a workspace of its own from the graph's memory pool, zeroed by the graph
before every replay (`cutegen.runtime.stream_scratch`): graphs captured on one stream may be
replayed at the same time on different streams.

Sizes, over the cluster-padded tile grid (a cluster's CTAs past M or N take part too):
``TILES = align(⌈M/tile_m⌉, cluster_m) · align(⌈N/tile_n⌉, cluster_n)`` counters and
``PARTIALS = TILES · K_SPLITS · tile_m · tile_n`` floats. A kernel that splits the last wave only
(epilogue ``split_k_last_wave_tma_store``) needs one counter and one partial tile per CTA of its
grid: ``TILES >= clusters · cluster size`` and ``PARTIALS >= TILES · tile_m · tile_n`` (the
runtime sizes them for the most clusters the device holds). Integrators
launching the cubins themselves allocate these (counters zeroed once) and pass ``K_SPLITS`` with
them (the manifest's requirements state the sizes).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import heuristics, sm_budget, stream_scratch
from .kernel_choice import catalogue
from .errors import KernelLoadError
from .manifest import KernelManifest
from .params import ceil_div

_lock = threading.Lock()
# (device index, stream handle) -> (counters int32, partials fp32), grown on demand. A workspace
# that growth replaces is freed once nothing views it: torch's allocator hands its memory only to
# later work on the same stream, so kernels already queued with it are safe.
_workspaces: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
# (kernel, device, stream, M, N, K, requested splits) -> (operands, extents) of a launch: the
# heuristic's split count and the workspace views cost tens of µs of Python per call otherwise.
_launches: dict[tuple, tuple[dict[str, Any], dict[str, int]]] = {}
_LAUNCH_CACHE_SIZE = 1024
# What a split-K kernel takes beside the GEMM's operands.
WORKSPACE_OPERANDS = ("split_counters", "split_partials")


def workspace_extents(
    manifest: KernelManifest, m: int, n: int, k_splits: int, max_active_clusters: int
) -> tuple[int, int]:
    """(TILES, PARTIALS) a launch of ``manifest`` on an M x N output with ``k_splits`` needs, on
    a device (and SM budget) holding ``max_active_clusters`` of its clusters at once."""
    rule = manifest.grid
    if heuristics.splits_k_last_wave(manifest):
        # The split units fill at most one wave: one counter and one partial tile per CTA of the
        # largest grid (a masked launch's tile count is only known on the GPU).
        ctas = max(1, max_active_clusters) * rule.cluster_m * rule.cluster_n
        return ctas, ctas * rule.tile_m * rule.tile_n
    tiles_m = ceil_div(ceil_div(int(m), rule.tile_m), rule.cluster_m) * rule.cluster_m
    tiles_n = ceil_div(ceil_div(int(n), rule.tile_n), rule.cluster_n) * rule.cluster_n
    tiles = tiles_m * tiles_n
    return tiles, tiles * int(k_splits) * rule.tile_m * rule.tile_n


def workspace(device: torch.device, stream: int, tiles: int, partials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counters (zeroed once) and partials of at least the given sizes for launches on ``stream``
    of ``device``; while a CUDA graph is being captured, a fresh pair for that one launch."""

    def make(old: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.zeros(max(tiles, old[0].numel() if old is not None else 0), dtype=torch.int32, device=device),
            torch.empty(max(partials, old[1].numel() if old is not None else 0), dtype=torch.float32, device=device),
        )

    return stream_scratch.per_stream(
        _workspaces, _lock, device, stream, make, lambda have: have[0].numel() >= tiles and have[1].numel() >= partials
    )


def launch_arguments(
    loaded: Any, device: torch.device, stream: int, m: int, n: int, k: int, k_splits: int = 0,
    rows_per_group: int | None = None, max_rows_per_group: int | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """The workspace operands and the ``K_SPLITS`` extent of one launch of the split-K kernel
    ``loaded``: ``k_splits`` (< 1: the tuning table's count for this kernel and shape, else the
    heuristic's for this GPU, for masked groups of about ``rows_per_group`` rows, at most
    ``max_rows_per_group``, where given), normalised so that no split is empty."""
    # A launch being captured gets a workspace of its own, so it neither reads nor fills the cache.
    capturing = stream_scratch.capturing()
    key = (loaded.name, str(device), int(stream), int(m), int(n), int(k), int(k_splits), rows_per_group,
           max_rows_per_group, sm_budget.budget())
    cached = None if capturing else _launches.get(key)
    if cached is not None:
        return cached
    requested = k_splits
    if requested < 1:
        requested = heuristics.tuned_split_count(
            loaded.manifest.op, loaded.name, m, n, k, catalogue().build_dir
        ) or heuristics.split_k_count(
            loaded.manifest, m, n, k, sm_budget.usable_sms(loaded.device.sm_count),
            rows_per_group=rows_per_group, max_rows_per_group=max_rows_per_group,
        )
    splits = heuristics.normalize_splits(k, requested)
    clusters = sm_budget.usable_clusters(loaded.max_active_clusters(), loaded.cluster_size)
    tiles, partials = workspace_extents(loaded.manifest, m, n, splits, clusters)
    counters, partial_buffer = workspace(device, stream, tiles, partials)
    result = (
        dict(zip(WORKSPACE_OPERANDS, (counters[:tiles], partial_buffer[:partials]))),
        {"K_SPLITS": int(splits)},
    )
    if not capturing:
        with _lock:
            if len(_launches) >= _LAUNCH_CACHE_SIZE:
                _launches.clear()
            _launches[key] = result
    return result


def bind(
    loaded: Any, operands: dict[str, Any], device: torch.device, stream: int, m: int, n: int, k: int, k_splits: int,
    fail: Any, rows_per_group: int | None = None, max_rows_per_group: int | None = None,
) -> tuple[dict[str, Any] | None, dict[str, int] | None]:
    """A GEMM launch's split-K part: for a split-K kernel, its workspace added to ``operands`` and
    returned with the ``K_SPLITS`` extent (`launch_arguments`, masked groups as it says); for
    another, (None, None), and a requested ``k_splits`` > 1 refused through ``fail(arg, what)``
    (the op's `InputError`). A kernel whose manifest declares other operands than ``operands``
    (and the workspace, when it splits K) is a `KernelLoadError`."""
    split = heuristics.splits_k(loaded.manifest)
    declared = sorted(spec.name for spec in loaded.manifest.operands)
    if declared != sorted([*operands, *(WORKSPACE_OPERANDS if split else ())]):
        raise KernelLoadError(
            f"kernel {loaded.name}: a {loaded.manifest.op} kernel must declare operands {', '.join(operands)} "
            f"(and {', '.join(WORKSPACE_OPERANDS)} when it splits K); got {declared}"
        )
    if not split:
        if k_splits > 1:
            raise fail("k_splits", f"is {k_splits}, but kernel {loaded.name} does not split K (its epilogue is "
                                   "neither split_k_tma_store nor split_k_last_wave_tma_store)")
        return None, None
    workspace_operands, extents = launch_arguments(
        loaded, device, stream, m, n, k, k_splits, rows_per_group=rows_per_group, max_rows_per_group=max_rows_per_group
    )
    operands.update(workspace_operands)
    return workspace_operands, extents


__all__ = ["bind", "launch_arguments", "workspace", "workspace_extents"]
