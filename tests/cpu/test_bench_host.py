"""CPU tier: the host-cost benchmark's operand rotation, its table and its section of the report."""

from __future__ import annotations

import pytest

from cutegen.bench import host as bench_host, report

torch = pytest.importorskip("torch")


def test_distinct_views_share_the_layout_at_distinct_aligned_addresses():
    base = torch.empty_strided((5, 3), (1, 8), dtype=torch.float32)  # MN-major scales, TMA-aligned
    views = bench_host.distinct_views(base, 7, lambda pool: pool.fill_(1.0))
    assert len({v.data_ptr() for v in views}) == 7
    assert all(v.shape == base.shape and v.stride() == base.stride() and v.dtype == base.dtype for v in views)
    steps = {views[i + 1].data_ptr() - views[i].data_ptr() for i in range(6)}
    assert steps == {16}
    assert all(bool((v == 1.0).all()) for v in views)  # every view lies inside the filled pool


def test_operands_copy_group_metadata_and_shift_the_rest():
    ops = bench_host.Operands(3, a=torch.zeros(4, 16), sizes=torch.tensor([1, 2], dtype=torch.int32), c=None)
    assert ops[0]["c"] is None and ops[4]["a"].data_ptr() == ops[1]["a"].data_ptr()
    assert [int(s.sum()) for s in (ops[i]["sizes"] for i in range(3))] == [3, 3, 3]
    assert len({ops[i]["sizes"].data_ptr() for i in range(3)}) == 3


def _row(op, path, fixed, rotating, gpu, call="c", size="decode"):
    return {"op": op, "size": size, "shape": "M=1", "path": path, "call": call, "fixed_host_us": fixed,
            "fixed_gpu_us": gpu, "rotating_host_us": rotating, "rotating_gpu_us": gpu}


RESULT = {
    "rows": [
        _row("fp8_gemm_nt", "direct", 8.0, 9.5, 10.0),
        _row("fp8_gemm_nt", "torch.ops", 18.0, 21.0, 21.5),
        _row("fp8_gemm_nt", "anchor", 22.0, 23.0, 23.5, call="F.scaled_mm blockwise (cuBLAS)"),
        _row("per_token_quant_fp8", "direct", 11.0, 11.9, 4.0),
    ],
    "first_calls_ms": {"fp8_gemm_nt": {"first_ms": 15.2, "second_ms": 0.05}},
    "batch": 100, "batches": 10, "rotation": 1000,
}


def test_table_judges_each_row_by_its_slower_run():
    lines = bench_host.table_lines(RESULT)
    text = "\n".join(lines)
    assert "| fp8_gemm_nt | decode | M=1 | direct | `c` | 8.0 | 9.5 | 10.0 | host | ≤ 10: met |" in text
    assert "| torch.ops | `c` | 18.0 | 21.0 | 21.5 | host | ≤ 20: missed |" in text
    assert "| per_token_quant_fp8 | decode | M=1 | direct | `c` | 11.0 | 11.9 | 4.0 | host | ≤ 12: met |" in text
    assert "- fp8_gemm_nt: first 15.2 ms, second 0.05 ms" in text
    summary = bench_host.summary_line(RESULT)
    assert "8.0-9.5 µs per call direct, 18.0-21.0 µs through torch.ops (cuBLAS blockwise 22.0-23.0 µs)" in summary
    assert "2 of 3 calls within their targets" in summary


def test_report_renders_a_host_only_result(tmp_path):
    results = {"environment": {"gpu": "NVIDIA H200", "date": "2026-12-04"}, "host": RESULT}
    text, plan = report.render(results, tmp_path, "stem", report.Settings(plots=False))
    assert f"## {report.TITLES['host']}" in text
    assert "≤ 20: missed" in text and "Quantize rows" not in text and "L2 flushed" not in text
    assert "Entries of the results not rendered here" not in text
    assert bench_host.summary_line(RESULT) in text
