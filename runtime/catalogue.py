"""The catalogue of a build folder: which kernels exist, their manifests and verified cubins.

A build folder holds ``catalogue.json`` (the index, `manifest.Catalogue`) and, per kernel, a
manifest and a cubin (``build/<name>/manifest.json``, ``build/<name>/kernel.cubin``). Paths in the
index are relative to the build folder; a manifest's ``cubin`` is relative to the manifest's own
folder (the build folder is tried second).

Listing and reading manifests work on any machine. The architecture check and the sha256 check
happen when a kernel is loaded (`KernelCatalogue.load`), which is also the only step that touches
the GPU driver.

The build folder is, in order: the explicit path, ``$CUTEGEN_BUILD_DIR``, ``./build`` when it
holds a catalogue, the prebuilt kernels of the runtime wheel (the installed ``cutegen.kernels``
package, `packaged_kernels_dir`) when they are installed, else ``./build``.

A packaged catalogue (a kernel folder with an ``__init__.py``, as ``make wheel`` writes it) records
every cubin's sha256 in its ``CUBIN_SHA256`` table; its cubins are checked against both the
manifest and that table.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .errors import ArchMismatchError, ArtifactError
from .manifest import Catalogue, CatalogueEntry, KernelManifest, ManifestError

if TYPE_CHECKING:  # pragma: no cover
    from .driver import LoadedKernel

BUILD_DIR_ENV = "CUTEGEN_BUILD_DIR"
CATALOGUE_FILE = "catalogue.json"
TUNING_FILE = "tuning.json"
# The data package of the runtime wheel (`make wheel`): catalogue.json, manifests, cubins.
KERNELS_PACKAGE = "cutegen.kernels"
DIGEST_TABLE = "CUBIN_SHA256"

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


def packaged_kernels_dir() -> Path | None:
    """The folder of the installed ``cutegen.kernels`` package if it holds a catalogue, else None.

    Found with `importlib.util.find_spec`, without importing the package (nor torch or CUDA).
    """
    try:
        spec = importlib.util.find_spec(KERNELS_PACKAGE)
    except (ImportError, ValueError):
        return None
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or []:
        if (Path(location) / CATALOGUE_FILE).is_file():
            return Path(location)
    return None


def resolve_build_dir(build_dir: str | os.PathLike[str] | None = None) -> Path:
    """The build folder to use: ``build_dir``, else ``$CUTEGEN_BUILD_DIR``, else ``./build`` if it
    holds a catalogue, else the installed prebuilt kernels (`packaged_kernels_dir`), else ``./build``."""
    if build_dir is not None:
        return Path(build_dir)
    env = os.environ.get(BUILD_DIR_ENV)
    if env:
        return Path(env)
    local = Path.cwd() / "build"
    if (local / CATALOGUE_FILE).is_file():
        return local
    return packaged_kernels_dir() or local


def packaged_digests(root: Path) -> dict[str, str] | None:
    """The ``CUBIN_SHA256`` table of a packaged catalogue (``root/__init__.py``), None for a plain
    build folder. Read as a literal, without importing the package."""
    init = root / "__init__.py"
    if not init.is_file():
        return None
    try:
        tree = ast.parse(init.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == DIGEST_TABLE for t in node.targets
            ):
                table = ast.literal_eval(node.value)
                if isinstance(table, dict):
                    return {str(k): str(v).lower() for k, v in table.items()}
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"the packaged catalogue's {init} cannot be read: {exc}") from exc
    raise ArtifactError(
        f"{init} has no {DIGEST_TABLE} table: the packaged kernels are incomplete; reinstall the "
        "runtime wheel (`make wheel`, `pip install dist/cutegen-*.whl`)"
    )


def required_capability(arch: str) -> tuple[int, int, str]:
    """``(major, minor, rule)`` for an arch name; rule is ``exact``, ``family`` or ``at_least``.

    ``sm_90a`` / ``sm_100a`` (architecture-specific features such as WGMMA or tcgen05) run only on
    exactly that compute capability; ``sm_100f`` on the same major version with minor >= 0; a
    plain ``sm_80`` cubin on the same major version with an equal or higher minor version.
    """
    match = _ARCH_RE.match(arch)
    if not match:
        raise ArtifactError(f"unknown architecture {arch!r}; expected a name like sm_90a")
    number = int(match.group(1))
    major, minor = divmod(number, 10)
    rule = {"a": "exact", "f": "family", "": "at_least"}[match.group(2)]
    return major, minor, rule


def arch_compatible(arch: str, capability: tuple[int, int]) -> bool:
    major, minor, rule = required_capability(arch)
    if rule == "exact":
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


def check_arch(
    manifest: KernelManifest, capability: tuple[int, int], device_name: str = "this GPU"
) -> None:
    """Raise `ArchMismatchError` unless ``manifest`` can run on a GPU of ``capability``."""
    if arch_compatible(manifest.arch, capability):
        return
    major, minor, rule = required_capability(manifest.arch)
    gpu = f"sm_{capability[0]}{capability[1]}"
    need = {
        "exact": f"{manifest.arch} kernels run only on GPUs of compute capability {major}.{minor}",
        "family": f"{manifest.arch} kernels run only on GPUs of compute capability {major}.x",
        "at_least": (
            f"{manifest.arch} kernels run only on GPUs of compute capability {major}.{minor} to "
            f"{major}.9"
        ),
    }[rule]
    raise ArchMismatchError(
        f"kernel {manifest.name} is built for {manifest.arch}; this GPU is {gpu} ({device_name}): "
        f"{need}. Use a kernel built for {gpu}a (cutegen build --arch {gpu}a)."
    )


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class KernelCatalogue:
    """The kernels of one build folder; loads (and caches) them on demand."""

    def __init__(
        self, build_dir: Path, index: Catalogue, cubin_digests: dict[str, str] | None = None
    ) -> None:
        self.build_dir = Path(build_dir)
        self.index = index
        # A packaged catalogue's CUBIN_SHA256 table (None for a build folder).
        self.cubin_digests = cubin_digests
        self._by_name: dict[str, CatalogueEntry] = {e.name: e for e in index.kernels}
        self._manifests: dict[str, KernelManifest] = {}
        self._loaded: dict[tuple[str, int], "LoadedKernel"] = {}
        self._lock = threading.RLock()
        self._root = self.build_dir.absolute()  # paths stay where they were if the process changes folder

    # ---- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, build_dir: str | os.PathLike[str] | None = None) -> "KernelCatalogue":
        """Read ``catalogue.json`` of the build folder (see `resolve_build_dir`) and, for a
        packaged catalogue, its digest table."""
        root = resolve_build_dir(build_dir)
        path = root / CATALOGUE_FILE
        if not path.is_file():
            raise ArtifactError(
                f"no kernel catalogue at {path}: build kernels with `cutegen build -o {root}`, "
                f"point ${BUILD_DIR_ENV} at a build folder, or install the runtime wheel with the "
                "prebuilt kernels (`make wheel` on a CPU machine, then `pip install "
                "dist/cutegen-*.whl`)"
            )
        try:
            index = Catalogue.from_json(path.read_text())
        except (ManifestError, OSError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path} cannot be used: {exc}") from exc
        return cls(root, index, packaged_digests(root))

    def __repr__(self) -> str:
        return f"KernelCatalogue({str(self.build_dir)!r}, {len(self._by_name)} kernels)"

    # ---- listing (no GPU) -------------------------------------------------------------------
    def entries(self, op: str | None = None, arch: str | None = None) -> list[CatalogueEntry]:
        return [
            e
            for e in self.index.kernels
            if (op is None or e.op == op) and (arch is None or e.arch == arch)
        ]

    def names(self, op: str | None = None, arch: str | None = None) -> list[str]:
        return [e.name for e in self.entries(op, arch)]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def entry(self, name: str) -> CatalogueEntry:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ArtifactError(
                f"no kernel named {name!r} in the catalogue at {self.build_dir} (known: {known})"
            ) from None

    def _inside(self, name: str, what: str, relative: str) -> Path:
        """``relative`` in the build folder; ArtifactError when it is absolute or its ``..`` steps
        lead out of it (a catalogue or manifest is data, never a reason to read elsewhere). Judged
        on the path's text, not by resolving links: resolving took half the time of reading an
        op's manifests, the first call's catalogue work."""
        normal = os.path.normpath(relative)
        if os.path.isabs(normal) or normal == os.pardir or normal.startswith(os.pardir + os.sep):
            raise ArtifactError(
                f"kernel {name}: its {what} path {relative!r} leads out of the build folder {self.build_dir}; "
                "rebuild the catalogue with `cutegen build`"
            )
        return self._root / normal

    def manifest_path(self, name: str) -> Path:
        return self._inside(name, "manifest", self.entry(name).manifest)

    def manifest(self, name: str) -> KernelManifest:
        """The kernel's manifest, read and checked against its catalogue line (cached)."""
        cached = self._manifests.get(name)
        if cached is not None:
            return cached
        entry = self.entry(name)
        path = self.manifest_path(name)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ArtifactError(
                f"kernel {name}: manifest {path} is missing; rebuild it with `cutegen build`"
            ) from None
        try:
            if entry.manifest_sha256 is not None and sha256_of(raw) != entry.manifest_sha256.lower():
                raise ManifestError(
                    f"its sha256 {sha256_of(raw)} is not the {entry.manifest_sha256} the catalogue records "
                    "(edited or replaced after the build); rebuild it with `cutegen build`"
                )
            manifest = KernelManifest.from_json(raw.decode())
        except (ManifestError, OSError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"kernel {name}: manifest {path} cannot be used: {exc}") from exc
        if (manifest.name, manifest.op, manifest.arch) != (entry.name, entry.op, entry.arch):
            raise ArtifactError(
                f"kernel {name}: manifest {path} describes {manifest.name} ({manifest.op}, "
                f"{manifest.arch}) but the catalogue lists {entry.name} ({entry.op}, {entry.arch})"
            )
        if manifest.schedule != entry.schedule:  # `compatible` chooses by the catalogue's line
            raise ArtifactError(
                f"kernel {name}: manifest {path} has another schedule than its line in the catalogue; rebuild "
                "it with `cutegen build`"
            )
        self._manifests[name] = manifest
        return manifest

    def manifests(self, op: str | None = None, arch: str | None = None) -> list[KernelManifest]:
        return [self.manifest(n) for n in self.names(op, arch)]

    def compatible(
        self, op: str, capability: tuple[int, int], schedule_wanted: Callable[[dict], bool] | None = None
    ) -> list[KernelManifest]:
        """Manifests of ``op`` whose architecture runs on a GPU of ``capability`` and, with
        ``schedule_wanted``, whose schedule it accepts: told by the catalogue's lines, so that only
        those manifests are read (about 0.15 ms each on a CPU machine: most of a first call)."""
        out = []
        for entry in self.entries(op):
            try:
                ok = arch_compatible(entry.arch, capability)
            except ArtifactError:
                ok = False
            if ok and (schedule_wanted is None or schedule_wanted(entry.schedule)):
                out.append(self.manifest(entry.name))
        return out

    def cubin_path(self, name: str) -> Path:
        """The cubin the manifest names: beside the manifest, else relative to the build folder;
        never outside the build folder."""
        manifest = self.manifest(name)
        folder = Path(self.entry(name).manifest).parent
        beside = self._inside(name, "cubin", str(folder / manifest.cubin))
        if beside.is_file():
            return beside
        in_root = self._inside(name, "cubin", manifest.cubin)
        return in_root if in_root.is_file() else beside

    def read_cubin(self, name: str) -> bytes:
        """The kernel's cubin bytes, after checking their sha256 against the manifest (and, for a
        packaged catalogue, against its ``CUBIN_SHA256`` table)."""
        manifest = self.manifest(name)
        path = self.cubin_path(name)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArtifactError(
                f"kernel {name}: cubin {path} cannot be read ({exc.strerror or exc}); rebuild it "
                "with `cutegen build`"
            ) from exc
        digest = sha256_of(data)
        if digest != manifest.sha256.lower():
            raise ArtifactError(
                f"kernel {name}: cubin {path} is corrupt or stale: sha256 {digest}, manifest "
                f"expects {manifest.sha256}; rebuild it with `cutegen build`"
            )
        if self.cubin_digests is not None:
            recorded = self.cubin_digests.get(name)
            if recorded != digest:
                raise ArtifactError(
                    f"kernel {name}: cubin {path} has sha256 {digest}, the packaged catalogue's "
                    f"{DIGEST_TABLE} records {recorded or 'no digest for it'}; reinstall the runtime "
                    "wheel (`pip install --force-reinstall dist/cutegen-*.whl`)"
                )
        return data

    def tuning_path(self) -> Path:
        return self.build_dir / TUNING_FILE

    # ---- loading (GPU) ----------------------------------------------------------------------
    def load(self, name: str, device: int = 0) -> "LoadedKernel":
        """Load kernel ``name`` on device ``device`` (cached per process and device).

        Refuses a kernel built for another architecture (`ArchMismatchError`) before reading the
        cubin, and a cubin whose sha256 differs from its manifest (`ArtifactError`).
        """
        key = (name, int(device))
        kernel = self._loaded.get(key)
        if kernel is not None:
            return kernel
        from . import driver  # the first GPU-touching step

        with self._lock:
            kernel = self._loaded.get(key)
            if kernel is not None:
                return kernel
            manifest = self.manifest(name)
            info = driver.device_info(int(device))
            check_arch(manifest, info.capability, info.name)
            cubin = self.read_cubin(name)
            kernel = driver.LoadedKernel.load(manifest, cubin, int(device))
            self._loaded[key] = kernel
            return kernel

    def load_all(self, names: Iterable[str], device: int = 0) -> list["LoadedKernel"]:
        return [self.load(n, device) for n in names]

    def loaded(self) -> list["LoadedKernel"]:
        """The kernels this process has loaded so far, on any device."""
        with self._lock:
            return list(self._loaded.values())


def load_catalogue(build_dir: str | os.PathLike[str] | None = None) -> KernelCatalogue:
    """Open the catalogue of a build folder (see `resolve_build_dir`)."""
    return KernelCatalogue.open(build_dir)


__all__ = [
    "BUILD_DIR_ENV",
    "KernelCatalogue",
    "arch_compatible",
    "check_arch",
    "load_catalogue",
    "packaged_kernels_dir",
    "required_capability",
    "resolve_build_dir",
    "sha256_of",
]
