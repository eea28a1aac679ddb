"""The expert GEMMs of Qwen3-30B-A3B with cutegen's bf16_gemm_nt, beside torch, on a Hopper GPU.

    python examples/new_shape_family/run.py --build-dir build/qwen3 [--tokens 512] [--experts 16]

A batch of ``--tokens`` tokens is routed (random router, top-8 of 128 experts, as the model does);
for each of the first ``--experts`` experts that receive tokens, the two expert GEMMs run:

    gate+up  D[T_e, 1536] = X_e[T_e, 2048] @ W_gu[1536, 2048]^T
    down     D[T_e, 2048] = H_e[T_e, 768]  @ W_d[2048, 768]^T

each with ``cutegen.runtime.ops.bf16_gemm_nt`` (the heuristic picks among the built kernels, or
``--kernel`` forces one) and with ``torch.matmul``; results are compared in fp32 and both are timed
with CUDA events. Exit status 0 when every result matches, 1 otherwise, 2 on setup errors.

(Dense per-expert GEMMs, one launch per expert. A real MoE layer would use the grouped GEMMs,
see examples/torch_moe_layer.)
"""

from __future__ import annotations

import argparse
import sys

HIDDEN = 2048  # hidden_size
INTERMEDIATE = 768  # moe_intermediate_size
EXPERTS = 128  # num_experts
TOP_K = 8  # num_experts_per_tok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=None, help="build folder (default: $CUTEGEN_BUILD_DIR or ./build)")
    p.add_argument("--tokens", type=int, default=512, help="tokens in the batch (default 512)")
    p.add_argument("--experts", type=int, default=16, help="how many routed experts to run (default 16)")
    p.add_argument("--kernel", default=None, help="force one kernel by name (default: the heuristic)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    try:
        import torch

        from cutegen.runtime import ops
    except ImportError as exc:
        print(f"run.py: {exc}; needs torch and cutegen", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("run.py: no CUDA device visible to torch", file=sys.stderr)
        return 2
    ops.set_build_dir(args.build_dir)

    g = torch.Generator(device="cuda").manual_seed(args.seed)
    dev = "cuda"
    # The router: top-8 of 128 experts per token.
    logits = torch.randn(args.tokens, EXPERTS, device=dev, generator=g)
    chosen = logits.topk(TOP_K, dim=-1).indices
    counts = torch.bincount(chosen.flatten(), minlength=EXPERTS).tolist()
    experts = [e for e in range(EXPERTS) if counts[e] > 0][: args.experts]

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(torch.bfloat16)

    problems = []
    for e in experts:
        t = counts[e]
        problems.append((e, "gate_up", randn(t, HIDDEN), randn(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5)))
        problems.append((e, "down", randn(t, INTERMEDIATE), randn(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5)))

    def cutegen_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.bf16_gemm_nt(a, b, kernel=args.kernel)

    def torch_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b.T

    def time_us(fn, a, b) -> float:
        for _ in range(3):
            fn(a, b)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / args.iters

    print(f"Qwen3-30B-A3B experts: {args.tokens} tokens, top-{TOP_K} of {EXPERTS}; "
          f"running {len(experts)} experts ({sum(counts[e] for e in experts)} routed tokens)")
    header = f"{'expert':>6} {'gemm':<8} {'M':>5} {'N':>5} {'K':>5}  {'max rel err':>11}  {'cutegen us':>10} {'torch us':>9}  kernel"
    print(header)
    bad = 0
    total_c = total_t = 0.0
    for e, which, a, b in problems:
        m, k = a.shape
        n = b.shape[0]
        out = cutegen_mm(a, b)
        ref = a.float() @ b.float().T
        err = float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
        ok = bool(torch.isfinite(out).all()) and err < 2e-2
        bad += not ok
        tc, tt = time_us(cutegen_mm, a, b), time_us(torch_mm, a, b)
        total_c += tc
        total_t += tt
        name = args.kernel or ops.choose_kernel("bf16_gemm_nt", m, n, k, d_dtype="bf16", adds=False, layout="nt")
        print(f"{e:>6} {which:<8} {m:>5} {n:>5} {k:>5}  {err:>11.2e}  {tc:>10.1f} {tt:>9.1f}  "
              f"{name}{'' if ok else '  MISMATCH'}")
    print(f"total: cutegen {total_c:.1f} us, torch {total_t:.1f} us; "
          f"{len(problems) - bad}/{len(problems)} results match")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
