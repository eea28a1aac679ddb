"""DeepGEMM's scaling recipes and operand tuples, read into the one cutegen kernel family each names.

A recipe is (gran_m of A, gran_n of B, gran_k), or the per-operand pair recipe_a = (gran_m,
gran_k), recipe_b = (gran_n, gran_k). On Hopper, DeepGEMM runs (1, 128, 128) on its 1D2D kernel
(1 x 128 activation scales, 128 x 128 weight scales, bf16 D) and (1, 1, 128) on its 1D1D kernel
(1 x 128 scales on both sides, fp32 D += A·Bᵀ): cutegen's `fp8_gemm_nt` and `fp8_wgrad_gemm_nt`.
On SM100 DeepGEMM takes packed UE8M0 (int32) scales, whose default recipe is (1, 1, 128): a scale
per row of A and of B, which cutegen's block-scaled `fp8_gemm_nt` kernels read (`default_recipe`).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

# Packed FP4 operands as DeepGEMM's tests and engines hold them (two e2m1 codes per byte).
FP4_DTYPES = tuple(d for d in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)


class Recipe(enum.Enum):
    """The cutegen kernel family a DeepGEMM recipe selects."""

    BLOCK_1D2D = (1, 128, 128)  # fp8_gemm_nt and the M-grouped GEMMs
    PER_ROW_1D1D = (1, 1, 128)  # fp8_wgrad_gemm_nt and the k-grouped GEMM


def unsupported(function: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"deep_gemm.{function}: {what} is not implemented in cutegen")


def operand_pair(function: str, arg: str, value: Any, packed_ue8m0: bool = False,
                 fp4: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scales)`` of an FP8 operand; FP4 data and packed UE8M0 (int32) scales are refused
    as not implemented unless the caller takes them (``fp4``, ``packed_ue8m0``)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"deep_gemm.{function}: argument '{arg}' must be a (data, scales) tuple, got {type(value).__name__}")
    data, scales = value
    for what, t in (("data", data), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"deep_gemm.{function}: argument '{arg}' {what} must be a torch.Tensor, got {type(t).__name__}")
    if data.dtype in FP4_DTYPES and not fp4:
        raise unsupported(function, f"FP4 (packed e2m1, {data.dtype}) data in argument '{arg}'")
    if scales.dtype == torch.int32 and not packed_ue8m0:
        raise unsupported(
            function,
            f"packed UE8M0 (int32) scales in argument '{arg}' (DeepGEMM's SM100 scale layout; pass fp32 scales)",
        )
    return data, scales


def default_recipe(sfb: torch.Tensor) -> Recipe:
    """DeepGEMM's recipe when none is given: (1, 1, 128) for packed UE8M0 weight scales (its SM100
    form, a scale per row of B), else (1, 128, 128)."""
    return Recipe.PER_ROW_1D1D if sfb.dtype == torch.int32 else Recipe.BLOCK_1D2D


def resolve(function: str, recipe: Any, recipe_a: Any, recipe_b: Any, default: Recipe = Recipe.BLOCK_1D2D) -> Recipe:
    """The family a call's recipe arguments select, checked as DeepGEMM checks them."""
    if (recipe_a is None) != (recipe_b is None):
        raise ValueError(f"deep_gemm.{function}: 'recipe_a' and 'recipe_b' must be given together")
    if recipe is not None and recipe_a is not None:
        raise ValueError(f"deep_gemm.{function}: give either 'recipe' or 'recipe_a' and 'recipe_b', not both")
    if recipe is None and recipe_a is None:
        return default
    if recipe is not None:
        full = tuple(int(x) for x in recipe)
    else:
        (gran_m, gran_k_a), (gran_n, gran_k_b) = tuple(recipe_a), tuple(recipe_b)
        if gran_k_a != gran_k_b:
            raise unsupported(function, f"different K granularities for A and B (recipe_a={tuple(recipe_a)}, recipe_b={tuple(recipe_b)})")
        full = (int(gran_m), int(gran_n), int(gran_k_a))
    for family in Recipe:
        if family.value == full:
            return family
    raise unsupported(function, f"the scaling recipe {full} (cutegen has (1, 128, 128) and (1, 1, 128))")


__all__ = ["FP4_DTYPES", "Recipe", "default_recipe", "operand_pair", "resolve", "unsupported"]
