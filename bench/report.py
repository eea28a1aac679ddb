"""`cutegen report`: turn the JSON of `cutegen bench --json-out` into a Markdown report with plots.

CPU only; never imports torch or the CuTe DSL. matplotlib (the ``report`` extra) is imported only
when plots are drawn, with the Agg backend.

What is written into the output folder (``docs/perf`` by default), ``STEM`` being
``<date>-<gpu>`` slugified (e.g. ``2026-11-30-nvidia-h200``) unless ``--name`` gives it:

- ``STEM.md``: a header (date, GPU, driver, torch, CUDA, the command that produced the results),
  the method, a summary, and one table per op: time, TFLOPS (GB/s for quantize), arithmetic
  intensity, which roof bounds the row, % of that roof, the anchors and cutegen's ratio to each,
  geometric means;
- ``STEM-<op>.png`` for each GEMM op (TFLOPS per shape beside the anchors, grouped bars),
  ``STEM-roofline.png`` (arithmetic intensity against achieved TFLOPS, under the compute and
  bandwidth ceilings) and ``STEM-quantize.png`` (GB/s per implementation beside the copy);
- ``LATEST.md``: the newest report of the folder (by the date it records) and a list of all.

The roofline (per GEMM row): arithmetic intensity AI = FLOPs / the bytes that must cross HBM at
least once (A and B read once, D written once as bf16, the fp32 scale factors of the FP8 ops).
The compute roof is the dense peak of the op's input type (FP8 1979 TFLOPS, BF16 989 TFLOPS: the
H100/H200 SXM datasheet numbers, ``--peak-fp8``/``--peak-bf16`` to change them); the bandwidth
roof is AI times the device-to-device copy bandwidth measured in the same run (bytes read +
written per second; ``fp8_gemm_nt``'s measurement, else the quantize benchmark's, else the
nominal 4800 GB/s of H200 HBM3e, said so in the report). The ridge point is peak / bandwidth: a
row with AI below it is memory-bound and its % of roofline is achieved TFLOPS over AI x bandwidth
(equivalently its effective bandwidth over the copy's); at or above it, it is compute-bound and
the % is achieved TFLOPS over the peak. Quantize rows are all memory-bound: their % is GB/s
over the bandwidth of a copy of the same bytes timed in the same run.

Ratios ``vs X`` are cutegen's TFLOPS over X's (X's time over cutegen's): above 1, cutegen is
faster. Anchors marked † were not measured in the run (DeepGEMM's own benchmark on this
project's H200, recorded in `cutegen.bench.run`, under its conditions): a historical column, left
out of the summary. Anything missing renders as ``n/a``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from cutegen.bench.conditions import CONDITIONS
from cutegen.bench.deepgemm_anchor import IN_RUN_LABEL as DEEPGEMM_IN_RUN

FP8_PEAK_TFLOPS = 1979.0
BF16_PEAK_TFLOPS = 989.0
NOMINAL_HBM_GBS = 4800.0

NA = "n/a"
LATEST = "LATEST.md"
MARKER = "cutegen-report"
SUMMARY_BEGIN = "<!-- summary -->"
SUMMARY_END = "<!-- /summary -->"

GEMM_OPS = (
    "bf16_gemm_nt",
    "fp8_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "fp8_wgrad_gemm_nt",
    "k_grouped_fp8_gemm_nt_contiguous",
)
KNOWN_KEYS = ("environment", *GEMM_OPS, "quantize", "host", "bf16_family", "fused")
# Folder files that are not reports.
NOT_REPORTS = {LATEST, "README.md", "NOTES.md", "STATUS.md"}


class ReportError(Exception):
    """The results cannot be turned into a report (unreadable, malformed, matplotlib missing)."""


# ---- values ------------------------------------------------------------------------------------


def num(value: Any) -> float | None:
    """A finite float, or None for anything else (None, strings, NaN, booleans)."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, (int, float, str)):
        return None
    try:
        v = float(value)
    except (ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def positive(value: Any) -> float | None:
    v = num(value)
    return v if v is not None and v > 0 else None


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values; None when there are none."""
    xs = [v for v in (positive(x) for x in values) if v is not None]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(value: Any, spec: str) -> str:
    v = num(value)
    return NA if v is None else format(v, spec)


def fmt_tflops(value: Any) -> str:
    v = num(value)
    if v is None:
        return NA
    return format(v, ".0f" if abs(v) >= 100 else ".1f" if abs(v) >= 10 else ".2f")


def fmt_pct(value: Any) -> str:
    v = num(value)
    return NA if v is None else f"{v:.1f}%"


def cell(value: Any) -> str:
    """Text for a Markdown table cell: n/a for nothing, pipes escaped, one line."""
    if value is None or value == "":
        return NA
    return str(value).replace("|", "\\|").replace("\n", " ")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def slugify(text: Any, limit: int = 80) -> str:
    """Lower-case letters, digits and single dashes; at most `limit` characters (file names)."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower())[:limit].strip("-")


def date_key(date: Any) -> str:
    """The sortable ISO-like part of a recorded date ('2026-11-30 07:00:17'), else ''."""
    m = re.search(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?)?", str(date or ""))
    return m.group(0).replace("T", " ") if m else ""


def report_stem(env: dict) -> str:
    """``<date>-<gpu>`` slugified, from the environment block."""
    date = str(env.get("date") or "")
    m = re.search(r"\d{4}-\d{2}-\d{2}", date)
    day = m.group(0) if m else (slugify(date) or "undated")
    return f"{day}-{slugify(env.get('gpu') or '') or 'unknown-gpu'}"


def short_kernel(name: Any) -> str:
    """The schedule part of a kernel name (tile, cluster, multicast, stages, warpgroups), and its
    epilogue tag unless it is the plain TMA store (e.g. ``episk`` for split K, ``epiwg`` for
    a whole tile stored per warpgroup), so that two kernels of one tile stay apart."""
    if not isinstance(name, str) or not name:
        return NA
    m = re.search(r"(\d+x\d+x\d+_c\d+x\d+_mc[a-z0-9]+_s\d+_wg\d+)(?:_r\d+x\d+_(epi[a-z0-9]+))?", name)
    if not m:
        return name
    return m.group(1) if m.group(2) in (None, "epitma") else f"{m.group(1)}_{m.group(2)}"


# ---- the results, normalised -------------------------------------------------------------------


@dataclasses.dataclass
class Anchor:
    name: str
    us: float | None
    tflops: float | None
    same_run: bool = True


@dataclasses.dataclass
class GemmPoint:
    """One GEMM row: what ran, how fast, its arithmetic intensity and its anchors."""

    label: list[str]  # the table cells naming the problem
    plot_label: str
    kernel: str | None
    ours_us: float | None
    ours_tflops: float | None
    flops: float | None
    nbytes: float | None
    anchors: list[Anchor]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:  # absurd inputs (1e300 rows) must not reach the plots as inf
        self.flops, self.nbytes = positive(self.flops), positive(self.nbytes)

    @property
    def ai(self) -> float | None:
        return positive(self.flops / self.nbytes) if self.flops and self.nbytes else None

    def ratio(self, anchor: Anchor) -> float | None:
        """cutegen over the anchor (> 1: cutegen faster), from times when both are known."""
        if positive(anchor.us) and positive(self.ours_us):
            return anchor.us / self.ours_us  # type: ignore[operator]
        if positive(anchor.tflops) and positive(self.ours_tflops):
            return self.ours_tflops / anchor.tflops  # type: ignore[operator]
        return None


@dataclasses.dataclass
class Roof:
    peak_tflops: float
    bandwidth_gbs: float

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the bandwidth roof meets the compute roof."""
        return self.peak_tflops * 1e3 / self.bandwidth_gbs

    def bound(self, ai: float | None) -> str | None:
        if ai is None:
            return None
        return "memory" if ai < self.ridge else "compute"

    def attainable(self, ai: float | None) -> float | None:
        if ai is None:
            return None
        return min(self.peak_tflops, ai * self.bandwidth_gbs / 1e3)

    def percent(self, ai: float | None, tflops: float | None) -> float | None:
        roof = self.attainable(ai)
        return 100.0 * tflops / roof if roof and tflops is not None else None


def _rows(entry: Any) -> list[dict]:
    """An op's rows whether the op's entry is a list of rows or an object with "rows"."""
    if isinstance(entry, dict):
        entry = entry.get("rows")
    if not isinstance(entry, list):
        return []
    return [r for r in entry if isinstance(r, dict)]


def _shape(value: Any) -> tuple[int, int, int] | None:
    if isinstance(value, (list, tuple)) and len(value) == 3:
        dims = [num(v) for v in value]
        if all(d is not None and d > 0 for d in dims):
            return tuple(int(d) for d in dims)  # type: ignore[return-value]
    return None


def _tflops(flops: float | None, us: float | None, given: Any) -> float | None:
    v = positive(given)
    if v is not None:
        return v
    return positive(flops / us / 1e6) if flops and positive(us) else None


def _anchor(name: str, flops: float | None, us: Any, tflops: Any, same_run: bool = True) -> Anchor:
    us_v = positive(us)
    return Anchor(name, us_v, _tflops(flops, us_v, tflops), same_run)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fp8_bytes(m: int, n: int, k: int) -> float:
    """Bytes an FP8 block-scaled GEMM must move: e4m3 A and B, fp32 scales (1x128, 128x128), bf16 D."""
    return m * k + n * k + 2 * m * n + 4 * m * _cdiv(k, 128) + 4 * _cdiv(n, 128) * _cdiv(k, 128)


def _point(
    r: dict, label: list[str], plot_label: str, flops: float | None, nbytes: float | None,
    anchors: list[Anchor], extra: dict[str, Any] | None = None,
) -> GemmPoint:
    """A row's GemmPoint: its own time, kernel and TFLOPS (recomputed from the time when the FLOPs
    are known) beside the given problem description and anchors."""
    us = positive(r.get("ours_us"))
    return GemmPoint(
        label=label,
        plot_label=plot_label,
        kernel=r.get("kernel") if isinstance(r.get("kernel"), str) else None,
        ours_us=us,
        ours_tflops=_tflops(flops, us, r.get("ours_tflops")),
        flops=flops,
        nbytes=nbytes,
        anchors=anchors,
        extra=extra or {},
    )


def _shape_point(
    r: dict, bytes_of: Callable[[int, int, int], float], anchors_of: Callable[[float | None], list[Anchor]],
    extra: dict[str, Any] | None = None,
) -> GemmPoint:
    """A row of an (M, N, K) problem: 2·M·N·K FLOPs and `bytes_of(M, N, K)` bytes."""
    shape = _shape(r.get("shape"))
    flops = positive(2 * shape[0] * shape[1] * shape[2]) if shape else None
    return _point(
        r,
        [", ".join(map(str, shape)) if shape else NA],
        "x".join(map(str, shape)) if shape else NA,
        flops,
        bytes_of(*shape) if shape else None,
        anchors_of(flops),
        extra,
    )


def bf16_bytes(m: int, n: int, k: int) -> float:
    return 2 * (m * k + n * k) + 2 * m * n


def bf16_points(entry: Any) -> list[GemmPoint]:
    points = []
    for r in _rows(entry):
        name = str(r.get("anchor") or "torch.matmul")
        p = _shape_point(r, bf16_bytes, lambda flops: [_anchor(name, flops, r.get("anchor_us"), r.get("anchor_tflops"))])
        # The bench's own ratio, when the times needed to recompute it are missing.
        if p.ratio(p.anchors[0]) is None and positive(r.get("ratio")):
            p.extra["ratio"] = positive(r.get("ratio"))
        points.append(p)
    return points


# Rows up to this M are summarised against the copy of B: there a GEMM is mostly a stream of B.
SMALL_M = 128


def _vs_copy_of_b(p: GemmPoint) -> float | None:
    """The copy of B's time over cutegen's (above 1: the GEMM takes less time than copying B)."""
    b_copy = p.extra.get("b_copy_us")
    return b_copy / p.ours_us if b_copy and p.ours_us else None


def _in_run_anchor(r: dict, in_run: bool, flops: float | None) -> list[Anchor]:
    """DeepGEMM's own kernel timed in this run (`cutegen bench --deepgemm`), when the op's rows
    carry it (decided once per op, so every row has the same columns)."""
    return [_anchor(DEEPGEMM_IN_RUN, flops, r.get("deepgemm_run_us"), r.get("deepgemm_run_tflops"))] if in_run else []


def _in_run_extra(r: dict) -> dict:
    return {"deepgemm_run_equal": r.get("deepgemm_run_equal"),
            "deepgemm_run_calc_diff": num(r.get("deepgemm_run_calc_diff")),
            "deepgemm_run_config": r.get("deepgemm_run_config")}


def _carries_in_run(entry: Any) -> bool:
    return any(r.get("deepgemm_run_us") for r in _rows(entry))


def fp8_points(entry: Any) -> list[GemmPoint]:
    in_run = _carries_in_run(entry)
    return [
        _shape_point(
            r,
            fp8_bytes,
            lambda flops: [
                _anchor("cuBLAS blockwise", flops, r.get("cublas_us"), r.get("cublas_tflops")),
                _anchor("DeepGEMM", flops, None, r.get("deepgemm_tflops"), same_run=False),
                *_in_run_anchor(r, in_run, flops),
            ],
            extra={"b_gbs": num(r.get("b_gbs")), "b_copy_us": num(r.get("b_copy_us")),
                   "m": (_shape(r.get("shape")) or (None,))[0], **_in_run_extra(r)},
        )
        for r in _rows(entry)
    ]


def wgrad_bytes(m: int, n: int, k: int) -> float:
    """fp8_wgrad_gemm_nt: e4m3 A and B with 1x128 fp32 scales each, fp32 D read and written (D += A·Bᵀ)."""
    return m * k + n * k + 4 * (m + n) * _cdiv(k, 128) + 8 * m * n


def _deepgemm_only(r: dict) -> Callable[[float | None], list[Anchor]]:
    return lambda flops: [_anchor("DeepGEMM", flops, None, r.get("deepgemm_tflops"), same_run=False)]


def wgrad_points(entry: Any) -> list[GemmPoint]:
    in_run = _carries_in_run(entry)
    return [
        _shape_point(r, wgrad_bytes, lambda flops: _deepgemm_only(r)(flops) + _in_run_anchor(r, in_run, flops),
                     extra=_in_run_extra(r))
        for r in _rows(entry)
    ]


def k_grouped_points(entry: Any) -> list[GemmPoint]:
    """k-grouped weight-gradient rows: shape [G, M, N, mean k] and the drawn group sizes; FLOPs and
    bytes over the real tokens (each group's D[g] read and written in fp32)."""
    in_run = _carries_in_run(entry)
    points = []
    for r in _rows(entry):
        shape = r.get("shape")
        sizes = r.get("group_sizes")
        ok = isinstance(shape, list) and len(shape) == 4 and all(isinstance(v, int) for v in shape)
        tokens = sum(int(v) for v in sizes) if isinstance(sizes, list) and ok else None
        g, m, n = (shape[0], shape[1], shape[2]) if ok else (None, None, None)
        flops = positive(2 * m * n * tokens) if tokens else None
        nbytes = (m + n) * tokens + 4 * (m + n) * _cdiv(tokens, 128) + 8 * g * m * n if tokens else None
        label = [", ".join(map(str, shape)) if ok else NA]
        plot_label = "G{}x{}x{} k{}".format(*shape) if ok else NA
        anchors = _deepgemm_only(r)(flops) + _in_run_anchor(r, in_run, flops)
        points.append(_point(r, label, plot_label, flops, nbytes, anchors, extra=_in_run_extra(r)))
    return points


def _masked_conditions(r: dict) -> str:
    """How a masked row's groups were filled, for its label: ragged in buffers of max_m rows (DeepGEMM's
    test conditions) or every group full; nothing for rows without conditions."""
    if r.get("conditions") == "ragged":
        return f" (ragged in max_m {r.get('max_m', NA)})"
    return " (full)" if r.get("conditions") == "full" else ""


def grouped_points(entry: Any, approx_rows: bool) -> list[GemmPoint]:
    """Grouped rows; `approx_rows`: group sizes vary around rows_per_group (contiguous layout)."""
    points = []
    in_run = _carries_in_run(entry)
    for r in _rows(entry):
        g, rows, n, k = (positive(r.get(key)) for key in ("groups", "rows_per_group", "n", "k"))
        known = None not in (g, rows, n, k)
        tilde = "~" if approx_rows else ""
        if known:
            g, rows, n, k = int(g), int(rows), int(n), int(k)  # type: ignore[arg-type]
            # Masked rows state their real rows (ragged groups); the others have g x rows.
            total = int(positive(r.get("real_rows")) or g * rows)
            flops = positive(2 * total * n * k)
            nbytes = (
                total * k + 4 * total * _cdiv(k, 128) + g * (n * k + 4 * _cdiv(n, 128) * _cdiv(k, 128)) + 2 * total * n
            )
        else:
            flops = nbytes = None

        def text(v: Any) -> str:
            return str(int(v)) if v is not None else NA

        anchors = [
            _anchor("cuBLAS loop", flops, r.get("cublas_loop_us"), r.get("cublas_loop_tflops")),
            _anchor("DeepGEMM", flops, None, r.get("deepgemm_tflops"), same_run=False),
            *_in_run_anchor(r, in_run, flops),
        ]
        points.append(
            _point(
                r,
                [f"{text(g)} x {tilde}{text(rows)}{_masked_conditions(r)}", f"{text(n)}, {text(k)}"],
                f"{text(g)}x{tilde}{text(rows)}\nN{text(n)} K{text(k)}",
                flops,
                nbytes,
                anchors,
                _in_run_extra(r),
            )
        )
    return points


def normalise(results: Any) -> dict[str, Any]:
    """The results with the legacy bf16-only form (top-level "rows") moved under bf16_gemm_nt.

    Raises ReportError when `results` is not an object or holds no benchmark results at all.
    """
    if not isinstance(results, dict):
        raise ReportError(f"expected a JSON object at the top level, found {type(results).__name__}")
    out = dict(results)
    if "rows" in out and "bf16_gemm_nt" not in out:
        out["bf16_gemm_nt"] = {"rows": out.pop("rows"), "host_overhead_us": out.pop("host_overhead_us", None)}
    if not isinstance(out.get("environment"), dict):
        out["environment"] = {}
    if not any(k in out for k in KNOWN_KEYS[1:]):
        raise ReportError(
            "no benchmark results found (expected one of: " + ", ".join(KNOWN_KEYS[1:]) + ", or a top-level \"rows\")"
        )
    return out


def measured_bandwidth(results: dict) -> tuple[float | None, str]:
    """The copy bandwidth measured in the run (GB/s) and where it came from."""
    for key in ("fp8_gemm_nt", "quantize"):
        entry = results.get(key)
        v = positive(entry.get("copy_gbs")) if isinstance(entry, dict) else None
        if v is not None:
            return v, f"the device-to-device copy measured in this run by the `{key}` benchmark"
    return None, ""


# ---- the Markdown ------------------------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    fp8_peak: float = FP8_PEAK_TFLOPS
    bf16_peak: float = BF16_PEAK_TFLOPS
    bandwidth: float | None = None  # GB/s; None: measured, else nominal
    plots: bool = True


@dataclasses.dataclass
class Section:
    op: str
    title: str
    points: list[GemmPoint]
    roof: Roof
    notes: list[str]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def shape_columns(op: str) -> list[str]:
    """The columns naming a problem in an op's tables (the report's and `cutegen bench`'s)."""
    if op.startswith("m_grouped"):
        return ["groups x rows", "N, K"]
    return ["G, M, N, mean k"] if op == "k_grouped_fp8_gemm_nt_contiguous" else ["M, N, K"]


def _gemm_table(sec: Section) -> tuple[list[str], dict[str, Any]]:
    """The op's table and its geometric means (per anchor, of % of roofline)."""
    pts, roof = sec.points, sec.roof
    names: list[Anchor] = []
    for p in pts:
        for a in p.anchors:
            if a.name not in [n.name for n in names]:
                names.append(a)
    show_us = {a.name: any(x.us is not None for p in pts for x in p.anchors if x.name == a.name) for a in names}
    first = shape_columns(sec.op)
    has_kernel = any(p.kernel for p in pts)
    header = [*first, *(["kernel"] if has_kernel else []), "cutegen µs", "cutegen TFLOPS", "AI (FLOP/B)", "bound",
              "% of roofline"]
    for a in names:
        mark = "" if a.same_run else " †"
        if show_us[a.name]:
            header.append(f"{a.name}{mark} µs")
        header += [f"{a.name}{mark} TFLOPS", f"vs {a.name}{mark}"]
    has_b = any(p.extra.get("b_gbs") is not None for p in pts) or sec.op == "fp8_gemm_nt"
    if has_b:
        header.append("B stream GB/s")
    # Results from before the copy-of-B reference have no such column.
    has_b_copy = any(p.extra.get("b_copy_us") is not None for p in pts)
    if has_b_copy:
        header += ["copy of B µs", "vs copy of B"]
    rows = []
    ratios: dict[str, list[float | None]] = {a.name: [] for a in names}
    pcts = []
    for p in pts:
        pct = roof.percent(p.ai, p.ours_tflops)
        pcts.append(pct)
        row = [
            *p.label,
            *([cell(short_kernel(p.kernel))] if has_kernel else []),
            fmt(p.ours_us, ".1f"),
            fmt_tflops(p.ours_tflops),
            fmt(p.ai, ".0f" if (p.ai or 0) >= 10 else ".1f"),
            cell(roof.bound(p.ai)),
            fmt_pct(pct),
        ]
        for a in names:
            got = next((x for x in p.anchors if x.name == a.name), None)
            r = p.ratio(got) if got else None
            if r is None and got is not None:  # the bench's own ratio, when the times are missing
                r = p.extra.get("ratio")
            ratios[a.name].append(r)
            if show_us[a.name]:
                row.append(fmt(got.us if got else None, ".1f"))
            row += [fmt_tflops(got.tflops if got else None), fmt(r, ".3f")]
        if has_b:
            row.append(fmt(p.extra.get("b_gbs"), ".0f"))
        if has_b_copy:
            row += [fmt(p.extra.get("b_copy_us"), ".1f"), fmt(_vs_copy_of_b(p), ".2f")]
        rows.append(row)
    lines = _table(header, rows)
    stats = {
        "n": len(pts),
        "pct": geomean(pcts),
        "ratios": {a.name: (geomean(ratios[a.name]), [r for r in ratios[a.name] if positive(r)], a.same_run)
                   for a in names},
    }
    parts = []
    for name, (g, xs, same_run) in stats["ratios"].items():
        mark = "" if same_run else " † (historical, other conditions)"
        if g is None:
            parts.append(f"vs {name}{mark} n/a")
        elif same_run:
            parts.append(f"vs {name} **{g:.3f}** (min {min(xs):.3f}, {len(xs)} of {_count(len(pts), 'shape')})")
        else:
            parts.append(f"vs {name}{mark} {g:.3f}")
    pct_text = fmt_pct(stats["pct"])
    lines += ["", f"Geometric means: {'; '.join(parts)}; % of roofline {pct_text}."]
    return lines, stats


def _one_line(label: str) -> str:
    """A plot label (which may break lines) for running text."""
    return label.replace("\n", " ")


def _deepgemm_agreement(points: list[GemmPoint]) -> str:
    """How DeepGEMM's outputs in this run compared with cutegen's on the same operands, and the
    configurations its heuristic picked."""
    equal = [p for p in points if p.extra.get("deepgemm_run_equal")]
    others = [p for p in points if not p.extra.get("deepgemm_run_equal")]
    if equal:
        text = (f"{DEEPGEMM_IN_RUN}: its output was bitwise equal to cutegen's on {len(equal)} of "
                f"{_count(len(points), 'shape')} (the two kernels promote in the same order)")
    else:
        text = f"{DEEPGEMM_IN_RUN}: its output was compared with cutegen's on {_count(len(points), 'shape')}"
    if others:
        worst = max((p.extra.get("deepgemm_run_calc_diff") or 0.0) for p in others)
        split = all("_episk_" in (p.kernel or "") for p in others)
        where = f"on {', '.join(_one_line(p.plot_label) for p in others)} " if equal else ""
        text += (f"; {where}calc_diff at most {worst:.1e}"
                 + (" (cutegen's split-K kernels add the K blocks in another order)" if split else ""))
    configs = ", ".join(f"{_one_line(p.plot_label)} {cell(p.extra.get('deepgemm_run_config'))}" for p in points)
    return text + f". Its configurations (tile, cluster, stages): {configs}."


def _summary_line(op: str, stats: dict) -> str:
    # Only anchors measured in the run: a number recorded under other conditions is no comparison.
    parts = []
    for name, (g, xs, same_run) in stats["ratios"].items():
        if same_run:
            parts.append(f"{g:.3f}x {name}" if g is not None else f"{name} n/a")
    return (f"- `{op}` ({_count(stats['n'], 'shape')}): geometric mean {', '.join(parts)}; "
            f"{fmt_pct(stats['pct'])} of roofline")


def _quant_rows(entry: Any) -> tuple[list[dict], float | None]:
    rows = _rows(entry)
    copy = positive(entry.get("copy_gbs")) if isinstance(entry, dict) else None
    return rows, copy


def _quant_pct(r: dict, bandwidth: float | None) -> float | None:
    frac = num(r.get("fraction_of_copy_bw"))
    if frac is not None:
        return 100.0 * frac
    gbs = positive(r.get("gbs"))
    return 100.0 * gbs / bandwidth if gbs and bandwidth else None


def _quant_note(r: dict) -> str:
    if r.get("note"):
        return cell(r["note"])
    return cell(short_kernel(r["kernel"])) if r.get("kernel") else ""


def _quant_section(entry: Any, bandwidth: float | None) -> tuple[list[str], str]:
    rows, copy = _quant_rows(entry)
    lines = [
        f"Copy bandwidth in this run: {fmt(copy, '.0f')} GB/s. GB/s = bytes read + written / time per call. "
        "Every quantize kernel is memory-bound: % of roofline = its GB/s over that of a copy of the same "
        "bytes timed in the same run. vs eager = eager torch's time over this row's.",
        "",
    ]
    table = []
    for r in rows:
        speed = num(r.get("speedup_vs_eager"))
        table.append([
            cell(r.get("op")),
            cell(r.get("case")),
            cell(r.get("impl")),
            fmt(positive(r.get("us")), ".1f"),
            fmt(positive(r.get("gbs")), ".0f"),
            fmt_pct(_quant_pct(r, bandwidth)),
            NA if speed is None else f"{speed:.2f}x",
            _quant_note(r),
        ])
    header = ["op", "case", "implementation", "µs", "GB/s", "% of roofline", "vs eager", "note / kernel"]
    lines += _table(header, table)
    ours = [r for r in rows if str(r.get("impl", "")).startswith("cutegen")]
    g_eager = geomean(r.get("speedup_vs_eager") for r in ours)
    g_pct = geomean(_quant_pct(r, bandwidth) for r in ours)
    lines += [
        "",
        f"Geometric means over the {_count(len(ours), 'cutegen row')}: vs eager torch "
        f"**{fmt(g_eager, '.2f')}{'x' if g_eager else ''}**; % of roofline {fmt_pct(g_pct)}.",
    ]
    summary = (
        f"- `quantize` ({_count(len(ours), 'cutegen row')}): geometric mean "
        f"{fmt(g_eager, '.2f')}{'x' if g_eager else ''} eager torch; {fmt_pct(g_pct)} of the copy bandwidth"
    )
    return lines, summary


TITLES = {
    "bf16_gemm_nt": "BF16 GEMM (`bf16_gemm_nt`)",
    "fp8_gemm_nt": "FP8 block-scaled GEMM (`fp8_gemm_nt`)",
    "m_grouped_fp8_gemm_nt_contiguous": "M-grouped FP8 GEMM, contiguous layout (`m_grouped_fp8_gemm_nt_contiguous`)",
    "m_grouped_fp8_gemm_nt_masked": "M-grouped FP8 GEMM, masked layout (`m_grouped_fp8_gemm_nt_masked`)",
    "fp8_wgrad_gemm_nt": "FP8 weight-gradient GEMM, fp32 D += A·Bᵀ (`fp8_wgrad_gemm_nt`)",
    "k_grouped_fp8_gemm_nt_contiguous": "k-grouped FP8 weight-gradient GEMM (MoE), fp32 D[g] += A_g·B_gᵀ, G, M, N, mean k "
    "(`k_grouped_fp8_gemm_nt_contiguous`)",
    "quantize": "FP8 quantize (`quantize`)",
    "host": "Host cost per call (`host`)",
    "bf16_family": "The BF16 family beside torch (`bf16_family`)",
    "fused": "Fused MoE up-projection: GEMM + SwiGLU + FP8 quantize (`fused`)",
}


def _header(env: dict, command: str | None, source: str | None, generated_by: str | None, out_dir: Path) -> list[str]:
    gpu = env.get("gpu") or NA
    sms = positive(env.get("sms"))
    gpu_text = f"{gpu} ({int(sms)} SMs)" if sms else str(gpu)
    cmd = env.get("command") or command
    source_text = NA
    if source:
        src = Path(source)
        try:
            rel = os.path.relpath(src.resolve(), out_dir.resolve())
        except ValueError:  # another drive
            rel = None
        source_text = f"[{src.name}]({rel})" if rel and not rel.startswith("..") else f"`{source}`"
    meta = {"date": str(env.get("date") or ""), "gpu": str(gpu)}
    rows = [
        ["date", cell(env.get("date"))],
        ["GPU", cell(gpu_text)],
        ["driver", cell(env.get("driver"))],
        ["torch", cell(env.get("torch"))],
        ["CUDA", cell(env.get("cuda"))],
        ["Python", cell(env.get("python"))],
        ["command", f"`{cmd}`" if cmd else "not recorded in the results"],
        ["results", source_text],
    ]
    if generated_by:
        rows.append(["report", f"`{generated_by}`"])
    title = f"# Benchmark report: {gpu}, {env.get('date') or 'undated'}"
    return [
        title,
        "",
        f"<!-- {MARKER} {json.dumps(meta).replace('--', '- -')} -->",
        "",
        *_table(["", ""], rows),
    ]


def _conditions_text(name: str) -> str:
    """What ran between the timed calls, as `cutegen.bench.conditions.CONDITIONS` describes it."""
    known = CONDITIONS.get(name)
    if known is None:
        return f"taken under the conditions named {name!r} (`cutegen bench --conditions`)"
    measured_dagger = "; the † numbers were measured under them" if name == "deepgemm" else ""
    return f"{known.description} (`cutegen bench --conditions {name}`{measured_dagger})"


def _method(
    sections: list[Section], bw: float, bw_source: str, s: Settings, has_deepgemm: bool, timer: str = "event",
    fresh_allocations: bool = False, deepgemm_in_run: str | None = None, conditions: str = "cutegen",
    quantize: bool = True, host_only: bool = False,
) -> list[str]:
    """The report's Method section; `timer` is the results' (runs before there was a choice used events),
    `fresh_allocations` whether each GEMM shape's operands were fresh allocations (runs since 2026-12-01),
    `conditions` what ran between the timed calls (`cutegen bench --conditions`; runs before there was a
    choice: cutegen)."""
    how = (
        "the summed durations of each call's GPU kernels as CUPTI records them (`--timer kernel`, the way "
        "DeepGEMM's own benchmark timed its numbers)"
        if timer == "kernel"
        else "CUDA events around each call (`--timer event`: they also count the GPU's launch of the call, ~2-3 µs)"
    )
    if host_only:  # host cost only: its section states its own method
        return ["## Method", "", "The host-cost section below states how its calls were timed; every row, "
                "cutegen's and the anchors', ran in the same process and was timed the same way.", ""]
    lines = [
        "## Method",
        "",
        f"Times are {_conditions_text(conditions)}, timed by {how}; "
        + "the anchors ran in the same process and were timed the same way, so the ratios are what to compare "
        "(absolute times drift)."
        + (" Each GEMM shape's operands are fresh allocations (torch's allocator cache is emptied before the "
           "shape): the same kernel measured up to 14% slower on operands in blocks reused from earlier shapes."
           if fresh_allocations else ""),
        "",
    ]
    if not sections:  # no GEMM op's section: each of the others states its own measure
        return lines + [
            "- Quantize rows: GB/s = bytes read + written over the time per call, beside a device-to-device "
            "copy of the same bytes timed in the same run."
        ] * quantize
    lines += [
        f"- Roofline: compute roof = dense peak of the input type (FP8 {s.fp8_peak:.0f} TFLOPS, "
        f"BF16 {s.bf16_peak:.0f} TFLOPS); bandwidth roof = AI x {bw:.0f} GB/s ({bw_source}).",
        "- AI (arithmetic intensity) = FLOPs / the bytes that must cross HBM at least once: A and B read "
        "once, D written once (bf16), and for FP8 the fp32 scale factors (1x128 for A, 128x128 for B)."
        + (" Weight gradients: 1x128 scales for both, and the fp32 D read and written."
           if any(sec.op in ("fp8_wgrad_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous") for sec in sections) else ""),
        f"- A row is **memory**-bound when its AI is below the ridge point peak / bandwidth "
        f"(FP8 {s.fp8_peak * 1e3 / bw:.0f}, BF16 {s.bf16_peak * 1e3 / bw:.0f} FLOP/B); its % of roofline "
        "is then its TFLOPS over AI x bandwidth. Otherwise it is **compute**-bound and the % is over the peak.",
        "- `vs X` = cutegen TFLOPS / X TFLOPS (= X's time / cutegen's): above 1, cutegen is faster. "
        "Geometric means are over the shapes where both numbers exist.",
    ]
    if any(sec.op == "m_grouped_fp8_gemm_nt_contiguous" for sec in sections):
        lines.append(
            "- Contiguous grouped GEMM: group sizes vary around the rows per group (±30%); TFLOPS count the "
            "real rows, the AI uses the mean group size (the results record only that)."
        )
    if has_deepgemm:
        lines.append(
            "- † not measured in this run: DeepGEMM's own benchmark on this project's H200 (the numbers in "
            "`cutegen.bench.run`), under that benchmark's conditions, which are not always this run's: a "
            "historical column, not a comparison; the summary leaves it out."
        )
    if any(sec.op == "m_grouped_fp8_gemm_nt_masked" for sec in sections):
        lines.append(
            "- Masked grouped GEMM: each problem runs twice, as DeepGEMM's tests fill the groups (ragged: "
            "masked_m drawn 0.7-1.3x the expected rows in buffers of max_m = 4096 rows) and with every group "
            "full (max_m = masked_m = the expected rows); TFLOPS count the real rows. The † column is "
            "DeepGEMM's figure for the ragged case."
        )
    which = {
        "fp8_gemm_nt": "its dense 1D2D kernel for `fp8_gemm_nt`",
        "m_grouped_fp8_gemm_nt_contiguous": "the same kernel over the contiguous layout for "
                                            "`m_grouped_fp8_gemm_nt_contiguous`",
        "fp8_wgrad_gemm_nt": "its dense 1D1D kernel (fp32 D accumulated) for `fp8_wgrad_gemm_nt`",
        "k_grouped_fp8_gemm_nt_contiguous": "the same 1D1D kernel over the k-grouped operands, each group "
                                            "given its token count padded to 128 (the padding tokens are "
                                            "zeros), for `k_grouped_fp8_gemm_nt_contiguous`",
    }
    timed = [which[sec.op] for sec in sections if sec.op in which
             and any(a.name == DEEPGEMM_IN_RUN and a.us for p in sec.points for a in p.anchors)]
    if deepgemm_in_run and timed:
        lines.append(
            f"- {DEEPGEMM_IN_RUN}: DeepGEMM's own FP8 kernels ({'; '.join(timed)}), each in the configuration "
            f"its heuristic picks, compiled by `cutegen deepgemm-build` ({cell(deepgemm_in_run)}), launched on "
            "the same operands and timed the same way (`cutegen bench --deepgemm`); each output was compared "
            "with cutegen's first."
        )
    return lines


def _relative(path: Path, base: Path) -> str:
    return os.path.relpath(path, base).replace(os.sep, "/")


def render(
    results: dict,
    out_dir: Path,
    stem: str,
    settings: Settings,
    *,
    command: str | None = None,
    source: str | None = None,
    generated_by: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The report's Markdown and a plan of its plots: {"bars": {op: (path, section)}, ...}."""
    results = normalise(results)
    env = results["environment"]
    measured, bw_source = measured_bandwidth(results)
    if settings.bandwidth:
        bw, bw_source = settings.bandwidth, "given on the command line"
    elif measured:
        bw = measured
    else:
        bw, bw_source = NOMINAL_HBM_GBS, "nominal H200 HBM3e: no copy bandwidth was measured in this run"

    sections: list[Section] = []
    builders = {
        "bf16_gemm_nt": (bf16_points, settings.bf16_peak),
        "fp8_gemm_nt": (fp8_points, settings.fp8_peak),
        "m_grouped_fp8_gemm_nt_contiguous": (lambda e: grouped_points(e, True), settings.fp8_peak),
        "m_grouped_fp8_gemm_nt_masked": (lambda e: grouped_points(e, False), settings.fp8_peak),
        "fp8_wgrad_gemm_nt": (wgrad_points, settings.fp8_peak),
        "k_grouped_fp8_gemm_nt_contiguous": (k_grouped_points, settings.fp8_peak),
    }
    for op, (build, peak) in builders.items():
        if op in results:
            sections.append(Section(op, TITLES[op], build(results[op]), Roof(peak, bw), []))
    has_deepgemm = any(
        not a.same_run and a.tflops is not None for sec in sections for p in sec.points for a in p.anchors
    )

    plan: dict[str, Any] = {"bars": {}, "roofline": None, "quantize": None, "bandwidth": bw, "bw_source": bw_source}
    body: list[str] = []
    summary: list[str] = []
    for sec in sections:
        body += ["", f"## {sec.title}", ""]
        if not sec.points:
            body.append("No rows in the results for this op (n/a).")
            summary.append(f"- `{sec.op}`: n/a (no rows)")
            continue
        table, stats = _gemm_table(sec)
        body += table
        summary.append(_summary_line(sec.op, stats))
        entry = results.get(sec.op)
        if sec.op == "bf16_gemm_nt" and isinstance(entry, dict) and isinstance(entry.get("host_overhead_us"), dict):
            body += ["", "Host time per call (128x128x128, wall clock, the GPU never the bottleneck):", ""]
            body += [f"- {cell(k)}: {fmt(v, '.1f')} µs" for k, v in entry["host_overhead_us"].items()]
        if sec.op == "fp8_gemm_nt":
            copy = positive(entry.get("copy_gbs")) if isinstance(entry, dict) else None
            body += ["", f"B stream GB/s: bytes of B and its scales over cutegen's time (copy bandwidth "
                         f"{fmt(copy, '.0f')} GB/s)."]
            if any(p.extra.get("b_copy_us") is not None for p in sec.points):
                body += ["", "copy of B µs: a device-to-device copy of B's bytes (read once, written once), "
                             "timed in the same run and the same way as the GEMM; vs copy of B = that time "
                             "over cutegen's (above 1, the whole GEMM takes less time than copying B)."]
                small_m = [r for p in sec.points if (p.extra.get("m") or 0) <= SMALL_M
                           and (r := _vs_copy_of_b(p)) is not None]
                if small_m:
                    body[-1] += (f" At M <= {SMALL_M}: geometric mean **{geomean(small_m):.3f}** "
                                 f"(min {min(small_m):.3f}, {_count(len(small_m), 'shape')}).")
        checked = [p for p in sec.points if p.extra.get("deepgemm_run_equal") is not None]
        if checked:
            body += ["", _deepgemm_agreement(checked)]
        kernels = sorted({p.kernel for p in sec.points if p.kernel and short_kernel(p.kernel) != p.kernel})
        if kernels:
            body += ["", "<details><summary>Kernels (full names)</summary>", ""]
            body += [f"- `{k}`" for k in kernels]
            body += ["", "</details>"]
        if settings.plots and any(p.ours_tflops is not None for p in sec.points):
            png = out_dir / f"{stem}-{sec.op}.png"
            plan["bars"][sec.op] = (png, sec)
            body += ["", f"![{sec.op}: TFLOPS per shape beside the anchors]({_relative(png, out_dir)})"]

    if "quantize" in results:
        body += ["", f"## {TITLES['quantize']}", ""]
        qrows, _ = _quant_rows(results["quantize"])
        if qrows:
            qlines, qsum = _quant_section(results["quantize"], bw)
            body += qlines
            summary.append(qsum)
            if settings.plots and any(positive(r.get("gbs")) for r in qrows):
                png = out_dir / f"{stem}-quantize.png"
                plan["quantize"] = (png, qrows, positive(results["quantize"].get("copy_gbs")) or bw)
                body += ["", f"![quantize: GB/s per implementation beside the copy]({_relative(png, out_dir)})"]
        else:
            body.append("No rows in the results for this op (n/a).")
            summary.append("- `quantize`: n/a (no rows)")

    if isinstance(results.get("host"), dict):
        from cutegen.bench import host as bench_host

        body += ["", f"## {TITLES['host']}", "", *bench_host.table_lines(results["host"])]
        summary.append(bench_host.summary_line(results["host"]))

    if isinstance(results.get("bf16_family"), dict):
        from cutegen.bench import bf16 as bench_bf16

        body += ["", f"## {TITLES['bf16_family']}", "", *bench_bf16.render(results["bf16_family"]).splitlines()[2:]]
        summary += [f"- {line}" for line in bench_bf16.summary(results["bf16_family"])]

    if isinstance(results.get("fused"), dict):
        from cutegen.bench import fused as bench_fused

        body += ["", f"## {TITLES['fused']}", "", *bench_fused.render(results["fused"]).splitlines()[2:]]
        summary += [f"- {line}" for line in bench_fused.summary(results["fused"])]

    roof_points = [sec for sec in sections if any(p.ai and p.ours_tflops for p in sec.points)]
    roof_lines: list[str] = []
    if settings.plots and roof_points:
        png = out_dir / f"{stem}-roofline.png"
        plan["roofline"] = (png, roof_points)
        roof_lines = [
            "",
            "## Roofline",
            "",
            f"![Roofline: arithmetic intensity against achieved TFLOPS]({_relative(png, out_dir)})",
            "",
            "Filled markers: cutegen; hollow: the anchor measured in the same run, same shape.",
        ]

    unknown = sorted(k for k in results if k not in KNOWN_KEYS)
    tail = []
    if unknown:
        tail = ["", "Entries of the results not rendered here: " + ", ".join(f"`{cell(k)}`" for k in unknown) + "."]

    lines = _header(env, command, source, generated_by, out_dir)
    lines += ["", "## Summary", "", SUMMARY_BEGIN, *(summary or ["- no results"]), SUMMARY_END, ""]
    lines += _method(
        sections, bw, bw_source, settings, has_deepgemm, str(env.get("timer") or "event"),
        bool(env.get("fresh_allocations")), env.get("deepgemm_in_run"), str(env.get("conditions") or "cutegen"),
        quantize="quantize" in results, host_only=not sections and set(results) & set(KNOWN_KEYS) <= {"environment", "host"},
    )
    lines += body + roof_lines + tail
    return "\n".join(lines) + "\n", plan


# ---- the plots ---------------------------------------------------------------------------------


def require_matplotlib():
    """matplotlib.pyplot with the Agg backend; ReportError saying how to install it if missing."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ReportError(
            "the plots need matplotlib, which is not installed: pip install 'cutegen[report]' "
            "(or pass --no-plots for the Markdown alone)"
        ) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


ANCHOR_COLOURS = {
    "torch.matmul": "#ff7f0e", "cuBLAS blockwise": "#ff7f0e", "cuBLAS loop": "#ff7f0e", "DeepGEMM": "#7f7f7f",
}
OP_COLOURS = {
    "bf16_gemm_nt": "#1f77b4",
    "fp8_gemm_nt": "#d62728",
    "m_grouped_fp8_gemm_nt_contiguous": "#2ca02c",
    "m_grouped_fp8_gemm_nt_masked": "#9467bd",
    "fp8_wgrad_gemm_nt": "#8c564b",
    "k_grouped_fp8_gemm_nt_contiguous": "#e377c2",
}
OP_MARKERS = {
    "bf16_gemm_nt": "o", "fp8_gemm_nt": "s", "m_grouped_fp8_gemm_nt_contiguous": "^",
    "m_grouped_fp8_gemm_nt_masked": "D", "fp8_wgrad_gemm_nt": "v", "k_grouped_fp8_gemm_nt_contiguous": "P",
}


def plot_bars(plt, path: Path, sec: Section, title: str) -> None:
    pts = sec.points
    names: list[Anchor] = []
    for p in pts:
        for a in p.anchors:
            if a.name not in [n.name for n in names] and any(
                x.name == a.name and x.tflops is not None for q in pts for x in q.anchors
            ):
                names.append(a)
    series = [("cutegen", [p.ours_tflops for p in pts], "#1f77b4", None)]
    for a in names:
        vals = [next((x.tflops for x in p.anchors if x.name == a.name), None) for p in pts]
        label = a.name if a.same_run else f"{a.name} (recorded, not this run)"
        series.append((label, vals, ANCHOR_COLOURS.get(a.name, None), None if a.same_run else "//"))
    n, k = len(pts), len(series)
    width = 0.8 / k
    fig, ax = plt.subplots(figsize=(min(18.0, max(7.0, 0.25 * n * k + 3.0)), 5.0))
    values = [v for _, vals, _, _ in series for v in vals if positive(v)]
    log = bool(values) and max(values) / min(values) > 20
    floor = min(values) / 2 if log and values else 0
    for j, (label, vals, colour, hatch) in enumerate(series):
        xs = [i + (j - (k - 1) / 2) * width for i in range(n)]
        hs = [v if positive(v) else 0 for v in vals]
        ax.bar(xs, hs, width, label=label, color="white" if hatch else colour,
               edgecolor=colour or "black", hatch=hatch, linewidth=0.8)
        for x, v in zip(xs, vals):
            if not positive(v):
                ax.text(x, floor if log else 0, NA, ha="center", va="bottom", fontsize=7, rotation=90, color="#555")
    ax.axhline(sec.roof.peak_tflops, color="black", linestyle="--", linewidth=1)
    ax.text(n - 0.5, sec.roof.peak_tflops, f"dense peak {sec.roof.peak_tflops:.0f} TFLOPS", ha="right",
            va="bottom", fontsize=8)
    # Head room above the peak line for the legend (one row) and the peak's label.
    if log:
        ax.set_yscale("log")
        ax.set_ylim(floor, sec.roof.peak_tflops * 5)
    else:
        ax.set_ylim(0, sec.roof.peak_tflops * 1.3)
    ax.set_xticks(range(n))
    ax.set_xticklabels([p.plot_label for p in pts], rotation=35 if n > 4 else 0, ha="right" if n > 4 else "center",
                       fontsize=8)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("TFLOPS" + (" (log scale)" if log else ""))
    grouped = sec.op.startswith("m_grouped")
    ax.set_xlabel("problem shape" + (" (groups x rows per group, N, K)" if grouped else " (M x N x K)"))
    ax.set_title(title)
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=len(series), framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roofline(plt, path: Path, sections: list[Section], bw: float, bw_source: str, s: Settings, title: str) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 5.8))
    ais = [p.ai for sec in sections for p in sec.points if p.ai]
    ridge_hi = max(s.fp8_peak, s.bf16_peak) * 1e3 / bw
    lo = min(min(ais) / 2, 0.5)
    hi = max(max(ais) * 2, ridge_hi * 4)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    dtypes = {("bf16" if sec.op == "bf16_gemm_nt" else "fp8") for sec in sections}
    for name, peak, style in (("FP8", s.fp8_peak, "-"), ("BF16", s.bf16_peak, "--")):
        if name.lower() not in dtypes:
            continue
        ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], color="black", linestyle=style, linewidth=1.3,
                label=f"{name} roof: dense peak {peak:.0f} TFLOPS")
        ridge = peak * 1e3 / bw
        ax.axvline(ridge, color="#999", linestyle=":", linewidth=0.8)
        ax.text(ridge * 1.05, lo * bw / 1e3 * 1.5, f"ridge {ridge:.0f}", rotation=90, fontsize=7, color="#666",
                va="bottom")
    ys = []
    for sec in sections:
        colour, marker = OP_COLOURS.get(sec.op, None), OP_MARKERS.get(sec.op, "o")
        pts = [p for p in sec.points if p.ai and p.ours_tflops]
        ax.scatter([p.ai for p in pts], [p.ours_tflops for p in pts], color=colour, marker=marker, s=36,
                   label=f"{sec.op} (cutegen)", zorder=3)
        ys += [p.ours_tflops for p in pts]
        hollow = [(p.ai, a.tflops) for p in pts for a in p.anchors if a.same_run and positive(a.tflops)]
        if hollow:
            ax.scatter([h[0] for h in hollow], [h[1] for h in hollow], facecolors="none", edgecolors=colour,
                       marker=marker, s=36, zorder=2)
            ys += [h[1] for h in hollow]
    ax.scatter([], [], facecolors="none", edgecolors="black", marker="o", s=36, label="anchor of the same run (hollow)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(min(ys) / 2, lo * bw / 1e3), max(s.fp8_peak, s.bf16_peak) * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic, log scale)")
    ax.set_ylabel("achieved TFLOPS (log scale)")
    ax.set_title(title)
    ax.grid(which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    fig.text(0.01, 0.005, f"bandwidth roof: {bw_source}", fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    # The bandwidth roof's label, along the line (its angle on screen, known once the layout is).
    x0, x1 = lo * 3, lo * 30
    (px0, py0), (px1, py1) = ax.transData.transform([(x0, x0 * bw / 1e3), (x1, x1 * bw / 1e3)])
    ax.text(x0, x0 * bw / 1e3 * 1.25, f"bandwidth roof {bw:.0f} GB/s", fontsize=8, ha="left", va="bottom",
            rotation=math.degrees(math.atan2(py1 - py0, px1 - px0)), rotation_mode="anchor")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_quantize(plt, path: Path, rows: list[dict], copy_gbs: float, title: str) -> None:
    rows = [r for r in rows if not str(r.get("impl", "")).startswith("copy")]
    labels = [f"{r.get('op', NA)}\n{r.get('impl', NA)}" for r in rows]
    vals = [positive(r.get("gbs")) for r in rows]
    fig, ax = plt.subplots(figsize=(9.0, max(3.0, 0.5 * len(rows) + 1.5)))
    ys = list(range(len(rows)))[::-1]
    colours = ["#1f77b4" if str(r.get("impl", "")).startswith("cutegen") else "#ff7f0e" for r in rows]
    ax.barh(ys, [v or 0 for v in vals], color=colours)
    for y, v in zip(ys, vals):
        ax.text((v or 0) + copy_gbs * 0.01, y, f"{v:.0f}" if v else NA, va="center", fontsize=7)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.axvline(copy_gbs, color="black", linestyle="--", linewidth=1)
    handles = [
        Patch(color="#1f77b4", label="cutegen"),
        Patch(color="#ff7f0e", label="anchor (eager torch, torch.compile)"),
        Line2D([], [], color="black", linestyle="--", label=f"copy {copy_gbs:.0f} GB/s (same run)"),
    ]
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("GB/s (bytes read + written / time per call)")
    ax.set_xlim(0, max([copy_gbs, *(v for v in vals if v)]) * 1.15)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- writing -----------------------------------------------------------------------------------


def load_results(path: str | os.PathLike) -> dict:
    """The parsed results; ReportError for a missing, unreadable or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise ReportError(f"{path}: no such file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read it ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from exc
    try:
        return normalise(data)
    except ReportError as exc:
        raise ReportError(f"{path}: {exc}") from exc


def _report_meta(path: Path) -> dict | None:
    try:
        head = path.read_text(errors="replace")[:4096]
    except OSError:
        return None
    m = re.search(r"<!-- " + MARKER + r" (\{.*?\}) -->", head)
    if not m:
        return None
    try:
        meta = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(meta, dict):
        return None
    body = path.read_text(errors="replace")
    i, j = body.find(SUMMARY_BEGIN), body.find(SUMMARY_END)
    meta["summary"] = body[i + len(SUMMARY_BEGIN) : j].strip() if 0 <= i < j else ""
    meta["path"] = path
    return meta


def write_latest(out_dir: str | os.PathLike) -> Path | None:
    """(Re)write ``LATEST.md``: the newest report in `out_dir` by recorded date, and all of them."""
    out = Path(out_dir)
    reports = [m for p in sorted(out.glob("*.md")) if p.name not in NOT_REPORTS and (m := _report_meta(p))]
    if not reports:
        return None
    reports.sort(key=lambda m: (date_key(m.get("date")), m["path"].name), reverse=True)
    newest = reports[0]

    def link(m: dict) -> str:
        return f"[{m['path'].name}]({m['path'].name})"

    lines = [
        "# Latest benchmark report",
        "",
        "<!-- Written by `cutegen report` (and `cutegen bench --report`) each time a report is written here. -->",
        "",
        f"Newest: **{link(newest)}**, {cell(newest.get('gpu'))}, {cell(newest.get('date'))}.",
        "",
        newest.get("summary") or "",
        "",
        "## All reports, newest first",
        "",
        *_table(["date", "GPU", "report"], [[cell(m.get("date")), cell(m.get("gpu")), link(m)] for m in reports]),
    ]
    path = out / LATEST
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(
    results: dict,
    out_dir: str | os.PathLike = "docs/perf",
    *,
    name: str | None = None,
    source: str | os.PathLike | None = None,
    command: str | None = None,
    generated_by: str | None = None,
    settings: Settings | None = None,
) -> list[Path]:
    """Write the Markdown, its plots and LATEST.md into `out_dir`; the paths written."""
    settings = settings or Settings()
    results = normalise(results)
    plt = require_matplotlib() if settings.plots else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = slugify(name) if name else report_stem(results["environment"])
    if not stem:
        raise ReportError(f"--name {name!r} has no letters or digits to name files with")
    text, plan = render(results, out, stem, settings, command=command,
                        source=str(source) if source else None, generated_by=generated_by)
    written: list[Path] = []
    env = results["environment"]
    suffix = f" — {env.get('gpu') or NA}, {date_key(env.get('date')) or env.get('date') or 'undated'}"
    if plt is not None:
        for op, (png, sec) in plan["bars"].items():
            plot_bars(plt, png, sec, f"{op}: TFLOPS per shape{suffix}")
            written.append(png)
        if plan["roofline"]:
            png, secs = plan["roofline"]
            plot_roofline(plt, png, secs, plan["bandwidth"], plan["bw_source"], settings, f"Roofline{suffix}")
            written.append(png)
        if plan["quantize"]:
            png, rows, copy = plan["quantize"]
            plot_quantize(plt, png, rows, copy, f"FP8 quantize: GB/s{suffix}")
            written.append(png)
    md = out / f"{stem}.md"
    md.write_text(text)
    written.insert(0, md)
    latest = write_latest(out)
    if latest:
        written.append(latest)
    return written


__all__ = [
    "BF16_PEAK_TFLOPS",
    "FP8_PEAK_TFLOPS",
    "NOMINAL_HBM_GBS",
    "ReportError",
    "Settings",
    "geomean",
    "load_results",
    "normalise",
    "render",
    "report_stem",
    "require_matplotlib",
    "write_latest",
    "write_report",
]
