"""Parse a kernel's PTX `.entry`: name, parameters (offset, size, alignment) and `.reqntid`."""

from __future__ import annotations

import dataclasses
import re

_SCALAR_BYTES = {
    "u8": 1, "s8": 1, "b8": 1, "pred": 1,
    "u16": 2, "s16": 2, "b16": 2, "f16": 2, "bf16": 2,
    "u32": 4, "s32": 4, "b32": 4, "f32": 4,
    "u64": 8, "s64": 8, "b64": 8, "f64": 8,
}

_ENTRY_RE = re.compile(r"\.entry\s+(\S+?)\s*\((.*?)\)", re.S)
_PARAM_RE = re.compile(
    r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(?:\.ptr\s+\S+\s+)?([\w$]+)(?:\[(\d+)\])?"
)
_REQNTID_RE = re.compile(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


class PtxParseError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class PtxParam:
    name: str
    offset: int
    size: int
    align: int
    ptx_type: str


@dataclasses.dataclass(frozen=True)
class PtxEntry:
    name: str
    params: tuple[PtxParam, ...]
    reqntid: tuple[int, int, int] | None
    version: str | None
    target: str | None

    @property
    def param_bytes(self) -> int:
        return 0 if not self.params else self.params[-1].offset + self.params[-1].size


def parse_ptx_entry(ptx: str) -> PtxEntry:
    """Parse the single `.entry` of a PTX module; offsets use natural alignment in declaration order."""
    entries = list(_ENTRY_RE.finditer(ptx))
    if len(entries) != 1:
        raise PtxParseError(f"expected exactly one .entry in the PTX, found {len(entries)}")
    match = entries[0]
    name, body = match.group(1), match.group(2)
    params: list[PtxParam] = []
    offset = 0
    for decl in (d.strip() for d in body.split(",")):
        if not decl:
            continue
        pm = _PARAM_RE.match(decl)
        if pm is None:
            raise PtxParseError(f"cannot parse parameter declaration {decl!r}")
        align_s, ptx_type, pname, count_s = pm.groups()
        if ptx_type not in _SCALAR_BYTES:
            raise PtxParseError(f"unknown PTX parameter type .{ptx_type} in {decl!r}")
        elem = _SCALAR_BYTES[ptx_type]
        size = elem * (int(count_s) if count_s else 1)
        align = int(align_s) if align_s else elem
        offset = (offset + align - 1) // align * align
        params.append(PtxParam(pname, offset, size, align, ptx_type))
        offset += size
    tail = ptx[match.end(): match.end() + 400]
    rq = _REQNTID_RE.search(tail.split("{", 1)[0])
    reqntid = None
    if rq:
        dims = [int(x) if x else 1 for x in rq.groups()]
        reqntid = (dims[0], dims[1], dims[2])
    version = re.search(r"^\s*\.version\s+(\S+)", ptx, re.M)
    target = re.search(r"^\s*\.target\s+(\S+)", ptx, re.M)
    return PtxEntry(
        name=name,
        params=tuple(params),
        reqntid=reqntid,
        version=version.group(1) if version else None,
        target=target.group(1).rstrip(",") if target else None,
    )
