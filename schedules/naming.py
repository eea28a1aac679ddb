"""Procedural kernel names: one readable, CUTLASS-style name per `Schedule`, and its inverse.

A GEMM's name encodes every field of the schedule, in a fixed order, as 17 parts joined by ``_``::

    cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8

    parts in order: prefix, arch, op, a/b/c/acc dtypes, scale format (nosf, sff32, sfue8m0),
    tile_m x tile_n x tile_k, cluster cMxN, multicast, stages sN, math warpgroups wgN,
    registers rPRODUCERxCONSUMER, epilogue, raster, swizzle group gN.

A GEMM whose operand layout is not the default ``nt`` (`Layout`: which of A and B is MN-major)
names it in an 18th part, e.g. ``..._epitma_rm_g8_tn``; ``nt`` is never written, so a name of 18
parts ending in ``nt`` is not canonical. A GEMM whose epilogue adds a bias (`Bias`) names it
next (``bias``), and one whose epilogue applies an activation (`Activation`) names it in a last
part, e.g. ``..._epitma_rm_g8_swiglu`` or ``..._epitma_rm_g8_bias_gelu``; ``none`` is never written.
A quantized output whose scales are rounded to powers of two (`OutputScale`) adds ``ue8m0``
(``..._g8_swiglu_ue8m0``); ``f32`` is never written. A GEMM whose MMA takes B's rows as its M
side (`OperandRoles`) adds ``swapab`` last (``..._epitma_rm_g8_swapab``); ``ab`` is never written.

A quantizer whose unused fields hold their neutral values (`Schedule.quant_neutral`, every valid
one) is named by the fields it uses, 9 parts::

    cutegen_sm90a_ptquant_bf16_e4m3_sfue8m0_8x512x128_s1_wg2

    prefix, arch, op, input dtype, output dtype, scale format, tile, stages, warpgroups.

Enum fields use the enum's ``tag`` (lower-cased) where it has one, else its value. Integers are
written in decimal without leading zeros; a negative integer (never valid, but the mapping is
total) is written with an ``n`` prefix, e.g. ``n8``. Names only use ``[a-z0-9_]`` so they serve as
directory names, and `parse_name` is the exact inverse of `procedural_name`.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Callable

from .spec import (
    _FIELD_TYPES,
    QUANT_NEUTRAL,
    Activation,
    Arch,
    Bias,
    DType,
    Epilogue,
    Layout,
    Multicast,
    Op,
    OperandRoles,
    OutputScale,
    Raster,
    ScaleFormat,
    Schedule,
)

PREFIX = "cutegen"
NAME_RE = re.compile(r"^[a-z0-9_]+$")
_TAG_RE = re.compile(r"^[a-z0-9]+$")
_INT = r"(?:0|n?[1-9][0-9]*)"


def _enum_tag(member: enum.Enum) -> str:
    tag = getattr(member, "tag", None)
    return str(tag if tag is not None else member.value).lower()


def _build_tags(cls: type[enum.Enum]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in cls:
        t = _enum_tag(m)
        if not _TAG_RE.match(t):
            raise RuntimeError(f"{cls.__name__}.{m.name}: name tag {t!r} must match [a-z0-9]+")
        if t in out:
            raise RuntimeError(
                f"{cls.__name__}: members {out[t].name} and {m.name} share the name tag {t!r}; "
                "procedural names would be ambiguous"
            )
        out[t] = m
    return out


_TAGS: dict[type, dict[str, Any]] = {
    cls: _build_tags(cls) for cls in (Arch, Op, DType, ScaleFormat, Multicast, Epilogue, Raster, Layout, Bias, Activation, OutputScale, OperandRoles)
}


def _int(v: Any, field: str) -> str:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"schedule field {field!r} must be an int, got {type(v).__name__} {v!r}")
    return f"n{-v}" if v < 0 else str(v)


def _enum(v: Any, field: str) -> str:
    cls = _FIELD_TYPES[field]
    try:
        member = cls(v)
    except ValueError:
        raise TypeError(f"schedule field {field!r}: {v!r} is not a {cls.__name__}") from None
    return _enum_tag(member)


# The quantizers' short form (`Schedule.quant_neutral`): the parts of the fields a quantize kernel
# uses, by their place in the full name (prefix, arch, op, a_dtype, c_dtype, scale, tile, stages,
# math warpgroups).
_QUANT_PARTS_AT = (0, 1, 2, 3, 5, 7, 8, 11, 12)


def procedural_name(s: Schedule) -> str:
    """The kernel name of `s`; distinct schedules have distinct names."""
    parts = [
        PREFIX,
        _enum(s.arch, "arch"),
        _enum(s.op, "op"),
        _enum(s.a_dtype, "a_dtype"),
        _enum(s.b_dtype, "b_dtype"),
        _enum(s.c_dtype, "c_dtype"),
        _enum(s.acc_dtype, "acc_dtype"),
        _enum(s.scale, "scale"),
        f"{_int(s.tile_m, 'tile_m')}x{_int(s.tile_n, 'tile_n')}x{_int(s.tile_k, 'tile_k')}",
        f"c{_int(s.cluster_m, 'cluster_m')}x{_int(s.cluster_n, 'cluster_n')}",
        _enum(s.multicast, "multicast"),
        f"s{_int(s.stages, 'stages')}",
        f"wg{_int(s.math_warpgroups, 'math_warpgroups')}",
        f"r{_int(s.producer_regs, 'producer_regs')}x{_int(s.consumer_regs, 'consumer_regs')}",
        _enum(s.epilogue, "epilogue"),
        _enum(s.raster, "raster"),
        f"g{_int(s.group_size, 'group_size')}",
    ]
    if s.quant_neutral:
        parts = [parts[i] for i in _QUANT_PARTS_AT]
    else:
        if s.layout != Layout.NT:
            parts.append(_enum(s.layout, "layout"))
        if s.bias != Bias.NONE:
            parts.append(_enum(s.bias, "bias"))
        if s.activation != Activation.NONE:
            parts.append(_enum(s.activation, "activation"))
        if s.d_scale != OutputScale.F32:
            parts.append(_enum(s.d_scale, "d_scale"))
        if s.operand_roles != OperandRoles.AB:
            parts.append(_enum(s.operand_roles, "operand_roles"))
    return "_".join(parts)


# ---- parsing -----------------------------------------------------------------------------------


def _parse_int(text: str) -> int:
    return -int(text[1:]) if text.startswith("n") else int(text)


def _ints(pattern: str, fields: tuple[str, ...], what: str) -> Callable[[str], dict[str, Any]]:
    rx = re.compile("^" + pattern.format(i=f"({_INT})") + "$")

    def parse(part: str) -> dict[str, Any]:
        m = rx.match(part)
        if not m:
            raise ValueError(f"{part!r} is not {what}")
        return {f: _parse_int(g) for f, g in zip(fields, m.groups())}

    return parse


def _tag(field: str) -> Callable[[str], dict[str, Any]]:
    cls = _FIELD_TYPES[field]
    tags = _TAGS[cls]

    def parse(part: str) -> dict[str, Any]:
        if part not in tags:
            raise ValueError(f"{part!r} is not a {field} tag (known: {', '.join(tags)})")
        return {field: tags[part]}

    return parse


# One parser per '_'-separated part, in name order (after the prefix).
_PARTS: tuple[Callable[[str], dict[str, Any]], ...] = (
    _tag("arch"),
    _tag("op"),
    _tag("a_dtype"),
    _tag("b_dtype"),
    _tag("c_dtype"),
    _tag("acc_dtype"),
    _tag("scale"),
    _ints("{i}x{i}x{i}", ("tile_m", "tile_n", "tile_k"), "a tile TILE_MxTILE_NxTILE_K, e.g. 128x256x64"),
    _ints("c{i}x{i}", ("cluster_m", "cluster_n"), "a cluster cMxN, e.g. c2x1"),
    _tag("multicast"),
    _ints("s{i}", ("stages",), "a stage count sN, e.g. s4"),
    _ints("wg{i}", ("math_warpgroups",), "a math warpgroup count wgN, e.g. wg2"),
    _ints("r{i}x{i}", ("producer_regs", "consumer_regs"), "registers rPRODUCERxCONSUMER, e.g. r40x232"),
    _tag("epilogue"),
    _tag("raster"),
    _ints("g{i}", ("group_size",), "a group size gN, e.g. g8"),
)

# A GEMM whose layout is not "nt" names it in one more part, then one with a bias names it
# ("bias"), then one whose activation is not "none" names that, then one whose quantized output's
# scales are rounded to powers of two names that ("ue8m0"), then one whose MMA takes B's rows as
# its M side names that ("swapab") in a last part.
_OPTIONAL_PARTS = (
    (_tag("layout"), Layout.NT), (_tag("bias"), Bias.NONE), (_tag("activation"), Activation.NONE),
    (_tag("d_scale"), OutputScale.F32), (_tag("operand_roles"), OperandRoles.AB),
)

# The short form's parsers (`_QUANT_PARTS_AT`).
_QUANT_PARTS = tuple(_PARTS[i - 1] for i in _QUANT_PARTS_AT[1:])

_EXAMPLE = "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_128x256x64_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8"


def parse_name(name: str) -> Schedule:
    """The schedule named `name` (exact inverse of `procedural_name`); ValueError if malformed."""
    if not isinstance(name, str):
        raise ValueError(f"a kernel name must be a string, got {type(name).__name__}")
    parts = name.split("_")
    if parts[0] != PREFIX:
        raise ValueError(f"{name!r} is not a cutegen kernel name: it must start with '{PREFIX}_' (e.g. {_EXAMPLE})")
    optional = len(parts) - 1 - len(_PARTS)
    if len(parts) == 1 + len(_QUANT_PARTS):
        grammar = _QUANT_PARTS
    elif 0 <= optional <= len(_OPTIONAL_PARTS):
        grammar = _PARTS
    else:
        raise ValueError(
            f"{name!r} is not a cutegen kernel name: expected {1 + len(_PARTS)} '_'-separated "
            f"parts (one more each for a layout other than nt, a bias, an activation, rounded output scales and swapped operand roles; a quantizer: "
            f"{1 + len(_QUANT_PARTS)}), got {len(parts)} (e.g. {_EXAMPLE})"
        )
    values: dict[str, Any] = {}
    for i, (part, parser) in enumerate(zip(parts[1:], grammar), start=2):
        try:
            values.update(parser(part))
        except ValueError as exc:
            raise ValueError(f"{name!r} is not a cutegen kernel name: part {i}: {exc}") from None
    if grammar is _PARTS:
        # The trailing parts: each optional one in its order, recognised by its tags.
        rest = parts[1 + len(_PARTS):]
        for parser, _default in _OPTIONAL_PARTS:
            if rest:
                try:
                    values.update(parser(rest[0]))
                    rest = rest[1:]
                except ValueError:
                    pass
        if rest:
            raise ValueError(
                f"{name!r} is not a cutegen kernel name: part {len(parts) - len(rest) + 1} "
                f"({rest[0]!r}) is not a layout, bias, activation, output scale or operand roles tag, or is out of order"
            )
    if grammar is _QUANT_PARTS:
        if not values["op"].is_quantize:
            raise ValueError(f"{name!r} is not a cutegen kernel name: the short form names quantizers only")
        values = {**QUANT_NEUTRAL, "b_dtype": values["a_dtype"], **values}
    s = Schedule(**values)
    if procedural_name(s) != name:  # pragma: no cover - guarded by the grammar above
        raise ValueError(f"{name!r} is not a canonical cutegen kernel name ({procedural_name(s)})")
    return s


def is_kernel_name(name: str) -> bool:
    try:
        parse_name(name)
    except ValueError:
        return False
    return True

