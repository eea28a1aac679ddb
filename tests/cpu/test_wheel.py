"""CPU tier: the runtime wheel with the prebuilt kernels (`make wheel`, `cutegen.gen.wheel`).

Where the runtime looks for kernels (an explicit folder, $CUTEGEN_BUILD_DIR, ./build, the installed
``cutegen.kernels`` package), the packaged digest table it checks cubins against, and a real wheel
built from two compiled kernels, unzipped and installed into a private folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cutegen
import cutegen.runtime
from cutegen.gen import wheel as wheel_builder
from cutegen.runtime.catalogue import (
    KernelCatalogue,
    packaged_kernels_dir,
    resolve_build_dir,
)
from cutegen.runtime.errors import ArtifactError
from cutegen.runtime.manifest import Catalogue
from cutegen.runtime.version import __version__
from test_runtime_packing import make_manifest, write_build

# One Hopper and one Blackwell kernel of the default schedules.
KERNELS = (
    "cutegen_sm90a_gemm_bf16_bf16_bf16_f32_nosf_64x128x64_c1x1_mc0_s8_wg1_r40x232_epitma_rm_g8",
    "cutegen_sm100a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x64x128_c1x1_mc0_s8_wg1_r96x256_epitma_rm_g8",
)


def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_catalogue: bool = True) -> Path:
    """An installed-looking ``cutegen.kernels`` package under ``tmp_path/site``; returns its folder.

    ``cutegen`` is a namespace already imported (from the source tree): the fake site's ``cutegen``
    folder joins its ``__path__``, as a second installed portion of the namespace would."""
    site = tmp_path / "site"
    kernels = site / "cutegen" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "__init__.py").write_text("CUBIN_SHA256 = {}\n")
    if with_catalogue:
        (kernels / "catalogue.json").write_text(Catalogue([], {}).to_json())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(cutegen, "__path__", [*cutegen.__path__, str(site / "cutegen")])
    monkeypatch.delitem(sys.modules, "cutegen.kernels", raising=False)
    return kernels


@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("CUTEGEN_BUILD_DIR", raising=False)
    return work


def test_resolve_build_dir_without_packaged_kernels(workdir, tmp_path, monkeypatch):
    assert packaged_kernels_dir() is None
    assert resolve_build_dir() == workdir / "build"
    assert resolve_build_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("CUTEGEN_BUILD_DIR", str(tmp_path / "env"))
    assert resolve_build_dir() == tmp_path / "env"
    monkeypatch.delenv("CUTEGEN_BUILD_DIR")
    with pytest.raises(ArtifactError, match=r"work/build/catalogue\.json.*make wheel.*pip install dist/cutegen-\*\.whl"):
        KernelCatalogue.open()


def test_resolve_build_dir_order(workdir, tmp_path, monkeypatch):
    packaged = fake_site(tmp_path, monkeypatch)
    # No ./build catalogue: the installed kernels, found without importing the package.
    assert resolve_build_dir() == packaged
    assert "cutegen.kernels" not in sys.modules
    assert KernelCatalogue.open().build_dir == packaged
    # An explicit folder and $CUTEGEN_BUILD_DIR come first, whether or not they hold a catalogue.
    assert resolve_build_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("CUTEGEN_BUILD_DIR", str(tmp_path / "env"))
    assert resolve_build_dir() == tmp_path / "env"
    monkeypatch.delenv("CUTEGEN_BUILD_DIR")
    # ./build with a catalogue comes before the installed kernels; without one it does not.
    (workdir / "build").mkdir()
    assert resolve_build_dir() == packaged
    (workdir / "build" / "catalogue.json").write_text(Catalogue([], {}).to_json())
    assert resolve_build_dir() == workdir / "build"


def test_packaged_kernels_without_catalogue_are_ignored(workdir, tmp_path, monkeypatch):
    fake_site(tmp_path, monkeypatch, with_catalogue=False)
    assert packaged_kernels_dir() is None
    assert resolve_build_dir() == workdir / "build"


def packaged(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A packaged catalogue staged the way the wheel stages it, from a synthetic build folder."""
    build = tmp_path / "build"
    build.mkdir()
    write_build(build, [make_manifest("k90"), make_manifest("k100", arch="sm_100a")],
                {"k90": b"\x7fELF-90", "k100": b"\x7fELF-100"})
    index = Catalogue.from_json((build / "catalogue.json").read_text())
    dest = tmp_path / "pkg" / "cutegen" / "kernels"
    digests = wheel_builder.stage_kernels(build, index.kernels, index.toolchain, dest, "0.1.0")
    return dest, digests


def test_packaged_catalogue_checks_the_digest_table(tmp_path):
    dest, digests = packaged(tmp_path)
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == [
        "__init__.py", "catalogue.json", "kernel.cubin", "kernel.cubin", "manifest.json", "manifest.json"]
    assert digests == {"k100": hashlib.sha256(b"\x7fELF-100").hexdigest(),
                       "k90": hashlib.sha256(b"\x7fELF-90").hexdigest()}
    cat = KernelCatalogue.open(dest)
    assert cat.cubin_digests == digests
    assert cat.read_cubin("k90") == b"\x7fELF-90"

    # A cubin replaced together with its manifest: the manifest agrees, the table does not.
    other = b"\x7fELF-other"
    (dest / "k90" / "kernel.cubin").write_bytes(other)
    manifest = json.loads((dest / "k90" / "manifest.json").read_text())
    manifest["sha256"] = hashlib.sha256(other).hexdigest()
    (dest / "k90" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as err:
        KernelCatalogue.open(dest).read_cubin("k90")
    assert "kernel k90" in str(err.value)
    assert hashlib.sha256(other).hexdigest() in str(err.value) and digests["k90"] in str(err.value)

    # A kernel the table does not list.
    (dest / "__init__.py").write_text(wheel_builder.kernels_init({"k90": digests["k90"]}, "0.1.0"))
    with pytest.raises(ArtifactError, match=f"kernel k100: .*{digests['k100']}.*no digest"):
        KernelCatalogue.open(dest).read_cubin("k100")
    # A package folder without the table at all.
    (dest / "__init__.py").write_text('"""no table"""\n')
    with pytest.raises(ArtifactError, match="no CUBIN_SHA256"):
        KernelCatalogue.open(dest)


def test_build_folder_needs_no_digest_table(tmp_path):
    build = write_build(tmp_path, [make_manifest("k90")], {"k90": b"\x7fELF-90"})
    cat = KernelCatalogue.open(build)
    assert cat.cubin_digests is None and cat.read_cubin("k90") == b"\x7fELF-90"


# ---- a real wheel ------------------------------------------------------------------------------


def run_builder(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cutegen.gen.wheel", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def small_build(tmp_path_factory) -> Path:
    """The two kernels built with the shared build cache (cache hits after `make build`)."""
    pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")
    from cutegen.gen.build import build_schedules
    from cutegen.schedules import default_schedules, procedural_name

    out = tmp_path_factory.mktemp("wheel") / "build"
    schedules = [s for s in default_schedules() if procedural_name(s) in KERNELS]
    assert len(schedules) == len(KERNELS), "the kernels left the default schedules"
    report = build_schedules(schedules, out, jobs=2, progress=False)
    assert report.ok, report.summary()
    return out


@pytest.mark.slow
def test_wheel_of_a_small_build(small_build, tmp_path):
    dist = tmp_path / "dist"
    # The default is strict: every default kernel must be there.
    strict = run_builder("--build-dir", str(small_build), "--dist", str(dist))
    assert strict.returncode == 2 and "lacks" in strict.stderr and "default kernels" in strict.stderr
    assert not dist.exists() or not list(dist.iterdir())

    proc = run_builder("--build-dir", str(small_build), "--dist", str(dist), "--allow-partial")
    assert proc.returncode == 0, proc.stderr
    whl = dist / f"cutegen-{__version__}-py3-none-any.whl"
    assert proc.stdout.strip().startswith(f"{whl} (") and "2 kernels (1 sm_100a, 1 sm_90a)" in proc.stdout

    names = set(zipfile.ZipFile(whl).namelist())
    runtime = {f"cutegen/runtime/{p.name}" for p in Path(cutegen.runtime.__file__).parent.glob("*.py")}
    assert runtime <= names and "cutegen/__init__.py" not in names  # a namespace, as in the source tree
    assert {"cutegen/kernels/__init__.py", "cutegen/kernels/catalogue.json"} <= names
    for name in KERNELS:
        assert {f"cutegen/kernels/{name}/manifest.json", f"cutegen/kernels/{name}/kernel.cubin"} <= names
    assert not [n for n in names if n.endswith((".ptx", ".h", ".txt", ".j2", ".toml"))
                and not n.endswith("top_level.txt")]
    assert not [n for n in names if n.startswith(("cutegen/gen/", "cutegen/templates/", "cutegen/schedules/"))]
    assert {"cutegen/deep_gemm/__init__.py", "cutegen/deep_gemm/testing/__init__.py"} <= names
    with zipfile.ZipFile(whl) as z:
        meta = z.read(f"cutegen-{__version__}.dist-info/METADATA").decode()
        table = z.read("cutegen/kernels/__init__.py").decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any("cuda-bindings>=12.8" in r for r in requires) and any("numpy" in r for r in requires)
    assert not [r for r in requires if "cutlass" in r or "jinja2" in r]
    assert not [r for r in requires if "torch" in r and "extra ==" not in r]
    for name in KERNELS:
        digest = hashlib.sha256((small_build / name / "kernel.cubin").read_bytes()).hexdigest()
        assert f"{name!r}: {digest!r}" in table

    # Installed into a private folder, the runtime finds the packaged kernels with no build folder.
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(whl)], check=True)
    probe = (
        "import cutegen.runtime, sys; from cutegen.runtime.catalogue import KernelCatalogue, resolve_build_dir\n"
        "cat = KernelCatalogue.open()\n"
        "print(cutegen.runtime.__file__, resolve_build_dir(), len(cat), sorted(cat.cubin_digests) == sorted(cat.names()),"
        " [len(cat.read_cubin(n)) > 0 for n in cat.names()], 'torch' in sys.modules, 'cuda' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUTEGEN_BUILD_DIR"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    module, root, rest = out.stdout.split(" ", 2)
    assert Path(module).is_relative_to(target) and Path(root) == target / "cutegen" / "kernels"
    assert rest.split() == ["2", "True", "[True,", "True]", "False", "False"]


@pytest.mark.slow
def test_wheel_refuses_a_stale_cubin(small_build, tmp_path):
    build = tmp_path / "build"
    shutil.copytree(small_build, build)
    cubin = build / KERNELS[0] / "kernel.cubin"
    cubin.write_bytes(cubin.read_bytes() + b"\0")
    proc = run_builder("--build-dir", str(build), "--dist", str(tmp_path / "dist"), "--allow-partial")
    assert proc.returncode == 2
    assert f"kernel {KERNELS[0]}" in proc.stderr and "its manifest records" in proc.stderr


def test_wheel_help_documents_allow_partial():
    proc = run_builder("--help")
    assert proc.returncode == 0 and "--allow-partial" in proc.stdout and "--build-dir" in proc.stdout


def test_staged_manifests_are_copied_unchanged(tmp_path):
    dest, _ = packaged(tmp_path)
    m = dataclasses.replace(make_manifest("k90"), sha256=hashlib.sha256(b"\x7fELF-90").hexdigest())
    assert (dest / "k90" / "manifest.json").read_text() == m.to_json()
