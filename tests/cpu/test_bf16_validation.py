"""CPU tier: the BF16 GEMMs' input validation and fake implementations on fake CUDA tensors (no
GPU): the dense GEMM's bf16 or fp32 D and C, the M-grouped layouts, and their DeepGEMM names'
argument handling. Bad inputs are refused with an error naming the argument before anything could
be launched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cutegen.runtime import bf16_grouped_ops as ops  # noqa: E402
from cutegen.runtime import bf16_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402

M, N, K, G = 256, 384, 520, 3
BF16 = torch.bfloat16


def bf16(*shape):
    return torch.empty(*shape, dtype=BF16, device="cuda")


def i32(*shape):
    return torch.empty(*shape, dtype=torch.int32, device="cuda")


def contiguous(**changes):
    args = {"a": bf16(M, K), "b": bf16(G, N, K), "m_indices": i32(M), "out": None}
    args.update(changes)
    return ops.check_contiguous(args["a"], args["b"], args["m_indices"], args["out"])


def masked(**changes):
    args = {"a": bf16(G, M, K), "b": bf16(G, N, K), "masked_m": i32(G), "out": None}
    args.update(changes)
    return ops.check_masked(args["a"], args["b"], args["masked_m"], args["out"])


def test_valid_operands():
    with FakeTensorMode():
        assert contiguous() == (M, N, K, G)
        assert contiguous(out=bf16(M, N)) == (M, N, K, G)
        # Row strides padded past K (16-byte aligned) and an N that is no tile multiple.
        assert contiguous(a=torch.empty_strided((M, K), (K + 8, 1), dtype=BF16, device="cuda"), b=bf16(G, 1000, K)) == (M, 1000, K, G)
        assert masked() == (G, M, N, K)
        # MN-major experts (DeepGEMM's nn): the contiguous layout takes them.
        experts = bf16(G, K, N).transpose(1, 2)
        assert contiguous(b=experts) == (M, N, K, G) and ops.experts_mn_major(experts)
        assert masked(out=bf16(G, M, N)) == (G, M, N, K)
        assert masked(a=bf16(G, 1, K)) == (G, 1, N, K)


BAD = [
    (contiguous, "a", lambda: {"a": torch.empty(M, K, dtype=torch.float8_e4m3fn, device="cuda")}),
    (contiguous, "a", lambda: {"a": bf16(M - 8, K), "m_indices": i32(M - 8)}),  # ΣM not 128-aligned
    (contiguous, "a", lambda: {"a": torch.empty_strided((M, K), (K + 4, 1), dtype=BF16, device="cuda")}),  # 8-byte rows
    (contiguous, "a", lambda: {"a": bf16(M, K).t()}),  # M-major
    (contiguous, "b", lambda: {"b": bf16(N, K)}),  # no group mode
    (contiguous, "b", lambda: {"b": bf16(G, N, K - 8)}),
    (contiguous, "b", lambda: {"b": torch.empty(G, N, K, dtype=torch.float32, device="cuda")}),
    (contiguous, "m_indices", lambda: {"m_indices": torch.empty(M, dtype=torch.int64, device="cuda")}),
    (contiguous, "m_indices", lambda: {"m_indices": i32(M - 1)}),
    (contiguous, "m_indices", lambda: {"m_indices": torch.empty_strided((M,), (2,), dtype=torch.int32, device="cuda")}),
    (contiguous, "out", lambda: {"out": torch.empty(M, N, device="cuda")}),
    (contiguous, "out", lambda: {"out": bf16(M, N + 8)}),
    (contiguous, "b", lambda: {"b": torch.empty_strided((G, N, K), (K * (N + 4), 1, N + 4), dtype=BF16, device="cuda")}),
    (masked, "b", lambda: {"b": bf16(G, K, N).transpose(1, 2)}),  # masked experts are K-major only
    (masked, "a", lambda: {"a": bf16(M, K)}),
    (masked, "a", lambda: {"a": torch.empty_strided((G, M, K), (M * (K + 4), K + 4, 1), dtype=BF16, device="cuda")}),
    (masked, "b", lambda: {"b": bf16(G + 1, N, K)}),
    (masked, "b", lambda: {"b": bf16(G, N, K + 8)}),
    (masked, "masked_m", lambda: {"masked_m": i32(G + 1)}),
    (masked, "masked_m", lambda: {"masked_m": torch.empty(G, dtype=torch.int64, device="cuda")}),
    (masked, "out", lambda: {"out": torch.empty(G, M, N, device="cuda")}),
    (masked, "out", lambda: {"out": bf16(G, M, N - 8)}),
]


@pytest.mark.parametrize("check, arg, change", BAD, ids=[f"{c.__name__}-{a}-{i}" for i, (c, a, _) in enumerate(BAD)])
def test_bad_input_names_the_argument(check, arg, change):
    with FakeTensorMode():
        with pytest.raises(InputError, match=f"'{arg}'"):
            check(**change())


def test_fake_implementations_give_the_output_shapes():
    with FakeTensorMode():
        out = torch.ops.cutegen.m_grouped_bf16_gemm_nt_contiguous(bf16(M, K), bf16(G, 1000, K), i32(M))
        assert tuple(out.shape) == (M, 1000) and out.dtype == BF16 and out.stride() == (1000, 1)
        out = torch.ops.cutegen.m_grouped_bf16_gemm_nt_masked(bf16(G, M, K), bf16(G, 100, K), i32(G), 64)
        assert tuple(out.shape) == (G, M, 100) and out.dtype == BF16 and out.stride() == (M * 104, 104, 1)
        with pytest.raises(InputError, match="'m_indices'"):
            torch.ops.cutegen.m_grouped_bf16_gemm_nt_contiguous(bf16(M, K), bf16(G, N, K), i32(M + 1))


def test_python_entry_points_check_their_own_arguments():
    with FakeTensorMode():
        with pytest.raises(InputError, match="'kernel'"):
            ops.m_grouped_bf16_gemm_nt_contiguous(bf16(M, K), bf16(G, N, K), i32(M), kernel=3)
        with pytest.raises(InputError, match="'expected_m'"):
            ops.m_grouped_bf16_gemm_nt_masked(bf16(G, M, K), bf16(G, N, K), i32(G), 64.0)


def test_deep_gemm_names_refuse_what_deep_gemm_refuses():
    import cutegen.deep_gemm as deep_gemm

    with FakeTensorMode():
        a, b, layout = bf16(M, K), bf16(G, N, K), i32(M)
        with pytest.raises(ValueError, match="'d'"):
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, torch.empty(M, N, device="cuda"), layout)
        with pytest.raises(ValueError, match="'a'"):
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a.float(), b, bf16(M, N), layout)
        with pytest.raises(ValueError, match="'grouped_layout'"):
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, bf16(M, N), i32(M + 1), use_psum_layout=True)
        with pytest.raises(ValueError, match="expected_m_for_psum_layout"):
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, bf16(M, N), layout, expected_m_for_psum_layout=64)
        with pytest.raises(TypeError, match="not both"):
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, bf16(M, N), layout, m_indices=layout)
        with pytest.raises(ValueError, match="'expected_m'"):
            deep_gemm.m_grouped_bf16_gemm_nt_masked(bf16(G, M, K), b, bf16(G, M, N), i32(G), 0)
        with pytest.raises(ValueError, match="'d'"):
            deep_gemm.bf16_m_grouped_gemm_nt_masked(bf16(G, M, K), b, bf16(G, M, N + 1), i32(G), 64)
    assert "m_grouped_bf16_gemm_nt_contiguous" not in deep_gemm.unsupported.MISSING


# ---- the dense GEMM: bf16 or fp32 D, C of D's type ------------------------------------------
def f32(*shape):
    return torch.empty(*shape, device="cuda")


def dense(**changes):
    args = {"a": bf16(M, K), "b": bf16(N, K), "out": None, "c": None}
    args.update(changes)
    return bf16_ops.check_meta(args["a"], args["b"], args["out"], args["c"])


def test_dense_valid_operands():
    with FakeTensorMode():
        assert dense(out=f32(M, N)) == (M, N, K)
        assert dense(out=f32(M, N), c=f32(M, N)) == (M, N, K)
        assert dense(out=bf16(M, N), c=bf16(M, N)) == (M, N, K)
        assert dense(c=f32(M, N)) == (M, N, K)  # a new D of C's type
        # MN-major operands (transposed views): DeepGEMM's nn, tn and tt forms.
        for a, b, layout in ((bf16(M, K), bf16(K, N).t(), "nn"), (bf16(K, M).t(), bf16(K, N).t(), "tn"),
                             (bf16(K, M).t(), bf16(N, K), "tt"), (bf16(M, K), bf16(N, K), "nt")):
            assert dense(a=a, b=b) == (M, N, K) and bf16_ops.layout_of(a, b) == layout


DENSE_BAD = [
    ("out", lambda: {"out": torch.empty(M, N, dtype=torch.float16, device="cuda")}),
    ("out", lambda: {"out": torch.empty_strided((M, N), (N + 2, 1), device="cuda")}),  # fp32 rows of 8-byte multiples
    ("out", lambda: {"out": f32(M, N + 4)}),
    ("c", lambda: {"out": f32(M, N), "c": bf16(M, N)}),  # C of another type than D
    ("c", lambda: {"c": f32(M, N - 4)}),
    ("c", lambda: {"c": torch.empty(M, N, dtype=torch.float64, device="cuda")}),
    ("a", lambda: {"a": torch.empty_strided((M, K), (1, M + 4), dtype=BF16, device="cuda")}),  # 8-byte columns
    ("b", lambda: {"b": torch.empty_strided((N, K), (1, N + 2), dtype=BF16, device="cuda")}),
    ("b", lambda: {"b": torch.empty_strided((N, K), (2, 2 * N), dtype=BF16, device="cuda")}),  # no unit stride
]


@pytest.mark.parametrize("arg, change", DENSE_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(DENSE_BAD)])
def test_dense_bad_input_names_the_argument(arg, change):
    with FakeTensorMode():
        with pytest.raises(InputError, match=f"'{arg}'"):
            dense(**change())


def test_dense_python_entry_point_and_fakes():
    with FakeTensorMode():
        with pytest.raises(InputError, match="'c'"):
            bf16_ops.bf16_gemm_nt(bf16(M, K), bf16(N, K), c=3.0)
        d = f32(M, N)
        torch.ops.cutegen.bf16_gemm_nt_out(bf16(M, K), bf16(N, K), d)
        torch.ops.cutegen.bf16_gemm_nt_accumulate(bf16(M, K), bf16(N, K), d)
        with pytest.raises(InputError, match="'out'"):
            torch.ops.cutegen.bf16_gemm_nt_accumulate(bf16(M, K), bf16(N, K), f32(M, N + 4))


def test_deep_gemm_bf16_gemm_nt_takes_fp32_d_and_c():
    import cutegen.deep_gemm as deep_gemm

    with FakeTensorMode():
        with pytest.raises(ValueError, match="'c'"):
            deep_gemm.bf16_gemm_nt(bf16(M, K), bf16(N, K), f32(M, N), c=f32(M, N + 1))
        with pytest.raises(ValueError, match="'d'"):
            deep_gemm.bf16_gemm_nt(bf16(M, K), bf16(N, K), torch.empty(M, N, dtype=torch.float16, device="cuda"))


# ---- the k-grouped weight gradient: tokens first -------------------------------------------
TOKENS = 384


def k_grouped(**changes):
    args = {"a": bf16(TOKENS, M), "b": bf16(TOKENS, N), "d": f32(G, M, N), "group_sizes": i32(G), "c": None}
    args.update(changes)
    return ops.check_k_grouped(args["a"], args["b"], args["d"], args["group_sizes"], args["c"])


K_GROUPED_BAD = [
    ("a", lambda: {"a": bf16(TOKENS + 64, M), "b": bf16(TOKENS + 64, N)}),  # Σk not a multiple of 128
    ("a", lambda: {"a": bf16(M, TOKENS).t()}),  # not row-major [Σk, M]
    ("a", lambda: {"a": bf16(TOKENS, M + 4), "d": f32(G, M + 4, N)}),  # rows of 8 bytes past 16
    ("b", lambda: {"b": bf16(TOKENS - 128, N)}),
    ("b", lambda: {"b": torch.empty(TOKENS, N, dtype=torch.float8_e4m3fn, device="cuda")}),
    ("d", lambda: {"d": torch.empty(G, M, N, dtype=BF16, device="cuda")}),
    ("d", lambda: {"d": f32(G + 1, M, N)}),
    ("group_sizes", lambda: {"group_sizes": torch.empty(G, dtype=torch.int64, device="cuda")}),
    ("c", lambda: {"c": f32(G, M, N + 8)}),
]


def test_k_grouped_valid_and_bad_operands():
    with FakeTensorMode():
        assert k_grouped() == (G, M, N, TOKENS)
        assert k_grouped(c=f32(G, M, N)) == (G, M, N, TOKENS)
        for arg, change in K_GROUPED_BAD:
            with pytest.raises(InputError, match=f"'{arg}'"):
                k_grouped(**change())
        d = f32(G, M, N)
        torch.ops.cutegen.k_grouped_bf16_gemm_tn_contiguous(bf16(TOKENS, M), bf16(TOKENS, N), d, i32(G))


def test_deep_gemm_k_grouped_bf16_refusals():
    import cutegen.deep_gemm as deep_gemm

    with FakeTensorMode():
        a, b, d, sizes = bf16(TOKENS, M), bf16(TOKENS, N), f32(G, M, N), i32(G)
        with pytest.raises(ValueError, match="multiple of 128"):
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, [100, 156, 128], sizes)
        with pytest.raises(ValueError, match="'a'"):
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, [128, 128, 256], sizes)  # Σk 512, a holds 384
        with pytest.raises(NotImplementedError, match="use_psum_layout"):
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, [128, 128, 128], sizes, use_psum_layout=True)
    assert "k_grouped_bf16_gemm_tn_contiguous" not in deep_gemm.unsupported.MISSING
