"""One FP8 mixture-of-experts layer's backward (dgrad and wgrad) on cutegen kernels, checked against autograd.

    python examples/torch_moe_backward/moe_backward.py [--build-dir build] [--tokens 4096]
        [--experts 8] [--hidden 2048] [--intermediate 768] [--top-k 2]

The layer per expert e, over the rows the router sent it (sorted by expert, T_e rows each):
h = x·W13ᵀ [T_e, 2I], a = SiLU(h_gate)·h_up, y = a·W2ᵀ [T_e, H]. Given bf16 x, the saved bf16
pre-activation h and the output gradient dy, the backward runs in FP8:

* dgrad (M-grouped, contiguous layout): da = dy·W2 and dx = dh·W13 as
  `m_grouped_fp8_gemm_nt_contiguous` (rows quantised per token, the transposed weights W2ᵀ and
  W13ᵀ per 128x128 block; each expert's rows padded to `contiguous_alignment()`); dh from da
  through SiLU·up in fp32;
* wgrad (k-grouped, the experts split the tokens): dW2[e] = dy_eᵀ·a_e and dW13[e] = dh_eᵀ·x_e as
  `k_grouped_fp8_gemm_nt_contiguous`, its operands straight from `grouped_transposed_quant_fp8`
  with the group sizes on the GPU.

dx, dW13 and dW2 are compared with autograd run in fp32 on the same bf16 inputs, by DeepGEMM's
calc_diff; the script exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

# dW2 is one FP8 GEMM of bf16 data (DeepGEMM's bound: 1e-3). dx and dW13 chain two FP8 GEMMs
# (da, then dh from it), like the forward layer of examples/torch_moe_layer, and get its 5e-3.
ONE_GEMM_TOLERANCE = 1e-3
CHAINED_TOLERANCE = 5e-3


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def quantize_weights(w: torch.Tensor):
    """Per-expert 128x128 block quantisation of [E, N, K] weights → (q [E, N, K], scales [E, N/128, K/128])."""
    from cutegen.runtime import quant_ops

    q, s = zip(*(quant_ops.per_block_quant_fp8(w[e].contiguous()) for e in range(w.shape[0])))
    return torch.stack(q), torch.stack(s).contiguous()


class ContiguousRows:
    """Where each expert's rows go in the padded contiguous layout (host-side planning)."""

    def __init__(self, sizes: list[int], device):
        from cutegen.runtime import grouped_ops

        align = grouped_ops.contiguous_alignment()
        spans = [-(-n // align) * align for n in sizes]
        self.total = sum(spans)
        rows, m_indices, start = [], [], 0
        for e, (n, span) in enumerate(zip(sizes, spans)):
            rows.append(torch.arange(start, start + n, device=device))
            m_indices += [e] * n + [-1] * (span - n)
            start += span
        self.rows = torch.cat(rows)
        self.m_indices = torch.tensor(m_indices, dtype=torch.int32, device=device)


def grouped_dgrad(g_rows: torch.Tensor, layout: ContiguousRows, qw, sw) -> torch.Tensor:
    """Per expert: g_e [T_e, K] · Wᵀ_e where (qw, sw) quantise Wᵀ [E, N, K]; returns [T, N] bf16."""
    from cutegen.runtime import grouped_ops, quant_ops

    padded = torch.zeros(layout.total, g_rows.shape[1], dtype=g_rows.dtype, device=g_rows.device)
    padded[layout.rows] = g_rows
    qa, sa = quant_ops.per_token_quant_fp8(padded, scale_layout="mn-major-tma-aligned")
    out = grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sa, qw, sw, layout.m_indices)
    return out[layout.rows]


def grouped_wgrad(left: torch.Tensor, right: torch.Tensor, sizes_gpu: torch.Tensor) -> torch.Tensor:
    """Per expert: left_eᵀ · right_e (fp32 [E, left width, right width]) from [T, ·] bf16 rows."""
    from cutegen.runtime import k_grouped_ops, quant_ops

    qa, sa = quant_ops.grouped_transposed_quant_fp8(left, sizes_gpu)
    qb, sb = quant_ops.grouped_transposed_quant_fp8(right, sizes_gpu)
    d = torch.zeros(sizes_gpu.numel(), left.shape[1], right.shape[1], device=left.device)
    return k_grouped_ops.k_grouped_fp8_gemm_nt_contiguous(qa, sa, qb, sb, d, sizes_gpu)


def fp8_backward(x, h, dy, sizes, w13, w2):
    """(dx, dW13, dW2) of the layer on cutegen kernels (module docstring)."""
    inter = h.shape[1] // 2
    layout = ContiguousRows(sizes, x.device)
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device=x.device)
    q2t, s2t = quantize_weights(w2.transpose(1, 2))  # W2ᵀ [E, I, H]: da = dy · W2
    q13t, s13t = quantize_weights(w13.transpose(1, 2))  # W13ᵀ [E, H, 2I]: dx = dh · W13

    gate, up = h[:, :inter].float(), h[:, inter:].float()
    sig = torch.sigmoid(gate)
    act = (gate * sig * up).to(torch.bfloat16)
    da = grouped_dgrad(dy, layout, q2t, s2t).float()
    d_gate = da * up * sig * (1 + gate * (1 - sig))
    d_up = da * gate * sig
    dh = torch.cat([d_gate, d_up], dim=1).to(torch.bfloat16)
    dx = grouped_dgrad(dh, layout, q13t, s13t)
    dw2 = grouped_wgrad(dy, act, sizes_gpu)
    dw13 = grouped_wgrad(dh, x, sizes_gpu)
    return dx, dw13, dw2


def autograd_reference(x, dy, sizes, w13, w2):
    """fp32 autograd of the same layer on the same bf16 inputs; also returns the saved h (bf16)."""
    xr = x.float().requires_grad_()
    w13r = w13.float().requires_grad_()
    w2r = w2.float().requires_grad_()
    inter = w13.shape[1] // 2
    outs, hs, start = [], [], 0
    for e, n in enumerate(sizes):
        h = xr[start : start + n] @ w13r[e].T
        hs.append(h.detach())
        outs.append((F.silu(h[:, :inter]) * h[:, inter:]) @ w2r[e].T)
        start += n
    torch.cat(outs).backward(dy.float())
    return torch.cat(hs).to(torch.bfloat16), xr.grad, w13r.grad, w2r.grad


def route(tokens: int, experts: int, top_k: int, device) -> list[int]:
    """Rows per expert from a random top-k router (one expert left empty, as happens)."""
    logits = torch.randn(tokens, experts, device=device)
    logits[:, experts - 1] = -1e9
    ids = torch.topk(logits, top_k, dim=-1).indices.reshape(-1)
    return torch.bincount(ids, minlength=experts).tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default=None)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--top-k", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU")
        return 2
    from cutegen.runtime import ops

    ops.set_build_dir(args.build_dir)
    torch.manual_seed(0)
    dev = "cuda"
    e, hid, inter = args.experts, args.hidden, args.intermediate
    w13 = (torch.randn(e, 2 * inter, hid, device=dev) / hid**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, hid, inter, device=dev) / inter**0.5).to(torch.bfloat16)
    sizes = route(args.tokens, e, args.top_k, dev)
    rows = sum(sizes)
    x = torch.randn(rows, hid, device=dev).to(torch.bfloat16)  # the routed rows, sorted by expert
    dy = torch.randn(rows, hid, device=dev).to(torch.bfloat16)

    h, dx_ref, dw13_ref, dw2_ref = autograd_reference(x, dy, sizes, w13, w2)
    dx, dw13, dw2 = fp8_backward(x, h, dy, sizes, w13, w2)
    print(f"{args.tokens} tokens x top-{args.top_k} of {e} experts, rows per expert {sizes}")
    failures = 0
    checks = (
        ("dx   (dgrad, two chained FP8 GEMMs)", dx, dx_ref, CHAINED_TOLERANCE),
        ("dW13 (k-grouped wgrad of dh)", dw13, dw13_ref, CHAINED_TOLERANCE),
        ("dW2  (k-grouped wgrad of dy)", dw2, dw2_ref, ONE_GEMM_TOLERANCE),
    )
    for label, got, ref, bound in checks:
        diff = calc_diff(got.float(), ref)
        ok = diff < bound
        failures += not ok
        print(f"{label}: calc_diff {diff:.2e} (bound {bound:.0e}) {'ok' if ok else 'FAIL'}")
    empty = [g for g, n in enumerate(sizes) if n == 0]
    if empty and not all(bool((dw13[g] == 0).all()) and bool((dw2[g] == 0).all()) for g in empty):
        failures += 1
        print(f"experts {empty} got no rows but have non-zero weight gradients: FAIL")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
