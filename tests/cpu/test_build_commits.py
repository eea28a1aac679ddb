"""CPU tier: how builds commit kernel folders (locks, staging, recovery after a crash) and what the cache key covers; no kernel is compiled here."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cutegen.gen import build
from cutegen.gen.build import commit_folder, folder_lock, recover_folder, staging_folder

DEAD_PID = None


def dead_pid() -> int:
    """The pid of a process that has exited."""
    global DEAD_PID
    if DEAD_PID is None:
        proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        DEAD_PID = int(proc.stdout)
    return DEAD_PID


def make_folder(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    for name in ("a.txt", "b.txt", "c.txt"):
        (path / name).write_text(f"{tag} {name}\n")
    return path


def tags(path: Path) -> set[str]:
    return {p.read_text().split()[0] for p in path.iterdir()}


def test_commit_replaces_a_folder_and_leaves_nothing_behind(tmp_path):
    dest = make_folder(tmp_path / "kernel", "old")
    staged = staging_folder(tmp_path, "kernel")
    assert staged.name.startswith(f".kernel.tmp.{os.getpid()}.")
    for name in ("a.txt", "b.txt"):
        (staged / name).write_text(f"new {name}\n")
    with folder_lock(tmp_path):
        commit_folder(staged, dest)
    assert tags(dest) == {"new"} and sorted(p.name for p in dest.iterdir()) == ["a.txt", "b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [build.LOCK_FILE, "kernel"]


def test_recovery_puts_back_what_a_dead_build_moved_aside_and_clears_its_staging(tmp_path):
    pid = dead_pid()
    make_folder(tmp_path / f".lost.old.{pid}", "old")  # died between the two renames
    make_folder(tmp_path / "kept", "new")
    make_folder(tmp_path / f".kept.old.{pid}", "old")  # died before deleting the old one
    make_folder(tmp_path / f".other.tmp.{pid}.abc123", "half")  # died while staging
    (tmp_path / f".{build.CATALOGUE_FILE}.{pid}").write_text("{")  # died writing the catalogue
    make_folder(tmp_path / f".busy.tmp.{os.getpid()}.xyz", "live")  # a live build's: left alone
    make_folder(tmp_path / ".notes", "user")  # not ours: left alone
    done = recover_folder(tmp_path)
    assert len(done) == 4, done
    assert tags(tmp_path / "lost") == {"old"} and tags(tmp_path / "kept") == {"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["lost", "kept", f".busy.tmp.{os.getpid()}.xyz", ".notes"])
    assert any("restored lost" in line for line in done)


def _hammer(folder: str, tag: str, rounds: int) -> None:
    """Stage and commit `dest` many times, and copy it out as a reader would, under the lock."""
    folder = Path(folder)
    for i in range(rounds):
        staged = staging_folder(folder, "dest")
        for name in ("a.txt", "b.txt", "c.txt"):
            (staged / name).write_text(f"{tag}-{i} {name}\n")
        with folder_lock(folder):
            commit_folder(staged, folder / "dest")
        with folder_lock(folder):
            seen = {p.read_text().split()[0] for p in (folder / "dest").iterdir()}
        assert len(seen) == 1, seen  # never a mixture of two commits


def test_concurrent_commits_never_mix_or_lose_a_folder(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), f"p{k}", 40)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(tags(tmp_path / "dest")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [build.LOCK_FILE, "dest"]


def test_cache_key_covers_dsl_settings_and_every_imported_module(monkeypatch):
    from cutegen.schedules.loader import default_schedules
    from cutegen.templates import registry

    quant = next(s for s in default_schedules() if s.op.value == "per_block_quant_fp8")
    gemm = next(s for s in default_schedules() if s.op.value == "fp8_gemm_nt" and s.arch.value == "sm_90a")
    for module in ("hopper_quant", "hopper_gemm"):
        names = registry.project_sources(f"cutegen.templates.{module}")
        assert {"cutegen.templates.gmem_vec", "cutegen.schedules.spec", "cutegen.templates.dtypes"} <= set(names), names
        assert all(path.is_file() for path in names.values())
    monkeypatch.delenv("CUTE_DSL_LINEINFO", raising=False)
    plain = build.cache_key(quant)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")  # set by the build itself from the schedule
    assert build.cache_key(quant) == plain
    monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")
    assert build.cache_key(quant) != plain


def test_cache_entry_counts_only_when_whole(tmp_path):
    import hashlib

    from cutegen.runtime.manifest import SCHEMA_VERSION

    entry = tmp_path / "entry"
    entry.mkdir()
    cubin = b"\x7fELF fake cubin"
    digest = hashlib.sha256(cubin).hexdigest()
    for name in build.KERNEL_FILES:
        (entry / name).write_text("x")
    (entry / build.CUBIN_FILE).write_bytes(cubin)
    manifest = {
        "schema": SCHEMA_VERSION, "name": "k", "op": "bf16_gemm_nt", "arch": "sm_90a", "entry": "e",
        "cubin": build.CUBIN_FILE, "sha256": digest, "block": [384, 1, 1], "cluster": [1, 1, 1],
        "smem_bytes": 1024, "pdl": False, "cooperative": False,
        "grid": {"kind": "persistent_clusters", "tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 1,
                 "extent_m": "M", "extent_n": "N"},
        "operands": [], "params": [], "schedule": {}, "toolchain": {}, "facts": {}, "requires": [],
    }
    (entry / build.MANIFEST_FILE).write_text(json.dumps(manifest))
    (entry / build.META_FILE).write_text(json.dumps({"sha256": digest}))
    assert build._cache_entry_valid(entry)
    (entry / build.SASS_FILE).unlink()
    assert not build._cache_entry_valid(entry)  # a missing file is a miss
    (entry / build.SASS_FILE).write_text("x")
    (entry / build.MANIFEST_FILE).write_text("[1, 2]")
    assert not build._cache_entry_valid(entry)  # a manifest of the wrong shape is a miss
    (entry / build.MANIFEST_FILE).write_text(json.dumps(manifest | {"sha256": "0" * 64}))
    assert not build._cache_entry_valid(entry)  # a manifest naming another cubin is a miss
