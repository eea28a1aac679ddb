"""The ``cutegen`` command line: list, show and build schedules, and report the environment.

Importing this module is cheap: it reads only the schedule vocabulary and the manifest schema.
The builder (and with it the CuTe DSL) is imported by ``cutegen build`` only.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from cutegen.runtime.manifest import KernelManifest, ManifestError
from cutegen.schedules import (
    Arch,
    Expanded,
    Op,
    Schedule,
    ScheduleFileError,
    all_expanded,
    parse_name,
    predicate_results,
    violations,
)

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


def matches(name: str, pattern: str) -> bool:
    """Full-name glob match when `pattern` has wildcards, else substring match."""
    pattern = pattern.lower()
    if any(c in pattern for c in GLOB_CHARS):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def _load(arch: str | None, op: str | None) -> list[Expanded]:
    return all_expanded(arch=arch, op=op)


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
        hits = [i for i, e in enumerate(pool) if e.name is not None and matches(e.name, pattern)]
        if not hits:
            raise CliError(_no_match(pattern, named, include_invalid, filters), code=1)
        chosen.update(hits)
    return [e for i, e in enumerate(pool) if i in chosen]


def _no_match(pattern: str, named: list[Expanded], include_invalid: bool, filters: str) -> str:
    invalid_hits = [e for e in named if not e.valid and matches(e.name or "", pattern)]
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
        f"\n(a pattern with '*' must match the whole name, one without matches any part of it; "
        f"`{PROG} list` shows the {sum(e.valid for e in named)} valid schedules)"
    )
    return msg


def derived_facts(s: Schedule) -> dict[str, Any]:
    em, en = s.epi_tile
    return {
        "smem_bytes": s.smem_bytes,
        "stage_bytes": s.stage_bytes,
        "epilogue_bytes": s.epilogue_bytes,
        "barrier_bytes": s.barrier_bytes,
        "epi_tile": [em, en],
        "accumulators_per_thread": s.accumulators_per_thread,
        "threads_per_cta": s.threads_per_cta,
        "cluster_size": s.cluster_size,
        "smem_limit_bytes": s.arch.smem_opt_in_bytes,
    }


def _safe_derived(s: Schedule) -> dict[str, Any] | None:
    try:
        return derived_facts(s)
    except Exception:  # an invalid schedule (e.g. math_warpgroups=0) may not have them
        return None


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
    entries = _load(args.arch, args.op)
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
            rows.append([f"({e.family})", "-", "-", "-", "-", "-", "-", _status(e)])
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
                _status(e),
            ]
        )
    print(_table(rows, ["NAME", "TILE", "CLUSTER", "MC", "STAGES", "WG", "SMEM_KIB", "STATUS"]))
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


def cmd_show(args: argparse.Namespace) -> int:
    entries = _load(None, None)
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
                f"  {'epilogue_bytes':<24}{d['epilogue_bytes']}",
                f"  {'barrier_bytes':<24}{d['barrier_bytes']}",
                f"  {'accumulators_per_thread':<24}{d['accumulators_per_thread']}",
                f"  {'threads_per_cta':<24}{d['threads_per_cta']}",
                f"  {'cluster_size':<24}{d['cluster_size']}",
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
            lines.append(f"manifest  not built in {args.build_dir} (`{PROG} build {name} -o {args.build_dir}`)")
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
    entries = _load(args.arch, args.op)
    chosen = select(entries, args.patterns, False, _filters(args.arch, args.op))
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
    return 0 if report.ok else 1


# ---- env ---------------------------------------------------------------------------------------

DISTRIBUTIONS = ("nvidia-cutlass-dsl", "cuda-bindings", "torch", "numpy")


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def find_cuobjdump() -> str | None:
    """cuobjdump from the `nvidia` wheels (cu13 or cuda_cuobjdump), else from PATH."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            for rel in ("cu13/bin/cuobjdump", "cuda_cuobjdump/bin/cuobjdump"):
                p = Path(base) / rel
                if p.is_file():
                    return str(p)
    return shutil.which("cuobjdump")


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
    import cutegen

    info: dict[str, Any] = {
        "python": f"{sys.version.split()[0]} ({sys.executable})",
        "cutegen": f"{cutegen.__version__} ({Path(cutegen.__file__).parent})",
    }
    for dist in DISTRIBUTIONS:
        info[dist] = _version(dist)
    info["cuobjdump"] = find_cuobjdump() or "not found"
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


def cmd_bench(args: argparse.Namespace) -> int:
    from cutegen.gen.bench import main as bench_main

    return bench_main(json_out=args.json_out)


# ---- the parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    archs = [a.value for a in Arch]
    ops = [o.value for o in Op]
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Generate warp-specialised NVIDIA GEMM kernels from declarative schedules.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    pat_help = "name patterns: with '*' they match the whole name, without any part of it"

    ls = sub.add_parser("list", help="list the schedules and whether they are valid")
    ls.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help)
    ls.add_argument("--arch", choices=archs, help="only this architecture")
    ls.add_argument("--op", choices=ops, help="only this op")
    ls.add_argument("--all", action="store_true", help="include invalid schedules and the reasons")
    fmt = ls.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--names", action="store_true", help="print only the names")
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
    sh.set_defaults(func=cmd_show)

    bd = sub.add_parser("build", help="compile schedules into cubins, manifests and headers")
    bd.add_argument("patterns", nargs="*", metavar="PATTERN", help=pat_help + " (default: all valid)")
    bd.add_argument("-o", "--out", default=DEFAULT_BUILD_DIR, metavar="DIR", help="output folder (default: build)")
    bd.add_argument("-j", "--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: CPU count)")
    bd.add_argument("--arch", choices=archs, help="only this architecture")
    bd.add_argument("--op", choices=ops, help="only this op")
    bd.add_argument("--force", action="store_true", help="rebuild kernels that are up to date")
    bd.set_defaults(func=cmd_build)

    bn = sub.add_parser("bench", help="benchmark the built kernels on this GPU beside torch (needs CUDA)")
    bn.add_argument("--json-out", metavar="PATH", help="also write the results as JSON")
    bn.set_defaults(func=cmd_bench)

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
