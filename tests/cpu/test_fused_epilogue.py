"""CPU tier: the fused epilogues without a GPU — SwiGLU + FP8 quantize, and bias + activation: their
schedules (names, rules, contract), the weight arrangement and reference numerics they follow, and
their ops' input checks on fake CUDA tensors (bad inputs refused naming the argument before anything
could be launched)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cutegen.runtime import epilogue_ops, fused_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402
from cutegen.runtime.fused_reference import (  # noqa: E402
    ACTIVATIONS,
    bias_activation_ref,
    deinterleave_gate_up,
    interleave_gate_up,
    swiglu_quant_ref,
    swiglu_ref,
)
from cutegen.runtime.quant_reference import dequant_per_token, per_token_quant_fp8_ref  # noqa: E402
from cutegen.schedules.contract import op_contract  # noqa: E402
from cutegen.schedules.loader import default_schedules  # noqa: E402
from cutegen.schedules.naming import parse_name, procedural_name  # noqa: E402
from cutegen.schedules.predicates import violations  # noqa: E402
from cutegen.schedules.spec import Activation, Bias, DType, Epilogue, Layout, Op, OutputScale  # noqa: E402

E4M3 = torch.float8_e4m3fn
M, I, K, G = 200, 256, 512, 3
N, KB = 2 * I, K // 128


def swiglu_schedules():
    return [s for s in default_schedules() if s.stages_quantized_rows]


# ---- schedules -------------------------------------------------------------------------------


def test_default_swiglu_schedules_cover_the_three_layouts_and_name_their_entry():
    entries = {s.entry for s in swiglu_schedules()}
    assert entries == {
        f"{op}_swiglu_quant{rounding}"
        for op in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")
        for rounding in ("", "_ue8m0")
    }
    for s in swiglu_schedules():
        name = procedural_name(s)
        rounds = s.d_scale == OutputScale.UE8M0
        assert name.endswith("_swiglu_ue8m0" if rounds else "_swiglu") and parse_name(name) == s
        assert s.entry.endswith("_ue8m0") == rounds
        # Every kernel comes with both roundings, otherwise the same.
        assert dataclasses.replace(s, d_scale=OutputScale.F32 if rounds else OutputScale.UE8M0) in swiglu_schedules()
        # The activation changes the entry, never a plain kernel's name or entry.
        plain = dataclasses.replace(s, activation=Activation.NONE, c_dtype=DType.BF16, d_scale=OutputScale.F32)
        assert plain.entry == s.op.value and not procedural_name(plain).endswith("_swiglu")


def test_swiglu_rows_are_staged_for_one_bulk_copy_each():
    """The quantized tile is staged in shared memory, one padded row per row of the tile, each
    row's start 16-byte aligned as a bulk copy's source must be; the bytes count in the schedule's
    shared memory, within the opt-in limit."""
    from cutegen.schedules.spec import QUANTIZED_ROW_PAD_BYTES, SM90_SMEM_OPT_IN_BYTES

    for s in swiglu_schedules():
        assert s.quantized_row_bytes == s.tile_n // 2 + QUANTIZED_ROW_PAD_BYTES
        assert s.quantized_row_bytes % 16 == 0 and (s.tile_n // 2) % 16 == 0
        assert s.epilogue_bytes == s.tile_m * s.quantized_row_bytes
        assert s.smem_bytes <= SM90_SMEM_OPT_IN_BYTES and not violations(s)


def test_names_with_a_layout_and_an_activation_parse_in_order_only():
    s = swiglu_schedules()[0]
    name = procedural_name(s)
    with pytest.raises(ValueError, match="not a layout, bias, activation, output scale or operand roles tag"):
        parse_name(name + "_nt")
    with pytest.raises(ValueError, match="not a layout, bias, activation, output scale or operand roles tag"):
        parse_name(name + "_ue8m0_swiglu")
    with pytest.raises(ValueError, match="not a canonical"):
        parse_name(name + "_f32")  # the default rounding is never named
    with pytest.raises(ValueError, match="not a canonical"):
        parse_name(name.replace("_swiglu", "_nt_swiglu"))


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"c_dtype": DType.BF16}, "activation_output"),
        ({"tile_n": 128}, "swiglu_tile_pairs_gate_and_up"),
        ({"epilogue": Epilogue.TMA_STORE_PER_WARPGROUP}, "fused_epilogue_stores"),
        ({"bias": Bias.COLUMN}, "bias_ops"),
        ({"d_scale": OutputScale.UE8M0, "activation": Activation.NONE, "c_dtype": DType.BF16},
         "rounded_scales_quantized_output"),
    ],
)
def test_each_swiglu_constraint_is_one_named_rule(change, rule):
    s = dataclasses.replace(swiglu_schedules()[0], **change)
    assert rule in {v.name for v in violations(s)}


def test_activations_are_fused_only_into_the_fp8_up_projection_ops():
    plain = next(s for s in default_schedules() if s.op.value == "bf16_gemm_nt")
    s = dataclasses.replace(plain, activation=Activation.SWIGLU, c_dtype=DType.E4M3, tile_n=256)
    assert "activation_ops" in {v.name for v in violations(s)}


def test_contract_writes_e4m3_d_its_scales_and_takes_eps():
    for s in swiglu_schedules():
        args = {a.name: a for a in op_contract(s)}
        lead = ("G",) if s.op.is_masked else ()
        assert args["d"].dtype == "e4m3" and args["d"].shape == (*lead, "M", "I") and args["d"].written
        assert args["d_sf"].shape == (*lead, "M", "IB") and args["d_sf"].contiguous_mode == len(lead)
        assert args["eps"].scalar and list(args)[-1] == "eps"


# ---- weights and numerics ----------------------------------------------------------------------


def test_interleave_gate_up_puts_each_128_block_of_gate_before_its_up_block():
    w = torch.randn(G, 2 * I, K)
    sf = torch.rand(G, 2 * I // 128, KB)
    w2, sf2 = interleave_gate_up(w, sf)
    for j in range(I // 128):
        assert torch.equal(w2[:, 256 * j:256 * j + 128], w[:, 128 * j:128 * j + 128])
        assert torch.equal(w2[:, 256 * j + 128:256 * j + 256], w[:, I + 128 * j:I + 128 * j + 128])
        assert torch.equal(sf2[:, 2 * j], sf[:, j]) and torch.equal(sf2[:, 2 * j + 1], sf[:, I // 128 + j])
    assert torch.equal(deinterleave_gate_up(w2), w)


def test_interleave_gate_up_refuses_an_intermediate_size_off_128():
    with pytest.raises(InputError, match="argument 'w'.*multiple of 128"):
        interleave_gate_up(torch.randn(2 * 192, 64))
    with pytest.raises(InputError, match="argument 'sf'"):
        interleave_gate_up(torch.randn(512, 256), torch.rand(3, 2))


def test_the_kernels_tiles_compute_the_reference_from_interleaved_weights():
    """What a 256-wide tile of the interleaved GEMM yields (its first 128 columns gate, the next 128
    up; tile j gives activation columns 128j..128j+127) is the reference's SwiGLU of the plain GEMM."""
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.float64)
    w13 = torch.randn(N, K, dtype=torch.float64)
    h = (x @ w13.T).float()
    h_interleaved = (x @ interleave_gate_up(w13).T).float()
    tiles = []
    for j in range(I // 128):
        tile = h_interleaved[:, 256 * j:256 * j + 256]
        gate, up = tile[:, :128], tile[:, 128:]
        tiles.append(gate / (1 + torch.exp(-gate)) * up)
    act = torch.cat(tiles, dim=1)
    torch.testing.assert_close(act, swiglu_ref(h), rtol=2e-6, atol=1e-5)
    q, s = per_token_quant_fp8_ref(swiglu_ref(h))
    q_ref, s_ref = swiglu_quant_ref(h)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


def test_swiglu_quant_reference_is_close_to_the_float64_activation():
    torch.manual_seed(1)
    h = torch.randn(G, 64, N) * 4
    q, s = swiglu_quant_ref(h)
    assert q.shape == (G, 64, I) and s.shape == (G, 64, I // 128)
    exact = torch.nn.functional.silu(h[..., :I].double()) * h[..., I:].double()
    for g in range(G):
        deq = dequant_per_token(q[g], s[g]).double()
        # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value, plus the group's scale floor.
        assert ((deq - exact[g]).abs() <= exact[g].abs() / 16 + s[g].repeat_interleave(128, 1) * 2 ** -9 + 1e-30).all()


def test_ue8m0_reference_rounds_each_scale_up_to_a_power_of_two_and_quantizes_with_it():
    torch.manual_seed(4)
    h = torch.randn(G, 64, N) * 4
    q, s = swiglu_quant_ref(h)
    q8, s8 = swiglu_quant_ref(h, use_ue8m0=True)
    assert s8.dtype == torch.float32 and s8.shape == s.shape
    mantissa, _ = torch.frexp(s8)
    assert (mantissa == 0.5).all() and (s8 >= s).all() and (s8 < 2 * s).all()
    assert (s8 != s).any()
    # The values are those the per-token quantizer writes with UE8M0 scales.
    act = swiglu_ref(h)
    for g in range(G):
        ref_q, _ = per_token_quant_fp8_ref(act[g], scale_format="ue8m0")
        assert torch.equal(q8[g].view(torch.uint8), ref_q.view(torch.uint8))


# ---- input checks on fake CUDA tensors ---------------------------------------------------------


def fp8(*shape):
    return torch.empty(*shape, dtype=E4M3, device="cuda")


def mn_major(rows, cols, groups=None):
    lds = -(-rows // 4) * 4
    if groups is None:
        return torch.empty_strided((rows, cols), (1, lds), device="cuda")
    return torch.empty_strided((groups, rows, cols), (cols * lds, 1, lds), device="cuda")


def dense(**changes):
    ops = {"a": fp8(M, K), "sfa": mn_major(M, KB), "b": fp8(N, K), "sfb": torch.empty(N // 128, KB, device="cuda"),
           "out": None, "out_sf": None, "eps": 1e-4}
    ops.update(changes)
    return fused_ops._dense_meta(**ops)


def masked(**changes):
    ops = {"a": fp8(G, 64, K), "sfa": mn_major(64, KB, G), "b": fp8(G, N, K),
           "sfb": torch.empty(G, N // 128, KB, device="cuda"), "masked_m": torch.empty(G, dtype=torch.int32, device="cuda"),
           "out": None, "out_sf": None, "eps": 1e-4}
    ops.update(changes)
    return fused_ops._masked_meta(**ops)


def contiguous(**changes):
    m = 256
    ops = {"a": fp8(m, K), "sfa": mn_major(m, KB), "b": fp8(G, N, K), "sfb": torch.empty(G, N // 128, KB, device="cuda"),
           "m_indices": torch.empty(m, dtype=torch.int32, device="cuda"), "out": None, "out_sf": None, "eps": 1e-4}
    ops.update(changes)
    return fused_ops._contiguous_meta(**ops)


def test_well_formed_calls_pass_the_checks():
    with FakeTensorMode():
        assert dense() == (M, N, K, I)
        assert dense(out=fp8(M, I), out_sf=mn_major(M, I // 128)) == (M, N, K, I)
        assert masked(out=fp8(G, 64, I), out_sf=mn_major(64, I // 128, G)) == (G, 64, N, K, I)
        assert contiguous() == (256, N, K, I)


@pytest.mark.parametrize(
    "check, change, arg",
    [
        (dense, lambda: {"b": fp8(384, K), "sfb": torch.empty(3, KB, device="cuda")}, "b"),
        (dense, lambda: {"sfa": mn_major(M, -(-KB // 4)).to(torch.int32), "sfb": torch.empty(4, 1, dtype=torch.int32, device="cuda")}, "sfa"),
        (dense, lambda: {"out": fp8(M, N)}, "out"),
        (dense, lambda: {"out": torch.empty(M, I, dtype=torch.bfloat16, device="cuda")}, "out"),
        (dense, lambda: {"out_sf": torch.empty(M, I // 128, device="cuda")}, "out_sf"),
        (dense, lambda: {"eps": 0.0}, "eps"),
        (dense, lambda: {"a": fp8(M, K + 128)}, "b"),
        (masked, lambda: {"out": fp8(G, 64, N)}, "out"),
        (masked, lambda: {"out_sf": mn_major(64, I // 128)}, "out_sf"),
        (masked, lambda: {"masked_m": torch.empty(G + 1, dtype=torch.int32, device="cuda")}, "masked_m"),
        (contiguous, lambda: {"m_indices": torch.empty(255, dtype=torch.int32, device="cuda")}, "m_indices"),
    ],
)
def test_bad_inputs_are_refused_naming_the_argument_and_the_fused_op(check, change, arg):
    op = {dense: fused_ops.OP_DENSE, masked: fused_ops.OP_MASKED, contiguous: fused_ops.OP_CONTIGUOUS}[check]
    with FakeTensorMode():
        with pytest.raises(InputError, match=rf"^{op}: argument '{arg}'"):
            check(**change())


def test_entry_points_refuse_a_kernel_that_is_not_a_name():
    with pytest.raises(InputError, match="argument 'kernel'"):
        fused_ops.fp8_gemm_nt_swiglu_quant(None, None, None, None, kernel=3)


def test_entry_points_refuse_a_rounding_flag_that_is_not_a_bool():
    with FakeTensorMode():
        sfb = torch.empty(N // 128, KB, device="cuda")
        with pytest.raises(InputError, match=rf"^{fused_ops.OP_DENSE}: argument 'use_ue8m0' must be a bool"):
            fused_ops.fp8_gemm_nt_swiglu_quant(fp8(M, K), mn_major(M, KB), fp8(N, K), sfb, use_ue8m0="yes")


# ---- bias and activation ----------------------------------------------------------------------


def bias_activation_schedules():
    return [s for s in default_schedules() if s.transforms_sum]


def test_bias_activation_schedules_cover_both_dense_gemms_and_every_epilogue():
    want = {f"{gemm}{suffix}" for gemm in ("fp8_gemm_nt", "bf16_gemm_nt")
            for suffix in ("_bias", "_bias_silu", "_bias_gelu", "_silu", "_gelu")}
    assert {s.entry for s in bias_activation_schedules()} == want
    for s in bias_activation_schedules():
        assert s.c_dtype == DType.BF16
        assert parse_name(procedural_name(s)) == s
        # The runtime names the entry of a call's epilogue as the generator names the schedule's.
        op = epilogue_ops.OP_FP8 if s.op == Op.FP8_GEMM_NT else epilogue_ops.OP_BF16
        assert epilogue_ops.entry(op, s.adds_bias, s.activation.value) == s.entry
        args = [a.name for a in op_contract(s)]
        assert args[: args.index("d") + 1] == list(epilogue_ops.OPERANDS[op])
        assert ("bias" in args) == s.adds_bias


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"op": Op.FP8_WGRAD_GEMM_NT}, "bias_ops"),
        ({"c_dtype": DType.F32}, "bias_ops"),
        ({"activation": Activation.SWIGLU}, "bias_ops"),
        ({"epilogue": Epilogue.SPLIT_K_TMA_STORE}, "fused_epilogue_stores"),
        ({"layout": Layout.NN}, "fused_epilogue_stores"),
    ],
)
def test_each_bias_constraint_is_one_named_rule(change, rule):
    s = next(s for s in bias_activation_schedules() if s.adds_bias and s.op == Op.BF16_GEMM_NT)
    assert rule in {v.name for v in violations(dataclasses.replace(s, **change))}


def test_a_residual_is_a_bias_kernel_adding_into_d():
    adding = [s for s in bias_activation_schedules() if s.adds_into_d]
    assert {s.entry for s in adding} == {"bf16_gemm_nt_bias", "fp8_gemm_nt_bias"}
    assert all(s.epilogue == Epilogue.TMA_STORE_ADD for s in adding)
    # An activation may add into D too (D = C + act(A·Bᵀ + bias)); SwiGLU's stores may not.
    assert not violations(dataclasses.replace(adding[0], activation=Activation.GELU))
    assert "fused_epilogue_stores" in {v.name for v in violations(
        dataclasses.replace(swiglu_schedules()[0], epilogue=Epilogue.TMA_STORE_ADD))}


def test_elementwise_activations_write_bf16_from_the_dense_gemms_only():
    s = next(s for s in bias_activation_schedules() if not s.adds_bias and s.op == Op.FP8_GEMM_NT)
    assert "activation_output" in {v.name for v in violations(dataclasses.replace(s, c_dtype=DType.F32))}
    grouped = next(g for g in default_schedules() if g.op == Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS)
    assert "activation_ops" in {v.name for v in violations(dataclasses.replace(grouped, activation=Activation.GELU))}


def test_bias_activation_reference_is_act_of_the_biased_fp32_sum_rounded_once():
    torch.manual_seed(2)
    h, bias = torch.randn(33, 200) * 3, torch.randn(200).to(torch.bfloat16)
    y = (h.double() + bias.double())
    exact = {"none": y, "silu": y / (1 + torch.exp(-y)), "gelu": 0.5 * y * (1 + torch.erf(y / 2 ** 0.5))}
    for act in ACTIVATIONS:
        got = bias_activation_ref(h, bias, act)
        assert got.dtype == torch.bfloat16
        # One rounding to bf16 (8 bits of mantissa) of a value computed in fp32.
        assert ((got.double() - exact[act]).abs() <= exact[act].abs() * 2 ** -8 + 1e-6).all(), act
    assert torch.equal(bias_activation_ref(h), h.to(torch.bfloat16))
    with pytest.raises(InputError, match="argument 'activation'"):
        bias_activation_ref(h, None, "relu")


def bf16(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="cuda")


def fp8_epilogue(**changes):
    ops = {"a": fp8(M, K), "sfa": mn_major(M, KB), "b": fp8(N, K), "sfb": torch.empty(N // 128, KB, device="cuda"),
           "bias": bf16(N), "activation": "gelu", "out": None}
    ops.update(changes)
    return epilogue_ops._fp8_meta(**ops)


def bf16_epilogue(**changes):
    ops = {"a": bf16(M, K), "b": bf16(N, K), "bias": bf16(N), "activation": "silu", "out": None}
    ops.update(changes)
    return epilogue_ops._bf16_meta(**ops)


def bf16_residual(c, activation="none"):
    return epilogue_ops.bf16_gemm_nt_epilogue(bf16(M, K), bf16(N, K), bf16(N), activation, c=c)


def fp8_residual(c, bias=None, activation="none"):
    b = torch.empty(N // 128, KB, device="cuda")
    return epilogue_ops.fp8_gemm_nt_epilogue(fp8(M, K), mn_major(M, KB), fp8(N, K), b, bias, activation, c=c)


def test_well_formed_epilogue_calls_pass_the_checks():
    with FakeTensorMode():
        assert fp8_epilogue() == (M, N, K)
        assert fp8_epilogue(bias=None, activation="silu", out=bf16(M, N)) == (M, N, K)
        assert bf16_epilogue(activation="none", out=bf16(M, N)) == (M, N, K)


@pytest.mark.parametrize(
    "check, change, arg",
    [
        (fp8_epilogue, lambda: {"bias": torch.empty(N, device="cuda")}, "bias"),
        (fp8_epilogue, lambda: {"bias": bf16(N + 8)}, "bias"),
        (fp8_epilogue, lambda: {"bias": torch.empty_strided((N,), (2,), dtype=torch.bfloat16, device="cuda")}, "bias"),
        (fp8_epilogue, lambda: {"bias": torch.empty(N, dtype=torch.bfloat16)}, "bias"),
        (fp8_epilogue, lambda: {"activation": "relu"}, "activation"),
        (fp8_epilogue, lambda: {"sfa": mn_major(M, -(-KB // 4)).to(torch.int32),
                                "sfb": torch.empty(N // 128, 1, dtype=torch.int32, device="cuda")}, "sfa"),
        (fp8_epilogue, lambda: {"out": bf16(M, N + 8)}, "out"),
        (fp8_epilogue, lambda: {"out": torch.empty(M, N, device="cuda")}, "out"),
        (fp8_epilogue, lambda: {"a": fp8(M, K + 128)}, "b"),
        (bf16_epilogue, lambda: {"a": bf16(K, M).t()}, "a"),
        (bf16_epilogue, lambda: {"bias": bf16(1, N)}, "bias"),
        (bf16_epilogue, lambda: {"out": bf16(N, M).t()}, "out"),
        (bf16_residual, lambda: {"c": bf16(M, N + 8)}, "c"),
        (bf16_residual, lambda: {"c": torch.empty(M, N, device="cuda")}, "c"),
        (bf16_residual, lambda: {"c": bf16(M, N), "activation": "silu"}, "c"),
        (fp8_residual, lambda: {"c": bf16(M, N + 8)}, "c"),
        (fp8_residual, lambda: {"c": torch.empty(M, N, device="cuda")}, "c"),
        (fp8_residual, lambda: {"c": bf16(M, N), "bias": bf16(N), "activation": "gelu"}, "c"),
        (fp8_residual, lambda: {"c": bf16(M, N), "bias": bf16(N - 8)}, "bias"),
    ],
)
def test_bad_epilogue_inputs_are_refused_naming_the_argument_and_the_op(check, change, arg):
    op = epilogue_ops.OP_FP8 if check in (fp8_epilogue, fp8_residual) else epilogue_ops.OP_BF16
    with FakeTensorMode():
        with pytest.raises(InputError, match=rf"^{op}: argument '{arg}'"):
            check(**change())


def test_epilogue_entry_points_refuse_a_kernel_that_is_not_a_name():
    with pytest.raises(InputError, match="argument 'kernel'"):
        epilogue_ops.bf16_gemm_nt_epilogue(None, None, kernel=3)


# ---- the benchmark's report (its measurement needs a GPU) --------------------------------------


def test_fused_benchmark_renders_its_rows_against_the_targets():
    from cutegen.bench import fused as bench_fused

    us = {"fused": 100.0, "gemm": 97.0, "gemm + torch.compile": 140.0, "gemm + cutegen quantize": 130.0}
    row = {"model": "DeepSeek-V3", "layout": "masked", "groups": 32, "expected": 16, "hidden": 7168,
           "intermediate": 2048, "rows": 512, "us": us, "fused_tflops": 300.0,
           "best_unfused": "gemm + cutegen quantize", "speedup": 1.3, "vs_gemm": 100 / 97}
    text = bench_fused.render({"rows": [row]})
    assert "decode (masked): fused 1.30x the best unfused pipeline" in text
    assert "| DeepSeek-V3 | masked | 32 x ~16 | 7168, 2048 | 100.0 | 300 | 97.0 |" in text
    assert "prefill" not in text and "bias" not in text
    dense = {"gemm": "bf16_gemm_nt", "m": 4096, "n": 16384, "k": 4096, "tflops": 700.0, "best_unfused": "gemm + torch.compile",
             "us": {"fused": 800.0, "gemm": 780.0, "gemm + torch": 1000.0, "gemm + torch.compile": 900.0},
             "speedup": 900 / 800, "vs_gemm": 800 / 780}
    text = bench_fused.render({"rows": [], "bias_activation": [dense]})
    assert "dense GEMM + bias + GELU: fused 1.12x the best unfused pipeline" in text
    assert "| bf16_gemm_nt | 4096, 16384, 4096 | 800.0 | 700 | 780.0 | gemm + torch 1000.0, gemm + torch.compile 900.0 |" in text
