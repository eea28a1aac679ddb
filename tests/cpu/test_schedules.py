"""Schedule vocabulary: predicates, procedural names and schedule files (CPU only, fast)."""

from __future__ import annotations

import dataclasses
import math
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutegen.schedules import (
    PREDICATES,
    Arch,
    DType,
    Epilogue,
    Layout,
    Multicast,
    Op,
    Raster,
    ScaleFormat,
    Schedule,
    ScheduleError,
    ScheduleFileError,
    all_expanded,
    check,
    default_schedule_files,
    default_schedules,
    expand_family,
    is_valid,
    load_schedule_file,
    parse_name,
    predicate_results,
    procedural_name,
    violations,
)
from cutegen.schedules import predicates as preds
from cutegen.schedules.spec import (
    K_GROUPED_EARLY_COLUMNS_MIN_REGS, SCALE_BLOCK, SM90_SMEM_OPT_IN_BYTES, Activation, Bias, OperandRoles, OutputScale,
)
from schedule_files import bf16_family  # noqa: E402

# bf16_gemm_nt: bf16 or fp32 D stored by each tile, and (tma_store_add) added into D.
_BF16_TILES = (("128x128x64", 6, 2), ("128x256x64", 4, 2), ("64x128x64", 8, 1), ("64x256x64", 5, 1))
# MN-major operands (a last part naming the layout): nn, tn, tt storing bf16 at the 128-row
# tiles, and tn adding into fp32.
EXPECTED_DEFAULT_NAMES = sorted(
    [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x232_{epilogue}_rm_g8"
        for tile, stages, wg in _BF16_TILES
        for cluster in ("c1x1_mc0", "c2x1_mcb")
        for d in ("bf16", "f32")
        for epilogue in ("epitma", "epiadd")
        if epilogue == "epitma" or not tile.startswith("64x256")
    ]
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_{tile}_{cluster}_s{stages}_wg2_r40x232_{epilogue}_rm_g8_{layout}"
        for tile, stages, _ in _BF16_TILES[:2]
        for cluster in ("c1x1_mc0", "c2x1_mcb")
        for d, epilogue, layouts in (("bf16", "epitma", ("nn", "tn", "tt")), ("f32", "epiadd", ("tn",)))
        for layout in layouts
    ]
    # Tile widths between 96 and 224 columns: storing a bf16 D, and adding into a bf16 or fp32 D.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_128x{tile_n}x64_{cluster}_s{stages[d]}_wg2_r40x232_{epilogue}_rm_g8"
        for tile_n, stages in (
            (96, {"bf16": 7, "f32": 7}), (144, {"bf16": 6, "f32": 5}), (160, {"bf16": 5, "f32": 5}),
            (176, {"bf16": 5, "f32": 5}), (192, {"bf16": 4, "f32": 5}), (208, {"bf16": 4, "f32": 4}),
            (224, {"bf16": 4, "f32": 4}),
        )
        for cluster in ("c1x1_mc0", "c2x1_mcb")
        for d, epilogue in (("bf16", "epitma"), ("bf16", "epiadd"), ("f32", "epiadd"))
    ]
    # Split K for the MN-major layouts, bf16 D.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x232_episk_rm_g8_{layout}"
        for tile, stages, wg in (("128x128x64", 6, 2), ("64x128x64", 8, 1))
        for cluster in ("c1x1_mc0", "c1x2_mca")
        for layout in ("nn", "tn", "tt")
    ]
    # Split K for small M, bf16 or fp32 D, 64-row tiles of one math warpgroup and 128x128 of two.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x232_episk_rm_g8"
        for tile, stages, wg in (("128x128x64", 6, 2), ("64x128x64", 8, 1), ("64x64x64", 8, 1), ("64x32x64", 14, 1))
        for cluster in ("c1x1_mc0", "c1x2_mca")
        for d in ("bf16", "f32")
    ]
    # Split K in 2x1 clusters sharing B, bf16 D, for M of two tile rows.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_{tile}_c2x1_mcb_s{stages}_wg{wg}_r40x232_episk_rm_g8"
        for tile, stages, wg in (("128x128x64", 6, 2), ("64x128x64", 8, 1), ("64x64x64", 8, 1))
    ]
    # Split K adding into D: bf16 or fp32 D in 1x1, 1x2 and 2x1 clusters, and tokens first (tn) into fp32.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x232_episkadd_rm_g8"
        for tile, stages, wg in (("128x128x64", 6, 2), ("64x128x64", 8, 1), ("64x64x64", 8, 1))
        for cluster in ("c1x1_mc0", "c1x2_mca", "c2x1_mcb")
        for d in ("bf16", "f32")
    ]
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_f32_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x232_episkadd_rm_g8_tn"
        for tile, stages, wg in (("128x128x64", 6, 2), ("64x128x64", 8, 1))
        for cluster in ("c1x1_mc0", "c1x2_mca")
    ]
    # MN-major B in 128x192 tiles: storing a bf16 D (nn, tn) and adding into fp32 (tn).
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_{d}_f32_nosf_128x192x64_{cluster}_s{stages}_wg2_r40x232_{epilogue}_rm_g8_{layout}"
        for cluster in ("c1x1_mc0", "c2x1_mcb")
        for d, stages, epilogue, layouts in (("bf16", 4, "epitma", ("nn", "tn")), ("f32", 5, "epiadd", ("tn",)))
        for layout in layouts
    ]
    # Split K for the last, partial wave only, bf16 D, 128-row tiles 128 to 256 wide.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_{tile}_{cluster}_s{stages}_wg2_r40x232_episkw_rm_g8"
        for tile, stages in (("128x128x64", 6), ("128x192x64", 4), ("128x256x64", 4))
        for cluster in ("c1x1_mc0", "c1x2_mca")
    ]
    # 192-row tiles over three math warpgroups, bf16 D (192x192 leaves room for three stages).
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_192x{tile_n}x64_{cluster}_s{stages}_wg3_r40x152_epitma_rm_g8"
        for tile_n, stages in ((80, 5), (96, 5), (112, 5), (128, 4), (144, 4), (160, 4), (176, 4), (192, 3))
        for cluster in ("c1x1_mc0", "c2x1_mcb")
    ]
    # Narrower 128-row widths, bf16 D.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x{tile_n}x64_{cluster}_s{stages}_wg2_r40x232_epitma_rm_g8"
        for tile_n, stages in ((64, 8), (80, 8), (112, 6))
        for cluster in ("c1x1_mc0", "c2x1_mcb")
    ]
    # B's rows as the MMA's M side (swapped operand roles), bf16 D: 112 or 176 wide along M.
    + [
        f"cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_{tile}_{cluster}_s{stages}_wg{wg}_r40x{regs}_epitma_rm_g8_swapab"
        for tile, stages, wg, regs in (("64x112x64", 8, 1, 232), ("128x112x64", 6, 2, 232), ("192x176x64", 4, 3, 152))
        for cluster in ("c1x1_mc0", "c2x1_mcb")
    ]
)

BASE = Schedule(
    arch=Arch.SM90A,
    op=Op.BF16_GEMM_NT,
    a_dtype=DType.BF16,
    b_dtype=DType.BF16,
    c_dtype=DType.BF16,
    acc_dtype=DType.F32,
    scale=ScaleFormat.NONE,
    tile_m=128,
    tile_n=256,
    tile_k=64,
    cluster_m=2,
    cluster_n=1,
    multicast=Multicast.B,
    stages=4,
    math_warpgroups=2,
    producer_regs=40,
    consumer_regs=232,
    epilogue=Epilogue.TMA_STORE,
    raster=Raster.ALONG_M,
    group_size=8,
)


def bad(**changes) -> Schedule:
    return dataclasses.replace(BASE, **changes)


# ---- default schedules -------------------------------------------------------------------------


def test_base_is_valid():
    assert violations(SM100_BASE) == []
    assert violations(BASE) == []
    assert is_valid(BASE)
    assert check(BASE) is BASE


def test_default_schedules_are_valid_unique_and_expected():
    scheds = default_schedules()
    assert scheds, "no default schedules"
    for s in scheds:
        assert violations(s) == [], procedural_name(s)
    names = [procedural_name(s) for s in scheds]
    assert len(set(names)) == len(names)
    assert names == sorted(names)
    # The plain BF16 GEMMs (the fused epilogues' are `test_fused_epilogue`'s).
    bf16 = [procedural_name(s) for s in scheds if s.op == Op.BF16_GEMM_NT and not s.fused_epilogue]
    assert bf16 == EXPECTED_DEFAULT_NAMES


def test_default_files_and_filters():
    files = default_schedule_files()
    assert any(p.name == "hopper_bf16_gemm.toml" for p in files)
    bf16 = default_schedules(arch=Arch.SM90A, op=Op.BF16_GEMM_NT)
    assert len(bf16) == 190 and sum(not s.fused_epilogue for s in bf16) == 179
    assert all(s.op == Op.FP8_GEMM_NT for s in default_schedules(op="fp8_gemm_nt"))
    assert len(default_schedules(arch="sm_90a")) >= 8
    assert {s.op for s in default_schedules(arch="sm_100a")} == {
        Op.FP8_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, Op.M_GROUPED_FP8_GEMM_NT_MASKED, Op.FP8_WGRAD_GEMM_NT,
        Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS, Op.NVFP4_GEMM_NT, Op.PER_TOKEN_QUANT_FP8, Op.PER_TOKEN_QUANT_FP4,
        Op.PER_BLOCK_QUANT_FP8,
    }
    entries = all_expanded(op=Op.BF16_GEMM_NT)
    assert all(e.valid for e in entries)
    # Stages chosen by the rule, but the split-K 64x32 tiles' (14: a long K loop over few bytes).
    assert all(e.stages_auto != (e.schedule.tile_n == 32) for e in entries)
    assert {e.family for e in entries} == {
        "hopper_bf16_gemm", "hopper_bf16_gemm_f32_out", "hopper_bf16_gemm_accumulate", "hopper_bf16_gemm_mn_major",
        "hopper_bf16_gemm_mn_major_accumulate", "hopper_bf16_gemm_split_k", "hopper_bf16_gemm_split_k_shared_b",
        "hopper_bf16_gemm_split_k_accumulate", "hopper_bf16_gemm_mn_major_split_k_accumulate", "hopper_bf16_gemm_tile_widths",
        "hopper_bf16_gemm_mn_major_widths",
        "hopper_bf16_gemm_bias_activation", "hopper_bf16_gemm_gelu", "hopper_bf16_gemm_bias_residual",
        "hopper_bf16_gemm_mn_major_split_k", "hopper_bf16_gemm_split_k_last_wave", "hopper_bf16_gemm_192_rows",
        "hopper_bf16_gemm_narrow_widths", "hopper_bf16_gemm_swapped_roles", "hopper_bf16_gemm_swapped_roles_192_rows",
    }


# ---- predicates --------------------------------------------------------------------------------

# rule name → (crafted bad schedule, field the reason must mention)
CRAFTED: dict[str, list[tuple[Schedule, str]]] = {
    "op_supported_on_arch": [(bad(arch=Arch.SM100A), "arch")],
    "dtypes_for_op": [(bad(c_dtype=DType.E4M3), "c_dtype"), (bad(acc_dtype=DType.F16), "acc_dtype")],
    "stages_at_least_two": [(bad(stages=1), "stages")],
    "smem_fits": [(bad(stages=5), "stages")],
    "tile_k_matches_dtype": [(bad(tile_k=32), "tile_k"), (bad(tile_k=128), "tile_k")],
    "math_warpgroups_range": [(bad(math_warpgroups=4), "math_warpgroups")],
    # Three math warpgroups: the plain BF16 store only, and accumulators that fit 128 registers.
    "three_math_warpgroups": [
        (bad(tile_m=192, tile_n=224, math_warpgroups=3, consumer_regs=152), "tile_n=224"),
        (bad(tile_m=192, tile_n=128, math_warpgroups=3, consumer_regs=152, epilogue=Epilogue.SPLIT_K_TMA_STORE,
             cluster_m=1, multicast=Multicast.NONE), "epilogue=split_k_tma_store"),
        (bad(tile_m=192, tile_n=128, math_warpgroups=3, consumer_regs=152, c_dtype=DType.F32), "c_dtype=f32"),
    ],
    # Swapped operand roles: the plain BF16 store from K-major operands, widths in steps of 16.
    "swapped_operand_roles": [
        (bad(operand_roles=OperandRoles.BA, tile_n=88), "tile_n=88"),
        (bad(operand_roles=OperandRoles.BA, c_dtype=DType.F32), "c_dtype=f32"),
        (bad(operand_roles=OperandRoles.BA, layout=Layout.NN), "layout=nn"),
    ],
    "tile_m_wgmma": [
        (bad(tile_m=96), "tile_m"), (bad(tile_m=64), "tile_m"), (bad(tile_m=512), "tile_m"),
        (bad(tile_m=192, math_warpgroups=1, tile_n=64), "math_warpgroups=3"),
    ],
    "tile_n_wgmma": [(bad(tile_n=120), "tile_n"), (bad(tile_n=272), "tile_n"), (bad(tile_n=0), "tile_n")],
    "register_budget": [
        (bad(producer_regs=44), "producer_regs"),
        (bad(consumer_regs=264), "consumer_regs"),
        (bad(producer_regs=16), "producer_regs"),
        (bad(consumer_regs=248), "consumer_regs"),  # 128*(40 + 2*248) > 65536
    ],
    "accumulator_registers": [(bad(consumer_regs=160), "consumer_regs")],
    # A 2x2 cluster is refused with the measured reason (30 four-CTA clusters fit on an H200).
    "cluster_shape": [(bad(cluster_m=4), "cluster_m"), (bad(cluster_n=2, multicast=Multicast.AB), "30 fit")],
    "multicast_matches_cluster": [
        (bad(multicast=Multicast.A), "multicast"),
        (bad(multicast=Multicast.NONE), "multicast"),
        (bad(cluster_m=1, cluster_n=2, multicast=Multicast.B), "multicast"),
        (bad(cluster_m=1, cluster_n=2, multicast=Multicast.NONE), "cluster_n"),
    ],
    "multicast_box_divisible": [(bad(tile_n=8), "tile_n"), (bad(tile_n=8, tile_m=8), "tile_n")],
    "tma_alignment": [(bad(c_dtype=DType.E4M3, tile_n=24), "tile_n")],
    "group_size_positive": [(bad(group_size=0), "group_size")],
    "scale_format_for_op": [(bad(scale=ScaleFormat.F32), "scale")],
    "epilogue_tile_divides": [(bad(tile_n=24), "tile_n")],
    "scale_blocks_per_tile": [
        (bad(op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.F32, tile_k=128, tile_n=176), "tile_n"),
        (bad(op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.F32, tile_k=64), "tile_k"),
    ],
    # A 256-row tile (two 128-row expert segments) would compute both halves with one expert's B.
    "contiguous_tile_within_one_expert": [
        (bad(op=Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.F32,
             tile_k=128, tile_m=256), "tile_m"),
    ],
    # epilogue_supported: every Epilogue is implemented on sm_90a; see test_epilogue_supported.
    "split_k_only_dense": [
        (bad(op=Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS, epilogue=Epilogue.SPLIT_K_TMA_STORE, cluster_m=1), "epilogue"),
    ],
    # Only the BF16 GEMM reads MN-major operands, and only on sm_90a.
    "mn_major_operands": [
        (bad(op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.F32, tile_k=128,
             layout=Layout.TN), "layout"),
    ],
    # Only the BF16 GEMM takes C to add its tiles to.
    "store_add_ops": [
        (bad(op=Op.M_GROUPED_FP8_GEMM_NT_MASKED, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.F32,
             tile_k=128, epilogue=Epilogue.TMA_STORE_ADD), "epilogue"),
    ],
    "whole_tile_epilogue_16bit_output": [
        (bad(epilogue=Epilogue.TMA_STORE_WHOLE_TILE, c_dtype=DType.F32), "c_dtype"),
        (bad(epilogue=Epilogue.TMA_STORE_PER_WARPGROUP, c_dtype=DType.F32), "c_dtype"),
    ],
    # BASE (bf16, 128 rows over two warpgroups) is one wave: its tma_store already stages the tile.
    "whole_tile_epilogue_two_wave": [(bad(epilogue=Epilogue.TMA_STORE_WHOLE_TILE), "tile_m")],
    # Only the FP8 GEMM and the contiguous grouped GEMM have run with per-warpgroup stores.
    "per_warpgroup_epilogue_two_warpgroups": [(bad(epilogue=Epilogue.TMA_STORE_PER_WARPGROUP), "op")],
}

# Blackwell (sm_100a) schedules: a one-CTA FP8 GEMM and a CTA pair.
SM100_BASE = Schedule(
    arch=Arch.SM100A, op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, c_dtype=DType.BF16,
    acc_dtype=DType.F32, scale=ScaleFormat.F32, tile_m=128, tile_n=128, tile_k=128, cluster_m=1,
    cluster_n=1, multicast=Multicast.NONE, stages=6, math_warpgroups=1, producer_regs=96,
    consumer_regs=256, epilogue=Epilogue.TMA_STORE, raster=Raster.ALONG_M, group_size=8,
)


def bwbad(**changes) -> Schedule:
    return dataclasses.replace(SM100_BASE, **changes)


CRAFTED.update({
    "accumulator_update_warpgroups": [(bwbad(math_warpgroups=2), "math_warpgroups")],
    "tile_m_umma": [(bwbad(tile_m=64), "tile_m"), (bwbad(tile_m=256), "tile_m")],
    "tile_n_umma": [(bwbad(tile_n=136), "tile_n"), (bwbad(tile_n=272), "tile_n")],
    "tmem_columns_fit": [(bwbad(tile_n=528), "tile_n")],  # one 528-column accumulator stage
    "promoted_sum_registers": [(bwbad(tile_n=256), "tile_n"), (bwbad(consumer_regs=160), "tile_n")],
    "sfb_one_block_per_tile": [(bwbad(tile_n=96), "tile_n")],
    "cta_pair_shape": [(bwbad(cluster_n=2, multicast=Multicast.A), "cluster_n"),
                       (bwbad(cluster_m=2, multicast=Multicast.AB), "multicast")],
    "ue8m0_gemm_on_blackwell": [
        (bad(op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.UE8M0, tile_k=128), "scale"),
        (bad(op=Op.FP8_GEMM_NT, a_dtype=DType.E4M3, b_dtype=DType.E4M3, scale=ScaleFormat.MX, tile_k=128), "scale"),
    ],
    "mx_whole_atoms": [(bwbad(scale=ScaleFormat.MX, tile_n=64), "tile_n")],
    "mx_cta_pair_ops": [
        (bwbad(op=Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS, scale=ScaleFormat.MX, cluster_m=2, multicast=Multicast.B,
               layout=Layout.TN, c_dtype=DType.F32), "cluster_m"),
    ],
    "fp4_on_block_scaled_mma": [(bwbad(b_dtype=DType.E2M1), "scale")],
    "contiguous_single_cta_mma": [
        (bwbad(op=Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, cluster_m=2, multicast=Multicast.B), "cluster_m")
    ],
})

# Quantize schedules (their own rules; the GEMM rules do not apply to them).
QUANT_BASE = Schedule(
    arch=Arch.SM90A, op=Op.PER_TOKEN_QUANT_FP8, a_dtype=DType.BF16, b_dtype=DType.BF16,
    c_dtype=DType.E4M3, acc_dtype=DType.F32, scale=ScaleFormat.F32, tile_m=8, tile_n=512,
    tile_k=128, cluster_m=1, cluster_n=1, multicast=Multicast.NONE, stages=2, math_warpgroups=2,
    producer_regs=0, consumer_regs=0, epilogue=Epilogue.TMA_STORE, raster=Raster.ALONG_M, group_size=1,
)


def qbad(**changes) -> Schedule:
    return dataclasses.replace(QUANT_BASE, **changes)


CRAFTED.update({
    "quant_unused_fields_neutral": [
        (qbad(cluster_m=2), "cluster_m"), (qbad(producer_regs=40), "producer_regs"),
        (qbad(b_dtype=DType.F16), "b_dtype"), (qbad(group_size=8), "group_size"),
    ],
    "quant_group": [(qbad(tile_k=64), "tile_k")],
    "quant_warpgroups": [(qbad(op=Op.GROUPED_TRANSPOSED_QUANT_FP8, tile_m=128, tile_n=64, math_warpgroups=1), "math_warpgroups")],
    "quant_tile": [(qbad(tile_m=16), "tile_m"), (qbad(tile_n=256), "tile_n"), (qbad(tile_n=1024), "tile_m"),
                   (qbad(tile_n=2048, tile_m=2), "tile_n"),
                   (qbad(op=Op.PER_BLOCK_QUANT_FP8, stages=1, tile_m=64, tile_n=128), "tile_m")],
    "quant_stages": [(qbad(stages=5), "stages"), (qbad(op=Op.PER_BLOCK_QUANT_FP8, stages=2, tile_m=128, tile_n=128), "stages")],
})

# A default SwiGLU + FP8 quantize schedule (dense, one CTA a cluster): the activation rules' base.
SWIGLU_BASE = next(
    s for s in default_schedules(arch="sm_90a") if s.stages_quantized_rows and s.op == Op.FP8_GEMM_NT and s.cluster_m == 1
)


def swbad(**changes) -> Schedule:
    return dataclasses.replace(SWIGLU_BASE, **changes)


CRAFTED.update({
    "activation_ops": [(swbad(scale=ScaleFormat.UE8M0), "activation"),
                       (swbad(op=Op.FP8_WGRAD_GEMM_NT), "activation")],
    "activation_output": [(swbad(c_dtype=DType.F32), "c_dtype")],
    "rounded_scales_quantized_output": [(swbad(d_scale=OutputScale.UE8M0, activation=Activation.NONE), "d_scale")],
    "swiglu_tile_pairs_gate_and_up": [(swbad(tile_n=128), "tile_n"), (swbad(math_warpgroups=1), "tile_m")],
    "fused_epilogue_stores": [(swbad(epilogue=Epilogue.TMA_STORE_ADD), "epilogue"),
                              (swbad(layout=Layout.NN), "layout"),
                              (swbad(epilogue=Epilogue.TMA_STORE_PER_WARPGROUP), "epilogue")],
    "bias_ops": [(bad(bias=Bias.COLUMN, c_dtype=DType.F32), "bias"), (swbad(bias=Bias.COLUMN), "bias")],
})



def test_every_predicate_is_crafted():
    assert set(CRAFTED) | {"epilogue_supported"} == {p.name for p in PREDICATES}


def test_predicate_registry_shape():
    names = [p.name for p in PREDICATES]
    assert len(names) == len(set(names))
    for p in PREDICATES:
        assert p.doc, p.name
        assert p.check.__name__ == p.name
        assert p.check(BASE) is None
        assert p.evaluate(QUANT_BASE) is None, p.name


@pytest.mark.parametrize(
    "rule,schedule,field",
    [(rule, s, f) for rule, cases in CRAFTED.items() for s, f in cases],
)
def test_predicate_rejects_crafted(rule, schedule, field):
    found = {v.name: v.reason for v in violations(schedule)}
    assert rule in found, f"{rule} did not fire; got {found}"
    reason = found[rule]
    assert field in reason, reason
    assert not is_valid(schedule)
    with pytest.raises(ScheduleError) as info:
        check(schedule)
    assert rule in str(info.value)
    assert any(v.name == rule for v in info.value.violations)


def test_reason_wording():
    (tm,) = [v for v in violations(bad(tile_m=64)) if v.name == "tile_m_wgmma"]
    assert "tile_m=64" in tm.reason and "math_warpgroups=2" in tm.reason and "128" in tm.reason
    (sm,) = [v for v in violations(bad(stages=5)) if v.name == "smem_fits"]
    for word in ("stages=5", "stage_bytes=49152", "epilogue_bytes", "232448", "at most 4"):
        assert word in sm.reason, sm.reason
    (acc,) = [v for v in violations(bad(consumer_regs=160)) if v.name == "accumulator_registers"]
    assert "128" in acc.reason and "120" in acc.reason


def test_epilogue_supported(monkeypatch):
    assert preds.epilogue_supported(BASE) is None
    monkeypatch.setitem(preds.ARCH_EPILOGUES, Arch.SM90A, frozenset())
    reason = preds.epilogue_supported(BASE)
    assert reason is not None and "epilogue" in reason


def test_check_lists_all_violations():
    s = bad(tile_m=96, stages=1, group_size=0)
    with pytest.raises(ScheduleError) as info:
        check(s)
    names = {v.name for v in info.value.violations}
    assert {"tile_m_wgmma", "stages_at_least_two", "group_size_positive"} <= names
    assert isinstance(info.value, ValueError)
    for n in names:
        assert n in str(info.value)


def test_rules_skip_other_archs():
    s = bad(arch=Arch.SM100A, tile_m=96)
    names = {v.name for v in violations(s)}
    assert "op_supported_on_arch" in names
    assert "tile_m_wgmma" not in names  # a WGMMA rule, sm_90a only
    statuses = {r.name: r.status for r in predicate_results(s)}
    assert statuses["tile_m_wgmma"] == "n/a"
    assert statuses["op_supported_on_arch"] == "fail"


def test_predicates_never_crash():
    for s in (bad(math_warpgroups=0), bad(cluster_m=0, cluster_n=0), bad(tile_k=0), bad(stages=-3)):
        assert violations(s)  # reported, not raised


# ---- names -------------------------------------------------------------------------------------

_INT_POOL = [0, 1, 2, 3, 4, 8, 10, 11, 12, 16, 64, 100, 101, 110, 128, 232, 256, -1, -8, -64]


def _random_schedule(rng: random.Random) -> Schedule:
    def i() -> int:
        return rng.choice(_INT_POOL) if rng.random() < 0.7 else rng.randint(-1000, 100000)

    return Schedule(
        arch=rng.choice(list(Arch)),
        op=rng.choice(list(Op)),
        a_dtype=rng.choice(list(DType)),
        b_dtype=rng.choice(list(DType)),
        c_dtype=rng.choice(list(DType)),
        acc_dtype=rng.choice(list(DType)),
        scale=rng.choice(list(ScaleFormat)),
        tile_m=i(),
        tile_n=i(),
        tile_k=i(),
        cluster_m=i(),
        cluster_n=i(),
        multicast=rng.choice(list(Multicast)),
        stages=i(),
        math_warpgroups=i(),
        producer_regs=i(),
        consumer_regs=i(),
        epilogue=rng.choice(list(Epilogue)),
        raster=rng.choice(list(Raster)),
        group_size=i(),
    )


NAME_RE = re.compile(r"[a-z0-9_]+")


def test_name_example():
    assert procedural_name(BASE) == (
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8"
    )


def test_roundtrip_defaults():
    for s in default_schedules():
        name = procedural_name(s)
        assert NAME_RE.fullmatch(name)
        assert parse_name(name) == s


def test_roundtrip_random_and_one_to_one():
    rng = random.Random(20240607)
    scheds = [_random_schedule(rng) for _ in range(2000)]
    # Some exact duplicates, and neighbours that differ in one field only.
    scheds += [scheds[i] for i in range(0, 2000, 97)]
    for s in list(scheds[:200]):
        f = rng.choice([f.name for f in dataclasses.fields(Schedule) if isinstance(getattr(s, f.name), int)])
        scheds.append(dataclasses.replace(s, **{f: getattr(s, f) + 1}))
    names = []
    for s in scheds:
        name = procedural_name(s)
        assert NAME_RE.fullmatch(name), name
        back = parse_name(name)
        assert back == s
        assert procedural_name(back) == name
        names.append(name)
    # names unique iff schedules distinct
    assert len(set(names)) == len(set(scheds))
    by_name: dict[str, Schedule] = {}
    for n, s in zip(names, scheds):
        assert by_name.setdefault(n, s) == s


def test_every_field_changes_the_name():
    base = procedural_name(BASE)
    for f in dataclasses.fields(Schedule):
        v = getattr(BASE, f.name)
        if isinstance(v, int):
            other = dataclasses.replace(BASE, **{f.name: v + 1})
        else:
            alternatives = [m for m in type(v) if m != v]
            if not alternatives:
                continue
            other = dataclasses.replace(BASE, **{f.name: alternatives[0]})
        assert procedural_name(other) != base, f.name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "foo",
        "cutegen",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcB_s4_wg2_r40x232_epitma_rm_g8",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s04_wg2_r40x232_epitma_rm_g8",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
        "cutegen_sm80_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_x",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_gn0",
        "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g-1",
        "xcutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    ],
)
def test_parse_name_rejects(name):
    with pytest.raises(ValueError, match="not a cutegen kernel name"):
        parse_name(name)


def test_parse_name_message_names_the_part():
    with pytest.raises(ValueError, match="multicast"):
        parse_name(
            "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcx_s4_wg2_r40x232_epitma_rm_g8"
        )


# ---- schedule files ----------------------------------------------------------------------------




def write(tmp_path: Path, body: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def family(base_extra: str = "", sweep: str = "", name: str = "fam") -> str:
    return bf16_family(name, sweep, base_extra)


GOOD_SWEEP = """
tile = [ {tile_m = 128, tile_n = 128, math_warpgroups = 2}, {tile_m = 64, tile_n = 64, math_warpgroups = 1} ]
cluster = [ {cluster_m = 1, cluster_n = 1, multicast = "none"}, {cluster_m = 2, cluster_n = 1, multicast = "b"} ]
"""


def test_load_good_file(tmp_path):
    p = write(tmp_path, family(sweep=GOOD_SWEEP + "group_size = [8, 16]\n"))
    entries = load_schedule_file(p)
    assert len(entries) == 2 * 2 * 2
    assert all(e.valid and e.family == "fam" and e.source == str(p) for e in entries)
    # cartesian product in file order: the first axis varies slowest
    assert [(e.schedule.tile_m, e.schedule.cluster_m, e.schedule.group_size) for e in entries][:3] == [
        (128, 1, 8),
        (128, 1, 16),
        (128, 2, 8),
    ]
    assert len(default_schedules(paths=[p])) == 8


def test_invalid_points_are_kept_with_reasons(tmp_path):
    sweep = 'tile = [ {tile_m = 96, tile_n = 128, math_warpgroups = 2} ]\ncluster = [ {cluster_m = 2, cluster_n = 1, multicast = "none"} ]\n'
    p = write(tmp_path, family(sweep=sweep))
    (e,) = load_schedule_file(p)
    assert not e.valid and e.schedule is not None
    names = {v.name for v in e.violations}
    assert {"tile_m_wgmma", "multicast_matches_cluster"} <= names
    assert default_schedules(paths=[p]) == []
    assert len(all_expanded(paths=[p])) == 1


def test_a_family_extends_another_of_its_file_or_a_shipped_one(tmp_path):
    body = family(sweep=GOOD_SWEEP) + textwrap.dedent("""
        [[family]]
        name = "deeper"
        description = "the same tiles, one more stage level"
        extends = "fam"
        [family.base]
        group_size = 16
        [family.sweep]
        tile = [ {tile_m = 128, tile_n = 192, math_warpgroups = 2} ]
        cluster = [ {cluster_m = 1, cluster_n = 1, multicast = "none"} ]

        [[family]]
        name = "from_shipped"
        description = "new tiles over the shipped BF16 family"
        extends = "hopper_bf16_gemm"
        [family.sweep]
        tile = [ {tile_m = 64, tile_n = 96, math_warpgroups = 1} ]
        cluster = [ {cluster_m = 1, cluster_n = 1, multicast = "none"} ]
        """)
    entries = {e.family: e for e in load_schedule_file(write(tmp_path, body))}
    own, base = entries["deeper"].schedule, entries["fam"].schedule
    assert own.group_size == 16 and own.tile_n == 192 and own.tile_k == base.tile_k and own.op == base.op
    assert entries["from_shipped"].schedule.tile_n == 96 and entries["from_shipped"].valid


@pytest.mark.parametrize("extends, words", [
    ('"nowhere"', ["extends 'nowhere'", "shipped"]),
    ('"loop"', ["circle", "loop -> loop"]),
    ("3", ["'extends' must name a family"]),
])
def test_extends_errors_name_the_family(tmp_path, extends, words):
    body = f'[[family]]\nname = "loop"\ndescription = "x"\nextends = {extends}\n[family.sweep]\ngroup_size = [8]\n'
    with pytest.raises(ScheduleFileError) as info:
        load_schedule_file(write(tmp_path, body))
    assert all(w in str(info.value) for w in words), str(info.value)


def test_shipped_families_state_each_base_field_once():
    """A shipped family that extends another restates none of the fields it inherits."""
    import tomllib

    from cutegen.schedules.loader import _shipped_families, resolve_extends

    shipped = _shipped_families()
    extending = 0
    for path in default_schedule_files():
        for fam in tomllib.loads(path.read_text())["family"]:
            if "extends" not in fam:
                continue
            extending += 1
            inherited = resolve_extends(shipped[fam["extends"]], shipped, path.name).get("base", {})
            restated = [k for k, v in fam.get("base", {}).items() if inherited.get(k, object()) == v]
            assert not restated, (path.name, fam["name"], restated)
    assert extending >= 10


def test_duplicates_across_files_are_merged(tmp_path):
    a = write(tmp_path, family(sweep=GOOD_SWEEP, name="a"), "a.toml")
    b = write(tmp_path, family(sweep=GOOD_SWEEP, name="b"), "b.toml")
    entries = all_expanded(paths=[a, b])
    assert len(entries) == 4
    assert {e.family for e in entries} == {"a"}


def _auto_ok(s: Schedule) -> bool:
    fits = s.smem_bytes <= SM90_SMEM_OPT_IN_BYTES
    nxt = dataclasses.replace(s, stages=s.stages + 1).smem_bytes > SM90_SMEM_OPT_IN_BYTES
    return fits and (s.stages == 8 or nxt)


def test_auto_stages_picks_max_that_fits(tmp_path):
    for e in all_expanded():
        if e.stages_auto:
            assert _auto_ok(e.schedule), e.name
    p = write(tmp_path, family(sweep=GOOD_SWEEP))
    by_tile = {(e.schedule.tile_m, e.schedule.tile_n): e.schedule.stages for e in load_schedule_file(p)}
    assert by_tile[(128, 128)] == 6
    assert by_tile[(64, 64)] == 8  # 12 would fit; auto stops at 8
    for e in load_schedule_file(p):
        assert e.stages_auto and _auto_ok(e.schedule)


def test_auto_stages_when_nothing_fits(tmp_path):
    p = write(tmp_path, family(sweep="tile = [ {tile_m = 256, tile_n = 256, math_warpgroups = 2, tile_k = 256} ]\ncluster_m = [1]\ncluster_n = [1]\nmulticast = [\"none\"]\n"))
    (e,) = load_schedule_file(p)
    assert e.schedule.stages == 2
    assert "smem_fits" in {v.name for v in e.violations}


def test_explicit_stages_are_kept(tmp_path):
    p = write(tmp_path, family(base_extra="", sweep=GOOD_SWEEP + "stages = [3]\n"))
    assert {e.schedule.stages for e in load_schedule_file(p)} == {3}
    assert not any(e.stages_auto for e in load_schedule_file(p))


def _err(tmp_path: Path, body: str) -> str:
    p = write(tmp_path, body)
    with pytest.raises(ScheduleFileError) as info:
        load_schedule_file(p)
    msg = str(info.value)
    assert str(p) in msg, msg
    assert isinstance(info.value, ValueError)
    return msg


@pytest.mark.parametrize(
    "base_extra,sweep,words",
    [
        ("tile_q = 3\n", GOOD_SWEEP, ["fam", "tile_q", "unknown field"]),
        ("", GOOD_SWEEP.replace('multicast = "b"', 'multicast = "c"'), ["fam", "multicast", "'c'", "cluster"]),
        ("", GOOD_SWEEP.replace("tile_m = 128", 'tile_m = "128"'), ["fam", "tile_m", "integer"]),
        ("", GOOD_SWEEP.replace("tile_m = 128", "tile_m = 128.0"), ["fam", "tile_m", "integer"]),
        ("", GOOD_SWEEP.replace("tile_m = 128", "tile_m = true"), ["fam", "tile_m", "integer"]),
        ("", GOOD_SWEEP.replace("tile_m = 128", "tile_mm = 128"), ["fam", "tile_mm", "tile"]),
        ("", GOOD_SWEEP + "group_size = 8\n", ["fam", "group_size", "list"]),
        ("", GOOD_SWEEP + "group_size = []\n", ["fam", "group_size", "empty"]),
        ("", GOOD_SWEEP + "foo = [1, 2]\n", ["fam", "foo", "not a schedule field"]),
        ("", GOOD_SWEEP + "more = [ {tile_m = 64} ]\n", ["fam", "tile_m", "more", "tile"]),
        ("", GOOD_SWEEP + 'stages = ["many"]\n', ["fam", "stages", "auto"]),
    ],
)
def test_loader_errors_name_file_family_field(tmp_path, base_extra, sweep, words):
    msg = _err(tmp_path, family(base_extra=base_extra, sweep=sweep))
    for w in words:
        assert w in msg, (w, msg)


def test_loader_bad_arch_in_base(tmp_path):
    body = family(sweep=GOOD_SWEEP).replace('arch = "sm_90a"', 'arch = "sm_80"')
    msg = _err(tmp_path, body)
    for w in ("fam", "arch", "sm_80", "sm_90a"):
        assert w in msg


def test_loader_missing_field(tmp_path):
    body = family(sweep=GOOD_SWEEP).replace("group_size = 8\n", "")
    msg = _err(tmp_path, body)
    assert "group_size" in msg and "missing" in msg


def test_loader_file_level_errors(tmp_path):
    assert "TOML" in _err(tmp_path, "[[family]\n")
    assert "[[family]]" in _err(tmp_path, "x = 1\n")
    assert "family" in _err(tmp_path, 'title = "x"\n')
    assert "defined twice" in _err(tmp_path, family(sweep=GOOD_SWEEP) + family(sweep=GOOD_SWEEP))
    assert "name" in _err(tmp_path, '[[family]]\ndescription = "x"\n')
    assert "bogus" in _err(tmp_path, family(sweep=GOOD_SWEEP) + "\n[family.bogus]\nx = 1\n")
    with pytest.raises(ScheduleFileError, match="cannot read"):
        load_schedule_file(tmp_path / "missing.toml")


def test_a_sweep_of_too_many_points_is_refused_before_it_is_expanded(tmp_path):
    axis = lambda field, values: f"{field} = [" + ", ".join(f"{{{field} = {v}}}" for v in values) + "]\n"  # noqa: E731
    sweep = GOOD_SWEEP + axis("group_size", range(1, 52)) + axis("stages", range(2, 52))  # 2 x 2 x 51 x 50
    p = write(tmp_path, family(sweep=sweep))
    with pytest.raises(ScheduleFileError) as info:
        load_schedule_file(p)
    message = str(info.value)
    for words in (str(p), "fam", "10,200 points (2 x 2 x 51 x 50", "more than 10,000", "--max-points 10200"):
        assert words in message, (words, message)
    assert len(load_schedule_file(p, max_points=10_200)) == 10_200


def test_expand_family_from_dict():
    import tomllib

    data = tomllib.loads(family(sweep=GOOD_SWEEP))
    entries = expand_family(data["family"][0])
    assert len(entries) == 4 and all(e.valid for e in entries)
    with pytest.raises(ScheduleFileError, match="family 'fam'"):
        expand_family({**data["family"][0], "sweep": {"tile": 3}})


def test_schedules_package_imports_nothing_else():
    code = (
        "import sys, cutegen.schedules as s; s.default_schedules();"
        "bad = [m for m in sys.modules if (m.startswith('cutegen.') and not m.startswith('cutegen.schedules'))"
        " or m.split('.')[0] in ('cutlass', 'torch', 'numpy')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scale_stages_start_on_tma_aligned_boundaries():
    """Each stage of a TMA-staged scale vector starts 128-byte aligned (a TMA destination must),
    so 112- or 144-row stages are padded, and the shared-memory budget counts the padding."""
    from cutegen.schedules.spec import TMA_SMEM_ALIGN_BYTES, scale_stage_elems

    assert [scale_stage_elems(r) for r in (64, 112, 128, 144, 160, 256)] == [64, 128, 128, 160, 160, 256]
    for rows in range(16, 257, 16):
        assert scale_stage_elems(rows) * 4 % TMA_SMEM_ALIGN_BYTES == 0
        assert 0 <= scale_stage_elems(rows) - rows < TMA_SMEM_ALIGN_BYTES // 4
    wgrad = [s for s in default_schedules() if s.op.scales_b_per_row and s.tile_n == 112]
    assert wgrad, "the default catalogue has 112-wide weight-gradient tiles"
    for s in wgrad:
        ab = s.tile_k * (s.tile_m + s.tile_n)  # one byte per e4m3 element
        assert s.stage_bytes == ab + 4 * (128 + 128)


def test_sfb_boundaries_cover_every_tile_position():
    """The main loop is compiled once per column where a tile's second SFB block can begin; the
    runtime boundary of every tile of every valid width (128 - start mod 128, start = j·tile_n)
    must be one of those, and the chunk test `8·chunk < boundary` must match the per-column
    test for the columns 0, 2, 4, 6 of a thread within each 8-column chunk."""
    from cutegen.schedules.spec import SCALE_BLOCK, sfb_boundaries

    assert sfb_boundaries(192) == (128, 64)
    assert sfb_boundaries(160) == (128, 96, 64, 32)
    assert sfb_boundaries(128) == sfb_boundaries(64) == sfb_boundaries(16) == (128,)
    for tile_n in range(16, 257, 16):
        if tile_n - math.gcd(tile_n, SCALE_BLOCK) > SCALE_BLOCK:
            continue  # three SFB blocks: rejected by scale_blocks_per_tile
        candidates = sfb_boundaries(tile_n)
        for j in range(2 * SCALE_BLOCK):
            boundary = SCALE_BLOCK - (j * tile_n) % SCALE_BLOCK
            if SCALE_BLOCK % tile_n == 0:
                assert boundary >= tile_n  # one block: no boundary inside the tile
                continue
            assert boundary in candidates, (tile_n, j, boundary)
            for col in range(tile_n):
                assert (col < boundary) == (8 * (col // 8) < boundary)


def test_per_row_scales_have_no_scale_block_limit_on_tile_n():
    """Weight gradients scale B per row, so a tile may span any number of 128-column blocks: the
    176-wide tile the block-scaled GEMM rejects is valid there (and a default schedule)."""
    wide = dict(a_dtype=DType.E4M3, b_dtype=DType.E4M3, c_dtype=DType.F32, scale=ScaleFormat.F32,
                tile_k=128, tile_n=176, producer_regs=24, consumer_regs=240)
    assert "scale_blocks_per_tile" in {v.name for v in violations(bad(op=Op.FP8_GEMM_NT, **wide))}
    assert "scale_blocks_per_tile" not in {v.name for v in violations(bad(op=Op.FP8_WGRAD_GEMM_NT, **wide))}
    assert any(s.tile_n == 176 for s in default_schedules(op=Op.FP8_WGRAD_GEMM_NT))


def test_whole_tile_epilogue_schedules():
    """The default 256x128 FP8 twins of the ring kernels stage the whole tile and store it per
    math warpgroup (tma_store_per_warpgroup): same stages, 64-row sub-tiles, a name tag of their
    own. tma_store_whole_tile (CTA-wide barriers) stays valid for two-wave tiles only (tma_store
    already stages single-wave tiles whole); both need a 16-bit output, per-warpgroup stores two
    math warpgroups, and neither exists on sm_100a."""
    defaults = {(s.tile_m, s.tile_n, s.cluster_m, s.cluster_n, s.epilogue): s
                for s in default_schedules(arch="sm_90a", op="fp8_gemm_nt")}
    whole = [s for s in defaults.values() if s.epilogue == Epilogue.TMA_STORE_PER_WARPGROUP]
    assert {(s.tile_m, s.tile_n, s.cluster_m, s.cluster_n) for s in whole} == {
        (256, 128, 1, 1), (256, 128, 2, 1), (256, 128, 1, 2)
    }
    for s in whole:
        ring = defaults[(s.tile_m, s.tile_n, s.cluster_m, s.cluster_n, Epilogue.TMA_STORE)]
        assert s.waves == 2 and s.epilogue_whole_tile and not ring.epilogue_whole_tile
        assert s.stages == ring.stages
        assert s.smem_bytes > ring.smem_bytes
        assert "_epiwg_" in procedural_name(s) and "_epitma_" in procedural_name(ring)
        assert s.epi_tile == (64, 32) and ring.epi_tile == (128, 32)
        assert parse_name(procedural_name(s)) == s
        cta_wide = dataclasses.replace(s, epilogue=Epilogue.TMA_STORE_WHOLE_TILE)
        assert not violations(cta_wide) and "_epitmaw_" in procedural_name(cta_wide)
        assert cta_wide.smem_bytes == s.smem_bytes
    single_wave = dataclasses.replace(whole[0], tile_m=128, stages=4, epilogue=Epilogue.TMA_STORE_WHOLE_TILE)
    assert "whole_tile_epilogue_two_wave" in {v.name for v in violations(single_wave)}
    assert not violations(dataclasses.replace(single_wave, epilogue=Epilogue.TMA_STORE_PER_WARPGROUP))
    one_wg = next(s for s in default_schedules(arch="sm_90a", op="fp8_gemm_nt") if s.math_warpgroups == 1)
    found = {v.name: v.reason for v in violations(dataclasses.replace(one_wg, epilogue=Epilogue.TMA_STORE_PER_WARPGROUP))}
    assert "math_warpgroups=1" in found["per_warpgroup_epilogue_two_warpgroups"]
    wgrad = next(s for s in default_schedules(op="fp8_wgrad_gemm_nt") if s.tile_m == 256)
    for epilogue in (Epilogue.TMA_STORE_WHOLE_TILE, Epilogue.TMA_STORE_PER_WARPGROUP):
        found = {v.name: v.reason for v in violations(dataclasses.replace(wgrad, epilogue=epilogue))}
        assert "c_dtype" in found["whole_tile_epilogue_16bit_output"]
    sm100 = next(s for s in default_schedules(arch="sm_100a"))
    for epilogue in (Epilogue.TMA_STORE_WHOLE_TILE, Epilogue.TMA_STORE_PER_WARPGROUP):
        assert "epilogue_supported" in {v.name for v in violations(dataclasses.replace(sm100, epilogue=epilogue))}


def test_whole_tile_epilogue_only_where_it_costs_no_stage():
    """Single-wave Hopper tiles with 16-bit outputs stage the whole output tile when it fits
    beside their operand stages; two-wave tiles (unless their epilogue is tma_store_whole_tile or
    tma_store_per_warpgroup, which stage any tile whole),
    fp32 outputs and Blackwell keep their rings, and no single-wave default schedule has fewer
    operand stages than the ring would give it."""
    from cutegen.schedules.loader import AUTO_MAX_STAGES
    from cutegen.schedules.spec import EPILOGUE_STAGES, SM90_SMEM_OPT_IN_BYTES

    by_tile = {}
    for s in default_schedules():
        if s.op.is_quantize:
            continue
        assert s.smem_bytes <= SM90_SMEM_OPT_IN_BYTES
        if s.epilogue_whole_tile:
            assert s.arch.value == "sm_90a" and s.c_dtype.bytes == 2
            whole_by_epilogue = s.epilogue in (Epilogue.TMA_STORE_WHOLE_TILE, Epilogue.TMA_STORE_PER_WARPGROUP)
            assert s.waves == 1 or whole_by_epilogue
            assert s.epilogue_stages == s.epilogue_subtiles
            if s.waves > 1 or whole_by_epilogue:
                # Two-wave tiles stage the whole tile by choice, at the cost of stages if need be.
                by_tile[(s.op.value, s.tile_m, s.tile_n, "whole")] = (s.cluster_m, s.cluster_n)
                continue
            # With the ring instead, one more operand stage would not fit either (or the schedule
            # already has at least the most stages "auto" gives).
            em, en = s.epi_tile
            ring = EPILOGUE_STAGES * em * en * s.c_dtype.bytes
            whole = s.epilogue_subtiles * em * en * s.c_dtype.bytes
            with_ring_and_one_more = s.smem_bytes - whole + ring + s.stage_bytes
            assert with_ring_and_one_more > SM90_SMEM_OPT_IN_BYTES or s.stages >= AUTO_MAX_STAGES
        by_tile[(s.op.value, s.tile_m, s.tile_n)] = s.epilogue_whole_tile
    assert by_tile[("fp8_gemm_nt", 128, 128)] and by_tile[("fp8_gemm_nt", 128, 192)]
    # Two waves: the ring at long K (tma_store), the whole tile for short K (tma_store_per_warpgroup).
    assert not by_tile[("fp8_gemm_nt", 256, 128)]
    assert ("fp8_gemm_nt", 256, 128, "whole") in by_tile
    assert not by_tile[("fp8_wgrad_gemm_nt", 256, 128)]  # fp32 output
    assert ("m_grouped_fp8_gemm_nt_contiguous", 128, 192, "whole") in by_tile


def test_static_stage_rounds_where_they_were_measured_faster():
    """The single-accumulator loops copied at most twice per SFB boundary run static-stage rounds;
    accumulator rings, 112- to 160-wide two-block tiles and the 176-wide weight gradient that
    spilled with them do not (`Schedule.static_stage_rounds`)."""
    chosen = {}
    for s in default_schedules():
        if s.op.is_quantize or not s.block_scaled:
            continue
        key = (s.op.value, s.arch.value, s.tile_m, s.tile_n)
        chosen.setdefault(key, set()).add(s.static_stage_rounds)
        if s.static_stage_rounds:
            assert s.wgmma_accumulators == 1 and s.arch == Arch.SM90A
    assert all(len(v) == 1 for v in chosen.values()), "one answer per tile, whatever the cluster"
    rounds = {k for k, v in chosen.items() if v == {True}}
    expected = {
        ("fp8_gemm_nt", "sm_90a", 128, 192), ("fp8_gemm_nt", "sm_90a", 256, 128),
        ("m_grouped_fp8_gemm_nt_contiguous", "sm_90a", 128, 192),
        ("m_grouped_fp8_gemm_nt_contiguous", "sm_90a", 128, 256),
        ("m_grouped_fp8_gemm_nt_masked", "sm_90a", 128, 192), ("m_grouped_fp8_gemm_nt_masked", "sm_90a", 256, 128),
        ("fp8_wgrad_gemm_nt", "sm_90a", 128, 112), ("fp8_wgrad_gemm_nt", "sm_90a", 128, 128),
        ("fp8_wgrad_gemm_nt", "sm_90a", 128, 160), ("fp8_wgrad_gemm_nt", "sm_90a", 256, 128),
        ("k_grouped_fp8_gemm_nt_contiguous", "sm_90a", 128, 112),
        ("k_grouped_fp8_gemm_nt_contiguous", "sm_90a", 128, 128),
        ("k_grouped_fp8_gemm_nt_contiguous", "sm_90a", 128, 160),
        ("k_grouped_fp8_gemm_nt_contiguous", "sm_90a", 256, 128),
        # The SwiGLU tiles (the contiguous one's is the plain 128x256's), and their 64-row twins.
        ("fp8_gemm_nt", "sm_90a", 128, 256), ("m_grouped_fp8_gemm_nt_masked", "sm_90a", 128, 256),
        ("fp8_gemm_nt", "sm_90a", 64, 256), ("m_grouped_fp8_gemm_nt_masked", "sm_90a", 64, 256),
    }
    assert rounds == expected


def test_256_wide_block_scaled_tiles_run_in_column_waves():
    """A 256-wide block-scaled Hopper tile is computed in two column waves of 128 (its promoted
    sum and one wave's accumulator fit where a whole-width accumulator would not), with a ring of
    two epilogue sub-tiles so that four operand stages fit; the contiguous catalogue has one, in a
    2x1 cluster. Row-wave (256-row) tiles, narrower tiles, weight gradients (per-row SFB),
    unscaled tiles and sm_100a keep one column wave, and a weight-gradient 128x256 tile is still
    refused for its registers. The SwiGLU tiles (gate wave, up wave) are 128x256, and 64x256 (one
    math warpgroup) for the dense and masked ops."""
    from cutegen.schedules.spec import COLUMN_WAVE_EPILOGUE_STAGES, SM90_SMEM_OPT_IN_BYTES

    wide = [s for s in default_schedules(arch="sm_90a") if s.column_waves > 1]
    assert {(s.entry, s.tile_m, s.tile_n, s.cluster_m, s.cluster_n) for s in wide} == {
        ("m_grouped_fp8_gemm_nt_contiguous", 128, 256, 2, 1),
    } | {
        (f"{op}_swiglu_quant{rounding}", tile_m, 256, *cluster)
        for op, clusters, tile_ms in (("fp8_gemm_nt", ((1, 1), (2, 1)), (128, 64)),
                                      ("m_grouped_fp8_gemm_nt_contiguous", ((1, 1), (2, 1)), (128,)),
                                      ("m_grouped_fp8_gemm_nt_masked", ((1, 1), (1, 2)), (128, 64)))
        for cluster in clusters
        for tile_m in tile_ms
        for rounding in ("", "_ue8m0")
        if (tile_m, cluster) != (64, (1, 2))  # spills
    }
    (s,) = [w for w in wide if not w.fused_epilogue]
    assert s.column_waves == 2 and s.waves == 1 and s.all_waves == 2
    assert s.wgmma_accumulators == 1
    assert s.accumulator_registers == 128 + 64 <= s.consumer_regs - preds.REGISTER_HEADROOM
    assert s.stages == 4 and not s.epilogue_whole_tile
    assert s.epilogue_stages == COLUMN_WAVE_EPILOGUE_STAGES
    assert s.smem_bytes <= SM90_SMEM_OPT_IN_BYTES
    assert not violations(s)
    # Three stages leave room for the whole output tile, which the epilogue then stages.
    three = dataclasses.replace(s, stages=3)
    assert three.epilogue_whole_tile and not violations(three)
    dense = dataclasses.replace(s, op=Op.FP8_GEMM_NT)
    assert dense.column_waves == 2 and not violations(dense)
    for other in (
        next(x for x in default_schedules(arch="sm_90a", op="fp8_gemm_nt") if x.tile_m == 256),
        next(x for x in default_schedules(arch="sm_90a", op="fp8_gemm_nt") if x.tile_n == 192),
        next(x for x in default_schedules(arch="sm_90a", op="bf16_gemm_nt") if x.tile_n == 256),
        next(x for x in default_schedules(arch="sm_100a") if x.tile_n == 128),
    ):
        assert other.column_waves == 1 and other.all_waves == other.waves
    wgrad = dataclasses.replace(
        next(x for x in default_schedules(arch="sm_90a", op="fp8_wgrad_gemm_nt") if x.tile_m == 128), tile_n=256, stages=3
    )
    assert wgrad.column_waves == 1
    assert "accumulator_registers" in {v.name for v in violations(wgrad)}


def test_column_scales_early_where_they_fit():
    """Single-wave Hopper weight-gradient tiles in 2-CTA clusters read their column scales while the
    WGMMAs run; 1x1 clusters and two-wave tiles do not, nor k-grouped tiles not a multiple of 128
    wide under the 240-register budget (`Schedule.column_scales_early`)."""
    early = {}
    for s in default_schedules():
        if not s.op.scales_b_per_row:
            continue
        crowded = (
            s.op.is_k_grouped and s.tile_n % SCALE_BLOCK != 0 and s.consumer_regs < K_GROUPED_EARLY_COLUMNS_MIN_REGS
        )
        expected = s.arch == Arch.SM90A and s.tile_m == 128 and s.cluster_size == 2 and not crowded
        assert s.column_scales_early == expected, procedural_name(s)
        early[(s.op.value, s.tile_m, s.tile_n, s.cluster_m, s.cluster_n, s.consumer_regs)] = s.column_scales_early
    assert early[("k_grouped_fp8_gemm_nt_contiguous", 128, 160, 2, 1, 240)]
    assert not early[("k_grouped_fp8_gemm_nt_contiguous", 128, 112, 2, 1, 232)]
    assert early[("fp8_wgrad_gemm_nt", 128, 112, 2, 1, 232)]


def test_quantizers_are_named_by_the_fields_they_use():
    """A quantizer with its unused fields neutral takes the 9-part short form, which `parse_name`
    inverts; its 17-part spelling is not canonical; a quantizer with a non-neutral unused field
    (never valid) keeps the long form, so the mapping stays total and one-to-one."""
    import dataclasses

    from cutegen.schedules.naming import parse_name, procedural_name
    from cutegen.schedules.predicates import violations

    quant = [s for s in default_schedules() if s.op.is_quantize]
    assert quant and all(s.quant_neutral for s in quant)
    for s in quant:
        name = procedural_name(s)
        assert len(name.split("_")) == 9 and parse_name(name) == s
    s = quant[0]
    long_form = "cutegen_sm90a_ptquant_bf16_bf16_e4m3_f32_sff32_8x512x128_c1x1_mc0_s1_wg2_r0x0_epitma_rm_g1"
    with pytest.raises(ValueError, match="not a canonical"):
        parse_name(long_form)
    odd = dataclasses.replace(s, cluster_m=2)
    assert len(procedural_name(odd).split("_")) == 17 and parse_name(procedural_name(odd)) == odd
    assert any(v.name == "quant_unused_fields_neutral" for v in violations(odd))
    with pytest.raises(ValueError, match="names quantizers only"):
        parse_name("cutegen_sm90a_fp8gemm_e4m3_bf16_sff32_128x128x128_s4_wg2")


def test_layout_is_named_only_when_not_nt():
    """A GEMM's layout is an 18th name part when it is nn, tn or tt, and never written as nt."""
    base = next(s for s in default_schedules(op="bf16_gemm_nt") if s.layout == Layout.NT)
    name = procedural_name(base)
    assert len(name.split("_")) == 17 and parse_name(name) == base
    for layout in (Layout.NN, Layout.TN, Layout.TT):
        s = dataclasses.replace(base, layout=layout)
        assert procedural_name(s) == f"{name}_{layout.value}" and parse_name(procedural_name(s)) == s
    with pytest.raises(ValueError, match="not a canonical|not a layout"):
        parse_name(f"{name}_nt")
    with pytest.raises(ValueError, match="layout"):
        parse_name(f"{name}_xx")
    assert not violations(dataclasses.replace(base, layout=Layout.TN))
