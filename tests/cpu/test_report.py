"""`cutegen report`: bench results (synthetic, every op, n/a values, the legacy bf16 form) to a
Markdown report with PNG plots and LATEST.md. CPU only; matplotlib with the Agg backend."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from cutegen.bench import report
from cutegen.gen.cli import main

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "tests" / "data" / "2026-11-30-h200-bf16-gemm.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ENV = {
    "date": "2026-12-03 10:20:30 UTC",
    "gpu": "NVIDIA H200",
    "sms": 132,
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "python": "3.12.3",
    "driver": "580.159",
    "command": "cutegen bench --json-out results.json",
}
COPY_GBS = 4000.0


def _gemm_tflops(m: int, n: int, k: int, us: float) -> float:
    return 2.0 * m * n * k / us / 1e6


def bf16_row(shape, ours_us, anchor_us):
    m, n, k = shape
    row = {"op": "bf16_gemm_nt", "shape": list(shape), "kernel":
           "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
           "ours_us": ours_us, "anchor": "torch.matmul", "anchor_us": anchor_us,
           "ours_tflops": _gemm_tflops(m, n, k, ours_us), "anchor_tflops": _gemm_tflops(m, n, k, anchor_us),
           "ratio": anchor_us / ours_us}
    return row


def fp8_row(shape, ours_us, cublas_us, deepgemm, b_copy_us=None):
    m, n, k = shape
    return {
        "shape": list(shape),
        "kernel": "cutegen_sm90a_gemm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x1_mc0_s6_wg2_r40x232_epitma_rm_g8",
        "ours_us": ours_us,
        "ours_tflops": _gemm_tflops(m, n, k, ours_us),
        "cublas_us": cublas_us,
        "cublas_tflops": _gemm_tflops(m, n, k, cublas_us) if cublas_us else None,
        "deepgemm_tflops": deepgemm,
        "b_gbs": (n * k + n * (k // 128) * 4) / ours_us / 1e3,
        "b_copy_us": b_copy_us,
    }


def grouped_row(groups, rows, n, k, ours_us, loop_tflops, deepgemm):
    return {"groups": groups, "rows_per_group": rows, "n": n, "k": k, "ours_us": ours_us,
            "ours_tflops": _gemm_tflops(groups * rows, n, k, ours_us), "cublas_loop_tflops": loop_tflops,
            "deepgemm_tflops": deepgemm}


def quant_row(op, impl, us, nbytes, note="", kernel="", eager_us=None, copy_us=None):
    return {"op": op, "case": "x [24064, 7168] bf16", "impl": impl, "us": us, "bytes": nbytes,
            "gbs": nbytes / us / 1e3 if us else None, "note": note, "kernel": kernel,
            "speedup_vs_eager": eager_us / us if eager_us and us else None,
            "fraction_of_copy_bw": copy_us / us if copy_us and us else None}


def synthetic() -> dict:
    nb = 24064 * 7168 * 4
    return {
        "environment": dict(ENV),
        "bf16_gemm_nt": {
            "rows": [bf16_row((4096, 4096, 4096), 160.0, 176.0), bf16_row((1, 4096, 7168), 40.0, 20.0)],
            "host_overhead_us": {"cutegen.bf16_gemm_nt": 28.0, "torch.matmul": 19.0},
        },
        "fp8_gemm_nt": {
            "rows": [
                fp8_row((4096, 4096, 7168), 200.0, 250.0, 1436, 8.0),  # compute-bound
                fp8_row((64, 2112, 7168), 20.0, None, 180, 9.0),       # memory-bound; cuBLAS n/a
                fp8_row((128, 576, 7168), 10.0, 12.0, None, 4.0),      # DeepGEMM n/a
            ],
            "copy_gbs": COPY_GBS,
        },
        "m_grouped_fp8_gemm_nt_contiguous": [
            grouped_row(4, 8192, 4096, 7168, 1000.0, 1100.0, 1345),
            grouped_row(8, 4096, 7168, 2048, 500.0, None, 1240),
        ],
        "m_grouped_fp8_gemm_nt_masked": [grouped_row(2, 512, 4096, 7168, 100.0, 400.0, 686)],
        "fp8_wgrad_gemm_nt": [{"shape": [7168, 2112, 4096], "ours_us": 150.0,
                               "ours_tflops": _gemm_tflops(7168, 2112, 4096, 150.0), "deepgemm_tflops": 952}],
        "k_grouped_fp8_gemm_nt_contiguous": [{"shape": [4, 7168, 4096, 4096], "group_sizes": [4000, 4100, 3000, 5000],
                                              "ours_us": 1300.0, "deepgemm_tflops": 967}],
        "quantize": {
            "rows": [
                quant_row("per_token_quant_fp8", "copy (same bytes)", 100.0, nb, eager_us=400.0, copy_us=100.0),
                quant_row("per_token_quant_fp8", "cutegen (fp32, k-major)", 125.0, nb, kernel="cutegen_quant_k",
                          eager_us=400.0, copy_us=100.0),
                quant_row("per_token_quant_fp8", "eager torch (reference)", 400.0, nb, eager_us=400.0, copy_us=100.0),
                quant_row("per_token_quant_fp8", "torch.compile (reference)", None, nb,
                          note="RuntimeError: failed | to compile"),
            ],
            "copy_gbs": COPY_GBS,
            "seconds": 12.0,
        },
    }


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The report of the synthetic results, written once (plots included)."""
    out = tmp_path_factory.mktemp("perf")
    src = out / "results.json"
    src.write_text(json.dumps(synthetic()))
    assert main(["report", str(src), "-o", str(out)]) == 0
    md = out / "2026-12-03-nvidia-h200.md"
    return out, md.read_text()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def _table_lines(text: str, heading: str) -> list[str]:
    """The lines of the first Markdown table after `heading`."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def header_of(text: str, heading: str) -> list[str]:
    return _cells(_table_lines(text, heading)[0])


def table_rows(text: str, heading: str) -> list[list[str]]:
    return [_cells(ln) for ln in _table_lines(text, heading)[2:]]


def table(text: str, heading: str) -> list[dict[str, str]]:
    cols = header_of(text, heading)
    return [dict(zip(cols, r, strict=True)) for r in table_rows(text, heading)]


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# ---- the Markdown ------------------------------------------------------------------------------


def test_header_names_the_environment_and_the_command(full):
    _, text = full
    assert text.startswith("# Benchmark report: NVIDIA H200, 2026-12-03 10:20:30 UTC")
    for needle in ("| driver | 580.159 |", "| torch | 2.11.0+cu130 |", "| CUDA | 13.0 |",
                   "| GPU | NVIDIA H200 (132 SMs) |", "`cutegen bench --json-out results.json`",
                   "| results | [results.json](results.json) |"):
        assert needle in text, needle


def test_bf16_table_numbers_ratios_and_geomean(full):
    _, text = full
    head = "## BF16 GEMM"
    rows = table(text, head)
    assert len(rows) == 2
    big = rows[0]
    assert big["M, N, K"] == "4096, 4096, 4096"
    assert big["kernel"] == "128x256x64_c2x1_mcb_s4_wg2"
    assert big["cutegen µs"] == "160.0" and big["torch.matmul µs"] == "176.0"
    assert big["cutegen TFLOPS"] == f"{_gemm_tflops(4096, 4096, 4096, 160.0):.0f}"
    assert big["vs torch.matmul"] == "1.100"
    assert big["bound"] == "compute"
    # compute-bound: % of the bf16 dense peak
    assert big["% of roofline"] == f"{100 * _gemm_tflops(4096, 4096, 4096, 160.0) / 989:.1f}%"
    one = rows[1]
    assert one["bound"] == "memory" and one["vs torch.matmul"] == "0.500"
    # memory-bound: TFLOPS over AI x the copy bandwidth measured in the run
    ai = 2 * 4096 * 7168 / (2 * (7168 + 4096 * 7168) + 2 * 4096)
    assert one["AI (FLOP/B)"] == f"{ai:.1f}"
    assert one["% of roofline"] == f"{100 * _gemm_tflops(1, 4096, 7168, 40.0) / (ai * COPY_GBS / 1e3):.1f}%"
    assert f"vs torch.matmul **{geo([1.1, 0.5]):.3f}** (min 0.500, 2 of 2 shapes)" in text
    assert "- torch.matmul: 19.0 µs" in text


def test_fp8_table_na_values_and_geomeans(full):
    _, text = full
    head = "## FP8 block-scaled GEMM"
    cols = header_of(text, head)
    assert "DeepGEMM † TFLOPS" in cols and "vs cuBLAS blockwise" in cols and "% of roofline" in cols
    rows = table(text, head)
    assert [r["M, N, K"] for r in rows] == ["4096, 4096, 7168", "64, 2112, 7168", "128, 576, 7168"]
    assert rows[0]["bound"] == "compute" and rows[1]["bound"] == "memory"
    assert rows[0]["vs cuBLAS blockwise"] == "1.250"
    assert rows[0]["% of roofline"] == f"{100 * _gemm_tflops(4096, 4096, 7168, 200.0) / 1979:.1f}%"
    assert rows[1]["cuBLAS blockwise µs"] == "n/a" and rows[1]["vs cuBLAS blockwise"] == "n/a"
    assert rows[2]["DeepGEMM † TFLOPS"] == "n/a" and rows[2]["vs DeepGEMM †"] == "n/a"
    ours = [_gemm_tflops(4096, 4096, 7168, 200.0), _gemm_tflops(64, 2112, 7168, 20.0)]
    g_dg = geo([ours[0] / 1436, ours[1] / 180])
    # A number not measured in the run is a historical column: shown, never in bold or the summary.
    assert f"vs DeepGEMM † (historical, other conditions) {g_dg:.3f}" in text
    assert f"vs cuBLAS blockwise **{geo([1.25, 1.2]):.3f}**" in text and "2 of 3 shapes" in text
    assert "not measured in this run" in text and "not a comparison" in text  # the † footnote
    summary = text.split("<!-- summary -->")[1].split("<!-- /summary -->")[0]
    assert "cuBLAS blockwise" in summary and "DeepGEMM †" not in summary


def test_fp8_table_compares_with_a_copy_of_b(full):
    """Each row's copy of B (same run, same timing) beside cutegen's time; rows up to M = 128
    summarised; results from before that reference have neither column."""
    _, text = full
    rows = table(text, "## FP8 block-scaled GEMM")
    assert [r["copy of B µs"] for r in rows] == ["8.0", "9.0", "4.0"]
    assert [r["vs copy of B"] for r in rows] == ["0.04", "0.45", "0.40"]
    assert f"At M <= 128: geometric mean **{geo([9.0 / 20.0, 4.0 / 10.0]):.3f}** (min 0.400, 2 shapes)." in text


def test_fp8_results_without_a_copy_of_b(tmp_path):
    results = {"environment": dict(ENV), "fp8_gemm_nt": {"rows": [fp8_row((64, 2112, 7168), 20.0, 22.0, 180)]}}
    text = report.write_report(results, tmp_path, settings=report.Settings(plots=False))[0].read_text()
    cols = header_of(text, "## FP8 block-scaled GEMM")
    assert "B stream GB/s" in cols and "copy of B µs" not in cols and "vs copy of B" not in cols
    assert "copy of B µs:" not in text


def test_grouped_and_wgrad_tables(full):
    _, text = full
    cont = table(text, "contiguous layout")
    assert cont[0]["groups x rows"] == "4 x ~8192" and cont[0]["N, K"] == "4096, 7168"
    assert cont[1]["cuBLAS loop TFLOPS"] == "n/a" and cont[1]["vs cuBLAS loop"] == "n/a"
    t0 = _gemm_tflops(4 * 8192, 4096, 7168, 1000.0)
    assert cont[0]["vs cuBLAS loop"] == f"{t0 / 1100:.3f}"
    masked = table(text, "masked layout")
    assert masked[0]["groups x rows"] == "2 x 512"
    assert masked[0]["vs cuBLAS loop"] == f"{_gemm_tflops(1024, 4096, 7168, 100.0) / 400:.3f}"
    wgrad = table(text, "`fp8_wgrad_gemm_nt`)")
    assert wgrad[0]["vs DeepGEMM †"] == f"{_gemm_tflops(7168, 2112, 4096, 150.0) / 952:.3f}"
    k_grouped = table(text, "`k_grouped_fp8_gemm_nt_contiguous`)")
    # TFLOPS over the real tokens: 2 · M · N · Σ k_g.
    assert k_grouped[0]["G, M, N, mean k"] == "4, 7168, 4096, 4096"
    assert k_grouped[0]["cutegen TFLOPS"] == f"{_gemm_tflops(7168, 4096, 16100, 1300.0):.0f}"
    assert k_grouped[0]["vs DeepGEMM †"] == f"{_gemm_tflops(7168, 4096, 16100, 1300.0) / 967:.3f}"


def test_quantize_table(full):
    _, text = full
    head = "## FP8 quantize"
    cols = header_of(text, head)
    rows = table(text, head)
    ours = next(r for r in rows if r["implementation"].startswith("cutegen"))
    assert ours["µs"] == "125.0" and ours["vs eager"] == "3.20x" and ours["% of roofline"] == "80.0%"
    assert ours["note / kernel"] == "cutegen_quant_k"
    failed = next(r for r in rows if r["implementation"].startswith("torch.compile"))
    assert failed["µs"] == "n/a" and failed["GB/s"] == "n/a" and failed["vs eager"] == "n/a"
    assert "failed \\| to compile" in failed["note / kernel"]
    assert "vs eager torch **3.20x**" in text


def test_summary_plots_and_latest(full):
    out, text = full
    summary = text.split(report.SUMMARY_BEGIN)[1].split(report.SUMMARY_END)[0]
    for op in ("bf16_gemm_nt", "fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
               "fp8_wgrad_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous", "quantize"):
        assert f"`{op}`" in summary
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    stem = "2026-12-03-nvidia-h200"
    expected = {f"{stem}-{op}.png" for op in report.GEMM_OPS} | {f"{stem}-roofline.png", f"{stem}-quantize.png"}
    assert names == expected
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 15_000, p
        assert f"]({p.name})" in text  # linked from the report
    latest = (out / "LATEST.md").read_text()
    assert f"[{stem}.md]({stem}.md)" in latest and "`fp8_gemm_nt`" in latest


# ---- legacy form, n/a, LATEST ordering ---------------------------------------------------------


def test_legacy_bf16_results(tmp_path):
    src = tmp_path / "old.json"
    shutil.copy(LEGACY, src)
    assert main(["report", str(src), "-o", str(tmp_path), "--name", "old run", "--no-plots"]) == 0
    text = (tmp_path / "old-run.md").read_text()
    data = json.loads(LEGACY.read_text())
    ratios = [r["anchor_us"] / r["ours_us"] for r in data["rows"]]
    rows = table_rows(text, "## BF16 GEMM")
    assert len(rows) == 5 and rows[0][0] == "4096, 4096, 4096"
    assert [r[-1] for r in rows] == [f"{x:.3f}" for x in ratios]
    assert f"**{geo(ratios):.3f}**" in text
    assert "| driver | n/a |" in text and "not recorded in the results" in text
    assert "nominal" in text  # no copy bandwidth in a bf16-only run
    assert "- torch.matmul: 19.3 µs" in text
    assert not list(tmp_path.glob("*.png"))


def test_missing_fields_render_as_na(tmp_path):
    results = {
        "environment": {"gpu": "NVIDIA H200"},
        "bf16_gemm_nt": {"rows": [{"shape": [128, 128, 128], "ours_us": None}, {"shape": "bad"}, {}]},
        "fp8_gemm_nt": {"rows": [{"shape": [64, 2112, 7168], "ours_us": 20.0, "cublas_us": None,
                                  "cublas_tflops": None, "deepgemm_tflops": None}]},
        "m_grouped_fp8_gemm_nt_contiguous": [{"groups": 4}],
        "m_grouped_fp8_gemm_nt_masked": {"rows": []},
        "quantize": {"rows": [{"op": "per_block_quant_fp8", "us": None}]},
        "something_new": [1, 2],
    }
    paths = report.write_report(results, tmp_path, settings=report.Settings(plots=True))
    md = paths[0]
    assert md.name == "undated-nvidia-h200.md"
    text = md.read_text()
    assert "n/a" in text and not re.search(r"\b(nan|inf|None)\b", text, re.IGNORECASE)
    assert "`something_new`" in text
    rows = table_rows(text, "## BF16 GEMM")
    assert rows[1][0] == "n/a" and rows[2][0] == "n/a"
    fp8 = table(text, "## FP8 block-scaled")[0]
    # TFLOPS from the time when the row does not carry it
    assert fp8["cutegen TFLOPS"] == f"{_gemm_tflops(64, 2112, 7168, 20.0):.1f}"
    assert fp8["vs cuBLAS blockwise"] == "n/a"
    assert "No rows in the results for this op (n/a)." in text


def test_latest_points_at_the_newest_by_recorded_date(tmp_path):
    def results(date):
        return {"environment": {"date": date, "gpu": "NVIDIA H200"},
                "rows": [bf16_row((4096, 4096, 4096), 160.0, 176.0)]}

    s = report.Settings(plots=False)
    report.write_report(results("2026-12-05 09:00:00 UTC"), tmp_path, settings=s)
    report.write_report(results("2026-11-01 09:00:00 UTC"), tmp_path, settings=s)  # written later, older run
    latest = (tmp_path / "LATEST.md").read_text()
    newest = latest.split("Newest:")[1].splitlines()[0]
    assert "2026-12-05-nvidia-h200.md" in newest
    order = [m for m in re.findall(r"\((2026-[\d-]+-nvidia-h200\.md)\)", latest.split("## All reports")[1])]
    assert order == ["2026-12-05-nvidia-h200.md", "2026-11-01-nvidia-h200.md"]


def test_geomean_and_stem():
    assert report.geomean([1.0, 4.0, None, 0.0, float("nan")]) == pytest.approx(2.0)
    assert report.geomean([None]) is None
    assert report.report_stem({"date": "2026-11-30 07:00:17 UTC", "gpu": "NVIDIA H200"}) == "2026-11-30-nvidia-h200"
    assert report.report_stem({}) == "undated-unknown-gpu"


# ---- the command line --------------------------------------------------------------------------


def test_cli_missing_file(tmp_path, capsys):
    rc = main(["report", str(tmp_path / "nope.json"), "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.json: no such file" in err and "Traceback" not in err


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"environment": {}}', "no benchmark results"),
])
def test_cli_malformed_json(tmp_path, capsys, content, needle):
    src = tmp_path / "bad.json"
    src.write_text(content)
    rc = main(["report", str(src), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_bad_peak(tmp_path, capsys):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(synthetic()))
    assert main(["report", str(src), "-o", str(tmp_path), "--peak-fp8", "0"]) == 2
    assert "--peak-fp8 must be a positive number" in capsys.readouterr().err


def test_missing_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    src = tmp_path / "r.json"
    src.write_text(json.dumps(synthetic()))
    assert main(["report", str(src), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cutegen[report]" in err and "--no-plots" in err
    # the Markdown alone needs no matplotlib
    assert main(["report", str(src), "-o", str(tmp_path / "out"), "--no-plots"]) == 0
    # and `bench --report` refuses before running anything
    assert main(["bench", "--report", str(tmp_path / "b")]) == 2
    assert "--report" in capsys.readouterr().err


def test_bench_report_option_is_passed_on(monkeypatch, tmp_path):
    from cutegen.bench import run as bench
    from cutegen.bench import timing

    seen = {}

    def fake_main(**kwargs):
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(bench, "main", fake_main)
    assert main(["bench", "--op", "fp8_gemm_nt", "--report", str(tmp_path)]) == 0
    assert seen["report_dir"] == str(tmp_path) and seen["ops"] == ("fp8_gemm_nt",)
    assert seen["command"] == f"cutegen bench --op fp8_gemm_nt --report {tmp_path} --timer kernel"
    assert timing.timer() == "kernel"
    try:
        assert main(["bench", "--op", "fp8_gemm_nt", "--timer", "event"]) == 0
        assert seen["command"].endswith("--timer event") and timing.timer() == "event"
    finally:
        timing.set_timer("kernel")
    with pytest.raises(ValueError, match="timer"):
        timing.set_timer("wall")


def test_bench_conditions_option_is_passed_on(monkeypatch):
    """`--conditions deepgemm` selects DeepGEMM's benchmark conditions for the run and is named on
    the command line; the default is cutegen's own and is not spelled out."""
    from cutegen.bench import run as bench
    from cutegen.bench import timing

    seen = {}

    def fake_main(**kwargs):
        seen.update(kwargs)
        seen["conditions"] = timing.conditions()
        return 0

    monkeypatch.setattr(bench, "main", fake_main)
    try:
        assert main(["bench", "--op", "fp8_wgrad_gemm_nt", "--conditions", "deepgemm"]) == 0
        assert seen["command"].endswith("--timer kernel --conditions deepgemm")
        c = seen["conditions"]
        assert (c.name, c.flush_bytes, c.warmup, c.reps, c.summary, c.flush_warmup) == (
            "deepgemm", 8_000_000_000, 30, 30, "mean", True)
        assert main(["bench", "--op", "fp8_wgrad_gemm_nt"]) == 0
        assert "--conditions" not in seen["command"] and seen["conditions"].name == "cutegen"
        assert seen["conditions"].summary == "median" and seen["conditions"].warmup is None
    finally:
        timing.set_conditions("cutegen")
    with pytest.raises(ValueError, match="conditions must be one of cutegen, deepgemm"):
        timing.set_conditions("hot")


def test_kernel_timer_splits_calls_at_its_marker_spins():
    """Each call is what runs between the second and third marker spin of its rep, however many
    kernels the flush before it launched (an 8 GB flush of bytes is split into several)."""
    from cutegen.bench import timing

    spin = ("void at::cuda::(anonymous namespace)::spin_kernel(long)", 1.0)
    flush = [("at::native::vectorized_elementwise_kernel<fill>", 700.0)] * 3
    rep = lambda call: [*flush, spin, spin, *call, spin]  # noqa: E731
    acts = rep([("gemm", 10.0)]) + rep([("gemm", 11.0), ("reduce", 2.0)]) + rep([("gemm", 12.0)])
    assert timing.call_durations(acts, 3) == [10.0, 13.0, 12.0]
    assert timing.call_durations(acts[len(flush):], 3) == [10.0, 13.0, 12.0]  # no flush
    with pytest.raises(RuntimeError, match="found 3 timed calls"):
        timing.call_durations(acts, 4)
    with pytest.raises(RuntimeError, match="no GPU activity"):
        timing.call_durations(rep([]), 1)


def test_k_grouped_bench_operands_have_zero_token_padding():
    """The k-grouped benchmark's operands hold each group's padding tokens as zeros, as the grouped
    transposed quantize writes them (DeepGEMM in the run is given the padded counts)."""
    torch = pytest.importorskip("torch")
    from cutegen.bench import run as bench

    rows, sizes = 3, [130, 0, 128, 5]
    spans = [256, 0, 128, 128]
    flat = (torch.arange(rows * sum(spans)) % 7 + 1).to(torch.uint8).view(torch.float8_e4m3fn)
    out = bench._zero_token_padding(flat, rows, sizes).view(torch.uint8)
    start = 0
    for k, span in zip(sizes, spans):
        group = out[start:start + rows * span].view(rows, span)
        assert bool((group[:, k:] == 0).all()) and bool((group[:, :k] != 0).all())
        start += rows * span


def test_bench_decode_option_and_table(monkeypatch):
    """`--decode` reaches bench.main and the command line; decode rows (no DeepGEMM numbers) render
    with the cuBLAS comparison only."""
    from cutegen.bench import run as bench

    seen = {}
    monkeypatch.setattr(bench, "main", lambda **kwargs: seen.update(kwargs) or 0)
    assert main(["bench", "--op", "fp8_gemm_nt", "--decode"]) == 0
    assert seen["decode"] is True and "--decode" in seen["command"]
    assert main(["bench", "--op", "fp8_gemm_nt"]) == 0 and seen["decode"] is False
    assert {m for m, _, _ in bench.DECODE_SHAPES} == {1, 16, 32} and len(bench.DECODE_SHAPES) == 24
    assert not any(shape in bench.DEEPGEMM_FP8_TFLOPS for shape in bench.DECODE_SHAPES)
    row = {"shape": [1, 4096, 7168], "kernel": "x_sff32_64x32x128_c1x1_r40", "ours_us": 13.7, "ours_tflops": 4.3,
           "cublas_us": 22.0, "cublas_tflops": 2.7, "deepgemm_tflops": None, "b_gbs": 2150.0}
    text = bench.render_fp8([row], dict(ENV), 4200.0, "fp8_gemm_nt at decode-sized M")
    assert text.startswith("# fp8_gemm_nt at decode-sized M on ")
    assert "vs DeepGEMM" not in text.splitlines()[-1] and "vs cuBLAS blockwise: 1.593" in text


def test_report_method_names_the_timer():
    from cutegen.bench import report

    kernel = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, "kernel"))
    event = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False))
    assert "CUPTI" in kernel and "DeepGEMM" in kernel
    assert "CUDA events" in event
    assert "medians" in kernel and "8 GB" not in kernel
    deepgemm = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, "kernel",
                                         conditions="deepgemm"))
    assert "means over 30 calls" in deepgemm and "8 GB memset" in deepgemm and "--conditions deepgemm" in deepgemm
    # Every named condition is stated in the words the benchmark and the CLI use for it.
    from cutegen.bench.conditions import CONDITIONS

    for name, cond in CONDITIONS.items():
        method = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, "kernel", conditions=name))
        assert f"Times are {cond.description} (`cutegen bench --conditions {name}`" in method
    unknown = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, conditions="later"))
    assert "conditions named 'later'" in unknown
    # Host cost alone: its section states its own method; anything else beside no GEMM op's
    # section (the fused benchmark alone) is timed as the method says.
    host = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, "kernel", quantize=False,
                                     host_only=True))
    assert "host-cost section below states how" in host and "CUPTI" not in host
    fused = "\n".join(report._method([], 4000.0, "measured", report.Settings(), False, "kernel", quantize=False))
    assert "host-cost" not in fused and "CUPTI" in fused


def test_bench_writes_the_report_after_the_run(monkeypatch, tmp_path, capsys):
    """`bench.main(report_dir=...)` with the GPU parts replaced: results JSON and report land in DIR."""
    torch = pytest.importorskip("torch")
    from cutegen.bench import quant as bench_quant, run as bench
    from cutegen.runtime import ops as runtime_ops

    quant = synthetic()["quantize"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "environment", lambda: dict(ENV, command=None))
    monkeypatch.setattr(runtime_ops, "runnable_kernels", lambda op, device=0: [])
    monkeypatch.setattr(bench_quant, "bench_quant", lambda every_kernel=False: quant)
    cmd = f"cutegen bench --op quantize --report {tmp_path}"
    assert bench.main(ops=("quantize",), report_dir=str(tmp_path), command=cmd) == 0
    stem = "2026-12-03-nvidia-h200"
    saved = json.loads((tmp_path / f"{stem}.json").read_text())
    assert saved["environment"]["command"] == cmd and saved["quantize"]["copy_gbs"] == COPY_GBS
    text = (tmp_path / f"{stem}.md").read_text()
    assert f"`{cmd}`" in text and f"[{stem}.json]({stem}.json)" in text
    assert "compute roof" not in text and "copy of the same bytes" in text  # no GEMM method lines
    assert (tmp_path / f"{stem}-quantize.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "LATEST.md").is_file()
    assert f"report: {tmp_path / (stem + '.md')}" in capsys.readouterr().out


def test_driver_version_never_raises():
    from cutegen.bench import run as bench

    v = bench.driver_version()
    assert v is None or isinstance(v, str)


def deepgemm_run(mnk, us: float, equal: bool, calc_diff: float, config: str) -> dict:
    """The fields `cutegen bench --deepgemm` adds to a row: DeepGEMM's kernel timed in the run on
    problem `mnk` (M counting every row), and how its output compared with cutegen's."""
    return {"deepgemm_run_us": us, "deepgemm_run_tflops": _gemm_tflops(*mnk, us), "deepgemm_run_equal": equal,
            "deepgemm_run_calc_diff": calc_diff, "deepgemm_run_config": config}


def report_with_deepgemm_in_run(tmp_path, **sections) -> str:
    """The report text of a run whose results carry DeepGEMM's kernels (`cutegen bench --deepgemm`)."""
    env = dict(ENV, deepgemm_in_run="DeepGEMM commit abc1234 2026-06-23")
    results = {"environment": env, **sections}
    return report.write_report(results, tmp_path, settings=report.Settings(plots=False))[0].read_text()


def test_deepgemm_in_run_columns_agreement_and_method(tmp_path, monkeypatch):
    """Rows with DeepGEMM's own kernel timed in the run (`bench --deepgemm`) get its µs, TFLOPS and
    ratio beside the fixed DeepGEMM numbers, a note on how its outputs compared, and a Method line;
    `--deepgemm` reaches bench.main."""
    rows = [fp8_row((4096, 7168, 16384), 680.0, 720.0, 1465, 57.0), fp8_row((64, 2112, 7168), 10.0, 22.0, 180, 9.3)]
    rows[0].update(deepgemm_run((4096, 7168, 16384), 640.0, True, 0.0, "256x128 c1x2 s3"))
    rows[1]["kernel"] = rows[1]["kernel"].replace("_epitma_", "_episk_")
    rows[1].update(deepgemm_run((64, 2112, 7168), 10.5, False, 3e-10, "64x16 c1x1 s16"))
    text = report_with_deepgemm_in_run(tmp_path, fp8_gemm_nt={"rows": rows, "copy_gbs": COPY_GBS})
    got = table(text, "## FP8 block-scaled GEMM")
    assert [r["DeepGEMM in this run µs"] for r in got] == ["640.0", "10.5"]
    assert [r["vs DeepGEMM in this run"] for r in got] == ["0.941", "1.050"]
    assert "bitwise equal to cutegen's on 1 of 2 shapes" in text
    assert "on 64x2112x7168 calc_diff at most 3.0e-10 (cutegen's split-K kernels" in text
    assert "DeepGEMM commit abc1234 2026-06-23" in text and "`cutegen bench --deepgemm`" in text
    assert "DeepGEMM in this run" in text.split("## Summary")[1].split("## Method")[0]

    from cutegen.bench import run as bench

    seen = {}
    monkeypatch.setattr(bench, "main", lambda **kwargs: seen.update(kwargs) or 0)
    (tmp_path / "dg").mkdir()
    (tmp_path / "dg" / "deepgemm.json").write_text("{}")
    assert main(["bench", "--op", "fp8_gemm_nt", "--deepgemm", str(tmp_path / "dg")]) == 0
    assert seen["deepgemm_dir"] == str(tmp_path / "dg") and "--deepgemm" in seen["command"]
    text = bench.render_fp8(rows, dict(ENV), COPY_GBS)
    assert "DeepGEMM in this run TFLOPS" in text and "bitwise equal" in text and "calc_diff 3.0e-10" in text
    assert "vs DeepGEMM in this run: " in text.splitlines()[-1]


def test_deepgemm_in_run_on_grouped_and_weight_gradient_rows(tmp_path):
    """The contiguous grouped, weight-gradient and k-grouped sections carry DeepGEMM's kernels timed
    in the run like fp8_gemm_nt does: their columns, how the outputs compared (one line of text even
    where plot labels break lines) and which kernels the Method line names."""
    from cutegen.bench import run as bench

    contiguous = [grouped_row(4, 8192, 4096, 7168, 1000.0, 1100.0, 1345),
                  grouped_row(8, 4096, 7168, 2048, 500.0, None, 1240)]
    for r, us in zip(contiguous, (900.0, 520.0)):
        r.update(deepgemm_run((r["groups"] * r["rows_per_group"], r["n"], r["k"]), us, True, 0.0, "128x192 c2x1 s4"))
    wgrad = [{"shape": [7168, 2112, 4096], "ours_us": 150.0, "ours_tflops": _gemm_tflops(7168, 2112, 4096, 150.0),
              "deepgemm_tflops": 952, **deepgemm_run((7168, 2112, 4096), 160.0, False, 2e-16, "128x152 c2x1 s4")}]
    # k-grouped: the FLOPs count the real tokens (16100 over 4 groups); DeepGEMM's kernel is timed too.
    k_grouped = [{"shape": [4, 7168, 4096, 4096], "group_sizes": [4000, 4100, 3000, 5000], "ours_us": 1300.0,
                  "deepgemm_tflops": 967, **deepgemm_run((7168, 4096, 16100), 1350.0, True, 0.0, "128x152 c2x1 s4")}]
    text = report_with_deepgemm_in_run(tmp_path, m_grouped_fp8_gemm_nt_contiguous=contiguous, fp8_wgrad_gemm_nt=wgrad,
                                       k_grouped_fp8_gemm_nt_contiguous=k_grouped)
    got = table(text, "## M-grouped FP8 GEMM, contiguous")
    assert [r["DeepGEMM in this run µs"] for r in got] == ["900.0", "520.0"]
    assert [r["vs DeepGEMM in this run"] for r in got] == ["0.900", "1.040"]
    assert "bitwise equal to cutegen's on 2 of 2 shapes" in text
    assert "4x~8192 N4096 K7168 128x192 c2x1 s4, 8x~4096 N7168 K2048 128x192 c2x1 s4." in text
    got = table(text, "## FP8 weight-gradient GEMM")
    assert [r["vs DeepGEMM in this run"] for r in got] == ["1.067"]
    assert "compared with cutegen's on 1 shape; calc_diff at most 2.0e-16" in text
    got = table(text, "## k-grouped FP8 weight-gradient GEMM")
    assert [r["DeepGEMM in this run µs"] for r in got] == ["1350.0"]
    assert [r["vs DeepGEMM in this run"] for r in got] == ["1.038"]
    summary = text.split("## Summary")[1].split("## Method")[0]
    assert "1.038x DeepGEMM in this run" in summary.split("`k_grouped_fp8_gemm_nt_contiguous`")[1].splitlines()[0]
    method = text.split("## Method")[1].split("\n## ")[0]
    assert "over the contiguous layout for `m_grouped_fp8_gemm_nt_contiguous`" in method
    assert "for `k_grouped_fp8_gemm_nt_contiguous`" in method
    assert "1D1D kernel (fp32 D accumulated) for `fp8_wgrad_gemm_nt`" in method
    assert "for `fp8_gemm_nt`" not in method  # no dense rows carried it in this run

    printed = bench.render_grouped(contiguous, dict(ENV))
    assert "DeepGEMM in this run TFLOPS" in printed and "| 0.90 | bitwise equal |" in printed
    printed = bench.render_vs_deepgemm(wgrad, "fp8_wgrad_gemm_nt", "M, N, K")
    assert "| 1.07 | calc_diff 2.0e-16 |" in printed
    # Rows without the in-run anchor print as before.
    assert "in this run" not in bench.render_vs_deepgemm([dict(wgrad[0], deepgemm_run_us=None)], "t", "M, N, K")


def test_masked_rows_name_their_conditions_and_count_real_rows(tmp_path):
    """Masked rows run ragged (DeepGEMM's test conditions) and full: each row's label says which,
    and its TFLOPS and cuBLAS ratio count the real rows it states, not groups x expected rows."""
    ragged = {**grouped_row(2, 512, 4096, 7168, 100.0, 400.0, 686), "conditions": "ragged", "max_m": 4096,
              "masked_m": [480, 600], "real_rows": 1080, "ours_tflops": _gemm_tflops(1080, 4096, 7168, 100.0)}
    full = {**grouped_row(2, 512, 4096, 7168, 90.0, 300.0, None), "conditions": "full", "max_m": 512,
            "masked_m": [512, 512], "real_rows": 1024}
    results = {"environment": dict(ENV), "m_grouped_fp8_gemm_nt_masked": [ragged, full]}
    (tmp_path / "r.json").write_text(json.dumps(results))
    assert main(["report", str(tmp_path / "r.json"), "-o", str(tmp_path), "--no-plots"]) == 0
    text = (tmp_path / "2026-12-03-nvidia-h200.md").read_text()
    rows = table(text, "masked layout")
    assert [r["groups x rows"] for r in rows] == ["2 x 512 (ragged in max_m 4096)", "2 x 512 (full)"]
    assert rows[0]["vs cuBLAS loop"] == f"{_gemm_tflops(1080, 4096, 7168, 100.0) / 400:.3f}"
    assert rows[0]["cutegen TFLOPS"] == f"{_gemm_tflops(1080, 4096, 7168, 100.0):.0f}"
    assert rows[1]["vs DeepGEMM †"] == "n/a"
    assert "ragged: masked_m drawn 0.7-1.3x" in text


def test_bf16_family_section(tmp_path):
    """The BF16 family's tables (dense bf16 and fp32 D beside torch.matmul, grouped beside the best
    torch alternative) and its summary lines against the targets."""
    family = {
        "dense": [
            {"d": "bf16", "m": 1, "n": 4096, "k": 7168, "kernel": "k1", "ours_us": 10.0, "torch_us": 11.0,
             "ours_tflops": 5.9, "torch_tflops": 5.3, "ratio": 1.1},
            {"d": "bf16", "m": 333, "n": 12288, "k": 5120, "kernel": "k2", "ours_us": 100.0, "torch_us": 90.0,
             "ours_tflops": 420.0, "torch_tflops": 466.0, "ratio": 0.9},
            {"d": "f32", "m": 128, "n": 256, "k": 7168, "kernel": "k3", "ours_us": 8.0, "torch_us": 8.0,
             "ours_tflops": 58.7, "torch_tflops": 58.7, "ratio": 1.0},
            {"d": "f32 tn +=", "m": 7168, "n": 2112, "k": 4096, "kernel": "k4", "ours_us": 200.0, "torch_us": 240.0,
             "ours_tflops": 620.0, "torch_tflops": 516.0, "ratio": 1.2},
        ],
        "grouped": [
            {"layout": "masked", "groups": 32, "expected": 192, "n": 4096, "k": 4096, "rows": 6000,
             "ours_us": 200.0, "ours_tflops": 1000.0, "torch_us": {"torch.matmul loop": 400.0, "torch._grouped_mm": 300.0},
             "best_torch": "torch._grouped_mm", "ratio": 1.5},
        ],
    }
    text = report.write_report({"environment": ENV, "bf16_family": family}, tmp_path,
                               settings=report.Settings(plots=False))[0].read_text()
    assert "## The BF16 family beside torch (`bf16_family`)" in text
    assert "bf16_gemm_nt, bf16 D: 0.995x torch.matmul (geometric mean over 2 shapes; worst 0.90x" in text
    assert "bf16_gemm_nt, f32 D: 1.000x" in text
    assert "bf16_gemm_nt, MN-major operands and D = C + A·Bᵀ: 1.200x torch on the same views (geometric mean over 1 shapes" in text
    assert "| f32 tn += | 7168, 2112, 4096 | `k4` |" in text
    assert "m_grouped_bf16_gemm_nt_masked: 1.500x the best torch alternative" in text
    assert "| bf16 | 333, 12288, 5120 | `k2` | 100.0 | 420 | 90.0 | 466 | 0.90 |" in text
    assert "torch.matmul loop 400.0, torch._grouped_mm 300.0 | 1.50 (torch._grouped_mm) |" in text
    assert "not rendered" not in text
