"""Parse PTX `.entry` declarations: name, parameters (offset, size, alignment) and launch directives."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


_PTX_TYPE_SIZE = {
    "b8": 1, "u8": 1, "s8": 1,
    "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
    "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
    "b64": 8, "u64": 8, "s64": 8, "f64": 8,
    "b128": 16,
}


@dataclass(frozen=True)
class PtxParam:
    """One kernel parameter of a PTX ``.entry``.

    ``offset`` is the byte offset in the kernel parameter buffer, computed with the
    parameter's alignment in declaration order (the layout the driver uses).
    ``ptx_type`` is the element type without the dot (``u32``, ``b8``, ...).
    """

    name: str
    offset: int
    size: int
    align: int
    ptx_type: str
    count: int = 1  # array length (1 for a scalar)
    is_ptr: bool = False


@dataclass(frozen=True)
class PtxEntry:
    name: str
    params: tuple[PtxParam, ...]
    reqntid: tuple[int, ...] | None = None
    maxntid: tuple[int, ...] | None = None
    minnctapersm: int | None = None
    reqnctapercluster: tuple[int, ...] | None = None
    explicitcluster: bool = False
    maxclusterrank: int | None = None

    @property
    def param_bytes(self) -> int:
        """Size of the whole parameter buffer (end of the last parameter)."""
        if not self.params:
            return 0
        last = self.params[-1]
        return last.offset + last.size

    @property
    def param_sizes(self) -> list[int]:
        return [p.size for p in self.params]


def _strip_ptx_comments(ptx: str) -> str:
    ptx = re.sub(r"/\*.*?\*/", " ", ptx, flags=re.S)
    return re.sub(r"//[^\n]*", "", ptx)


_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*\(([^)]*)\)([^{]*)\{", re.S)
_PARAM_RE = re.compile(
    r"^\.param\s+(?P<quals>(?:\.[\w]+\s+(?:\d+\s+)?)*?)\.(?P<ty>[busf]\d+(?:x2)?|bf16(?:x2)?)\s+"
    r"(?P<attrs>(?:\.[\w]+\s+(?:\d+\s+)?)*)(?P<name>[A-Za-z_$%][\w$%]*)\s*(?:\[\s*(?P<n>\d+)\s*\])?$"
)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s))


def _parse_one_param(text: str, offset: int) -> PtxParam:
    text = " ".join(text.split())
    m = _PARAM_RE.match(text)
    if not m:
        raise ValueError(f"cannot parse PTX parameter declaration: {text!r}")
    ty = m.group("ty")
    if ty not in _PTX_TYPE_SIZE:
        raise ValueError(f"unknown PTX parameter type .{ty} in {text!r}")
    elem = _PTX_TYPE_SIZE[ty]
    count = int(m.group("n")) if m.group("n") is not None else 1
    quals = (m.group("quals") or "") + " " + (m.group("attrs") or "")
    am = re.search(r"\.align\s+(\d+)", quals)
    # `.param .u64 .ptr .global .align 16 p` -- the .align after .ptr is the
    # alignment of the *pointee*, not of the parameter slot.
    is_ptr = ".ptr" in quals
    align = elem
    if am and not (is_ptr and am.start() > quals.find(".ptr")):
        align = int(am.group(1))
    offset = (offset + align - 1) // align * align
    return PtxParam(
        name=m.group("name"), offset=offset, size=elem * count, align=align,
        ptx_type=ty, count=count, is_ptr=is_ptr,
    )


def parse_ptx_entries(ptx: str) -> list[PtxEntry]:
    """All ``.entry`` functions of a PTX module, in file order."""
    src = _strip_ptx_comments(ptx)
    entries = []
    for m in _ENTRY_RE.finditer(src):
        name, plist, directives = m.group(1), m.group(2), m.group(3)
        params = []
        off = 0
        for decl in plist.split(","):
            if not decl.strip():
                continue
            p = _parse_one_param(decl.strip(), off)
            params.append(p)
            off = p.offset + p.size
        kw: dict[str, Any] = {}
        for d in re.finditer(
            r"\.(reqntid|maxntid|minnctapersm|reqnctapercluster|maxclusterrank|explicitcluster)\b([\s\d,]*)",
            directives,
        ):
            key, val = d.group(1), d.group(2)
            if key == "explicitcluster":
                kw[key] = True
            elif key in ("minnctapersm", "maxclusterrank"):
                kw[key] = _ints(val)[0]
            else:
                kw[key] = _ints(val)
        entries.append(PtxEntry(name=name, params=tuple(params), **kw))
    return entries


def parse_ptx_entry(ptx: str, name: str | None = None) -> PtxEntry:
    """The ``.entry`` named ``name`` (or the only one) of a PTX module."""
    entries = parse_ptx_entries(ptx)
    if name is not None:
        for e in entries:
            if e.name == name:
                return e
        raise ValueError(f"no .entry {name!r} in PTX (have {[e.name for e in entries]})")
    if len(entries) != 1:
        raise ValueError(f"expected exactly one .entry in PTX, found {len(entries)}")
    return entries[0]


def ptx_version(ptx: str) -> str | None:
    """The module's `.version` (the PTX ISA version)."""
    m = re.search(r"^\s*\.version\s+(\S+)", ptx, re.M)
    return m.group(1) if m else None


def ptx_target(ptx: str) -> str | None:
    """The module's `.target` (e.g. sm_90a)."""
    m = re.search(r"^\s*\.target\s+([\w]+)", ptx, re.M)
    return m.group(1) if m else None
