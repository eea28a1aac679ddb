"""The builder: schedules → cubins compiled on the CPU → kernel folders with manifest, header and SASS summary.

For each schedule the template is traced and compiled with the CuTe DSL (`CUTE_DSL_ARCH` set, no GPU
needed). A compiled kernel folder is first committed to a content-addressed cache, keyed by
(procedural name, template source fingerprint, DSL version, cutegen version); the build folder
receives a copy. Every write is atomic (temporary folder + rename), and the cache entry's
`meta.json` is written last as its commit marker, so concurrent or interrupted builds never leave a
half-written kernel behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

from cutegen import __version__ as CUTEGEN_VERSION
from cutegen.runtime.manifest import (
    Catalogue,
    CatalogueEntry,
    GridRule,
    KernelManifest,
    OperandSpec,
    Param,
)
from cutegen.schedules.naming import procedural_name
from cutegen.schedules.spec import Schedule

MANIFEST_FILE = "manifest.json"
CUBIN_FILE = "kernel.cubin"
PTX_FILE = "kernel.ptx"
HEADER_FILE = "kernel.h"
SASS_FILE = "sass.txt"
META_FILE = "meta.json"
CATALOGUE_FILE = "catalogue.json"


class BuildError(RuntimeError):
    pass


def dsl_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


def cache_root() -> Path:
    env = os.environ.get("CUTEGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cutegen"


def artifact_writers_fingerprint() -> str:
    """sha256 over the code that shapes a kernel folder beside the template (manifest, header, SASS)."""
    here = Path(__file__).parent
    sources = [here / "build.py", here / "ptx.py", here / "sass.py",
               here.parent / "runtime" / "manifest.py"]
    # The export_*.j2 templates (cutegen export) shape no kernel folder: they do not invalidate builds.
    sources += sorted(
        p for p in (here.parent / "templates" / "artifacts").glob("*.j2") if not p.name.startswith("export_")
    )
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(schedule: Schedule) -> str:
    from cutegen.templates.registry import template_fingerprint

    blob = json.dumps(
        {
            "name": procedural_name(schedule),
            "template": template_fingerprint(schedule),
            "writers": artifact_writers_fingerprint(),
            "dsl": dsl_version(),
            "cutegen": CUTEGEN_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# ---- one kernel (runs in a worker process) ---------------------------------------------------
def _bind_params(ptx_entry, bindings: list[dict]) -> list[Param]:
    """Pair each PTX `.param` with the template's binding and check sizes agree."""
    if len(ptx_entry.params) != len(bindings):
        raise BuildError(
            f"the PTX entry has {len(ptx_entry.params)} parameters but the template declares "
            f"{len(bindings)} bindings ({[b['name'] for b in bindings]})"
        )
    params = []
    for i, (pp, b) in enumerate(zip(ptx_entry.params, bindings)):
        binding = {k: v for k, v in b.items() if k != "name"}
        kind = binding["kind"]
        if kind == "tma":
            expected = 128
        elif kind == "shape":
            expected = binding["width"] // 8 * len(binding["values"])
        elif kind == "pointer":
            expected = 8
        elif kind == "scalar":
            expected = {"i32": 4, "i64": 8, "f32": 4}[binding["dtype"]]
        elif kind == "tensor":
            from cutegen.runtime.params import tensor_struct_layout

            expected = tensor_struct_layout(binding)[1]
        else:
            expected = pp.size
        if pp.size != expected:
            raise BuildError(
                f"parameter {i} ({b['name']}, {kind}) is {pp.size} bytes in the PTX; "
                f"the binding needs {expected}"
            )
        params.append(Param(i, b["name"], pp.offset, pp.size, pp.align, binding))
    return params


def _compile(schedule: Schedule, workdir: Path) -> dict:
    """Trace and compile one schedule; return its artifacts (cubin, PTX, manifest pieces).

    ``art["compiled"]`` is the DSL's compiled object (used by the ABI self-check); it is not
    written anywhere.
    """
    import cutlass.cute as cute
    from cutlass.cutlass_dsl import CuTeDSL

    from cutegen.gen.ptx import parse_ptx_entry, ptx_target, ptx_version
    from cutegen.templates.registry import load_template

    # The DSL reads CUTE_DSL_ARCH once, when it is first imported; a process that builds for
    # several architectures sets the target on the DSL itself before each compile.
    dsl = CuTeDSL._get_dsl()
    dsl.envar.arch = schedule.arch.value
    # --keep-cubin/--keep-ptx write files into the DSL's dump folder (the cwd at import by
    # default); point it at the scratch folder for this compile only.
    old_dump_dir = dsl.envar.dump_dir
    dsl.envar.dump_dir = str(workdir)
    template = load_template(schedule)
    args = template.fake_arguments()
    old = os.getcwd()
    os.chdir(workdir)
    try:
        with warnings.catch_warnings():
            # The templates unroll their per-accumulator loops on purpose (each element's scale
            # pattern is static); the DSL's advice against long static loops does not apply.
            warnings.filterwarnings("ignore", message="This static loop has")
            compiled = cute.compile(template.kernel, *args, options="--keep-cubin --keep-ptx")
        cubin = bytes(compiled.__cubin__)
        ptx = str(compiled.__ptx__)
    finally:
        os.chdir(old)
        dsl.envar.dump_dir = old_dump_dir
    if ".entry" not in ptx:
        raise BuildError(f"the DSL returned no PTX text for {procedural_name(schedule)}: {ptx[:200]!r}")
    entry = parse_ptx_entry(ptx)
    facts = template.launch_facts()
    if entry.reqntid is not None and list(entry.reqntid) != facts["block"]:
        raise BuildError(f".reqntid {entry.reqntid} differs from the block {facts['block']}")
    params = _bind_params(entry, template.param_bindings())
    return {
        "compiled": compiled,
        "fake_arguments": args,
        "cubin": cubin,
        "ptx": ptx,
        "entry": entry,
        "ptx_version": ptx_version(ptx),
        "ptx_target": ptx_target(ptx),
        "facts": facts,
        "params": params,
        "operands": template.operands(),
        "grid": template.grid_rule(),
    }


def _make_manifest(schedule: Schedule, art: dict, sass_summary) -> KernelManifest:
    facts = art["facts"]
    entry = art["entry"]
    return KernelManifest(
        name=procedural_name(schedule),
        op=schedule.op.value,
        arch=schedule.arch.value,
        entry=entry.name,
        cubin=CUBIN_FILE,
        sha256=hashlib.sha256(art["cubin"]).hexdigest(),
        block=tuple(facts["block"]),
        cluster=tuple(facts["cluster"]),
        smem_bytes=facts["smem_bytes"],
        pdl=facts["pdl"],
        cooperative=facts["cooperative"],
        grid=GridRule(**art["grid"]),
        operands=[OperandSpec(**o) for o in art["operands"]],
        params=art["params"],
        schedule=schedule.to_dict(),
        toolchain={
            "cutegen": CUTEGEN_VERSION,
            "nvidia-cutlass-dsl": dsl_version(),
            "ptx_version": art["ptx_version"] or "",
            "ptx_target": art["ptx_target"] or "",
            "python": sys.version.split()[0],
        },
        registers=sass_summary.registers if sass_summary else None,
        wgmma_accumulators=schedule.wgmma_accumulators,
        column_scales_early=schedule.column_scales_early,
    )


def render_header(manifest: KernelManifest) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cutegen.templates", "artifacts"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    ident = manifest.name.upper()
    return env.get_template("kernel.h.j2").render(m=manifest, ident=ident)


def _write_kernel_dir(dest: Path, schedule: Schedule, art: dict) -> KernelManifest:
    from cutegen.gen.sass import disassemble, summarise

    sass_text, res_usage = disassemble(art["cubin"])
    summary = summarise(sass_text, res_usage)
    manifest = _make_manifest(schedule, art, summary)
    (dest / CUBIN_FILE).write_bytes(art["cubin"])
    (dest / PTX_FILE).write_text(art["ptx"])
    (dest / MANIFEST_FILE).write_text(manifest.to_json())
    (dest / HEADER_FILE).write_text(render_header(manifest))
    (dest / SASS_FILE).write_text(summary.render())
    (dest / "sass_summary.json").write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    return manifest


def _cache_entry_valid(entry: Path) -> bool:
    meta = entry / META_FILE
    if not meta.is_file():
        return False
    try:
        data = json.loads(meta.read_text())
        cubin = (entry / CUBIN_FILE).read_bytes()
    except (OSError, json.JSONDecodeError):
        return False
    return data.get("sha256") == hashlib.sha256(cubin).hexdigest()


def compile_into_cache(schedule_dict: dict, cache_dir: str, force: bool) -> dict:
    """Worker entry point: make sure the schedule's cache entry exists. Returns a status record."""
    schedule = Schedule.from_dict(schedule_dict)
    name = procedural_name(schedule)
    key = cache_key(schedule)
    entry = Path(cache_dir) / key
    if not force and _cache_entry_valid(entry):
        return {"name": name, "status": "cached", "key": key, "seconds": 0.0}
    os.environ["CUTE_DSL_ARCH"] = schedule.arch.value
    t0 = time.perf_counter()
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=entry.parent))
    try:
        with tempfile.TemporaryDirectory() as scratch:
            art = _compile(schedule, Path(scratch))
        manifest = _write_kernel_dir(tmp, schedule, art)
        # The commit marker goes last.
        (tmp / META_FILE).write_text(
            json.dumps({"name": name, "key": key, "sha256": manifest.sha256}, indent=2) + "\n"
        )
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another process committed the same entry first; theirs is identical.
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as exc:  # reported per kernel, the build goes on
        shutil.rmtree(tmp, ignore_errors=True)
        return {
            "name": name,
            "status": "failed",
            "key": key,
            "seconds": time.perf_counter() - t0,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    return {"name": name, "status": "built", "key": key, "seconds": time.perf_counter() - t0}


# ---- the build -------------------------------------------------------------------------------
@dataclasses.dataclass
class KernelResult:
    name: str
    status: str  # built | cached | failed
    seconds: float
    error: str | None = None


@dataclasses.dataclass
class BuildReport:
    out_dir: Path
    results: list[KernelResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        lines = []
        width = max([len(r.name) for r in self.results] + [6])
        for r in sorted(self.results, key=lambda r: r.name):
            extra = f"  {r.error}" if r.error else ""
            lines.append(f"{r.name:<{width}}  {r.status:<6}  {r.seconds:6.1f}s{extra}")
        lines.append(
            f"{len(self.results)} kernels: {self.count('built')} built, "
            f"{self.count('cached')} cache hits, {self.count('failed')} failed "
            f"in {self.seconds:.1f}s → {self.out_dir}"
        )
        return "\n".join(lines)


def _copy_entry_to(entry: Path, dest: Path) -> None:
    """Atomically replace `dest` with a copy of the cache entry."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for f in entry.iterdir():
            if f.name != META_FILE:
                shutil.copy2(f, tmp / f.name)
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old.{os.getpid()}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _kernel_manifests(out_dir: Path) -> list[Path]:
    """The manifest of every kernel folder in `out_dir` (folders starting with "." are staging)."""
    return [p for p in sorted(out_dir.glob(f"*/{MANIFEST_FILE}")) if not p.parent.name.startswith(".")]


def write_catalogue(out_dir: Path) -> Catalogue:
    """Index every kernel folder in `out_dir` into catalogue.json (atomically)."""
    entries = []
    toolchain: dict[str, str] = {}
    for manifest_path in _kernel_manifests(out_dir):
        m = KernelManifest.from_json(manifest_path.read_text())
        toolchain = dict(m.toolchain)
        entries.append(
            CatalogueEntry(
                name=m.name,
                op=m.op,
                arch=m.arch,
                manifest=f"{manifest_path.parent.name}/{MANIFEST_FILE}",
                schedule=m.schedule,
            )
        )
    cat = Catalogue(kernels=entries, toolchain={k: toolchain.get(k, "") for k in ("cutegen", "nvidia-cutlass-dsl")})
    tmp = out_dir / f".{CATALOGUE_FILE}.{os.getpid()}"
    tmp.write_text(cat.to_json())
    os.replace(tmp, out_dir / CATALOGUE_FILE)
    return cat


def prune_build_dir(out_dir: Path, keep: set[str]) -> list[str]:
    """Remove the kernel folders of `out_dir` whose manifest names a kernel not in `keep` (stale
    kernels of schedules no longer produced), rewrite catalogue.json, and return the names removed
    (sorted). Folders without a readable manifest are left alone."""
    out_dir = Path(out_dir)
    removed = []
    for manifest_path in _kernel_manifests(out_dir):
        try:
            name = KernelManifest.from_json(manifest_path.read_text()).name
        except (OSError, ValueError):  # ManifestError and UnicodeDecodeError are ValueErrors
            continue
        if name not in keep:
            shutil.rmtree(manifest_path.parent)
            removed.append(name)
    write_catalogue(out_dir)
    return sorted(removed)


def build_schedules(
    schedules: list[Schedule],
    out_dir: Path,
    jobs: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> BuildReport:
    """Compile `schedules` (in parallel processes) into `out_dir`; an unchanged rebuild is all cache hits."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    unique = {procedural_name(s): s for s in schedules}
    todo = [unique[n] for n in sorted(unique)]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo) or 1))

    records: list[dict] = []
    bar = None
    if progress:
        with contextlib.suppress(ImportError):
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="building", unit="kernel", file=sys.stderr)
    if jobs == 1 or len(todo) <= 1:
        for s in todo:
            records.append(compile_into_cache(s.to_dict(), str(cache), force))
            if bar:
                bar.set_postfix_str(records[-1]["status"])
                bar.update()
    else:
        # spawn: the CuTe DSL's compiler state must not be shared through fork.
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(compile_into_cache, s.to_dict(), str(cache), force) for s in todo]
            for fut in cf.as_completed(futures):
                records.append(fut.result())
                if bar:
                    bar.set_postfix_str(records[-1]["status"])
                    bar.update()
    if bar:
        bar.close()

    results = []
    for rec in records:
        if rec["status"] != "failed":
            _copy_entry_to(cache / rec["key"], out_dir / rec["name"])
        else:
            sys.stderr.write(f"\n--- {rec['name']} failed ---\n{rec.get('traceback', '')}\n")
        results.append(KernelResult(rec["name"], rec["status"], rec["seconds"], rec.get("error")))
    write_catalogue(out_dir)
    return BuildReport(out_dir=out_dir, results=results, seconds=time.perf_counter() - t0)
