"""CPU tier: the k-grouped weight-gradient op's input validation and fake implementation, on fake
CUDA tensors (no GPU): every refused input names its argument before anything is launched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cutegen.runtime import k_grouped_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402

G, M, N, S = 3, 256, 128, 5


def operand_set(a_shape: tuple[int, ...], b_shape: tuple[int, ...], changes: dict) -> dict:
    """A valid operand set (fake CUDA tensors) with A and B of these shapes, with named replacements."""
    ops = {
        "a": torch.empty(a_shape, dtype=torch.float8_e4m3fn, device="cuda"),
        "sfa": torch.empty(S, M, device="cuda"),
        "b": torch.empty(b_shape, dtype=torch.float8_e4m3fn, device="cuda"),
        "sfb": torch.empty(S, N, device="cuda"),
        "d": torch.empty(G, M, N, device="cuda"),
        "group_sizes": torch.empty(G, dtype=torch.int32, device="cuda"),
        "c": None,
    }
    ops.update(changes)
    return ops


def operands(**changes):
    """A valid operand set of `k_grouped_fp8_gemm_nt_contiguous`: A and B flat, groups back to back."""
    return operand_set((128 * M * S,), (128 * N * S,), changes)


def check(**changes):
    o = operands(**changes)
    return k_grouped_ops._check(o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"], o["c"])


def test_valid_operands_give_the_extents():
    with FakeTensorMode():
        assert check() == (G, M, N, S)
        assert check(c=torch.empty(G, M, N, device="cuda")) == (G, M, N, S)


BAD = [
    ("a", lambda: {"a": torch.empty(128 * M * S, dtype=torch.uint8, device="cuda")}, "float8_e4m3fn"),
    ("a", lambda: {"a": torch.empty(M, 128 * S, dtype=torch.float8_e4m3fn, device="cuda")}, "1-D"),
    ("a", lambda: {"a": torch.empty(128 * M * S - 128, dtype=torch.float8_e4m3fn, device="cuda")}, "elements"),
    ("b", lambda: {"b": torch.empty(128 * N * S, dtype=torch.float8_e4m3fn, device="cpu")}, "CUDA tensor"),
    ("sfa", lambda: {"sfa": torch.empty(S, M, device="cuda", dtype=torch.float64)}, "float32"),
    ("sfa", lambda: {"sfa": torch.empty(M, S, device="cuda").t()}, "contiguous"),
    ("sfa", lambda: {"sfa": torch.empty(S, M - 2, device="cuda"), "a": torch.empty(128 * (M - 2) * S, dtype=torch.float8_e4m3fn, device="cuda")}, "multiple of 4"),
    ("sfb", lambda: {"sfb": torch.empty(S - 1, N, device="cuda")}, "block rows"),
    ("group_sizes", lambda: {"group_sizes": torch.empty(G, dtype=torch.int64, device="cuda")}, "int32"),
    ("group_sizes", lambda: {"group_sizes": torch.empty(G, 1, dtype=torch.int32, device="cuda")}, "1-D"),
    ("d", lambda: {"d": torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16)}, "float32"),
    ("d", lambda: {"d": torch.empty(G + 1, M, N, device="cuda")}, "shape"),
    ("d", lambda: {"d": torch.empty_strided((G, M, N), (M * (N + 2), N + 2, 1), device="cuda")}, "multiples of 4"),
    ("c", lambda: {"c": torch.empty(G, M, N - 1, device="cuda")}, "'c'"),
]


@pytest.mark.parametrize("arg, change, words", BAD, ids=[f"{a}-{w}" for a, _, w in BAD])
def test_bad_input_names_the_argument(arg, change, words):
    with FakeTensorMode():
        with pytest.raises(InputError, match=f"'{arg}'.*{words}" if not words.startswith("'") else words):
            check(**change())


def test_fake_implementation_checks_and_launches_nothing():
    # Under a fake mode the custom op runs its fake implementation: shapes are checked, nothing
    # reaches the GPU (there is none here).
    with FakeTensorMode():
        o = operands()
        torch.ops.cutegen.k_grouped_fp8_gemm_nt_contiguous(o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"])
        bad = operands(d=torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(InputError, match="'d'"):
            torch.ops.cutegen.k_grouped_fp8_gemm_nt_contiguous(
                bad["a"], bad["sfa"], bad["b"], bad["sfb"], bad["d"], bad["group_sizes"]
            )


def test_python_entry_rejects_bad_hints():
    with FakeTensorMode():
        o = operands()
        for hint in (-1, 2.5, True):
            with pytest.raises(InputError, match="'expected_k'"):
                k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(
                    o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"], expected_k=hint
                )


# ---- the tokens-first form (Blackwell's block-scaled MMA) -----------------------------------------


def tn_operands(**changes):
    """A valid operand set of `k_grouped_fp8_gemm_tn_contiguous`: A and B tokens first."""
    return operand_set((128 * S, M), (128 * S, N), changes)


def check_tn(**changes):
    o = tn_operands(**changes)
    return k_grouped_ops._check_tn(o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"], o["c"])


def test_tn_valid_operands_give_the_extents():
    with FakeTensorMode():
        assert check_tn() == (G, M, N, S)
        assert check_tn(c=torch.empty(G, M, N, device="cuda")) == (G, M, N, S)


BAD_TN = [
    ("a", lambda: {"a": torch.empty(128 * S, M, dtype=torch.bfloat16, device="cuda")}, "float8_e4m3fn"),
    ("a", lambda: {"a": torch.empty(128 * M * S, dtype=torch.float8_e4m3fn, device="cuda")}, "tokens first"),
    ("a", lambda: {"a": torch.empty(M, 128 * S, dtype=torch.float8_e4m3fn, device="cuda").t()}, "contiguous"),
    ("a", lambda: {"a": torch.empty(128 * S - 8, M, dtype=torch.float8_e4m3fn, device="cuda"),
                   "b": torch.empty(128 * S - 8, N, dtype=torch.float8_e4m3fn, device="cuda")}, "multiple of 128 rows"),
    ("a", lambda: {"a": torch.empty(128 * S, M - 8, dtype=torch.float8_e4m3fn, device="cuda"),
                   "sfa": torch.empty(S, M - 8, device="cuda")}, "multiple of 16 columns"),
    ("b", lambda: {"b": torch.empty(128 * S, N, dtype=torch.float8_e4m3fn, device="cpu")}, "CUDA tensor"),
    ("b", lambda: {"b": torch.empty(128 * (S + 1), N, dtype=torch.float8_e4m3fn, device="cuda")}, "rows"),
    ("sfa", lambda: {"sfa": torch.empty(S, M, device="cuda", dtype=torch.int32)}, "float32"),
    ("sfa", lambda: {"sfa": torch.empty(M, S, device="cuda")}, r"\[Σk/128, M\]"),
    ("sfb", lambda: {"sfb": torch.empty(N, S, device="cuda").t()}, "contiguous"),
    ("group_sizes", lambda: {"group_sizes": torch.empty(G, dtype=torch.int64, device="cuda")}, "int32"),
    ("d", lambda: {"d": torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16)}, "float32"),
    ("d", lambda: {"d": torch.empty(G, N, M, device="cuda")}, "shape"),
    ("c", lambda: {"c": torch.empty(G, M, N - 1, device="cuda")}, "'c'"),
]


@pytest.mark.parametrize("arg, change, words", BAD_TN, ids=[f"{a}-{w}" for a, _, w in BAD_TN])
def test_tn_bad_input_names_the_argument(arg, change, words):
    with FakeTensorMode():
        with pytest.raises(InputError, match=f"k_grouped_fp8_gemm_tn_contiguous: argument '{arg}'.*{words}"
                           if not words.startswith("'") else words):
            check_tn(**change())


def test_tn_fake_implementation_checks_and_launches_nothing():
    with FakeTensorMode():
        o = tn_operands()
        torch.ops.cutegen.k_grouped_fp8_gemm_tn_contiguous(o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"])
        bad = tn_operands(sfb=torch.empty(S, N + 16, device="cuda"))
        with pytest.raises(InputError, match="'sfb'"):
            torch.ops.cutegen.k_grouped_fp8_gemm_tn_contiguous(
                bad["a"], bad["sfa"], bad["b"], bad["sfb"], bad["d"], bad["group_sizes"]
            )
        for hint in (-1, 2.5, True):
            with pytest.raises(InputError, match="'expected_k'"):
                k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous(
                    o["a"], o["sfa"], o["b"], o["sfb"], o["d"], o["group_sizes"], expected_k=hint
                )
