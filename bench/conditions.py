"""The conditions `cutegen bench` and `cutegen tune` time calls under (what runs before each timed
call, how many calls are timed and how they are summarised), in one place for the benchmark that
applies them, the CLI that offers them and the report that states them."""

from __future__ import annotations

import dataclasses

# GPU clock cycles the stream spins before each timed call (~100 µs at H200 clocks): longer than
# the host needs to enqueue one call, so the launch never lands inside the timed interval.
HOST_HIDING_SPIN_CYCLES = 200_000


@dataclasses.dataclass(frozen=True)
class Conditions:
    """What runs before each timed call, how many calls are timed and how they are summarised."""

    name: str
    # Bytes zeroed before every call (warm-up calls included when `flush_warmup`).
    flush_bytes: int
    # GPU cycles the stream spins between the flush and the call, hiding the host's launch work.
    spin_cycles: int
    flush_warmup: bool
    # None: the caller's numbers of warm-up and timed calls.
    warmup: int | None
    reps: int | None
    summary: str  # "median" or "mean"
    description: str


# DeepGEMM's bench_kineto: `torch.empty(int(8e9 // 4), dtype=torch.int).zero_()` before each call,
# one round of 30 calls untimed (the profiler's warm-up step), one of 30 timed, the kernels' mean.
DEEPGEMM_FLUSH_BYTES = 8_000_000_000
DEEPGEMM_CALLS = 30

CONDITIONS = {
    "cutegen": Conditions(
        "cutegen", 256 * 1024 * 1024, HOST_HIDING_SPIN_CYCLES, False, None, None, "median",
        "medians over calls run alone with the L2 flushed (a 256 MiB write) and a ~100 µs GPU spin before each",
    ),
    "deepgemm": Conditions(
        "deepgemm", DEEPGEMM_FLUSH_BYTES, 0, True, DEEPGEMM_CALLS, DEEPGEMM_CALLS, "mean",
        "means over 30 calls after 30 untimed ones, each call after an 8 GB memset, as DeepGEMM's own "
        "benchmark (bench_kineto) times: the memset flushes the L2 and gives the power-limited GPU ~2.5 ms "
        "to recover before the call",
    ),
}
