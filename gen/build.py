"""The builder: schedules → cubins compiled on the CPU → kernel folders with manifest, header and SASS summary.

For each schedule the template is traced and compiled with the CuTe DSL (`CUTE_DSL_ARCH` set, no GPU
needed). A compiled kernel folder is first committed to a content-addressed cache, keyed by
(procedural name, the sources of the template and of every project module it imports, the
artifact writers, DSL version and its ``CUTE_DSL_*`` settings, cutegen version); the build folder
receives a copy. Kernels compile outside any lock, into staging folders named for their process;
a commit (`commit_folder`) takes the cache's or the build folder's file lock, moves the old folder
aside, renames the staged one into place and only then deletes the old one, so concurrent builds
never see a half-written or missing kernel and an interrupted one leaves either folder in place
or the old one aside, which the next build puts back (`recover_folder`). A cache entry counts as a
hit only when its commit marker, every file and its manifest agree.
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

from filelock import FileLock

from cutegen.runtime.version import __version__ as CUTEGEN_VERSION
from cutegen.runtime.manifest import (
    Catalogue,
    CatalogueEntry,
    GridRule,
    KernelManifest,
    OperandSpec,
    Param,
    Requirement,
)
from cutegen.schedules.naming import procedural_name
from cutegen.schedules.spec import Schedule

MANIFEST_FILE = "manifest.json"
CUBIN_FILE = "kernel.cubin"
PTX_FILE = "kernel.ptx"
HEADER_FILE = "kernel.h"
SASS_FILE = "sass.txt"
SASS_SUMMARY_FILE = "sass_summary.json"
META_FILE = "meta.json"
CATALOGUE_FILE = "catalogue.json"
# Every file of a kernel folder (a cache entry also has META_FILE).
KERNEL_FILES = (CUBIN_FILE, PTX_FILE, MANIFEST_FILE, HEADER_FILE, SASS_FILE, SASS_SUMMARY_FILE)
LOCK_FILE = ".cutegen.lock"


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


# The CuTe DSL reads its code-generation settings (line info, optimisation level, assertions, …)
# from variables with this prefix; the builder sets the architecture itself from the schedule.
DSL_SETTINGS_PREFIX = "CUTE_DSL_"
DSL_SETTINGS_SET_BY_BUILD = ("CUTE_DSL_ARCH",)


def dsl_settings() -> dict[str, str]:
    """The CuTe DSL settings in the environment that are part of every cache key: a build with,
    say, ``CUTE_DSL_LINEINFO=1`` makes other cubins than a default one and must not share its
    cache entries."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(DSL_SETTINGS_PREFIX) and k not in DSL_SETTINGS_SET_BY_BUILD}


def cache_key(schedule: Schedule) -> str:
    from cutegen.templates.registry import template_fingerprint

    blob = json.dumps(
        {
            "name": procedural_name(schedule),
            "template": template_fingerprint(schedule),
            "writers": artifact_writers_fingerprint(),
            "dsl": dsl_version(),
            "dsl_settings": dsl_settings(),
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
        "requires": template.requires(),
    }


def _make_manifest(schedule: Schedule, art: dict, sass_summary) -> KernelManifest:
    facts = art["facts"]
    entry = art["entry"]
    return KernelManifest(
        name=procedural_name(schedule),
        op=schedule.entry,
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
        facts=schedule.facts(),
        requires=[Requirement(**r) for r in art["requires"]],
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
    (dest / SASS_SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    return manifest


# ---- commits: staging folders, locks, recovery -------------------------------------------------
def folder_lock(folder: Path) -> FileLock:
    """The lock every commit into ``folder`` (a cache or a build folder) holds."""
    return FileLock(str(folder / LOCK_FILE))


def staging_folder(parent: Path, name: str) -> Path:
    """A new, empty staging folder in ``parent`` for ``name``, named for this process so that a
    later build can tell the leftovers of one that died (``.<name>.tmp.<pid>.<random>``)."""
    return Path(tempfile.mkdtemp(prefix=f".{name}.tmp.{os.getpid()}.", dir=parent))


def commit_folder(staged: Path, dest: Path) -> None:
    """Put the staged folder at ``dest`` (call with the folder's lock held): any old folder is
    moved aside first and deleted last, so ``dest`` is never missing while a crash is recoverable."""
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old.{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(dest, old)
    os.replace(staged, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def recover_folder(folder: Path) -> list[str]:
    """Clean up after builds that died in ``folder`` (call with its lock held): their staging
    folders are deleted, and an old folder moved aside is put back where its new one never
    arrived. Returns what was done, one line each."""
    done = []
    for path in sorted(folder.iterdir()):
        if not path.name.startswith("."):
            continue
        stem = path.name[1:]
        if path.is_dir() and ".old." in stem:
            name, _, pid = stem.rpartition(".old.")
        elif path.is_dir() and ".tmp." in stem:
            name, _, rest = stem.partition(".tmp.")
            pid = rest.partition(".")[0]
        elif path.is_file() and stem.startswith(f"{CATALOGUE_FILE}."):  # `write_catalogue`'s temporary
            name, pid = CATALOGUE_FILE, stem[len(CATALOGUE_FILE) + 1:]
        else:
            continue
        if not pid.isdigit() or _process_alive(int(pid)):
            continue
        target = folder / name
        if path.is_dir() and ".old." in stem and not target.exists():
            os.replace(path, target)
            done.append(f"restored {name}: process {pid} moved it aside and died before replacing it")
        else:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            done.append(f"removed {path.name}, left by process {pid}")
    return done


def _cache_entry_valid(entry: Path) -> bool:
    """A hit: the commit marker, every kernel file, and a manifest naming the marker's cubin digest,
    which the cubin has."""
    from cutegen.runtime.manifest import ManifestError

    try:
        data = json.loads((entry / META_FILE).read_text())
        cubin = (entry / CUBIN_FILE).read_bytes()
        manifest = KernelManifest.from_json((entry / MANIFEST_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ManifestError):
        return False
    digest = hashlib.sha256(cubin).hexdigest()
    return (isinstance(data, dict) and data.get("sha256") == digest == manifest.sha256
            and all((entry / f).is_file() for f in KERNEL_FILES))


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
    tmp = staging_folder(entry.parent, key)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            art = _compile(schedule, Path(scratch))
        manifest = _write_kernel_dir(tmp, schedule, art)
        # The commit marker goes last.
        (tmp / META_FILE).write_text(
            json.dumps({"name": name, "key": key, "sha256": manifest.sha256}, indent=2) + "\n"
        )
        with folder_lock(entry.parent):
            if not force and _cache_entry_valid(entry):
                shutil.rmtree(tmp, ignore_errors=True)  # another process committed the same kernel
            else:
                commit_folder(tmp, entry)
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
    # What the build repaired or left out: leftovers of builds that died, unreadable manifests.
    notices: list[str] = dataclasses.field(default_factory=list)

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
        lines += self.notices
        lines.append(
            f"{len(self.results)} kernels: {self.count('built')} built, "
            f"{self.count('cached')} cache hits, {self.count('failed')} failed "
            f"in {self.seconds:.1f}s → {self.out_dir}"
        )
        return "\n".join(lines)


def _copy_entry_to(entry: Path, dest: Path) -> None:
    """Replace the kernel folder ``dest`` with a copy of the cache entry (the build folder's lock
    held by the caller; the cache's is taken while copying, so no commit swaps the entry meanwhile)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_folder(dest.parent, dest.name)
    try:
        with folder_lock(entry.parent):
            for name in KERNEL_FILES:
                shutil.copy2(entry / name, tmp / name)
        commit_folder(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _kernel_manifests(out_dir: Path) -> list[Path]:
    """The manifest of every kernel folder in `out_dir` (folders starting with "." are staging)."""
    return [p for p in sorted(out_dir.glob(f"*/{MANIFEST_FILE}")) if not p.parent.name.startswith(".")]


def write_catalogue(out_dir: Path, notices: list[str] | None = None) -> Catalogue:
    """Index every kernel folder in `out_dir` into catalogue.json (atomically), each with its
    manifest's sha256; a folder whose manifest cannot be read is left out, and said in ``notices``."""
    from cutegen.runtime.manifest import ManifestError

    entries = []
    toolchain: dict[str, str] = {}
    for manifest_path in _kernel_manifests(out_dir):
        try:
            raw = manifest_path.read_bytes()
            m = KernelManifest.from_json(raw.decode())
        except (OSError, UnicodeDecodeError, ManifestError) as exc:
            if notices is not None:
                notices.append(f"left out of the catalogue: {manifest_path} cannot be read ({exc}); "
                               "rebuild that kernel or delete its folder")
            continue
        toolchain = dict(m.toolchain)
        entries.append(
            CatalogueEntry(
                name=m.name,
                op=m.op,
                arch=m.arch,
                manifest=f"{manifest_path.parent.name}/{MANIFEST_FILE}",
                schedule=m.schedule,
                manifest_sha256=hashlib.sha256(raw).hexdigest(),
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
    with folder_lock(out_dir):
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
    notices: list[str] = []
    for folder in (cache, out_dir):
        with folder_lock(folder):
            notices += [f"{folder}: {line}" for line in recover_folder(folder)]
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
    with folder_lock(out_dir):
        for rec in records:
            if rec["status"] != "failed":
                _copy_entry_to(cache / rec["key"], out_dir / rec["name"])
            else:
                sys.stderr.write(f"\n--- {rec['name']} failed ---\n{rec.get('traceback', '')}\n")
            results.append(KernelResult(rec["name"], rec["status"], rec["seconds"], rec.get("error")))
        write_catalogue(out_dir, notices)
    return BuildReport(out_dir=out_dir, results=results, seconds=time.perf_counter() - t0, notices=notices)
