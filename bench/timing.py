"""How the benchmark times a call: the timer (CUPTI kernel durations or CUDA events), the conditions
between timed calls (`cutegen.bench.conditions`), and host time per call."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from cutegen.bench.conditions import CONDITIONS, Conditions


TIMERS = ("kernel", "event")
_timer = "kernel"
_conditions = CONDITIONS["cutegen"]


def set_conditions(name: str) -> None:
    """Time calls under the named `CONDITIONS`."""
    global _conditions
    if name not in CONDITIONS:
        raise ValueError(f"conditions must be one of {', '.join(CONDITIONS)}, got {name!r}")
    _conditions = CONDITIONS[name]


def conditions() -> Conditions:
    return _conditions


def set_timer(timer: str) -> None:
    """Time calls by their kernels' durations ("kernel") or by CUDA events around them ("event")."""
    global _timer
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    _timer = timer


def timer() -> str:
    return _timer


def time_cuda(fn: Callable[[], object], *, warmup: int = 5, reps: int = 20, flush_l2: bool = True) -> float:
    """GPU time of `fn` in microseconds, each call timed alone by the current timer under the current
    conditions (`set_conditions`: their flush, counts and summary; flush_l2=False: no flush)."""
    import torch

    c = _conditions
    warmup = c.warmup if c.warmup is not None else warmup
    reps = c.reps if c.reps is not None else reps
    # int32, as DeepGEMM's flush: its 8 GB are 2e9 elements, which torch zeroes in one kernel.
    flush = torch.empty(c.flush_bytes // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        if flush is not None and c.flush_warmup:
            flush.zero_()
        fn()
    torch.cuda.synchronize()
    if _timer == "kernel":
        times = _time_kernels(fn, flush, reps, c.spin_cycles)
    else:
        times = []
        for _ in range(reps):
            if flush is not None:
                flush.zero_()
            if c.spin_cycles:
                torch.cuda._sleep(c.spin_cycles)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
    del flush
    return statistics.fmean(times) if c.summary == "mean" else statistics.median(times)


def _time_kernels(fn: Callable[[], object], flush, reps: int, spin_cycles: int) -> list[float]:
    """The summed durations of each of `reps` calls' GPU activities (CUPTI).

    Each rep runs the flush (when given), two GPU spins (the first `spin_cycles` long), the call and
    a third spin; the call's activities are those between the second spin and the third, whatever
    the flush launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if flush is not None:
                flush.zero_()
            torch.cuda._sleep(max(spin_cycles, 1))
            torch.cuda._sleep(1)
            fn()
            torch.cuda._sleep(1)
        torch.cuda.synchronize()
    activities = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    return call_durations([(e.name, e.time_range.elapsed_us()) for e in activities], reps)


def call_durations(activities: list[tuple[str, float]], reps: int) -> list[float]:
    """Each timed call's summed activity durations, from the GPU activities (name, µs) of
    `_time_kernels`' profile in start order: per rep, the flush's activities (any number), three
    spins, and the call's activities between the second spin and the third."""
    calls: list[list[float]] = []
    spins = 0
    collecting = False
    for name, us in activities:
        if "spin_kernel" in name:
            spins += 1
            collecting = spins % 3 == 2
            if collecting:
                calls.append([])
        elif collecting:
            calls[-1].append(us)
    if len(calls) != reps or spins != 3 * reps:
        raise RuntimeError(
            f"kernel timer: found {len(calls)} timed calls ({spins} marker spins) in the profile, expected {reps}"
        )
    if not all(calls):
        raise RuntimeError("kernel timer: a timed call launched no GPU activity")
    return [sum(c) for c in calls]


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """Median µs of each callable over `rounds` rounds, the callables alternating within a round
    (the GPU's clocks drift: a comparison inside one round is on equal terms)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_cuda(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def host_overhead_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Wall time per call of `fn` on a problem small enough that the GPU is never the bottleneck."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def fresh_allocations() -> None:
    """Hand every unused block of torch's CUDA caching allocator back to the driver, so that the
    next shape's operands are fresh allocations. Called before each GEMM shape: the same kernel on
    same-sized operands ran up to 14% longer in blocks reused from the shapes timed before
    (NOTES N36), so a shape's time would depend on the shapes timed before it."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
