"""PyTorch entry points of the k-grouped FP8 weight-gradient GEMMs for mixture-of-experts layers.

``k_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, group_sizes, c=None, *, expected_k=None,
kernel=None)`` computes, for every group g with k_g = group_sizes[g] tokens,

    D[g] (fp32 [M, N]) = C[g] + Σ_kb (A_g[:, kb] · sfa_g[kb]) · (B_g[:, kb] · sfb_g[kb])ᵀ

with fp32 promotion after every 128-token block: the MoE weight gradient, each expert's gradient
contracting over that expert's tokens. The operands are exactly what `grouped_transposed_quant_fp8`
returns for dy (giving A, M = dy's width) and for x (giving B, N = x's width):

* ``a``: e4m3, flat, 128·M·S elements: for each group in order, A_g [M, 128·⌈k_g/128⌉] row-major
  (the group's tokens padded with zeros to whole 128-token blocks); S ≥ Σ ⌈k_g/128⌉ blocks.
* ``sfa``: fp32 [S, M] row-major, one scale per row and 128-token block; block rows of group g
  start at Σ_{j<g} ⌈k_j/128⌉.
* ``b``, ``sfb``: the same for B with N rows: 128·N·S elements and [S, N].
* ``d``: fp32 [G, M, N], contiguous along N with a row stride that is a multiple of 4 elements;
  accumulated in place (C = D) unless ``c`` is given, in which case D is first set to C.
* ``group_sizes``: int32 [G] on the GPU. Never read by the host: the launch needs no
  synchronisation and can be captured in a CUDA graph. Groups with 0 tokens leave D[g] as it is
  (as C[g] when ``c`` is given).
* ``expected_k`` (optional): the typical tokens per group, a hint for the kernel choice only.

M and N must be multiples of 4 (the scale rows are read by TMA, whose strides are multiples of 16
bytes). What cannot be checked without reading device memory: that Σ ⌈group_sizes/128⌉ ≤ S, that
the sizes are the ones the quantize used, and that the scales are finite. The kernel never reads
past the S blocks: a group whose blocks reach past them contracts over its blocks inside, a group
wholly past them and a negative size count as empty (D[g] as it is, or C[g]); sizes up to 2³¹ - 1
do not overflow. Bad inputs that can be checked raise `InputError` naming the argument before
anything is launched.

``k_grouped_fp8_gemm_tn_contiguous(a, sfa, b, sfb, d, group_sizes, c=None, *, expected_k=None,
kernel=None)`` is the same gradient in DeepGEMM's SM100 form, for Blackwell's block-scaled MMA:
A [Σk, M] and B [Σk, N] tokens first, scales [Σk/128, M | N] (powers of two), the same group
sizes, D and C (its docstring). Its kernels are built for sm_100a only.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import stream_scratch
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_expected_k, check_kernel_name, check_not_overlapping_itself
from .errors import InputError
from .fp8_ops import F32_ROW_ALIGN_ELEMS
from .fp8_ops import SFA_COLUMN_ALIGN as SCALE_ROW_ALIGN  # 16 bytes of fp32: TMA's stride rule
from .kernel_choice import kernel_for
from .launch import launch
from .mx_reference import k_grouped_scale_operand
from .params import SCALE_BLOCK
from .torch_ops import TorchOp, current_stream, device_ordinal

OP = "k_grouped_fp8_gemm_nt_contiguous"
# Two 128-byte TMA descriptors per CTA (A and B), as int64 words.
WORKSPACE_WORDS_PER_CTA = 2 * 128 // 8


def _fail(arg: str, what: str) -> InputError:
    return InputError(f"{OP}: argument '{arg}' {what}")


def _check(a, sfa, b, sfb, d, group_sizes, c) -> tuple[int, int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (G, M, N, S)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise _fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda" or t.dtype != torch.float8_e4m3fn:
            raise _fail(arg, f"must be a torch.float8_e4m3fn CUDA tensor, got {t.dtype} on {t.device}")
        if t.dim() != 1 or not t.is_contiguous():
            raise _fail(
                arg,
                f"must be the flat, contiguous 1-D tensor grouped_transposed_quant_fp8 returns, got "
                f"shape {list(t.shape)} strides {list(t.stride())}",
            )
    if b.device != a.device:
        raise _fail("b", f"must be on {a.device} (the device of 'a'), got {b.device}")
    for arg, t in (("sfa", sfa), ("sfb", sfb)):
        if not isinstance(t, torch.Tensor) or t.device != a.device or t.dtype != torch.float32:
            raise _fail(arg, f"must be a torch.float32 tensor on {a.device}")
        if t.dim() != 2 or not t.is_contiguous():
            raise _fail(arg, f"must be a contiguous [S, rows] tensor, got shape {list(t.shape)} strides {list(t.stride())}")
    s, m = sfa.shape
    s_b, n = sfb.shape
    if s_b != s:
        raise _fail("sfb", f"must have S = sfa.shape[0] = {s} block rows, got {s_b}")
    for arg, rows in (("sfa", m), ("sfb", n)):
        if rows % SCALE_ROW_ALIGN:
            raise _fail(arg, f"must have a multiple of {SCALE_ROW_ALIGN} columns (M or N), got {rows}")
    for arg, t, rows in (("a", a, m), ("b", b, n)):
        if t.numel() != SCALE_BLOCK * rows * s:
            raise _fail(
                arg,
                f"must hold 128 · {rows} · S = {SCALE_BLOCK * rows * s} elements (S = {s} scale block "
                f"rows), got {t.numel()}",
            )
    return check_sizes_and_output(OP, a.device, group_sizes, d, c, m, n), m, n, s


def check_sizes_and_output(op: str, device: Any, group_sizes: Any, d: Any, c: Any | None, m: int, n: int) -> int:
    """The k-grouped GEMMs' ``group_sizes`` (int32 [G]), D (fp32 [G, M, N], contiguous along N,
    16-byte aligned strides, not overlapping itself) and optional C (D's type and shape), all on
    ``device``; returns G."""
    def fail(arg: str, what: str) -> InputError:
        return InputError(f"{op}: argument '{arg}' {what}")

    if not isinstance(group_sizes, torch.Tensor) or group_sizes.device != device or group_sizes.dtype != torch.int32:
        raise fail("group_sizes", f"must be an int32 tensor on {device}")
    if group_sizes.dim() != 1 or not group_sizes.is_contiguous():
        raise fail("group_sizes", f"must be a contiguous 1-D [G] tensor, got shape {list(group_sizes.shape)}")
    g = group_sizes.shape[0]
    if not isinstance(d, torch.Tensor) or d.device != device or d.dtype != torch.float32:
        raise fail("d", f"must be a torch.float32 tensor on {device}")
    if tuple(d.shape) != (g, m, n):
        raise fail("d", f"must have shape [G, M, N] = [{g}, {m}, {n}], got {list(d.shape)}")
    if d.numel() and (
        (n > 1 and d.stride(2) != 1)
        or (m > 1 and d.stride(1) % F32_ROW_ALIGN_ELEMS)
        or (g > 1 and d.stride(0) % F32_ROW_ALIGN_ELEMS)
    ):
        raise fail("d", f"must be contiguous along N with strides that are multiples of 4 elements, got {list(d.stride())}")
    check_not_overlapping_itself(op, "d", d)
    if c is not None and (not isinstance(c, torch.Tensor) or c.device != device or c.dtype != torch.float32
                          or tuple(c.shape) != (g, m, n)):
        raise fail("c", f"must be a torch.float32 [G, M, N] = [{g}, {m}, {n}] tensor on {device}")
    return g


def set_d_to_c(d: torch.Tensor, c: torch.Tensor | None) -> None:
    """D = C before the kernels add into D: a copy, none when C is D itself (the same address and
    strides) or absent."""
    if c is not None and not (c.data_ptr() == d.data_ptr() and c.stride() == d.stride()):
        d.copy_(c)


def tokens_per_group(expected_k: int | None, s_blocks: int, groups: int) -> int:
    """The K the kernel choice scores a k-grouped call at: the groups' tiles stacked along M (the
    persistent scheduler walks them as one sequence) over the tokens of one group, ``expected_k``
    or the blocks' even share, in whole 128-token blocks."""
    k = int(expected_k) if expected_k else max(1, s_blocks * SCALE_BLOCK // max(groups, 1))
    return max(SCALE_BLOCK, -(-k // SCALE_BLOCK) * SCALE_BLOCK)


def workspace_words(sm_count: int) -> int:
    """Int64 words of descriptor workspace a launch on a GPU with ``sm_count`` SMs needs (the grid
    never has more CTAs than SMs)."""
    return WORKSPACE_WORDS_PER_CTA * sm_count


_lock = threading.Lock()
# (device index, stream handle) -> the descriptor workspace of launches on that stream: they never
# overlap (no kernel here is launched with PDL), so they can share one; a launch being captured in
# a CUDA graph gets its own (`stream_scratch`).
_workspaces: dict[tuple[int, int], torch.Tensor] = {}
# Calls are remembered with their stream's workspace.
_calls = CallCache(OP, stream_scratch.capturing)
_CALL_OPERANDS = ("a", "sfa", "b", "sfb", "d", "group_sizes")


def descriptor_workspace(device: torch.device, stream: int, words: int) -> torch.Tensor:
    """The int64 descriptor workspace of launches on ``stream`` of ``device`` (`_workspaces`)."""
    return stream_scratch.per_stream(
        _workspaces, _lock, device, stream, lambda _: torch.empty(words, dtype=torch.int64, device=device),
        lambda have: have.numel() >= words,
    )


def _kernel_operands(a, sfa, b, sfb, d, group_sizes) -> tuple:
    """The operands as the kernel takes them, in `_CALL_OPERANDS` order: the flat operands as
    [rows, 128·S] (the host descriptors are templates the kernel rewrites per group) and the scales
    as MN-major (rows, S) views; each starts at its tensor's address, so a remembered call
    relaunches on the tensors themselves."""
    s, m = sfa.shape
    n = sfb.shape[1]
    return a.view(m, SCALE_BLOCK * s), sfa.t(), b.view(n, SCALE_BLOCK * s), sfb.t(), d, group_sizes


def _run(a, sfa, b, sfb, d, group_sizes, c, expected_k: int | None, kernel: str) -> None:
    tensors = (a, sfa, b, sfb, d, group_sizes)
    call, key = _calls.find(tensors if c is None else (*tensors, c), c is None, expected_k, kernel)
    if call is None:
        g, m, n, s = _check(a, sfa, b, sfb, d, group_sizes, c)
        check_disjoint(OP, {"d": d}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "group_sizes": group_sizes})
    set_d_to_c(d, c)
    if call is not None:
        if call.relaunch(tensors, current_stream(a)):
            return
        g, m, n, s = _check(a, sfa, b, sfb, d, group_sizes, c)
    if g == 0 or m == 0 or n == 0 or s == 0:
        return
    for arg, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("d", d)):
        check_aligned(OP, arg, t)
    device = device_ordinal(a)
    with torch.cuda.device(device):
        loaded = kernel_for(OP, m * g, n, tokens_per_group(expected_k, s, g), device, kernel)
        stream = current_stream(a)
        workspace = descriptor_workspace(a.device, stream, workspace_words(loaded.device.sm_count))
        operands = dict(zip(_CALL_OPERANDS, _kernel_operands(a, sfa, b, sfb, d, group_sizes)), workspace=workspace)
        prepared = launch(loaded, operands, stream=stream)
    _calls.remember(
        key, Launched(loaded, prepared, _CALL_OPERANDS, fixed={"workspace": workspace}, outputs={"d": "d"}), tensors
    )


def _impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor, group_sizes: torch.Tensor,
    c: torch.Tensor | None = None, expected_k: int = 0, kernel_name: str = "",
) -> None:
    _run(a, sfa, b, sfb, d, group_sizes, c, expected_k or None, kernel_name)


def _fake(a, sfa, b, sfb, d, group_sizes, c=None, expected_k: int = 0, kernel_name: str = "") -> None:
    _check(a, sfa, b, sfb, d, group_sizes, c)


K_GROUPED = TorchOp(OP, _impl, _fake, mutates=("d",))


def k_grouped_fp8_gemm_nt_contiguous(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    d: torch.Tensor,
    group_sizes: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    expected_k: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """MoE weight gradient over groups that split K; D is updated in place and returned (module
    docstring)."""
    check_kernel_name(OP, kernel)
    check_expected_k(OP, expected_k)
    K_GROUPED.call(a, sfa, b, sfb, d, group_sizes, c, expected_k or 0, kernel or "")
    return d


def k_grouped_reference(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, group_sizes: Any
) -> list[torch.Tensor]:
    """fp32 Σ over each group's blocks of (A_g · sfa) (B_g · sfb)ᵀ on the dequantised operands
    (the executable statement of the layout; ``group_sizes`` on the host or the GPU)."""
    sizes = [int(v) for v in (group_sizes.tolist() if isinstance(group_sizes, torch.Tensor) else group_sizes)]
    m, n = sfa.shape[1], sfb.shape[1]
    out, first = [], 0
    for k in sizes:
        blocks = -(-max(k, 0) // SCALE_BLOCK)
        if blocks == 0:
            out.append(torch.zeros(m, n, dtype=torch.float32, device=a.device))
            continue
        width = blocks * SCALE_BLOCK
        ag = a[SCALE_BLOCK * m * first : SCALE_BLOCK * m * (first + blocks)].view(m, blocks, SCALE_BLOCK).float()
        bg = b[SCALE_BLOCK * n * first : SCALE_BLOCK * n * (first + blocks)].view(n, blocks, SCALE_BLOCK).float()
        ag = (ag * sfa[first : first + blocks].t().unsqueeze(2)).reshape(m, width)
        bg = (bg * sfb[first : first + blocks].t().unsqueeze(2)).reshape(n, width)
        out.append(ag @ bg.t())
        first += blocks
    return out


# ---- tokens first, scales applied by the MMA (DeepGEMM's SM100 form) --------------------------
OP_TN = "k_grouped_fp8_gemm_tn_contiguous"
# TMA reads A [Σk, M] and B [Σk, N] along M (N): rows of 16 bytes, as the kernel's contract says.
TN_ROW_ALIGN = 16
_TN_OPERANDS = ("a", "sfa", "b", "sfb", "d", "group_sizes")


def _check_tn(a, sfa, b, sfb, d, group_sizes, c) -> tuple[int, int, int, int]:
    """Everything checkable without data (also under fake tensors); returns (G, M, N, S)."""
    def fail(arg: str, what: str) -> InputError:
        return InputError(f"{OP_TN}: argument '{arg}' {what}")

    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise fail(arg, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda" or t.dtype != torch.float8_e4m3fn:
            raise fail(arg, f"must be a torch.float8_e4m3fn CUDA tensor, got {t.dtype} on {t.device}")
        if t.dim() != 2 or not t.is_contiguous():
            raise fail(arg, f"must be a contiguous [Σk, rows] tensor (tokens first), got shape {list(t.shape)} "
                            f"strides {list(t.stride())}")
    if b.device != a.device:
        raise fail("b", f"must be on {a.device} (the device of 'a'), got {b.device}")
    (tokens, m), (tokens_b, n) = a.shape, b.shape
    if tokens_b != tokens:
        raise fail("b", f"must have Σk = a.shape[0] = {tokens} rows, got {tokens_b}")
    if tokens % SCALE_BLOCK:
        raise fail("a", f"must have a multiple of {SCALE_BLOCK} rows (each group's tokens start at a "
                        f"{SCALE_BLOCK}-token block), got {tokens}")
    for arg, rows in (("a", m), ("b", n)):
        if rows % TN_ROW_ALIGN:
            raise fail(arg, f"must have a multiple of {TN_ROW_ALIGN} columns (M or N: rows of whole 16 bytes "
                            f"for the TMA), got {rows}")
    s = tokens // SCALE_BLOCK
    for arg, t, rows in (("sfa", sfa, m), ("sfb", sfb, n)):
        if not isinstance(t, torch.Tensor) or t.device != a.device or t.dtype != torch.float32:
            raise fail(arg, f"must be a torch.float32 tensor on {a.device}")
        if tuple(t.shape) != (s, rows) or not t.is_contiguous():
            raise fail(arg, f"must be a contiguous [Σk/128, {'M' if arg == 'sfa' else 'N'}] = [{s}, {rows}] "
                            f"tensor, got shape {list(t.shape)} strides {list(t.stride())}")
    return check_sizes_and_output(OP_TN, a.device, group_sizes, d, c, m, n), m, n, s


def _tn_impl(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor, group_sizes: torch.Tensor,
    c: torch.Tensor | None = None, expected_k: int = 0, kernel_name: str = "",
) -> None:
    g, m, n, s = _check_tn(a, sfa, b, sfb, d, group_sizes, c)
    check_disjoint(OP_TN, {"d": d}, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "group_sizes": group_sizes})
    launches = g > 0 and m > 0 and n > 0 and s > 0
    device = device_ordinal(a)
    if launches:
        for arg, t in (("a", a), ("b", b), ("d", d)):
            check_aligned(OP_TN, arg, t)
        # Chosen before D is touched, so that a GPU without these kernels refuses with D intact.
        with torch.cuda.device(device):
            loaded = kernel_for(OP_TN, m * g, n, tokens_per_group(expected_k, s, g), device, kernel_name)
    set_d_to_c(d, c)
    if not launches:
        return
    with torch.cuda.device(device):
        # The kernel reads A and B as the MN-major [rows, Σk] views and the scales in the MMA's
        # blocked layout, made per call (nothing is remembered).
        operands = dict(zip(_TN_OPERANDS, (a.t(), k_grouped_scale_operand(sfa), b.t(), k_grouped_scale_operand(sfb),
                                           d, group_sizes)))
        launch(loaded, operands, stream=current_stream(a))


def _tn_fake(a, sfa, b, sfb, d, group_sizes, c=None, expected_k: int = 0, kernel_name: str = "") -> None:
    _check_tn(a, sfa, b, sfb, d, group_sizes, c)


K_GROUPED_TN = TorchOp(OP_TN, _tn_impl, _tn_fake, mutates=("d",))


def k_grouped_fp8_gemm_tn_contiguous(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    d: torch.Tensor,
    group_sizes: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    expected_k: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """MoE weight gradient on Blackwell (sm_100a), tokens first: for every group g with k_g =
    group_sizes[g] tokens, D[g] (fp32 [M, N]) = C[g] + (A_g · sfa_g)ᵀ (B_g · sfb_g), the scales
    applied by the block-scaled tensor-core MMA (DeepGEMM's ``k_grouped_fp8_gemm_tn_contiguous``).

    * ``a``: e4m3 [Σk, M] row-major: group g's tokens are its rows from 128 · Σ_{j<g} ⌈k_j/128⌉
      (each group's tokens padded with zeros to whole 128-token blocks; with every k_g a multiple
      of 128, as DeepGEMM requires, the groups back to back). M a multiple of 16.
    * ``sfa``: fp32 [Σk/128, M] row-major, one scale per 128-token block and column of A; powers
      of two (UE8M0, e.g. `per_token_quant_fp8(..., scale_format="ue8m0")` scales transposed):
      another value counts as the power of two at or below it (`mx_reference.k_grouped_scale_operand`).
    * ``b``, ``sfb``: the same with N.
    * ``d``: fp32 [G, M, N], contiguous along N with strides that are multiples of 4 elements;
      accumulated in place (C = D) unless ``c`` is given, in which case D is first set to C.
    * ``group_sizes``: int32 [G] on the GPU, never read by the host. A group with no tokens leaves
      D[g] as it is (or C[g]); the kernel never reads past A's Σk/128 blocks whatever the sizes.

    Only sm_100a kernels exist: on another GPU the call fails before any launch, naming the
    architecture the kernels are built for. Compiled and checked only: no Blackwell GPU has run it.
    """
    check_kernel_name(OP_TN, kernel)
    check_expected_k(OP_TN, expected_k)
    K_GROUPED_TN.call(a, sfa, b, sfb, d, group_sizes, c, expected_k or 0, kernel or "")
    return d


def k_grouped_tn_reference(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, group_sizes: Any
) -> list[torch.Tensor]:
    """float64 Σ over each group's blocks of (A_g · sfa_g)ᵀ (B_g · sfb_g) on the dequantised
    operands of the tn form (the executable statement of its layout; ``group_sizes`` on the host
    or the GPU)."""
    sizes = [int(v) for v in (group_sizes.tolist() if isinstance(group_sizes, torch.Tensor) else group_sizes)]
    s_blocks = a.shape[0] // SCALE_BLOCK
    out, first = [], 0
    for k in sizes:
        blocks = max(0, min(-(-max(k, 0) // SCALE_BLOCK), s_blocks - first))
        rows = slice(first * SCALE_BLOCK, (first + blocks) * SCALE_BLOCK)
        ag = a[rows].double() * sfa[first : first + blocks].double().repeat_interleave(SCALE_BLOCK, dim=0)
        bg = b[rows].double() * sfb[first : first + blocks].double().repeat_interleave(SCALE_BLOCK, dim=0)
        out.append(ag.t() @ bg)
        first += blocks
    return out


__all__ = [
    "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_reference",
    "k_grouped_tn_reference", "workspace_words",
]
