"""CPU tier: the ABI self-check. For real templates and concrete shapes, the bytes the CuTe DSL's own
host code passes to the launch (captured by linking its `export_to_c` object against stub CUDA
functions) must equal what the runtime packs from the manifest, and the launch facts must agree."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")

import abi_probe as ap  # noqa: E402
from cutegen.gen.build import _compile, _make_manifest  # noqa: E402
from tensormap import DSL_FLAG_BITS, decode_tensor_map, encode_tensor_map  # noqa: E402
from cutegen.runtime.launch import compute_grid  # noqa: E402
from cutegen.runtime.params import OperandInfo, pack_params, tma_args_from_binding  # noqa: E402
from cutegen.schedules.naming import parse_name  # noqa: E402

pytestmark = pytest.mark.slow

SCHEDULES = (
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_64x128x64_c1x1_mc0_s8_wg1_r40x232_epitma_rm_g8",
    # Three math warpgroups (512 threads a CTA), B multicast.
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_192x192x64_c2x1_mcb_s3_wg3_r40x152_epitma_rm_g8",
    # B's rows as the MMA's M side: A and B swap descriptors, D written through a column-major view.
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x112x64_c2x1_mcb_s6_wg2_r40x232_epitma_rm_g8_swapab",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_192x176x64_c1x1_mc0_s4_wg3_r40x152_epitma_rm_g8_swapab",
    # fp32 D added into by the TMA's reduce-add (D = C + A·Bᵀ).
    "cutegen_sm90a_gemm_bf16_bf16_f32_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epiadd_rm_g8",
    # MN-major operands: B (nn, with B multicast), both (tn, adding into fp32 D), A (tt).
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_nn",
    "cutegen_sm90a_gemm_bf16_bf16_f32_f32_nosf_128x128x64_c2x1_mcb_s6_wg2_r40x232_epiadd_rm_g8_tn",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x128x64_c1x1_mc0_s6_wg2_r40x232_epitma_rm_g8_tt",
    "cutegen_sm90a_mgbf16gemmc_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_nn",
    "cutegen_sm90a_kgbf16wgrad_bf16_bf16_f32_f32_nosf_128x128x64_c2x1_mcb_s6_wg2_r40x232_epitma_rm_g8_tn",
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x160x128_c1x2_mca_s5_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_64x32x128_c1x2_mca_s14_wg1_r40x232_episk_rm_g8",
    "cutegen_sm90a_mgfp8gemmc_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x2_mca_s5_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_64x128x128_c1x2_mca_s8_wg1_r40x232_epitma_rm_g1",
    # The masked layout with its last wave split along K (the split-K workspace after masked_m).
    "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c1x2_mca_s3_wg2_r40x232_episkw_rm_g1",
    "cutegen_sm90a_fp8wgrad_e4m3_e4m3_f32_f32_sff32_128x112x128_c2x1_mcb_s6_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_kgfp8wgrad_e4m3_e4m3_f32_f32_sff32_128x128x128_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_mgbf16gemmc_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_mgbf16gemmm_bf16_bf16_bf16_f32_nosf_64x128x64_c1x2_mca_s8_wg1_r40x232_epitma_rm_g1",
    # Blackwell: every sm_100a op, one CTA and a CTA pair (only compiled: no sm_100 GPU here).
    "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x64x128_c2x1_mcb_s8_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_mgfp8gemmc_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c2x1_mcb_s8_wg1_r96x256_epitma_rn_g1",
    "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sfue8m0_128x128x128_c2x1_mcb_s8_wg1_r96x256_epitma_rm_g8",
    # The block-scaled MMA (scales applied by the tensor cores, blocked bytes taken by address).
    "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sfmx_128x256x128_c1x1_mc0_s4_wg1_r96x256_epitma_rm_g8",
    # ... with FP4 weights, TMA-loaded unpacked (16U4_ALIGN16B).
    "cutegen_sm100a_fp8gemm_e4m3_e2m1_bf16_f32_sfmx_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rm_g8",
    # ... over the grouped layouts.
    "cutegen_sm100a_mgfp8gemmc_e4m3_e2m1_bf16_f32_sfmx_128x256x128_c1x1_mc0_s4_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sfmx_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rn_g1",
    # ... and the weight gradient (fp32 D, TMA reduce-add).
    "cutegen_sm100a_fp8wgrad_e4m3_e4m3_f32_f32_sfmx_128x256x128_c1x1_mc0_s4_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_kgfp8wgradtn_e4m3_e4m3_f32_f32_sfmx_128x128x128_c1x1_mc0_s6_wg1_r96x256_epitma_rm_g8_tn",
    # ... and in CTA pairs (2-CTA MMAs; each CTA's TMA box half of the tile's B rows).
    "cutegen_sm100a_fp8gemm_e4m3_e2m1_bf16_f32_sfmx_128x256x128_c2x1_mcb_s6_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_mgfp8gemmm_e4m3_e4m3_bf16_f32_sfmx_128x128x128_c2x1_mcb_s8_wg1_r96x256_epitma_rn_g1",
    "cutegen_sm100a_fp8wgrad_e4m3_e4m3_f32_f32_sfmx_128x128x128_c2x1_mcb_s8_wg1_r96x256_epitma_rm_g8",
    # NVFP4: FP4 A and B packed in shared memory, E4M3 scales per 16, alpha by address.
    "cutegen_sm100a_nvfp4gemm_e2m1_e2m1_bf16_f32_sfnv_128x128x256_c1x1_mc0_s5_wg1_r96x256_epitma_rm_g8",
    "cutegen_sm100a_nvfp4gemm_e2m1_e2m1_bf16_f32_sfnv_128x256x256_c2x1_mcb_s5_wg1_r96x256_epitma_rm_g8",
    # The SwiGLU + FP8 quantize epilogue (D e4m3 and its scales as plain tensors, eps by value).
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_e4m3_f32_sff32_128x256x128_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_swiglu",
    "cutegen_sm90a_mgfp8gemmc_e4m3_e4m3_e4m3_f32_sff32_128x256x128_c1x1_mc0_s4_wg2_r40x232_epitma_rm_g8_swiglu",
    "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_e4m3_f32_sff32_128x256x128_c1x2_mca_s4_wg2_r40x232_epitma_rn_g1_swiglu",
    "cutegen_sm90a_mgfp8gemmm_e4m3_e4m3_e4m3_f32_sff32_64x256x128_c1x1_mc0_s5_wg1_r40x232_epitma_rn_g1_swiglu",
    # A bias per column (a plain [N] tensor after D) and an activation, FP8 and BF16; an
    # activation alone takes the plain GEMM's arguments.
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x128x128_c1x1_mc0_s5_wg2_r40x232_epitma_rm_g8_bias_gelu",
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c2x1_mcb_s3_wg2_r40x232_epitma_rm_g8_bias",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8_bias_silu",
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x128x64_c1x1_mc0_s6_wg2_r40x232_epitma_rm_g8_gelu",
    # ... and a residual: the bias kernel adding into D (TMA reduce-add).
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x128x64_c1x1_mc0_s6_wg2_r40x232_epiadd_rm_g8_bias",
)
# The SwiGLU kernels' eps.
EPS = 1e-4
GROUPS = 3
# Split-K kernels: the split count passed (the DSL's host code only multiplies the grid by it).
K_SPLITS = 3
# (M, N, K, padding of each leading dimension in elements, max active clusters)
PROBLEMS = ((1000, 776, 640, 16, 66), (4096, 4096, 4096, 0, 132), (1, 128, 128, 64, 3))

# cuTensorMapEncodeTiled's enum codes (CUtensorMapDataType / Swizzle / L2 promotion / ...).
CU_DTYPE = {"bf16": 9, "f16": 6, "f32": 7, "e4m3": 0, "e2m1": 14, "e2m1_packed": 13}
CU_SWIZZLE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
CU_L2 = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
CU_INTERLEAVE = {"none": 0, "16B": 1, "32B": 2}
CU_OOB = {"none": 0, "nan": 1}
ELEM_BITS = {"bf16": 16, "f16": 16, "f32": 32, "e4m3": 8, "e2m1": 4, "u8": 8, "i32": 32}


@pytest.fixture(scope="module", params=SCHEDULES)
def compiled(request, tmp_path_factory):
    if ap.find_runtime_static_lib() is None or shutil.which("gcc") is None:
        pytest.fail("the ABI self-check needs gcc and the DSL's static runtime library")
    schedule = parse_name(request.param)
    art = _compile(schedule, tmp_path_factory.mktemp("compile"))
    return schedule, art, _make_manifest(schedule, art, None)


def encode_like_the_runtime(tma) -> bytes:
    """What `cutegen.runtime.tma.encode_tiled` asks the driver for, encoded on the CPU."""
    return encode_tensor_map(
        tma.global_address,
        CU_DTYPE[tma.dtype],
        tma.global_dims,
        tma.global_strides,
        tma.box,
        tma.element_strides,
        interleave=CU_INTERLEAVE[tma.interleave],
        swizzle=CU_SWIZZLE[tma.swizzle],
        l2_promotion=CU_L2[tma.l2_promotion],
        oob_fill=CU_OOB[tma.oob_fill],
        dsl_flags=False,  # exactly what the driver writes
    )


def with_dsl_private_bits(ours: bytes, dsl: bytes) -> bytes:
    """Copy the two flag bits only the DSL's own encoder sets (bits 65 and 85; no effect on the
    copy was measured on an H200) from the DSL's descriptor; every other bit must already match."""
    word = int.from_bytes(ours[8:16], "little")
    theirs = int.from_bytes(dsl[8:16], "little")
    for bit in DSL_FLAG_BITS:
        word = (word & ~(1 << bit)) | (theirs & (1 << bit))
    return ours[:8] + word.to_bytes(8, "little") + ours[16:]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: "x".join(map(str, p[:3])))
def test_runtime_packing_equals_dsl_host_launch(compiled, problem, tmp_path):
    schedule, art, manifest = compiled
    m, n, k, pad, max_clusters = problem
    ab = schedule.a_dtype.value
    b_dtype = schedule.b_dtype.value
    grouped = schedule.op.is_m_grouped
    masked = schedule.op.is_masked
    fused = schedule.stages_quantized_rows
    if fused:  # gate and up columns pair up: N = 2I with I a multiple of 128
        n = 256 * max(1, n // 256)
    nvfp4 = schedule.scale.value == "nv"
    if nvfp4:  # whole K tiles of 256
        k = 256 * -(-k // 256)
    # FP4 rows: strides of whole 32 bytes (64 elements), as its TMA type needs.
    pad_b = -(-pad // 64) * 64 if b_dtype == "e2m1" else pad
    pad_a = -(-pad // 64) * 64 if ab == "e2m1" else pad
    b_info = (
        OperandInfo(0x7F1000000000, (GROUPS, n, k), (n * (k + pad_b), k + pad_b, 1), b_dtype)
        if grouped
        else OperandInfo(0x7F1000000000, (n, k), (k + pad_b, 1), b_dtype)
    )
    operands = {
        "a": OperandInfo(0x7F0000000000, (m, k), (k + pad_a, 1), ab),
        "b": b_info,
        "d": OperandInfo(0x7F2000000000, (m, n), (n + pad, 1), schedule.c_dtype.value),
    }
    # MN-major operands (layouts nn, tn, tt): contiguous along M (N), K rows of M + pad (N + pad)
    # rounded up to 16 bytes.
    if schedule.layout.a_mn_major:
        operands["a"] = OperandInfo(0x7F0000000000, (m, k), (1, -(-(m + pad) // 8) * 8), ab)
    if schedule.layout.b_mn_major:
        ldb = -(-(n + pad) // 8) * 8
        operands["b"] = (
            OperandInfo(0x7F1000000000, (GROUPS, n, k), (k * ldb, 1, ldb), b_dtype)
            if grouped
            else OperandInfo(0x7F1000000000, (n, k), (1, ldb), b_dtype)
        )
    if masked:  # [G, max_m, ...] with M = max_m
        operands["a"] = OperandInfo(0x7F0000000000, (GROUPS, m, k), (m * (k + pad), k + pad, 1), ab)
        operands["d"] = OperandInfo(0x7F2000000000, (GROUPS, m, n), (m * (n + pad), n + pad, 1), "bf16")
    if fused:  # e4m3 [(G,) M, I] and its scales [(G,) M, I/128], MN-major and TMA-aligned
        i, ib, lds = n // 2, n // 256, -(-m // 4) * 4
        operands["d"] = (
            OperandInfo(0x7F2000000000, (GROUPS, m, i), (m * (i + pad), i + pad, 1), "e4m3") if masked
            else OperandInfo(0x7F2000000000, (m, i), (i + pad, 1), "e4m3")
        )
        operands["d_sf"] = (
            OperandInfo(0x7FA000000000, (GROUPS, m, ib), (ib * lds, 1, lds), "f32") if masked
            else OperandInfo(0x7FA000000000, (m, ib), (1, lds), "f32")
        )
    if schedule.adds_bias:  # bf16 [N], after D in the entry's arguments
        operands["bias"] = OperandInfo(0x7FB000000000, (n,), (1,), "bf16")
    kt = 128 * -(-k // 128)
    if schedule.op.is_k_grouped:
        operands["a"] = OperandInfo(0x7F0000000000, (m, kt), (kt, 1), ab)
        operands["b"] = OperandInfo(0x7F1000000000, (n, kt), (kt, 1), ab)
        operands["d"] = OperandInfo(0x7F2000000000, (GROUPS, m, n), (m * (n + pad), n + pad, 1), "f32")
    fakes = art["fake_arguments"]

    def tensor(fake, name):
        op = operands[name]
        if len(op.shape) == 3:  # torch [G, X, Y] is the kernel's (X, Y, G)
            g, x, y = op.shape
            sg, sx, sy = op.strides
            return ap.ctensor_from_fake(fake, op.ptr, (x, y, g), (sx, sy, sg))
        return ap.ctensor_from_fake(fake, op.ptr, op.shape, op.strides)

    if schedule.mma_applies_scales:  # blocked atoms of 128 rows x 4 scales along K, by address
        atoms_k = -(-k // (4 * schedule.scale.mma_vector))
        # Grouped: every group's atoms of B (and, masked, of A), one group after another.
        sa = (GROUPS if masked else 1) * -(-m // 128) * atoms_k * 512
        sb = (GROUPS if grouped else 1) * -(-n // 128) * atoms_k * 512
        operands["sfa"] = OperandInfo(0x7F3000000000, (sa,), (1,), "u8")
        operands["sfb"] = OperandInfo(0x7F4000000000, (sb,), (1,), "u8")
        a_fake, _, b_fake, _, d_fake = fakes[:5]
        args = [tensor(a_fake, "a"), ap.CPointer(operands["sfa"].ptr), tensor(b_fake, "b"),
                ap.CPointer(operands["sfb"].ptr), tensor(d_fake, "d")]
        extents = {"M": m, "N": n, "K": k, "SA": sa, "SB": sb}
        if masked:
            operands["masked_m"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            args += [ap.CPointer(operands["masked_m"].ptr)]
            extents.update(G=GROUPS)
        elif grouped:
            operands["m_indices"] = OperandInfo(0x7F5000000000, (m,), (1,), "i32")
            args += [ap.CPointer(operands["m_indices"].ptr), ap.CScalar(1)]
            extents.update(G=GROUPS, ZERO_PADDING=1)
        elif schedule.op.splits_last_wave:  # the weight gradient's tail-split switch, on
            args += [ap.CScalar(1)]
            extents.update(TAIL_SPLIT=1)
        if nvfp4:  # alpha, one fp32 by address
            operands["alpha"] = OperandInfo(0x7FC000000000, (1,), (1,), "f32")
            args += [ap.CPointer(operands["alpha"].ptr)]
        if schedule.op.is_k_grouped:  # tokens first: A [Σk, M] and B [Σk, N] as MN-major views
            m16, n16 = -(-m // 16) * 16, -(-n // 16) * 16
            sa, sb = -(-m16 // 128) * (kt // 128) * 512, -(-n16 // 128) * (kt // 128) * 512
            operands["a"] = OperandInfo(0x7F0000000000, (m16, kt), (1, m16), ab)
            operands["b"] = OperandInfo(0x7F1000000000, (n16, kt), (1, n16), ab)
            operands["d"] = OperandInfo(0x7F2000000000, (GROUPS, m16, n16), (m16 * (n16 + pad), n16 + pad, 1), "f32")
            operands["sfa"] = OperandInfo(0x7F3000000000, (sa,), (1,), "u8")
            operands["sfb"] = OperandInfo(0x7F4000000000, (sb,), (1,), "u8")
            operands["group_sizes"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            args = [tensor(a_fake, "a"), ap.CPointer(operands["sfa"].ptr), tensor(b_fake, "b"),
                    ap.CPointer(operands["sfb"].ptr), tensor(d_fake, "d"), ap.CPointer(operands["group_sizes"].ptr)]
            extents = {"M": m16, "N": n16, "KT": kt, "SA": sa, "SB": sb, "G": GROUPS}
    elif schedule.block_scaled:
        kb, nb = -(-k // 128), -(-n // 128)
        lds = -(-m // 4) * 4
        ue8m0 = schedule.scale.value == "ue8m0"
        sf = "i32" if ue8m0 else "f32"
        kc = -(-kb // 4) if ue8m0 else kb  # UE8M0: four exponent bytes per int32 word
        operands["sfa"] = (
            OperandInfo(0x7F3000000000, (GROUPS, m, kc), (kc * lds, 1, lds), sf)
            if masked
            else OperandInfo(0x7F3000000000, (m, kc), (1, lds), sf)
        )
        operands["sfb"] = OperandInfo(0x7F4000000000, (nb, kc), (kc, 1), sf)
        a_fake, sfa_fake, b_fake, sfb_fake, d_fake = fakes[:5]
        sfb_arg = ap.CPointer(operands["sfb"].ptr)
        if schedule.op.scales_b_per_row:  # SFB [N, KB] per row of B, MN-major and TMA-aligned
            ldn = -(-n // 4) * 4
            operands["sfb"] = OperandInfo(0x7F4000000000, (n, kb), (1, ldn), "f32")
            sfb_arg = tensor(sfb_fake, "sfb")
        args = [
            tensor(a_fake, "a"),
            tensor(sfa_fake, "sfa"),
            tensor(b_fake, "b"),
            sfb_arg,
            tensor(d_fake, "d"),
        ]
        extents = {"M": m, "N": n, "K": k, "KW" if ue8m0 else "KB": kc, "NB": nb}
        if grouped:
            operands["sfb"] = OperandInfo(0x7F4000000000, (GROUPS, nb, kc), (nb * kc, kc, 1), sf)
            args[3] = ap.CPointer(operands["sfb"].ptr)
        if fused:
            args.append(tensor(fakes[5], "d_sf"))
            extents.update(I=n // 2, IB=n // 256)
        if schedule.adds_bias:
            args.append(tensor(fakes[5], "bias"))
        if masked:
            operands["masked_m"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            args += [ap.CPointer(operands["masked_m"].ptr)]
            extents.update(G=GROUPS)
        elif grouped:
            operands["m_indices"] = OperandInfo(0x7F5000000000, (m,), (1,), "i32")
            args += [ap.CPointer(operands["m_indices"].ptr), ap.CScalar(1)]
            extents.update(G=GROUPS, ZERO_PADDING=1)
        if schedule.op.is_k_grouped:  # flat A, B as [rows, KT]; D [G, M, N]; sizes and workspace
            operands["group_sizes"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            operands["workspace"] = OperandInfo(0x7F7000000000, (32 * 132,), (1,), "i64")
            args = [
                tensor(a_fake, "a"), tensor(sfa_fake, "sfa"), tensor(b_fake, "b"), tensor(sfb_fake, "sfb"),
                tensor(d_fake, "d"), ap.CPointer(operands["group_sizes"].ptr),
                ap.CPointer(operands["workspace"].ptr),
            ]
            extents = {"M": m, "N": n, "KT": kt, "KB": kb, "G": GROUPS, "W": 32 * 132}
        if schedule.epilogue.splits_k:  # per-tile counters, fp32 partial tiles, the split count
            # At least a counter per CTA of any grid here (the last-wave kernels' requirement).
            tiles, partials = 264, 264 * K_SPLITS * schedule.tile_m * schedule.tile_n
            operands["split_counters"] = OperandInfo(0x7F8000000000, (tiles,), (1,), "i32")
            operands["split_partials"] = OperandInfo(0x7F9000000000, (partials,), (1,), "f32")
            args += [
                ap.CPointer(operands["split_counters"].ptr), ap.CPointer(operands["split_partials"].ptr),
                ap.CScalar(K_SPLITS),
            ]
            extents.update(TILES=tiles, PARTIALS=partials, K_SPLITS=K_SPLITS)
        if schedule.op.splits_last_wave:  # the tail-split switch, on
            args += [ap.CScalar(1)]
            extents.update(TAIL_SPLIT=1)
        if fused:
            args += [ap.CScalar(EPS)]
            extents.update(eps=EPS)
    else:
        a_fake, b_fake, d_fake = fakes[:3]
        args = [tensor(a_fake, "a"), tensor(b_fake, "b"), tensor(d_fake, "d")]
        extents = {"M": m, "N": n, "K": k}
        if schedule.adds_bias:
            args.append(tensor(fakes[3], "bias"))
        if schedule.op.is_k_grouped:  # BF16, tokens first: A [Σk, M] and B [Σk, N] as MN-major views
            m8, n8 = -(-m // 8) * 8, -(-n // 8) * 8
            operands["a"] = OperandInfo(0x7F0000000000, (m8, kt), (1, m8), ab)
            operands["b"] = OperandInfo(0x7F1000000000, (n8, kt), (1, n8), ab)
            operands["d"] = OperandInfo(0x7F2000000000, (GROUPS, m8, n8), (m8 * n8, n8, 1), "f32")
            operands["group_sizes"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            operands["workspace"] = OperandInfo(0x7F7000000000, (32 * 132,), (1,), "i64")
            args = [tensor(a_fake, "a"), tensor(b_fake, "b"), tensor(d_fake, "d"),
                    ap.CPointer(operands["group_sizes"].ptr), ap.CPointer(operands["workspace"].ptr)]
            extents = {"M": m8, "N": n8, "KT": kt, "G": GROUPS, "W": 32 * 132}
        elif masked:  # the BF16 grouped layouts: no scales
            operands["masked_m"] = OperandInfo(0x7F6000000000, (GROUPS,), (1,), "i32")
            args += [ap.CPointer(operands["masked_m"].ptr)]
            extents.update(G=GROUPS)
        elif grouped:
            operands["m_indices"] = OperandInfo(0x7F5000000000, (m,), (1,), "i32")
            args += [ap.CPointer(operands["m_indices"].ptr), ap.CScalar(0)]
            extents.update(G=GROUPS, ZERO_PADDING=0)
    args += [ap.CScalar(max_clusters), ap.CStream(0x5000)]
    captured = ap.capture_launch(art["compiled"], args, tmp_path / "probe")

    # Launch facts: block, cluster, dynamic shared memory, and the grid rule.
    assert captured.block == tuple(manifest.block)
    assert captured.cluster == tuple(manifest.cluster)
    assert captured.smem_bytes == manifest.smem_bytes
    grid, _ = compute_grid(manifest, extents, max_clusters)
    assert captured.grid == grid

    # Parameters: the runtime's TMA recipes and extents, packed, equal the DSL's bytes.
    maps = {}
    for p in manifest.params:
        if p.binding["kind"] != "tma":
            continue
        op = operands[p.binding["operand"]]
        tma = tma_args_from_binding(p.binding, op.shape, op.strides, ELEM_BITS[op.dtype], op.ptr, p.binding["operand"])
        maps[p.name] = with_dsl_private_bits(encode_like_the_runtime(tma), captured.params[p.index])
        # Field by field first, so a failure says which field differs.
        dsl = decode_tensor_map(captured.params[p.index])
        assert dsl["global_address"] == tma.global_address, p.name
        assert dsl["global_dims"] == list(tma.global_dims), p.name
        assert dsl["global_strides"] == list(tma.global_strides), p.name
        assert dsl["box_dims"] == list(tma.box), p.name
        assert dsl["element_strides"] == list(tma.element_strides), p.name
        assert dsl["swizzle"] == tma.swizzle, p.name
        assert dsl["l2_promotion"] == tma.l2_promotion, p.name
        assert dsl["oob_fill"] == tma.oob_fill and dsl["interleave"] == tma.interleave, p.name
    blob = pack_params(manifest, extents, operands, maps).tobytes()
    ours = [blob[p.offset : p.offset + p.size] for p in manifest.params]
    assert captured.mismatches(ours) == []
