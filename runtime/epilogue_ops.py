"""PyTorch entry points of the dense GEMMs whose epilogue adds a bias per column and/or applies an activation: D = act(A · Bᵀ + bias) in one kernel.

* ``fp8_gemm_nt_epilogue(a, sfa, b, sfb, bias=None, activation="none", out=None, *, c=None, kernel=None)``:
  the FP8 GEMM as `fp8_gemm_nt` takes it (fp32 1x128 scales of A, 128x128 of B) → D bf16 [M, N];
* ``bf16_gemm_nt_epilogue(a, b, bias=None, activation="none", out=None, *, c=None, kernel=None)``:
  the BF16 GEMM, A [M, K] and B [N, K] K-major → D bf16 [M, N].

With ``c`` (bf16 [M, N], a residual) both compute D = C + (A · Bᵀ + bias): the biased sum rounded
to bf16 is added into D holding C by the TMA's reduce-add (`out` may be `c` itself: in place). A
residual takes no activation (no shipped kernel adds an activated tile), and the FP8 GEMM without a
bias adds zeros as its bias (its only adding kernels are the bias ones).

``bias`` is a bf16 vector of N values (contiguous, 16-byte aligned), added to every row;
``activation`` is ``"none"``, ``"silu"`` or ``"gelu"`` (the exact, erf-based GELU, as
``torch.nn.functional.gelu`` by default). Both are applied to the fp32 sum before its one rounding
to bf16 (`cutegen.runtime.fused_reference.bias_activation_ref`). With neither, the plain GEMM runs.
``out`` (bf16 [M, N], unit stride along N, 16-byte aligned rows) is written in place; the torch
ops ``torch.ops.cutegen.<name>`` take it as a required argument. UE8M0 scales, FP4 weights, an
MN-major BF16 operand and a bias of another type or length are refused naming the argument before
anything is launched.
"""

from __future__ import annotations

from typing import Any

import torch

from . import bf16_ops, fp8_ops, stream_scratch
from .checks import check_aligned, check_disjoint, check_kernel_name, checks_under
from .errors import InputError
from .fused_reference import ACTIVATIONS
from .kernel_choice import kernel_for
from .launch import launch
from .torch_ops import TorchOp, current_stream, device_ordinal, new_bf16_out, nothing_to_launch

OP_FP8 = "fp8_gemm_nt_epilogue"
OP_BF16 = "bf16_gemm_nt_epilogue"
# The plain GEMM each op fuses its epilogue into.
GEMM = {OP_FP8: "fp8_gemm_nt", OP_BF16: "bf16_gemm_nt"}
# What each op binds, in the kernels' entry order (`schedules.contract`; bias where there is one).
OPERANDS = {OP_FP8: ("a", "sfa", "b", "sfb", "d"), OP_BF16: ("a", "b", "d")}


def entry(op: str, has_bias: bool, activation: str) -> str:
    """The catalogue entry (the manifest's op) of the kernels that serve `op` with this epilogue:
    the GEMM's name, then ``bias``, then the activation's name (``fp8_gemm_nt_bias_gelu``), as
    the generator names it (`Schedule.entry`)."""
    parts = [GEMM[op]] + (["bias"] if has_bias else []) + ([activation] if activation != "none" else [])
    return "_".join(parts)


def _fail(op: str, arg: str, what: str) -> InputError:
    return InputError(f"{op}: argument '{arg}' {what}")


def _check_epilogue(op: str, a: torch.Tensor, n: int, bias: Any, activation: Any) -> None:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise _fail(op, "activation", f"must be one of {', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise _fail(op, "bias", f"must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.device != a.device:
        raise _fail(op, "bias", f"must be on {a.device} (the device of 'a'), got {bias.device}")
    if bias.dtype != torch.bfloat16:
        raise _fail(op, "bias", f"must be torch.bfloat16 (D's type), got {bias.dtype}")
    if bias.dim() != 1 or bias.shape[0] != n:
        raise _fail(op, "bias", f"must be a vector of N = {n} values (one per column of D), got shape {list(bias.shape)}")
    if n > 1 and bias.stride(0) != 1:
        raise _fail(op, "bias", f"must be contiguous, got stride {bias.stride(0)}")


def _check_out(op: str, a: torch.Tensor, out: Any, m: int, n: int, arg: str = "out") -> None:
    """D (``out``), or the residual C it starts from: bf16 [M, N], rows contiguous and 16-byte aligned."""
    if not isinstance(out, torch.Tensor):
        raise _fail(op, arg, f"must be a torch.Tensor, got {type(out).__name__}")
    if out.device != a.device or out.dtype != torch.bfloat16:
        raise _fail(op, arg, f"must be a torch.bfloat16 tensor on {a.device}, got {out.dtype} on {out.device}")
    if tuple(out.shape) != (m, n):
        raise _fail(op, arg, f"must have shape [M, N] = [{m}, {n}], got {list(out.shape)}")
    if (n > 1 and out.stride(1) != 1) or (m > 1 and out.stride(0) % 8):
        raise _fail(op, arg, f"must be unit-stride along N with 16-byte aligned rows, got strides {list(out.stride())}")


def _fp8_meta(a, sfa, b, sfb, bias, activation, out) -> tuple[int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (M, N, K)."""
    m, n, k = checks_under(OP_FP8, GEMM[OP_FP8], lambda: fp8_ops._check_meta(a, sfa, b, sfb, None))
    if fp8_ops.b_is_fp4(b):
        raise _fail(OP_FP8, "b", "must be torch.float8_e4m3fn weights: the epilogue kernels take no FP4 weights")
    if sfa.dtype != torch.float32:
        raise _fail(OP_FP8, "sfa", f"must be fp32 scales (torch.float32): the epilogue kernels take no UE8M0 scales, got {sfa.dtype}")
    _check_epilogue(OP_FP8, a, n, bias, activation)
    if out is not None:
        _check_out(OP_FP8, a, out, m, n)
    return m, n, k


def _bf16_meta(a, b, bias, activation, out) -> tuple[int, int, int]:
    m, n, k = checks_under(OP_BF16, GEMM[OP_BF16], lambda: bf16_ops.check_meta(a, b, None))
    for arg, t in (("a", a), ("b", b)):
        if bf16_ops.mn_major(t):
            raise _fail(OP_BF16, arg, "must be K-major (unit stride along K): the epilogue kernels read NT operands")
    _check_epilogue(OP_BF16, a, n, bias, activation)
    if out is not None:
        _check_out(OP_BF16, a, out, m, n)
    return m, n, k


def _launch(op: str, operands: dict[str, torch.Tensor], bias, activation: str, m: int, n: int, k: int,
            kernel_name: str, scale: str | None, adds: bool = False) -> None:
    """Launch the kernel of `op`'s epilogue on the checked operands (``adds``: one adding its result
    into D, which holds C)."""
    inputs = {name: t for name, t in operands.items() if name != "d"}
    if bias is not None:
        inputs["bias"] = bias
    check_disjoint(op, {"out": operands["d"]}, inputs)
    if nothing_to_launch(operands["d"], m, n, k):
        if k == 0 and (bias is not None or activation != "none"):
            # The empty sum is zero: D = act(bias), broadcast over the rows.
            zero = torch.zeros_like(operands["d"], dtype=torch.float32) + (bias.float() if bias is not None else 0.0)
            act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}.get(activation)
            result = act(zero) if act is not None else zero
            operands["d"].copy_(result.to(torch.bfloat16).float() + operands["d"].float() if adds else result)
        return
    for name, t in (*operands.items(), ("bias", bias)):
        check_aligned(op, "out" if name == "d" else name, t, 4 if name == "sfb" else 16)
    bound = dict(operands)
    if bias is not None:
        bound["bias"] = bias
    device = device_ordinal(operands["a"])
    with torch.cuda.device(device):
        loaded = kernel_for(
            entry(op, bias is not None, activation), m, n, k, device, kernel_name, scale, d_dtype="bf16", adds=adds
        )
        launch(loaded, bound, stream=current_stream(operands["a"]))


# ---- FP8 ----------------------------------------------------------------------------------------


def _fp8_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, bias: torch.Tensor | None,
    activation: str, out: torch.Tensor, adds: bool = False, kernel_name: str = "",
) -> None:
    m, n, k = _fp8_meta(a, sfa, b, sfb, bias, activation, out)
    operands = dict(zip(OPERANDS[OP_FP8], (a, sfa, b, sfb, out)))
    _launch(OP_FP8, operands, bias, activation, m, n, k, kernel_name, "f32", adds)


def _fp8_fake(a, sfa, b, sfb, bias, activation: str, out, adds: bool = False, kernel_name: str = "") -> None:
    _fp8_meta(a, sfa, b, sfb, bias, activation, out)


FP8 = TorchOp(OP_FP8, _fp8_impl, _fp8_fake, mutates=("out",))

# Zero biases [N] per (device, N): what the FP8 residual kernels add when the caller gives none.
_zero_biases: dict[tuple[int, int], torch.Tensor] = {}


def _zero_bias(a: torch.Tensor, n: int) -> torch.Tensor:
    if stream_scratch.capturing():
        # Zeros made during a capture are written only when the graph replays: never cached.
        return torch.zeros(n, dtype=torch.bfloat16, device=a.device)
    key = (device_ordinal(a), n)
    zeros = _zero_biases.get(key)
    if zeros is None:
        zeros = _zero_biases.setdefault(key, torch.zeros(n, dtype=torch.bfloat16, device=a.device))
    return zeros


def _residual_out(op: str, a: torch.Tensor, c: torch.Tensor, out: torch.Tensor | None, activation: str,
                  m: int, n: int) -> torch.Tensor:
    """D holding C, ready for a kernel adding into it: `out` (or a new tensor) set to C unless it is C."""
    if activation != "none":
        raise _fail(op, "c", f"(a residual) is added to A·Bᵀ + bias without an activation: no kernel adds an "
                             f"activated tile into D, got activation={activation!r}")
    _check_out(op, a, c, m, n, "c")
    d = out if out is not None else new_bf16_out(a, m, n)
    if d.data_ptr() != c.data_ptr() or d.stride() != c.stride():  # else in place: D is C
        check_disjoint(op, {"out": d}, {"c": c})
        d.copy_(c)
    return d


def fp8_gemm_nt_epilogue(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str = "none", out: torch.Tensor | None = None, *, c: torch.Tensor | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """D[M, N] (bf16) = (C +) act((A · sfa) @ (B · sfb)ᵀ + bias); see the module docstring."""
    check_kernel_name(OP_FP8, kernel)
    m, n, _ = _fp8_meta(a, sfa, b, sfb, bias, activation, out)
    if c is not None:
        d = _residual_out(OP_FP8, a, c, out, activation, m, n)
        FP8.call(a, sfa, b, sfb, bias if bias is not None else _zero_bias(a, n), activation, d, True, kernel or "")
        return d
    if bias is None and activation == "none":
        return fp8_ops.fp8_gemm_nt(a, sfa, b, sfb, out, kernel=kernel)
    d = out if out is not None else new_bf16_out(a, m, n)
    FP8.call(a, sfa, b, sfb, bias, activation, d, False, kernel or "")
    return d


# ---- BF16 ---------------------------------------------------------------------------------------


def _bf16_impl(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str, out: torch.Tensor,
    adds: bool = False, kernel_name: str = "",
) -> None:
    m, n, k = _bf16_meta(a, b, bias, activation, out)
    operands = dict(zip(OPERANDS[OP_BF16], (a, b, out)))
    _launch(OP_BF16, operands, bias, activation, m, n, k, kernel_name, None, adds)


def _bf16_fake(a, b, bias, activation: str, out, adds: bool = False, kernel_name: str = "") -> None:
    _bf16_meta(a, b, bias, activation, out)


BF16 = TorchOp(OP_BF16, _bf16_impl, _bf16_fake, mutates=("out",))


def bf16_gemm_nt_epilogue(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none",
    out: torch.Tensor | None = None, *, c: torch.Tensor | None = None, kernel: str | None = None,
) -> torch.Tensor:
    """D[M, N] (bf16) = (C +) act(A @ Bᵀ + bias); see the module docstring."""
    check_kernel_name(OP_BF16, kernel)
    m, n, _ = _bf16_meta(a, b, bias, activation, out)
    if bias is None and activation == "none":
        return bf16_ops.bf16_gemm_nt(a, b, out, c=c, kernel=kernel)
    if c is None:
        d = out if out is not None else new_bf16_out(a, m, n)
    else:
        d = _residual_out(OP_BF16, a, c, out, activation, m, n)
    BF16.call(a, b, bias, activation, d, c is not None, kernel or "")
    return d



__all__ = ["bf16_gemm_nt_epilogue", "entry", "fp8_gemm_nt_epilogue"]
