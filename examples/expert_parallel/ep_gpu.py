"""Expert parallelism on GPUs: `ep_moe.py`'s layer over NCCL with cutegen's grouped FP8 GEMMs as the experts, prefill and CUDA-graph decode, checked and timed.

    torchrun --nproc-per-node N examples/expert_parallel/ep_gpu.py [--build-dir DIR] [--time ROUNDS]
        [--json-out FILE] [--experts 32] [--top-k 4] [--hidden 7168] [--intermediate 2048]
        [--prefill-tokens 4096,16384,32768] [--decode-tokens 1,16,64,256] [--chunks 2] [--reserve-sms 16]
    python examples/expert_parallel/ep_gpu.py ...      # one GPU: a process group of one rank

Each rank holds E / W experts (FP8 weights, 128x128 block scales) and its own tokens. Its experts
run as cutegen kernels on the rows the exchange delivers:

* **prefill**: the rows sorted by local expert into the contiguous layout (each expert's segment
  padded to `contiguous_alignment()`), the up-projection with SwiGLU and the FP8 quantize fused
  (`m_grouped_fp8_gemm_nt_contiguous_swiglu_quant`, or the GEMM, SwiGLU in torch and cutegen's
  quantizer where the catalogue has no fused kernel for this GPU), then the down-projection
  (`m_grouped_fp8_gemm_nt_contiguous`); the exchange is `ep_moe.dispatch` / `combine` (split
  sizes exchanged first, then copied to the host);
* **decode**: `ep_moe.ep_decode_forward`, every exchange of a fixed size (a capacity of the step's
  tokens per rank and expert) so that nothing leaves the GPU, the experts in the masked layout
  (`m_grouped_fp8_gemm_nt_masked_swiglu_quant`, then `m_grouped_fp8_gemm_nt_masked`), the whole
  step captured in one CUDA graph and replayed.

* **overlap** (`overlapped_prefill`): prefill in micro-batches, each one's dispatch and combine on
  a communication stream beside the experts of its neighbours, cutegen's kernels capped by
  `set_num_sms` so that NCCL's kernels keep ``--reserve-sms`` SMs.

Checks (always, on a small layer): each rank's prefill and decode outputs against the same layer
in one process with every expert local (the same kernels; `calc_diff` ≤ 1e-5), the overlapped
prefill against the prefill in one piece (the same bound), and against the layer in fp32 torch on
the unquantised weights (`calc_diff` < 5e-3, the bound of `examples/torch_moe_layer`). `--time
ROUNDS` then times the layer at the given sizes (CUDA events, medians over rounds): prefill split
into quantize, dispatch, experts and combine, the overlapped prefill, and a decode step's graph
replay; tokens per second per GPU. Rank 0 prints the tables (`--json-out` writes them).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "torch_moe_layer"))
import ep_moe  # noqa: E402
from moe_layer import LAYER_TOLERANCE, Fp8Experts, calc_diff, contiguous_layout, reference  # noqa: E402

# A rank's output and the same layer's in one process run the same kernels on the same FP8 rows;
# they differ where another tile or split order is chosen for another row count.
SAME_LAYER_TOLERANCE = 1e-5


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cutegen's per-token quantizer: FP8 [T, H] and row-major fp32 scales [T, H / 128]."""
    from cutegen.runtime import quant_ops

    return quant_ops.per_token_quant_fp8(x, scale_layout="k-major")


def _swiglu_quant(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(gate) · up of bf16 h [..., 2I] and its per-token quantize (the unfused path)."""
    from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

    inter = h.shape[-1] // 2
    act = (F.silu(h[..., :inter].float()) * h[..., inter:].float()).to(torch.bfloat16)
    q, s = quantize(act.reshape(-1, inter))
    return q.view(*h.shape[:-1], inter), to_mn_major_tma_aligned(s.view(*h.shape[:-1], -1))


class ContiguousExperts:
    """An `ep_moe.ExpertFn` for prefill: the received rows in the contiguous layout."""

    def __init__(self, experts: Fp8Experts, fused: bool) -> None:
        self.experts, self.fused = experts, fused

    def __call__(self, q: torch.Tensor, sf: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        from cutegen.runtime import fused_ops, grouped_ops
        from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

        rows_in, hidden = q.shape
        if rows_in == 0:
            return torch.zeros((0, hidden), dtype=torch.bfloat16, device=q.device)
        order, rows, m_indices = contiguous_layout(local, self.experts.experts)
        total = m_indices.numel()
        a = torch.zeros((total, hidden), dtype=torch.uint8, device=q.device)
        a[rows] = ep_moe.as_bytes(q)[order]
        s = torch.zeros((total, sf.shape[1]), dtype=torch.float32, device=q.device)
        s[rows] = sf[order]
        qa, sa = ep_moe.from_bytes(a, q.dtype), to_mn_major_tma_aligned(s)
        if self.fused:
            qh, sh = fused_ops.m_grouped_fp8_gemm_nt_contiguous_swiglu_quant(
                qa, sa, self.experts.q13_fused, self.experts.s13_fused, m_indices
            )
        else:
            qh, sh = _swiglu_quant(grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qa, sa, self.experts.q13, self.experts.s13, m_indices))
        y = grouped_ops.m_grouped_fp8_gemm_nt_contiguous(qh, sh, self.experts.q2, self.experts.s2, m_indices)
        out = torch.empty((rows_in, hidden), dtype=y.dtype, device=q.device)
        out[order] = y[rows]
        return out


class MaskedExperts:
    """An `ep_moe.MaskedExpertFn` for decode: the masked layout, ``expected_m`` rows per expert
    as the kernel choice's hint."""

    def __init__(self, experts: Fp8Experts, fused: bool, expected_m: int) -> None:
        self.experts, self.fused, self.expected_m = experts, fused, expected_m

    def __call__(self, q: torch.Tensor, sf: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
        from cutegen.runtime import fused_ops, grouped_ops
        from cutegen.runtime.fp8_ops import to_mn_major_tma_aligned

        sa = to_mn_major_tma_aligned(sf)
        if self.fused:
            qh, sh = fused_ops.m_grouped_fp8_gemm_nt_masked_swiglu_quant(
                q, sa, self.experts.q13_fused, self.experts.s13_fused, masked_m, self.expected_m
            )
        else:
            h = grouped_ops.m_grouped_fp8_gemm_nt_masked(q, sa, self.experts.q13, self.experts.s13, masked_m, self.expected_m)
            qh, sh = _swiglu_quant(h)
        return grouped_ops.m_grouped_fp8_gemm_nt_masked(qh, sh, self.experts.q2, self.experts.s2, masked_m, self.expected_m)


@dataclasses.dataclass(frozen=True)
class Layer:
    experts: int
    top_k: int
    hidden: int
    intermediate: int


def weights(layer: Layer, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The same bf16 gate/up [E, 2I, H] and down [E, H, I] weights on every rank."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i = layer.experts, layer.hidden, layer.intermediate
    w13 = (torch.randn(e, 2 * i, h, generator=g, device=device) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g, device=device) / i**0.5).to(torch.bfloat16)
    return w13, w2


def tokens(layer: Layer, count: int, rank: int, device: torch.device, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens [count, H] (bf16) and router logits [count, E]."""
    g = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    x = torch.randn(count, layer.hidden, generator=g, device=device).to(torch.bfloat16)
    return x, torch.randn(count, layer.experts, generator=g, device=device)


def torch_reference(x, logits, top_k, w13, w2) -> torch.Tensor:
    """The layer in fp32 torch on the unquantised weights (every expert), routed as `ep_moe.route`."""
    return reference(x, *ep_moe.route(logits, top_k), w13, w2)


def deepep_installed() -> bool:
    return importlib.util.find_spec("deep_ep") is not None


def low_latency_buffer(layer: Layer, max_tokens: int):
    """DeepEP's low-latency buffer for decode steps of at most ``max_tokens`` tokens per rank where
    `deep_ep` is installed, else `ep_moe.LowLatencyStandIn` (the same calls over all_to_all)."""
    world = dist.get_world_size()
    if not deepep_installed():
        return ep_moe.LowLatencyStandIn(None, world, quantize=quantize)
    import deep_ep

    rdma_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(max_tokens, layer.hidden, world, layer.experts)
    return deep_ep.Buffer(dist.group.WORLD, 0, rdma_bytes, low_latency_mode=True,
                          num_qps_per_rank=layer.experts // world)


class Rank:
    """This process's place: its rank, the world, its experts (the shard and all of them, for the
    one-process anchor) and whether the fused up-projection runs here."""

    def __init__(self, layer: Layer, fused: bool, seed: int = 0) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.layer = layer
        self.shards = ep_moe.Shards(layer.experts, self.world)
        self.device = torch.device("cuda", torch.cuda.current_device())
        w13, w2 = weights(layer, self.device, seed)
        lo, hi = self.rank * self.shards.per_rank, (self.rank + 1) * self.shards.per_rank
        self.w13, self.w2 = w13, w2
        self.mine = Fp8Experts(w13[lo:hi].contiguous(), w2[lo:hi].contiguous())
        self.fused = fused
        self._everyone: Fp8Experts | None = None

    @property
    def every_expert(self) -> Fp8Experts:
        if self._everyone is None:
            self._everyone = Fp8Experts(self.w13, self.w2)
        return self._everyone

    def prefill(self, x, logits):
        return ep_moe.ep_forward(x, logits, self.layer.top_k, self.shards, ContiguousExperts(self.mine, self.fused),
                                 quantize=quantize).float()

    def decode_graph(self, count: int, exchange: str = "nccl"):
        """A decode step for ``count`` tokens captured in a CUDA graph: (static x, static logits,
        static output, graph); ``exchange`` "nccl" (`ep_moe.ep_decode_forward`) or "deepep"
        (`ep_moe.deepep_decode_forward` through `low_latency_buffer`)."""
        x, logits = tokens(self.layer, count, self.rank, self.device, seed=7)
        fn = MaskedExperts(self.mine, self.fused, max(1, count * self.layer.top_k // self.layer.experts))
        buffer = low_latency_buffer(self.layer, count) if exchange == "deepep" else None

        def step():
            if buffer is not None:
                return ep_moe.deepep_decode_forward(buffer, x, logits, self.layer.top_k, count, self.layer.experts, fn)
            return ep_moe.ep_decode_forward(x, logits, self.layer.top_k, self.shards, count, fn, quantize=quantize)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # load the kernels and the exchange outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        return x, logits, out, graph

    def one_process(self, x, logits) -> torch.Tensor:
        """The same layer for these tokens with every expert local (no exchange)."""
        return ep_moe.ep_forward(x, logits, self.layer.top_k, ep_moe.Shards(self.layer.experts, 1),
                                 ContiguousExperts(self.every_expert, self.fused), quantize=quantize).float()


def overlapped_prefill(rank: Rank, x: torch.Tensor, logits: torch.Tensor, chunks: int, reserve_sms: int) -> torch.Tensor:
    """Prefill in ``chunks`` micro-batches, each one's routing, quantize, dispatch and combine on a
    communication stream beside the experts of its neighbours on the current stream: chunk i + 1
    is dispatched while chunk i's experts run, chunk i is combined while chunk i + 1's run.
    cutegen's persistent kernels leave ``reserve_sms`` SMs to NCCL's kernels meanwhile
    (`set_num_sms`): a grid on every SM would hold them off until it ends. Outputs as `Rank.prefill`."""
    from cutegen.runtime import set_num_sms

    compute, comm = torch.cuda.current_stream(), torch.cuda.Stream()
    ready = torch.cuda.Event()
    ready.record(compute)  # the tokens and router logits exist
    experts_fn = ContiguousExperts(rank.mine, rank.fused)
    parts = list(zip(x.chunk(chunks), logits.chunk(chunks)))
    top_k, shards = rank.layer.top_k, rank.shards

    def dispatch(part):
        with torch.cuda.stream(comm):
            comm.wait_event(ready)
            experts, weights_ = ep_moe.route(part[1], top_k)
            q, sf = quantize(part[0])
            plan = ep_moe.plan_dispatch(experts, shards)
            received = ep_moe.dispatch(q, sf, experts, plan, shards)
            done = torch.cuda.Event()
            done.record(comm)
        for t in received:
            t.record_stream(compute)
        return plan, weights_, received, done

    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    set_num_sms(max(1, sms - reserve_sms))
    outs = []
    try:
        pending = dispatch(parts[0])
        for i in range(len(parts)):
            plan, weights_, received, done = pending
            if i + 1 < len(parts):
                pending = dispatch(parts[i + 1])
            compute.wait_event(done)
            y = experts_fn(*received)
            computed = torch.cuda.Event()
            computed.record(compute)
            y.record_stream(comm)
            with torch.cuda.stream(comm):
                comm.wait_event(computed)
                outs.append(ep_moe.combine(y, plan, weights_))
        compute.wait_stream(comm)
        for out in outs:
            out.record_stream(compute)
        return torch.cat(outs).float()
    finally:
        set_num_sms(None)


def check(rank: Rank, prefill_tokens: int, decode_tokens: int) -> list[str]:
    """The failed checks' descriptions (prefill, then three replays of a decode graph with new
    tokens each time, through all_to_all and through DeepEP's calls), each rank's lines printed
    in rank order."""
    failures, lines = [], []
    x, logits = tokens(rank.layer, prefill_tokens - prefill_tokens // 3 * (rank.rank % 2), rank.rank, rank.device)
    got = rank.prefill(x, logits)
    same, exact = calc_diff(got, rank.one_process(x, logits)), calc_diff(got, torch_reference(x, logits, rank.layer.top_k, rank.w13, rank.w2))
    lines.append(f"rank {rank.rank}: prefill {x.shape[0]} tokens: calc_diff {same:.1e} from one process, {exact:.1e} from fp32 torch")
    if not (same <= SAME_LAYER_TOLERANCE and exact < LAYER_TOLERANCE):
        failures.append(f"rank {rank.rank} prefill")
    chunked = calc_diff(overlapped_prefill(rank, x, logits, chunks=3, reserve_sms=16), got)
    lines.append(f"rank {rank.rank}: prefill in 3 overlapped chunks: calc_diff {chunked:.1e} from the prefill in one piece")
    if not chunked <= SAME_LAYER_TOLERANCE:
        failures.append(f"rank {rank.rank} overlapped prefill")
    deepep = "DeepEP's low-latency buffer" if deepep_installed() else "DeepEP's calls through the stand-in"
    for exchange, label in (("nccl", "all_to_all"), ("deepep", deepep)):
        sx, slog, out, graph = rank.decode_graph(decode_tokens, exchange)
        for replay in range(3):
            nx, nlog = tokens(rank.layer, decode_tokens, rank.rank, rank.device, seed=20 + replay)
            sx.copy_(nx)
            slog.copy_(nlog)
            graph.replay()
            torch.cuda.synchronize()
            same = calc_diff(out, rank.one_process(nx, nlog))
            exact = calc_diff(out, torch_reference(nx, nlog, rank.layer.top_k, rank.w13, rank.w2))
            lines.append(f"rank {rank.rank}: decode ({label}) replay {replay}, {decode_tokens} tokens: calc_diff "
                         f"{same:.1e} from one process, {exact:.1e} from fp32 torch")
            if not (same <= SAME_LAYER_TOLERANCE and exact < LAYER_TOLERANCE):
                failures.append(f"rank {rank.rank} decode ({label}) replay {replay}")
    for r in range(rank.world):
        dist.barrier()
        if r == rank.rank:
            print("\n".join(lines), flush=True)
    return failures


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


STAGES = ("quantize", "dispatch", "experts", "combine")


def time_stages(rank: Rank, count: int, rounds: int, decode: bool) -> dict[str, float]:
    """Median ms of each stage of the layer run eagerly (routing and quantize, the plan and the
    dispatch, the experts, the combine) and of the whole; prefill, or with ``decode`` the
    fixed-capacity exchange and the masked layout."""
    x, logits = tokens(rank.layer, count, rank.rank, rank.device)
    top_k, shards = rank.layer.top_k, rank.shards
    if decode:
        masked_fn = MaskedExperts(rank.mine, rank.fused, max(1, count * top_k // rank.layer.experts))
    else:
        contiguous_fn = ContiguousExperts(rank.mine, rank.fused)
    stages: dict[str, list[float]] = {name: [] for name in (*STAGES, "layer")}
    for round_ in range(rounds + 1):  # the first round warms up
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        dist.barrier()
        marks[0].record()
        experts, weights_ = ep_moe.route(logits, top_k)
        q, sf = quantize(x)
        marks[1].record()
        if decode:
            plan = ep_moe.plan_decode(experts, shards, count)
            rq, rsf = ep_moe.dispatch_decode(q, sf, plan, shards)
            marks[2].record()
            y = masked_fn(rq, rsf, plan.masked_m)
            marks[3].record()
            ep_moe.combine_decode(y, plan, weights_, shards)
        else:
            plan = ep_moe.plan_dispatch(experts, shards)
            rq, rsf, local = ep_moe.dispatch(q, sf, experts, plan, shards)
            marks[2].record()
            y = contiguous_fn(rq, rsf, local)
            marks[3].record()
            ep_moe.combine(y, plan, weights_)
        marks[4].record()
        torch.cuda.synchronize()
        if round_:
            for name, (a, b) in zip(STAGES, zip(marks, marks[1:])):
                stages[name].append(a.elapsed_time(b))
            stages["layer"].append(marks[0].elapsed_time(marks[4]))
    return {name: statistics.median(v) for name, v in stages.items()}


def time_overlapped(rank: Rank, count: int, rounds: int, chunks: int, reserve_sms: int) -> float:
    """Median ms of `overlapped_prefill` for ``count`` tokens."""
    x, logits = tokens(rank.layer, count, rank.rank, rank.device)
    times = []
    for round_ in range(rounds + 1):  # the first round warms up
        dist.barrier()
        start, end = _events()
        start.record()
        overlapped_prefill(rank, x, logits, chunks, reserve_sms)
        end.record()
        end.synchronize()
        if round_:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_decode(rank: Rank, count: int, rounds: int) -> float:
    """Median ms of one decode step's graph replay (10 replays per round)."""
    _, _, _, graph = rank.decode_graph(count)
    times = []
    for _ in range(rounds):
        dist.barrier()
        start, end = _events()
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 10)
    return statistics.median(times)


def _gather(value: dict) -> list[dict]:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def timings(rank: Rank, prefill_counts: list[int], decode_counts: list[int], rounds: int, chunks: int,
            reserve_sms: int) -> dict:
    """Every rank's timings (rank 0 gets them all)."""
    mine = {"prefill": {str(c): {**time_stages(rank, c, rounds, decode=False),
                                 "overlapped": time_overlapped(rank, c, rounds, chunks, reserve_sms)}
                        for c in prefill_counts},
            "decode": {str(c): {**time_stages(rank, c, rounds, decode=True), "graph": time_decode(rank, c, rounds)}
                       for c in decode_counts}}
    return {"ranks": _gather(mine)}


def render(result: dict) -> str:
    """Markdown tables of `timings` (the slowest rank's time per stage: the layer waits for it)."""
    ranks = result["ranks"]
    world = len(ranks)
    lines = [f"{result['device']}, {world} rank(s), NCCL; {result['layer']}; up-projection: {result['up_projection']}; "
             f"medians over {result['rounds']} rounds, the slowest rank's time.", "",
             f"| prefill tokens per rank | quantize ms | dispatch ms | experts ms | combine ms | layer ms | tokens/s per GPU "
             f"| overlapped layer ms ({result['chunks']} chunks, {result['reserve_sms']} SMs left to NCCL) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for count in ranks[0]["prefill"]:
        worst = {k: max(r["prefill"][count][k] for r in ranks) for k in ranks[0]["prefill"][count]}
        lines.append(f"| {count} | {worst['quantize']:.3f} | {worst['dispatch']:.3f} | {worst['experts']:.3f} | "
                     f"{worst['combine']:.3f} | {worst['layer']:.3f} | {int(count) / worst['layer'] * 1e3:,.0f} | "
                     f"{worst['overlapped']:.3f} |")
    lines += ["", "| decode tokens per rank | quantize µs | dispatch µs | experts µs | combine µs | eager step µs "
                  "| step µs (CUDA graph) | tokens/s per GPU |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for count in ranks[0]["decode"]:
        worst = {k: max(r["decode"][count][k] for r in ranks) for k in ranks[0]["decode"][count]}
        stages = " | ".join(f"{worst[name] * 1e3:.1f}" for name in (*STAGES, "layer"))
        lines.append(f"| {count} | {stages} | {worst['graph'] * 1e3:.1f} | {int(count) / worst['graph'] * 1e3:,.0f} |")
    return "\n".join(lines)


def _init() -> None:
    if "RANK" in os.environ:  # torchrun
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        torch.cuda.set_device(0)
        store = tempfile.NamedTemporaryFile(delete=False).name
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=None)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--prefill-tokens", default="4096,16384,32768")
    p.add_argument("--decode-tokens", default="1,16,64,256")
    p.add_argument("--up-projection", choices=("fused", "unfused"), default="fused",
                   help="the fused SwiGLU + quantize kernels (where they run on this GPU) or the separate ones")
    p.add_argument("--time", type=int, default=0, metavar="ROUNDS", help="time the layer over this many rounds")
    p.add_argument("--chunks", type=int, default=2, help="micro-batches of the overlapped prefill")
    p.add_argument("--reserve-sms", type=int, default=16,
                   help="SMs cutegen's kernels leave to NCCL while the overlapped prefill runs (set_num_sms)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("this example needs CUDA GPUs and NCCL")
        return 2
    from cutegen.runtime import ops

    ops.set_build_dir(args.build_dir)
    _init()
    try:
        fused = args.up_projection == "fused" and all(
            ops.runnable_kernels(f"m_grouped_fp8_gemm_nt_{layout}_swiglu_quant") for layout in ("contiguous", "masked"))
        world = dist.get_world_size()
        small = Layer(experts=4 * world, top_k=2, hidden=512, intermediate=256)
        failures = check(Rank(small, fused), prefill_tokens=300, decode_tokens=24)
        failed = _gather({"failures": failures})
        if dist.get_rank() == 0:
            everything = [f for r in failed for f in r["failures"]]
            print("checks: OK" if not everything else f"checks FAILED: {', '.join(everything)}", flush=True)
        if args.time > 0:
            layer = Layer(args.experts, args.top_k, args.hidden, args.intermediate)
            result = timings(Rank(layer, fused), [int(c) for c in args.prefill_tokens.split(",")],
                             [int(c) for c in args.decode_tokens.split(",")], args.time, args.chunks, args.reserve_sms)
            result.update(device=torch.cuda.get_device_name(), rounds=args.time, chunks=args.chunks,
                          reserve_sms=args.reserve_sms,
                          up_projection="fused SwiGLU + quantize" if fused else "GEMM, SwiGLU, quantize",
                          layer=f"{layer.experts} experts, top-{layer.top_k}, hidden {layer.hidden}, "
                                f"intermediate {layer.intermediate}")
            if dist.get_rank() == 0:
                print(render(result), flush=True)
                if args.json_out:
                    Path(args.json_out).write_text(json.dumps(result, indent=1))
        return 1 if any(r["failures"] for r in failed) else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
