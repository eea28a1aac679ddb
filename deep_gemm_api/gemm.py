"""DeepGEMM's GEMM entry points over cutegen's kernels: tuple operands, D written in place, None returned.

Every function here has DeepGEMM's name, argument order, keywords and defaults, and computes
D = C + A·Bᵀ into the preallocated ``d`` the way DeepGEMM does on Hopper, by calling the
matching `cutegen.runtime` op:

| DeepGEMM | cutegen |
| --- | --- |
| `fp8_gemm_nt`, recipe (1, 128, 128) (the default): bf16 D, no C | `fp8_ops.fp8_gemm_nt` |
| `fp8_gemm_nt`, recipe (1, 1, 128): fp32 D, D = C + A·Bᵀ | `fp8_ops.fp8_wgrad_gemm_nt` |
| `fp8_gemm_nt`, packed UE8M0 (int32) scales, DeepGEMM's SM100 form: bf16 D, no C | `fp8_ops.fp8_gemm_nt` (Blackwell) |
| `fp8_gemm_nt`, packed UE8M0 (int32) scales: fp32 D = C + A·Bᵀ (either recipe), or bf16 D with C (through an fp32 temporary) | `fp8_ops.fp8_wgrad_gemm_nt` (Blackwell) |
| `fp8_fp4_gemm_nt` (= `fp8_gemm_nt`), packed FP4 B, recipe_a (1, 128), recipe_b (1, 32): bf16 D, no C | `fp8_ops.fp8_gemm_nt` with FP4 `b` (Blackwell) |
| `m_grouped_fp8_gemm_nt_contiguous` (m_indices, or cumulative group ends with `use_psum_layout`) | `grouped_ops.m_grouped_fp8_gemm_nt_contiguous` |
| `m_grouped_fp8_gemm_nt_masked` | `grouped_ops.m_grouped_fp8_gemm_nt_masked` |
| the M-grouped GEMMs with packed UE8M0 scales or FP4 experts (DeepGEMM's SM100 forms) | the same ops on the block-scaled kernels (Blackwell) |
| `k_grouped_fp8_gemm_nt_contiguous` | `k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous` |
| `k_grouped_fp8_gemm_tn_contiguous` (DeepGEMM's SM100 form: tokens first) | `k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous` (Blackwell) |
| `bf16_gemm_nt`, bf16 or fp32 D, D = C + A·Bᵀ with C optional | `ops.bf16_gemm_nt` |
| `m_grouped_bf16_gemm_nt_contiguous` (m_indices, or cumulative group ends with `use_psum_layout`), `m_grouped_bf16_gemm_nt_masked`, `k_grouped_bf16_gemm_tn_contiguous` | `bf16_grouped_ops` (sm_90a) |

Scales are taken as DeepGEMM takes them and brought into the layout the kernels read: fp32
1 x 128 scales given row-major (what engines' own quantizers write) are copied once per call into
the MN-major TMA-aligned layout (one small transposing copy of M·⌈K/128⌉ floats; none when they
already have it), 128 x 128 weight scales made contiguous when they are not. What cutegen has no
kernel for raises `NotImplementedError` naming the function and the feature, never a wrong result.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from cutegen.runtime import bf16_grouped_ops, fp8_ops, grouped_ops, k_grouped_ops, ops
from cutegen.runtime.quant_reference import to_mn_major_tma_aligned

from .recipes import Recipe, default_recipe, operand_pair, resolve, unsupported
from .utils.layout import check_mk_alignment

SCALE_BLOCK = 128


def _check_d(function: str, d: Any, shape: tuple[int, ...], dtypes: Sequence[torch.dtype]) -> None:
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"deep_gemm.{function}: argument 'd' must be a preallocated torch.Tensor, got {type(d).__name__}")
    if tuple(d.shape) != shape:
        raise ValueError(f"deep_gemm.{function}: argument 'd' must have shape {list(shape)}, got {list(d.shape)}")
    if d.dtype not in dtypes:
        names = " or ".join(str(t) for t in dtypes)
        raise ValueError(f"deep_gemm.{function}: argument 'd' must be {names} here, got {d.dtype}")


def _check_c(function: str, c: Any, d: torch.Tensor) -> None:
    if c is None:
        return
    if not isinstance(c, torch.Tensor) or c.dtype != d.dtype or tuple(c.shape) != tuple(d.shape):
        raise ValueError(
            f"deep_gemm.{function}: argument 'c' must be a {d.dtype} tensor of d's shape {list(d.shape)}, got "
            f"{getattr(c, 'dtype', type(c).__name__)} {list(getattr(c, 'shape', []))}"
        )
    if c.data_ptr() == d.data_ptr() and c.stride() != d.stride():
        raise ValueError(f"deep_gemm.{function}: 'c' aliases 'd' with other strides ({list(c.stride())} vs {list(d.stride())})")


def _rows_cols(function: str, arg: str, t: torch.Tensor, rank: int) -> tuple[int, ...]:
    if t.dim() != rank:
        raise ValueError(f"deep_gemm.{function}: argument '{arg}' data must have rank {rank}, got shape {list(t.shape)}")
    return tuple(t.shape)


def _empty_k(d: torch.Tensor, c: torch.Tensor | None) -> None:
    """K == 0: D = C (or 0), as DeepGEMM's early return."""
    if c is None:
        d.zero_()
    elif c.data_ptr() != d.data_ptr():
        d.copy_(c)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
) -> None:
    """D[M, N] = C + (A · sfa) @ (B · sfb)ᵀ, written into ``d``. ``a`` = (e4m3 [M, K], fp32 [M,
    ⌈K/128⌉]); ``b`` = (e4m3 [N, K], fp32 [⌈N/128⌉, ⌈K/128⌉]) for recipe (1, 128, 128) or fp32
    [N, K/128] for (1, 1, 128). Packed UE8M0 scales (int32, DeepGEMM's SM100 form: [M, ⌈K/512⌉]
    and, by default, [N, ⌈K/512⌉] per row of B) run the UE8M0 kernels (Blackwell's) into a bf16 D.
    ``compiled_dims`` and ``disable_ue8m0_cast`` are accepted (cutegen compiles nothing, and never
    casts fp32 scales to UE8M0)."""
    function = "fp8_gemm_nt"
    qa, sfa = operand_pair(function, "a", a, packed_ue8m0=True)
    qb, sfb = operand_pair(function, "b", b, packed_ue8m0=True, fp4=True)
    if fp8_ops.b_is_fp4(qb):
        _fp8_fp4_gemm_nt(function, qa, sfa, qb, sfb, d, c, recipe, recipe_a, recipe_b)
        return
    family = resolve(function, recipe, recipe_a, recipe_b, default_recipe(sfb))
    m, k = _rows_cols(function, "a", qa, 2)
    n, kb = _rows_cols(function, "b", qb, 2)
    if kb != k:
        raise ValueError(f"deep_gemm.{function}: 'a' is [M, K] = {[m, k]} and 'b' must be [N, K], got {list(qb.shape)}")
    if torch.int32 in (sfa.dtype, sfb.dtype):
        _fp8_gemm_nt_ue8m0(function, qa, sfa, qb, sfb, d, c, family)
        return
    if family is Recipe.BLOCK_1D2D:
        _check_d(function, d, (m, n), (torch.bfloat16,))
        if c is not None:
            raise unsupported(function, "C with recipe (1, 128, 128) (the 1D2D kernel writes bf16 D without C, as DeepGEMM's; "
                              "use recipe (1, 1, 128) with an fp32 d to accumulate)")
    else:
        _check_d(function, d, (m, n), (torch.float32,))
        _check_c(function, c, d)
    if m == 0 or n == 0:
        return
    if k == 0:
        _empty_k(d, c)
        return
    if family is Recipe.BLOCK_1D2D:
        fp8_ops.fp8_gemm_nt(qa, to_mn_major_tma_aligned(sfa), qb, _contiguous(sfb), out=d)
        return
    if c is None:  # D = A·Bᵀ: the weight-gradient kernel accumulates into D
        d.zero_()
    fp8_ops.fp8_wgrad_gemm_nt(qa, to_mn_major_tma_aligned(sfa), qb, to_mn_major_tma_aligned(sfb), d, c)


fp8_fp4_gemm_nt = fp8_gemm_nt


# FP8 x FP4: 1 x 128 scales of A, 1 x 32 of B (DeepGEMM's recipe_a, recipe_b).
FP4_RECIPE = ((1, 128), (1, 32))


def _fp8_fp4_gemm_nt(function: str, qa: torch.Tensor, sfa: torch.Tensor, qb: torch.Tensor, sfb: torch.Tensor,
                     d: Any, c: Any, recipe: Any, recipe_a: Any, recipe_b: Any) -> None:
    """DeepGEMM's FP8 x FP4 call on SM100: ``b`` packed e2m1 [N, K/2], recipe_a = (1, 128) and
    recipe_b = (1, 32), packed UE8M0 scales (int32 [M, ⌈K/512⌉] and [N, K/128]); bf16 D without C,
    on the block-scaled kernels with FP4 B (Blackwell's)."""
    pair = None if recipe_a is None or recipe_b is None else (tuple(recipe_a), tuple(recipe_b))
    if recipe is not None or pair != FP4_RECIPE:
        raise unsupported(
            function,
            f"FP4 'b' with recipe={recipe}, recipe_a={recipe_a}, recipe_b={recipe_b} (cutegen's FP8 x FP4 kernels "
            f"take recipe_a={FP4_RECIPE[0]}, recipe_b={FP4_RECIPE[1]})",
        )
    if sfa.dtype != torch.int32 or sfb.dtype != torch.int32:
        raise unsupported(function, f"{sfa.dtype} / {sfb.dtype} scales with FP4 'b' (pass packed UE8M0, torch.int32)")
    m, k = _rows_cols(function, "a", qa, 2)
    n, k_bytes = _rows_cols(function, "b", qb, 2)
    if 2 * k_bytes != k:
        raise ValueError(f"deep_gemm.{function}: 'a' is [M, K] = {[m, k]} and FP4 'b' must be [N, K/2], got {list(qb.shape)}")
    if not isinstance(d, torch.Tensor) or d.dtype != torch.bfloat16 or c is not None:
        raise unsupported(function, "fp32 D or C with FP4 'b' (cutegen's FP8 x FP4 kernels write bf16 D without C)")
    _check_d(function, d, (m, n), (torch.bfloat16,))
    if m == 0 or n == 0:
        return
    if k == 0:
        _empty_k(d, c)
        return
    fp8_ops.fp8_gemm_nt(qa, to_mn_major_tma_aligned(sfa), qb, to_mn_major_tma_aligned(sfb), out=d)


def _fp8_gemm_nt_ue8m0(function: str, qa: torch.Tensor, sfa: torch.Tensor, qb: torch.Tensor, sfb: torch.Tensor,
                       d: Any, c: Any, family: Recipe) -> None:
    """DeepGEMM's SM100 form: packed UE8M0 scales, int32 [M, ⌈K/512⌉] for A and, by the default
    recipe (1, 1, 128), [N, ⌈K/512⌉] per row of B (with recipe (1, 128, 128), [⌈N/128⌉, ⌈K/512⌉]
    per block), on the kernels that take UE8M0 scales (Blackwell's). D = C + A·Bᵀ as DeepGEMM
    computes it: bf16 D without C on the GEMM kernels; fp32 D (C optional) on the weight-gradient
    kernels, which take B's scales per row (a block's scale repeated over its rows); bf16 D with C
    as fp32 C + A·Bᵀ on those kernels into a temporary, rounded to bf16 once."""
    if sfa.dtype != sfb.dtype:
        raise ValueError(
            f"deep_gemm.{function}: the scales of 'a' ({sfa.dtype}) and 'b' ({sfb.dtype}) must both be packed "
            "UE8M0 (torch.int32) or both fp32"
        )
    m, n = qa.shape[0], qb.shape[0]
    per_row_b = family is Recipe.PER_ROW_1D1D
    _check_d(function, d, (m, n), (torch.bfloat16, torch.float32))
    _check_c(function, c, d)
    rows = n if per_row_b else -(-n // SCALE_BLOCK)
    if sfb.dim() != 2 or sfb.shape[0] != rows:
        raise ValueError(
            f"deep_gemm.{function}: argument 'b' scales must have {rows} rows under recipe {family.value} "
            f"({'one per row of B' if per_row_b else 'one per 128 rows of B'}), got {list(sfb.shape)}"
        )
    if m == 0 or n == 0:
        return
    if qa.shape[1] == 0:
        _empty_k(d, c)
        return
    if d.dtype == torch.bfloat16 and c is None:
        fp8_ops.fp8_gemm_nt(qa, to_mn_major_tma_aligned(sfa), qb, to_mn_major_tma_aligned(sfb) if per_row_b else _contiguous(sfb), out=d)
        return
    sfb_rows = sfb if per_row_b else sfb.repeat_interleave(SCALE_BLOCK, dim=0)[:n]
    if d.dtype == torch.float32:
        if c is None:  # the weight-gradient kernel adds into D
            d.zero_()
        accumulator, c_in = d, c
    else:  # bf16 D with C: C + A·Bᵀ in fp32, rounded to bf16 once below
        accumulator, c_in = c.float(), None
    fp8_ops.fp8_wgrad_gemm_nt(qa, to_mn_major_tma_aligned(sfa), qb, to_mn_major_tma_aligned(sfb_rows), accumulator, c_in)
    if accumulator is not d:
        d.copy_(accumulator)


def _transposed(pair: Any) -> tuple[torch.Tensor, torch.Tensor]:
    data, scales = pair
    return data.transpose(-2, -1), scales.transpose(-2, -1)


def fp8_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False) -> None:
    """`fp8_gemm_nt` with B given as [K, N] (a view of the K-major [N, K] cutegen reads)."""
    fp8_gemm_nt(a, _transposed(b), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn", disable_ue8m0_cast=False) -> None:
    """`fp8_gemm_nt` with A given as [K, M] and B as [K, N]."""
    fp8_gemm_nt(_transposed(a), _transposed(b), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn", disable_ue8m0_cast=False) -> None:
    """`fp8_gemm_nt` with A given as [K, M]."""
    fp8_gemm_nt(_transposed(a), b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt = fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt


def _grouped_operands(function: str, a: Any, b: Any, recipe: Any, recipe_a: Any, recipe_b: Any) -> tuple:
    """(qa, sfa, qb, sfb) of an M-grouped call in the layouts `grouped_ops` takes: fp32 scales
    (recipe (1, 128, 128)); or DeepGEMM's SM100 forms, packed UE8M0 scales with FP8 experts
    (recipe (1, 1, 128) by default: SFB [G, N, ⌈K/512⌉] per row; (1, 128, 128): [G, ⌈N/128⌉,
    ⌈K/512⌉] per block) or with FP4 experts (recipe_a (1, 128), recipe_b (1, 32): SFB [G, N, K/128])."""
    qa, sfa = operand_pair(function, "a", a, packed_ue8m0=True)
    qb, sfb = operand_pair(function, "b", b, packed_ue8m0=True, fp4=True)
    fp4 = fp8_ops.b_is_fp4(qb)
    if not fp4 and torch.int32 not in (sfa.dtype, sfb.dtype):
        if resolve(function, recipe, recipe_a, recipe_b) is not Recipe.BLOCK_1D2D:
            raise unsupported(function, "recipe (1, 1, 128) with fp32 scales for the M-grouped GEMMs (cutegen's are the 1D2D kernel)")
        return qa, to_mn_major_tma_aligned(sfa), qb, _contiguous(sfb)
    if sfa.dtype != torch.int32 or sfb.dtype != torch.int32:
        raise ValueError(f"deep_gemm.{function}: the scales of 'a' ({sfa.dtype}) and 'b' ({sfb.dtype}) must both be packed "
                         "UE8M0 (torch.int32) with FP4 experts or packed scales")
    if fp4:
        pair = None if recipe_a is None or recipe_b is None else (tuple(recipe_a), tuple(recipe_b))
        if recipe is not None or pair != FP4_RECIPE:
            raise unsupported(function, f"FP4 'b' with recipe={recipe}, recipe_a={recipe_a}, recipe_b={recipe_b} (cutegen's "
                                        f"FP8 x FP4 kernels take recipe_a={FP4_RECIPE[0]}, recipe_b={FP4_RECIPE[1]})")
        per_row_b = True
    else:
        per_row_b = resolve(function, recipe, recipe_a, recipe_b, Recipe.PER_ROW_1D1D) is Recipe.PER_ROW_1D1D
    return qa, to_mn_major_tma_aligned(sfa), qb, to_mn_major_tma_aligned(sfb) if per_row_b else _contiguous(sfb)


def m_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    grouped_layout: torch.Tensor | None = None,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    expected_m_for_psum_layout: int | None = None,
    *,
    m_indices: torch.Tensor | None = None,
) -> None:
    """MoE experts over one [ΣM, K] activation: D[r] = A[r] @ B[g]ᵀ for every row r of group g.

    ``grouped_layout`` (DeepGEMM's older name ``m_indices`` is accepted as a keyword) is int32 on
    the GPU: per row its group, -1 for padding rows, or with ``use_psum_layout`` the cumulative
    group ends [G] (group g's rows are [align(end[g-1], 128), end[g])), turned into per-row
    indices on the GPU, with no host synchronisation. Padding rows of D are written as zeros
    unless ``ensure_zero_padding=False``. ``expected_m_for_psum_layout`` is a hint and not needed.
    """
    function = "m_grouped_fp8_gemm_nt_contiguous"
    grouped_layout = _grouped_layout_argument(function, grouped_layout, m_indices)
    qa, sfa, qb, sfb = _grouped_operands(function, a, b, recipe, recipe_a, recipe_b)
    check_mk_alignment(function)
    m, k = _rows_cols(function, "a", qa, 2)
    g, n, _ = _rows_cols(function, "b", qb, 3)
    _check_d(function, d, (m, n), (torch.bfloat16,))
    row_groups = _row_groups(function, grouped_layout, use_psum_layout, expected_m_for_psum_layout, g, m)
    if m == 0:
        return
    grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sfa, qb, sfb, row_groups, out=d, zero_padding=bool(ensure_zero_padding))


def _grouped_layout_argument(function: str, grouped_layout: Any, m_indices: Any) -> torch.Tensor:
    """``grouped_layout``, or DeepGEMM's older keyword ``m_indices`` for it."""
    if m_indices is not None:
        if grouped_layout is not None:
            raise TypeError(f"deep_gemm.{function}: give 'grouped_layout' or its old name 'm_indices', not both")
        grouped_layout = m_indices
    if not isinstance(grouped_layout, torch.Tensor):
        raise TypeError(f"deep_gemm.{function}: argument 'grouped_layout' must be an int32 CUDA tensor, got {type(grouped_layout).__name__}")
    if grouped_layout.dtype != torch.int32:
        raise ValueError(f"deep_gemm.{function}: argument 'grouped_layout' must be torch.int32, got {grouped_layout.dtype}")
    return grouped_layout


def _row_groups(function: str, grouped_layout: torch.Tensor, use_psum_layout: bool, expected_m_for_psum_layout: Any,
                g: int, m: int) -> torch.Tensor:
    """Each row's group (m_indices): ``grouped_layout`` itself, or with ``use_psum_layout`` the
    [G] cumulative group ends turned into per-row indices on the GPU (no host synchronisation)."""
    if use_psum_layout:
        if tuple(grouped_layout.shape) != (g,):
            raise ValueError(f"deep_gemm.{function}: with use_psum_layout, 'grouped_layout' must be the [G] = [{g}] group ends, got {list(grouped_layout.shape)}")
        return grouped_ops.m_indices_from_group_ends(grouped_layout, m)
    if expected_m_for_psum_layout is not None:
        raise ValueError(f"deep_gemm.{function}: 'expected_m_for_psum_layout' applies only with use_psum_layout=True")
    return grouped_layout


m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous


def m_grouped_fp8_gemm_nn_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                                     disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True) -> None:
    """`m_grouped_fp8_gemm_nt_contiguous` with each B[g] given as [K, N]."""
    m_grouped_fp8_gemm_nt_contiguous(a, _transposed(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                                     disable_ue8m0_cast, use_psum_layout, ensure_zero_padding)


m_grouped_fp8_fp4_gemm_nn_contiguous = m_grouped_fp8_gemm_nn_contiguous


def m_grouped_fp8_gemm_nt_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
) -> None:
    """Decode-time experts: A [G, max_m, K], D [G, max_m, N]; rows [0, masked_m[g]) of group g are
    computed (masked_m int32 [G] stays on the GPU: CUDA-graph capturable); ``expected_m`` guides the
    kernel choice only."""
    function = "m_grouped_fp8_gemm_nt_masked"
    qa, sfa, qb, sfb = _grouped_operands(function, a, b, recipe, recipe_a, recipe_b)
    g, max_m, _ = _rows_cols(function, "a", qa, 3)
    _, n, _ = _rows_cols(function, "b", qb, 3)
    _check_d(function, d, (g, max_m, n), (torch.bfloat16,))
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"deep_gemm.{function}: argument 'expected_m' must be a positive int, got {expected_m!r}")
    grouped_ops.m_grouped_fp8_gemm_nt_masked(qa, sfa, qb, sfb, masked_m, int(expected_m), out=d)


m_grouped_fp8_fp4_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked


def _k_grouped_problem(
    function: str, d: Any, c: Any, ks_cpu: Any, grouped_layout: Any, use_psum_layout: bool
) -> tuple[int, int, int, list[int]]:
    """The k-grouped GEMMs' arguments but the operands, checked: (G, M, N, the groups' k)."""
    if use_psum_layout:
        raise unsupported(function, "use_psum_layout (DeepGEMM's SM100 k-grouped layout)")
    if ks_cpu is None or len(ks_cpu) == 0:
        raise ValueError(f"deep_gemm.{function}: argument 'ks_cpu' must list every group's k (a host list), got {ks_cpu!r}")
    check_mk_alignment(function)
    if not isinstance(d, torch.Tensor) or d.dim() != 3:
        raise ValueError(f"deep_gemm.{function}: argument 'd' must be an fp32 [G, M, N] tensor, got {getattr(d, 'shape', type(d).__name__)}")
    g, m, n = d.shape
    _check_d(function, d, (g, m, n), (torch.float32,))
    _check_c(function, c, d)
    ks = [int(x) for x in ks_cpu]
    if len(ks) != g:
        raise ValueError(f"deep_gemm.{function}: 'ks_cpu' must have G = {g} entries (d.shape[0]), got {len(ks)}")
    if any(x < 0 or x % SCALE_BLOCK for x in ks):
        raise ValueError(f"deep_gemm.{function}: every entry of 'ks_cpu' must be a non-negative multiple of 128, got {ks}")
    if not isinstance(grouped_layout, torch.Tensor) or grouped_layout.dtype != torch.int32 or tuple(grouped_layout.shape) != (g,):
        raise ValueError(f"deep_gemm.{function}: argument 'grouped_layout' must be an int32 [G] = [{g}] tensor of the group sizes")
    return g, m, n, ks


def _k_grouped_fp8_call(
    function: str, a: Any, b: Any, recipe: Any, d: Any, c: Any, ks_cpu: Any, grouped_layout: Any, use_psum_layout: bool
) -> tuple[tuple[Any, Any], tuple[Any, Any], tuple[int, int, int, list[int]]]:
    """The FP8 k-grouped GEMMs' call checked but for the operands' layout: ((A, its scales), (B, its
    scales), (G, M, N, the groups' k)); only the 1D1D recipe (1, 1, 128)."""
    pair_a, pair_b = operand_pair(function, "a", a), operand_pair(function, "b", b)
    if resolve(function, recipe, None, None) is not Recipe.PER_ROW_1D1D:
        raise unsupported(function, f"recipe {tuple(recipe)} (the k-grouped GEMM is the 1D1D kernel, recipe (1, 1, 128))")
    return pair_a, pair_b, _k_grouped_problem(function, d, c, ks_cpu, grouped_layout, use_psum_layout)


def _nothing_to_launch(d: torch.Tensor, c: torch.Tensor | None, m: int, n: int, sum_k: int) -> bool:
    """A k-grouped call's D without a launch where there is nothing to compute (D = C, or zeros,
    at Σk = 0); otherwise D zeroed first when there is no C (the kernels add into D)."""
    if m == 0 or n == 0:
        return True
    if sum_k == 0:
        _empty_k(d, c)
        return True
    if c is None:
        d.zero_()
    return False


def k_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: Sequence[int] | None,
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] = (1, 1, 128),
    compiled_dims: str = "mn",
    use_psum_layout: bool = False,
) -> None:
    """MoE weight gradient: D[g] (fp32 [M, N]) = C[g] + A_g @ B_gᵀ over group g's k_g tokens.

    DeepGEMM's Hopper layout: ``a`` = (e4m3 flat [Σk·M]: per group A_g [M, k_g] row-major, groups
    back to back; fp32 [M, Σk/128]), ``b`` likewise with N; ``ks_cpu`` the host list of k_g, each a
    multiple of 128; ``grouped_layout`` the same sizes, int32 [G] on the GPU (what the kernel reads).
    """
    function = "k_grouped_fp8_gemm_nt_contiguous"
    (qa, sfa), (qb, sfb), (_, m, n, ks) = _k_grouped_fp8_call(function, a, b, recipe, d, c, ks_cpu, grouped_layout,
                                                               use_psum_layout)
    sum_k = sum(ks)
    for arg, data, rows in (("a", qa, m), ("b", qb, n)):
        if data.numel() != sum_k * rows or not data.is_contiguous():
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' data must be contiguous with Σk·{rows} = {sum_k * rows} elements, got {data.numel()}")
    blocks = sum_k // SCALE_BLOCK
    for arg, sf, rows in (("a", sfa, m), ("b", sfb, n)):
        if tuple(sf.shape) != (rows, blocks):
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' scales must be [{rows}, Σk/128] = [{rows}, {blocks}], got {list(sf.shape)}")
    if _nothing_to_launch(d, c, m, n, sum_k):
        return
    # cutegen's kernel reads the scales as [Σk/128, rows] row-major: DeepGEMM's [rows, Σk/128]
    # MN-major scales transposed (a view when they have that layout).
    k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(
        qa.view(-1), _contiguous(sfa.t()), qb.view(-1), _contiguous(sfb.t()), d, grouped_layout, c
    )


def k_grouped_fp8_gemm_tn_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: Sequence[int] | None,
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] = (1, 1, 128),
    compiled_dims: str = "mn",
    use_psum_layout: bool = False,
) -> None:
    """MoE weight gradient, DeepGEMM's SM100 form: D[g] (fp32 [M, N]) = C[g] + A_gᵀ @ B_g over
    group g's k_g tokens, on Blackwell's block-scaled MMA.

    ``a`` = (e4m3 [Σk, M] row-major, the groups' tokens back to back; fp32 [Σk/128, M], powers of
    two), ``b`` likewise with N; ``ks_cpu`` the host list of k_g, each a multiple of 128;
    ``grouped_layout`` the same sizes, int32 [G] on the GPU (what the kernel reads). Its kernels
    are built for sm_100a only: elsewhere the call fails naming the architecture.
    """
    function = "k_grouped_fp8_gemm_tn_contiguous"
    (qa, sfa), (qb, sfb), (_, m, n, ks) = _k_grouped_fp8_call(function, a, b, recipe, d, c, ks_cpu, grouped_layout,
                                                               use_psum_layout)
    sum_k = sum(ks)
    for arg, data, sf, rows in (("a", qa, sfa, m), ("b", qb, sfb, n)):
        if data.dim() != 2 or tuple(data.shape) != (sum_k, rows):
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' data must be [Σk, {rows}] = [{sum_k}, {rows}], "
                             f"got {list(data.shape)}")
        if tuple(sf.shape) != (sum_k // SCALE_BLOCK, rows):
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' scales must be [Σk/128, {rows}] = "
                             f"[{sum_k // SCALE_BLOCK}, {rows}], got {list(sf.shape)}")
    if _nothing_to_launch(d, c, m, n, sum_k):
        return
    # The kernel choice's K is the runtime's default, the tokens' even share per group.
    k_grouped_ops.k_grouped_fp8_gemm_tn_contiguous(
        _contiguous(qa), _contiguous(sfa), _contiguous(qb), _contiguous(sfb), d, grouped_layout, c
    )


def _bf16_operands(function: str, a: Any, b: Any) -> tuple[int, int, int]:
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 or t.dim() != 2:
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' must be a 2-D torch.bfloat16 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {list(getattr(t, 'shape', []))}")
    (m, k), (n, kb) = a.shape, b.shape
    if kb != k:
        raise ValueError(f"deep_gemm.{function}: 'a' is [M, K] = {[m, k]} and 'b' must be [N, K], got {list(b.shape)}")
    return m, n, k


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None, compiled_dims: str = "nk") -> None:
    """D[M, N] = C + A @ Bᵀ (fp32 accumulation), written into ``d``: bf16 or fp32 D, C optional
    and of D's type (copied into D unless it is ``d``; K == 0 gives C or zeros)."""
    function = "bf16_gemm_nt"
    m, n, k = _bf16_operands(function, a, b)
    _check_d(function, d, (m, n), (torch.bfloat16, torch.float32))
    if c is not None and (not isinstance(c, torch.Tensor) or c.dtype != d.dtype or tuple(c.shape) != (m, n)):
        raise ValueError(f"deep_gemm.{function}: argument 'c' must be a {d.dtype} [M, N] = {[m, n]} tensor like 'd', got "
                         f"{getattr(c, 'dtype', type(c).__name__)} {list(getattr(c, 'shape', []))}")
    if m == 0 or n == 0:
        return
    if k == 0:
        _empty_k(d, c)
        return
    ops.bf16_gemm_nt(a, b, out=d, c=c)


def bf16_gemm_nn(a, b, d, c=None, compiled_dims="nk") -> None:
    """`bf16_gemm_nt` with B given as [K, N]."""
    bf16_gemm_nt(a, b.transpose(0, 1), d, c, compiled_dims)


def bf16_gemm_tn(a, b, d, c=None, compiled_dims="mn") -> None:
    """`bf16_gemm_nt` with A given as [K, M] and B as [K, N]."""
    bf16_gemm_nt(a.transpose(0, 1), b.transpose(0, 1), d, c, compiled_dims)


def bf16_gemm_tt(a, b, d, c=None, compiled_dims="mn") -> None:
    """`bf16_gemm_nt` with A given as [K, M]."""
    bf16_gemm_nt(a.transpose(0, 1), b, d, c, compiled_dims)


def m_grouped_bf16_gemm_nt_contiguous(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    grouped_layout: torch.Tensor | None = None,
    compiled_dims: str = "nk",
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    expected_m_for_psum_layout: int | None = None,
    *,
    m_indices: torch.Tensor | None = None,
) -> None:
    """BF16 experts over one [ΣM, K] activation: D[r] = A[r] @ B[g]ᵀ for every row r of group g,
    ``grouped_layout`` as in `m_grouped_fp8_gemm_nt_contiguous` (per-row groups, or cumulative group
    ends with ``use_psum_layout``); padding rows of D zeroed unless ``ensure_zero_padding=False``."""
    function = "m_grouped_bf16_gemm_nt_contiguous"
    grouped_layout = _grouped_layout_argument(function, grouped_layout, m_indices)
    for arg, t, rank in (("a", a, 2), ("b", b, 3)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' must be a torch.bfloat16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        _rows_cols(function, arg, t, rank)
    check_mk_alignment(function)
    m, _ = a.shape
    g, n, _ = b.shape
    _check_d(function, d, (m, n), (torch.bfloat16,))
    row_groups = _row_groups(function, grouped_layout, use_psum_layout, expected_m_for_psum_layout, g, m)
    if m == 0:
        return
    bf16_grouped_ops.m_grouped_bf16_gemm_nt_contiguous(a, b, row_groups, out=d, zero_padding=bool(ensure_zero_padding))


def m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False,
                                      ensure_zero_padding=True) -> None:
    """`m_grouped_bf16_gemm_nt_contiguous` with each B[g] given as [K, N]."""
    m_grouped_bf16_gemm_nt_contiguous(a, b.transpose(1, 2), d, grouped_layout, compiled_dims, use_psum_layout,
                                      ensure_zero_padding)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, compiled_dims: str = "nk") -> None:
    """Decode-time BF16 experts: A [G, max_m, K], D [G, max_m, N]; rows [0, masked_m[g]) of group g
    are computed (masked_m int32 [G] stays on the GPU: CUDA-graph capturable); ``expected_m`` guides
    the kernel choice only."""
    function = "m_grouped_bf16_gemm_nt_masked"
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' must be a torch.bfloat16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        _rows_cols(function, arg, t, 3)
    g, max_m, _ = a.shape
    n = b.shape[1]
    _check_d(function, d, (g, max_m, n), (torch.bfloat16,))
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"deep_gemm.{function}: argument 'expected_m' must be a positive int, got {expected_m!r}")
    bf16_grouped_ops.m_grouped_bf16_gemm_nt_masked(a, b, masked_m, int(expected_m), out=d)


bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked


def k_grouped_bf16_gemm_tn_contiguous(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    ks_cpu: Sequence[int] | None,
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    compiled_dims: str = "mn",
    use_psum_layout: bool = False,
) -> None:
    """MoE weight gradient in BF16: D[g] (fp32 [M, N]) = C[g] + A_gᵀ @ B_g over group g's k_g
    tokens, ``a`` [Σk, M] and ``b`` [Σk, N] tokens first; ``ks_cpu`` the host list of k_g, each a
    multiple of 128; ``grouped_layout`` the same sizes, int32 [G] on the GPU (what the kernel reads)."""
    function = "k_grouped_bf16_gemm_tn_contiguous"
    g, m, n, ks = _k_grouped_problem(function, d, c, ks_cpu, grouped_layout, use_psum_layout)
    for arg, t, rows in (("a", a, m), ("b", b, n)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 or tuple(t.shape) != (sum(ks), rows):
            raise ValueError(f"deep_gemm.{function}: argument '{arg}' must be a torch.bfloat16 [Σk, {rows}] = "
                             f"[{sum(ks)}, {rows}] tensor, got {getattr(t, 'dtype', type(t).__name__)} {list(getattr(t, 'shape', []))}")
    if _nothing_to_launch(d, c, m, n, sum(ks)):
        return
    bf16_grouped_ops.k_grouped_bf16_gemm_tn_contiguous(a, b, d, grouped_layout, c, expected_k=max(SCALE_BLOCK, sum(ks) // g))


def _cublaslt(function: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
    """D = C + A·Bᵀ on cuBLASLt through torch (FP8 without scales: `torch._scaled_mm` at scale 1;
    BF16 with C: one GEMM reading C, as DeepGEMM's cuBLASLt call with beta = 1)."""
    if a.dtype == torch.float8_e4m3fn:
        one = torch.ones((), dtype=torch.float32, device=a.device)
        product = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=d.dtype)
    elif a.dtype == torch.bfloat16 and c is not None:
        d.copy_(torch.addmm(c, a, b.t()) if d.dtype == torch.bfloat16 else torch.addmm(c, a, b.t(), out_dtype=d.dtype))
        return
    elif a.dtype == torch.bfloat16:
        product = torch.mm(a, b.t()) if d.dtype == torch.bfloat16 else torch.mm(a, b.t(), out_dtype=d.dtype)
    else:
        raise unsupported(function, f"{a.dtype} operands")
    if c is None:
        d.copy_(product)
    else:
        torch.add(c, product, out=d)


def cublaslt_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """DeepGEMM's cuBLASLt baseline: D = C + A @ Bᵀ (FP8 e4m3 or bf16 operands, no scales)."""
    _cublaslt("cublaslt_gemm_nt", a, b, d, c)


def cublaslt_gemm_nn(a, b, d, c=None) -> None:
    _cublaslt("cublaslt_gemm_nn", a, b.t(), d, c)


def cublaslt_gemm_tn(a, b, d, c=None) -> None:
    _cublaslt("cublaslt_gemm_tn", a.t(), b.t(), d, c)


def cublaslt_gemm_tt(a, b, d, c=None) -> None:
    _cublaslt("cublaslt_gemm_tt", a.t(), b, d, c)


__all__ = [
    "bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "bf16_m_grouped_gemm_nt_masked",
    "cublaslt_gemm_nn", "cublaslt_gemm_nt", "cublaslt_gemm_tn", "cublaslt_gemm_tt",
    "fp8_fp4_gemm_nn", "fp8_fp4_gemm_nt", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_m_grouped_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_fp8_fp4_gemm_nn_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
]
