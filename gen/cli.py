"""The ``cutegen`` command line: list, show, build, verify and export kernels; report the environment.

Importing this module is cheap: it reads only the schedule vocabulary and the manifest schema.
The builder (and with it the CuTe DSL) is imported by ``cutegen build`` only; ``verify`` and
``export`` read build folders and never import the CuTe DSL.

Exit status: 0 success; 1 the command ran and found a failure (a build or verify failure, a
``list`` pattern that matches nothing); 2 a usage error (bad arguments, unknown kernel names, a
missing or unusable build folder or schedule file); 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

# The op lists only (both modules import torch lazily, inside their functions).
from cutegen.bench.run import OPS as BENCH_OPS
from cutegen.bench.conditions import CONDITIONS
from cutegen.bench.deepgemm_anchor import DeepGemmKernel
from cutegen.bench.tune import TUNABLE_OPS
from cutegen.runtime.manifest import KernelManifest, ManifestError
from cutegen.schedules import (
    MAX_POINTS,
    Arch,
    Expanded,
    Op,
    Schedule,
    ScheduleFileError,
    all_expanded,
    default_schedule_files,
    parse_name,
    predicate_results,
    violations,
)
from cutegen.schedules.evidence import hardware_evidence

PROG = "cutegen"
DEFAULT_BUILD_DIR = "build"
GLOB_CHARS = "*?["


class CliError(Exception):
    """A user error: reported on stderr without a traceback, with exit status `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# ---- helpers shared by the subcommands ---------------------------------------------------------


def cache_dir() -> Path:
    """Where cutegen caches compiled kernels: $CUTEGEN_CACHE_DIR, else $XDG_CACHE_HOME/cutegen or ~/.cache/cutegen."""
    from cutegen.gen.build import cache_root  # imports no CuTe DSL

    return cache_root()


def matches(name: str, pattern: str, *groups: str) -> bool:
    """Full-name glob match when `pattern` has wildcards, else substring match; a pattern that is
    one of the kernel's ``groups`` (its op, its schedule family) selects it too."""
    pattern = pattern.lower()
    if pattern in groups:
        return True
    if any(c in pattern for c in GLOB_CHARS):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def _groups(e: Expanded) -> tuple[str, ...]:
    """What a pattern may name to select all of an entry's kind: its op and its family."""
    return (e.schedule.op.value, e.family.lower()) if e.schedule is not None else (e.family.lower(),)


def _load(arch: str | None, op: str | None, extra: Sequence[str] = (), max_points: int = MAX_POINTS) -> list[Expanded]:
    """The shipped schedules plus those of the ``extra`` schedule files."""
    if not extra:
        return all_expanded(arch=arch, op=op, max_points=max_points)
    for path in extra:
        if not Path(path).is_file():
            raise CliError(f"--schedules {path}: no such file", 2)
    return all_expanded(arch=arch, op=op, paths=[*default_schedule_files(), *map(Path, extra)],
                        max_points=max_points)


def _entries(args: argparse.Namespace, arch: str | None, op: str | None) -> list[Expanded]:
    extra = list(getattr(args, "schedules", None) or [])
    return _load(arch, op, extra, getattr(args, "max_points", MAX_POINTS))


def _filters(arch: str | None, op: str | None) -> str:
    parts = [f"arch {arch}" if arch else "", f"op {op}" if op else ""]
    text = " and ".join(p for p in parts if p)
    return f" for {text}" if text else ""


def select(
    entries: list[Expanded],
    patterns: Sequence[str],
    include_invalid: bool,
    filters: str = "",
) -> list[Expanded]:
    """The entries whose names match any pattern (all when none), in `entries` order.

    Raises CliError(code=1) naming the first pattern that matches nothing.
    """
    named = [e for e in entries if e.name is not None]
    pool = named if include_invalid else [e for e in named if e.valid]
    if not patterns:
        # Points whose schedule could not be built have no name; only --all lists them.
        return pool + [e for e in entries if e.name is None] if include_invalid else pool
    chosen: set[int] = set()
    for pattern in patterns:
        hits = [i for i, e in enumerate(pool) if e.name is not None and matches(e.name, pattern, *_groups(e))]
        if not hits:
            raise CliError(_no_match(pattern, named, include_invalid, filters), code=1)
        chosen.update(hits)
    return [e for i, e in enumerate(pool) if i in chosen]


def _no_match(pattern: str, named: list[Expanded], include_invalid: bool, filters: str) -> str:
    invalid_hits = [e for e in named if not e.valid and matches(e.name or "", pattern, *_groups(e))]
    if invalid_hits and not include_invalid:
        return (
            f"pattern {pattern!r} matches only invalid schedules ({len(invalid_hits)}); "
            f"`{PROG} list --all '{pattern}'` shows why"
        )
    names = [e.name for e in named if e.name]
    msg = f"no schedule{filters} matches {pattern!r}"
    close = difflib.get_close_matches(pattern.lower(), names, n=3, cutoff=0.5)
    if close:
        msg += "; did you mean:\n  " + "\n  ".join(close)
    msg += (
        f"\n(a pattern with '*' must match the whole name, one without matches any part of it, an op or "
        f"family name selects all its schedules; `{PROG} list` shows the {sum(e.valid for e in named)} valid "
        "schedules)"
    )
    return msg


def derived_facts(s: Schedule) -> dict[str, Any]:
    em, en = s.epi_tile
    return {
        "smem_bytes": s.smem_bytes,
        "stage_bytes": s.stage_bytes,
        "epilogue_bytes": s.epilogue_bytes,
        "epilogue_buffers": s.epilogue_stages,
        "epilogue_whole_tile": s.epilogue_whole_tile,
        "barrier_bytes": s.barrier_bytes,
        "epi_tile": [em, en],
        "wgmma_accumulators": s.wgmma_accumulators,
        "row_waves": s.waves,
        "column_waves": s.column_waves,
        "accumulators_per_thread": s.accumulators_per_thread,
        "threads_per_cta": s.threads_per_cta,
        "cluster_size": s.cluster_size,
        "smem_limit_bytes": s.arch.smem_opt_in_bytes,
        "mma_ctas": s.mma_ctas,
        "tmem_accumulator_stages": s.tmem_accumulator_stages,
        "tmem_columns": s.tmem_columns,
    }


def _epilogue_buffers(d: dict[str, Any]) -> str:
    """' (N sub-tile buffers: the whole tile | a ring)' for `show`; nothing without an epilogue."""
    n = d["epilogue_buffers"]
    if not d["epilogue_bytes"]:
        return ""
    kind = "the whole tile" if d["epilogue_whole_tile"] else "a ring"
    return f" ({n} sub-tile buffer{'s' if n != 1 else ''}: {kind})"


def _safe_derived(s: Schedule) -> dict[str, Any] | None:
    try:
        return derived_facts(s)
    except Exception:  # an invalid schedule (e.g. math_warpgroups=0) may not have them
        return None


@functools.cache
def _catalogue_names() -> frozenset[str]:
    """Names of the shipped catalogue's valid schedule points (those the GPU tier and benchmark run)."""
    return frozenset(e.name for e in all_expanded() if e.valid and e.name)


def _hardware(e: Expanded) -> str:
    """What hardware has run this schedule point. Only the shipped catalogue's points carry their
    evidence ("ran on H200" / "ran on H100" / "compiled only", `schedules.evidence`); a point only a user's schedule file
    names, or one the rules refuse, has run nowhere."""
    if not e.valid or e.schedule is None:
        return "none (invalid)"
    if e.name not in _catalogue_names():
        return "none (not in catalogue)"
    return hardware_evidence(e.schedule)


def _entry_json(e: Expanded) -> dict[str, Any]:
    s = e.schedule
    return {
        "name": e.name,
        "family": e.family,
        "source": e.source,
        "valid": e.valid,
        "stages_auto": e.stages_auto,
        "violations": [{"name": v.name, "reason": v.reason} for v in e.violations],
        "schedule": s.to_dict() if s is not None else None,
        "derived": _safe_derived(s) if s is not None else None,
        "hardware": _hardware(e),
    }


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _status(e: Expanded) -> str:
    if e.valid:
        return "ok"
    v = e.violations[0]
    more = f" (+{len(e.violations) - 1} more)" if len(e.violations) > 1 else ""
    return f"{v.name}: {v.reason}{more}"


# ---- list --------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    entries = _entries(args, args.arch, args.op)
    chosen = select(entries, args.patterns, args.all, _filters(args.arch, args.op))
    if not chosen:
        raise CliError(f"no {'' if args.all else 'valid '}schedules{_filters(args.arch, args.op)}", 1)
    if args.json:
        print(json.dumps([_entry_json(e) for e in chosen], indent=2))
        return 0
    if args.names:
        for e in chosen:
            if e.name:
                print(e.name)
        return 0
    rows = []
    for e in chosen:
        s = e.schedule
        if s is None:
            rows.append([f"({e.family})", "-", "-", "-", "-", "-", "-", "-", _status(e)])
            continue
        d = _safe_derived(s)
        smem = f"{d['smem_bytes'] / 1024:.1f}" if d else "?"
        rows.append(
            [
                e.name or "?",
                f"{s.tile_m}x{s.tile_n}x{s.tile_k}",
                f"{s.cluster_m}x{s.cluster_n}",
                s.multicast.value,
                str(s.stages),
                str(s.math_warpgroups),
                smem,
                _hardware(e),
                _status(e),
            ]
        )
    print(_table(rows, ["NAME", "TILE", "CLUSTER", "MC", "STAGES", "WG", "SMEM_KIB", "HARDWARE", "STATUS"]))
    n_valid = sum(e.valid for e in chosen)
    summary = f"{len(chosen)} schedule(s), {n_valid} valid"
    if not args.all:
        hidden = sum(
            1
            for e in entries
            if not e.valid
            and e.name is not None
            and (not args.patterns or any(matches(e.name, p) for p in args.patterns))
        )
        if hidden:
            summary += f"; {hidden} invalid hidden (--all shows them)"
    print(summary)
    return 0


# ---- show --------------------------------------------------------------------------------------


def _find(name: str, entries: list[Expanded]) -> tuple[Expanded, str | None]:
    """The entry called `name` and a note; CliError(code=2) with suggestions if unknown."""
    for e in entries:
        if e.name == name:
            return e, None
    try:
        s = parse_name(name)
    except ValueError as exc:
        parse_error = str(exc)
    else:
        found = violations(s)
        return Expanded("-", s, tuple(found), "(decoded from the name)"), (
            "not in any schedule file; decoded from the name"
        )
    named = [e for e in entries if e.name]
    hits = [e for e in named if matches(e.name or "", name)]
    if len(hits) == 1:
        return hits[0], None
    if len(hits) > 1:
        listing = "\n  ".join(e.name or "" for e in hits)
        raise CliError(f"{name!r} matches {len(hits)} schedules; give one of:\n  {listing}", 2)
    msg = f"unknown schedule {name!r}"
    close = difflib.get_close_matches(name, [e.name or "" for e in named], n=5, cutoff=0.6)
    if close:
        msg += "; closest names:\n  " + "\n  ".join(close)
    else:
        msg += f" ({parse_error}); `{PROG} list --all` shows the known names"
    raise CliError(msg, 2)


def _binding_text(binding: dict[str, Any]) -> str:
    rest = ", ".join(f"{k}={v}" for k, v in binding.items() if k != "kind")
    return f"{binding.get('kind')}" + (f" ({rest})" if rest else "")


def _manifest_text(m: KernelManifest, path: Path) -> str:
    g = m.grid
    lines = [
        f"manifest  {path}",
        f"  entry        {m.entry}",
        f"  cubin        {m.cubin}  sha256 {m.sha256[:16]}",
        f"  block        {tuple(m.block)}",
        f"  cluster      {tuple(m.cluster)}",
        f"  smem         {m.smem_bytes} bytes ({m.smem_bytes / 1024:.1f} KiB)",
        f"  registers    {m.registers if m.registers is not None else '?'}",
        f"  pdl          {m.pdl}    cooperative {m.cooperative}",
        f"  grid         {g.kind}: {g.extent_m} x {g.extent_n} in {g.tile_m}x{g.tile_n} tiles, "
        f"clusters of {g.cluster_m}x{g.cluster_n}",
    ]
    for o in m.operands:
        lines.append(
            f"  operand      {o.name}: {o.dtype} [{', '.join(o.shape)}], contiguous mode "
            f"{o.contiguous_mode}, {o.align_bytes}-byte aligned"
        )
    lines.append(f"  params       {len(m.params)} ({m.param_bytes} bytes)")
    rows = [
        [str(p.index), p.name, str(p.offset), str(p.size), str(p.align), _binding_text(p.binding)]
        for p in m.params
    ]
    if rows:
        table = _table(rows, ["IDX", "NAME", "OFFSET", "SIZE", "ALIGN", "BINDING"])
        lines += ["    " + line for line in table.splitlines()]
    return "\n".join(lines)


def _schedules_option(e: Expanded, args: argparse.Namespace) -> str:
    """`` --schedules FILE`` when ``e`` comes from a schedule file given on the command line."""
    extra = [str(p) for p in getattr(args, "schedules", None) or []]
    matching = [p for p in extra if Path(p).resolve() == Path(str(e.source)).resolve()]
    return f" --schedules {matching[0]}" if matching else ""


def cmd_show(args: argparse.Namespace) -> int:
    entries = _entries(args, None, None)
    e, note = _find(args.name, entries)
    s = e.schedule
    assert s is not None and e.name is not None
    name = e.name
    results = predicate_results(s)
    d = _safe_derived(s)

    kdir = Path(args.build_dir) / name
    mpath, spath = kdir / "manifest.json", kdir / "sass.txt"
    manifest: KernelManifest | None = None
    manifest_error: str | None = None
    if mpath.is_file():
        try:
            manifest = KernelManifest.from_json(mpath.read_text())
        except (ManifestError, OSError) as exc:
            manifest_error = f"{mpath}: {exc}"
    sass = spath.read_text(errors="replace") if spath.is_file() else None

    if args.json:
        out = _entry_json(e)
        out["note"] = note
        out["rules"] = [
            {"name": r.name, "status": r.status, "reason": r.reason, "doc": r.doc} for r in results
        ]
        out["manifest"] = json.loads(manifest.to_json()) if manifest else None
        out["manifest_error"] = manifest_error
        out["sass"] = sass
        print(json.dumps(out, indent=2))
    else:
        lines = [name]
        lines.append(f"  family       {e.family}  ({e.source})" if not note else f"  family       - ({note})")
        n_fail = sum(r.status == "fail" for r in results)
        lines.append(f"  status       {'valid' if not n_fail else f'INVALID ({n_fail} rule(s) broken)'}")
        lines.append(f"  hardware     {_hardware(e)}")
        lines.append("schedule")
        for k, v in s.to_dict().items():
            extra = "  (auto)" if k == "stages" and e.stages_auto else ""
            lines.append(f"  {k:<24}{v}{extra}")
        lines.append("derived")
        if d is None:
            lines.append("  (not computable for this schedule)")
        else:
            fixed = d["smem_bytes"] - s.stages * d["stage_bytes"] - d["epilogue_bytes"]
            lines += [
                f"  {'smem_bytes':<24}{d['smem_bytes']} ({d['smem_bytes'] / 1024:.1f} KiB; limit "
                f"{d['smem_limit_bytes']}) = {s.stages} stages x {d['stage_bytes']} + epilogue "
                f"{d['epilogue_bytes']} + reserved {fixed}",
                f"  {'stage_bytes':<24}{d['stage_bytes']}",
                f"  {'epi_tile':<24}{d['epi_tile'][0]}x{d['epi_tile'][1]}",
                f"  {'epilogue_bytes':<24}{d['epilogue_bytes']}{_epilogue_buffers(d)}",
                f"  {'barrier_bytes':<24}{d['barrier_bytes']}",
                f"  {'accumulators_per_thread':<24}{d['accumulators_per_thread']}",
                f"  {'wgmma_accumulators':<24}{d['wgmma_accumulators']}",
                f"  {'threads_per_cta':<24}{d['threads_per_cta']}",
                f"  {'cluster_size':<24}{d['cluster_size']}",
            ]
            if s.arch.value == "sm_90a" and s.block_scaled_gemm:  # one WGMMA accumulator, in waves
                lines.append(
                    f"  {'waves':<24}{s.all_waves} ({s.waves} of 64 rows per math warpgroup x "
                    f"{s.column_waves} of {s.wave_columns} columns)"
                )
            if s.arch.value == "sm_100a":  # tcgen05: the MMA's CTAs and the tensor memory it uses
                lines += [
                    f"  {'mma_ctas':<24}{d['mma_ctas']}",
                    f"  {'tmem_columns':<24}{d['tmem_columns']} ({d['tmem_accumulator_stages']} "
                    f"accumulator stages x {s.tile_n}; 512 per SM)",
                ]
        lines.append("rules")
        width = max(len(r.name) for r in results)
        for r in results:
            tail = f"  {r.reason}" if r.reason else ""
            label = r.status.upper() if r.status == "fail" else r.status
            lines.append(f"  {label:<5} {r.name:<{width}}{tail}".rstrip())
        if manifest is not None:
            lines.append(_manifest_text(manifest, mpath))
        elif manifest_error is None:
            lines.append(f"manifest  not built in {args.build_dir} (`{PROG} build{_schedules_option(e, args)} {name} "
                         f"-o {args.build_dir}`)")
        if sass is not None:
            lines.append(f"sass  {spath} ({len(sass.splitlines())} lines)")
            lines.append(sass.rstrip("\n"))
        print("\n".join(lines))
    if manifest_error:
        print(f"{PROG}: error: {manifest_error}", file=sys.stderr)
        return 1
    return 0


# ---- build -------------------------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise CliError(f"-j/--jobs must be at least 1, got {args.jobs}", 2)
    jobs = args.jobs or os.cpu_count() or 1
    entries = _entries(args, args.arch, args.op)
    chosen = select(entries, args.patterns, False, _filters(args.arch, args.op))
    for path in getattr(args, "schedules", None) or []:
        invalid = [e for e in entries if not e.valid and Path(str(e.source)).resolve() == Path(path).resolve()]
        if invalid:
            print(f"{PROG}: {len(invalid)} point(s) of {path} are invalid and not built "
                  f"(`{PROG} list --all --schedules {path}` shows why)", file=sys.stderr)
    if not chosen:
        raise CliError(f"no valid schedules{_filters(args.arch, args.op)} to build", 1)
    try:
        from cutegen.gen.build import build_schedules
    except ImportError as exc:
        raise CliError(
            f"the generator is not available ({exc}); install it with `pip install 'cutegen[gen]'`",
            2,
        ) from None
    schedules = [e.schedule for e in chosen if e.schedule is not None]
    out_dir = Path(args.out)
    print(
        f"building {len(schedules)} kernel(s) into {out_dir} with {jobs} job(s)"
        + (" (forced)" if args.force else ""),
        file=sys.stderr,
    )
    report = build_schedules(schedules, out_dir=out_dir, jobs=jobs, force=args.force)
    print(report.summary())
    if args.prune:
        from cutegen.gen.build import prune_build_dir

        # What stays: every valid schedule of the schedule files, whatever this run built.
        keep = {e.name for e in select(_entries(args, None, None), [], False)}
        removed = prune_build_dir(out_dir, keep)
        print(f"pruned {len(removed)} stale kernel folder(s) from {out_dir}" + "".join(f"\n  {n}" for n in removed))
    return 0 if report.ok else 1


# ---- built kernels (verify, export) ------------------------------------------------------------


def built_kernels(build_dir: Path) -> list[Any]:
    """The catalogue entries of a build (or export) folder; CliError(code=2) if there is none."""
    from cutegen.runtime.manifest import Catalogue

    path = build_dir / "catalogue.json"
    if not path.is_file():
        hint = f"`{PROG} build -o {build_dir}`" if build_dir.exists() else f"{build_dir} does not exist"
        raise CliError(f"no kernel catalogue at {path} ({hint}; or pass --build-dir DIR)", 2)
    try:
        return list(Catalogue.from_json(path.read_text()).kernels)
    except (ManifestError, OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path} cannot be used: {exc}", 2) from None


def select_built(
    entries: list[Any], patterns: Sequence[str], build_dir: Path, arch: str | None, op: str | None
) -> list[Any]:
    """The built kernels matching any pattern (all when none); CliError(code=1) for a pattern
    that matches none, saying whether it names schedules that were not built."""
    filters = _filters(arch, op)
    pool = [e for e in entries if (arch is None or e.arch == arch) and (op is None or e.op == op)]
    if not pool:
        raise CliError(f"no kernels{filters} in {build_dir} (`{PROG} build -o {build_dir}`)", 2)
    if not patterns:
        return pool
    chosen: set[int] = set()
    for pattern in patterns:
        if not pattern.strip():
            raise CliError("an empty pattern matches nothing; give a kernel name or a pattern", 2)
        hits = [i for i, e in enumerate(pool) if matches(e.name, pattern, e.op)]
        if not hits:
            raise CliError(_not_built(pattern, pool, build_dir, filters), 1)
        chosen.update(hits)
    return [e for i, e in enumerate(pool) if i in chosen]


def _not_built(pattern: str, pool: list[Any], build_dir: Path, filters: str) -> str:
    msg = f"no kernel{filters} built in {build_dir} matches {pattern!r}"
    try:
        known = [e.name for e in all_expanded() if e.valid and e.name and matches(e.name, pattern, *_groups(e))]
    except ScheduleFileError:
        known = []
    if known:
        msg += (
            f"; it matches {len(known)} schedule(s) that are not built there: "
            f"`{PROG} build '{pattern}' -o {build_dir}`"
        )
        return msg
    close = difflib.get_close_matches(pattern.lower(), [e.name for e in pool], n=3, cutoff=0.5)
    if close:
        msg += "; did you mean:\n  " + "\n  ".join(close)
    msg += (
        f"\n(a pattern with '*' must match the whole name, one without matches any part of it, an op name "
        f"selects all its kernels; {len(pool)} kernel(s) are built there: `{PROG} verify --build-dir "
        f"{build_dir}` lists them)"
    )
    return msg


# ---- verify ------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    from cutegen.gen.verify import verify_kernel

    build_dir = Path(args.build_dir)
    chosen = select_built(built_kernels(build_dir), args.patterns, build_dir, args.arch, args.op)
    verdicts = [verify_kernel((build_dir / e.manifest).parent) for e in chosen]
    n_bad = sum(not v.ok for v in verdicts)
    if args.json:
        print(json.dumps({"build_dir": str(build_dir), "ok": n_bad == 0,
                          "kernels": [v.to_dict() for v in verdicts]}, indent=2))
        return 0 if n_bad == 0 else 1
    rows = []
    for v in verdicts:
        f = v.facts
        mma = f.get("mma") or {}
        want = f.get("expected_mma")
        mma_text = f"{want} x{mma.get(want, 0)}" if want else (", ".join(mma) or "none")
        status = "ok" if v.ok else "FAIL " + "; ".join(f"{c.name}: {c.detail}" for c in v.failures())
        rows.append(
            [
                v.name,
                mma_text if "mma" in f else "?",
                f"{f['local_loads']}/{f['local_stores']}" if "local_loads" in f else "?",
                str(f.get("stack_bytes", "?")),
                f"{f['registers']}/{f['register_budget']}" if "register_budget" in f else "?",
                f"{f['smem_bytes'] + f['static_smem_bytes']}/{f['smem_limit']}" if "smem_limit" in f else "?",
                status,
            ]
        )
    print(_table(rows, ["NAME", "MMA", "LDL/STL", "STACK", "REGS/BUDGET", "SMEM/LIMIT", "STATUS"]))
    print(f"{len(verdicts)} kernel(s) verified in {build_dir}: {len(verdicts) - n_bad} ok, {n_bad} failed")
    return 0 if n_bad == 0 else 1


# ---- export ------------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    try:
        import jinja2  # noqa: F401

        from cutegen.gen.export import ExportError, export_kernels
    except ImportError as exc:
        raise CliError(
            f"export needs jinja2 ({exc}); install it with `pip install jinja2` or 'cutegen[gen]'", 2
        ) from None
    build_dir = Path(args.build_dir)
    chosen = select_built(built_kernels(build_dir), args.patterns, build_dir, args.arch, args.op)
    try:
        report = export_kernels(build_dir, [e.name for e in chosen], Path(args.out))
    except ExportError as exc:
        raise CliError(str(exc), 2 if exc.usage else 1) from None
    if args.json:
        print(json.dumps({"out_dir": str(report.out_dir), "kernels": report.kernels,
                          "files": report.files, "no_op_launcher": {op: names for op, names in report.skipped_dispatch}}, indent=2))
    else:
        print(report.summary())
    return 0


# ---- env ---------------------------------------------------------------------------------------

DISTRIBUTIONS = ("nvidia-cutlass-dsl", "cuda-bindings", "torch", "numpy")


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gpu_info() -> list[str] | str:
    """The visible CUDA devices (via torch), or a string saying why there are none."""
    try:
        import torch  # noqa: PLC0415
    except Exception as exc:  # torch missing or broken
        return f"none (torch not importable: {type(exc).__name__})"
    try:
        if not torch.cuda.is_available():
            return "none (torch.cuda.is_available() is False)"
        out = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            out.append(f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor}, capability {major}.{minor})")
        return out
    except Exception as exc:
        return f"none ({type(exc).__name__}: {exc})"


def cmd_env(args: argparse.Namespace) -> int:
    import cutegen.runtime
    from cutegen.runtime.version import __version__

    info: dict[str, Any] = {
        "python": f"{sys.version.split()[0]} ({sys.executable})",
        "cutegen": f"{__version__} ({Path(cutegen.runtime.__file__).parent.parent})",
    }
    for dist in DISTRIBUTIONS:
        info[dist] = _version(dist)
    from cutegen.gen.sass import find_cuobjdump  # the lookup the build uses

    tool = find_cuobjdump()
    info["cuobjdump"] = str(tool) if tool else "not found"
    info["gpu"] = gpu_info()
    info["cache"] = str(cache_dir())
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info) + 2
    for k, v in info.items():
        if isinstance(v, list):
            print(f"{k:<{width}}{v[0] if v else 'none'}")
            for extra in v[1:]:
                print(f"{'':<{width}}{extra}")
        else:
            print(f"{k:<{width}}{v}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from cutegen.bench.tune import parse_shapes, tune

    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        raise CliError(f"--shapes: {exc}", 2) from exc
    try:
        import torch
    except ImportError:
        raise CliError("cutegen tune needs torch with CUDA", 2) from None
    if args.groups < 1:
        raise CliError(f"--groups: expected a positive number of groups, got {args.groups}", 2)
    if not torch.cuda.is_available():
        raise CliError("cutegen tune needs a CUDA GPU (torch.cuda.is_available() is False)", 2)
    from cutegen.bench.timing import set_conditions, set_timer
    from cutegen.runtime import ops

    ops.set_build_dir(args.build_dir)
    set_timer(args.timer)
    set_conditions(args.conditions)
    out = Path(args.out) if args.out else Path(args.build_dir) / "tuning.json"
    try:
        tune(args.op, shapes, out, timings_out=Path(args.timings_out) if args.timings_out else None,
             groups=args.groups)
    except ValueError as exc:
        raise CliError(str(exc), 2) from exc
    print(f"tuning table written: {out}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from cutegen.bench.run import OPS
    from cutegen.bench.timing import set_conditions, set_timer
    from cutegen.bench.run import main as bench_main

    report_dir = getattr(args, "report", None)
    if report_dir:  # before the run, not after minutes of it
        from cutegen.bench.report import ReportError, require_matplotlib

        try:
            require_matplotlib()
        except ReportError as exc:
            raise CliError(f"--report: {exc}", 2) from exc
    command = " ".join([
        f"{PROG} bench", *(f"--op {o}" for o in args.op or ()),
        *(["--json-out", args.json_out] if args.json_out else []), *(["--report", report_dir] if report_dir else []),
        *(["--every-kernel"] if args.every_kernel else []), *(["--decode"] if args.decode else []),
        *(["--deepgemm", args.deepgemm] if args.deepgemm else []), f"--timer {args.timer}",
        *([f"--conditions {args.conditions}"] if args.conditions != "cutegen" else []),
    ])
    if args.deepgemm and not (Path(args.deepgemm) / "deepgemm.json").is_file():
        raise CliError(f"--deepgemm {args.deepgemm}: no deepgemm.json there; make it with `{PROG} deepgemm-build`", 2)
    ops = tuple(args.op) if args.op else OPS
    set_timer(args.timer)
    set_conditions(args.conditions)
    return bench_main(json_out=args.json_out, ops=ops, report_dir=report_dir, command=command,
                      every_kernel=args.every_kernel, decode=args.decode, deepgemm_dir=args.deepgemm)


# ---- deepgemm-build ----------------------------------------------------------------------------


def cmd_deepgemm_build(args: argparse.Namespace) -> int:
    from cutegen.bench.run import deepgemm_problems
    from cutegen.bench.deepgemm_anchor import DeepGemmBuildError, DeepGemmCompileError, build

    ops = args.op or [k.op for k in DeepGemmKernel]
    problems = deepgemm_problems(ops, all_shapes=args.all_shapes)
    print(f"compiling DeepGEMM's kernels for {len(problems)} problems ({', '.join(ops)}) with {args.jobs} jobs",
          flush=True)
    try:
        entries = build(problems, Path(args.deepgemm), Path(args.cutlass), Path(args.output), nvcc=args.nvcc,
                        jobs=args.jobs, sms=args.sms, progress=lambda line: print(f"  built {line}", flush=True))
    except DeepGemmBuildError as exc:
        raise CliError(str(exc), 1 if isinstance(exc, DeepGemmCompileError) else 2) from exc
    op_args = " ".join(f"--op {op}" for op in ops)
    print(f"{len(entries)} DeepGEMM kernels in {args.output}; time them with `{PROG} bench {op_args} "
          f"--deepgemm {args.output}`")
    return 0


# ---- report ------------------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    from cutegen.bench import report

    settings = report.Settings(plots=not args.no_plots)
    for flag, attr, value in (("--peak-fp8", "fp8_peak", args.peak_fp8), ("--peak-bf16", "bf16_peak", args.peak_bf16),
                              ("--bandwidth", "bandwidth", args.bandwidth)):
        if value is not None:
            if not 0 < value < float("inf"):
                raise CliError(f"{flag} must be a positive number, got {value}", 2)
            setattr(settings, attr, value)
    try:
        results = report.load_results(args.results)
        written = report.write_report(
            results, args.out, name=args.name, source=args.results, settings=settings,
            generated_by=" ".join([f"{PROG} report", args.results, "-o", args.out]
                                  + (["--name", args.name] if args.name else [])),
        )
    except report.ReportError as exc:
        raise CliError(str(exc), 2) from exc
    except OSError as exc:
        raise CliError(f"cannot write the report into {args.out}: {exc}", 2) from exc
    for path in written:
        print(path)
    return 0


# ---- the parser --------------------------------------------------------------------------------


def _conditions_help() -> str:
    """`--conditions`: each choice with the description `cutegen.bench.conditions.CONDITIONS` gives it."""
    return "what runs between the timed calls. " + "; ".join(
        f"{name}{' (default)' if name == 'cutegen' else ''}: {c.description}" for name, c in CONDITIONS.items()
    )


def build_parser() -> argparse.ArgumentParser:
    archs = [a.value for a in Arch]
    ops = [o.value for o in Op]
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Generate warp-specialised NVIDIA GEMM kernels from declarative schedules.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    pat_help = "name patterns: with '*' they match the whole name, without any part of it"
    sched_help = (
        "also read this schedule file (TOML families, like schedules/*.toml); repeatable"
    )
    points_help = (f"refuse a schedule family whose sweep expands to more than N points (default: "
                   f"{MAX_POINTS:,})")

    def positive(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        return value

    ls = sub.add_parser("list", help="list the schedules and whether they are valid")
    ls.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help)
    ls.add_argument("--arch", choices=archs, help="only this architecture")
    ls.add_argument("--op", choices=ops, help="only this op")
    ls.add_argument("--all", action="store_true", help="include invalid schedules and the reasons")
    fmt = ls.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--names", action="store_true", help="print only the names")
    ls.add_argument("--schedules", action="append", metavar="FILE", help=sched_help)
    ls.add_argument("--max-points", type=positive, default=MAX_POINTS, metavar="N", help=points_help)
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="show one schedule, its rules and its built kernel")
    sh.add_argument("name", metavar="NAME", help="a kernel name (see `cutegen list`)")
    sh.add_argument(
        "--build-dir",
        default=DEFAULT_BUILD_DIR,
        metavar="DIR",
        help=f"build folder holding NAME/manifest.json and NAME/sass.txt (default: {DEFAULT_BUILD_DIR})",
    )
    sh.add_argument("--json", action="store_true", help="print JSON")
    sh.add_argument("--schedules", action="append", metavar="FILE", help=sched_help)
    sh.add_argument("--max-points", type=positive, default=MAX_POINTS, metavar="N", help=points_help)
    sh.set_defaults(func=cmd_show)

    bd = sub.add_parser("build", help="compile schedules into cubins, manifests and headers")
    bd.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help + " (default: all valid)")
    bd.add_argument("-o", "--out", default=DEFAULT_BUILD_DIR, metavar="DIR", help="output folder (default: build)")
    bd.add_argument("-j", "--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: CPU count)")
    bd.add_argument("--arch", choices=archs, help="only this architecture")
    bd.add_argument("--op", choices=ops, help="only this op")
    bd.add_argument("--force", action="store_true", help="rebuild kernels that are up to date")
    bd.add_argument(
        "--prune",
        action="store_true",
        help="then remove the folder's kernels that no schedule file (shipped or --schedules) "
        "produces any more, e.g. after an upgrade (patterns, --arch and --op do not narrow what stays)",
    )
    bd.add_argument("--schedules", action="append", metavar="FILE", help=sched_help)
    bd.add_argument("--max-points", type=positive, default=MAX_POINTS, metavar="N", help=points_help)
    bd.set_defaults(func=cmd_build)

    built_help = f"build (or export) folder holding catalogue.json (default: {DEFAULT_BUILD_DIR})"
    vf = sub.add_parser(
        "verify",
        help="check the SASS invariants of built kernels (MMA opcode, no local memory, registers, smem)",
    )
    vf.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help + " (default: all built)")
    vf.add_argument("--build-dir", default=DEFAULT_BUILD_DIR, metavar="DIR", help=built_help)
    vf.add_argument("--arch", choices=archs, help="only this architecture")
    vf.add_argument("--op", choices=ops, help="only this op")
    vf.add_argument("--json", action="store_true", help="print JSON")
    vf.set_defaults(func=cmd_verify)

    ex = sub.add_parser(
        "export",
        help="copy built kernels into a self-contained folder with a generated C launcher",
    )
    ex.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help + " (default: all built)")
    ex.add_argument("-o", "--out", required=True, metavar="DIR",
                    help="the export folder (created; an earlier export there is replaced)")
    ex.add_argument("--build-dir", default=DEFAULT_BUILD_DIR, metavar="DIR", help=built_help)
    ex.add_argument("--arch", choices=archs, help="only this architecture")
    ex.add_argument("--op", choices=ops, help="only this op")
    ex.add_argument("--json", action="store_true", help="print what was written as JSON")
    ex.set_defaults(func=cmd_export)

    tn = sub.add_parser("tune", help="time every built kernel of an op for given shapes and write the tuning table (needs CUDA)")
    tn.add_argument("--op", required=True,
                    choices=TUNABLE_OPS)
    tn.add_argument("--shapes", required=True, metavar="M,N,K;...",
                    help="shapes to tune, e.g. '4096,7168,16384;64,2112,7168' (k-grouped: M,N and the tokens "
                         "per group)")
    tn.add_argument("--groups", type=int, default=4, metavar="G",
                    help="k-grouped only: groups per problem; the table entry serves calls with G groups (default: 4)")
    tn.add_argument("--build-dir", default=DEFAULT_BUILD_DIR, metavar="DIR", help=f"build folder (default: {DEFAULT_BUILD_DIR})")
    tn.add_argument("-o", "--out", metavar="PATH", help="tuning table to update (default: DIR/tuning.json, which the runtime reads)")
    tn.add_argument("--timings-out", metavar="PATH", help="also write every kernel's time per shape (JSON)")
    tn.add_argument("--timer", choices=("kernel", "event"), default="kernel",
                    help="kernel: GPU kernel durations (CUPTI, default); event: CUDA events around each call")
    tn.add_argument("--conditions", choices=tuple(CONDITIONS), default="cutegen", help=_conditions_help())
    tn.set_defaults(func=cmd_tune)

    bn = sub.add_parser("bench", help="benchmark the built kernels on this GPU beside torch (needs CUDA)")
    bn.add_argument("--json-out", metavar="PATH", help="also write the results as JSON")
    bn.add_argument(
        "--op",
        action="append",
        choices=BENCH_OPS,
        help="only this op (repeatable; default: every op with built kernels)",
    )
    bn.add_argument("--report", metavar="DIR",
                    help="also write the Markdown report with plots into DIR (as `cutegen report`; needs matplotlib)")
    bn.add_argument("--every-kernel", action="store_true",
                    help="quantize: also time every other runnable kernel of each case, forced by name")
    bn.add_argument("--decode", action="store_true",
                    help="fp8_gemm_nt: also time M = 1, 16 and 32 at DeepGEMM's (N, K) pairs beside cuBLAS "
                         "blockwise (results JSON and printout; not in the report)")
    bn.add_argument("--timer", choices=("kernel", "event"), default="kernel",
                    help="kernel: the calls' GPU kernel durations as CUPTI records them, as DeepGEMM's own "
                         "benchmark timed its numbers (default); event: CUDA events around each call")
    bn.add_argument("--conditions", choices=tuple(CONDITIONS), default="cutegen", help=_conditions_help())
    bn.add_argument("--deepgemm", metavar="DIR",
                    help=", ".join(k.op for k in DeepGemmKernel) + ": also time "
                         "DeepGEMM's own kernels from a `deepgemm-build` folder beside cutegen's, same operands, "
                         "checked against cutegen's output first")
    bn.set_defaults(func=cmd_bench)

    dg = sub.add_parser(
        "deepgemm-build",
        help="compile DeepGEMM's FP8 kernels (dense 1D2D, contiguous grouped 1D2D, dense and k-grouped 1D1D weight "
             "gradients; "
             "from your checkout, with nvcc) for the benchmark's problems, as an anchor for `bench --deepgemm`",
    )
    dg.add_argument("--deepgemm", required=True, metavar="DIR", help="a DeepGEMM checkout (deepseek-ai/DeepGEMM)")
    dg.add_argument("--cutlass", required=True, metavar="DIR", help="a CUTLASS checkout (its include/ is used)")
    dg.add_argument("-o", "--output", default="build/deepgemm", metavar="DIR", help="where the cubins go")
    dg.add_argument("--nvcc", help="the nvcc to use (default: the one on PATH; CUDA 12.8 or newer)")
    dg.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    dg.add_argument("--sms", type=int, default=132, help="SMs of the GPU the kernels are for (H200/H100 SXM: 132)")
    dg.add_argument("--op", action="append", choices=[k.op for k in DeepGemmKernel],
                    help="only the DeepGEMM counterpart of this op (repeatable; default: every one)")
    dg.add_argument("--all-shapes", action="store_true",
                    help="also the (N, K) = (576, 7168) shapes DeepGEMM published no numbers for")
    dg.set_defaults(func=cmd_deepgemm_build)

    rp = sub.add_parser(
        "report",
        help="turn `cutegen bench --json-out` results into a Markdown report with plots (docs/perf)",
    )
    rp.add_argument("results", metavar="RESULTS.json", help="the JSON written by `cutegen bench --json-out`")
    rp.add_argument("-o", "--out", default="docs/perf", metavar="DIR",
                    help="folder for the report, its plots and LATEST.md (default: docs/perf)")
    rp.add_argument("--name", metavar="NAME", help="file stem of the report (default: <date>-<gpu> of the results)")
    rp.add_argument("--no-plots", action="store_true", help="the Markdown only (no matplotlib needed)")
    rp.add_argument("--peak-fp8", type=float, metavar="TFLOPS", help="FP8 dense peak (default: 1979, H200 SXM)")
    rp.add_argument("--peak-bf16", type=float, metavar="TFLOPS", help="BF16 dense peak (default: 989, H200 SXM)")
    rp.add_argument("--bandwidth", type=float, metavar="GBS",
                    help="memory roof in GB/s (default: the copy bandwidth measured in the run)")
    rp.set_defaults(func=cmd_report)

    ev = sub.add_parser("env", help="report versions, cuobjdump, GPU and cache location")
    ev.add_argument("--json", action="store_true", help="print JSON")
    ev.set_defaults(func=cmd_env)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already reported
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.code
    except (ScheduleFileError, ManifestError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
