"""The torch-facing runtime in one place: every op's entry point, and the catalogue and kernel choice they share.

The ops live in modules of their own (`bf16_ops`, `bf16_grouped_ops`, `epilogue_ops`, `fp8_ops`, `fused_ops`,
`grouped_ops`, `k_grouped_ops`, `nvfp4_ops`, `quant_ops`) over shared services (`kernel_choice`: catalogue and choice; `checks`: input
checks; `torch_ops`: registration, eager dispatch, streams; `call_cache` and `launch`: the
remembered calls and their plans). Importing any op module registers its ``torch.ops.cutegen``
ops; ``import cutegen.runtime`` registers all of them when torch is already imported.
"""

from __future__ import annotations

from .bf16_grouped_ops import (
    k_grouped_bf16_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
)
from .bf16_ops import OP_BF16_GEMM_NT, bf16_gemm_nt
from .epilogue_ops import bf16_gemm_nt_epilogue, fp8_gemm_nt_epilogue
from .fp8_ops import fp8_gemm_nt, fp8_wgrad_gemm_nt, to_mn_major_tma_aligned
from .fused_ops import (
    fp8_gemm_nt_swiglu_quant,
    interleave_gate_up,
    m_grouped_fp8_gemm_nt_contiguous_swiglu_quant,
    m_grouped_fp8_gemm_nt_masked_swiglu_quant,
)
from .grouped_ops import m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked
from .k_grouped_ops import k_grouped_fp8_gemm_nt_contiguous, k_grouped_fp8_gemm_tn_contiguous
from .kernel_choice import (
    catalogue,
    choose_kernel,
    explain,
    forced_manifest,
    runnable_kernels,
    set_build_dir,
)
from .nvfp4_ops import nvfp4_gemm_nt
from .quant_ops import grouped_transposed_quant_fp8, per_block_quant_fp8, per_token_quant_fp4, per_token_quant_fp8

__all__ = [
    "OP_BF16_GEMM_NT",
    "bf16_gemm_nt",
    "bf16_gemm_nt_epilogue",
    "catalogue",
    "choose_kernel",
    "explain",
    "forced_manifest",
    "fp8_gemm_nt",
    "fp8_gemm_nt_epilogue",
    "fp8_gemm_nt_swiglu_quant",
    "fp8_wgrad_gemm_nt",
    "grouped_transposed_quant_fp8",
    "interleave_gate_up",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant",
    "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_masked_swiglu_quant",
    "nvfp4_gemm_nt",
    "per_block_quant_fp8",
    "per_token_quant_fp4",
    "per_token_quant_fp8",
    "runnable_kernels",
    "set_build_dir",
    "to_mn_major_tma_aligned",
]
