"""The typed entry points (`__call__`) of the block-scaled GEMM ops that more than one architecture
implements, mixed into each architecture's kernel class, which provides `_launch`. The argument
types are what `cute.compile` traces, so they fix the kernels' host-side signatures.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute


class Fp8GemmNtEntry:
    """`fp8_gemm_nt`: D = (A · sfa) · (B · sfb)ᵀ with 1x128 / 128x128 block scales."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream)


class Fp8GemmNtMxEntry:
    """`fp8_gemm_nt` with the scales applied by the MMA: SFA and SFB are the blocked UE8M0 bytes
    the block-scaled MMA reads (`cutegen.runtime.mx_reference.to_blocked`), taken as addresses."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream)


class Nvfp4GemmNtEntry:
    """`nvfp4_gemm_nt`: D = alpha · (A · sfa) · (B · sfb)ᵀ with FP4 A and B and NVFP4's E4M3 scales
    in the MMA's blocked layout, taken as addresses, like ``alpha`` (fp32, one element)."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        alpha: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, alpha=alpha)


class Fp8WgradMxEntry:
    """`fp8_wgrad_gemm_nt` with the scales applied by the MMA: D (fp32) += (A · sfa) · (B · sfb)ᵀ,
    SFA and SFB the blocked UE8M0 bytes of every row of A and of B; ``tail_split`` sizes the grid
    as the op's grid rule does."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        tail_split: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, tail_split=tail_split)


class KGroupedTnMxEntry:
    """`k_grouped_fp8_gemm_tn_contiguous` with the scales applied by the MMA: for every group g with
    tokens, D[g] (fp32) += (A_g · sfa_g)ᵀ · (B_g · sfb_g) over its rows of A [Σk, M] and B [Σk, N]
    (taken MN-major), SFA and SFB the blocked UE8M0 bytes of every row and 128-token block;
    ``group_sizes`` [G] is read on the GPU."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        group_sizes: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, group_sizes=group_sizes)


class Fp8GemmNtSplitKEntry:
    """`fp8_gemm_nt` with the K blocks of each tile split over `k_splits` CTAs: each writes its fp32
    partial sum to `split_partials` and counts itself in `split_counters` (one int32 per tile,
    zero before the launch and left zero after it); the last of a tile adds the others' partials
    and stores the tile."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        split_counters: cute.Pointer,
        split_partials: cute.Pointer,
        k_splits: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, sfa, sfb, max_active_clusters, stream,
            split_counters=split_counters, split_partials=split_partials, k_splits=k_splits,
        )


class MGroupedContiguousEntry:
    """`m_grouped_fp8_gemm_nt_contiguous`: per row r of A, D[r] = (A[r] · sfa) · (B[g] · sfb[g])ᵀ
    with g = m_indices[r]; rows with g = -1 are padding."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        m_indices: cute.Pointer,
        zero_padding: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, m_indices, zero_padding)


class MGroupedContiguousMxEntry:
    """`m_grouped_fp8_gemm_nt_contiguous` with the scales applied by the MMA: SFA the blocked
    UE8M0 bytes of all ΣM rows, SFB of each group's [N, K] one group after another."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        m_indices: cute.Pointer,
        zero_padding: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, m_indices, zero_padding)


class MGroupedMaskedMxEntry:
    """`m_grouped_fp8_gemm_nt_masked` with the scales applied by the MMA: SFA the blocked UE8M0
    bytes of each group's [max_m, K], SFB of each group's [N, K], one group after another."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Pointer,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        masked_m: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, masked_m=masked_m)


class MGroupedMaskedEntry:
    """`m_grouped_fp8_gemm_nt_masked`: for every group g and row r < masked_m[g],
    D[g, r] = (A[g, r] · sfa[g, r]) · (B[g] · sfb[g])ᵀ."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        masked_m: cute.Pointer,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(a, b, d, sfa, sfb, max_active_clusters, stream, masked_m=masked_m)


class MGroupedMaskedSplitKEntry:
    """`m_grouped_fp8_gemm_nt_masked` with the last wave's tiles split along K over the idle
    clusters (at most `k_splits` ways), their fp32 partial sums reduced through `split_partials`
    and `split_counters` as `Fp8GemmNtSplitKEntry` describes."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        sfa: cute.Tensor,
        b: cute.Tensor,
        sfb: cute.Pointer,
        d: cute.Tensor,
        masked_m: cute.Pointer,
        split_counters: cute.Pointer,
        split_partials: cute.Pointer,
        k_splits: cutlass.Int32,
        max_active_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        self._launch(
            a, b, d, sfa, sfb, max_active_clusters, stream, masked_m=masked_m,
            split_counters=split_counters, split_partials=split_partials, k_splits=k_splits,
        )
