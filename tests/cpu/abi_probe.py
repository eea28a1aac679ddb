"""ABI self-check without a GPU: capture what the CuTe DSL's own host code launches.

A kernel compiled on the CPU with ``cute.compile`` can be exported with
``compiled.export_to_c(dir, name, prefix)``: that writes ``name.h`` (C typedefs and
a ``static inline`` wrapper) and ``name.o`` (the DSL's x86-64 host launcher with the
cubin embedded).  The host launcher does all the host-side work a launch needs --
it unpacks the tensor descriptors, bit-packs the TMA descriptors, computes the grid
-- and finally calls ``cudaLaunchKernelExC`` through the DSL's static runtime
library ``libcuda_dialect_runtime_static.a``.

This module links that object and that runtime library against *stub*
implementations of every CUDA runtime function they reference (and of the driver
functions they fetch through ``cudaGetDriverEntryPointByVersion``), plus a small
``main`` that calls the header's wrapper with concrete argument values.  The
executable runs on any x86-64 Linux host without libcuda/libcudart; the launch
stub writes down the launch configuration and the bytes of every kernel
parameter (sizes from the PTX ``.entry`` parameter list).  The result can be
compared with what our own runtime packs (:meth:`CapturedLaunch.mismatches`).

Usage::

    compiled = cute.compile(host_fn, a_fake, b_fake, make_fake_stream(),
                            options=f"--keep-ptx --keep-cubin --dump-dir {existing_dir}")
    launch = capture_launch(compiled, [
        ctensor_from_fake(a_fake, 0x7F0000000000, (M, K), (K, 1)),
        ctensor_from_fake(b_fake, 0x7F0000100000, (N, K), (K, 1)),
        CStream(0),
    ])
    launch.grid, launch.block, launch.cluster, launch.smem_bytes, launch.params

Pitfalls the probe handles:

* The DSL host code leaves bytes it does not care about uninitialised: bytes 64..127
  of every TMA descriptor and the padding of small structs (e.g. bytes 10..11 of the
  12-byte FastDivmod params).  The probe runs twice with the stack filled with 0x00
  and 0xFF; ``params`` shows such bytes as 0 and ``param_masks`` marks them.
* The exported header includes ``<cuda_runtime.h>``; a minimal stand-in is generated.
* The runtime library fetches driver functions (``cuKernelGetAttribute``,
  ``cuDeviceGet``, ``cuTensorMapEncodeTiled``) through
  ``cudaGetDriverEntryPointByVersion``; those are stubbed too.  Descriptors built by
  ``make_tiled_tma_atom`` are packed by the DSL itself (no driver call); descriptors
  built through ``cutlass.experimental.cuda`` go through ``cuTensorMapEncodeTiled``,
  whose arguments are recorded (``ProbeResult.tensor_map_encodes``).

Nothing here needs a GPU; it needs ``gcc`` (or ``$CC``), ``nm`` and the DSL wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from cutegen.gen.ptx import PtxEntry, PtxParam, parse_ptx_entries, parse_ptx_entry  # noqa: F401

# The probe's C sources: stand-ins for the CUDA headers, the driver stubs and the calling main, whose
# @NAME@ placeholders are filled per probe.
C_SOURCES = Path(__file__).resolve().parent / "abi_probe_c"

__all__ = [
    "PtxParam",
    "PtxEntry",
    "parse_ptx_entry",
    "parse_ptx_entries",
    "CTensor",
    "CTensorList",
    "CScalar",
    "CPointer",
    "CTuple",
    "CStream",
    "ctensor_from_fake",
    "CParam",
    "CWrapper",
    "parse_export_header",
    "ApiCall",
    "CapturedLaunch",
    "ProbeResult",
    "probe_exported",
    "capture_launches",
    "capture_launch",
    "find_runtime_static_lib",
    "CubinParam",
    "CubinKernelParams",
    "parse_cubin_kparams",
    "ProbeError",
]


class ProbeError(RuntimeError):
    """The probe could not be built or run, or its output was not as expected."""


# --------------------------------------------------------------------------------------
# PTX .entry parsing
# --------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------
# cubin .nv.info kernel-parameter tables (what the driver uses to place the params)
# --------------------------------------------------------------------------------------

_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19


@dataclass(frozen=True)
class CubinParam:
    ordinal: int
    offset: int  # byte offset as recorded in the cubin (see CubinKernelParams.bias)
    size: int


@dataclass(frozen=True)
class CubinKernelParams:
    kernel: str
    params: tuple[CubinParam, ...]  # by ordinal
    cbank_offset: int | None  # where the param block sits in the constant bank
    cbank_size: int | None  # EIATTR_CBANK_PARAM_SIZE

    def bias_against(self, entry: PtxEntry) -> int:
        """The constant ``cubin offset - PTX offset`` over all params (the compiler may
        shift the whole block, e.g. by 0x30 so that a 64-byte aligned TMA descriptor is
        64-byte aligned in the bank).  Raises if sizes or relative layout disagree."""
        if len(self.params) != len(entry.params):
            raise ProbeError(f"{self.kernel}: cubin has {len(self.params)} params, PTX {len(entry.params)}")
        biases = set()
        for c, p in zip(self.params, entry.params):
            if c.size != p.size:
                raise ProbeError(f"{self.kernel}: param {c.ordinal} size {c.size} (cubin) != {p.size} (PTX)")
            biases.add(c.offset - p.offset)
        if len(biases) > 1:
            raise ProbeError(f"{self.kernel}: cubin/PTX offsets differ non-uniformly: {sorted(biases)}")
        return biases.pop() if biases else 0


def _elf_sections(elf: bytes) -> dict[str, bytes]:
    import struct

    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 image")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stro = heads[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in heads:
        end = elf.index(b"\0", stro + name)
        out[elf[stro + name : end].decode()] = elf[off : off + size]
    return out


def parse_cubin_kparams(cubin: bytes) -> dict[str, CubinKernelParams]:
    """Kernel parameter tables from a cubin's ``.nv.info.<kernel>`` sections."""
    import struct

    result = {}
    for sec, data in _elf_sections(cubin).items():
        if not sec.startswith(".nv.info."):
            continue
        params, cb_off, cb_size = [], None, None
        i = 0
        while i + 4 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt == 4:  # EIFMT_SVAL: u16 size + payload
                n = struct.unpack_from("<H", data, i + 2)[0]
                val = data[i + 4 : i + 4 + n]
                i += 4 + n
            elif fmt in (1, 2, 3):  # NVAL / BVAL / HVAL: 4 bytes in all
                val = data[i + 2 : i + 4]
                i += 4
            else:
                break
            if attr == _EIATTR_KPARAM_INFO and len(val) >= 12:
                _idx, ordinal, off, packed = struct.unpack_from("<IHHI", val)
                params.append(CubinParam(ordinal, off, packed >> 18))
            elif attr == _EIATTR_PARAM_CBANK and len(val) >= 8:
                cb_off, cb_size = struct.unpack_from("<HH", val, 4)
            elif attr == _EIATTR_CBANK_PARAM_SIZE:
                cb_size = struct.unpack_from("<H", val)[0]
        if params:
            kname = sec[len(".nv.info.") :]
            result[kname] = CubinKernelParams(
                kname, tuple(sorted(params, key=lambda p: p.ordinal)), cb_off, cb_size
            )
    return result


# --------------------------------------------------------------------------------------
# Argument description (values for the exported wrapper's C arguments)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CTensor:
    """A ``{prefix}_Tensor_{name}_t``: data pointer + only the *dynamic* extents/strides.

    ``dynamic_shapes`` / ``dynamic_strides`` are in elements, in mode order, and
    contain only the modes that were dynamic (``SymInt``) at compile time -- exactly
    the arrays of the generated C struct.  Use :func:`ctensor_from_fake` to build one
    from a full shape/stride and the fake tensor used at compile time.
    """

    data: int
    dynamic_shapes: tuple[int, ...] = ()
    dynamic_strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class CTensorList:
    tensors: tuple[CTensor, ...]


@dataclass(frozen=True)
class CScalar:
    """A numeric argument passed by value.  For ``__half_raw``/``__nv_bfloat16``
    arguments a float is converted to its bit pattern (or pass ``bits=True`` with the
    raw 16-bit integer)."""

    value: Union[int, float, bool]
    bits: bool = False


@dataclass(frozen=True)
class CPointer:
    address: int


@dataclass(frozen=True)
class CTuple:
    """A cute algebra argument (tuple of integers): its dynamic elements, in order."""

    values: tuple[int, ...]


@dataclass(frozen=True)
class CStream:
    handle: int = 0


CArg = Union[CTensor, CTensorList, CScalar, CPointer, CTuple, CStream, int, float]


def _mask(fake: Any, attr: str) -> tuple[bool, ...]:
    m = getattr(fake, attr, None)
    if m is None:
        raise TypeError(f"{type(fake).__name__} has no {attr}; build CTensor directly")
    return tuple(bool(x) for x in m)


def ctensor_from_fake(fake: Any, data: int, shape: Sequence[int], stride: Sequence[int]) -> CTensor:
    """CTensor for ``fake`` (a compile-time fake/real cute tensor) with the given
    concrete full shape and stride (elements): keeps the dynamic modes only."""
    sm = _mask(fake, "dynamic_shapes_mask")
    tm = _mask(fake, "dynamic_strides_mask")
    if len(sm) != len(shape) or len(tm) != len(stride):
        raise ValueError(f"rank mismatch: masks {sm}/{tm} vs shape {shape} stride {stride}")
    return CTensor(
        data=int(data),
        dynamic_shapes=tuple(int(s) for s, d in zip(shape, sm) if d),
        dynamic_strides=tuple(int(s) for s, d in zip(stride, tm) if d),
    )


# --------------------------------------------------------------------------------------
# Generated header parsing
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CParam:
    name: str
    c_type: str  # as written in the header, e.g. "dgp_Tensor_a_t *", "cudaStream_t", "int32_t*"
    kind: str  # tensor | tensor_list | pointer | stream | scalar | tuple


@dataclass(frozen=True)
class CWrapper:
    prefix: str
    wrapper_name: str
    return_type: str
    capi_name: str
    params: tuple[CParam, ...]
    structs: Mapping[str, tuple[tuple[str, str, int | None], ...]]  # typedef -> (type, field, array len)


def parse_export_header(text: str) -> CWrapper:
    """Parse the header written by ``export_to_c``: the wrapper signature and typedefs."""
    m = re.search(
        r"static\s+inline\s+([\w ]+?)\s+(\w+)_wrapper\s*\(\s*(\w+)_Kernel_Module_t\s*\*\s*module\s*,?([^)]*)\)",
        text,
    )
    if not m:
        raise ProbeError("export header: wrapper function not found")
    ret, wname_prefix, prefix, rest = m.group(1).strip(), m.group(2), m.group(3), m.group(4)
    cm = re.search(r"void\s+(_mlir_\w+__mlir_ciface_\w+)\s*\(\s*void\s*\*\*\s*args", text)
    capi = cm.group(1) if cm else ""
    structs: dict[str, tuple[tuple[str, str, int | None], ...]] = {}
    for sm in re.finditer(r"typedef\s+struct(?:\s+__attribute__\(\(\w+\)\))?\s*\{([^{}]*)\}\s*(\w+)\s*;", text):
        fields = []
        for fm in re.finditer(r"([\w][\w\s\*]*?)\s*\b(\w+)\s*(?:\[(\d+)\])?\s*;", sm.group(1)):
            fields.append((" ".join(fm.group(1).split()), fm.group(2), int(fm.group(3)) if fm.group(3) else None))
        structs[sm.group(2)] = tuple(fields)
    params = []
    for decl in [d.strip() for d in rest.split(",") if d.strip()]:
        pm = re.match(r"^(.*?)\s*(\w+)$", decl)
        if not pm:
            raise ProbeError(f"export header: cannot parse parameter {decl!r}")
        ctype, name = " ".join(pm.group(1).split()), pm.group(2)
        base = ctype.replace("*", "").strip()
        if re.fullmatch(rf"{re.escape(prefix)}_TensorList_\w+_t", base):
            kind = "tensor_list"
        elif re.fullmatch(rf"{re.escape(prefix)}_Tensor_\w+_t", base):
            kind = "tensor"
        elif base == "cudaStream_t":
            kind = "stream"
        elif base == "void" and "*" in ctype:
            kind = "pointer"
        elif "*" in ctype:
            kind = "tuple"
        else:
            kind = "scalar"
        params.append(CParam(name=name, c_type=ctype, kind=kind))
    return CWrapper(
        prefix=prefix, wrapper_name=f"{wname_prefix}_wrapper", return_type=ret,
        capi_name=capi, params=tuple(params), structs=structs,
    )


# --------------------------------------------------------------------------------------
# C sources
# --------------------------------------------------------------------------------------

_FAKE_CUDA_RUNTIME_H = (C_SOURCES / "cuda_runtime.h").read_text()

_FAKE_CUDA_FP16_H = (C_SOURCES / "cuda_fp16.h").read_text()

# Stub CUDA runtime / driver.  Every stub appends one line to the log file.
# Struct layouts follow the CUDA 12 ABI (cudaLaunchConfig_t, cudaLaunchAttribute).
_STUBS_C = (C_SOURCES / "stubs.c.in").read_text()

_DRIVER_MAIN_C = (C_SOURCES / "main.c.in").read_text()

# The stubs above define these; anything else starting with "cu" that the object or
# the runtime library references gets a generic "log and return 0" stub.
_DEDICATED = {
    "cudaLaunchKernelExC", "cudaLaunchKernel", "cudaLibraryLoadData", "cudaLibraryLoadFromFile",
    "cudaLibraryGetKernel", "cudaLibraryUnload", "cudaFuncSetAttribute",
    "cudaKernelSetAttributeForDevice", "cudaDeviceGetAttribute", "cudaGetDevice", "cudaSetDevice",
    "cudaGetDeviceCount", "cudaDriverGetVersion", "cudaGetLastError", "cudaGetErrorName",
    "cudaGetErrorString", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaGetDriverEntryPointByVersion", "cudaGetDriverEntryPoint",
}

# Plausible H100 SXM values (cudaDeviceAttr -> value) for host code that queries the device.
DEFAULT_DEVICE_ATTRS: dict[int, int] = {
    1: 1024,  # MaxThreadsPerBlock
    8: 49152,  # MaxSharedMemoryPerBlock
    10: 32,  # WarpSize
    12: 65536,  # MaxRegistersPerBlock
    16: 132,  # MultiProcessorCount
    38: 50 * 1024 * 1024,  # L2CacheSize
    39: 2048,  # MaxThreadsPerMultiProcessor
    75: 9,  # ComputeCapabilityMajor
    76: 0,  # ComputeCapabilityMinor
    81: 233472,  # MaxSharedMemoryPerMultiprocessor
    97: 232448,  # MaxSharedMemoryPerBlockOptin
    106: 32,  # MaxBlocksPerMultiprocessor
    120: 1,  # ClusterLaunch
}

# CUfunction_attribute -> value returned by cuKernelGetAttribute.
DEFAULT_KERNEL_ATTRS: dict[int, int] = {
    0: 1024,  # MAX_THREADS_PER_BLOCK
}


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiCall:
    """One logged stub call: ``name`` and the rest of the log line."""

    name: str
    detail: str


@dataclass(frozen=True)
class CapturedLaunch:
    kernel: str | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] | None
    smem_bytes: int
    params: tuple[bytes, ...]
    ptx_params: tuple[PtxParam, ...]
    stream: int = 0
    attrs: tuple[tuple[int, bytes], ...] = ()  # (cudaLaunchAttributeID, 64-byte value)
    # Per param, a bit mask of the bits the host code actually wrote (1 = defined).
    # Bits left 0 held uninitialised stack (struct padding, unused descriptor bytes):
    # they changed with the stack fill.  ``params`` shows them as 0 (zero fill).
    param_masks: tuple[bytes, ...] = ()
    # From the cubin's .nv.info (when a cubin was given): per-param offsets as the
    # driver sees them, and their constant shift against the PTX offsets.
    cubin_param_offsets: tuple[int, ...] | None = None
    cubin_param_bias: int | None = None
    cubin_param_cbank_size: int | None = None

    def undefined_bytes(self, i: int) -> list[int]:
        """Byte offsets in param ``i`` with at least one undefined bit."""
        if not self.param_masks:
            return []
        return [j for j, m in enumerate(self.param_masks[i]) if m != 0xFF]

    def mismatches(self, params: Sequence[bytes]) -> list[str]:
        """Compare another packing of the same kernel's params with the captured one,
        ignoring undefined bits.  Returns human-readable differences (empty = equal)."""
        out = []
        if len(params) != len(self.params):
            return [f"param count {len(params)} != captured {len(self.params)}"]
        for i, (mine, theirs) in enumerate(zip(self.params, params)):
            if len(mine) != len(theirs):
                out.append(f"param {i}: size {len(theirs)} != captured {len(mine)}")
                continue
            mask = self.param_masks[i] if self.param_masks else b"\xff" * len(mine)
            bad = [j for j in range(len(mine)) if (mine[j] ^ theirs[j]) & mask[j]]
            if bad:
                out.append(
                    f"param {i} ({self.ptx_params[i].name if i < len(self.ptx_params) else '?'}): "
                    f"bytes {bad[:16]}{'...' if len(bad) > 16 else ''} differ: "
                    f"captured {mine.hex()} vs {theirs.hex()}"
                )
        return out

    def param(self, name_suffix_or_index: Union[int, str]) -> bytes:
        if isinstance(name_suffix_or_index, int):
            return self.params[name_suffix_or_index]
        for p, b in zip(self.ptx_params, self.params):
            if p.name.endswith(name_suffix_or_index):
                return b
        raise KeyError(name_suffix_or_index)

    def param_buffer(self) -> bytes:
        """The params laid out at their PTX offsets (zero padding), as in cuLaunchKernel's
        ``CU_LAUNCH_PARAM_BUFFER_POINTER`` form."""
        if not self.ptx_params:
            return b""
        end = self.ptx_params[-1].offset + self.ptx_params[-1].size
        buf = bytearray(end)
        for p, b in zip(self.ptx_params, self.params):
            buf[p.offset : p.offset + p.size] = b
        return bytes(buf)


@dataclass(frozen=True)
class ProbeResult:
    launches: tuple[CapturedLaunch, ...]
    calls: tuple[ApiCall, ...]  # every stub call in order (load, call, unload phases)
    return_value: int | None
    log: str
    unstubbed: tuple[str, ...] = ()
    images: tuple[bytes, ...] = ()  # images given to cudaLibraryLoadData (fatbins)
    # cuTensorMapEncodeTiled calls (only for descriptors built through the driver):
    # dicts with dtype, rank, addr, interleave, swizzle, l2, oob, dims, strides, box, estr
    tensor_map_encodes: tuple[dict, ...] = ()

    def calls_named(self, name: str) -> list[ApiCall]:
        return [c for c in self.calls if c.name == name]


# --------------------------------------------------------------------------------------
# Build + run
# --------------------------------------------------------------------------------------


def find_runtime_static_lib() -> Path | None:
    """``libcuda_dialect_runtime_static.a`` shipped in the nvidia-cutlass-dsl wheel."""
    try:
        import nvidia_cutlass_dsl  # type: ignore
        roots = [Path(p) for p in nvidia_cutlass_dsl.__path__]
    except Exception:  # pragma: no cover - layout differences
        roots = []
    try:
        import cutlass  # type: ignore
        roots.append(Path(cutlass.__file__).resolve().parents[2])
    except Exception:
        pass
    for root in roots:
        for cand in sorted(root.glob("cu*/lib/libcuda_dialect_runtime_static.a")):
            return cand
    return None


def _undefined_symbols(paths: Sequence[Path]) -> set[str]:
    und: set[str] = set()
    defined: set[str] = set()
    for p in paths:
        out = subprocess.run(["nm", "-P", str(p)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2 or line.endswith(":"):
                continue
            (und if parts[1] == "U" else defined).add(parts[0])
    return und - defined


def _c_literal_int(v: int, ctype: str) -> str:
    return f"(({ctype})0x{int(v) & (2**64 - 1):x}ULL)"


def _scalar_init(ctype: str, arg: CScalar | int | float | bool) -> str:
    if not isinstance(arg, CScalar):
        arg = CScalar(arg)
    t = ctype.strip()
    v = arg.value
    if t in ("__half_raw", "__nv_bfloat16"):
        if arg.bits:
            bits = int(v)
        else:
            import numpy as np

            if t == "__half_raw":
                bits = int(np.array(v, dtype=np.float16).view(np.uint16))
            else:
                u = int(np.array(v, dtype=np.float32).view(np.uint32))
                bits = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 & 0xFFFF  # round to nearest even
        return f"{{ 0x{bits:04x} }}"
    if t in ("float", "double"):
        return f"{float(v).hex()}" if t == "double" else f"(float){float(v).hex()}"
    return f"(({t}){int(v)}LL)" if int(v) < 0 else f"(({t}){int(v)}ULL)"


def _tensor_init(wrapper: CWrapper, typedef: str, t: CTensor, pname: str) -> str:
    fields = wrapper.structs.get(typedef)
    if fields is None:
        raise ProbeError(f"header has no typedef {typedef}")
    parts = []
    for ftype, fname, n in fields:
        if fname == "data":
            parts.append(f".data = (void *)0x{t.data:x}ULL")
        elif fname in ("dynamic_shapes", "dynamic_strides"):
            vals = t.dynamic_shapes if fname == "dynamic_shapes" else t.dynamic_strides
            if len(vals) != n:
                raise ProbeError(f"argument {pname}: {fname} needs {n} values, got {len(vals)} ({vals})")
            parts.append(f".{fname} = {{" + ", ".join(f"({ftype}){int(x)}LL" for x in vals) + "}")
        else:
            raise ProbeError(f"unknown field {fname} in {typedef}")
    have = {f[1] for f in fields}
    if t.dynamic_shapes and "dynamic_shapes" not in have:
        raise ProbeError(f"argument {pname}: tensor has no dynamic shapes but values were given")
    if t.dynamic_strides and "dynamic_strides" not in have:
        raise ProbeError(f"argument {pname}: tensor has no dynamic strides but values were given")
    return "{ " + ", ".join(parts) + " }"


def _gen_call(wrapper: CWrapper, args: Union[Sequence[CArg], Mapping[str, CArg]]) -> tuple[str, str]:
    if isinstance(args, Mapping):
        missing = [p.name for p in wrapper.params if p.name not in args]
        extra = set(args) - {p.name for p in wrapper.params}
        if missing or extra:
            raise ProbeError(f"arguments: missing {missing}, unknown {sorted(extra)}")
        vals = [args[p.name] for p in wrapper.params]
    else:
        vals = list(args)
        if len(vals) != len(wrapper.params):
            raise ProbeError(
                f"wrapper takes {len(wrapper.params)} arguments "
                f"({[p.name for p in wrapper.params]}), got {len(vals)}"
            )
    decls, call = [], []
    for i, (p, a) in enumerate(zip(wrapper.params, vals)):
        var = f"cgp_arg{i}"
        base = p.c_type.replace("*", "").strip()
        if p.kind == "tensor":
            if not isinstance(a, CTensor):
                raise ProbeError(f"argument {p.name} needs a CTensor, got {a!r}")
            decls.append(f"    {base} {var} = {_tensor_init(wrapper, base, a, p.name)};")
            call.append(f"&{var}")
        elif p.kind == "tensor_list":
            if not isinstance(a, CTensorList):
                raise ProbeError(f"argument {p.name} needs a CTensorList, got {a!r}")
            elem_t = wrapper.structs[base][0][0]
            inits = ", ".join(_tensor_init(wrapper, elem_t, t, p.name) for t in a.tensors)
            decls.append(f"    {base} {var} = {{ .elements = {{ {inits} }}, .count = {len(a.tensors)} }};")
            call.append(f"&{var}")
        elif p.kind == "stream":
            h = a.handle if isinstance(a, CStream) else int(a)  # type: ignore[arg-type]
            call.append(_c_literal_int(h, "cudaStream_t"))
        elif p.kind == "pointer":
            addr = a.address if isinstance(a, CPointer) else int(a)  # type: ignore[arg-type]
            call.append(f"(void *)0x{addr:x}ULL")
        elif p.kind == "tuple":
            vs = a.values if isinstance(a, CTuple) else tuple(a)  # type: ignore[arg-type]
            decls.append(f"    {base} {var}[{max(1, len(vs))}] = {{" + ", ".join(f"({base}){int(x)}LL" for x in vs) + "};")
            call.append(var)
        else:  # scalar
            if isinstance(a, (CTensor, CTensorList, CPointer, CTuple, CStream)):
                raise ProbeError(f"argument {p.name} ({p.c_type}) needs a scalar, got {a!r}")
            decls.append(f"    {base} {var} = {_scalar_init(base, a)};")  # type: ignore[arg-type]
            call.append(var)
    return "\n".join(decls), "".join(", " + c for c in call)


def _parse_log(text: str, ptx_by_kernel: Mapping[str, PtxEntry]) -> tuple[list[CapturedLaunch], list[ApiCall], int | None, list[str]]:
    launches: list[CapturedLaunch] = []
    calls: list[ApiCall] = []
    unstubbed: list[str] = []
    ret = None
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "CALL":
            name, _, detail = rest.partition(" ")
            calls.append(ApiCall(name, detail))
        elif tag == "UNSTUBBED_DRIVER" or tag == "UNSTUBBED":
            unstubbed.append(rest.split()[0])
            calls.append(ApiCall(rest.split()[0], "UNSTUBBED " + rest))
        elif tag == "ENCODE":
            calls.append(ApiCall("cuTensorMapEncodeTiled", rest))
        elif tag == "LAUNCH":
            m = re.search(r"kernel=(\S+)", rest)
            kname = m.group(1) if m and m.group(1) != "?" else None
            cur = {"kernel": kname, "attrs": [], "params": [], "cluster": None, "stream": 0}
            calls.append(ApiCall("cudaLaunchKernelExC", rest))
        elif cur is not None and tag in ("GRID", "BLOCK"):
            cur[tag.lower()] = tuple(int(x) for x in rest.split())
        elif cur is not None and tag == "SMEM":
            cur["smem"] = int(rest)
        elif cur is not None and tag == "STREAM":
            cur["stream"] = 0 if rest in ("(nil)", "0") else int(rest, 16)
        elif cur is not None and tag == "ATTR":
            aid, hx = rest.split()
            val = bytes.fromhex(hx)
            cur["attrs"].append((int(aid), val))
            if int(aid) == 4:  # cudaLaunchAttributeClusterDimension
                cur["cluster"] = tuple(int.from_bytes(val[4 * i : 4 * i + 4], "little") for i in range(3))
        elif cur is not None and tag == "PARAM":
            _, size, hx = rest.split(" ", 2) if rest.count(" ") >= 2 else (*rest.split(" "), "")
            b = bytes.fromhex(hx.strip())
            if len(b) != int(size):
                raise ProbeError(f"bad PARAM line {line!r}")
            cur["params"].append(b)
        elif cur is not None and tag == "ENDLAUNCH":
            k = cur["kernel"]
            entry = ptx_by_kernel.get(k) if k else (next(iter(ptx_by_kernel.values())) if len(ptx_by_kernel) == 1 else None)
            launches.append(
                CapturedLaunch(
                    kernel=k, grid=cur["grid"], block=cur["block"], cluster=cur["cluster"],
                    smem_bytes=cur["smem"], params=tuple(cur["params"]),
                    ptx_params=entry.params if entry else (), stream=cur["stream"],
                    attrs=tuple(cur["attrs"]),
                )
            )
            cur = None
        elif tag == "RETURN":
            ret = int(rest)
    return launches, calls, ret, unstubbed


def probe_exported(
    header: Union[str, Path],
    objects: Sequence[Union[str, Path]],
    ptx: str,
    args: Union[Sequence[CArg], Mapping[str, CArg]],
    workdir: Union[str, Path],
    *,
    runtime_lib: Union[str, Path, None] = None,
    device_attrs: Mapping[int, int] | None = None,
    kernel_attrs: Mapping[int, int] | None = None,
    cc: str | None = None,
    keep_images: bool = False,
    fills: Sequence[int] = (0x00, 0xFF),
    cubin: bytes | None = None,
    timeout: float = 60.0,
) -> ProbeResult:
    """Link an ``export_to_c`` header/object pair against CUDA stubs, run it, parse the log.

    ``args`` are the values of the wrapper's arguments after ``module`` (positional or
    by name).  The executable runs in a subprocess (a crash cannot take the caller
    down), once per value in ``fills`` (the byte the stack is filled with before the
    host code runs); the first run's bytes are reported, and bits that differ
    between runs are marked undefined in ``CapturedLaunch.param_masks``.  With
    ``cubin``, each launch's PTX parameter layout is checked against the cubin's
    ``.nv.info`` table (same sizes, offsets shifted by one constant).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    header = Path(header)
    text = header.read_text()
    wrapper = parse_export_header(text)
    entries = parse_ptx_entries(ptx)
    if not entries:
        raise ProbeError("no .entry in the PTX")
    by_name = {e.name: e for e in entries}

    rt = Path(runtime_lib) if runtime_lib else find_runtime_static_lib()
    if rt is None or not rt.exists():
        raise ProbeError("libcuda_dialect_runtime_static.a not found (nvidia-cutlass-dsl wheel)")
    objs = [Path(o) for o in objects]

    # Generic stubs for whatever else the object + runtime library reference.
    und = _undefined_symbols([*objs, rt])
    generic = sorted(
        s for s in und if re.match(r"^(cu|cuda)[A-Z]\w*$", s) and s not in _DEDICATED
    )
    gen_stubs = "\n".join(
        f'int {s}() {{ cgp_printf("UNSTUBBED {s}\\n"); return 0; }}' for s in generic
    )

    ktab = []
    for i, e in enumerate(entries):
        sizes = ", ".join(str(p.size) for p in e.params) or "0"
        ktab.append(f"static const int cgp_sizes{i}[] = {{ {sizes} }};")
    ktab.append(
        "static const cgp_kernel_t cgp_kernels[] = { "
        + ", ".join(f'{{"{e.name}", {len(e.params)}, cgp_sizes{i}}}' for i, e in enumerate(entries))
        + " };"
    )
    ktab.append(f"static const int cgp_nkernels = {len(entries)};")
    dattr = {**DEFAULT_DEVICE_ATTRS, **(device_attrs or {})}
    kattr = {**DEFAULT_KERNEL_ATTRS, **(kernel_attrs or {})}
    stubs = (
        _STUBS_C.replace("@KERNEL_TABLE@", "\n".join(ktab))
        .replace("@DEVATTRS@", " ".join(f"{{{k}, {v}}}," for k, v in sorted(dattr.items())))
        .replace("@KATTRS@", " ".join(f"{{{k}, {v}}}," for k, v in sorted(kattr.items())))
        .replace("@GENERIC_STUBS@", gen_stubs)
    )

    inc = workdir / "include"
    inc.mkdir(exist_ok=True)
    (inc / "cuda_runtime.h").write_text(_FAKE_CUDA_RUNTIME_H)
    (inc / "cuda_fp16.h").write_text(_FAKE_CUDA_FP16_H)
    (workdir / "cgp_stubs.c").write_text(stubs)
    decls, call_args = _gen_call(wrapper, args)
    void_ret = wrapper.return_type == "void"
    main_c = (
        _DRIVER_MAIN_C.replace("@HEADER@", str(header.resolve()))
        .replace("@PREFIX@", wrapper.prefix)
        .replace("@DECLS@", decls)
        .replace("@RET_DECL@", "" if void_ret else f"{wrapper.return_type} cgp_ret = ")
        .replace("@WRAPPER@", wrapper.wrapper_name)
        .replace("@CALL_ARGS@", call_args)
        .replace("@RET_EXPR@", "0" if void_ret else "cgp_ret")
    )
    (workdir / "cgp_main.c").write_text(main_c)

    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise ProbeError("no C compiler (gcc/cc) found")
    exe = workdir / "cgp_probe"
    cmd = [
        cc, "-O0", "-g0", "-w", "-I", str(inc),
        str(workdir / "cgp_main.c"), str(workdir / "cgp_stubs.c"),
        *[str(o) for o in objs], str(rt),
        "-o", str(exe), "-no-pie",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ProbeError(f"link failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")

    env = dict(os.environ)
    img_dir = workdir / "images"
    if keep_images:
        img_dir.mkdir(exist_ok=True)
        env["CGP_IMAGE_DIR"] = str(img_dir)
    runs = []
    for k, fill in enumerate(fills):
        log_path = workdir / f"cgp_log{k}.txt"
        r = subprocess.run([str(exe), str(log_path), str(int(fill))], capture_output=True, text=True,
                           timeout=timeout, env=env)
        log = log_path.read_text() if log_path.exists() else ""
        if r.returncode != 0:
            raise ProbeError(
                f"probe exited with {r.returncode}\nstdout: {r.stdout[-2000:]}\n"
                f"stderr: {r.stderr[-2000:]}\nlog:\n{log[-4000:]}"
            )
        if "Got Cuda Error" in r.stdout:
            raise ProbeError(f"the DSL's host code reported a CUDA error:\n{r.stdout[-2000:]}\nlog:\n{log[-4000:]}")
        runs.append((log, *_parse_log(log, by_name)))
        env.pop("CGP_IMAGE_DIR", None)  # one copy is enough

    log, launches, calls, ret, unstubbed = runs[0]
    encodes = []
    for c in calls:
        if c.name == "cuTensorMapEncodeTiled":
            e: dict[str, Any] = {}
            for kv in c.detail.split()[1:]:
                k, _, v = kv.partition("=")
                if k in ("dims", "strides", "box", "estr"):
                    e[k] = [int(x) for x in v.split(",") if x]
                elif k == "addr":
                    e[k] = 0 if v in ("(nil)", "0") else int(v, 16)
                else:
                    e[k] = int(v)
            encodes.append(e)
    # Bits that differ between runs with different stack fills were never written.
    merged = []
    for li, launch in enumerate(launches):
        masks = [bytearray(b"\xff" * len(p)) for p in launch.params]
        for _, other, *_ in runs[1:]:
            if len(other) != len(launches):
                raise ProbeError("launch count changed with the stack fill")
            o = other[li]
            if (o.grid, o.block, o.cluster, o.smem_bytes, o.kernel) != (
                launch.grid, launch.block, launch.cluster, launch.smem_bytes, launch.kernel
            ):
                raise ProbeError(f"launch configuration changed with the stack fill: {launch} vs {o}")
            for m, a, b in zip(masks, launch.params, o.params):
                for j in range(len(m)):
                    m[j] &= ~(a[j] ^ b[j]) & 0xFF
        merged.append(
            CapturedLaunch(
                kernel=launch.kernel, grid=launch.grid, block=launch.block, cluster=launch.cluster,
                smem_bytes=launch.smem_bytes, params=launch.params, ptx_params=launch.ptx_params,
                stream=launch.stream, attrs=launch.attrs, param_masks=tuple(bytes(m) for m in masks),
            )
        )
    if cubin is not None:
        import dataclasses

        table = parse_cubin_kparams(cubin)
        checked = []
        for launch in merged:
            kp = table.get(launch.kernel or "") or (next(iter(table.values())) if len(table) == 1 else None)
            entry = by_name.get(launch.kernel or "")
            if kp is None or entry is None:
                raise ProbeError(f"kernel {launch.kernel!r} not in the cubin/PTX")
            bias = kp.bias_against(entry)
            checked.append(dataclasses.replace(
                launch, cubin_param_offsets=tuple(p.offset for p in kp.params),
                cubin_param_bias=bias, cubin_param_cbank_size=kp.cbank_size,
            ))
        merged = checked
    images: list[bytes] = []
    if keep_images:
        images = [p.read_bytes() for p in sorted(img_dir.glob("image*.bin"))]
    return ProbeResult(
        launches=tuple(merged), calls=tuple(calls), return_value=ret, log=log,
        unstubbed=tuple(unstubbed), images=tuple(images), tensor_map_encodes=tuple(encodes),
    )


def _compiled_ptx(compiled: Any) -> str:
    """PTX text of a ``cute.compile`` result (needs ``--keep-ptx``).

    Pitfall: the DSL stores the *path* of the dumped PTX and only replaces it with
    the text if the file exists; with ``--dump-dir`` naming a missing directory
    nothing is written and ``__ptx__`` is just that path.
    """
    v = None
    try:
        v = compiled.__ptx__
    except Exception:
        art = getattr(compiled, "artifacts", None)
        v = getattr(art, "PTX", None) if art is not None else None
    if isinstance(v, str) and ".entry" not in v and len(v) < 4096:
        if os.path.isfile(v):
            v = Path(v).read_text()
        else:
            raise ProbeError(
                f"compiled function has no PTX text (got {v!r}); compile with "
                "options='--keep-ptx' and a --dump-dir that exists"
            )
    if not v:
        raise ProbeError("compiled function has no PTX; compile with options='--keep-ptx'")
    return v


def _compiled_cubin(compiled: Any) -> bytes | None:
    """cubin bytes of a ``cute.compile`` result, when it was compiled with --keep-cubin."""
    try:
        v = compiled.__cubin__
    except Exception:
        return None
    if isinstance(v, str) and os.path.isfile(v):
        v = Path(v).read_bytes()
    return v if isinstance(v, (bytes, bytearray)) and v[:4] == b"\x7fELF" else None


def capture_launches(
    compiled: Any,
    args: Union[Sequence[CArg], Mapping[str, CArg]],
    workdir: Union[str, Path, None] = None,
    *,
    prefix: str = "cgp",
    **kw: Any,
) -> ProbeResult:
    """Export ``compiled`` (a ``cute.compile`` result) with ``export_to_c`` and probe it."""
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="cutegen_abi_probe_")
        workdir = tmp.name
    try:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        ptx = _compiled_ptx(compiled)
        if "cubin" not in kw:
            kw["cubin"] = _compiled_cubin(compiled)
        compiled.export_to_c(str(workdir), prefix, prefix)
        return probe_exported(
            workdir / f"{prefix}.h", [workdir / f"{prefix}.o"], ptx, args, workdir / "probe", **kw
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


def capture_launch(
    compiled: Any,
    args: Union[Sequence[CArg], Mapping[str, CArg]],
    workdir: Union[str, Path, None] = None,
    **kw: Any,
) -> CapturedLaunch:
    """The single kernel launch made by ``compiled`` for these argument values."""
    res = capture_launches(compiled, args, workdir, **kw)
    if res.unstubbed:
        raise ProbeError(f"host code used unstubbed CUDA functions {res.unstubbed}:\n{res.log[-3000:]}")
    if len(res.launches) != 1:
        raise ProbeError(f"expected one launch, captured {len(res.launches)}:\n{res.log[-3000:]}")
    launch = res.launches[0]
    if len(launch.params) != len(launch.ptx_params):
        raise ProbeError(f"launched kernel {launch.kernel!r} not found among the PTX entries")
    return launch
