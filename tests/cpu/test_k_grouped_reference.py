"""CPU tier: the k-grouped weight-gradient layout, stated by `k_grouped_reference` on the grouped
transposed quantize's reference output, reproduces each group's dyᵀ·x."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime.k_grouped_ops import k_grouped_reference, workspace_words  # noqa: E402
from cutegen.runtime.quant_reference import grouped_transposed_quant_fp8_ref  # noqa: E402


def calc_diff(x, y) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


@pytest.mark.parametrize("sizes", [[0, 1, 129, 300], [128, 0], [5]], ids=lambda s: "-".join(map(str, s)))
def test_reference_reproduces_each_group(sizes):
    gen = torch.Generator().manual_seed(0)
    m, n = 64, 40
    dy = torch.randn(sum(sizes), m, generator=gen).bfloat16()
    x = torch.randn(sum(sizes), n, generator=gen).bfloat16()
    qa, sfa = grouped_transposed_quant_fp8_ref(dy, sizes, num_blocks=8)  # S larger than needed
    qb, sfb = grouped_transposed_quant_fp8_ref(x, sizes, num_blocks=8)
    got = k_grouped_reference(qa, sfa, qb, sfb, sizes)
    start = 0
    for g, k in enumerate(sizes):
        ref = dy[start : start + k].float().T @ x[start : start + k].float()
        if k == 0:
            assert torch.equal(got[g], torch.zeros(m, n))
        else:
            assert calc_diff(got[g], ref) < 1e-3, (g, k)
        start += k


def test_workspace_is_two_descriptors_per_cta():
    assert workspace_words(132) == 132 * 2 * 128 // 8
