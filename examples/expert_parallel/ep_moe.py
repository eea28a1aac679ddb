"""Expert parallelism for an FP8 MoE layer: tokens sent to the ranks that hold their experts and back, through torch.distributed.

    python examples/expert_parallel/ep_moe.py [--ranks 2] [--tokens 48] [--experts 8] [--top-k 2]
        [--hidden 256] [--intermediate 128] [--seed 0]

runs the layer on ``--ranks`` CPU processes joined by the gloo backend and checks every rank's
output against the same layer computed in one process (`reference_forward`); it exits 1 when a
check fails. The experts there are the float64 reference (`ReferenceExperts`); the bookkeeping
(`plan_dispatch`, `dispatch`, `combine`) is what a GPU run would use with NCCL.

The layer, per rank (T tokens here; E experts, E / W of them on each of the W ranks, expert e on
rank e // (E / W)):

* **route**: the router's top-k experts of each token, weighted by the softmax over those k logits;
* **quantize** each token once, 1x128 FP8 with fp32 scales: what travels is the FP8 bytes and
  their scales, half the bytes of bf16, and each of a token's k copies is the same bytes;
* **dispatch**: the (token, k) pairs sorted by expert (so by destination rank, then by the rank's
  local expert); the pair counts per rank are exchanged first (``all_to_all_single`` on a counts
  tensor, on the GPU under NCCL), then the FP8 rows, scales and local expert ids;
* **experts**: each rank runs its experts on the rows it received, in the order they came (by
  source rank, then local expert): an `ExpertFn`;
* **combine**: the outputs travel back with the counts swapped, land in their (token, k) slots, and
  a token's k outputs are summed with the router's weights in slot order, so the result does not
  depend on which rank ran which expert.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cutegen.runtime.quant_reference import dequant_per_token, per_token_quant_fp8_ref

# What an ExpertFn takes: the FP8 rows it received, their fp32 scales and each row's local expert;
# it returns the rows' outputs [R, hidden].
ExpertFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Shards:
    """E experts over W ranks, E / W consecutive ones on each."""

    experts: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.experts < 1 or self.experts % self.world:
            raise ValueError(f"experts ({self.experts}) must be a positive multiple of the ranks ({self.world})")

    @property
    def per_rank(self) -> int:
        return self.experts // self.world

    def owner(self, expert: torch.Tensor) -> torch.Tensor:
        return torch.div(expert, self.per_rank, rounding_mode="floor")

    def local(self, expert: torch.Tensor) -> torch.Tensor:
        return expert % self.per_rank


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top-k experts [T, k] (int64) and their weights [T, k] (fp32, the softmax over
    the k logits)."""
    values, experts = torch.topk(logits.float(), top_k, dim=-1)
    return experts, torch.softmax(values, dim=-1)


@dataclasses.dataclass(frozen=True)
class DispatchPlan:
    """Where a rank's (token, k) pairs go: ``order`` lists the pairs (t * k + j) sorted by expert;
    ``send[r]`` of them go to rank r, and ``recv[r]`` rows come from rank r."""

    order: torch.Tensor
    top_k: int
    send: list[int]
    recv: list[int]


def _exchange(t: torch.Tensor, out_splits: list[int], in_splits: list[int],
              group: dist.ProcessGroup | None) -> torch.Tensor:
    """``all_to_all_single`` of rows of ``t`` (a copy where one rank holds every expert); FP8
    travels as bytes."""
    if len(out_splits) == 1:
        return t.clone()
    as_bytes = t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    send = t.contiguous().view(torch.uint8) if as_bytes else t.contiguous()
    out = send.new_empty((sum(out_splits), *send.shape[1:]))
    dist.all_to_all_single(out, send, out_splits, in_splits, group=group)
    return out.view(t.dtype) if as_bytes else out


def plan_dispatch(experts: torch.Tensor, shards: Shards, group: dist.ProcessGroup | None = None) -> DispatchPlan:
    """The dispatch of one rank's top-k ``experts`` [T, k]: pairs sorted by expert, and the pair
    counts per rank exchanged with every rank (one ``all_to_all_single`` of W counts)."""
    if shards.world > 1:
        ranks = dist.get_world_size(group) if dist.is_initialized() else 1
        if ranks != shards.world:
            raise ValueError(f"the shards are for {shards.world} ranks, the process group has {ranks}")
    flat = experts.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    send = torch.bincount(shards.owner(flat), minlength=shards.world)
    recv = _exchange(send, [1] * shards.world, [1] * shards.world, group)
    return DispatchPlan(order, experts.shape[1], send.tolist(), recv.tolist())


def dispatch(q: torch.Tensor, sf: torch.Tensor, experts: torch.Tensor, plan: DispatchPlan, shards: Shards,
             group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FP8 rows, their scales and local expert ids this rank receives, by source rank and then
    local expert; ``q`` [T, hidden] and ``sf`` [T, hidden / 128] are this rank's tokens."""
    tokens = torch.div(plan.order, plan.top_k, rounding_mode="floor")
    local = shards.local(experts.reshape(-1)[plan.order]).to(torch.int32)
    return tuple(_exchange(t, plan.recv, plan.send, group) for t in (q[tokens], sf[tokens], local))


def combine(y: torch.Tensor, plan: DispatchPlan, weights: torch.Tensor,
            group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's tokens' outputs [T, hidden]: the rows its experts computed (``y``, in the order
    `dispatch` delivered them) sent back, placed in their (token, k) slots, and each token's k
    slots summed in slot order with the router's ``weights`` [T, k]."""
    back = _exchange(y, plan.send, plan.recv, group)
    hidden = y.shape[1]
    slots = back.new_empty((plan.order.numel(), hidden))
    slots[plan.order] = back
    t, k = weights.shape
    return (slots.view(t, k, hidden) * weights.to(slots.dtype)[..., None]).sum(dim=1)


class ReferenceExperts:
    """Experts computed in float64 from fp32 weights: gate/up [E_local, 2I, hidden] (gate rows
    first), down [E_local, hidden, I]; each row dequantised from its FP8 bytes and scales."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.w13, self.w2 = w13.double(), w2.double()

    def __call__(self, q: torch.Tensor, sf: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        x = dequant_per_token(q, sf).double()
        y = x.new_zeros((x.shape[0], self.w2.shape[1]))
        for e in range(self.w13.shape[0]):
            rows = (local == e).nonzero().squeeze(1)
            if rows.numel():
                gate, up = (x[rows] @ self.w13[e].t()).chunk(2, dim=1)
                y[rows] = (F.silu(gate) * up) @ self.w2[e].t()
        return y


def ep_forward(x: torch.Tensor, logits: torch.Tensor, top_k: int, shards: Shards, experts_fn: ExpertFn,
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The layer for this rank's tokens ``x`` [T, hidden] with router ``logits`` [T, E]."""
    experts, weights = route(logits, top_k)
    q, sf = per_token_quant_fp8_ref(x)
    plan = plan_dispatch(experts, shards, group)
    rq, rsf, local = dispatch(q, sf, experts, plan, shards, group)
    return combine(experts_fn(rq, rsf, local), plan, weights, group)


def reference_forward(x: torch.Tensor, logits: torch.Tensor, top_k: int, w13: torch.Tensor,
                      w2: torch.Tensor) -> torch.Tensor:
    """The same layer in one process, every expert local (the anchor of a parallel run)."""
    return ep_forward(x, logits, top_k, Shards(w13.shape[0], 1), ReferenceExperts(w13, w2))


@dataclasses.dataclass(frozen=True)
class Problem:
    """A layer with its inputs, the same on every rank (drawn from ``seed``): ``tokens[r]`` are rank
    r's, and a rank may have none."""

    tokens: Sequence[int]
    experts: int = 8
    top_k: int = 2
    hidden: int = 256
    intermediate: int = 128
    seed: int = 0

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every rank's tokens [ΣT, hidden], router logits [ΣT, E], gate/up [E, 2I, hidden] and down
        [E, hidden, I] weights."""
        g = torch.Generator().manual_seed(self.seed)
        total = sum(self.tokens)
        x = torch.randn(total, self.hidden, generator=g)
        logits = torch.randn(total, self.experts, generator=g)
        w13 = torch.randn(self.experts, 2 * self.intermediate, self.hidden, generator=g) / self.hidden ** 0.5
        w2 = torch.randn(self.experts, self.hidden, self.intermediate, generator=g) / self.intermediate ** 0.5
        return x, logits, w13, w2


def rank_check(problem: Problem, rank: int, group: dist.ProcessGroup | None = None) -> float:
    """Run rank ``rank``'s share of ``problem`` and return its largest relative difference from
    the single-process reference (the reference for its rows, computed on every rank)."""
    x, logits, w13, w2 = problem.inputs()
    shards = Shards(problem.experts, len(problem.tokens))
    start = sum(problem.tokens[:rank])
    mine = slice(start, start + problem.tokens[rank])
    lo, hi = rank * shards.per_rank, (rank + 1) * shards.per_rank
    out = ep_forward(x[mine], logits[mine], problem.top_k, shards, ReferenceExperts(w13[lo:hi], w2[lo:hi]), group)
    want = reference_forward(x, logits, problem.top_k, w13, w2)[mine]
    if out.shape != want.shape:
        raise AssertionError(f"rank {rank}: output shape {tuple(out.shape)}, expected {tuple(want.shape)}")
    if not want.numel():
        return 0.0
    return float(((out - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())


def _worker(rank: int, problem: Problem, rendezvous: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=len(problem.tokens))
    try:
        diff = rank_check(problem, rank)
        with open(f"{results}.{rank}", "w") as f:
            f.write(repr(diff))
    finally:
        dist.destroy_process_group()


def run_on_cpu_ranks(problem: Problem) -> list[float]:
    """Each rank's largest relative difference from the reference, the ranks being CPU processes
    joined by gloo (one per entry of ``problem.tokens``)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        rendezvous, results = os.path.join(tmp, "rendezvous"), os.path.join(tmp, "result")
        mp.spawn(_worker, args=(problem, rendezvous, results), nprocs=len(problem.tokens), join=True)
        return [float(open(f"{results}.{rank}").read()) for rank in range(len(problem.tokens))]


# The ranks' outputs and the reference differ only in the order float64 matmuls add (each expert
# sees other row batches): far below any FP8 effect.
TOLERANCE = 1e-12


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per rank (the last rank gets a third fewer)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokens = [args.tokens] * (args.ranks - 1) + [args.tokens - args.tokens // 3]
    problem = Problem(tokens, args.experts, args.top_k, args.hidden, args.intermediate, args.seed)
    diffs = run_on_cpu_ranks(problem)
    for rank, diff in enumerate(diffs):
        print(f"rank {rank}: {tokens[rank]} tokens, max relative difference from one process {diff:.1e}")
    ok = all(d <= TOLERANCE for d in diffs)
    print("OK" if ok else f"FAILED: above {TOLERANCE:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
