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
