"""Schedule files: TOML families of schedules, expanded into `Schedule` objects.

A file holds one or more families::

    [[family]]
    name = "hopper_bf16_gemm"
    description = "..."

    [family.base]            # any Schedule field; "stages" may be "auto"
    arch = "sm_90a"
    ...

    [family.sweep]           # axes, expanded as a cartesian product (in file order)
    tile = [ {tile_m = 128, tile_n = 128, math_warpgroups = 2}, ... ]
    group_size = [8, 16]     # a plain list of scalars when the axis is itself a field

A sweep entry overrides the base; two axes may not set the same field. ``stages = "auto"``
resolves to the largest stage count (at most `AUTO_MAX_STAGES`) whose shared memory fits the
architecture's opt-in limit.

``extends = "other_family"`` starts a family's base from another family's (itself resolved the
same way), its own base fields overriding; the sweep is the family's own. The other family is
looked up in the same file, then in the shipped schedule files, so a file of new tiles can say
``extends = "hopper_fp8_gemm"`` and give only what differs.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
import tomllib
from pathlib import Path
from typing import Any, Iterable

from .naming import procedural_name
from .predicates import Violation, violations
from .spec import _FIELD_TYPES, QUANT_NEUTRAL, Arch, Op, Schedule

AUTO = "auto"
AUTO_MAX_STAGES = 8
AUTO_MIN_STAGES = 2
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Schedule))
# Fields a schedule file may leave out: they take their default (`Schedule.layout`: "nt").
DEFAULTED = frozenset(f.name for f in dataclasses.fields(Schedule) if f.default is not dataclasses.MISSING)
_FAMILY_KEYS = ("name", "description", "extends", "base", "sweep")
# A family whose sweep expands to more points than this is refused before it is expanded (a
# mistyped axis can mean millions of points and minutes of listing); `--max-points` raises it.
MAX_POINTS = 10_000


class ScheduleFileError(ValueError):
    """A schedule file that cannot be read: bad TOML, unknown field, bad value or bad sweep."""


@dataclasses.dataclass(frozen=True)
class Expanded:
    """One point of a family's sweep: its schedule (None if it could not be built) and verdict."""

    family: str
    schedule: Schedule | None
    violations: tuple[Violation, ...]
    source: str = "<memory>"
    stages_auto: bool = False

    @property
    def valid(self) -> bool:
        return self.schedule is not None and not self.violations

    @property
    def name(self) -> str | None:
        return procedural_name(self.schedule) if self.schedule is not None else None


# ---- value checking ----------------------------------------------------------------------------


def _where(source: str, family: str, axis: str | None = None, entry: int | None = None) -> str:
    out = f"{source}: family {family!r}"
    if axis is not None:
        out += f": sweep axis {axis!r}"
        if entry is not None:
            out += f" entry {entry}"
    return out


def _convert(field: str, value: Any, where: str) -> Any:
    """The typed value of `field`, or ScheduleFileError naming `where` and the field."""
    if field not in _FIELD_TYPES:
        raise ScheduleFileError(
            f"{where}: unknown field {field!r} (schedule fields: {', '.join(FIELDS)})"
        )
    typ = _FIELD_TYPES[field]
    if field == "stages" and isinstance(value, str) and value.lower() == AUTO:
        return AUTO
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        if not isinstance(value, str):
            raise ScheduleFileError(
                f"{where}: field {field!r}: expected a string, got {type(value).__name__} {value!r}"
            )
        try:
            return typ(value.lower())
        except ValueError:
            known = ", ".join(repr(m.value) for m in typ)
            raise ScheduleFileError(
                f"{where}: field {field!r}: {value!r} is not a valid {typ.__name__} "
                f"(expected one of {known})"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int):
        extra = ' or "auto"' if field == "stages" else ""
        raise ScheduleFileError(
            f"{where}: field {field!r}: expected an integer{extra}, "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _convert_table(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ScheduleFileError(f"{where}: expected a table, got {type(table).__name__} {table!r}")
    return {k: _convert(k, v, where) for k, v in table.items()}


def resolve_auto_stages(fields: dict[str, Any]) -> Schedule:
    """The schedule with the largest stage count (<= 8) that fits shared memory.

    If not even `AUTO_MIN_STAGES` fit, that minimum is used (the `smem_fits` rule reports it).
    """
    template = Schedule(**{**fields, "stages": AUTO_MIN_STAGES})
    budget = template.arch.smem_opt_in_bytes
    for stages in range(AUTO_MAX_STAGES, AUTO_MIN_STAGES - 1, -1):
        candidate = dataclasses.replace(template, stages=stages)
        if candidate.smem_bytes <= budget:
            return candidate
    return template


# ---- expansion ---------------------------------------------------------------------------------


def _family_name(family: Any, index: int) -> str:
    if isinstance(family, dict) and isinstance(family.get("name"), str) and family["name"]:
        return family["name"]
    return f"#{index} (unnamed)"


def _sweep_axes(sweep: Any, source: str, fname: str) -> list[tuple[str, list[dict[str, Any]]]]:
    where = _where(source, fname)
    if not isinstance(sweep, dict):
        raise ScheduleFileError(f"{where}: 'sweep' must be a table of axes, got {type(sweep).__name__}")
    axes: list[tuple[str, list[dict[str, Any]]]] = []
    owner: dict[str, str] = {}
    for axis, entries in sweep.items():
        aw = _where(source, fname, axis)
        if not isinstance(entries, list):
            raise ScheduleFileError(
                f"{aw}: must be a list (of tables of field values, or of values of field "
                f"{axis!r}), got {type(entries).__name__} {entries!r}"
            )
        if not entries:
            raise ScheduleFileError(f"{aw}: is empty; an axis needs at least one entry")
        points: list[dict[str, Any]] = []
        for i, entry in enumerate(entries):
            ew = _where(source, fname, axis, i)
            if isinstance(entry, dict):
                points.append(_convert_table(entry, ew))
            elif axis in _FIELD_TYPES:
                points.append({axis: _convert(axis, entry, ew)})
            else:
                raise ScheduleFileError(
                    f"{ew}: {entry!r} is a plain value but {axis!r} is not a schedule field; "
                    f"use tables of field values, e.g. {{tile_m = 128, tile_n = 128}}"
                )
        for field in sorted({f for p in points for f in p}):
            if field in owner:
                raise ScheduleFileError(
                    f"{aw}: field {field!r} is also set by sweep axis {owner[field]!r}; "
                    "each field may be swept by one axis only"
                )
            owner[field] = axis
        axes.append((axis, points))
    return axes


def expand_family(
    family: dict[str, Any], *, source: str | Path = "<memory>", index: int = 0, max_points: int = MAX_POINTS,
    scope: dict[str, Any] | None = None,
) -> list[Expanded]:
    """Every schedule of one ``[[family]]`` table (a dict as tomllib reads it), in sweep order;
    ScheduleFileError when the sweep has more than ``max_points`` points. ``scope``: the families
    its ``extends`` may name besides the shipped ones (those of its file)."""
    source = str(source)
    fname = _family_name(family, index)
    where = _where(source, fname)
    if not isinstance(family, dict):
        raise ScheduleFileError(f"{where}: a family must be a table, got {type(family).__name__}")
    unknown = [k for k in family if k not in _FAMILY_KEYS]
    if unknown:
        raise ScheduleFileError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
            f"(a family has {', '.join(_FAMILY_KEYS)})"
        )
    if not isinstance(family.get("name"), str) or not family["name"]:
        raise ScheduleFileError(f"{where}: a family needs a non-empty string 'name'")
    if "description" in family and not isinstance(family["description"], str):
        raise ScheduleFileError(f"{where}: 'description' must be a string")
    family = resolve_extends(family, scope or {}, where)
    base = _convert_table(family.get("base", {}), f"{where}: base")
    axes = _sweep_axes(family.get("sweep", {}), source, fname)
    sizes = [len(points) for _, points in axes]
    if math.prod(sizes) > max_points:
        raise ScheduleFileError(
            f"{where}: its sweep expands to {math.prod(sizes):,} points ({' x '.join(map(str, sizes))} over "
            f"axes {', '.join(axis for axis, _ in axes)}), more than {max_points:,}; narrow the sweep, or "
            f"allow it with --max-points {math.prod(sizes)}"
        )

    out: list[Expanded] = []
    for combo in itertools.product(*(points for _, points in axes)):
        fields = dict(base)
        for point in combo:
            fields.update(point)
        if isinstance(fields.get("op"), Op) and fields["op"].is_quantize:
            # A quantizer's unused fields default to their neutral values (stated ones are checked
            # by the quant_unused_fields_neutral rule).
            fields = {**QUANT_NEUTRAL, **({"b_dtype": fields["a_dtype"]} if "a_dtype" in fields else {}), **fields}
        missing = [f for f in FIELDS if f not in fields and f not in DEFAULTED]
        if missing:
            raise ScheduleFileError(
                f"{where}: field(s) {', '.join(map(repr, missing))} missing; set them in "
                "[family.base] or a sweep axis"
            )
        auto = fields["stages"] == AUTO
        try:
            schedule = resolve_auto_stages(fields) if auto else Schedule(**fields)
        except (TypeError, ValueError, KeyError) as exc:
            out.append(Expanded(fname, None, (Violation("construct", str(exc)),), source, auto))
            continue
        out.append(Expanded(fname, schedule, tuple(violations(schedule)), source, auto))
    return out


def _family_tables(path: Path) -> list[Any]:
    """The ``[[family]]`` tables of the TOML file `path`, as read."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ScheduleFileError(f"{path}: cannot read schedule file: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleFileError(f"{path}: not valid TOML: {exc}") from exc
    unknown = [k for k in data if k != "family"]
    if unknown:
        raise ScheduleFileError(
            f"{path}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            "a schedule file holds [[family]] tables"
        )
    families = data.get("family")
    if not isinstance(families, list) or not families:
        raise ScheduleFileError(f"{path}: no [[family]] tables")
    return families


@functools.lru_cache(maxsize=1)
def _shipped_families() -> dict[str, Any]:
    """Every family table of the shipped schedule files, by name (what ``extends`` falls back on)."""
    return {fam["name"]: fam for path in default_schedule_files() for fam in _family_tables(path)
            if isinstance(fam, dict) and isinstance(fam.get("name"), str)}


def resolve_extends(family: Any, local: dict[str, Any], where: str, chain: tuple[str, ...] = ()) -> Any:
    """``family`` with its ``extends`` applied: the named family's base (resolved first; looked up
    in ``local``, then among the shipped families) under the family's own base fields."""
    if not isinstance(family, dict) or "extends" not in family:
        return family
    parent_name = family["extends"]
    name = family.get("name", "?")
    if not isinstance(parent_name, str) or not parent_name:
        raise ScheduleFileError(f"{where}: 'extends' must name a family, got {parent_name!r}")
    if parent_name == name or parent_name in chain:
        raise ScheduleFileError(f"{where}: 'extends' goes round in a circle: {' -> '.join((*chain, name, parent_name))}")
    scope = local if parent_name in local else _shipped_families()
    if parent_name not in scope:
        raise ScheduleFileError(
            f"{where}: extends {parent_name!r}, which is neither a family of this file nor a shipped one "
            f"(shipped: {', '.join(sorted(_shipped_families()))})"
        )
    parent = resolve_extends(scope[parent_name], scope, where, (*chain, name))
    parent_base, own_base = parent.get("base", {}), family.get("base", {})
    for table, whose in ((parent_base, parent_name), (own_base, name)):
        if not isinstance(table, dict):
            raise ScheduleFileError(f"{where}: the base of {whose!r} must be a table, got {type(table).__name__}")
    resolved = {k: v for k, v in family.items() if k != "extends"}
    resolved["base"] = {**parent_base, **own_base}
    return resolved


def load_schedule_file(path: str | Path, max_points: int = MAX_POINTS) -> list[Expanded]:
    """Every schedule of every family in the TOML file `path` (`expand_family`'s ``max_points``)."""
    path = Path(path)
    families = _family_tables(path)
    local = {fam["name"]: fam for fam in families if isinstance(fam, dict) and isinstance(fam.get("name"), str)}
    seen: set[str] = set()
    out: list[Expanded] = []
    for i, fam in enumerate(families):
        name = _family_name(fam, i)
        if name in seen:
            raise ScheduleFileError(f"{path}: family {name!r} is defined twice")
        seen.add(name)
        out.extend(expand_family(fam, source=path, index=i, max_points=max_points, scope=local))
    return out


def default_schedule_files() -> list[Path]:
    """The schedule files shipped with cutegen (every ``*.toml`` of this package)."""
    return sorted(Path(__file__).parent.glob("*.toml"))


def _matches(s: Schedule | None, arch: Arch | None, op: Op | None) -> bool:
    if s is None:
        return arch is None and op is None
    return (arch is None or s.arch == arch) and (op is None or s.op == op)


def all_expanded(
    arch: Arch | str | None = None,
    op: Op | str | None = None,
    paths: Iterable[str | Path] | None = None,
    max_points: int = MAX_POINTS,
) -> list[Expanded]:
    """Every expanded schedule (valid or not) of `paths` (default: the shipped files).

    Filtered by arch/op, de-duplicated (first occurrence wins) and sorted by name; entries whose
    schedule could not be built come last.
    """
    arch_ = Arch(arch) if arch is not None else None
    op_ = Op(op) if op is not None else None
    files = default_schedule_files() if paths is None else [Path(p) for p in paths]
    seen: set[Schedule] = set()
    built: list[Expanded] = []
    broken: list[Expanded] = []
    for path in files:
        for e in load_schedule_file(path, max_points):
            if not _matches(e.schedule, arch_, op_):
                continue
            if e.schedule is None:
                broken.append(e)
            elif e.schedule not in seen:
                seen.add(e.schedule)
                built.append(e)
    built.sort(key=lambda e: e.name or "")
    return built + broken


def default_schedules(
    arch: Arch | str | None = None,
    op: Op | str | None = None,
    paths: Iterable[str | Path] | None = None,
) -> list[Schedule]:
    """The valid schedules of the shipped files (or `paths`), de-duplicated and sorted by name."""
    return [e.schedule for e in all_expanded(arch, op, paths) if e.valid and e.schedule is not None]
