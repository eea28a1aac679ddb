"""DeepGEMM's benchmark helpers (``deep_gemm.testing``): event timing and per-kernel CUPTI timing.

`bench_kineto` times the GPU kernels one call launches by name, from torch's profiler (CUPTI),
as DeepGEMM's does: each of 30 calls after an 8 GB memset (the power-limited GPU recovers in it),
averaged. Names are matched as substrings of each kernel's name; a cutegen kernel's name is its
CuTe DSL entry, so it is also matched as ``<op>:<kernel name>`` (e.g. ``fp8_gemm_nt:cutegen_…``):
DeepGEMM's tests ask for ``"gemm_"`` or ``"bf16_gemm"``, which its own kernel names contain.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch

FLUSH_BYTES = int(8e9)


def bench(fn: Callable[[], object], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Seconds per call of ``fn``, by CUDA events around ``num_tests`` back-to-back calls."""
    torch.cuda.synchronize()
    torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda").zero_()  # flush the L2
    for _ in range(num_warmups):
        fn()
    if high_precision:  # a long kernel ahead hides the host's launch time
        x = torch.randn((8192, 8192), dtype=torch.float32, device="cuda")
        x @ x
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_tests):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / num_tests / 1e3


class empty_suppress:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


class suppress_stdout_stderr:
    """Silence file descriptors 1 and 2 (the profiler's C++ output included) inside the block."""

    def __enter__(self):
        self._null = open(os.devnull, "w")
        self._saved = [(fd, os.dup(fd)) for fd in (sys.stdout.fileno(), sys.stderr.fileno())]
        self._streams = (sys.stdout, sys.stderr)
        for fd, _ in self._saved:
            os.dup2(self._null.fileno(), fd)
        sys.stdout = sys.stderr = self._null
        return self

    def __exit__(self, *_):
        sys.stdout, sys.stderr = self._streams
        for fd, saved in self._saved:
            os.dup2(saved, fd)
            os.close(saved)
        self._null.close()
        return False


def _cutegen_labels() -> dict[str, str]:
    """CuTe DSL entry name -> ``<op>:<kernel name>`` for every kernel this process loaded."""
    from cutegen.runtime import ops

    return {k.manifest.entry: f"{k.manifest.op}:{k.manifest.name}" for k in ops.catalogue().loaded()}


def _kernel_events(profiler) -> list[tuple[str, float, int]]:
    """(label, total µs, count) per distinct CUDA kernel name in the profile."""
    labels = _cutegen_labels()
    rows = []
    for event in profiler.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = event.cuda_time_total
        if event.count == 0 or device_us <= 0:
            continue
        label = event.key
        if event.key in labels:
            label = f"{labels[event.key]} {event.key}"
        rows.append((label, float(device_us), int(event.count)))
    return rows


def bench_kineto(
    fn: Callable[[], object],
    kernel_names: str | tuple[str, ...],
    num_tests: int = 30,
    suppress_kineto_output: bool = False,
    trace_path: str | None = None,
    flush_l2: bool = True,
    with_multiple_kernels: bool = False,
    barrier: Callable[[], object] | None = None,
):
    """Mean seconds per call of the kernels named ``kernel_names`` (one name: a float; a tuple: a
    tuple), over ``num_tests`` profiled calls; 0 for a name no kernel matched. Unless
    ``with_multiple_kernels``, a name matching more than one distinct kernel is an error."""
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"bench_kineto: 'kernel_names' must be a str or a tuple of str, got {type(kernel_names).__name__}")
    is_tuple = isinstance(kernel_names, tuple)
    names = kernel_names if is_tuple else (kernel_names,)
    if int(os.environ.get("DG_USE_NVIDIA_TOOLS", 0)):  # profilers conflict with Nsight and the sanitizer
        return (1,) * len(names) if is_tuple else 1
    fn()  # first call outside the profile (loads the kernel)
    suppress = suppress_stdout_stderr if suppress_kineto_output else empty_suppress
    with suppress():
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], schedule=schedule)
        with profiler:
            for _ in range(2):
                for _ in range(num_tests):
                    if flush_l2:
                        torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda").zero_()
                    if barrier is not None:
                        torch.cuda._sleep(int(2e7))  # ~10 ms: hides the host's uneven launch times
                        barrier()
                    fn()
                torch.cuda.synchronize()
                profiler.step()
    if trace_path is not None:
        profiler.export_chrome_trace(trace_path)
    rows = _kernel_events(profiler)
    times = []
    for name in names:
        matched = [row for row in rows if name in row[0]]
        if not with_multiple_kernels and len(matched) > 1:
            raise AssertionError(f"bench_kineto: {name!r} matches {len(matched)} kernels: {[r[0] for r in matched]}")
        total_us = sum(us for _, us, _ in matched)
        count = sum(c for _, _, c in matched)
        times.append(total_us / count / 1e6 if count else 0)
    return tuple(times) if is_tuple else times[0]


__all__ = ["bench", "bench_kineto", "empty_suppress", "suppress_stdout_stderr"]
