"""Pure-torch specification of the fused epilogues: SwiGLU + FP8 quantize (the weight arrangement it reads and its numerics), and bias + activation.

A mixture-of-experts up-projection computes h = x · W13ᵀ with W13 = [gate; up] ([2I, H]: the
first I rows gate, the next I up, as checkpoints and engines store them), then
a = SiLU(h_gate) · h_up [T, I]. The fused kernels read W13 with its gate and up rows interleaved
in blocks of SWIGLU_BLOCK = 128 (`interleave_gate_up`, done once when the weights are loaded), so
that every 256-wide tile of h holds 128 gate columns and the matching 128 up columns, and they
write a quantized per token and 1x128 block exactly as `per_token_quant_fp8` would.

`swiglu_quant_ref` is the executable specification: given the GEMM's fp32 sums h (in the
original gate | up column order), a = h_gate / (1 + exp(-h_gate)) · h_up in fp32 (what
``torch.nn.functional.silu(h_gate) * h_up`` computes) and `per_token_quant_fp8_ref` of a. The
kernels promote the sums as the plain FP8 GEMM does and apply these steps without rounding h to
bf16 in between (where the unfused pipeline GEMM → bf16 → activation → quantize rounds once more).

`bias_activation_ref` is the bias-and-activation epilogue's (`fp8_gemm_nt_epilogue`,
`bf16_gemm_nt_epilogue`): y = act(h + bias) in fp32 on the GEMM's fp32 sums h, then one rounding to
bf16, where the unfused pipeline rounds h to bf16 first and the sum with the bias again.
"""

from __future__ import annotations

import torch

from .errors import InputError
from .quant_reference import DEFAULT_EPS, ceil_div, per_token_quant_fp8_ref, unpack_ue8m0

SWIGLU_BLOCK = 128
SCALE_BLOCK = 128


def interleave_gate_up(w: torch.Tensor, sf: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """W13 = [gate; up] ([2I, H] or per expert [G, 2I, H], any dtype) with its rows reordered as the
    fused SwiGLU kernels read them: gate rows 128j..128j+127, then up rows 128j..128j+127, for
    j = 0 .. I/128 - 1. With ``sf``, the weights' 128x128 block scales ([2I/128, ⌈H/128⌉] or
    [G, ...]) reordered the same way: returns (w, sf). I must be a multiple of 128."""
    w2 = _interleave_rows(w, "w", SWIGLU_BLOCK)
    if sf is None:
        return w2
    if sf.dim() != w.dim() or sf.shape[-2] * SCALE_BLOCK != w.shape[-2]:
        raise InputError(
            f"interleave_gate_up: argument 'sf' must hold one scale per 128x128 block of 'w' "
            f"([..., {w.shape[-2] // SCALE_BLOCK}, ceil(H/128)]), got {list(sf.shape)}"
        )
    return w2, _interleave_rows(sf, "sf", SWIGLU_BLOCK // SCALE_BLOCK)


def deinterleave_gate_up(w: torch.Tensor) -> torch.Tensor:
    """The inverse of `interleave_gate_up` on rows (weights, or the columns of h transposed)."""
    lead = w.shape[:-2]
    rows, cols = w.shape[-2:]
    blocks = rows // (2 * SWIGLU_BLOCK)
    return w.reshape(*lead, blocks, 2, SWIGLU_BLOCK, cols).transpose(-4, -3).reshape(*lead, rows, cols)


def _interleave_rows(t: torch.Tensor, arg: str, block: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3):
        raise InputError(f"interleave_gate_up: argument '{arg}' must be a [2I, H] or [G, 2I, H] tensor, "
                         f"got {getattr(t, 'shape', type(t).__name__)}")
    rows, cols = t.shape[-2:]
    if rows % (2 * block):
        raise InputError(f"interleave_gate_up: argument '{arg}' must have 2I rows with I a multiple of "
                         f"{SWIGLU_BLOCK} (gate rows, then up rows), got {rows}")
    lead = t.shape[:-2]
    halves = t.reshape(*lead, 2, rows // (2 * block), block, cols)
    return halves.transpose(-4, -3).reshape(*lead, rows, cols).contiguous()


def swiglu_ref(h: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) · up in fp32 from h [..., 2I] = [gate | up] (any float dtype, widened exactly)."""
    h = h.float()
    inter = h.shape[-1] // 2
    gate, up = h[..., :inter], h[..., inter:]
    return torch.nn.functional.silu(gate) * up


def swiglu_quant_ref(h: torch.Tensor, eps: float = DEFAULT_EPS, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q e4m3 [..., M, I], fp32 scales [..., M, I/128]) of SiLU(gate) · up of the sums h
    [..., M, 2I] (gate | up), quantized per token and 1x128 block (`per_token_quant_fp8_ref`);
    ``use_ue8m0``: with its UE8M0 scales (rounded up to powers of two), returned as fp32."""
    act = swiglu_ref(h)
    if act.dim() == 2:
        return _quantize_rows(act, eps, use_ue8m0)
    qs, ss = zip(*(_quantize_rows(a, eps, use_ue8m0) for a in act))
    return torch.stack(qs), torch.stack(ss)


def _quantize_rows(act: torch.Tensor, eps: float, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_ue8m0:
        return per_token_quant_fp8_ref(act, eps=eps)
    q, packed = per_token_quant_fp8_ref(act, eps=eps, scale_format="ue8m0")
    return q, unpack_ue8m0(packed, ceil_div(act.shape[-1], SCALE_BLOCK))


# The elementwise activations of the bias-and-activation epilogue, by name.
ACTIVATIONS = ("none", "silu", "gelu")


def bias_activation_ref(h: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    """bf16 act(h + bias) from the sums h [M, N] (widened to fp32), bias [N] (widened to fp32) or
    None, act one of `ACTIVATIONS` (``gelu`` the exact one, erf-based), in fp32."""
    if activation not in ACTIVATIONS:
        raise InputError(f"bias_activation_ref: argument 'activation' must be one of {', '.join(ACTIVATIONS)}, "
                         f"got {activation!r}")
    y = h.float()
    if bias is not None:
        y = y + bias.float()
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    elif activation == "gelu":
        y = torch.nn.functional.gelu(y)
    return y.to(torch.bfloat16)


__all__ = [
    "ACTIVATIONS", "SWIGLU_BLOCK", "bias_activation_ref", "deinterleave_gate_up", "interleave_gate_up",
    "swiglu_quant_ref", "swiglu_ref",
]
