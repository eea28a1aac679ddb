"""PyTorch entry points of the FP8 and FP4 quantize kernels, registered as torch custom ops.

Numerics, the NaN/Inf policy, padding and the scale layouts are those of
`cutegen.runtime.quant_reference` (the executable specification); the kernels reproduce its bytes.

``per_token_quant_fp8(x, group=128, scale_format="fp32", scale_layout="k-major", eps=1e-4, *, out=None, out_scales=None, kernel=None)``
    x [M, K] bf16/f16/f32 -> ``(q, scales)``: q e4m3 [M, K]; scales fp32 [M, ceil(K/128)]
    (``scale_format="fp32"``) or UE8M0 packed int32 [M, ceil(ceil(K/128)/4)] (``"ue8m0"``), in
    the ``k-major`` (row-major) or ``mn-major-tma-aligned`` layout (strides (1, align(M, 4)),
    what `fp8_gemm_nt` takes as SFA). K must be a multiple of 16.
``per_token_quant_fp4(x, group=32, scale_layout="k-major", eps=1e-4, *, out=None, out_scales=None, kernel=None)``
    x [M, K] bf16/f16/f32 -> ``(q, scales)``: q uint8 [M, K/2], FP4 E2M1 codes two per byte
    (element 2i in the low nibble); scales UE8M0 packed int32 [M, ceil(ceil(K/32)/4)], one per
    1x32 group, in the ``k-major`` or ``mn-major-tma-aligned`` layout (DeepGEMM's SM100 layout,
    what `fp8_gemm_nt` takes for an FP4 B). Numerics: `cutegen.runtime.mx_reference.quant_fp4_ref`,
    bit for bit. K must be a multiple of 32.
``per_block_quant_fp8(w, eps=1e-4, *, out=None, out_scales=None, kernel=None)``
    w [N, K] bf16/f16/f32 -> ``(q e4m3 [N, K], scales fp32 [ceil(N/128), ceil(K/128)])``.
    K must be a multiple of 16; N and K need not be multiples of 128.
``grouped_transposed_quant_fp8(x, group_sizes, eps=1e-4, num_blocks=None, *, out=None, out_scales=None, kernel=None)``
    x [T, H] bf16 and group_sizes int32 [G] on the GPU (1 <= G <= 1024) -> ``(q, scales)``:
    q e4m3 flat [128 * H * S], scales fp32 [S, H] in the grouped layout of the reference, where
    S = ``num_blocks``: an upper bound on sum ceil(m_g/128), by default
    ``(T + 127 G) // 128``, which needs no knowledge of the sizes, so nothing is read back from
    the GPU (the call is CUDA-graph capturable). Rows past the real blocks are zero blocks. If
    ``num_blocks`` is smaller than the real count, blocks at or past it are dropped and a group
    that straddles it is incomplete (never out of bounds). H must be a multiple of 8. The sizes
    must be non-negative and sum to T; that is not checked (it would need a device read): the
    kernel clamps negative sizes to 0 and reads tokens past T as zeros. The kernel hands out its
    tiles through an int32 counter that every launch leaves at zero; the runtime keeps one per
    device and stream, and gives each launch captured in a CUDA graph its own
    (`grouped_tile_counter`), so calls on different streams may overlap.

``out`` / ``out_scales`` (optional, both or neither) receive the result in place: ``out`` e4m3
(FP4: uint8) with the output's shape, ``stride(-1) == 1`` and 16-byte aligned rows;
``out_scales`` the scale tensor of the requested layout (for ``mn-major-tma-aligned``, strides (1, align(M, 4)) over a
buffer holding all align(M, 4) rows: the kernel writes the padding rows with 0).

Every entry point validates its inputs and raises `InputError` naming the argument before
anything is launched. Kernels are chosen from the catalogue (`cutegen.runtime.ops.catalogue`) by
op, input dtype and scale format (per-token also by scale layout: `PER_TOKEN_TILE_COLS_BY_LAYOUT`);
``kernel`` forces one by name.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from . import driver, stream_scratch
from .call_cache import CallCache, Launched
from .checks import check_aligned, check_disjoint, check_extents, check_kernel_name, check_not_overlapping_itself, span_of
from .errors import ArtifactError, InputError
from .kernel_choice import candidates, catalogue, forced_manifest
from .launch import launch
from .mx_reference import MX_VEC
from .params import align, ceil_div
from .quant_reference import DEFAULT_EPS, GROUP, MAX_EPS, MIN_EPS, SCALE_FORMATS, SCALE_LAYOUTS, TMA_ALIGN_ROWS
from .torch_ops import TorchOp, current_stream, device_ordinal

OP_PER_TOKEN = "per_token_quant_fp8"
OP_PER_TOKEN_FP4 = "per_token_quant_fp4"
OP_PER_BLOCK = "per_block_quant_fp8"
OP_GROUPED = "grouped_transposed_quant_fp8"

# The grouped kernel's shared-memory prefix sums hold this many groups (schedules.spec.QUANT_MAX_GROUPS).
MAX_GROUPS = 1024
# The schedule's scale format of each `scale_format` argument.
SCHEDULE_SCALE = {"fp32": "f32", "ue8m0": "ue8m0"}
PTR_ALIGN_BYTES = 16
IN_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
# K (per-token, per-block) and H (grouped) multiples: 16-byte rows of e4m3 / of the bf16 input.
K_MULTIPLE = 16
H_MULTIPLE = 8
# FP4: 1x32 groups (the block-scaled MMA's scale vector), and K a multiple of 32 so that q's rows
# of K/2 bytes stay 16-byte aligned.
FP4_GROUP = MX_VEC
FP4_K_MULTIPLE = 32
FP4_OUT_DTYPES = (torch.uint8,)

# The per-token tile width each scale layout prefers. A tile row writes its scales as one run:
# K-major scales of 1024 columns (8 groups) fill a 32-byte sector, where 512 columns write half
# sectors in as many L2 requests as rows; MN-major columns of 8 rows fill a sector, so 512
# columns x 8 rows is the better tile there. Measured: K-major 1.02x faster with 1024 columns,
# MN-major 0.99x with them (NOTES N34).
PER_TOKEN_TILE_COLS_BY_LAYOUT = {"k-major": 1024, "mn-major-tma-aligned": 512}

_lock = threading.RLock()
_choices: dict[tuple[str, str, str, int, str | None], str] = {}
# (device index, stream handle) -> the grouped kernel's int32 tile counter, zeroed once: every
# launch leaves it zero, and launches on one stream never overlap (launches being captured in a
# CUDA graph get their own: `grouped_tile_counter`).
_tile_counters: dict[tuple[int, int], torch.Tensor] = {}


# ------------------------------------------------------------------------------------------------
# Kernel choice


def quant_kernels(op: str, in_dtype: str, scale: str, device: int = 0) -> list[str]:
    """Names of the catalogue's kernels for (op, input dtype, scale format) that run on GPU
    `device`, sorted (raises ArtifactError when none of the op runs there)."""
    return sorted(
        m.name for m in candidates(op, device, SCHEDULE_SCALE[scale]) if m.schedule.get("a_dtype") == in_dtype
    )


def choose_quant_kernel(op: str, in_dtype: str, scale: str, device: int = 0, scale_layout: str | None = None) -> str:
    """The catalogue kernel for (op, input dtype, scale format) on this GPU: for per-token with a
    ``scale_layout``, the first by name whose tile width is the layout's
    (`PER_TOKEN_TILE_COLS_BY_LAYOUT`); otherwise, or when none is built, the first by name."""
    layout = scale_layout if op == OP_PER_TOKEN else None
    key = (op, in_dtype, scale, int(device), layout)
    name = _choices.get(key)
    if name is not None:
        return name
    cat = catalogue()
    info = driver.device_info(device)
    names = quant_kernels(op, in_dtype, scale, device)
    if not names:
        built = sorted({f"{e.arch} {e.schedule.get('a_dtype')}/{e.schedule.get('scale')}" for e in cat.entries(op)})
        raise ArtifactError(
            f"{op}: no kernel in the catalogue at {cat.build_dir} runs on {info.arch} ({info.name}) "
            f"for input {in_dtype} with {scale} scales; built: {', '.join(built) or 'none'}"
        )
    name = names[0]
    if layout is not None:
        cols = PER_TOKEN_TILE_COLS_BY_LAYOUT[layout]
        name = next((n for n in names if cat.manifest(n).schedule.get("tile_n") == cols), name)
    with _lock:
        _choices[key] = name
    return name


def _kernel(op: str, in_dtype: str, scale: str, device: int, forced: str, scale_layout: str | None = None) -> Any:
    cat = catalogue()
    if forced:
        manifest = forced_manifest(op, forced)
        want_scale = SCHEDULE_SCALE[scale]
        if manifest.schedule.get("a_dtype") != in_dtype or manifest.schedule.get("scale") != want_scale:
            raise InputError(
                f"{op}: argument 'kernel' names {forced!r}, built for input "
                f"{manifest.schedule.get('a_dtype')} with {manifest.schedule.get('scale')} scales; "
                f"this call needs {in_dtype} with {want_scale}"
            )
        name = forced
    else:
        name = choose_quant_kernel(op, in_dtype, scale, device, scale_layout)
    return cat.load(name, device)


# ------------------------------------------------------------------------------------------------
# Validation (everything here works on fake tensors too)


def _fail(op: str, arg: str, what: str) -> InputError:
    return InputError(f"{op}: argument '{arg}' {what}")


def _check_eps(op: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise _fail(op, "eps", f"must be a float, got {type(eps).__name__}")
    value = float(eps)
    if not math.isfinite(value) or not MIN_EPS <= value <= MAX_EPS:
        raise _fail(op, "eps", f"must be a finite float in [{MIN_EPS}, 3.4e38], got {eps!r}")
    return value


def _check_tensor(op: str, arg: str, t: Any, device: Any | None, dtypes: tuple, rank: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail(op, arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise _fail(op, arg, f"must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise _fail(op, arg, f"must be on {device} (the device of the input), got {t.device}")
    if t.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise _fail(op, arg, f"must be {names}, got {t.dtype}")
    if t.dim() != rank:
        raise _fail(op, arg, f"must be {rank}-D, got {t.dim()}-D with shape {list(t.shape)}")
    check_extents(op, arg, t)


def _check_rows(op: str, arg: str, t: torch.Tensor) -> None:
    """Unit stride along the last mode and 16-byte aligned rows (2-D)."""
    rows, cols = t.shape
    if cols > 1 and t.stride(1) != 1:
        raise _fail(op, arg, f"must be contiguous along its last dimension (stride(1) == 1), got strides {list(t.stride())}")
    row_align = PTR_ALIGN_BYTES // t.element_size()
    if rows > 1 and cols > 0 and t.stride(0) % row_align:
        raise _fail(
            op,
            arg,
            f"must have a row stride that is a multiple of {row_align} elements (16 bytes), got stride(0) = {t.stride(0)}",
        )


def _check_ptr(op: str, arg: str, t: torch.Tensor | None, align_bytes: int = PTR_ALIGN_BYTES) -> None:
    check_aligned(op, arg, t, align_bytes)


def _check_out(
    op: str, out: Any, out_scales: Any, device: Any, q_shape: tuple, q_dtypes: tuple = (torch.float8_e4m3fn,)
) -> None:
    if (out is None) != (out_scales is None):
        raise _fail(op, "out" if out is None else "out_scales", "must be given together with 'out_scales' / 'out'")
    if out is None:
        return
    _check_tensor(op, "out", out, device, q_dtypes, len(q_shape))
    if tuple(out.shape) != tuple(q_shape):
        raise _fail(op, "out", f"must have shape {list(q_shape)}, got {list(out.shape)}")
    if len(q_shape) == 2:
        _check_rows(op, "out", out)
    elif out.numel() > 1 and out.stride(0) != 1:
        raise _fail(op, "out", f"must be contiguous, got strides {list(out.stride())}")
    check_not_overlapping_itself(op, "out", out)
    if isinstance(out_scales, torch.Tensor):  # its dtype, shape and layout: the op's own checks
        check_not_overlapping_itself(op, "out_scales", out_scales)


def _scale_buffer_view(op: str, sf: torch.Tensor, rows: int, cols: int, layout: str) -> torch.Tensor:
    """The kernel's view of an MN-major TMA-aligned scale tensor: all align(rows, 4) rows."""
    padded = align(rows, TMA_ALIGN_ROWS)
    if layout != "mn-major-tma-aligned":
        return sf
    needed = sf.storage_offset() + (cols - 1) * padded + padded if cols else 0
    if sf.untyped_storage().nbytes() < needed * sf.element_size():
        raise _fail(
            op,
            "out_scales",
            f"must lie in a buffer holding all {padded} rows of each of its {cols} columns (the kernel "
            "writes the padding rows); allocate it with cutegen.runtime.quant_reference.mn_major_tma_aligned_empty",
        )
    return torch.as_strided(sf, (padded, cols), (1, padded), sf.storage_offset())


def _per_token_meta(x: Any, group: Any, scale_format: Any, scale_layout: Any, eps: Any, out: Any, out_scales: Any):
    op = OP_PER_TOKEN
    _check_tensor(op, "x", x, None, tuple(IN_DTYPES), 2)
    _check_rows(op, "x", x)
    if group != GROUP:
        raise _fail(op, "group", f"must be {GROUP} (the kernels quantise 1x128 groups), got {group!r}")
    if scale_format not in SCALE_FORMATS:
        raise _fail(op, "scale_format", f"must be one of {SCALE_FORMATS}, got {scale_format!r}")
    if scale_layout not in SCALE_LAYOUTS:
        raise _fail(op, "scale_layout", f"must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    eps = _check_eps(op, eps)
    m, k = x.shape
    if k % K_MULTIPLE:
        raise _fail(op, "x", f"must have K a multiple of {K_MULTIPLE} (16-byte rows of q), got K = {k}")
    g = ceil_div(k, GROUP)
    cols = g if scale_format == "fp32" else ceil_div(g, 4)
    _check_out(op, out, out_scales, x.device, (m, k))
    _check_per_token_scales(op, out_scales, x.device, m, cols, torch.float32 if scale_format == "fp32" else torch.int32,
                            scale_layout)
    return m, k, cols, eps


def _check_per_token_scales(op: str, out_scales: Any, device: Any, m: int, cols: int, dtype: torch.dtype, layout: str) -> None:
    """A per-token quantizer's ``out_scales`` (when given): ``dtype`` [m, cols] in ``layout``."""
    if out_scales is None:
        return
    _check_tensor(op, "out_scales", out_scales, device, (dtype,), 2)
    if tuple(out_scales.shape) != (m, cols):
        raise _fail(op, "out_scales", f"must have shape [{m}, {cols}], got {list(out_scales.shape)}")
    if layout == "mn-major-tma-aligned":
        ma = align(m, TMA_ALIGN_ROWS)
        if not ((m <= 1 or out_scales.stride(0) == 1) and (cols <= 1 or out_scales.stride(1) == ma)):
            raise _fail(op, "out_scales", f"must have strides (1, {ma}) (mn-major-tma-aligned), got {list(out_scales.stride())}")


def _new_scales(x: torch.Tensor, m: int, cols: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    if layout == "mn-major-tma-aligned":
        ma = align(m, TMA_ALIGN_ROWS)
        if ma == m:  # no padding rows: the strided tensor's own storage holds every row
            return torch.empty_strided((m, cols), (1, ma), dtype=dtype, device=x.device)
        return torch.empty(cols * ma, dtype=dtype, device=x.device).as_strided((m, cols), (1, ma))
    return torch.empty((m, cols), dtype=dtype, device=x.device)


def _launch(
    op: str,
    in_dtype: str,
    scale: str,
    forced: str,
    device_of: torch.Tensor,
    operands: dict,
    eps: float,
    scale_layout: str | None = None,
) -> tuple[Any, Any]:
    """Launch; returns (kernel, prepared launch) for a `CallCache`."""
    device = device_ordinal(device_of)

    def go() -> tuple[Any, Any]:
        loaded = _kernel(op, in_dtype, scale, device, forced, scale_layout)
        stream = current_stream(device_of)
        return loaded, launch(loaded, operands, extents={"eps": eps}, stream=stream)

    if torch.cuda.current_device() != device:
        with torch.cuda.device(device):
            return go()
    return go()


# ------------------------------------------------------------------------------------------------
# Per-token


def _per_token_run(x, scale_format, scale_layout, eps, q, sf, kernel, op: str = OP_PER_TOKEN) -> Launched | None:
    """Launch a per-token quantizer (FP8, or ``op`` FP4); returns what its `CallCache` remembers
    of it, None if nothing ran."""
    m, k = x.shape
    if m == 0:
        return None
    if k == 0:
        return None
    for arg, t in (("x", x), ("out", q)):
        _check_ptr(op, arg, t)
    _check_ptr(op, "out_scales", sf, 4)
    cols = sf.shape[1]
    sf_kernel = _scale_buffer_view(op, sf, m, cols, scale_layout)
    loaded, prepared = _launch(
        op, IN_DTYPES[x.dtype], scale_format, kernel, x, {"x": x, "q": q, "sf": sf_kernel}, eps, scale_layout
    )
    # The kernel's view of the scales starts at their address: a relaunch passes them as they are.
    return Launched(loaded, prepared, _PER_TOKEN_OPERANDS, extra=cols)


_per_token_calls = CallCache(OP_PER_TOKEN)


def _per_token_outputs(x, m, k, cols, scale_format, scale_layout):
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    dtype = torch.float32 if scale_format == "fp32" else torch.int32
    return q, _new_scales(x, m, cols, dtype, scale_layout)


def _per_token_impl(
    x: torch.Tensor, group: int = GROUP, scale_format: str = "fp32", scale_layout: str = "k-major",
    eps: float = DEFAULT_EPS, kernel_name: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    call, key = _per_token_calls.find((x,), group, scale_format, scale_layout, eps, kernel_name)
    if call is not None:
        q, sf = call.new_output()
        if call.relaunch((x, q, sf), current_stream(x)):
            return q, sf
    m, k, cols, eps = _per_token_meta(x, group, scale_format, scale_layout, eps, None, None)
    q, sf = _per_token_outputs(x, m, k, cols, scale_format, scale_layout)
    _per_token_calls.remember(key, _per_token_run(x, scale_format, scale_layout, eps, q, sf, kernel_name), new_output=(q, sf))
    return q, sf


def _per_token_fake(x, group=GROUP, scale_format="fp32", scale_layout="k-major", eps=DEFAULT_EPS, kernel_name=""):
    m, k, cols, _ = _per_token_meta(x, group, scale_format, scale_layout, eps, None, None)
    q = x.new_empty((m, k), dtype=torch.float8_e4m3fn)
    return q, _fake_scales(x, m, cols, torch.float32 if scale_format == "fp32" else torch.int32, scale_layout)


def _fake_scales(x: torch.Tensor, m: int, cols: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """A per-token quantizer's scales as `_new_scales` lays them out, for fake tensors."""
    if layout == "mn-major-tma-aligned":
        return x.new_empty_strided((m, cols), (1, align(m, TMA_ALIGN_ROWS)), dtype=dtype)
    return x.new_empty((m, cols), dtype=dtype)


def _per_token_out_impl(
    x: torch.Tensor, out: torch.Tensor, out_scales: torch.Tensor, group: int = GROUP, scale_format: str = "fp32",
    scale_layout: str = "k-major", eps: float = DEFAULT_EPS, kernel_name: str = "",
) -> None:
    call, key = _per_token_calls.find((x, out, out_scales), group, scale_format, scale_layout, eps, kernel_name)
    if call is not None:
        m = x.shape[0]
        if m % TMA_ALIGN_ROWS and scale_layout == "mn-major-tma-aligned":
            # the padding rows the kernel writes must fit the buffer: more than the layout says
            _scale_buffer_view(OP_PER_TOKEN, out_scales, m, call.extra, scale_layout)
        if call.relaunch((x, out, out_scales), current_stream(x)):
            return
    m, _, cols, eps = _per_token_meta(x, group, scale_format, scale_layout, eps, out, out_scales)
    _per_token_out_run(OP_PER_TOKEN, _per_token_calls, key, x, out, out_scales, scale_format, scale_layout, eps, cols,
                       kernel_name)


def _per_token_out_run(op, calls, key, x, out, out_scales, scale_format, scale_layout, eps, cols, kernel_name) -> None:
    """A checked in-place per-token call (FP8 or FP4) launched and remembered in ``calls``: the
    outputs share no memory with x, the scales' padding rows included."""
    sf_kernel = _scale_buffer_view(op, out_scales, x.shape[0], cols, scale_layout)
    check_disjoint(op, {"out": out, "out_scales": (out_scales, span_of(sf_kernel))}, {"x": x})
    ran = _per_token_run(x, scale_format, scale_layout, eps, out, out_scales, kernel_name, op)
    calls.remember(key, ran and ran._replace(outputs={"q": "out", "sf": "out_scales"}), (x, out, sf_kernel))


def _per_token_out_fake(
    x, out, out_scales, group=GROUP, scale_format="fp32", scale_layout="k-major", eps=DEFAULT_EPS, kernel_name=""
) -> None:
    _per_token_meta(x, group, scale_format, scale_layout, eps, out, out_scales)


PER_TOKEN = TorchOp(OP_PER_TOKEN, _per_token_impl, _per_token_fake)
PER_TOKEN_OUT = TorchOp(f"{OP_PER_TOKEN}_out", _per_token_out_impl, _per_token_out_fake, mutates=("out", "out_scales"))


def per_token_quant_fp8(
    x: torch.Tensor,
    group: int = GROUP,
    scale_format: str = "fp32",
    scale_layout: str = "k-major",
    eps: float = DEFAULT_EPS,
    *,
    out: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 1x128 FP8 quantize of x [M, K]; see the module docstring."""
    check_kernel_name(OP_PER_TOKEN, kernel)
    if not isinstance(x, torch.Tensor):
        raise _fail(OP_PER_TOKEN, "x", f"must be a torch.Tensor, got {type(x).__name__}")
    if out is None and out_scales is None:
        return PER_TOKEN.call(x, group, scale_format, scale_layout, eps, kernel or "")
    PER_TOKEN_OUT.call(x, out, out_scales, group, scale_format, scale_layout, eps, kernel or "")
    return out, out_scales


# ------------------------------------------------------------------------------------------------
# Per-block


def _per_block_meta(w: Any, eps: Any, out: Any, out_scales: Any):
    op = OP_PER_BLOCK
    _check_tensor(op, "w", w, None, tuple(IN_DTYPES), 2)
    _check_rows(op, "w", w)
    eps = _check_eps(op, eps)
    n, k = w.shape
    if k % K_MULTIPLE:
        raise _fail(op, "w", f"must have K a multiple of {K_MULTIPLE} (16-byte rows of q), got K = {k}")
    shape_s = (ceil_div(n, GROUP), ceil_div(k, GROUP))
    _check_out(op, out, out_scales, w.device, (n, k))
    if out_scales is not None:
        _check_tensor(op, "out_scales", out_scales, w.device, (torch.float32,), 2)
        if tuple(out_scales.shape) != shape_s:
            raise _fail(op, "out_scales", f"must have shape {list(shape_s)}, got {list(out_scales.shape)}")
    return n, k, shape_s, eps


def _per_block_run(w, eps, q, sf, kernel) -> Launched | None:
    """Launch; returns what `_per_block_calls` remembers of it, None if nothing ran."""
    n, k = w.shape
    if n == 0 or k == 0:
        return None
    _check_ptr(OP_PER_BLOCK, "w", w)
    _check_ptr(OP_PER_BLOCK, "out", q)
    _check_ptr(OP_PER_BLOCK, "out_scales", sf, 4)
    loaded, prepared = _launch(OP_PER_BLOCK, IN_DTYPES[w.dtype], "fp32", kernel, w, {"w": w, "q": q, "sf": sf}, eps)
    return Launched(loaded, prepared, _PER_BLOCK_OPERANDS)


_per_block_calls = CallCache(OP_PER_BLOCK)


def _per_block_impl(w: torch.Tensor, eps: float = DEFAULT_EPS, kernel_name: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    call, key = _per_block_calls.find((w,), eps, kernel_name)
    if call is not None:
        q, sf = call.new_output()
        if call.relaunch((w, q, sf), current_stream(w)):
            return q, sf
    _, _, shape_s, eps = _per_block_meta(w, eps, None, None)
    q, sf = _per_block_outputs(w, shape_s)
    _per_block_calls.remember(key, _per_block_run(w, eps, q, sf, kernel_name), new_output=(q, sf))
    return q, sf


def _per_block_outputs(w: torch.Tensor, shape_s: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """New q [N, K] (e4m3) and scales ``shape_s`` (fp32) for a weight ``w``."""
    return (torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device),
            torch.empty(shape_s, dtype=torch.float32, device=w.device))


def _per_block_fake(w, eps=DEFAULT_EPS, kernel_name=""):
    n, k, shape_s, _ = _per_block_meta(w, eps, None, None)
    return w.new_empty((n, k), dtype=torch.float8_e4m3fn), w.new_empty(shape_s, dtype=torch.float32)


def _per_block_out_impl(
    w: torch.Tensor, out: torch.Tensor, out_scales: torch.Tensor, eps: float = DEFAULT_EPS, kernel_name: str = ""
) -> None:
    call, key = _per_block_calls.find((w, out, out_scales), eps, kernel_name)
    if call is not None and call.relaunch((w, out, out_scales), current_stream(w)):
        return
    _, _, _, eps = _per_block_meta(w, eps, out, out_scales)
    check_disjoint(OP_PER_BLOCK, {"out": out, "out_scales": out_scales}, {"w": w})
    ran = _per_block_run(w, eps, out, out_scales, kernel_name)
    _per_block_calls.remember(key, ran and ran._replace(outputs={"q": "out", "sf": "out_scales"}), (w, out, out_scales))


def _per_block_out_fake(w, out, out_scales, eps=DEFAULT_EPS, kernel_name="") -> None:
    _per_block_meta(w, eps, out, out_scales)


PER_BLOCK = TorchOp(OP_PER_BLOCK, _per_block_impl, _per_block_fake)
PER_BLOCK_OUT = TorchOp(f"{OP_PER_BLOCK}_out", _per_block_out_impl, _per_block_out_fake, mutates=("out", "out_scales"))


def per_block_quant_fp8(
    w: torch.Tensor,
    eps: float = DEFAULT_EPS,
    *,
    out: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block 128x128 FP8 quantize of a weight w [N, K]; see the module docstring."""
    check_kernel_name(OP_PER_BLOCK, kernel)
    if not isinstance(w, torch.Tensor):
        raise _fail(OP_PER_BLOCK, "w", f"must be a torch.Tensor, got {type(w).__name__}")
    if out is None and out_scales is None:
        return PER_BLOCK.call(w, eps, kernel or "")
    PER_BLOCK_OUT.call(w, out, out_scales, eps, kernel or "")
    return out, out_scales


# ------------------------------------------------------------------------------------------------
# Per-token FP4 (1x32 groups, UE8M0 scales)


def _per_token_fp4_meta(x: Any, group: Any, scale_layout: Any, eps: Any, out: Any, out_scales: Any):
    op = OP_PER_TOKEN_FP4
    _check_tensor(op, "x", x, None, tuple(IN_DTYPES), 2)
    _check_rows(op, "x", x)
    if group != FP4_GROUP:
        raise _fail(op, "group", f"must be {FP4_GROUP} (the kernels quantise 1x{FP4_GROUP} groups), got {group!r}")
    if scale_layout not in SCALE_LAYOUTS:
        raise _fail(op, "scale_layout", f"must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    eps = _check_eps(op, eps)
    m, k = x.shape
    if k % FP4_K_MULTIPLE:
        raise _fail(op, "x", f"must have K a multiple of {FP4_K_MULTIPLE} (16-byte rows of packed FP4 q), got K = {k}")
    cols = ceil_div(ceil_div(k, FP4_GROUP), 4)
    _check_out(op, out, out_scales, x.device, (m, k // 2), FP4_OUT_DTYPES)
    _check_per_token_scales(op, out_scales, x.device, m, cols, torch.int32, scale_layout)
    return m, k, cols, eps


_per_token_fp4_calls = CallCache(OP_PER_TOKEN_FP4)


def _per_token_fp4_outputs(x, m, k, cols, scale_layout):
    return torch.empty((m, k // 2), dtype=torch.uint8, device=x.device), _new_scales(x, m, cols, torch.int32, scale_layout)


def _per_token_fp4_impl(
    x: torch.Tensor, group: int = FP4_GROUP, scale_layout: str = "k-major", eps: float = DEFAULT_EPS,
    kernel_name: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    call, key = _per_token_fp4_calls.find((x,), group, scale_layout, eps, kernel_name)
    if call is not None:
        q, sf = call.new_output()
        if call.relaunch((x, q, sf), current_stream(x)):
            return q, sf
    m, k, cols, eps = _per_token_fp4_meta(x, group, scale_layout, eps, None, None)
    q, sf = _per_token_fp4_outputs(x, m, k, cols, scale_layout)
    _per_token_fp4_calls.remember(
        key, _per_token_run(x, "ue8m0", scale_layout, eps, q, sf, kernel_name, OP_PER_TOKEN_FP4), new_output=(q, sf)
    )
    return q, sf


def _per_token_fp4_fake(x, group=FP4_GROUP, scale_layout="k-major", eps=DEFAULT_EPS, kernel_name=""):
    m, k, cols, _ = _per_token_fp4_meta(x, group, scale_layout, eps, None, None)
    return x.new_empty((m, k // 2), dtype=torch.uint8), _fake_scales(x, m, cols, torch.int32, scale_layout)


def _per_token_fp4_out_impl(
    x: torch.Tensor, out: torch.Tensor, out_scales: torch.Tensor, group: int = FP4_GROUP,
    scale_layout: str = "k-major", eps: float = DEFAULT_EPS, kernel_name: str = "",
) -> None:
    call, key = _per_token_fp4_calls.find((x, out, out_scales), group, scale_layout, eps, kernel_name)
    if call is not None:
        m = x.shape[0]
        if m % TMA_ALIGN_ROWS and scale_layout == "mn-major-tma-aligned":
            _scale_buffer_view(OP_PER_TOKEN_FP4, out_scales, m, call.extra, scale_layout)
        if call.relaunch((x, out, out_scales), current_stream(x)):
            return
    _, _, cols, eps = _per_token_fp4_meta(x, group, scale_layout, eps, out, out_scales)
    _per_token_out_run(OP_PER_TOKEN_FP4, _per_token_fp4_calls, key, x, out, out_scales, "ue8m0", scale_layout, eps, cols,
                       kernel_name)


def _per_token_fp4_out_fake(x, out, out_scales, group=FP4_GROUP, scale_layout="k-major", eps=DEFAULT_EPS, kernel_name="") -> None:
    _per_token_fp4_meta(x, group, scale_layout, eps, out, out_scales)


PER_TOKEN_FP4 = TorchOp(OP_PER_TOKEN_FP4, _per_token_fp4_impl, _per_token_fp4_fake)
PER_TOKEN_FP4_OUT = TorchOp(
    f"{OP_PER_TOKEN_FP4}_out", _per_token_fp4_out_impl, _per_token_fp4_out_fake, mutates=("out", "out_scales")
)


def per_token_quant_fp4(
    x: torch.Tensor,
    group: int = FP4_GROUP,
    scale_layout: str = "k-major",
    eps: float = DEFAULT_EPS,
    *,
    out: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 1x32 FP4 quantize of x [M, K]; see the module docstring."""
    check_kernel_name(OP_PER_TOKEN_FP4, kernel)
    if not isinstance(x, torch.Tensor):
        raise _fail(OP_PER_TOKEN_FP4, "x", f"must be a torch.Tensor, got {type(x).__name__}")
    if out is None and out_scales is None:
        return PER_TOKEN_FP4.call(x, group, scale_layout, eps, kernel or "")
    PER_TOKEN_FP4_OUT.call(x, out, out_scales, group, scale_layout, eps, kernel or "")
    return out, out_scales


# ------------------------------------------------------------------------------------------------
# Grouped transposed


def grouped_num_blocks_bound(num_tokens: int, num_groups: int) -> int:
    """sum ceil(m_g/128) <= floor((T + 127 G) / 128) for any sizes summing to T."""
    return (num_tokens + (GROUP - 1) * num_groups) // GROUP


def _grouped_meta(x: Any, group_sizes: Any, eps: Any, num_blocks: Any, out: Any, out_scales: Any):
    op = OP_GROUPED
    _check_tensor(op, "x", x, None, (torch.bfloat16,), 2)
    _check_rows(op, "x", x)
    _check_tensor(op, "group_sizes", group_sizes, x.device, (torch.int32,), 1)
    g = group_sizes.shape[0]
    if not 1 <= g <= MAX_GROUPS:
        raise _fail(op, "group_sizes", f"must hold 1 to {MAX_GROUPS} groups, got {g}")
    if g > 1 and group_sizes.stride(0) != 1:
        raise _fail(op, "group_sizes", f"must be contiguous, got stride {group_sizes.stride(0)}")
    eps = _check_eps(op, eps)
    t, h = x.shape
    if h % H_MULTIPLE:
        raise _fail(op, "x", f"must have H a multiple of {H_MULTIPLE} (16-byte rows), got H = {h}")
    if num_blocks is None:
        s = grouped_num_blocks_bound(t, g)
    else:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise _fail(op, "num_blocks", f"must be a non-negative int (an upper bound on sum ceil(m_g/128)), got {num_blocks!r}")
        s = num_blocks
    _check_out(op, out, out_scales, x.device, (GROUP * h * s,))
    if out_scales is not None:
        _check_tensor(op, "out_scales", out_scales, x.device, (torch.float32,), 2)
        if tuple(out_scales.shape) != (s, h):
            raise _fail(op, "out_scales", f"must have shape [{s}, {h}], got {list(out_scales.shape)}")
        if h > 1 and out_scales.stride(1) != 1:
            raise _fail(op, "out_scales", f"must be row-major (stride(1) == 1), got strides {list(out_scales.stride())}")
        if s > 1 and out_scales.stride(0) % 2:
            raise _fail(op, "out_scales", f"must have an even row stride (8-byte stores), got {out_scales.stride(0)}")
    return t, h, g, s, eps


def grouped_tile_counter(device: torch.device, stream: int) -> torch.Tensor:
    """The int32 [1] tile counter of grouped-kernel launches on ``stream`` of ``device`` (zero
    between launches); a launch being captured in a CUDA graph gets its own
    (`cutegen.runtime.stream_scratch`)."""
    return stream_scratch.per_stream(
        _tile_counters, _lock, device, stream, lambda _: torch.zeros(1, dtype=torch.int32, device=device)
    )


def _grouped_run(x, group_sizes, eps, q, sf, kernel) -> Launched | None:
    """Launch; returns what `_grouped_calls` remembers of it, None if nothing ran."""
    t, h = x.shape
    s = sf.shape[0]
    if s == 0 or h == 0:
        return None
    _check_ptr(OP_GROUPED, "x", x)
    _check_ptr(OP_GROUPED, "out", q)
    _check_ptr(OP_GROUPED, "out_scales", sf, 8)
    _check_ptr(OP_GROUPED, "group_sizes", group_sizes, 4)
    counter = grouped_tile_counter(x.device, current_stream(x))
    operands = {"x": x, "group_sizes": group_sizes, "q": q, "sf": sf, "tile_counter": counter}
    loaded, prepared = _launch(OP_GROUPED, "bf16", "fp32", kernel, x, operands, eps)
    return Launched(loaded, prepared, _GROUPED_OPERANDS, fixed={"tile_counter": counter})


# Calls are remembered with their stream's tile counter.
_grouped_calls = CallCache(OP_GROUPED, stream_scratch.capturing)
_GROUPED_OPERANDS = ("x", "group_sizes", "q", "sf")
# What the per-token and per-block calls bind, in entry order (`schedules.contract` states it).
_PER_TOKEN_OPERANDS = ("x", "q", "sf")
_PER_BLOCK_OPERANDS = ("w", "q", "sf")


def _grouped_impl(x, group_sizes, eps, num_blocks, kernel):
    call, key = _grouped_calls.find((x, group_sizes), eps, num_blocks, kernel)
    if call is not None:
        q, sf = call.new_output()
        if call.relaunch((x, group_sizes, q, sf), current_stream(x)):
            return q, sf
    _, h, _, s, eps = _grouped_meta(x, group_sizes, eps, num_blocks, None, None)
    q, sf = _grouped_outputs(x, s, h)
    _grouped_calls.remember(key, _grouped_run(x, group_sizes, eps, q, sf, kernel), new_output=(q, sf))
    return q, sf


def _grouped_outputs(x: torch.Tensor, s: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New q (e4m3, 128·H·S, flat) and scales [S, H] (fp32) of the grouped transposed quantize."""
    return (torch.empty(GROUP * h * s, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty((s, h), dtype=torch.float32, device=x.device))


def _grouped_op_impl(
    x: torch.Tensor, group_sizes: torch.Tensor, eps: float = DEFAULT_EPS, num_blocks: int = -1, kernel_name: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    return _grouped_impl(x, group_sizes, eps, None if num_blocks < 0 else num_blocks, kernel_name)


def _grouped_fake(x, group_sizes, eps=DEFAULT_EPS, num_blocks=-1, kernel_name=""):
    _, h, _, s, _ = _grouped_meta(x, group_sizes, eps, None if num_blocks < 0 else num_blocks, None, None)
    return x.new_empty((GROUP * h * s,), dtype=torch.float8_e4m3fn), x.new_empty((s, h), dtype=torch.float32)


def _grouped_out_impl(
    x: torch.Tensor, group_sizes: torch.Tensor, out: torch.Tensor, out_scales: torch.Tensor, eps: float = DEFAULT_EPS,
    kernel_name: str = "",
) -> None:
    call, key = _grouped_calls.find((x, group_sizes, out, out_scales), eps, kernel_name)
    if call is not None and call.relaunch((x, group_sizes, out, out_scales), current_stream(x)):
        return
    _, _, _, _, eps = _grouped_meta(x, group_sizes, eps, out_scales.shape[0], out, out_scales)
    check_disjoint(OP_GROUPED, {"out": out, "out_scales": out_scales}, {"x": x, "group_sizes": group_sizes})
    ran = _grouped_run(x, group_sizes, eps, out, out_scales, kernel_name)
    _grouped_calls.remember(
        key, ran and ran._replace(outputs={"q": "out", "sf": "out_scales"}), (x, group_sizes, out, out_scales)
    )


def _grouped_out_fake(x, group_sizes, out, out_scales, eps=DEFAULT_EPS, kernel_name="") -> None:
    _grouped_meta(x, group_sizes, eps, out_scales.shape[0], out, out_scales)


# num_blocks < 0 in the schema stands for None (the bound from T and G).
GROUPED = TorchOp(OP_GROUPED, _grouped_op_impl, _grouped_fake)
GROUPED_OUT = TorchOp(f"{OP_GROUPED}_out", _grouped_out_impl, _grouped_out_fake, mutates=("out", "out_scales"))


def grouped_transposed_quant_fp8(
    x: torch.Tensor,
    group_sizes: torch.Tensor,
    eps: float = DEFAULT_EPS,
    num_blocks: int | None = None,
    *,
    out: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped transposed per-token FP8 quantize (MoE weight gradient); see the module docstring.

    With ``out``/``out_scales`` given, S is ``out_scales.shape[0]`` (``num_blocks``, if also
    given, must agree).
    """
    op = OP_GROUPED
    check_kernel_name(op, kernel)
    for arg, t in (("x", x), ("group_sizes", group_sizes)):
        if not isinstance(t, torch.Tensor):
            raise _fail(op, arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0):
        raise _fail(op, "num_blocks", f"must be a non-negative int (an upper bound on sum ceil(m_g/128)), got {num_blocks!r}")
    if out is None and out_scales is None:
        return GROUPED.call(x, group_sizes, eps, -1 if num_blocks is None else num_blocks, kernel or "")
    if out_scales is None or not isinstance(out_scales, torch.Tensor):
        raise _fail(op, "out_scales", "must be a torch.Tensor given together with 'out'")
    if num_blocks is not None and num_blocks != out_scales.shape[0]:
        raise _fail(op, "num_blocks", f"must equal out_scales.shape[0] = {out_scales.shape[0]}, got {num_blocks}")
    GROUPED_OUT.call(x, group_sizes, out, out_scales, eps, kernel or "")
    return out, out_scales


__all__ = [
    "MAX_GROUPS",
    "choose_quant_kernel",
    "grouped_num_blocks_bound",
    "grouped_tile_counter",
    "grouped_transposed_quant_fp8",
    "per_block_quant_fp8",
    "per_token_quant_fp4",
    "per_token_quant_fp8",
    "quant_kernels",
]
