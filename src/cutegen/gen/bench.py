"""`cutegen bench`: time the built kernels on the GPU beside their anchors measured in the same run.

Needs torch with CUDA and a build folder; never the CuTe DSL. Method: fresh random inputs, warm-up,
then each timed call is bracketed by CUDA events with the L2 flushed (a 256 MiB write) before it;
the median is reported. Ratios within one run are what to compare: absolute times drift.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from typing import Callable

BF16_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (4096, 7168, 16384),
    (127, 4096, 7168),
    (1, 4096, 7168),
]


@dataclasses.dataclass
class BenchRow:
    op: str
    shape: tuple[int, int, int]
    kernel: str
    ours_us: float
    anchor: str
    anchor_us: float

    @property
    def flops(self) -> float:
        m, n, k = self.shape
        return 2.0 * m * n * k

    @property
    def ours_tflops(self) -> float:
        return self.flops / self.ours_us / 1e6

    @property
    def anchor_tflops(self) -> float:
        return self.flops / self.anchor_us / 1e6

    @property
    def ratio(self) -> float:
        return self.anchor_us / self.ours_us


def time_cuda(fn: Callable[[], object], *, warmup: int = 5, reps: int = 20, flush_l2: bool = True) -> float:
    """Median time of `fn` in microseconds, each call timed alone with CUDA events."""
    import torch

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


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


def bench_bf16_gemm(shapes=BF16_SHAPES) -> tuple[list[BenchRow], dict]:
    import torch

    from cutegen.runtime import ops

    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        kernel = ops.choose_kernel("bf16_gemm_nt", m, n, k)
        ours = time_cuda(lambda: ops.bf16_gemm_nt(a, b, out=out))
        ref = time_cuda(lambda: torch.matmul(a, b.t(), out=out))
        rows.append(BenchRow("bf16_gemm_nt", (m, n, k), kernel, ours, "torch.matmul", ref))
        del a, b, out
    small_a = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    small_b = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    small_out = torch.empty(128, 128, device="cuda", dtype=torch.bfloat16)
    overhead = {
        "cutegen.bf16_gemm_nt(out=)": host_overhead_us(lambda: ops.bf16_gemm_nt(small_a, small_b, out=small_out)),
        "cutegen.bf16_gemm_nt": host_overhead_us(lambda: ops.bf16_gemm_nt(small_a, small_b)),
        "torch.ops.cutegen.bf16_gemm_nt": host_overhead_us(lambda: torch.ops.cutegen.bf16_gemm_nt(small_a, small_b)),
        "torch.matmul": host_overhead_us(lambda: torch.matmul(small_a, small_b.t())),
    }
    return rows, overhead


def environment() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def render(rows: list[BenchRow], overhead: dict, env: dict) -> str:
    lines = [
        f"# bf16_gemm_nt on {env['gpu']} ({env['date']}; torch {env['torch']}, CUDA {env['cuda']})",
        "",
        "| M, N, K | kernel | cutegen µs | TFLOPS | torch.matmul µs | TFLOPS | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.shape[0]}, {r.shape[1]}, {r.shape[2]} | {r.kernel} | {r.ours_us:.1f} | "
            f"{r.ours_tflops:.0f} | {r.anchor_us:.1f} | {r.anchor_tflops:.0f} | {r.ratio:.3f} |"
        )
    lines += ["", "Host time per call (128x128x128, wall clock, GPU not the bottleneck):", ""]
    lines += [f"- {k}: {v:.1f} µs" for k, v in overhead.items()]
    return "\n".join(lines) + "\n"


def main(json_out: str | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("cutegen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    env = environment()
    rows, overhead = bench_bf16_gemm()
    print(render(rows, overhead, env))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(
                {
                    "environment": env,
                    "rows": [dataclasses.asdict(r) | {"ours_tflops": r.ours_tflops, "anchor_tflops": r.anchor_tflops, "ratio": r.ratio} for r in rows],
                    "host_overhead_us": overhead,
                },
                f,
                indent=2,
            )
    return 0
