"""`cutegen tune`: time every built kernel of an op on this GPU for given shapes and write the tuning
table (``{op: {"M,N,K": kernel}}``) that the runtime prefers over its analytic heuristic.

Optional: the heuristic needs no tuning. Entries for other ops and shapes already in the table are
kept; each timed shape gets the fastest kernel that also produced a correct result (checked against
the first candidate's output, so a broken kernel never wins). Split-K kernels are timed at each of
`TUNED_SPLITS` (normalised for K; a table entry "NAME@SPLITS" fixes the count).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from cutegen.bench.timing import time_cuda
from cutegen.runtime.params import SCALE_BLOCK, ceil_div

TUNABLE_OPS = ("bf16_gemm_nt", "fp8_gemm_nt", "fp8_wgrad_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous")
# A k-grouped shape M,N,K is timed as this many groups of K tokens each unless told otherwise
# (the runtime's kernel choice sees the groups' rows stacked: G·M x N x K).
K_GROUPED_TUNE_GROUPS = 4
# Split counts a split-K kernel is timed at (each normalised so that no split is empty).
TUNED_SPLITS = (2, 3, 4, 6, 8, 12)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """"M,N,K;M,N,K;..." → shapes; ValueError naming the bad item."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        try:
            m, n, k = (int(x) for x in item.split(","))
        except ValueError:
            raise ValueError(f"shape {item!r} is not M,N,K (three integers)") from None
        if min(m, n, k) <= 0:
            raise ValueError(f"shape {item!r} must have positive extents")
        shapes.append((m, n, k))
    if not shapes:
        raise ValueError("no shapes given (expected e.g. '4096,7168,16384;64,2112,7168')")
    return shapes


# The kernels a tuning run times: those serving the call `_runner` makes (bf16_gemm_nt: a bf16 D
# stored, K-major operands; its other kernels serve other calls).
TUNED_CALL: dict[str, dict] = {"bf16_gemm_nt": {"d_dtype": "bf16", "adds": False, "layout": "nt"}}


def _runner(
    op: str, m: int, n: int, k: int, groups: int = K_GROUPED_TUNE_GROUPS
) -> tuple[Callable[[str], object], Callable[[], object], Callable[[], object]]:
    """(run(kernel), output(), reset()) for one problem of `op` (inputs are created once); reset
    puts an accumulating output (weight gradients, D += ...) back to zero before the comparison run.
    run takes "NAME" or, for a split-K kernel, "NAME@SPLITS"."""
    import torch

    from cutegen.runtime import fp8_ops, heuristics, k_grouped_ops, ops

    def nothing() -> None:
        return None

    if op == "bf16_gemm_nt":
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def run_bf16(entry: str):
            name, splits = heuristics.parse_tuned(entry)
            return ops.bf16_gemm_nt(a, b, out=out, kernel=name, k_splits=splits)

        return run_bf16, (lambda: out), nothing
    if op == "fp8_gemm_nt":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sfa = fp8_ops.to_mn_major_tma_aligned(torch.rand(m, ceil_div(k, SCALE_BLOCK), device="cuda") + 0.5)
        sfb = torch.rand(ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK), device="cuda") + 0.5
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def run(entry: str):
            name, splits = heuristics.parse_tuned(entry)
            return fp8_ops.fp8_gemm_nt(a, sfa, b, sfb, out=out, kernel=name, k_splits=splits)

        return run, (lambda: out), nothing
    if op == "fp8_wgrad_gemm_nt":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sfa = fp8_ops.to_mn_major_tma_aligned(torch.rand(m, k // 128, device="cuda") + 0.5)
        sfb = fp8_ops.to_mn_major_tma_aligned(torch.rand(n, k // 128, device="cuda") + 0.5)
        d = torch.zeros(m, n, device="cuda")
        return (lambda name: fp8_ops.fp8_wgrad_gemm_nt(a, sfa, b, sfb, d, kernel=name)), (lambda: d), d.zero_
    if op == "k_grouped_fp8_gemm_nt_contiguous":
        blocks = groups * -(-k // 128)
        a = torch.randn(128 * m * blocks, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(128 * n * blocks, device="cuda").to(torch.float8_e4m3fn)
        sfa = torch.rand(blocks, m, device="cuda") + 0.5
        sfb = torch.rand(blocks, n, device="cuda") + 0.5
        d = torch.zeros(groups, m, n, device="cuda")
        sizes = torch.full((groups,), k, dtype=torch.int32, device="cuda")
        return (
            (lambda name: k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, sizes, kernel=name)),
            (lambda: d),
            d.zero_,
        )
    raise ValueError(f"op {op!r} cannot be tuned; tunable ops: {', '.join(TUNABLE_OPS)}")


def merge_table(path: Path, op: str, choices: dict[str, str]) -> dict:
    """Read the table at `path` (if any), set op's entries from `choices`, write it atomically."""
    table: dict = {}
    if path.is_file():
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            raise ValueError(f"{path} is not a tuning table (a JSON object)")
    table.setdefault(op, {}).update(choices)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning.")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return table


def tune(
    op: str,
    shapes: list[tuple[int, int, int]],
    out: Path,
    progress: Callable[[str], None] = print,
    timings_out: Path | None = None,
    groups: int = K_GROUPED_TUNE_GROUPS,
) -> dict:
    import torch

    from cutegen.runtime import heuristics, ops

    if op not in TUNABLE_OPS:
        raise ValueError(f"op {op!r} cannot be tuned; tunable ops: {', '.join(TUNABLE_OPS)}")
    names = ops.runnable_kernels(op, **TUNED_CALL.get(op, {}))
    if not names:
        raise ValueError(f"no {op} kernel of the catalogue at {ops.catalogue().build_dir} runs on this GPU")
    choices: dict[str, str] = {}
    every: dict[str, dict[str, float]] = {}
    every_split: dict[str, dict[str, float]] = {}
    split_names = {name for name in names if heuristics.splits_k(ops.catalogue().manifest(name))}
    for m, n, k in shapes:
        run, output, reset = _runner(op, m, n, k, groups)
        reference = None
        timings = []
        entries = []
        for name in names:
            if name in split_names:
                counts = sorted({heuristics.normalize_splits(k, s) for s in TUNED_SPLITS} - {1})
                entries += [f"{name}@{s}" for s in counts]
            else:
                entries.append(name)
        for name in entries:
            reset()
            run(name)
            torch.cuda.synchronize()
            result = output().float()
            if reference is None:
                reference = result.clone()
            elif not torch.allclose(result, reference, rtol=2e-2, atol=2e-2 * float(reference.abs().max() + 1e-6)):
                progress(f"{m},{n},{k}: {name} disagrees with {entries[0]}; not considered")
                continue
            timings.append((time_cuda(lambda: run(name), warmup=3, reps=10), name))
        best_us, best = min(timings)
        # The key the runtime looks the choice up by (k-grouped: the groups' rows stacked).
        rows = m * groups if op == "k_grouped_fp8_gemm_nt_contiguous" else m
        choices[heuristics.shape_key(rows, n, k)] = best
        every[heuristics.shape_key(m, n, k)] = {name: round(us, 2) for us, name in timings if "@" not in name}
        every_split[heuristics.shape_key(m, n, k)] = {name: round(us, 2) for us, name in timings if "@" in name}
        progress(f"{m},{n},{k}: {best} ({best_us:.1f} µs; {len(timings)} kernels and split counts timed)")
    if timings_out is not None:
        # Every kernel's time per shape (µs), for calibrating the analytic heuristic; split-K
        # kernels as NAME@SPLITS under "<op>_split_k".
        written = {op: every}
        if split_names:
            written[f"{op}_split_k"] = every_split
        timings_out.write_text(json.dumps(written, indent=2, sort_keys=True))
    return merge_table(out, op, choices)
