"""Build the runtime wheel: ``cutegen.runtime`` plus the prebuilt default kernels, without the generator.

``python -m cutegen.gen.wheel`` (what ``make wheel`` runs) writes
``dist/cutegen-<version>-py3-none-any.whl`` on any CPU machine. The wheel holds, under the namespace
``cutegen``, the packages ``cutegen.runtime``, ``cutegen.deep_gemm`` (with its subpackages) and
the data package ``cutegen.kernels``: the build
folder's ``catalogue.json`` and, per kernel, ``manifest.json`` and ``kernel.cubin`` (no PTX, SASS or
headers). Its ``__init__.py`` records ``CUBIN_SHA256``, every packaged cubin's sha256, which the
runtime checks beside the manifest's when it reads a cubin. The wheel depends on the base
dependencies of pyproject.toml only (numpy, cuda-bindings); torch is the ``torch`` extra.

The build folder must hold every kernel of the default schedules, each cubin matching its
manifest's sha256; ``--allow-partial`` (for tests) packages the default kernels it has. Steps: check
the build folder, stage a temporary source tree (the runtime sources, the kernels, a generated
pyproject.toml), then ``python -m pip wheel --no-deps --no-build-isolation`` it (setuptools>=77 must
be importable; nothing is downloaded). Beside it, the same way, ``dist/deep_gemm-*.whl`` from
``compat/deep_gemm``: the ``deep_gemm`` import name for engines written against DeepGEMM.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Sequence

import cutegen.deep_gemm
import cutegen.runtime
from cutegen.runtime.manifest import Catalogue, CatalogueEntry, KernelManifest, ManifestError

from cutegen.runtime.version import __version__

# The source packages the runtime wheel carries, by their name under `cutegen`, and their folders.
RUNTIME_PACKAGES = {
    "runtime": Path(cutegen.runtime.__file__).resolve().parent,
    "deep_gemm": Path(cutegen.deep_gemm.__file__).resolve().parent,
}
PROJECT_ROOT = RUNTIME_PACKAGES["runtime"].parent  # the source checkout holding pyproject.toml
KERNELS_PACKAGE = "kernels"
# The `deep_gemm` import-name distribution (compat/deep_gemm), built beside the runtime wheel.
COMPAT_SOURCE = PROJECT_ROOT / "compat" / "deep_gemm"
CATALOGUE_FILE = "catalogue.json"
MIN_SETUPTOOLS = (77,)


class WheelError(Exception):
    """The wheel cannot be built from this build folder or environment (reported without a traceback)."""


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def default_kernel_names() -> set[str]:
    """The procedural names of every valid default schedule point (what `make build` builds)."""
    from cutegen.schedules import all_expanded

    return {e.name for e in all_expanded() if e.valid and e.name}


# ---- the build folder ----------------------------------------------------------------------------


def read_catalogue(build_dir: Path) -> Catalogue:
    path = build_dir / CATALOGUE_FILE
    if not path.is_file():
        raise WheelError(f"no kernel catalogue at {path}: build the kernels with `cutegen build -o {build_dir}`")
    try:
        return Catalogue.from_json(path.read_text())
    except (ManifestError, OSError, UnicodeDecodeError) as exc:
        raise WheelError(f"{path} cannot be used: {exc}") from None


def select_kernels(catalogue: Catalogue, build_dir: Path, allow_partial: bool) -> list[CatalogueEntry]:
    """The catalogue's default kernels; all of them unless ``allow_partial``."""
    wanted = default_kernel_names()
    chosen = [e for e in catalogue.kernels if e.name in wanted]
    missing = sorted(wanted - {e.name for e in chosen})
    if missing and not allow_partial:
        shown = "".join(f"\n  {n}" for n in missing[:10]) + ("\n  ..." if len(missing) > 10 else "")
        raise WheelError(
            f"{build_dir} lacks {len(missing)} of the {len(wanted)} default kernels; build them with "
            f"`cutegen build -o {build_dir}`:{shown}"
        )
    if not chosen:
        raise WheelError(f"{build_dir} holds none of the default kernels")
    return sorted(chosen, key=lambda e: e.name)


def checked_kernel(build_dir: Path, entry: CatalogueEntry) -> tuple[Path, Path, str]:
    """``(manifest path, cubin path, sha256)`` of one kernel, after checking the cubin's sha256."""
    manifest_path = build_dir / entry.manifest
    try:
        manifest = KernelManifest.from_json(manifest_path.read_text())
    except (ManifestError, OSError, UnicodeDecodeError) as exc:
        raise WheelError(f"kernel {entry.name}: manifest {manifest_path} cannot be used: {exc}") from None
    if manifest.name != entry.name or Path(manifest.cubin).is_absolute():
        raise WheelError(f"kernel {entry.name}: manifest {manifest_path} does not describe a kernel of this folder")
    cubin = manifest_path.parent / manifest.cubin
    if not cubin.is_file():
        raise WheelError(f"kernel {entry.name}: cubin {cubin} is missing; rebuild it with `cutegen build`")
    digest = sha256_file(cubin)
    if digest != manifest.sha256.lower():
        raise WheelError(
            f"kernel {entry.name}: cubin {cubin} has sha256 {digest}, its manifest records "
            f"{manifest.sha256}; rebuild it with `cutegen build --force`"
        )
    return manifest_path, cubin, digest


# ---- staging -------------------------------------------------------------------------------------


def kernels_init(digests: dict[str, str], version: str) -> str:
    """The source of ``cutegen/kernels/__init__.py``: the package version and the cubin digests."""
    lines = [
        '"""The prebuilt default kernels of the cutegen runtime wheel: catalogue.json, and per kernel'
        " manifest.json and kernel.cubin.",
        "",
        "The runtime finds this folder when no build folder is given (`cutegen.runtime.catalogue."
        "resolve_build_dir`)",
        "and checks every cubin it reads against both its manifest and CUBIN_SHA256.",
        '"""',
        "",
        f"PACKAGE_VERSION = {version!r}",
        "",
        "CUBIN_SHA256 = {",
        *(f"    {name!r}: {digest!r}," for name, digest in sorted(digests.items())),
        "}",
        "",
    ]
    return "\n".join(lines)


def stage_kernels(build_dir: Path, entries: list[CatalogueEntry], toolchain: dict[str, str], dest: Path,
                  version: str) -> dict[str, str]:
    """Write the ``cutegen.kernels`` package into ``dest``; return ``{kernel name: cubin sha256}``."""
    dest.mkdir(parents=True)
    digests = {}
    for entry in entries:
        manifest_path, cubin, digest = checked_kernel(build_dir, entry)
        target = dest / entry.manifest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(manifest_path, target)
        cubin_target = target.parent / cubin.relative_to(manifest_path.parent)
        cubin_target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cubin, cubin_target)
        digests[entry.name] = digest
    (dest / CATALOGUE_FILE).write_text(Catalogue(list(entries), dict(toolchain)).to_json())
    (dest / "__init__.py").write_text(kernels_init(digests, version))
    return digests


def package_data(src: Path) -> dict[str, list[str]]:
    """Every staged package's non-Python files, relative to the package (subpackages excluded)."""
    data = {}
    for init in sorted(src.rglob("__init__.py")):
        package = init.parent
        files = []
        for path in sorted(package.rglob("*")):
            if not path.is_file() or path.suffix in (".py", ".pyc"):
                continue
            owner = path.parent
            while owner != package and not (owner / "__init__.py").is_file():
                owner = owner.parent
            if owner == package:
                files.append(path.relative_to(package).as_posix())
        if files:
            data[".".join(package.relative_to(src).parts)] = files
    return data


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(toml_string(v) for v in values) + "]"


def wheel_pyproject(project: dict, data: dict[str, list[str]]) -> str:
    """The staged pyproject.toml: the project's name, version, licence and base dependencies, no scripts."""
    torch_extra = project.get("optional-dependencies", {}).get("torch", ["torch"])
    lines = [
        "[build-system]",
        'requires = ["setuptools>=77"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        f"name = {toml_string(project['name'])}",
        f"version = {toml_string(project['version'])}",
        'description = "The cutegen runtime (cuda-python loader, launcher, torch ops) with its prebuilt '
        'default kernels."',
        f"requires-python = {toml_string(project.get('requires-python', '>=3.10'))}",
        f"dependencies = {toml_list(project.get('dependencies', []))}",
    ]
    if "license" in project:
        lines.append(f"license = {toml_string(project['license'])}")
    if (PROJECT_ROOT / "LICENSE").is_file():
        lines.append('license-files = ["LICENSE"]')
    lines += [
        "",
        "[project.optional-dependencies]",
        f"torch = {toml_list(torch_extra)}",
        "",
        "[tool.setuptools.packages.find]",
        'where = ["src"]',
        "",
        "[tool.setuptools.package-data]",
        *(f"{toml_string(pkg)} = {toml_list(files)}" for pkg, files in sorted(data.items())),
    ]
    return "\n".join(lines) + "\n"


def stage(build_dir: Path, entries: list[CatalogueEntry], toolchain: dict[str, str], root: Path,
          project: dict) -> dict[str, str]:
    """Stage the wheel's source tree in ``root``; return the packaged cubins' digests."""
    src = root / "src" / "cutegen"  # a namespace, as in the source tree: no __init__.py
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name, folder in RUNTIME_PACKAGES.items():
        shutil.copytree(folder, src / name, ignore=ignore)
    digests = stage_kernels(build_dir, entries, toolchain, src / KERNELS_PACKAGE, project["version"])
    if (PROJECT_ROOT / "LICENSE").is_file():
        shutil.copyfile(PROJECT_ROOT / "LICENSE", root / "LICENSE")
    (root / "pyproject.toml").write_text(wheel_pyproject(project, package_data(root / "src")))
    return digests


# ---- building ------------------------------------------------------------------------------------


def check_setuptools() -> None:
    try:
        import setuptools
    except ImportError:
        raise WheelError(f"setuptools>=77 is needed to build the wheel: `{sys.executable} -m pip install "
                         "'setuptools>=77'`") from None
    major = int(setuptools.__version__.split(".")[0])
    if (major,) < MIN_SETUPTOOLS:
        raise WheelError(f"setuptools {setuptools.__version__} is too old to build the wheel (the runtime's "
                         f"pyproject.toml needs setuptools>=77): `{sys.executable} -m pip install "
                         "'setuptools>=77'`")


def read_project(pyproject: Path) -> dict:
    if not pyproject.is_file():
        raise WheelError(f"{pyproject} not found: build the wheel from a cutegen source checkout")
    project = tomllib.loads(pyproject.read_text())["project"]
    return {**project, "version": __version__}


def build_wheel(build_dir: Path, dist: Path, allow_partial: bool = False, quiet: bool = True
                ) -> tuple[Path, collections.Counter[str]]:
    """Build the runtime wheel into ``dist``; return its path and the packaged kernels per architecture."""
    check_setuptools()
    project = read_project(PROJECT_ROOT / "pyproject.toml")
    catalogue = read_catalogue(build_dir)
    entries = select_kernels(catalogue, build_dir, allow_partial)
    dist.mkdir(parents=True, exist_ok=True)
    wheel = dist / f"{project['name']}-{project['version']}-py3-none-any.whl"
    with tempfile.TemporaryDirectory(prefix="cutegen-wheel-") as tmp:
        root = Path(tmp) / "stage"
        stage(build_dir, entries, catalogue.toolchain, root, project)
        wheel.unlink(missing_ok=True)
        # A staged copy and a private working folder, so no build/ or *.egg-info lands in the checkout.
        _pip_wheel(root, dist, quiet, Path(tmp))
        if not wheel.is_file():
            raise WheelError(f"pip wrote no {wheel.name} into {dist}")
    return wheel, collections.Counter(e.arch for e in entries)


def _pip_wheel(source: Path, dist: Path, quiet: bool, workdir: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
           *(["-q"] if quiet else []), "-w", str(dist.resolve()), str(source)]
    proc = subprocess.run(cmd, cwd=workdir, env={**os.environ, "PIP_NO_INPUT": "1"})
    if proc.returncode != 0:
        raise WheelError(f"`{' '.join(cmd)}` failed (exit status {proc.returncode})")


def build_compat_wheel(dist: Path, quiet: bool = True) -> Path:
    """Build the ``deep_gemm`` wheel (compat/deep_gemm) into ``dist`` from a staged copy."""
    project = tomllib.loads((COMPAT_SOURCE / "pyproject.toml").read_text())["project"]
    for old in dist.glob(f"{project['name']}-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="cutegen-compat-wheel-") as tmp:
        root = Path(tmp) / "stage"
        shutil.copytree(COMPAT_SOURCE, root, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        _pip_wheel(root, dist, quiet, Path(tmp))
    wheels = sorted(dist.glob(f"{project['name']}-{project['version']}-*.whl"))
    if not wheels:
        raise WheelError(f"no {project['name']} wheel was written into {dist}")
    return wheels[-1]



def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cutegen.gen.wheel",
        description="Build dist/cutegen-<version>-py3-none-any.whl: the runtime and the prebuilt default "
        "kernels of a build folder (no generator, no CuTe DSL).",
    )
    parser.add_argument("--build-dir", default="build", help="the build folder holding the default catalogue "
                        "(default: build)")
    parser.add_argument("--dist", default="dist", help="where the wheel is written (default: dist)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="package the default kernels the build folder has instead of refusing one that "
                        "lacks some (for tests; a released wheel carries all of them)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pip's output")
    args = parser.parse_args(argv)
    try:
        wheel, per_arch = build_wheel(Path(args.build_dir), Path(args.dist), args.allow_partial,
                                      quiet=not args.verbose)
        compat = build_compat_wheel(Path(args.dist), quiet=not args.verbose) if COMPAT_SOURCE.is_dir() else None
    except WheelError as exc:
        print(f"cutegen wheel: error: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{n} {arch}" for arch, n in sorted(per_arch.items()))
    print(f"{wheel} ({wheel.stat().st_size / 1e6:.1f} MB): {sum(per_arch.values())} kernels ({counts})")
    if compat is not None:
        print(f"{compat} ({compat.stat().st_size / 1e3:.1f} kB): the `deep_gemm` import name over cutegen.deep_gemm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
