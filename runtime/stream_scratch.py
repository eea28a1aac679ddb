"""Where kernels' self-resetting scratch (tile counters, split-K workspaces) comes from: one buffer
per device and stream, or a fresh one for each launch captured in a CUDA graph.

A kernel that leaves its counters as it found them (zero) can share one buffer among all launches
on a stream, since those never overlap. A launch captured in a graph cannot use that buffer:
graphs captured on one stream may be replayed at the same time on different streams. So it gets
a buffer of its own, allocated during capture from the graph's memory pool (zeroed by a memset the
graph replays before the kernel), which lives as long as the graph.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (a launch now needs its own scratch)."""
    return torch.cuda.is_current_stream_capturing()


def stream_key(device: torch.device, stream: int) -> tuple[int, int]:
    """The (device index, stream handle) a per-stream buffer is kept under."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(index), int(stream)


def per_stream(
    cache: dict[tuple[int, int], T],
    lock: threading.Lock | threading.RLock,
    device: torch.device,
    stream: int,
    make: Callable[[T | None], T],
    fits: Callable[[T], bool] = lambda _: True,
) -> T:
    """The scratch of launches on ``stream`` of ``device``: ``cache``'s, or ``make(old)`` (old: the
    one that no longer `fits`, or None) stored there; while a CUDA graph is being captured,
    ``make(None)`` for that one launch, not cached."""
    if capturing():
        return make(None)
    key = stream_key(device, stream)
    have = cache.get(key)
    if have is not None and fits(have):
        return have
    with lock:
        have = cache.get(key)
        if have is None or not fits(have):
            have = cache[key] = make(have)
        return have


__all__ = ["capturing", "per_stream", "stream_key"]
