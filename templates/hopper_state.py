"""What the Hopper GEMM's roles share, set up once per CTA: the kernel's arguments, the CTA's place in
its cluster, its shared-memory partitions and fragments, and the persistent tile walk."""

from __future__ import annotations

from typing import Any, NamedTuple


class GemmArgs(NamedTuple):
    """The kernel's parameters, as `_launch` passes them: what the roles read."""

    tma_atom_a: Any
    mA_mk: Any
    tma_atom_b: Any
    mB_nk: Any
    tma_atom_sfa: Any
    mSFA_mk: Any
    sfb_ptr: Any
    tma_atom_sfb: Any
    mSFB_nk: Any
    tma_atom_c: Any
    mC_mn: Any
    m_indices_ptr: Any
    zero_padding: Any
    masked_m_ptr: Any
    group_sizes_ptr: Any
    workspace_ptr: Any
    split_counters_ptr: Any
    split_partials_ptr: Any
    k_splits: Any
    a_base_ptr: Any
    b_base_ptr: Any
    tail_split: Any
    tma_atom_a_tail: Any
    a_smem_layout_staged: Any
    a_tail_layout_staged: Any
    b_smem_layout_staged: Any
    sfa_smem_layout_staged: Any
    sfb_smem_layout_staged: Any
    epi_smem_layout_staged: Any
    d_sf: Any  # the activation epilogue's output scales (None for the others)
    eps: Any  # the activation epilogue's quantizer eps (None for the others)
    bias: Any  # the fused epilogue's bias per column of D (None for the others)


class ClusterPosition(NamedTuple):
    """This CTA's place in its cluster and the multicast masks of its A and B loads."""

    cta_layout_mnk: Any
    cta_rank: Any
    coord_mnk: Any
    a_mcast_mask: Any
    b_mcast_mask: Any


class StageBytes(NamedTuple):
    """Bytes of a stage's loads: an A tile, one A_TAIL_SLICE_ROWS-row slice, all operands."""

    a_tile_bytes: int
    a_slice_bytes: int
    tma_copy_bytes: int


class ScaleTensors(NamedTuple):
    """SFA's stage buffers and TMA partition; SFB in global memory, or staged per row of B."""

    sSFA: Any
    tSFAsSFA: Any
    tSFAgSFA: Any
    mSFB: Any
    sSFB: Any
    tSFBsSFB: Any
    tSFBgSFB: Any


class GroupMetadata(NamedTuple):
    """The grouped layouts' device-side metadata (None where the op has none)."""

    mIdx: Any  # m_indices [M], contiguous layout
    mMasked: Any  # masked_m [G], masked layout
    mSizes: Any  # group sizes [G], k-grouped layout


class LoadPartitions(NamedTuple):
    """The operand tiles and the producer's TMA partitions of A and B."""

    gA_mk: Any
    gC_mn: Any
    tAsA: Any
    tAgA: Any
    tAsA_tail: Any
    tAgA_tail: Any
    tBsB: Any
    tBgB: Any
    tBsB_other: Any
    tBgB_other: Any
    b_own_mask: Any


class MathFragments(NamedTuple):
    """A math warpgroup's WGMMA operand fragments, accumulators and their tile coordinates."""

    tCrA: Any
    tCrB: Any
    accumulators: Any
    promoted: Any  # the tile's sum: `accumulators`, or the block-scaled path's promotion target
    accs: Any  # the block-scaled path's ring of WGMMA accumulators
    tCcC: Any  # tile-local (row, column) of this thread's accumulator elements


class TileWalk(NamedTuple):
    """The persistent walk both roles take, computed once per CTA (`_tile_walk`)."""

    first_tile: Any
    tile_stride: Any
    num_cluster_tiles: Any
    ct_m: Any
    ct_n: Any
    k_tile_cnt: Any
    cluster_coord_mnk: Any
    tail: Any  # `_tail_plan`'s, with a tail split
    last_wave: Any = None  # `_last_wave_plan`'s, with split K for the last wave only
