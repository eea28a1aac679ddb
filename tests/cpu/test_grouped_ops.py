"""CPU tier: the contiguous grouped GEMM's host-side pieces (group-ends conversion, alignment)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import grouped_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402


def reference_m_indices(ends: list[int], rows: int) -> list[int]:
    out = [-1] * rows
    start = 0
    for g, end in enumerate(ends):
        for r in range(start, min(end, rows)):
            out[r] = g
        start = -(-end // 128) * 128
    return out


@pytest.mark.parametrize(
    "sizes",
    [[200, 0, 1, 128, 129], [0, 0, 0], [128], [1], [], [300, 5, 0, 0, 256]],
    ids=lambda s: "-".join(map(str, s)) or "none",
)
def test_m_indices_from_group_ends(sizes):
    ends, row = [], 0
    for size in sizes:
        ends.append(row + size)
        row = -(-(row + size) // 128) * 128
    rows = max(row, 128)
    got = grouped_ops.m_indices_from_group_ends(torch.tensor(ends, dtype=torch.int32), rows)
    assert got.dtype == torch.int32
    assert got.tolist() == reference_m_indices(ends, rows)


def test_alignment_and_bad_group_ends():
    assert grouped_ops.contiguous_alignment() == 128
    with pytest.raises(InputError, match="group_ends"):
        grouped_ops.m_indices_from_group_ends(torch.tensor([1.0]), 128)
