"""Standalone runtime: manifests, cuda-python loader and launcher, heuristics, torch ops. Never imports the CuTe DSL.

Importing this package is cheap: it loads no torch and no CUDA library. The heavier pieces are
reached lazily by attribute:

* ``bf16_gemm_nt`` (torch-facing, `cutegen.runtime.ops`; imports torch on first access);
* ``fp8_gemm_nt`` and ``to_mn_major_tma_aligned`` (torch-facing, `cutegen.runtime.fp8_ops`);
* ``fp8_wgrad_gemm_nt`` (dense weight gradient, `fp8_ops`) and
  ``k_grouped_fp8_gemm_nt_contiguous`` (MoE weight gradient, `cutegen.runtime.k_grouped_ops`);
* ``per_token_quant_fp8``, ``per_block_quant_fp8``, ``grouped_transposed_quant_fp8``
  (torch-facing, `cutegen.runtime.quant_ops`; their pure-torch references are in
  `cutegen.runtime.quant_reference`);
* ``set_num_sms`` (`sm_budget`): cap the SMs every persistent grid uses;
* ``load_catalogue`` / ``KernelCatalogue`` (`catalogue`), ``LoadedKernel`` (`driver`),
  ``choose`` / ``explain`` (`heuristics`). The launcher is ``cutegen.runtime.launch.launch``
  (the submodule's name would shadow a lazy attribute).

The error classes are importable directly (``from cutegen.runtime import InputError``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    ArchMismatchError,
    ArtifactError,
    CudaError,
    CutegenError,
    InputError,
    KernelLoadError,
    NoGpuError,
)

_LAZY = {
    "bf16_gemm_nt": "ops",
    "fp8_gemm_nt": "fp8_ops",
    "fp8_wgrad_gemm_nt": "fp8_ops",
    "k_grouped_fp8_gemm_nt_contiguous": "k_grouped_ops",
    "m_grouped_fp8_gemm_nt_contiguous": "grouped_ops",
    "m_grouped_fp8_gemm_nt_masked": "grouped_ops",
    "m_indices_from_group_ends": "grouped_ops",
    "contiguous_alignment": "grouped_ops",
    "per_token_quant_fp8": "quant_ops",
    "per_block_quant_fp8": "quant_ops",
    "grouped_transposed_quant_fp8": "quant_ops",
    "to_mn_major_tma_aligned": "fp8_ops",
    "load_catalogue": "catalogue",
    "KernelCatalogue": "catalogue",
    "LoadedKernel": "driver",
    "choose": "heuristics",
    "explain": "heuristics",
    "set_num_sms": "sm_budget",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ArchMismatchError",
    "ArtifactError",
    "CudaError",
    "CutegenError",
    "InputError",
    "KernelLoadError",
    "NoGpuError",
    *_LAZY,
]
