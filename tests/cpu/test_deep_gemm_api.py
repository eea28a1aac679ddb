"""CPU tier: `cutegen.deep_gemm` matches DeepGEMM's API (names, signatures, semantics of its pure-torch
helpers) and refuses what cutegen has no kernel for before launching anything; the `deep_gemm`
compat distribution re-exports it under DeepGEMM's import name."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import cutegen.deep_gemm as dg  # noqa: E402
from cutegen.runtime import quant_reference  # noqa: E402

COMPAT = Path(__file__).resolve().parents[2] / "compat" / "deep_gemm"

# DeepGEMM 2.6.1's argument names (its pybind definitions), per entry point cutegen serves.
DEEPGEMM_SIGNATURES = {
    "fp8_gemm_nt": ["a", "b", "d", "c", "recipe", "recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast"],
    "fp8_fp4_gemm_nt": ["a", "b", "d", "c", "recipe", "recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast"],
    "m_grouped_fp8_gemm_nt_contiguous": [
        "a", "b", "d", "grouped_layout", "recipe", "recipe_a", "recipe_b", "compiled_dims",
        "disable_ue8m0_cast", "use_psum_layout", "ensure_zero_padding", "expected_m_for_psum_layout",
    ],
    "m_grouped_fp8_gemm_nt_masked": [
        "a", "b", "d", "masked_m", "expected_m", "recipe", "recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast",
    ],
    "k_grouped_fp8_gemm_nt_contiguous": ["a", "b", "d", "ks_cpu", "grouped_layout", "c", "recipe", "compiled_dims", "use_psum_layout"],
    "k_grouped_fp8_gemm_tn_contiguous": ["a", "b", "d", "ks_cpu", "grouped_layout", "c", "recipe", "compiled_dims", "use_psum_layout"],
    "bf16_gemm_nt": ["a", "b", "d", "c", "compiled_dims"],
    "cublaslt_gemm_nt": ["a", "b", "d", "c"],
    "transform_sf_into_required_layout": ["sf", "mn", "k", "recipe", "num_groups", "is_sfa", "disable_ue8m0_cast", "psum_layout"],
}
# What vLLM and SGLang look up by name on an installed deep_gemm.
ENGINE_NAMES = [
    "fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "fp8_m_grouped_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
    "get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor", "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout", "get_k_alignment_for_contiguous_layout", "transform_sf_into_required_layout",
    "get_num_sms", "set_num_sms", "get_tma_aligned_size", "bf16_gemm_nt", "set_pdl", "get_pdl", "set_tc_util", "get_tc_util",
    "set_compile_mode", "get_compile_mode", "ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int",
    "per_token_cast_to_fp8", "per_block_cast_to_fp8", "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_mk_alignment_for_contiguous_layout", "get_mn_major_tma_aligned_packed_ue8m0_tensor", "k_grouped_fp8_gemm_nt_contiguous",
]


@pytest.mark.parametrize("name", sorted(DEEPGEMM_SIGNATURES))
def test_signatures_are_deepgemms(name):
    params = list(inspect.signature(getattr(dg, name)).parameters)
    assert params[: len(DEEPGEMM_SIGNATURES[name])] == DEEPGEMM_SIGNATURES[name]


def test_every_name_engines_look_up_exists():
    missing = [n for n in ENGINE_NAMES if not callable(getattr(dg, n, None))]
    assert not missing
    assert dg.fp8_m_grouped_gemm_nt_masked is dg.m_grouped_fp8_gemm_nt_masked
    for module in ("cutegen.deep_gemm.utils.layout", "cutegen.deep_gemm.utils.math", "cutegen.deep_gemm.testing"):
        importlib.import_module(module)
    from cutegen.deep_gemm.testing import bench_kineto, calc_diff, count_bytes, get_arch_major, ignore_env  # noqa: F401


def test_math_helpers():
    assert (dg.ceil_div(129, 128), dg.align(129, 128), dg.get_tma_aligned_size(5, 4), dg.get_tma_aligned_size(5, 2)) == (2, 256, 8, 8)
    x = torch.tensor([0.3, 1.0, 1.5, 448.0, 1e-30])
    assert dg.ceil_to_ue8m0(x).tolist() == [0.5, 1.0, 2.0, 512.0, 2.0 ** -99]
    packed = dg.pack_ue8m0_to_int(torch.tensor([[1.0, 2.0, 0.5, 4.0]]))
    assert packed.view(torch.uint8).tolist() == [[127, 128, 126, 129]]
    assert torch.equal(dg.utils.unpack_ue8m0_from_int(packed), torch.tensor([[1.0, 2.0, 0.5, 4.0]]))
    with pytest.raises(ValueError, match="powers of two"):
        dg.pack_ue8m0_to_int(torch.tensor([[1.0, 3.0, 1.0, 1.0]]))


@pytest.mark.parametrize("shape", [(1, 128), (300, 7168), (257, 576)])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_casts_equal_cutegens_references(shape, use_ue8m0):
    """DeepGEMM's casts and cutegen's executable quantize specification agree bit for bit."""
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(shape[0])) * 5).to(torch.bfloat16)
    fmt = "ue8m0" if use_ue8m0 else "fp32"
    q, s = dg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    rq, rs = quant_reference.per_token_quant_fp8_ref(x, scale_format=fmt)
    rs = quant_reference.unpack_ue8m0(rs, s.shape[1]) if use_ue8m0 else rs
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    q, s = dg.per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    rq, rs = quant_reference.per_block_quant_fp8_ref(x, scale_format=fmt)
    rs = quant_reference.unpack_ue8m0(rs, s.shape[1]) if use_ue8m0 else rs
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)


def test_fp4_cast_round_trip():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    packed, sf = dg.per_token_cast_to_fp4(x, use_ue8m0=False, gran_k=32)
    assert packed.shape == (64, 128) and sf.shape == (64, 8)
    back = dg.utils.cast_back_from_fp4(packed, sf, gran_k=32)
    # e2m1 keeps at most a quarter of a block's amax as its rounding error
    assert float((back - x).abs().max()) <= float(x.abs().max()) / 4
    twice = dg.transpose_packed_fp4(dg.transpose_packed_fp4(packed))
    assert torch.equal(twice, packed)


def test_layouts():
    sf = torch.randn(2, 5, 3)
    aligned = dg.get_mn_major_tma_aligned_tensor(sf)
    assert aligned.stride() == (3 * 8, 1, 8) and torch.equal(aligned, sf)
    assert dg.get_mn_major_tma_aligned_tensor(aligned) is aligned
    one_block = torch.randn(4096, 1)  # DeepGEMM's strides literally, also for a single K block
    assert dg.get_mn_major_tma_aligned_tensor(one_block).stride() == (1, 4096)
    assert dg.get_mn_major_tma_aligned_tensor(torch.randn(2, 4097, 1)).stride() == (4100, 1, 4100)
    pow2 = dg.ceil_to_ue8m0(torch.rand(5, 7) + 0.1)
    packed = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(pow2)
    assert packed.shape == (5, 2) and packed.stride() == (1, 8)
    assert packed[:, 0].view(torch.uint8).view(5, 4)[:, :4].tolist() == (pow2[:, :4].view(torch.int32) >> 23).tolist()
    assert dg.transform_sf_into_required_layout(sf[0], 5, 384, (1, 128, 128), is_sfa=True).stride() == (1, 8)
    block = torch.randn(3, 4).t()
    assert dg.transform_sf_into_required_layout(block, 512, 384, (1, 128, 128), is_sfa=False).is_contiguous()
    per_row = dg.transform_sf_into_required_layout(torch.arange(10, dtype=torch.int32).view(5, 2), 5, 1024, (1, 128), None)
    assert per_row.stride() == (1, 8) and per_row.tolist() == torch.arange(10).view(5, 2).tolist()  # SM100 (INT, 1, 128)
    with pytest.raises(NotImplementedError, match=r"packed UE8M0 scales of granularity \(mn 128"):
        dg.transform_sf_into_required_layout(torch.zeros(1, 1, dtype=torch.int32), 5, 384, (1, 128, 128), is_sfa=False)
    with pytest.raises(ValueError, match=r"must have shape \[5, 2\]"):
        dg.transform_sf_into_required_layout(torch.zeros(5, 1, dtype=torch.int32), 5, 1024, (1, 128), None)
    with pytest.raises(NotImplementedError, match="SM100 k-grouped"):
        dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, None, [128], 128, 128)


def test_alignment_setting_is_shared_and_checked():
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    dg.set_mk_alignment_for_contiguous_layout(64)
    try:
        assert dg.get_m_alignment_for_contiguous_layout() == dg.get_k_alignment_for_contiguous_layout() == 64
        with pytest.raises(ValueError, match="need 128-aligned"):
            dg.utils.layout.check_mk_alignment("m_grouped_fp8_gemm_nt_contiguous")
    finally:
        dg.set_mk_alignment_for_contiguous_layout(128)


def _fp8(*shape):
    return torch.zeros(shape, dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1)), (_fp8(8, 128), torch.ones(1, 1)), torch.empty(4, 8, dtype=torch.bfloat16),
                                c=torch.empty(4, 8, dtype=torch.bfloat16)), NotImplementedError, "C with recipe"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1)), (_fp8(8, 128), torch.ones(1, 1)), torch.empty(4, 8)),
         ValueError, "'d' must be torch.bfloat16"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1)), (_fp8(8, 128), torch.ones(8, 1)), torch.empty(4, 8),
                                recipe=(1, 1, 32)), NotImplementedError, r"recipe \(1, 1, 32\)"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1)), (_fp8(8, 128), torch.ones(1, 1)), torch.empty(4, 8),
                                recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(128, 128)), ValueError, "not both"),
        (lambda: dg.fp8_gemm_nt((torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 1)), (_fp8(8, 128), torch.ones(1, 1)),
                                torch.empty(4, 8, dtype=torch.bfloat16)), NotImplementedError, "FP4"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1, dtype=torch.int32)), (_fp8(8, 128), torch.ones(1, 1)),
                                torch.empty(4, 8, dtype=torch.bfloat16)), ValueError, "both be packed UE8M0"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1, dtype=torch.int32)), (_fp8(8, 128), torch.ones(1, 1, dtype=torch.int32)),
                                torch.empty(4, 8), c=torch.empty(4, 8, dtype=torch.bfloat16), recipe=(1, 128, 128)),
         ValueError, "argument 'c' must be a torch.float32"),
        (lambda: dg.fp8_gemm_nt((_fp8(4, 128), torch.ones(4, 1, dtype=torch.int32)), (_fp8(8, 128), torch.ones(1, 1, dtype=torch.int32)),
                                torch.empty(4, 8, dtype=torch.bfloat16)), ValueError, r"8 rows under recipe \(1, 1, 128\)"),
        (lambda: dg.fp8_fp4_gemm_nt((_fp8(4, 128), torch.ones(4, 1, dtype=torch.int32)),
                                    (torch.zeros(8, 64, dtype=torch.int8), torch.ones(8, 1, dtype=torch.int32)),
                                    torch.empty(4, 8, dtype=torch.bfloat16)), NotImplementedError, r"recipe_b=\(1, 32\)"),
        (lambda: dg.fp8_fp4_gemm_nt((_fp8(4, 128), torch.ones(4, 1)), (torch.zeros(8, 64, dtype=torch.int8), torch.ones(8, 1)),
                                    torch.empty(4, 8, dtype=torch.bfloat16), recipe_a=(1, 128), recipe_b=(1, 32)),
         NotImplementedError, "torch.float32 scales with FP4"),
        (lambda: dg.m_grouped_fp8_gemm_nt_masked((_fp8(2, 4, 128), torch.ones(2, 4, 1, dtype=torch.int32)),
                                                 (_fp8(2, 8, 128), torch.ones(2, 1, 1)),
                                                 torch.empty(2, 4, 8, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32), 4),
         ValueError, "must both be packed UE8M0"),
        (lambda: dg.fp8_gemm_nt(_fp8(4, 128), (_fp8(8, 128), torch.ones(1, 1)), torch.empty(4, 8, dtype=torch.bfloat16)),
         TypeError, "'a' must be a \\(data, scales\\) tuple"),
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous((_fp8(128, 128), torch.ones(128, 1)), (_fp8(2, 8, 128), torch.ones(2, 1, 1)),
                                                     torch.empty(128, 8, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.int32),
                                                     expected_m_for_psum_layout=64), ValueError, "only with use_psum_layout"),
        (lambda: dg.k_grouped_fp8_gemm_nt_contiguous((_fp8(128 * 4), torch.ones(4, 1)), (_fp8(128 * 4), torch.ones(4, 1)),
                                                     torch.empty(1, 4, 4), [100], torch.zeros(1, dtype=torch.int32)),
         ValueError, "multiple of 128"),
        (lambda: dg.k_grouped_fp8_gemm_nt_contiguous((_fp8(128 * 4), torch.ones(4, 1)), (_fp8(128 * 4), torch.ones(4, 1)),
                                                     torch.empty(1, 4, 4), [128], torch.zeros(1, dtype=torch.int32),
                                                     use_psum_layout=True), NotImplementedError, "use_psum_layout"),
        (lambda: dg.k_grouped_fp8_gemm_tn_contiguous((_fp8(256, 16), torch.ones(2, 16)), (_fp8(256, 32), torch.ones(16, 2)),
                                                     torch.empty(2, 16, 32), [128, 128], torch.zeros(2, dtype=torch.int32)),
         ValueError, r"'b' scales must be \[Σk/128, 32\] = \[2, 32\]"),
        (lambda: dg.k_grouped_fp8_gemm_tn_contiguous((_fp8(16, 256), torch.ones(2, 16)), (_fp8(256, 32), torch.ones(2, 32)),
                                                     torch.empty(2, 16, 32), [128, 128], torch.zeros(2, dtype=torch.int32)),
         ValueError, r"'a' data must be \[Σk, 16\]"),
        (lambda: dg.bf16_gemm_nt(torch.zeros(4, 16, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16), torch.empty(4, 8),
                                 c=torch.empty(4, 8, dtype=torch.bfloat16)),
         ValueError, "argument 'c' must be a torch.float32"),
        (lambda: dg.fp8_mqa_logits(), NotImplementedError, "fp8_mqa_logits"),
        (lambda: dg.fp8_einsum("bhr,hdr->bhd"), NotImplementedError, "einsum"),
    ],
    ids=["c-with-1d2d", "d-dtype", "fp4-recipe", "two-recipes", "fp4-data", "ue8m0-mixed", "ue8m0-fp32-d", "ue8m0-sfb-rows", "fp4-default-recipe", "fp4-fp32-scales",
         "ue8m0-grouped-mixed", "not-a-tuple", "psum-hint",
         "k-not-aligned", "k-psum", "tn-scales", "tn-tokens-first", "bf16-c-dtype", "mqa", "einsum"],
)
def test_refused_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_empty_problems_follow_deepgemm(dg_k0=None):
    d = torch.full((4, 8), 7.0)
    c = torch.full((4, 8), 2.0)
    dg.fp8_gemm_nt((_fp8(4, 0), torch.ones(4, 0)), (_fp8(8, 0), torch.ones(8, 0)), d, c=c, recipe=(1, 1, 128))
    assert bool((d == 2.0).all())  # K == 0: D = C
    d = torch.full((4, 8), 7.0, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((_fp8(4, 0), torch.ones(4, 0)), (_fp8(8, 0), torch.ones(1, 0)), d)
    assert bool((d == 0).all())  # K == 0, no C: D = 0
    dg.fp8_gemm_nt((_fp8(0, 128), torch.ones(0, 1)), (_fp8(8, 128), torch.ones(1, 1)), torch.empty(0, 8, dtype=torch.bfloat16))


def test_compat_distribution_reexports_under_deepgemms_name():
    code = (
        "import deep_gemm, cutegen.deep_gemm as c\n"
        "from deep_gemm.utils import layout, per_token_cast_to_fp4, get_mk_alignment_for_contiguous_layout\n"
        "from deep_gemm.testing import bench_kineto, calc_diff\n"
        "import deep_gemm.utils.math\n"
        "assert deep_gemm.fp8_gemm_nt is c.fp8_gemm_nt and layout is c.utils.layout\n"
        "deep_gemm.set_mk_alignment_for_contiguous_layout(64); assert c.get_mk_alignment_for_contiguous_layout() == 64\n"
        "print(deep_gemm.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "PYTHONPATH": str(COMPAT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.6.1"


def test_packed_ue8m0_scales_reach_the_runtime_in_its_layout(monkeypatch):
    """DeepGEMM's SM100 call (int32 scales, recipe (1, 1, 128) by default: a scale per row of A and
    of B) reaches `fp8_ops.fp8_gemm_nt` with both scales MN-major and TMA-aligned; recipe
    (1, 128, 128) passes 128 x 128 weight scales row-major."""
    from cutegen.deep_gemm import gemm

    seen = {}
    monkeypatch.setattr(gemm.fp8_ops, "fp8_gemm_nt", lambda qa, sfa, qb, sfb, out: seen.update(sfa=sfa, sfb=sfb, out=out))
    m, n, k = 6, 200, 1024
    sfa = torch.arange(m * 2, dtype=torch.int32).view(m, 2)
    sfb = torch.arange(n * 2, dtype=torch.int32).view(n, 2)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((_fp8(m, k), sfa), (_fp8(n, k), sfb), d)
    assert seen["sfa"].stride() == (1, 8) and torch.equal(seen["sfa"], sfa)
    assert seen["sfb"].stride() == (1, 200) and torch.equal(seen["sfb"], sfb) and seen["out"] is d
    blocks = torch.arange(4, dtype=torch.int32).view(2, 2)
    dg.fp8_gemm_nt((_fp8(m, k), sfa), (_fp8(n, k), blocks.t().contiguous().t()), d, recipe=(1, 128, 128))
    assert seen["sfb"].is_contiguous() and torch.equal(seen["sfb"], blocks)


def test_fp8_fp4_call_reaches_the_runtime_with_fp4_b(monkeypatch):
    """DeepGEMM's FP8 x FP4 call (packed e2m1 B, recipe_a (1, 128), recipe_b (1, 32), packed UE8M0
    scales) reaches `fp8_ops.fp8_gemm_nt` with B as given and both scales MN-major TMA-aligned."""
    from cutegen.deep_gemm import gemm

    seen = {}
    monkeypatch.setattr(gemm.fp8_ops, "fp8_gemm_nt", lambda qa, sfa, qb, sfb, out: seen.update(qb=qb, sfa=sfa, sfb=sfb))
    m, n, k = 3, 136, 512
    qb = torch.zeros(n, k // 2, dtype=torch.int8)
    sfa = torch.arange(m, dtype=torch.int32).view(m, 1)
    sfb = torch.arange(n * 4, dtype=torch.int32).view(n, 4)
    dg.fp8_fp4_gemm_nt((_fp8(m, k), sfa), (qb, sfb), torch.empty(m, n, dtype=torch.bfloat16),
                       recipe_a=(1, 128), recipe_b=(1, 32))
    assert seen["qb"] is qb and torch.equal(seen["sfb"], sfb) and seen["sfb"].stride() == (1, 136)
    assert torch.equal(seen["sfa"], sfa)


def test_grouped_sm100_calls_reach_the_runtime_in_its_layouts(monkeypatch):
    """DeepGEMM's SM100 M-grouped calls: packed UE8M0 scales with FP8 experts (SFB per row by
    default, per block with recipe (1, 128, 128)) and FP4 experts (recipe_a (1, 128), recipe_b
    (1, 32)) reach `grouped_ops` with every scale tensor MN-major TMA-aligned (per group) or, per
    block, contiguous."""
    from cutegen.deep_gemm import gemm

    seen = {}
    monkeypatch.setattr(gemm.grouped_ops, "m_grouped_fp8_gemm_nt_masked",
                        lambda qa, sfa, qb, sfb, masked_m, expected_m, out: seen.update(qb=qb, sfa=sfa, sfb=sfb))
    monkeypatch.setattr(gemm.grouped_ops, "m_grouped_fp8_gemm_nt_contiguous",
                        lambda qa, sfa, qb, sfb, rows, out, zero_padding: seen.update(qb=qb, sfa=sfa, sfb=sfb))
    g, m, n, k = 2, 6, 136, 512
    d = torch.empty(g, m, n, dtype=torch.bfloat16)
    masked_m = torch.zeros(g, dtype=torch.int32)
    sfa = torch.arange(g * m, dtype=torch.int32).view(g, m, 1)
    sfb = torch.arange(g * n, dtype=torch.int32).view(g, n, 1)
    dg.m_grouped_fp8_gemm_nt_masked((_fp8(g, m, k), sfa), (_fp8(g, n, k), sfb), d, masked_m, 4)
    assert seen["sfa"].stride() == (8, 1, 8) and torch.equal(seen["sfa"], sfa)
    assert torch.equal(seen["sfb"], sfb)
    blocks = torch.arange(g * 2, dtype=torch.int32).view(g, 2, 1)
    dg.m_grouped_fp8_gemm_nt_masked((_fp8(g, m, k), sfa), (_fp8(g, n, k), blocks), d, masked_m, 4, recipe=(1, 128, 128))
    assert seen["sfb"].is_contiguous() and torch.equal(seen["sfb"], blocks)
    qb = torch.zeros(g, n, k // 2, dtype=torch.uint8)
    sfb4 = torch.arange(g * n * 4, dtype=torch.int32).view(g, n, 4)
    dg.m_grouped_fp8_fp4_gemm_nt_masked((_fp8(g, m, k), sfa), (qb, sfb4), d, masked_m, 4, recipe_a=(1, 128), recipe_b=(1, 32))
    assert seen["qb"] is qb and seen["sfb"].stride() == (4 * 136, 1, 136) and torch.equal(seen["sfb"], sfb4)
    with pytest.raises(NotImplementedError, match="recipe_b=\\(1, 32\\)"):
        dg.m_grouped_fp8_fp4_gemm_nt_masked((_fp8(g, m, k), sfa), (qb, sfb4), d, masked_m, 4)
    rows = torch.full((256,), -1, dtype=torch.int32)
    dg.m_grouped_fp8_gemm_nt_contiguous((_fp8(256, k), torch.zeros(256, 1, dtype=torch.int32)), (_fp8(g, n, k), sfb),
                                        torch.empty(256, n, dtype=torch.bfloat16), rows)
    from cutegen.runtime.quant_reference import is_mn_major_tma_aligned

    assert is_mn_major_tma_aligned(seen["sfa"]) and torch.equal(seen["sfb"], sfb)


def test_sm100_weight_gradient_call_reaches_the_runtime(monkeypatch):
    """DeepGEMM's SM100 1D1D call (packed UE8M0 per row on both sides, fp32 D, optional C)
    reaches `fp8_ops.fp8_wgrad_gemm_nt` with MN-major scales, D zeroed first when there is no C."""
    from cutegen.deep_gemm import gemm

    seen = {}
    monkeypatch.setattr(gemm.fp8_ops, "fp8_wgrad_gemm_nt",
                        lambda qa, sfa, qb, sfb, d, c: seen.update(sfa=sfa, sfb=sfb, d=d, c=c))
    m, n, k = 5, 9, 1024
    sfa = torch.arange(m * 2, dtype=torch.int32).view(m, 2)
    sfb = torch.arange(n * 2, dtype=torch.int32).view(n, 2)
    d = torch.full((m, n), 7.0)
    dg.fp8_gemm_nt((_fp8(m, k), sfa), (_fp8(n, k), sfb), d)
    assert seen["c"] is None and seen["d"] is d and bool((d == 0).all())
    assert seen["sfa"].stride() == (1, 8) and seen["sfb"].stride() == (1, 12) and torch.equal(seen["sfb"], sfb)
    c = torch.ones(m, n)
    dg.fp8_gemm_nt((_fp8(m, k), sfa), (_fp8(n, k), sfb), d, c=c)
    assert seen["c"] is c


@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128)])
@pytest.mark.parametrize("d_dtype, with_c", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)])
def test_ue8m0_calls_with_fp32_d_or_c_compose_the_weight_gradient(monkeypatch, recipe, d_dtype, with_c):
    """DeepGEMM's SM100 calls that no GEMM kernel serves directly (fp32 D under either recipe, C
    with a bf16 D) run the weight-gradient kernel with B's scales per row (a 128-row block's scale
    repeated over its rows) and, for a bf16 D, an fp32 temporary rounded once. The kernel is
    replaced here by the float64 product of what it is given; the result must be C + A·Bᵀ of the
    caller's scales."""
    from cutegen.runtime import fp8_ops, mx_reference as mx

    def dequant(q, words):
        scales = mx.ue8m0_to_float(mx.ue8m0_bytes(words, -(-q.shape[1] // 128))).double()
        return q.double() * scales.repeat_interleave(128, dim=1)[:, : q.shape[1]]

    def fake_wgrad(qa, sfa, qb, sfb, d, c=None):
        assert d.dtype == torch.float32 and sfb.shape[0] == qb.shape[0]
        if c is not None and c.data_ptr() != d.data_ptr():
            d.copy_(c)
        d += (dequant(qa, sfa) @ dequant(qb, sfb).T).float()
        return d

    monkeypatch.setattr(fp8_ops, "fp8_wgrad_gemm_nt", fake_wgrad)
    g = torch.Generator().manual_seed(3)
    m, n, k = 8, 200, 640
    qa = (torch.randn(m, k, generator=g) * 8).to(torch.float8_e4m3fn)
    qb = (torch.randn(n, k, generator=g) * 8).to(torch.float8_e4m3fn)
    words = lambda rows: torch.randint(120, 134, (rows, 8), generator=g, dtype=torch.uint8).view(torch.int32)  # noqa: E731
    sfa = words(m)[:, :2]
    sfb = words(n if recipe == (1, 1, 128) else -(-n // 128))[:, :2]
    sfb_rows = sfb if recipe == (1, 1, 128) else sfb.repeat_interleave(128, dim=0)[:n]
    c = torch.randn(m, n, generator=g).to(d_dtype) if with_c else None
    d = torch.full((m, n), float("nan"), dtype=d_dtype)
    dg.fp8_gemm_nt((qa, sfa), (qb, sfb), d, c=c, recipe=recipe)
    product = (dequant(qa, sfa) @ dequant(qb, sfb_rows).T).float()
    if d_dtype == torch.bfloat16:  # C + A·Bᵀ in fp32, rounded to bf16 once
        assert torch.equal(d, (c.float() + product).to(torch.bfloat16))
    else:
        assert torch.equal(d, product + c if with_c else product)
