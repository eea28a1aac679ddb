"""GPU check of the SiLU epilogue's division: inside the operand range `cutegen.templates.fast_division`
states, its straight-line PTX sequence gives the bits of ``div.rn.f32``, on tens of millions of
random operands, every divisor mantissa in [1, 2) and the range's edges.

The sequence is JIT-compiled from PTX by the driver next to ``div.rn.f32`` in one kernel; the
GPU's own IEEE division is the reference.
"""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from cutegen.templates.fast_division import (  # noqa: E402
    ABS_MASK, HIGHEST_DIVIDEND_BITS, HIGHEST_DIVISOR, LOWEST_DIVIDEND_BITS, LOWEST_DIVISOR, div_fast_ptx,
)

pytestmark = pytest.mark.gpu

THREADS = 256


def _kernel_ptx() -> str:
    """quotients(x, d, fast, ieee, n): fast[i] = the sequence's x[i] / d[i], ieee[i] = div.rn.f32."""
    return "\n".join([
        ".version 8.0", ".target sm_90", ".address_size 64",
        ".visible .entry quotients(.param .u64 px, .param .u64 pd, .param .u64 pfast, "
        ".param .u64 pieee, .param .u32 n)",
        "{",
        ".reg .b32 %r<6>; .reg .b64 %rd<10>; .reg .f32 %f<4>; .reg .pred %p;",
        "mov.u32 %r0, %ctaid.x; mov.u32 %r1, %ntid.x; mov.u32 %r2, %tid.x;",
        "mad.lo.u32 %r3, %r0, %r1, %r2;",
        "ld.param.u32 %r4, [n]; setp.ge.u32 %p, %r3, %r4; @%p ret;",
        "mul.wide.u32 %rd0, %r3, 4;",
        "ld.param.u64 %rd1, [px]; add.u64 %rd1, %rd1, %rd0; ld.global.f32 %f0, [%rd1];",
        "ld.param.u64 %rd2, [pd]; add.u64 %rd2, %rd2, %rd0; ld.global.f32 %f1, [%rd2];",
        "div.rn.f32 %f2, %f0, %f1;",
        div_fast_ptx("%f3", "%f0", "%f1"),
        "ld.param.u64 %rd3, [pfast]; add.u64 %rd3, %rd3, %rd0; st.global.f32 [%rd3], %f3;",
        "ld.param.u64 %rd4, [pieee]; add.u64 %rd4, %rd4, %rd0; st.global.f32 [%rd4], %f2;",
        "ret;",
        "}",
    ]) + "\n"


@pytest.fixture(scope="module")
def quotients():
    """(x, d) -> (the sequence's quotients, div.rn.f32's), on the current device."""
    from cuda.bindings import driver as cuda

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context current
    err, module = cuda.cuModuleLoadData(_kernel_ptx().encode() + b"\0")
    assert err == cuda.CUresult.CUDA_SUCCESS, err
    err, function = cuda.cuModuleGetFunction(module, b"quotients")
    assert err == cuda.CUresult.CUDA_SUCCESS, err

    def run(x: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, d = x.contiguous(), d.contiguous()
        fast, ieee = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        args = ((x.data_ptr(), d.data_ptr(), fast.data_ptr(), ieee.data_ptr(), n),
                (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32))
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = cuda.cuLaunchKernel(function, (n + THREADS - 1) // THREADS, 1, 1, THREADS, 1, 1, 0, stream, args, 0)
        assert err == cuda.CUresult.CUDA_SUCCESS, err
        torch.cuda.synchronize()
        return fast, ieee

    yield run
    cuda.cuModuleUnload(module)


def _in_range(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    ax = x.view(torch.int32) & ABS_MASK
    return (ax >= LOWEST_DIVIDEND_BITS) & (ax <= HIGHEST_DIVIDEND_BITS) & (d >= LOWEST_DIVISOR) & (d <= HIGHEST_DIVISOR)


def _float_with_exponents(n: int, low: int, high: int, g: torch.Generator, signed: bool) -> torch.Tensor:
    """n floats with random mantissas and unbiased exponents in [low, high] (and random signs)."""
    exponent = torch.randint(low + 127, high + 128, (n,), generator=g, device="cuda", dtype=torch.int32)
    mantissa = torch.randint(0, 1 << 23, (n,), generator=g, device="cuda", dtype=torch.int32)
    bits = (exponent << 23) | mantissa
    if signed:
        bits = bits | (torch.randint(0, 2, (n,), generator=g, device="cuda", dtype=torch.int32) << 31)
    return bits.view(torch.float32)


def _assert_same_bits(fast: torch.Tensor, ieee: torch.Tensor, x: torch.Tensor, d: torch.Tensor) -> None:
    differ = fast.view(torch.int32) != ieee.view(torch.int32)
    if differ.any():
        i = int(differ.nonzero()[0])
        raise AssertionError(
            f"{int(differ.sum())} of {differ.numel()} quotients differ, e.g. {x[i].item()!r} / {d[i].item()!r}: "
            f"sequence {fast[i].item()!r}, div.rn {ieee[i].item()!r}"
        )


@pytest.mark.parametrize("seed", range(4))
def test_random_operands_over_the_whole_range(quotients, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 1 << 24
    x = _float_with_exponents(n, -40, 63, g, signed=True)
    d = _float_with_exponents(n, 0, 63, g, signed=False)
    assert bool(_in_range(x, d).all())
    _assert_same_bits(*quotients(x, d), x, d)


def test_silu_operands(quotients):
    """x and 1 + exp(-x) as SiLU divides them, over |x| in [2^-40, 44]."""
    g = torch.Generator(device="cuda").manual_seed(7)
    n = 1 << 24
    x = torch.cat([_float_with_exponents(n // 2, -40, 5, g, signed=True),
                   (torch.rand(n // 2, generator=g, device="cuda") * 88 - 44)])
    d = 1 + torch.exp(-x)
    keep = _in_range(x, d)
    x, d = x[keep], d[keep]
    assert x.numel() > n * 0.99
    _assert_same_bits(*quotients(x, d), x, d)


def test_every_divisor_mantissa(quotients):
    """Every d in [1, 2), against dividends of random mantissas at both ends and the middle of the range."""
    g = torch.Generator(device="cuda").manual_seed(11)
    d = (torch.arange(1 << 23, device="cuda", dtype=torch.int32) | (127 << 23)).view(torch.float32)
    for exponent in (-40, -1, 0, 30, 63):
        x = _float_with_exponents(d.numel(), exponent, exponent, g, signed=True)
        _assert_same_bits(*quotients(x, d), x, d)


def test_range_edges(quotients):
    lowest = torch.tensor([LOWEST_DIVIDEND_BITS], dtype=torch.int32).view(torch.float32).item()
    highest = torch.tensor([HIGHEST_DIVIDEND_BITS], dtype=torch.int32).view(torch.float32).item()
    xs = [lowest, -lowest, highest, -highest, 1.0, -1.0, 3.0, -44.0, 1e-12, 1.5e19]
    ds = [LOWEST_DIVISOR, HIGHEST_DIVISOR, 1.0000001, 2.0, 3.0, 1.8446743e19, 1.2e9]
    x = torch.tensor([a for a in xs for _ in ds], device="cuda")
    d = torch.tensor([b for _ in xs for b in ds], device="cuda")
    keep = _in_range(x, d)
    assert int(keep.sum()) >= len(xs) * len(ds) - 2 * len(xs)
    x, d = x[keep], d[keep]
    _assert_same_bits(*quotients(x, d), x, d)
