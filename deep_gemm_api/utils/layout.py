"""DeepGEMM's scale-layout utilities (``deep_gemm.utils.layout``) and its contiguous-layout alignment.

Hopper's kernels take fp32 activation scales MN-major and TMA-aligned: a [mn, k] matrix with
strides (1, align(mn, 4)), batches back to back (`get_mn_major_tma_aligned_tensor`, the layout
`cutegen.runtime.to_mn_major_tma_aligned` produces). The UE8M0 packings are DeepGEMM's SM100
layouts: `get_mn_major_tma_aligned_packed_ue8m0_tensor` is computed here in torch (same result),
and `transform_sf_into_required_layout` passes per-row packed scales through (Blackwell's
block-scaled kernels read them); the k-grouped SM100 packing is not in cutegen and raises
`NotImplementedError`.
"""

from __future__ import annotations

import torch

from cutegen.runtime.grouped_ops import contiguous_alignment
from cutegen.runtime.quant_reference import is_mn_major_tma_aligned, to_mn_major_tma_aligned

from .math import align, ceil_div

TMA_ALIGN_BYTES = 16

# DeepGEMM's process-wide M (contiguous) / K (k-grouped) segment alignment. cutegen's grouped
# kernels are built for 128-row segments; a call under another value is refused, naming it.
_mk_alignment = contiguous_alignment()


def set_mk_alignment_for_contiguous_layout(alignment: int) -> None:
    """Set the row (M-grouped) / token (k-grouped) alignment of each group's segment."""
    global _mk_alignment
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"set_mk_alignment_for_contiguous_layout: 'alignment' must be a positive int, got {alignment!r}")
    _mk_alignment = alignment


def get_mk_alignment_for_contiguous_layout() -> int:
    return _mk_alignment


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment cutegen's grouped kernels need: 128 on every architecture (their tiles are
    128 rows; DeepGEMM's SM100 kernels may prefer other values, cutegen's do not)."""
    return contiguous_alignment()


def check_mk_alignment(op: str) -> None:
    """Refuse a grouped call while the alignment set is not the one cutegen's kernels take."""
    if _mk_alignment != contiguous_alignment():
        raise ValueError(
            f"{op}: the contiguous-layout alignment is {_mk_alignment} "
            f"(set_mk_alignment_for_contiguous_layout), but cutegen's grouped kernels need "
            f"{contiguous_alignment()}-aligned group segments; set it to "
            f"get_theoretical_mk_alignment_for_contiguous_layout() = {contiguous_alignment()}"
        )


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """x rounded up to a 16-byte multiple of elements of ``element_size`` bytes."""
    if TMA_ALIGN_BYTES % element_size:
        raise ValueError(f"get_tma_aligned_size: 'element_size' must divide 16, got {element_size}")
    return align(x, TMA_ALIGN_BYTES // element_size)


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """sf [mn, k] or [g, mn, k] (fp32) in the MN-major TMA-aligned layout; itself when it already is."""
    if sf.dtype != torch.float32 or sf.dim() not in (2, 3):
        raise ValueError(f"get_mn_major_tma_aligned_tensor: 'sf' must be a 2-D or 3-D fp32 tensor, got {sf.dtype} {list(sf.shape)}")
    # DeepGEMM's strides literally, also on modes of extent 1 (which the kernels do not read):
    # callers check them.
    mn, k = sf.shape[-2:]
    aligned_mn = get_tma_aligned_size(mn, sf.element_size())
    strides = (1, aligned_mn) if sf.dim() == 2 else (aligned_mn * k, 1, aligned_mn)
    if tuple(sf.stride()) == strides:
        return sf
    if sf.dim() == 2:
        out = torch.zeros((k, aligned_mn), dtype=sf.dtype, device=sf.device).t()[:mn]
    else:
        out = torch.zeros((sf.shape[0], k, aligned_mn), dtype=sf.dtype, device=sf.device).transpose(1, 2)[:, :mn]
    out.copy_(sf)  # padding rows stay 0
    return out


get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, psum_layout: torch.Tensor | None = None) -> torch.Tensor:
    """Power-of-two fp32 sf [mn, k] or [g, mn, k] -> their exponent bytes packed four per int32
    along k, MN-major and TMA-aligned: int32 [.., mn, ceil(k/4)] with strides (1, align(mn, 4))."""
    if psum_layout is not None:
        raise NotImplementedError(
            "get_mn_major_tma_aligned_packed_ue8m0_tensor: the psum layout packing is DeepGEMM's SM100 "
            "layout, which cutegen does not implement"
        )
    if sf.dtype != torch.float32 or sf.dim() not in (2, 3):
        raise ValueError(f"get_mn_major_tma_aligned_packed_ue8m0_tensor: 'sf' must be a 2-D or 3-D fp32 tensor, got {sf.dtype} {list(sf.shape)}")
    batched = sf if sf.dim() == 3 else sf.unsqueeze(0)
    groups, mn, k = batched.shape
    aligned_mn, words = get_tma_aligned_size(mn, 4), ceil_div(k, 4)
    exponents = torch.zeros((groups, aligned_mn, 4 * words), dtype=torch.uint8, device=sf.device)
    exponents[:, :mn, :k] = (batched.contiguous().view(torch.int32) >> 23).to(torch.uint8)
    packed = exponents.view(torch.int32).view(groups, aligned_mn, words)
    out = torch.empty((groups, words, aligned_mn), dtype=torch.int32, device=sf.device).transpose(1, 2)
    out.copy_(packed)
    out = out[:, :mn, :]
    return out if sf.dim() == 3 else out.squeeze(0)


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(*args, **kwargs):
    raise NotImplementedError(
        "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor: DeepGEMM's SM100 k-grouped UE8M0 "
        "scale layout is not implemented in cutegen (its k-grouped kernels take fp32 scales)"
    )


def transform_sf_into_required_layout(
    sf: torch.Tensor,
    mn: int,
    k: int,
    recipe: tuple,
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scales in the layout cutegen's kernels take, as DeepGEMM transforms them: fp32 1 x 128
    scales -> MN-major TMA-aligned; fp32 128 x 128 scales -> checked, returned (contiguous); packed
    UE8M0 1 x 128 scales per row (int32 [mn, ⌈k/512⌉], DeepGEMM's SM100 form) -> MN-major
    TMA-aligned. fp32 scales stay fp32 on every GPU (DeepGEMM casts them to UE8M0 on SM100;
    cutegen's sm_100a kernels take fp32 scales exactly); other packed granularities raise
    `NotImplementedError`."""
    if len(recipe) == 3:
        if is_sfa is None:
            raise ValueError("transform_sf_into_required_layout: a 3-element recipe needs 'is_sfa'")
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    elif len(recipe) == 2:
        if is_sfa is not None:
            raise ValueError("transform_sf_into_required_layout: a 2-element recipe takes no 'is_sfa'")
        gran_mn, gran_k = recipe
    else:
        raise ValueError(f"transform_sf_into_required_layout: 'recipe' must have 2 or 3 elements, got {recipe!r}")
    packed = sf.dtype == torch.int32
    expected = (ceil_div(mn, gran_mn), ceil_div(ceil_div(k, gran_k), 4) if packed else ceil_div(k, gran_k))
    if num_groups is not None and sf.dim() == 3:
        expected = (num_groups, *expected)
    if packed:
        if gran_mn != 1 or gran_k != 128 or sf.dim() != 2:
            raise NotImplementedError(
                f"transform_sf_into_required_layout: packed UE8M0 scales of granularity (mn {gran_mn}, k {gran_k})"
                f"{' in groups' if sf.dim() != 2 else ''}; cutegen's UE8M0 kernels read 1 x 128 scales per row "
                "of a dense GEMM's operand (DeepGEMM's SM100 (INT, 1, 128))"
            )
        if tuple(sf.shape) != expected:
            raise ValueError(f"transform_sf_into_required_layout: 'sf' must have shape {list(expected)}, got {list(sf.shape)}")
        return to_mn_major_tma_aligned(sf)
    if sf.dtype != torch.float32:
        raise ValueError(f"transform_sf_into_required_layout: 'sf' must be torch.float32 or packed UE8M0 torch.int32, got {sf.dtype}")
    if tuple(sf.shape[-2:]) != expected[-2:] or (len(expected) == 3 and sf.shape[0] != expected[0]):
        raise ValueError(f"transform_sf_into_required_layout: 'sf' must have shape {list(expected)}, got {list(sf.shape)}")
    if gran_k != 128 or gran_mn not in (1, 128):
        raise NotImplementedError(
            f"transform_sf_into_required_layout: recipe granularity (mn {gran_mn}, k {gran_k}) is not "
            "one of cutegen's (1 x 128 or 128 x 128 fp32 scales)"
        )
    if psum_layout is not None and gran_mn != 1:
        raise ValueError("transform_sf_into_required_layout: 'psum_layout' applies to activation (1 x 128) scales only")
    if gran_mn == 1:
        return to_mn_major_tma_aligned(sf)
    return sf if sf.is_contiguous() else sf.contiguous()


__all__ = [
    "get_col_major_tma_aligned_tensor",
    "get_k_alignment_for_contiguous_layout",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_mn_major_tma_aligned_tensor",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_tma_aligned_size",
    "is_mn_major_tma_aligned",
    "set_mk_alignment_for_contiguous_layout",
    "transform_sf_into_required_layout",
]
