"""Expert parallelism for an FP8 MoE layer: tokens sent to the ranks that hold their experts and back, through torch.distributed.

    python examples/expert_parallel/ep_moe.py [--ranks 2] [--tokens 48] [--experts 8] [--top-k 2]
        [--hidden 256] [--intermediate 128] [--seed 0] [--decode {nccl,deepep}]

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
  a token's k outputs are summed with the router's weights (`weighted_sum`), so the result does
  not depend on which rank ran which expert.

The decode path (`ep_decode_forward`) exchanges fixed-size blocks into the masked layout, so that
nothing leaves the GPU; `deepep_decode_forward` is the same step through DeepEP's low-latency calls
(`LowLatencyStandIn` where `deep_ep` is not installed). `ep_gpu.py` runs both with NCCL and
cutegen's kernels.
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


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as bytes when it is FP8, else ``t``: FP8 rows are gathered, scattered and
    exchanged as bytes, since indexing, index_put and the collectives have no FP8 kernels
    everywhere."""
    return t.view(torch.uint8) if t.dtype in FP8_DTYPES else t


def from_bytes(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `as_bytes` for a tensor that was ``dtype``."""
    return t.view(dtype) if dtype in FP8_DTYPES else t


def _exchange(t: torch.Tensor, out_splits: list[int], in_splits: list[int],
              group: dist.ProcessGroup | None) -> torch.Tensor:
    """``all_to_all_single`` of rows of ``t`` (``t`` itself where one rank holds every expert);
    FP8 travels as bytes."""
    if len(out_splits) == 1:
        return t
    send = as_bytes(t.contiguous())
    out = send.new_empty((sum(out_splits), *send.shape[1:]))
    dist.all_to_all_single(out, send, out_splits, in_splits, group=group)
    return from_bytes(out, t.dtype)


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
    recv = _exchange_equal(send, shards.world, group)
    return DispatchPlan(order, experts.shape[1], send.tolist(), recv.tolist())


def dispatch(q: torch.Tensor, sf: torch.Tensor, experts: torch.Tensor, plan: DispatchPlan, shards: Shards,
             group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FP8 rows, their scales and local expert ids this rank receives, by source rank and then
    local expert; ``q`` [T, hidden] and ``sf`` [T, hidden / 128] are this rank's tokens."""
    tokens = torch.div(plan.order, plan.top_k, rounding_mode="floor")
    local = shards.local(experts.reshape(-1)[plan.order]).to(torch.int32)
    rows = from_bytes(as_bytes(q)[tokens], q.dtype)
    return tuple(_exchange(t, plan.recv, plan.send, group) for t in (rows, sf[tokens], local))


def combine(y: torch.Tensor, plan: DispatchPlan, weights: torch.Tensor,
            group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's tokens' outputs [T, hidden] in y's type: the rows its experts computed (``y``,
    in the order `dispatch` delivered them) sent back, placed in their (token, k) slots, and each
    token's k slots summed with the router's ``weights`` [T, k] (`weighted_sum`)."""
    back = _exchange(y, plan.send, plan.recv, group)
    hidden = y.shape[1]
    slots = back.new_empty((plan.order.numel(), hidden))
    slots[plan.order] = back
    return weighted_sum(slots, weights)


def weighted_sum(slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's k output rows (``slots`` [T * k, hidden], in (token, k) order) summed with the
    router's ``weights`` [T, k], in the outputs' type (a batched GEMM: bf16 accumulates in fp32)."""
    t, k = weights.shape
    return torch.bmm(weights.to(slots.dtype).unsqueeze(1), slots.view(t, k, slots.shape[-1])).squeeze(1)


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


# What a Quantizer takes: tokens [T, hidden]; it returns their 1x128 FP8 values and fp32 scales
# [T, hidden / 128], row-major (`per_token_quant_fp8_ref`, or cutegen's kernel on a GPU).
Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def ep_forward(x: torch.Tensor, logits: torch.Tensor, top_k: int, shards: Shards, experts_fn: ExpertFn,
               group: dist.ProcessGroup | None = None, quantize: Quantizer = per_token_quant_fp8_ref) -> torch.Tensor:
    """The layer for this rank's tokens ``x`` [T, hidden] with router ``logits`` [T, E]."""
    experts, weights = route(logits, top_k)
    q, sf = quantize(x)
    plan = plan_dispatch(experts, shards, group)
    rq, rsf, local = dispatch(q, sf, experts, plan, shards, group)
    return combine(experts_fn(rq, rsf, local), plan, weights, group)


# ---- decode: fixed capacity, no host synchronisation (CUDA-graph capturable) ---------------------
#
# Each rank sends every rank one block per local expert of `capacity` rows (capacity >= the tokens
# a rank has, so a token's copy always fits: its top-k experts differ), whatever the routing: the
# exchanges have fixed sizes and no count leaves the GPU. The receiver packs each expert's rows
# from all sources to the front of its [W * capacity] rows, which is the masked layout
# (`m_grouped_fp8_gemm_nt_masked`: masked_m = the expert's row count), and unpacks the outputs the
# same way before they travel back.

# What a MaskedExpertFn takes: FP8 rows [E_local, M, hidden], their fp32 scales [E_local, M,
# hidden / 128] (row-major) and masked_m [E_local] (int32, rows past it are not read); it returns
# outputs [E_local, M, hidden] (rows past masked_m[e] are not used).
MaskedExpertFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """A fixed-capacity dispatch. Pair t * k + j goes to row ``slot[t * k + j]`` of the send buffer
    [W * E_local * capacity] (destination rank, its local expert, the pair's place among this
    rank's pairs for that expert); the same rows, received, are ordered (source rank, local
    expert, place). Row r of the packed (masked-layout) buffer [E_local * W * capacity] is received
    row ``pack_from[r]``, received row i is packed row ``unpack_from[i]`` (rows nobody filled read
    row 0: gathers, never scatters, so no two threads write one row); ``masked_m`` [E_local]
    counts each local expert's rows."""

    slot: torch.Tensor
    pack_from: torch.Tensor
    unpack_from: torch.Tensor
    masked_m: torch.Tensor
    capacity: int
    top_k: int


def plan_decode(experts: torch.Tensor, shards: Shards, capacity: int,
                group: dist.ProcessGroup | None = None) -> DecodePlan:
    """The fixed-capacity plan of one rank's top-k ``experts`` [T, k] (T <= ``capacity``): one
    ``all_to_all_single`` of the E counts, every size fixed by (W, E, capacity)."""
    t, k = experts.shape
    if t > capacity:
        raise ValueError(f"{t} tokens exceed the capacity of {capacity} rows per expert and source rank")
    world, per_rank, dev = shards.world, shards.per_rank, experts.device
    flat = experts.reshape(-1)
    onehot = F.one_hot(flat, shards.experts).to(torch.int32)  # [T * k, E]
    place = (onehot.cumsum(0) - onehot).gather(1, flat[:, None]).squeeze(1)  # the pair's rank for its expert
    slot = flat * capacity + place  # expert e = (rank, local) in that order: rank * E_local + local
    recv = _exchange_equal(onehot.sum(0), world, group).view(world, per_rank)  # [source, local] rows
    start = recv.cumsum(0) - recv  # each source's first row among the expert's packed rows
    masked_m = recv.sum(0)
    places = torch.arange(capacity, device=dev)
    local = torch.arange(per_rank, device=dev)
    # Received row (source, local, place) -> packed row local * W * capacity + start + place.
    unpack_from = local[None, :, None] * (world * capacity) + start[:, :, None] + places[None, None, :]
    unpack_from = torch.where(places[None, None, :] < recv[:, :, None], unpack_from, 0).reshape(-1)
    # Packed row (local, p) <- the source whose share of the expert's rows holds p.
    p = torch.arange(world * capacity, device=dev)
    ends = (start + recv).t().contiguous()  # [local, source]: each source's end among the packed rows
    source = torch.searchsorted(ends, p.expand(per_rank, -1).contiguous(), right=True).clamp(max=world - 1)
    first = start.t().gather(1, source)
    pack_from = (source * per_rank + local[:, None]) * capacity + (p[None, :] - first)
    pack_from = torch.where(p[None, :] < masked_m[:, None], pack_from, 0).reshape(-1)
    return DecodePlan(slot, pack_from, unpack_from, masked_m.to(torch.int32), capacity, k)


def _exchange_equal(t: torch.Tensor, world: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`_exchange` of ``t`` cut into ``world`` equal blocks along dim 0: the split sizes come from
    its shape, so no count leaves the GPU."""
    splits = [t.shape[0] // world] * world
    return _exchange(t, splits, splits, group)


def dispatch_decode(q: torch.Tensor, sf: torch.Tensor, plan: DecodePlan, shards: Shards,
                    group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's experts' rows in the masked layout: FP8 [E_local, W * capacity, hidden] and
    scales [E_local, W * capacity, hidden / 128], each expert's ``plan.masked_m`` rows first; ``q``
    [T, hidden] and ``sf`` [T, hidden / 128] are this rank's tokens."""
    rows = shards.world * shards.per_rank * plan.capacity
    tokens = torch.div(torch.arange(plan.slot.numel(), device=q.device), plan.top_k, rounding_mode="floor")
    out = []
    for t in (q, sf):
        values = as_bytes(t)
        # Rows nobody fills travel too, and no packed row reads them: no need to clear them.
        send = values.new_empty((rows, values.shape[1]))
        send[plan.slot] = values[tokens]
        recv = _exchange_equal(send, shards.world, group)
        packed = recv[plan.pack_from].view(shards.per_rank, shards.world * plan.capacity, values.shape[1])
        out.append(from_bytes(packed, t.dtype))
    return out[0], out[1]


def combine_decode(y: torch.Tensor, plan: DecodePlan, weights: torch.Tensor, shards: Shards,
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's tokens' outputs [T, hidden] in y's type from its experts' masked-layout outputs
    ``y`` [E_local, W * capacity, hidden]: unpacked into the received order, sent back, gathered
    into their (token, k) slots and summed with the router's ``weights`` [T, k]
    (`weighted_sum`)."""
    # Places nobody filled read row 0: they travel back and are never gathered.
    back = _exchange_equal(y.reshape(-1, y.shape[-1])[plan.unpack_from], shards.world, group)
    return weighted_sum(back[plan.slot], weights)


def ep_decode_forward(x: torch.Tensor, logits: torch.Tensor, top_k: int, shards: Shards, capacity: int,
                      experts_fn: MaskedExpertFn, group: dist.ProcessGroup | None = None,
                      quantize: Quantizer = per_token_quant_fp8_ref) -> torch.Tensor:
    """One decode step of the layer for this rank's tokens ``x`` [T, hidden] (T <= ``capacity``),
    every exchange of a fixed size (capturable in a CUDA graph with NCCL)."""
    experts, weights = route(logits, top_k)
    q, sf = quantize(x)
    plan = plan_decode(experts, shards, capacity, group)
    rq, rsf = dispatch_decode(q, sf, plan, shards, group)
    return combine_decode(experts_fn(rq, rsf, plan.masked_m), plan, weights, shards, group)


# ---- DeepEP's low-latency buffer ---------------------------------------------------------------
#
# Where `deep_ep` is installed, decode can exchange through DeepEP's low-latency kernels instead:
# `Buffer.low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
# use_fp8=True)` quantizes the bf16 tokens itself and returns ((FP8 [E_local, W * max, hidden],
# fp32 scales [E_local, W * max, hidden / 128] with the last two dimensions column-major, i.e.
# MN-major), per-expert counts int32 [E_local], handle, event, hook): exactly the masked layout's
# A, sfa and masked_m. `Buffer.low_latency_combine(y, topk_idx, topk_weights, handle)` returns
# (bf16 [T, hidden], event, hook). `deepep_decode_forward` is that path; `LowLatencyStandIn` has
# the same two calls and layouts over this file's fixed-capacity exchange, so the path runs (and
# is tested) where DeepEP is not installed.


def deepep_decode_forward(buffer, x: torch.Tensor, logits: torch.Tensor, top_k: int, max_tokens: int,
                          num_experts: int, experts_fn: MaskedExpertFn) -> torch.Tensor:
    """One decode step through a DeepEP low-latency ``buffer`` (or `LowLatencyStandIn`): ``x``
    [T, hidden] bf16 (T <= ``max_tokens``, the same on every rank), the experts on the masked
    layout it delivers (their scales arrive MN-major)."""
    experts, weights = route(logits, top_k)
    (rq, rsf), counts, handle, _, _ = buffer.low_latency_dispatch(x, experts, max_tokens, num_experts, use_fp8=True)
    y = experts_fn(rq, rsf, counts)
    out, _, _ = buffer.low_latency_combine(y, experts, weights, handle)
    return out


class LowLatencyStandIn:
    """DeepEP's low-latency dispatch and combine (the calls `deepep_decode_forward` makes, their
    arguments and the layouts they return) over `plan_decode`, `dispatch_decode` and
    `combine_decode`: tokens quantized by ``quantize``, scales returned MN-major, the plan as the
    handle, the combined output in the outputs' type. Not DeepEP's transport: the exchanges are
    ``all_to_all_single`` in ``group``. Expert indices of -1 (DeepEP's "no expert") are refused."""

    def __init__(self, group: dist.ProcessGroup | None, world: int, quantize: Quantizer = per_token_quant_fp8_ref) -> None:
        self.group, self.world, self.quantize = group, world, quantize

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, use_fp8: bool = True, async_finish: bool = False,
                             return_recv_hook: bool = False):
        if not use_fp8 or async_finish or return_recv_hook:
            raise ValueError("the stand-in dispatches FP8, synchronously, without a receive hook")
        capturing = topk_idx.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing and bool((topk_idx < 0).any()):  # a graph's capture cannot read it back
            raise ValueError("the stand-in routes every (token, k) pair to an expert: no -1 indices")
        shards = Shards(num_experts, self.world)
        plan = plan_decode(topk_idx, shards, num_max_dispatch_tokens_per_rank, self.group)
        q, sf = self.quantize(x)
        rq, rsf = dispatch_decode(q, sf, plan, shards, self.group)
        # DeepEP's scales: the last two dimensions column-major.
        mn_major = rsf.new_empty((rsf.shape[0], rsf.shape[2], rsf.shape[1])).transpose(1, 2)
        mn_major.copy_(rsf)
        return (rq, mn_major), plan.masked_m, (plan, shards), None, None

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle,
                            async_finish: bool = False, return_recv_hook: bool = False):
        plan, shards = handle
        return combine_decode(x, plan, topk_weights, shards, self.group), None, None


class ReferenceMaskedExperts:
    """`ReferenceExperts` over the masked layout: expert e's first masked_m[e] rows."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.experts = ReferenceExperts(w13, w2)

    def __call__(self, q: torch.Tensor, sf: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
        e, m, hidden = q.shape
        rows = torch.arange(m, device=q.device)[None, :] < masked_m[:, None]
        local = torch.arange(e, device=q.device)[:, None].expand(e, m)
        y = torch.zeros((e * m, hidden), dtype=torch.float64, device=q.device)
        keep = rows.reshape(-1)
        y[keep] = self.experts(q.reshape(-1, hidden)[keep], sf.reshape(e * m, -1)[keep], local.reshape(-1)[keep])
        return y.view(e, m, hidden)


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


def rank_check(problem: Problem, rank: int, group: dist.ProcessGroup | None = None, decode: str = "") -> float:
    """Run rank ``rank``'s share of ``problem`` and return its largest relative difference from
    the single-process reference (the reference for its rows, computed on every rank); with
    ``decode`` "nccl", through the fixed-capacity exchange (`ep_decode_forward`, capacity = the
    most tokens any rank has), with "deepep" through `deepep_decode_forward` and the stand-in."""
    x, logits, w13, w2 = problem.inputs()
    shards = Shards(problem.experts, len(problem.tokens))
    start = sum(problem.tokens[:rank])
    mine = slice(start, start + problem.tokens[rank])
    lo, hi = rank * shards.per_rank, (rank + 1) * shards.per_rank
    capacity = max(max(problem.tokens), 1)
    if decode == "deepep":
        buffer = LowLatencyStandIn(group, shards.world)
        out = deepep_decode_forward(buffer, x[mine], logits[mine], problem.top_k, capacity, problem.experts,
                                    ReferenceMaskedExperts(w13[lo:hi], w2[lo:hi]))
    elif decode:
        experts = ReferenceMaskedExperts(w13[lo:hi], w2[lo:hi])
        out = ep_decode_forward(x[mine], logits[mine], problem.top_k, shards, capacity, experts, group)
    else:
        out = ep_forward(x[mine], logits[mine], problem.top_k, shards, ReferenceExperts(w13[lo:hi], w2[lo:hi]), group)
    want = reference_forward(x, logits, problem.top_k, w13, w2)[mine]
    if out.shape != want.shape:
        raise AssertionError(f"rank {rank}: output shape {tuple(out.shape)}, expected {tuple(want.shape)}")
    if not want.numel():
        return 0.0
    return float(((out.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())


def _worker(rank: int, problem: Problem, rendezvous: str, results: str, decode: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=len(problem.tokens))
    try:
        diff = rank_check(problem, rank, decode=decode)
        with open(f"{results}.{rank}", "w") as f:
            f.write(repr(diff))
    finally:
        dist.destroy_process_group()


def run_on_cpu_ranks(problem: Problem, decode: str = "") -> list[float]:
    """Each rank's largest relative difference from the reference, the ranks being CPU processes
    joined by gloo (one per entry of ``problem.tokens``); ``decode``: see `rank_check`."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        rendezvous, results = os.path.join(tmp, "rendezvous"), os.path.join(tmp, "result")
        mp.spawn(_worker, args=(problem, rendezvous, results, decode), nprocs=len(problem.tokens), join=True)
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
    parser.add_argument("--decode", choices=("nccl", "deepep"), default="",
                        help="the decode path: fixed-capacity all_to_all blocks into the masked layout (nccl), or "
                             "DeepEP's low-latency calls (deepep: the stand-in over the same exchange)")
    args = parser.parse_args(argv)
    tokens = [args.tokens] * (args.ranks - 1) + [args.tokens - args.tokens // 3]
    problem = Problem(tokens, args.experts, args.top_k, args.hidden, args.intermediate, args.seed)
    diffs = run_on_cpu_ranks(problem, args.decode)
    for rank, diff in enumerate(diffs):
        print(f"rank {rank}: {tokens[rank]} tokens, max relative difference from one process {diff:.1e}")
    ok = all(d <= TOLERANCE for d in diffs)
    print("OK" if ok else f"FAILED: above {TOLERANCE:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
