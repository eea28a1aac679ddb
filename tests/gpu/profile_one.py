"""Run one forced kernel a few times on one problem, for a profiler (ncu) to attach to.

    ncu --section WarpStateStats -k regex:kernel -c 1 python3 tests/gpu/profile_one.py fp8_gemm_nt NAME M N K
"""

from __future__ import annotations

import sys

import torch

from cutegen.runtime import fp8_ops, quant_ops


def main() -> int:
    op, name, m, n, k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    if op != "fp8_gemm_nt":
        raise SystemExit(f"profile_one: op {op!r} is not supported (fp8_gemm_nt only)")
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = quant_ops.per_token_quant_fp8(a, scale_layout="mn-major-tma-aligned")
    qb, sb = quant_ops.per_block_quant_fp8(b)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        fp8_ops.fp8_gemm_nt(qa, sa, qb, sb, out=out, kernel=name)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
