"""CPU tier: NVFP4 — the reference quantiser and product (`mx_reference`), the blocked layout of
16-element scales as the kernels load it, and `nvfp4_gemm_nt`'s input validation on fake CUDA
tensors (each bad input refused naming the argument, before anything could be launched)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cutegen.runtime import mx_reference as mx  # noqa: E402
from cutegen.runtime import nvfp4_ops  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402

E2M1_MAGNITUDES = torch.tensor(mx.E2M1_VALUES)


def exact_nvfp4(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random codes whose every 16-element block holds a ±6, random E4M3 scales and a power-of-two
    global scale: (x, codes, scales, global scale) with x exactly e2m1 · s / global scale."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    codes.view(rows, k // 16, 16)[:, :, 0] = torch.where(
        torch.rand(rows, k // 16, generator=g) < 0.5, torch.tensor(7, dtype=torch.uint8), torch.tensor(15, dtype=torch.uint8)
    )
    scales = (torch.rand(rows, k // 16, generator=g) * 400 + 0.5).to(torch.float8_e4m3fn)
    gs = torch.tensor([2.0**7])
    x = mx.e2m1_to_float(codes) * scales.float().repeat_interleave(16, dim=1) / gs
    return x, codes, scales, gs


def test_quantiser_recovers_exact_nvfp4_codes_and_scales():
    x, codes, scales, gs = exact_nvfp4(130, 256, seed=1)
    packed, sf = mx.quant_nvfp4_ref(x, gs)
    # -0.0 has code 8; the quantiser writes +0 (code 0), as the PTX conversion does.
    expected = torch.where(codes == 8, torch.zeros_like(codes), codes)
    assert torch.equal(mx.unpack_e2m1(packed), expected)
    assert torch.equal(sf.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(mx.dequant_nvfp4(packed, sf, gs), x)


def test_quantiser_rounds_saturates_and_poisons_like_the_recipe():
    """Scales are E4M3 of amax / 6 · global scale (ties to even, at most 448); codes round to the
    nearest E2M1 value; a block with NaN or Inf gets the NaN scale and codes 7; zeros stay zero."""
    x = torch.zeros(4, 32)
    x[0, :16] = torch.linspace(-3.0, 3.0, 16)
    x[1, 3] = float("nan")
    x[2, :16] = 1e6  # amax / 6 · global scale past 448: saturates
    gs = torch.tensor([1.0])
    packed, sf = mx.quant_nvfp4_ref(x, gs)
    s = sf.float()
    assert float(s[0, 0]) == float(torch.tensor(0.5).to(torch.float8_e4m3fn).float())
    assert torch.isnan(s[1, 0]) and bool((mx.unpack_e2m1(packed)[1, :16] == 7).all())
    assert float(s[2, 0]) == 448.0
    assert float(s[3, 0]) == 0.0 and bool((mx.unpack_e2m1(packed)[3] == 0).all())
    values = mx.e2m1_to_float(mx.unpack_e2m1(packed))[0, :16]
    scaled = x[0, :16] / 0.5
    nearest = E2M1_MAGNITUDES[(scaled.abs().unsqueeze(1) - E2M1_MAGNITUDES).abs().argmin(dim=1)] * scaled.sign()
    assert torch.equal(values.abs(), nearest.abs())


def test_global_scale_maps_the_largest_block_to_e4m3_max():
    x = torch.randn(64, 128) * 3
    gs = mx.nvfp4_global_scale(x)
    _, sf = mx.quant_nvfp4_ref(x, gs)
    assert float(sf.float().max()) == 448.0
    assert float(mx.nvfp4_global_scale(torch.zeros(2, 16))) == 1.0


def test_product_reference_is_the_dequantised_product_times_alpha():
    a = torch.randn(70, 512)
    b = torch.randn(90, 512)
    ga, gb = mx.nvfp4_global_scale(a), mx.nvfp4_global_scale(b)
    qa, sa = mx.quant_nvfp4_ref(a, ga)
    qb, sb = mx.quant_nvfp4_ref(b, gb)
    alpha = 1.0 / (ga * gb)
    ref = mx.nvfp4_gemm_ref(qa, sa, qb, sb, alpha)
    dq = mx.dequant_nvfp4(qa, sa, ga).double() @ mx.dequant_nvfp4(qb, sb, gb).double().T
    # dequant_nvfp4 divides by the global scale in fp32: one rounding per element.
    assert float((ref - dq).norm() / ref.norm()) < 1e-6
    exact = a.double() @ b.double().T
    # FP4 keeps one mantissa bit: about 0.1 relative error over K = 512.
    assert float((ref - exact).norm() / exact.norm()) < 0.2


def test_a_k_tile_of_a_row_block_is_one_contiguous_chunk_of_the_blocked_scales():
    """What the kernels' one bulk copy per 128 rows and K tile relies on: the 16-element scales of
    rows [128 r, 128 r + 128) and K tile t (256 elements: 16 scales, 4 atoms) are bytes
    [(r · tiles + t) · 2048, + 2048) of the blocked layout, the tile's own blocked layout."""
    rows, k = 300, 1024
    tiles = k // 256
    sf = torch.randint(0, 255, (rows, k // 16), dtype=torch.uint8)
    blocked = mx.to_blocked(sf)
    padded = torch.zeros(-(-rows // 128) * 128, k // 16, dtype=torch.uint8)
    padded[:rows] = sf
    for r in range(-(-rows // 128)):
        for t in range(tiles):
            chunk = blocked[(r * tiles + t) * 2048:(r * tiles + t + 1) * 2048]
            assert torch.equal(chunk, mx.to_blocked(padded[128 * r:128 * (r + 1), 16 * t:16 * (t + 1)].contiguous()))


# ---- validation ------------------------------------------------------------------------------

M, N, K = 200, 384, 512


def call(**changes):
    padded = lambda rows: -(-rows // 128) * 128  # noqa: E731
    with FakeTensorMode():
        ops = {
            "a": torch.empty(M, K // 2, dtype=torch.uint8, device="cuda"),
            "sfa": torch.empty(padded(M), K // 16, dtype=torch.float8_e4m3fn, device="cuda"),
            "b": torch.empty(N, K // 2, dtype=torch.uint8, device="cuda"),
            "sfb": torch.empty(padded(N) * K // 16, dtype=torch.uint8, device="cuda"),
            "alpha": torch.empty(1, dtype=torch.float32, device="cuda"),
            "out": None,
        }
        ops.update({name: make() if callable(make) else make for name, make in changes.items()})
        return nvfp4_ops._check_meta(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["alpha"], ops["out"])


def test_valid_inputs_pass():
    assert call() == (M, N, K)
    assert call(out=lambda: torch.empty(M, N, dtype=torch.bfloat16, device="cuda")) == (M, N, K)


@pytest.mark.parametrize("changes, arg, words", [
    ({"a": lambda: torch.empty(M, K, dtype=torch.float8_e4m3fn, device="cuda")}, "a", "FP4 packed"),
    ({"b": lambda: torch.empty(N, K // 4, dtype=torch.uint8, device="cuda")}, "b", "K/2"),
    ({"a": lambda: torch.empty(M, 192, dtype=torch.uint8, device="cuda"),
      "b": lambda: torch.empty(N, 192, dtype=torch.uint8, device="cuda")}, "a", "multiple of 256"),
    ({"a": lambda: torch.empty_strided((M, K // 2), (K // 2 + 16, 1), dtype=torch.uint8, device="cuda")}, "a",
     "row stride"),
    ({"sfa": lambda: torch.empty(M, K // 16, dtype=torch.float8_e4m3fn, device="cuda")}, "sfa", "padded to 256"),
    ({"sfb": lambda: torch.empty(384, K // 16, dtype=torch.float32, device="cuda")}, "sfb", "E4M3"),
    ({"sfb": lambda: torch.empty(K // 16, 384, dtype=torch.uint8, device="cuda").t()}, "sfb", "contiguous"),
    ({"alpha": lambda: torch.empty(2, dtype=torch.float32, device="cuda")}, "alpha", "one fp32"),
    ({"alpha": lambda: torch.empty(1, dtype=torch.float16, device="cuda")}, "alpha", "one fp32"),
    ({"out": lambda: torch.empty(M, N + 8, dtype=torch.bfloat16, device="cuda")}, "out", "shape"),
])
def test_bad_inputs_are_refused_naming_the_argument(changes, arg, words):
    with pytest.raises(InputError, match=f"nvfp4_gemm_nt: argument '{arg}'.*{words}"):
        call(**changes)


def test_generator_and_runtime_name_the_packed_fp4_tma_type_alike():
    """The manifest's TMA dtype of FP4 packed in shared memory is written by the generator
    (`cutegen.schedules.spec`) and read by the runtime, which imports nothing of the generator:
    the two names must agree."""
    from cutegen.runtime import params
    from cutegen.schedules import spec

    assert spec.TMA_FP4_PACKED == params.TMA_FP4_PACKED
