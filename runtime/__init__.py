"""Standalone runtime: manifests, cuda-python loader and launcher, heuristics, torch ops. Never imports the CuTe DSL.

Importing this package loads no CUDA library. Where torch is already imported (as in every engine
and training script), it also imports the op modules, so that every ``torch.ops.cutegen.<op>``
exists from ``import cutegen.runtime`` on; otherwise it loads no torch either (C launchers and the
generator use the torch-free modules: manifest, catalogue, driver, launch), and the op modules
load on first access of an op by attribute, or by importing them. The pieces reached lazily by
attribute:

* ``bf16_gemm_nt`` (torch-facing, `cutegen.runtime.bf16_ops`);
* ``m_grouped_bf16_gemm_nt_contiguous``, ``m_grouped_bf16_gemm_nt_masked`` (BF16 experts) and
  ``k_grouped_bf16_gemm_tn_contiguous`` (their weight gradient), `cutegen.runtime.bf16_grouped_ops`;
* ``fp8_gemm_nt`` and ``to_mn_major_tma_aligned`` (torch-facing, `cutegen.runtime.fp8_ops`);
* ``nvfp4_gemm_nt`` (NVFP4 operands, Blackwell only; `cutegen.runtime.nvfp4_ops`);
* ``fp8_wgrad_gemm_nt`` (dense weight gradient, `fp8_ops`) and
  ``k_grouped_fp8_gemm_nt_contiguous`` (MoE weight gradient) and its tokens-first Blackwell form
  ``k_grouped_fp8_gemm_tn_contiguous``, `cutegen.runtime.k_grouped_ops`;
* ``fp8_gemm_nt_swiglu_quant``, ``m_grouped_fp8_gemm_nt_contiguous_swiglu_quant``,
  ``m_grouped_fp8_gemm_nt_masked_swiglu_quant`` (the MoE up-projection with SwiGLU and FP8
  quantize fused) and ``interleave_gate_up`` (the weights' arrangement they read),
  `cutegen.runtime.fused_ops`;
* ``fp8_gemm_nt_epilogue``, ``bf16_gemm_nt_epilogue`` (the dense GEMMs with a bias and/or an
  activation fused into their epilogue), `cutegen.runtime.epilogue_ops`;
* ``per_token_quant_fp8``, ``per_token_quant_fp4``, ``per_block_quant_fp8``,
  ``grouped_transposed_quant_fp8`` (torch-facing, `cutegen.runtime.quant_ops`; their pure-torch
  references are in `cutegen.runtime.quant_reference` and, for FP4, `cutegen.runtime.mx_reference`);
* ``set_num_sms`` (`sm_budget`): cap the SMs every persistent grid uses;
* ``load_catalogue`` / ``KernelCatalogue`` (`catalogue`), ``LoadedKernel`` (`driver`),
  ``choose`` / ``explain`` (`heuristics`). The launcher is ``cutegen.runtime.launch.launch``
  (the submodule's name would shadow a lazy attribute).

The error classes are importable directly (``from cutegen.runtime import InputError``).
"""

from __future__ import annotations

import importlib
import sys
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
    "bf16_gemm_nt": "bf16_ops",
    "m_grouped_bf16_gemm_nt_contiguous": "bf16_grouped_ops",
    "m_grouped_bf16_gemm_nt_masked": "bf16_grouped_ops",
    "k_grouped_bf16_gemm_tn_contiguous": "bf16_grouped_ops",
    "fp8_gemm_nt": "fp8_ops",
    "fp8_wgrad_gemm_nt": "fp8_ops",
    "nvfp4_gemm_nt": "nvfp4_ops",
    "k_grouped_fp8_gemm_nt_contiguous": "k_grouped_ops",
    "k_grouped_fp8_gemm_tn_contiguous": "k_grouped_ops",
    "m_grouped_fp8_gemm_nt_contiguous": "grouped_ops",
    "m_grouped_fp8_gemm_nt_masked": "grouped_ops",
    "m_indices_from_group_ends": "grouped_ops",
    "contiguous_alignment": "grouped_ops",
    "fp8_gemm_nt_swiglu_quant": "fused_ops",
    "m_grouped_fp8_gemm_nt_contiguous_swiglu_quant": "fused_ops",
    "m_grouped_fp8_gemm_nt_masked_swiglu_quant": "fused_ops",
    "interleave_gate_up": "fused_ops",
    "fp8_gemm_nt_epilogue": "epilogue_ops",
    "bf16_gemm_nt_epilogue": "epilogue_ops",
    "per_token_quant_fp8": "quant_ops",
    "per_token_quant_fp4": "quant_ops",
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


# The modules that register torch.ops.cutegen ops (`torch_ops.TorchOp`).
OP_MODULES = (
    "bf16_ops", "bf16_grouped_ops", "epilogue_ops", "fp8_ops", "fused_ops", "grouped_ops", "k_grouped_ops",
    "nvfp4_ops", "quant_ops",
)


def register_torch_ops() -> None:
    """Import every op module, defining all ``torch.ops.cutegen`` ops (imports torch)."""
    for module in OP_MODULES:
        importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if "torch" in sys.modules:
    register_torch_ops()

__all__ = [
    "ArchMismatchError",
    "ArtifactError",
    "CudaError",
    "CutegenError",
    "InputError",
    "KernelLoadError",
    "NoGpuError",
    "OP_MODULES",
    "register_torch_ops",
    *_LAZY,
]
