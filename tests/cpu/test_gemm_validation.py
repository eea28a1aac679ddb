"""CPU tier: the FP8 GEMM ops' input validation on fake CUDA tensors (no GPU): `fp8_gemm_nt`, the
dense weight gradient and the two M-grouped layouts refuse bad inputs with an error that names the
argument, before anything could be launched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cutegen.runtime import fp8_ops, grouped_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402

M, N, K, G = 256, 384, 512, 3
KB, NB = K // 128, -(-N // 128)
E4M3 = torch.float8_e4m3fn


def fp8(*shape):
    return torch.empty(*shape, dtype=E4M3, device="cuda")


def fp4(*shape_and_dtype):
    """Packed FP4 weights: two e2m1 per byte."""
    *shape, dtype = shape_and_dtype if isinstance(shape_and_dtype[-1], torch.dtype) else (*shape_and_dtype, torch.uint8)
    return torch.empty(*shape, dtype=dtype, device="cuda")


def mn_major(rows, cols, dtype=torch.float32):
    """[rows, cols] with strides (1, align(rows, 4)): MN-major and TMA-aligned (fp32 scales, or
    int32 words of packed UE8M0 scales)."""
    return torch.empty_strided((rows, cols), (1, -(-rows // 4) * 4), device="cuda", dtype=dtype)


KW = -(-KB // 4)  # UE8M0: four K blocks per int32 word


def mn_major_groups(groups, rows, cols, dtype=torch.int32):
    """[groups, rows, cols], each group MN-major and TMA-aligned, groups back to back."""
    lds = -(-rows // 4) * 4
    return torch.empty_strided((groups, rows, cols), (cols * lds, 1, lds), device="cuda", dtype=dtype)
I32 = torch.int32


def dense(**changes):
    ops = {"a": fp8(M, K), "sfa": mn_major(M, KB), "b": fp8(N, K), "sfb": torch.empty(NB, KB, device="cuda"),
           "out": None}
    ops.update(changes)
    return fp8_ops._check_meta(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["out"])


def wgrad(**changes):
    ops = {"a": fp8(M, K), "sfa": mn_major(M, KB), "b": fp8(N, K), "sfb": mn_major(N, KB),
           "d": torch.empty(M, N, device="cuda"), "c": None}
    ops.update(changes)
    return fp8_ops._check_wgrad(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["d"], ops["c"])


def contiguous(**changes):
    ops = {"a": fp8(M, K), "sfa": mn_major(M, KB), "b": fp8(G, N, K), "sfb": torch.empty(G, NB, KB, device="cuda"),
           "m_indices": torch.empty(M, dtype=torch.int32, device="cuda"), "out": None}
    ops.update(changes)
    return grouped_ops._check_meta(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["m_indices"], ops["out"])


def masked(**changes):
    lds = -(-M // 4) * 4
    ops = {"a": fp8(G, M, K), "sfa": torch.empty_strided((G, M, KB), (KB * lds, 1, lds), device="cuda"),
           "b": fp8(G, N, K), "sfb": torch.empty(G, NB, KB, device="cuda"),
           "masked_m": torch.empty(G, dtype=torch.int32, device="cuda"), "out": None}
    ops.update(changes)
    return grouped_ops._check_masked(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["masked_m"], ops["out"])


def test_valid_operands():
    with FakeTensorMode():
        assert dense() == (M, N, K)
        assert dense(out=torch.empty(M, N, dtype=torch.bfloat16, device="cuda")) == (M, N, K)
        # UE8M0 scales packed four per int32 (taken by the sm_100a kernels)
        assert dense(sfa=mn_major(M, KW, I32), sfb=torch.empty(NB, KW, dtype=I32, device="cuda")) == (M, N, K)
        # ... and DeepGEMM's SM100 sfb: per row of B, MN-major and TMA-aligned (block-scaled kernels)
        assert dense(sfa=mn_major(M, KW, I32), sfb=mn_major(N, KW, I32)) == (M, N, K)
        assert dense(b=fp8(1, K), sfa=mn_major(M, KW, I32), sfb=mn_major(1, KW, I32)) == (M, 1, K)
        # FP8 x FP4: packed e2m1 B [N, K/2], UE8M0 per 1x128 of A and per 1x32 of B, per row
        assert dense(b=fp4(N, K // 2), sfa=mn_major(M, KW, I32), sfb=mn_major(N, K // 128, I32)) == (M, N, K)
        assert dense(b=fp4(N, K // 2, torch.int8), sfa=mn_major(M, KW, I32), sfb=mn_major(N, K // 128, I32)) == (M, N, K)
        # K not a multiple of 128: the last scale block is partial (K = 576: 5 scale blocks)
        assert dense(a=fp8(M, 576), b=fp8(N, 576), sfa=mn_major(M, 5), sfb=torch.empty(NB, 5, device="cuda")) == (M, N, 576)
        assert wgrad() == (M, N, K)
        assert wgrad(sfa=mn_major(M, KW, I32), sfb=mn_major(N, KW, I32)) == (M, N, K)  # packed UE8M0 (sm_100a)
        assert contiguous() == (M, N, K, G)
        assert masked() == (G, M, N, K)
        # Packed UE8M0 scales (the block-scaled kernels): SFB per row of each expert or per block,
        # FP4 experts with SFB per 1x32
        per_row_b = mn_major_groups(G, N, KW)
        assert contiguous(sfa=mn_major(M, KW, I32), sfb=per_row_b) == (M, N, K, G)
        assert contiguous(sfa=mn_major(M, KW, I32), sfb=torch.empty(G, NB, KW, dtype=I32, device="cuda")) == (M, N, K, G)
        assert contiguous(b=fp4(G, N, K // 2), sfa=mn_major(M, KW, I32), sfb=mn_major_groups(G, N, K // 128)) == (M, N, K, G)
        assert masked(sfa=mn_major_groups(G, M, KW), sfb=per_row_b) == (G, M, N, K)
        assert masked(b=fp4(G, N, K // 2), sfa=mn_major_groups(G, M, KW), sfb=mn_major_groups(G, N, K // 128)) == (G, M, N, K)


BAD = [
    (dense, "a", lambda: {"a": torch.empty(M, K, dtype=torch.bfloat16, device="cuda")}),
    (dense, "a", lambda: {"a": torch.empty_strided((M, K + 8), (K + 16, 1), dtype=E4M3, device="cuda"),
                          "b": torch.empty_strided((N, K + 8), (K + 16, 1), dtype=E4M3, device="cuda")}),  # K % 16
    (dense, "sfa", lambda: {"a": fp8(M, K + 64), "b": fp8(N, K + 64)}),  # K/128 rounded up: one more scale block
    (dense, "b", lambda: {"b": fp8(N, K - 128)}),
    (dense, "b", lambda: {"b": torch.empty_strided((N, K), (K + 8, 1), dtype=E4M3, device="cuda")}),
    (dense, "sfa", lambda: {"sfa": torch.empty(M, KB, device="cuda")}),  # row-major, not MN-major
    (dense, "sfa", lambda: {"sfa": mn_major(M, KB + 1)}),
    (dense, "sfb", lambda: {"sfb": torch.empty(NB + 1, KB, device="cuda")}),
    (dense, "sfb", lambda: {"sfb": torch.empty(NB, KB, device="cuda", dtype=torch.bfloat16)}),
    (dense, "sfb", lambda: {"sfa": mn_major(M, KW, I32)}),  # one scale format for both
    (dense, "sfa", lambda: {"sfa": mn_major(M, KB, I32), "sfb": torch.empty(NB, KB, dtype=I32, device="cuda")}),
    (dense, "sfb", lambda: {"sfa": mn_major(M, KW, I32), "sfb": torch.empty(NB, KB, dtype=I32, device="cuda")}),
    (dense, "sfa", lambda: {"sfa": torch.empty_strided((M, KW), (2, 1), dtype=I32, device="cuda"),
                            "sfb": torch.empty(NB, KW, dtype=I32, device="cuda")}),  # not MN-major
    (dense, "sfb", lambda: {"a": fp8(M, 1024), "b": fp8(N, 1024), "sfa": mn_major(M, 2, I32),
                            "sfb": torch.empty(N, 2, dtype=I32, device="cuda")}),  # per row, row-major
    (dense, "sfb", lambda: {"sfa": mn_major(M, KW, I32), "sfb": mn_major(N, KW + 1, I32)}),
    (dense, "sfb", lambda: {"sfb": mn_major(N, KB)}),  # fp32 scales are per 128x128 block only
    (dense, "b", lambda: {"b": fp4(N, K), "sfa": mn_major(M, KW, I32), "sfb": mn_major(N, K // 128, I32)}),  # K bytes, not K/2
    (dense, "a", lambda: {"a": fp8(M, 576), "b": fp4(N, 288), "sfa": mn_major(M, 2, I32),
                          "sfb": mn_major(N, 5, I32)}),  # FP4 needs K % 128 == 0
    (dense, "b", lambda: {"b": torch.empty_strided((N, K // 2), (K // 2 + 16, 1), dtype=torch.uint8, device="cuda"),
                          "sfa": mn_major(M, KW, I32), "sfb": mn_major(N, K // 128, I32)}),  # rows not 32-byte
    (dense, "sfa", lambda: {"b": fp4(N, K // 2), "sfb": mn_major(N, K // 128, I32)}),  # fp32 sfa with FP4
    (dense, "sfb", lambda: {"b": fp4(N, K // 2), "sfa": mn_major(M, KW, I32), "sfb": mn_major(N, KW, I32)}),  # per 1x128
    (dense, "sfb", lambda: {"b": fp4(N, K // 2), "sfa": mn_major(M, KW, I32),
                            "sfb": torch.empty(N, K // 128, dtype=I32, device="cuda")}),  # row-major
    (dense, "out", lambda: {"out": torch.empty(M, N, device="cuda")}),
    (dense, "out", lambda: {"out": torch.empty(M, N + 8, dtype=torch.bfloat16, device="cuda")}),
    (wgrad, "sfb", lambda: {"sfb": torch.empty(NB, KB, device="cuda")}),  # 128x128 blocks, not per row
    (wgrad, "sfb", lambda: {"sfa": mn_major(M, KW, I32)}),  # packed sfa, fp32 sfb
    (wgrad, "sfa", lambda: {"sfa": mn_major(M, KW + 1, I32), "sfb": mn_major(N, KW, I32)}),
    (wgrad, "d", lambda: {"d": torch.empty(M, N, dtype=torch.bfloat16, device="cuda")}),
    (wgrad, "d", lambda: {"d": torch.empty(N, M, device="cuda")}),
    (wgrad, "c", lambda: {"c": torch.empty(M, N - 1, device="cuda")}),
    (contiguous, "a", lambda: {"a": fp8(M - 8, K), "sfa": mn_major(M - 8, KB),
                               "m_indices": torch.empty(M - 8, dtype=torch.int32, device="cuda")}),
    (contiguous, "b", lambda: {"b": fp8(N, K)}),  # no group mode
    (contiguous, "sfb", lambda: {"sfb": torch.empty(NB, KB, device="cuda")}),
    (contiguous, "m_indices", lambda: {"m_indices": torch.empty(M, dtype=torch.int64, device="cuda")}),
    (contiguous, "m_indices", lambda: {"m_indices": torch.empty(M - 1, dtype=torch.int32, device="cuda")}),
    (contiguous, "sfb", lambda: {"sfa": mn_major(M, KW, I32)}),  # fp32 sfb beside packed sfa
    (contiguous, "sfa", lambda: {"sfa": mn_major(M, KW + 1, I32), "sfb": mn_major_groups(G, N, KW)}),
    (contiguous, "sfb", lambda: {"sfa": mn_major(M, KW, I32), "sfb": mn_major_groups(G, N, KW + 1)}),
    (contiguous, "sfa", lambda: {"b": fp4(G, N, K // 2), "sfb": mn_major_groups(G, N, K // 128)}),  # FP4 needs packed
    (contiguous, "sfb", lambda: {"b": fp4(G, N, K // 2), "sfa": mn_major(M, KW, I32), "sfb": mn_major_groups(G, N, KW)}),
    (contiguous, "b", lambda: {"b": fp4(G, N, K), "sfa": mn_major(M, KW, I32), "sfb": mn_major_groups(G, N, K // 128)}),
    (masked, "sfa", lambda: {"sfa": mn_major_groups(G, M, KB, torch.float32), "sfb": mn_major_groups(G, N, KW)}),
    (masked, "sfb", lambda: {"b": fp4(G, N, K // 2), "sfa": mn_major_groups(G, M, KW),
                             "sfb": torch.empty(G, NB, KW, dtype=I32, device="cuda")}),  # FP4: per row only
    (masked, "a", lambda: {"a": fp8(M, K)}),
    (masked, "b", lambda: {"b": fp8(G + 1, N, K)}),
    (masked, "sfa", lambda: {"sfa": torch.empty(G, M, KB, device="cuda")}),
    (masked, "masked_m", lambda: {"masked_m": torch.empty(G + 1, dtype=torch.int32, device="cuda")}),
    (masked, "out", lambda: {"out": torch.empty(G, M, N, device="cuda")}),
]


@pytest.mark.parametrize("check, arg, change", BAD, ids=[f"{c.__name__}-{a}-{i}" for i, (c, a, _) in enumerate(BAD)])
def test_bad_input_names_the_argument(check, arg, change):
    with FakeTensorMode():
        with pytest.raises(InputError, match=f"'{arg}'"):
            check(**change())


def test_fake_implementations_give_the_output_shapes():
    # What torch.compile sees while tracing: the custom ops' fake implementations check the
    # inputs and describe the outputs, with no GPU involved.
    lds = -(-M // 4) * 4
    with FakeTensorMode():
        out = torch.ops.cutegen.fp8_gemm_nt(fp8(M, K), mn_major(M, KB), fp8(N, K), torch.empty(NB, KB, device="cuda"))
        assert tuple(out.shape) == (M, N) and out.dtype == torch.bfloat16 and out.stride(1) == 1
        out = torch.ops.cutegen.m_grouped_fp8_gemm_nt_contiguous(
            fp8(M, K), mn_major(M, KB), fp8(G, N, K), torch.empty(G, NB, KB, device="cuda"),
            torch.empty(M, dtype=torch.int32, device="cuda"),
        )
        assert tuple(out.shape) == (M, N) and out.dtype == torch.bfloat16
        out = torch.ops.cutegen.m_grouped_fp8_gemm_nt_masked(
            fp8(G, M, K), torch.empty_strided((G, M, KB), (KB * lds, 1, lds), device="cuda"), fp8(G, N, K),
            torch.empty(G, NB, KB, device="cuda"), torch.empty(G, dtype=torch.int32, device="cuda"), 64,
        )
        assert tuple(out.shape) == (G, M, N) and out.dtype == torch.bfloat16
        with pytest.raises(InputError, match="'sfb'"):
            torch.ops.cutegen.fp8_gemm_nt(fp8(M, K), mn_major(M, KB), fp8(N, K), torch.empty(NB + 1, KB, device="cuda"))
