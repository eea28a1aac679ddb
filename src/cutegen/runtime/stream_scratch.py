"""Where kernels' self-resetting scratch (tile counters, split-K workspaces) comes from: one buffer
per device and stream, or a fresh one for each launch captured in a CUDA graph.

A kernel that leaves its counters as it found them (zero) can share one buffer among all launches
on a stream, since those never overlap. A launch captured in a graph cannot use that buffer:
graphs captured on one stream may be replayed at the same time on different streams. So it gets
a buffer of its own, allocated during capture from the graph's memory pool (zeroed by a memset the
graph replays before the kernel), which lives as long as the graph.
"""

from __future__ import annotations

import torch


def capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (a launch now needs its own scratch)."""
    return torch.cuda.is_current_stream_capturing()


def stream_key(device: torch.device, stream: int) -> tuple[int, int]:
    """The (device index, stream handle) a per-stream buffer is kept under."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(index), int(stream)


__all__ = ["capturing", "stream_key"]
