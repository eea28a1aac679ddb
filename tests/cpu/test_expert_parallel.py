"""CPU tier: the expert-parallel MoE layer's dispatch and combine (examples/expert_parallel) on gloo ranks, against the layer in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "expert_parallel"))
import ep_moe  # noqa: E402


def test_routing_and_the_dispatch_plan_in_one_process():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, -1.0, 4.0, 0.0]])
    experts, weights = ep_moe.route(logits, 2)
    assert experts.tolist() == [[1, 3], [0, 2]]
    assert torch.allclose(weights.sum(1), torch.ones(2)) and bool((weights[:, 0] > weights[:, 1]).all())
    plan = ep_moe.plan_dispatch(experts, ep_moe.Shards(4, 1))
    # Pairs t * k + j sorted by expert: (1, 0) expert 0, (0, 0) expert 1, (1, 1) expert 2, (0, 1) expert 3.
    assert plan.order.tolist() == [2, 0, 3, 1] and plan.send == plan.recv == [4]
    with pytest.raises(ValueError, match="multiple of the ranks"):
        ep_moe.Shards(6, 4)


@pytest.mark.parametrize(
    "tokens, experts, top_k",
    [
        ((37, 5), 8, 2),  # uneven ranks
        ((20, 0), 4, 3),  # a rank with no tokens sends nothing and still serves its experts
        ((11, 0, 7), 6, 1),  # three ranks, top-1
    ],
)
def test_every_rank_matches_the_layer_in_one_process(tokens, experts, top_k):
    problem = ep_moe.Problem(tokens, experts=experts, top_k=top_k, hidden=256, intermediate=64, seed=len(tokens))
    diffs = ep_moe.run_on_cpu_ranks(problem)
    assert len(diffs) == len(tokens) and max(diffs) <= ep_moe.TOLERANCE, diffs


def test_a_plan_for_another_world_size_is_refused():
    problem = ep_moe.Problem((4, 4), experts=4)
    x, logits, w13, w2 = problem.inputs()
    experts, _ = ep_moe.route(logits, 2)
    # One process, no process group: the two-rank plan has nobody to exchange with.
    with pytest.raises(ValueError, match="the shards are for 2 ranks, the process group has 1"):
        ep_moe.plan_dispatch(experts, ep_moe.Shards(4, 2))


@pytest.mark.parametrize(
    "tokens, experts, top_k",
    [
        ((37, 5), 8, 2),  # uneven ranks: the capacity is the larger rank's
        ((20, 0), 4, 3),  # a rank with no tokens
        ((11, 6, 7), 6, 1),  # three ranks, top-1
    ],
)
def test_decode_exchange_of_fixed_size_matches_the_layer_in_one_process(tokens, experts, top_k):
    problem = ep_moe.Problem(tokens, experts=experts, top_k=top_k, hidden=256, intermediate=64, seed=7 + len(tokens))
    diffs = ep_moe.run_on_cpu_ranks(problem, decode="nccl")
    assert len(diffs) == len(tokens) and max(diffs) <= ep_moe.TOLERANCE, diffs


def test_decode_plan_packs_each_experts_rows_first():
    # One rank, four experts, capacity 3: pairs (t, j) of experts [[2, 0], [2, 1], [0, 3]].
    experts = torch.tensor([[2, 0], [2, 1], [0, 3]])
    plan = ep_moe.plan_decode(experts, ep_moe.Shards(4, 1), capacity=3)
    assert plan.masked_m.tolist() == [2, 1, 2, 1]
    # Send rows: expert * capacity + place among this rank's pairs for that expert.
    assert plan.slot.tolist() == [6, 0, 7, 3, 1, 9]
    # One rank: each expert's received rows are its packed rows; places nobody filled read row 0.
    assert plan.pack_from.tolist() == plan.unpack_from.tolist() == [0, 1, 0, 3, 0, 0, 6, 7, 0, 9, 0, 0]
    with pytest.raises(ValueError, match="4 tokens exceed the capacity of 3"):
        ep_moe.plan_decode(torch.zeros(4, 1, dtype=torch.long), ep_moe.Shards(4, 1), capacity=3)


@pytest.mark.parametrize("tokens, experts, top_k", [((37, 5), 8, 2), ((9, 0, 9), 6, 3)])
def test_the_deepep_path_through_the_stand_in_matches_the_layer_in_one_process(tokens, experts, top_k):
    problem = ep_moe.Problem(tokens, experts=experts, top_k=top_k, hidden=256, intermediate=64, seed=3)
    diffs = ep_moe.run_on_cpu_ranks(problem, decode="deepep")
    assert len(diffs) == len(tokens) and max(diffs) <= ep_moe.TOLERANCE, diffs


def test_the_stand_in_returns_deepeps_layouts_and_refuses_what_it_does_not_do():
    problem = ep_moe.Problem((6,), experts=4, top_k=2, hidden=256)
    x, logits, _, _ = problem.inputs()
    experts, _ = ep_moe.route(logits, 2)
    buffer = ep_moe.LowLatencyStandIn(None, 1)
    (q, sf), counts, _, _, _ = buffer.low_latency_dispatch(x, experts, 8, 4)
    assert q.shape == (4, 8, 256) and q.dtype == torch.float8_e4m3fn
    # Scales [E_local, W * max, hidden / 128], the last two dimensions column-major.
    assert sf.shape == (4, 8, 2) and sf.stride() == (16, 1, 8)
    assert counts.dtype == torch.int32 and int(counts.sum()) == 12
    with pytest.raises(ValueError, match="no -1 indices"):
        buffer.low_latency_dispatch(x, torch.full_like(experts, -1), 8, 4)
    with pytest.raises(ValueError, match="synchronously"):
        buffer.low_latency_dispatch(x, experts, 8, 4, async_finish=True)


def test_the_gpu_driver_imports_and_renders_its_committed_timings():
    """examples/expert_parallel/ep_gpu.py needs GPUs to run; its tables come from its JSON alone."""
    import json

    import ep_gpu

    report = Path(__file__).resolve().parents[2] / "docs" / "perf" / "ep" / "2026-12-06-nvidia-h100-80gb-hbm3.json"
    result = json.loads(report.read_text())
    text = ep_gpu.render(result)
    assert "| 32768 |" in text and "step µs (CUDA graph)" in text and "overlapped layer ms" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    sizes = len(result["ranks"][0]["prefill"]) + len(result["ranks"][0]["decode"])
    assert len(rows) == 2 * 2 + sizes  # two tables: a header and a rule each, then a row per size
