"""DeepGEMM's entry points that cutegen has no kernels for: each raises `NotImplementedError` naming itself."""

from __future__ import annotations

from typing import Callable

# name -> what it is, as the error says it.
MISSING = {
    "fp8_gemm_nt_skip_head_mid": "the skip-head-mid FP8 GEMM",
    "einsum": "einsum",
    "fp8_einsum": "FP8 einsum",
    "fp8_fp4_mqa_logits": "the MQA logits kernels",
    "fp8_mqa_logits": "the MQA logits kernels",
    "fp8_paged_mqa_logits": "the paged MQA logits kernels",
    "fp8_fp4_paged_mqa_logits": "the paged MQA logits kernels",
    "get_paged_mqa_logits_metadata": "the paged MQA logits kernels",
    "tf32_hc_prenorm_gemm": "the hyper-connection pre-norm GEMM",
    "fp8_fp4_mega_moe": "Mega MoE",
    "bf16_mega_moe": "Mega MoE",
    "get_symm_buffer_for_mega_moe": "Mega MoE",
    "transform_weights_for_mega_moe": "Mega MoE",
}


def _missing(name: str, what: str) -> Callable[..., None]:
    def function(*args, **kwargs) -> None:
        raise NotImplementedError(f"deep_gemm.{name}: {what} is not implemented in cutegen")

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Not in cutegen ({what}): raises NotImplementedError."
    return function


globals().update({name: _missing(name, what) for name, what in MISSING.items()})

__all__ = sorted(MISSING)
