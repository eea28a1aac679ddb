"""CPU tier: the analytic kernel choice against every default GEMM kernel's time measured on an H200.

tests/data/2026-12-02-h200-fp8-kernel-timings.json holds, per problem shape, the kernel duration of
every default `fp8_gemm_nt` kernel (split-K kernels at 2-12 splits under "fp8_gemm_nt_split_k",
keyed NAME@SPLITS; the M = 4096 shapes re-measured on 2026-12-02 after static-stage rounds,
`cutegen tune --timings-out`, the M = 64 and 128 shapes on 2026-12-01),
tests/data/2026-12-05-h200-bf16-kernel-timings.json those of the `bf16_gemm_nt` kernels (bf16 D;
tests/data/2026-12-06-h100-bf16-kernel-timings.json on an H100, 192-row tiles included, and
tests/data/2026-12-07-h100-bf16-split-k-shared-b-timings.json the split-K ones at small M),
tests/data/2026-12-02-h200-contiguous-kernel-timings.json those of the contiguous M-grouped
kernels (with each problem's group sizes and DeepGEMM's kernel beside them), and
tests/data/2026-12-02-h200-wgrad-kernel-timings.json those of the weight-gradient ops (the dense
kernels timed in interleaved rounds with DeepGEMM's 1D1D kernel; the k-grouped ones by `cutegen
tune --timings-out`, where a shape M,N,K is 4 groups of K tokens, re-measured on 2026-12-02 with
the 128x160 tile, best of four rounds; all with static-stage rounds where the schedule has
them). The heuristic only sees the kernels' names (tile, cluster, multicast), so this pins how
far its choice may fall behind the fastest kernel measured, shape by shape, with no GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from cutegen.runtime import heuristics
from cutegen.runtime.grouped_ops import contiguous_alignment
from cutegen.runtime.params import align
from cutegen.runtime.manifest import GridRule, KernelManifest, OperandSpec, Param
from cutegen.schedules import parse_name

DATA = Path(__file__).resolve().parents[1] / "data"
TIMINGS = DATA / "2026-12-02-h200-fp8-kernel-timings.json"
WGRAD_TIMINGS = DATA / "2026-12-02-h200-wgrad-kernel-timings.json"
CONTIGUOUS_TIMINGS = DATA / "2026-12-02-h200-contiguous-kernel-timings.json"
CONTIGUOUS_WIDE_TIMINGS = DATA / "2026-12-03-h200-contiguous-128x256-timings.json"
CONTIGUOUS_H100_TIMINGS = DATA / "2026-12-07-h100-contiguous-kernel-timings.json"
K_GROUPED_TUNE_GROUPS = 4
# The measured GPU: 132 SMs.
H200_SMS = 132


TAIL_SPLIT_PARAM = Param(10, "tail_split", 1408, 4, 4, {"kind": "scalar", "dtype": "i32", "expr": "TAIL_SPLIT"})


def manifest_from_name(name: str) -> KernelManifest:
    """The fields the heuristic reads, from a procedural kernel name."""
    s = parse_name(name)
    return KernelManifest(
        name=name,
        op=s.op.value,
        arch=s.arch.value,
        entry="kernel",
        cubin="kernel.cubin",
        sha256="0" * 64,
        block=(s.threads_per_cta, 1, 1),
        cluster=(s.cluster_m, s.cluster_n, 1),
        smem_bytes=s.smem_bytes,
        pdl=False,
        cooperative=False,
        grid=GridRule("persistent_clusters", s.tile_m, s.tile_n, s.cluster_m, s.cluster_n, *s.tile_extents),
        operands=[
            OperandSpec("a", s.a_dtype.value, ["M", "K"], 1, 16),
            OperandSpec("sfa", "f32", ["M", "KB"], 0, 16),
            OperandSpec("b", s.b_dtype.value, ["N", "K"], 1, 16),
            OperandSpec("sfb", "f32", ["N", "KB"] if s.op.scales_b_per_row else ["NB", "KB"], 1, 4),
            OperandSpec("d", s.c_dtype.value, ["M", "N"], 1, 16),
        ],
        # The dense weight gradient's tail-split switch, which the model reads off the params.
        params=[TAIL_SPLIT_PARAM] if s.op.splits_last_wave else [],
        schedule=s.to_dict(),
        toolchain={},
        facts=s.facts(),
    )


def split_k_manifest_from_name(name: str) -> KernelManifest:
    """A split-K kernel's fields the heuristic reads (its grid rule is a `blocks` rule)."""
    plain = manifest_from_name(name)
    return dataclasses.replace(plain, grid=dataclasses.replace(plain.grid, kind="blocks", blocks=["1", "1", "1"]))


def measured_time(per_shape: dict, split_per_shape: dict, score: heuristics.Score) -> float:
    """The measured time of a scored choice: a split-K kernel at the model's split count (the
    nearest count measured, which were 2, 3, 4, 6, 8 and 12)."""
    if score.name in per_shape:
        return per_shape[score.name]
    counts = [int(key.split("@")[1]) for key in split_per_shape if key.split("@")[0] == score.name]
    nearest = min(counts, key=lambda c: (abs(c - score.k_splits), c))
    return split_per_shape[f"{score.name}@{nearest}"]


def dense_regrets(op: str, path: Path) -> tuple[dict[str, float], float]:
    """Per shape of a `cutegen tune --timings-out` file (plain and split-K kernels of a dense op):
    the measured time of the heuristic's choice over the fastest measured; and their geometric mean."""
    data = json.loads(path.read_text())
    timings, split_timings = data[op], data[f"{op}_split_k"]
    names = sorted({name for per_shape in timings.values() for name in per_shape})
    split_names = sorted({key.split("@")[0] for per_shape in split_timings.values() for key in per_shape})
    candidates = [manifest_from_name(n) for n in names] + [split_k_manifest_from_name(n) for n in split_names]
    regrets = {}
    for key, per_shape in timings.items():
        m, n, k = map(int, key.split(","))
        best = heuristics.explain(op, candidates, m, n, k, H200_SMS, tuning={})[0]
        fastest = min(min(per_shape.values()), min(split_timings[key].values()))
        regrets[key] = measured_time(per_shape, split_timings[key], best) / fastest
    return regrets, math.exp(sum(math.log(r) for r in regrets.values()) / len(regrets))


def test_fp8_choice_stays_close_to_the_fastest_measured_kernel():
    regrets, geomean = dense_regrets("fp8_gemm_nt", TIMINGS)
    worst = max(regrets, key=regrets.get)
    # Measured with the model of this commit over the 21 DeepGEMM shapes and the three N = 576,
    # K = 7168 ones (kernel durations of every kernel, split-K ones at 2-12 splits, re-measured on
    # 2026-12-01 after the loads of streamed B became evict-first, the M = 4096 shapes again on
    # 2026-12-02 after static-stage rounds, every M = 4096 choice within 1.009x of the fastest;
    # the latency floor, split_fixup_s and the two-block factor fitted on earlier builds'
    # timings; the smaller tile first in latency-bound ties): geometric mean 1.012, worst
    # 1.076 (64x7168x16384: 64x128 in two splits chosen, 64x64 in a 1x2 cluster unsplit fastest).
    # Without the ring's SFB factor the model kept 128x112 at 4096x2112x7168, 1.12x the fastest.
    assert regrets[worst] < 1.12, f"{worst}: the chosen kernel is {regrets[worst]:.2f}x the fastest"
    assert geomean < 1.03, f"geometric-mean slowdown {geomean:.3f} over {len(regrets)} shapes"
    # The M = 4096 shapes, re-measured after static-stage rounds: every choice within 1.01x.
    m4096 = {key: r for key, r in regrets.items() if key.startswith("4096,")}
    assert len(m4096) == 8 and max(m4096.values()) < 1.01, m4096
    # One latency-bound wave: the smaller tile wins the tie (64x64 in a 1x2 cluster, 1.10x faster
    # than the 64x128 tile the larger-tile preference chose).
    assert regrets["64,7168,576"] < 1.01, regrets["64,7168,576"]
    # A compute-bound shape where the accumulator ring's per-block SFB loads decide: 128x192 (SFB
    # in registers) against 128x112 (a two-accumulator ring), which the model otherwise scores alike.
    assert regrets["4096,2112,7168"] < 1.02, regrets["4096,2112,7168"]


BF16_TIMINGS = DATA / "2026-12-05-h200-bf16-kernel-timings.json"


def bf16_regrets_within(path: Path, geomean_below: float, worst_below: float) -> dict[str, float]:
    """`dense_regrets` of the BF16 GEMM on a timings file, their geometric mean and worst checked."""
    regrets, geomean = dense_regrets("bf16_gemm_nt", path)
    worst = max(regrets, key=regrets.get)
    assert geomean < geomean_below, f"geometric-mean slowdown {geomean:.3f} over {len(regrets)} shapes"
    assert regrets[worst] < worst_below, f"{worst}: the chosen kernel is {regrets[worst]:.2f}x the fastest"
    return regrets


def test_bf16_choice_stays_close_to_the_fastest_measured_kernel():
    """`bf16_gemm_nt` (bf16 D, K-major operands) on the BF16 benchmark's 66 dense shapes (M = 1 to
    8192; N, K of DeepSeek-V3 and Qwen3 layers): every kernel's duration on an H200 on 2026-12-05
    (`cutegen tune --timings-out`; split-K kernels at 2-12 splits), tile widths 96-224 included."""
    # Measured with the model of this commit: geometric mean 1.015; worst 1.17 (128x2112x7168:
    # 128x128 split seven ways chosen, 64x64 split two ways fastest). Before compute-bound ties
    # went to more math warpgroups: 1.020 and 1.29 (256x7168x2048: 64x256 of one warpgroup chosen).
    regrets = bf16_regrets_within(BF16_TIMINGS, geomean_below=1.02, worst_below=1.2)
    # Tiles of one area tied by the model: 128x128 of two math warpgroups, not 64x256 of one.
    for key in ("256,7168,2048", "512,4096,7168"):
        assert regrets[key] < 1.01, (key, regrets[key])
    # Among those, one wave of 1x1 clusters at M = 333, not 2x1 ones with a fourth tile row idle
    # (128x128 in 2x1 clusters ran 1.30x the time of the 1x1 twin there).
    assert regrets["333,4096,7168"] < 1.05, regrets["333,4096,7168"]
    # Where the catalogue had no kernel to fill the GPU before split K and the widths.
    for key in ("1,2112,7168", "64,2112,7168", "1024,2112,7168", "2048,2112,7168", "4096,2112,7168"):
        assert regrets[key] < 1.06, (key, regrets[key])


BF16_H100_TIMINGS = DATA / "2026-12-06-h100-bf16-kernel-timings.json"


def test_bf16_choice_on_an_h100_with_the_192_row_tiles():
    """The same 66 shapes on an H100 on 2026-12-06 (`cutegen tune --timings-out`), with the
    last-wave split kernels, the 192-row tiles of three math warpgroups and the 128-row tiles 64,
    80 and 112 wide in the catalogue."""
    # Measured with the model of this commit: geometric mean 1.021 (1.023 before compute-bound
    # ties went to more math warpgroups, 1.027 before split K was held to one wave of units,
    # `heuristics.SPLIT_MAX_WAVES`); worst 1.24 (128x2112x7168: 128x128 split seven ways chosen,
    # 64x64 split two ways fastest).
    regrets = bf16_regrets_within(BF16_H100_TIMINGS, geomean_below=1.025, worst_below=1.3)
    # 128x128 of two math warpgroups, not 64x256 of one (1.12x before).
    assert regrets["512,4096,7168"] < 1.01, regrets["512,4096,7168"]
    # Where a 192-row tile is the fastest kernel by 1.14-1.33x, the model picks it: M = 333 in two
    # tile rows filling whole waves, and 2048x2112 in one wave; and the narrow widths' whole waves.
    for key in ("333,12288,5120", "333,24576,1536", "333,7168,2048", "2048,2112,7168", "512,2112,7168"):
        assert regrets[key] < 1.02, (key, regrets[key])
    # Two waves of split-K units (1.35x the fastest before SPLIT_MAX_WAVES) are no candidate.
    assert regrets["256,5120,25600"] < 1.05, regrets["256,5120,25600"]


BF16_SHARED_B_TIMINGS = DATA / "2026-12-07-h100-bf16-split-k-shared-b-timings.json"


def test_bf16_split_k_in_clusters_sharing_b():
    """Small M on an H100 on 2026-12-07 (a `.scratch`-style sweep, kernel durations, medians of three
    interleaved rounds; torch.matmul beside them): the split-K kernels of every cluster shape, the
    2x1 ones sharing B among them, at 2, 3, 4 and 6 splits, and the 64x128 tile unsplit."""
    regrets, geomean = dense_regrets("bf16_gemm_nt", BF16_SHARED_B_TIMINGS)
    # Measured with the model of this commit: geometric mean 1.039; worst 1.14 (96x4096x7168 and
    # 128x4096x7168: 128x128 split four ways chosen, 32.1-32.4 µs, against 28.5 for 64x128 split two
    # ways in a 2x1 cluster; NOTES N106 has the model terms tried there).
    assert geomean < 1.045, geomean
    assert max(regrets.values()) < 1.15, regrets
    # Two tile rows at M = 256: of the 128x128 split kernels the model ties, the 2x1 cluster.
    for key in ("256,4096,7168", "256,2112,7168"):
        assert regrets[key] < 1.01, (key, regrets[key])
    # At M = 128 a 2x1 cluster of 64-row tiles (18.6 µs, against 21.5 for 128x128 split four ways).
    assert regrets["128,2112,7168"] < 1.05, regrets["128,2112,7168"]


def regrets_of(op: str, timings: dict, rows_scale: int = 1) -> dict[str, float]:
    names = sorted({name for per_shape in timings.values() for name in per_shape})
    candidates = [manifest_from_name(n) for n in names]
    regrets = {}
    for key, per_shape in timings.items():
        m, n, k = map(int, key.split(","))
        # The runtime asks for a k-grouped problem as its groups' rows stacked (see k_grouped_ops).
        chosen = heuristics.choose(op, candidates, m * rows_scale, n, k, H200_SMS, tuning={})
        regrets[key] = per_shape[chosen.name] / min(per_shape.values())
    return regrets


def test_weight_gradient_choice_stays_close_to_the_fastest_measured_kernel():
    timings = json.loads(WGRAD_TIMINGS.read_text())
    for op, scale in (("fp8_wgrad_gemm_nt", 1), ("k_grouped_fp8_gemm_nt_contiguous", K_GROUPED_TUNE_GROUPS)):
        regrets = regrets_of(op, timings[op], scale)
        worst = max(regrets, key=regrets.get)
        geomean = math.exp(sum(math.log(r) for r in regrets.values()) / len(regrets))
        # Measured with the model of this commit (per-row-scale factors fitted on earlier dense
        # timings, unchanged since the 160- and 176-wide tiles joined) on the timings of
        # 2026-12-02: dense 1.011 geometric mean, worst 1.021 (512x32768x4096 and 2048x7168x4096:
        # 128x176 and 128x160 in 2x1 clusters chosen, 128x128 and 128x176 fastest); k-grouped
        # 1.002, worst 1.006 (7168x4096, 4 x 8192 tokens: 128x128 chosen, 128x160 fastest, both
        # in 2x1 clusters).
        assert regrets[worst] < 1.06, f"{op} {worst}: the chosen kernel is {regrets[worst]:.2f}x the fastest"
        assert geomean < 1.02, f"{op}: geometric-mean slowdown {geomean:.3f} over {len(regrets)} shapes"


def _padded_rows(sizes: list[int]) -> int:
    """Rows of a contiguous A whose groups have `sizes` rows, each segment padded to the alignment."""
    return sum(align(size, contiguous_alignment()) for size in sizes)


def test_contiguous_choice_stays_close_to_the_fastest_measured_kernel():
    """DeepGEMM's six contiguous shapes (groups of 0.7-1.3x the expected rows, each segment
    padded to 128): the choice for the padded rows against every contiguous kernel's duration."""
    op = "m_grouped_fp8_gemm_nt_contiguous"
    problems = json.loads(CONTIGUOUS_TIMINGS.read_text())[op]
    regrets = {}
    for key, problem in problems.items():
        _, _, n, k = map(int, key.split(","))
        times = problem["times"]
        rows = _padded_rows(problem["sizes"])
        candidates = [manifest_from_name(name) for name in times]
        chosen = heuristics.choose(op, candidates, rows, n, k, H200_SMS, tuning={})
        regrets[key] = times[chosen.name] / min(times.values())
    worst = max(regrets, key=regrets.get)
    geomean = math.exp(sum(math.log(r) for r in regrets.values()) / len(regrets))
    # Measured with the model of this commit (grouped_tile_overhead_s fitted on earlier timings;
    # these, of 2026-12-02, with each tile's group prefetched into L1): geometric mean 1.001,
    # worst 1.006 (32 x ~256 rows, N 4096, K 7168: 128x192 in a 2x1 cluster chosen, in a 1x2
    # cluster fastest).
    assert regrets[worst] < 1.03, f"{worst}: the chosen kernel is {regrets[worst]:.2f}x the fastest"
    assert geomean < 1.01, f"geometric-mean slowdown {geomean:.3f} over {len(regrets)} shapes"


def test_contiguous_choice_between_the_192_and_256_wide_tiles():
    """The two 2x1 contiguous kernels of the catalogue, 128x192 and 128x256 (two column waves),
    timed on DeepGEMM's six shapes on an H200 (2026-12-03, best of three rounds; the file also
    holds two three-stage 128x256 builds that were not kept) and an H100 (2026-12-07, with every
    other contiguous kernel): the model picks 128x192 at K 2048 (N 7168), where 128x256 ran
    0.99-1.01x its time on the H200 and 1.02-1.04x on the H100, and 128x256 at K 7168, where it
    ran up to 1.07x faster; at most 1.03x slower than the faster of the two (4 x ~8192, N 4096,
    K 7168 on the H100, where the two ran 0.99x and 1.01x each other's time on two allocations)."""
    op = "m_grouped_fp8_gemm_nt_contiguous"
    for path in (CONTIGUOUS_WIDE_TIMINGS, CONTIGUOUS_H100_TIMINGS):
        problems = json.loads(path.read_text())[op]
        regrets = {}
        for key, problem in problems.items():
            _, _, n, k = map(int, key.split(","))
            times = {name: t for name, t in problem["times"].items() if "_c2x1_mcb_s4_" in name}
            assert len(times) == 2, sorted(problem["times"])
            candidates = [manifest_from_name(name) for name in times]
            chosen = heuristics.choose(op, candidates, _padded_rows(problem["sizes"]), n, k, H200_SMS, tuning={})
            assert ("_128x192x128_" if k <= 2048 else "_128x256x128_") in chosen.name, (path.name, key)
            regrets[key] = times[chosen.name] / min(times.values())
        assert max(regrets.values()) < 1.03, (path.name, regrets)


def test_contiguous_choice_on_an_h100():
    """Every contiguous kernel on DeepGEMM's six shapes on an H100 (2026-12-07): the choice ran
    1.004x the time of the fastest kernel over the six (geometric mean), 1.024x at worst; with the
    model before its column-wave term (and a 6 µs tile overhead) 1.016x, 128x256 at K 2048
    1.02-1.03x slower than 128x192."""
    op = "m_grouped_fp8_gemm_nt_contiguous"
    problems = json.loads(CONTIGUOUS_H100_TIMINGS.read_text())[op]
    logs = []
    for key, problem in problems.items():
        _, _, n, k = map(int, key.split(","))
        times = problem["times"]
        candidates = [manifest_from_name(name) for name in times]
        chosen = heuristics.choose(op, candidates, _padded_rows(problem["sizes"]), n, k, H200_SMS, tuning={})
        regret = times[chosen.name] / min(times.values())
        assert regret < 1.03, (key, chosen.name, regret)
        logs.append(math.log(regret))
    assert math.exp(sum(logs) / len(logs)) < 1.006


MASKED_KERNELS = [
    f"cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_{tile}_{cluster}_wg{wg}_r40x232_epitma_rm_g1"
    for tile, wg, stages in (("64x128x128", 1, 8), ("128x192x128", 2, 4), ("256x128x128", 2, 3))
    for cluster in (f"c1x1_mc0_s{stages}", f"c1x2_mca_s{stages}")
]
# The shipped masked FP8 kernels: MASKED_KERNELS and their last-wave split twins.
MASKED_SHIPPED = frozenset(MASKED_KERNELS) | {
    n.replace("_epitma_", "_episkw_") for n in MASKED_KERNELS if "_64x128x128_" not in n
}


def test_masked_choice_pads_each_group_to_the_tile():
    """A masked problem is G groups of about expected_m rows, each padded to the tile height:
    measured on an H200, 256-row tiles are the fastest for full groups of 256-1024 rows, while
    groups of 20 rows would waste 92% of a 256-row tile (seen as 640 stacked rows, they would get a
    tile taller than 64). Where groups may hold more rows than expected (max_m 4096, DeepGEMM's
    conditions), the 256-row tile that fills one wave at the expected rows runs a second, nearly
    empty wave at 1.2x of them: 128x192 tiles are chosen, which ran 1.01-1.17x faster than 256x128 over eight draws of
    each of DeepGEMM's six masked problems on an H100 (NOTES N88)."""
    candidates = [manifest_from_name(n) for n in MASKED_KERNELS]

    def tile_m(groups: int, rows: int, n: int, k: int, **kw) -> int:
        chosen = heuristics.choose(
            "m_grouped_fp8_gemm_nt_masked", candidates, groups * rows, n, k, H200_SMS, tuning={}, **kw
        )
        return chosen.grid.tile_m

    for groups, rows in ((1, 1024), (2, 512), (4, 256)):
        assert tile_m(groups, rows, 7168, 2048, rows_per_group=rows, max_rows_per_group=rows) == 256
        for n, k in ((4096, 7168), (7168, 2048)):
            chosen = heuristics.choose("m_grouped_fp8_gemm_nt_masked", candidates, groups * rows, n, k, H200_SMS,
                                       tuning={}, rows_per_group=rows, max_rows_per_group=4096)
            assert (chosen.grid.tile_m, chosen.grid.tile_n) == (128, 192)
    assert tile_m(32, 20, 4096, 7168, rows_per_group=20) == 64
    assert tile_m(8, 100, 4096, 7168, rows_per_group=100) <= 128
    assert tile_m(32, 20, 4096, 7168) > 64  # stacked rows: the case rows_per_group exists for


FP8_MASKED_TIMINGS = DATA / "2026-12-07-h100-fp8-masked-kernel-timings.json"


def test_masked_clusters_two_tiles_tall_pad_each_group_to_the_cluster():
    """In 2x1 clusters the masked walk gives a cluster's two tile rows to one group, so each group
    pads its rows to 2 · tile_m: 2 groups of 300 rows in 128x256 tiles are 2 · ⌈300 / 256⌉
    cluster rows of 16 cluster tiles, not ⌈2 · ⌈300 / 128⌉ / 2⌉ = 3 rows of them."""
    c2x1 = manifest_from_name(
        "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_128x256x128_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g1")
    s = heuristics.score(c2x1, 2 * 300, 4096, 7168, H200_SMS, heuristics.DEFAULT_MODEL, 300, 300)
    assert (s.cluster_tiles, s.tiles) == (2 * 2 * 16, 2 * 4 * 16)
    c1x1 = manifest_from_name(
        "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_128x256x128_c1x1_mc0_s4_wg2_r40x232_epitma_rm_g1")
    s = heuristics.score(c1x1, 2 * 300, 4096, 7168, H200_SMS, heuristics.DEFAULT_MODEL, 300, 300)
    assert (s.cluster_tiles, s.tiles) == (2 * 3 * 16, 2 * 3 * 16)


def test_masked_fp8_choice_over_ragged_draws():
    """DeepGEMM's six masked problems, four draws of masked_m (0.7-1.3x expected, max_m 4096) and
    full groups, every masked FP8 kernel timed beside DeepGEMM's (an H100): the choice among the
    shipped kernels ran 1.055x the time of the fastest of them over the 30 draws (geometric mean),
    1.27x at worst (2 x 512 at N 4096, where 256-row tiles fill one wave and the choice, made for
    up to 1.3x the expected rows, is 128x192 split over its last wave). Even the fastest of the 22
    timed kernels on each draw, chosen after the fact, is 1.04x DeepGEMM's kernel (NOTES N108)."""
    data = json.loads(FP8_MASKED_TIMINGS.read_text())
    shipped = [manifest_from_name(n) for n in data["kernels"] if n in MASKED_SHIPPED]
    assert len(shipped) == len(MASKED_SHIPPED)
    logs = []
    for d in data["draws"]:
        chosen = heuristics.choose("m_grouped_fp8_gemm_nt_masked", shipped, d["groups"] * d["expected_m"], d["n"],
                                   d["k"], H200_SMS, tuning={}, rows_per_group=d["expected_m"],
                                   max_rows_per_group=data["max_m"])
        regret = d["us"][chosen.name] / min(d["us"][c.name] for c in shipped)
        assert regret < 1.28, (d["groups"], d["masked_m"], d["n"], d["k"], chosen.name, regret)
        logs.append(math.log(regret))
    assert math.exp(sum(logs) / len(logs)) < 1.06


SWIGLU_MASKED_KERNELS = [
    f"cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_e4m3_f32_sff32_{tile}_r40x232_epitma_rn_g1_swiglu"
    for tile in ("128x256x128_c1x1_mc0_s4_wg2", "128x256x128_c1x2_mca_s4_wg2", "64x256x128_c1x1_mc0_s5_wg1")
]


def test_masked_swiglu_choice_takes_64_row_tiles_for_groups_of_a_few_dozen_rows():
    """32 groups of ~16 rows (max_m 256) take the 64-row SwiGLU tiles, which ran 1.04-1.08x
    faster than the 128-row ones on an H100 (DeepSeek-V3, Qwen3-235B and Qwen3-30B up-projections,
    two sweeps, 2026-12-05, NOTES N89); 8 groups of ~128 keep 128 rows (at Qwen3-235B's N 3072,
    K 4096 the 64-row tile ran 1.26-1.34x faster there, which the spread model misses: NOTES N89)."""
    candidates = [manifest_from_name(n) for n in SWIGLU_MASKED_KERNELS]

    def tile_m(groups: int, rows: int, n: int, k: int) -> int:
        chosen = heuristics.choose("m_grouped_fp8_gemm_nt_masked", candidates, groups * rows, n, k, H200_SMS,
                                   tuning={}, rows_per_group=rows, max_rows_per_group=256)
        return chosen.grid.tile_m

    for n, k in ((4096, 7168), (3072, 4096), (1536, 2048)):
        assert tile_m(32, 16, n, k) == 64
        assert tile_m(8, 128, n, k) == 128

def test_whole_tile_twins_rank_by_k():
    """A 256-row kernel that stages its whole output tile (epilogue tma_store_per_warpgroup, or
    tma_store_whole_tile) ranks before its ring twin where K has at most `whole_tile_max_k_blocks`
    blocks, after it above; a single-wave tile with per-warpgroup stores has no such factor."""
    ring = manifest_from_name("cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c1x2_mca_s3_wg2_r40x232_epitma_rm_g8")
    limit = heuristics.DEFAULT_MODEL.whole_tile_max_k_blocks * 128
    for tag in ("epiwg", "epitmaw"):
        whole = manifest_from_name(f"cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c1x2_mca_s3_wg2_r40x232_{tag}_rm_g8")
        for k in (512, 1536, limit):
            best = heuristics.explain("fp8_gemm_nt", [ring, whole], 4096, 32768, k, H200_SMS, tuning={})[0]
            assert best.name == whole.name, k
        for k in (limit + 128, 7168, 16384):
            best = heuristics.explain("fp8_gemm_nt", [ring, whole], 4096, 7168, k, H200_SMS, tuning={})[0]
            assert best.name == ring.name, k
    single = manifest_from_name("cutegen_sm90a_mgfp8gemmc_e4m3_e4m3_bf16_f32_sff32_128x192x128_c1x1_mc0_s4_wg2_r40x232_epiwg_rm_g8")
    assert not heuristics._whole_tile_epilogue(single)


def test_ties_go_to_the_multicast_of_the_larger_operand():
    """Between clusters the model scores alike, where memory or latency bounds the tile, the one
    multicasting the operand with more bytes in all (B, 2x1 clusters, where N >= M); where compute
    does, the one multicasting the larger of the tile's boxes: A for 256x128 tiles (1x2 measured
    faster at 4096x7168x16384), B for 128x192 ones (2x1 measured faster at every dense M = 4096
    shape and five of DeepGEMM's six contiguous ones)."""
    def pair(tile: str, stages: int, wg: int, kind: str = "fp8gemm", epilogue: str = "epitma") -> list[KernelManifest]:
        return [
            manifest_from_name(f"cutegen_sm90a_{kind}_e4m3_e4m3_bf16_f32_sff32_{tile}x128_{c}_s{stages}_wg{wg}_r40x232_{epilogue}_rm_g8")
            for c in ("c1x2_mca", "c2x1_mcb")
        ]
    small_m = heuristics.explain("fp8_gemm_nt", pair("64x64", 12, 1), 128, 4096, 7168, H200_SMS, tuning={})
    assert "_c2x1_mcb_" in small_m[0].name and small_m[0].shares_larger_operand
    large_m = heuristics.explain("fp8_gemm_nt", pair("256x128", 3, 2), 4096, 7168, 16384, H200_SMS, tuning={})
    assert "_c1x2_mca_" in large_m[0].name and not large_m[0].shares_larger_operand
    assert large_m[0].compute_bound and large_m[0].multicasts_larger_box
    wide = heuristics.explain("fp8_gemm_nt", pair("128x192", 4, 2), 4096, 2112, 7168, H200_SMS, tuning={})
    assert "_c2x1_mcb_" in wide[0].name and wide[0].compute_bound and wide[0].multicasts_larger_box
    contiguous = heuristics.explain(
        "m_grouped_fp8_gemm_nt_contiguous", pair("128x192", 4, 2, "mgfp8gemmc", "epiwg"), 33536, 4096, 7168,
        H200_SMS, tuning={},
    )
    assert "_c2x1_mcb_" in contiguous[0].name


def test_the_heuristic_reads_facts_that_every_manifest_records():
    """Every fact the heuristic reads is one the generator records (`spec.FACTS`), and a manifest
    without one is refused with the fact's name, never scored on a guess."""
    import re

    from cutegen.runtime.manifest import ManifestError
    from cutegen.schedules.spec import FACTS

    read = set(re.findall(r'fact\("(\w+)"\)', Path(heuristics.__file__).read_text()))
    assert read and read <= set(FACTS), read - set(FACTS)
    name = "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x1_mc0_s5_wg2_r40x232_epitma_rm_g8"
    bare = dataclasses.replace(manifest_from_name(name), facts={})
    with pytest.raises(ManifestError, match="records no fact 'splits_k'"):
        heuristics.score(bare, 128, 4096, 7168)


def test_tail_split_rule_mirrors_the_kernels():
    """The heuristic's copy of the kernels' tail-split rule: same constants, and the cases that
    decided them (66 clusters of two CTAs, 132 of one)."""
    from cutegen.schedules import spec

    assert heuristics.TAIL_SPLIT_MAX_FILL == spec.TAIL_SPLIT_MAX_FILL
    assert heuristics.TAIL_SPLIT_MIN_SAVED_BLOCKS == spec.TAIL_SPLIT_MIN_SAVED_BLOCKS
    assert heuristics.tail_split_pays(14, 66, 4096)  # 7168x2112, 128x128 2x1: 1.07x split
    assert heuristics.tail_split_pays(52, 66, 8192)
    assert not heuristics.tail_split_pays(52, 66, 4096)  # spares 6.8 blocks of 32
    assert not heuristics.tail_split_pays(62, 66, 16384)  # the wave is 94% full
    assert not heuristics.tail_split_pays(64, 132, 512)  # 1000x1000x512: 0.84x split
    assert not heuristics.tail_split_pays(0, 66, 4096)  # no partial wave


BF16_MASKED_TIMINGS = DATA / "2026-12-06-h100-bf16-masked-kernel-timings.json"
# The shipped masked BF16 kernels as timed: 128x256 walking each group down its columns of tiles;
# 64x128 timed walking along N, which is the same tiles in the same order wherever a group holds
# one tile row (where that tile is the fastest).
BF16_MASKED_KERNELS = [
    f"cutegen_sm90a_mgbf16gemmm_bf16_bf16_bf16_f32_nosf_{tile}_{raster}_g1"
    for tile, raster in (
        ("64x128x64_c1x1_mc0_s8_wg1_r40x232", "epitma_rn"), ("64x128x64_c1x2_mca_s8_wg1_r40x232", "epitma_rn"),
        ("128x256x64_c1x1_mc0_s4_wg2_r40x232", "epitma_rm"), ("128x256x64_c1x2_mca_s4_wg2_r40x232", "epitma_rm"),
    )
]


def test_masked_bf16_choice_stays_close_to_the_fastest_measured_kernel():
    """The BF16 bench's 16 masked problems, three draws of masked_m each (an H100): the choice
    among the shipped kernels ran within 1.07x of the fastest of them on every draw, 1.01x over
    all (geometric mean). 128x128 tiles, which the model scored within 2% of 128x256 at groups of
    ~1024 rows and which ran 1.15-1.4x slower there, are not built."""
    problems = json.loads(BF16_MASKED_TIMINGS.read_text())["problems"]
    candidates = [manifest_from_name(n) for n in BF16_MASKED_KERNELS]
    logs = []
    for p in problems:
        rows = p["expected_m"]
        chosen = heuristics.choose("m_grouped_bf16_gemm_nt_masked", candidates, p["groups"] * rows, p["n"], p["k"],
                                   H200_SMS, tuning={}, rows_per_group=rows, max_rows_per_group=4096)
        regret = p["us"][chosen.name] / min(p["us"][n] for n in BF16_MASKED_KERNELS)
        assert regret < 1.07, (p["groups"], rows, p["n"], p["k"], chosen.name, regret)
        logs.append(math.log(regret))
    assert math.exp(sum(logs) / len(logs)) < 1.01


BF16_SWAPPED_TIMINGS = DATA / "2026-12-06-h100-bf16-swapped-kernel-timings.json"
# The shipped kernels with swapped operand roles (hopper_bf16_gemm_swapped_roles*).
SHIPPED_SWAPPED = ("_64x112x64_", "_128x112x64_", "_192x176x64_")
# Where they ran faster than every other kernel: M = 333 at all N, K but 7168, 2048 (whose
# 192x112 row tiles already fill one wave).
SWAPPED_WIN = {(333, 2112, 7168), (333, 24576, 1536), (333, 4096, 7168), (333, 12288, 5120), (333, 5120, 25600)}


def test_bf16_swapped_roles_chosen_where_m_fits_their_columns():
    """20 BF16 shapes near the 0.95x floor (an H100): beside the other bf16-D kernels, the shipped
    kernels with swapped operand roles are chosen at five of the six M = 333 shapes (three 112-wide
    or two 176-wide tiles along M, where row tiles compute 384 rows) and nowhere else; there the choice
    ran within 1.03x of the fastest shipped kernel and 1.02-1.11x faster than the choice without them."""
    shapes = json.loads(BF16_SWAPPED_TIMINGS.read_text())["shapes"]
    for p in shapes:
        names = [n for n in p["us"] if n.startswith("cutegen_") and
                 (not n.endswith("_swapab") or any(t in n for t in SHIPPED_SWAPPED))]
        plain = [n for n in names if not n.endswith("_swapab")]
        chosen = heuristics.choose("bf16_gemm_nt", [manifest_from_name(n) for n in names], p["m"], p["n"], p["k"],
                                   H200_SMS, tuning={})
        win = (p["m"], p["n"], p["k"]) in SWAPPED_WIN
        assert chosen.name.endswith("_swapab") == win, (p["m"], p["n"], p["k"], chosen.name)
        if win:
            without = heuristics.choose("bf16_gemm_nt", [manifest_from_name(n) for n in plain], p["m"], p["n"],
                                        p["k"], H200_SMS, tuning={})
            assert p["us"][chosen.name] <= 1.03 * min(p["us"][n] for n in names), (p["n"], p["k"], chosen.name)
            assert p["us"][without.name] >= 1.02 * p["us"][chosen.name], (p["n"], p["k"], without.name)


BF16_FORMS_TIMINGS = DATA / "2026-12-07-h100-bf16-mn-major-and-adding-timings.json"


def test_bf16_mn_major_and_adding_choices():
    """DeepGEMM's BF16 test shapes on an H100 on 2026-12-07 (kernel durations after an L2 flush):
    MN-major operands (nn, tn; bf16 D, fp32 D added into) and D = C + A·Bᵀ at small M, every
    catalogue kernel of each call's layout, D type and epilogue kind, split-K ones at 2-8 splits
    (the adding ones at the runtime's count for each). Kernels the file times that the catalogue
    does not build (MN-major widths 144 and 176, 192-row MN-major tiles) are left out."""
    from cutegen.runtime.manifest import adds_into_d
    from cutegen.schedules import default_schedules, procedural_name

    built = {procedural_name(s) for s in default_schedules(arch="sm_90a", op="bf16_gemm_nt")}
    data = json.loads(BF16_FORMS_TIMINGS.read_text())["bf16_gemm_nt"]
    regrets = {}
    for key, entry in data.items():
        m, n, k, layout, d, adds = key.split(",")
        times = {name: t for name, t in entry["kernels"].items() if name.split("@")[0] in built}
        names = sorted({name.split("@")[0] for name in times})
        candidates = [split_k_manifest_from_name(x) if "_episk" in x else manifest_from_name(x) for x in names]
        candidates = [c for c in candidates if c.schedule.get("layout", "nt") == layout
                      and c.schedule["c_dtype"] == d and adds_into_d(c.schedule) == (adds == "1")]
        best = heuristics.explain("bf16_gemm_nt", candidates, int(m), int(n), int(k), H200_SMS, tuning={})[0]
        plain = {x: t for x, t in times.items() if "@" not in x}
        split = {x: t for x, t in times.items() if "@" in x}
        regrets[key] = measured_time(plain, split, best) / min(times.values())
    geomean = math.exp(sum(math.log(r) for r in regrets.values()) / len(regrets))
    # Measured with the model of this commit: geometric mean 1.023; worst 1.14 at 24576x4096x1536
    # tn (128x128 in a 2x1 cluster chosen, 470 µs, against 414 for 128x192), and 1.14 at
    # 128x4096x7168 with C (128x128 split four ways, 31.6 µs, against 27.9 for 64x128 split in a
    # 2x1 cluster: the storing kernels' miss, NOTES N106).
    assert geomean < 1.04, (geomean, regrets)
    assert max(regrets.values()) < 1.15, regrets
    # The 128x192 MN-major tiles where they fill more of their waves, in 2x1 clusters.
    for key in ("2112,4096,7168,tn,bf16,0", "2112,4096,7168,tn,f32,1", "4096,1536,24576,nn,bf16,0", "576,4096,7168,tn,f32,1"):
        assert regrets[key] < 1.01, (key, regrets[key])
