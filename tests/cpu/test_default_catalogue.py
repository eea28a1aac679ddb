"""CPU tier: every default schedule (both architectures, every op) compiles, and its SASS keeps the
invariants `cutegen verify` checks: the op's MMA opcode (QGMMA for the FP8 GEMMs on sm_90a), no
local memory, no stack, registers and shared memory that fit the SM, the cubin's sha256."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")

from cutegen.gen.build import build_schedules  # noqa: E402
from cutegen.gen.verify import expected_mma, verify_kernel  # noqa: E402
from cutegen.schedules.loader import default_schedules  # noqa: E402
from cutegen.schedules.naming import procedural_name  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    """The whole default catalogue built once into a fresh folder (the shared build cache, so a
    machine that ran `make build` reuses its artifacts; a fresh one compiles all of them)."""
    out = tmp_path_factory.mktemp("catalogue")
    schedules = default_schedules()
    report = build_schedules(schedules, out, jobs=2, progress=False)
    return {"out": out, "schedules": schedules, "report": report}


def test_every_default_schedule_compiles(catalogue):
    report = catalogue["report"]
    failed = [f"{r.name}: {r.error}" for r in report.results if r.status == "failed"]
    assert not failed, "\n".join(failed)
    assert len(report.results) == len(catalogue["schedules"])


def test_every_default_kernel_keeps_its_sass_invariants(catalogue):
    out = catalogue["out"]
    bad = []
    for schedule in catalogue["schedules"]:
        name = procedural_name(schedule)
        verdict = verify_kernel(out / name)
        if not verdict.ok:
            bad.append(f"{name}: " + "; ".join(f"{c.name}: {c.detail}" for c in verdict.failures()))
    assert not bad, "\n".join(bad)


def test_every_fp8_gemm_kernel_uses_qgmma_without_local_memory(catalogue):
    """The FP8 GEMM ops' own statement of the rule (issue-level, not only through verify's table)."""
    out = catalogue["out"]
    fp8_sm90 = [s for s in catalogue["schedules"] if s.arch.value == "sm_90a" and s.block_scaled and not s.op.is_quantize]
    assert fp8_sm90, "no sm_90a block-scaled schedule in the default set"
    for schedule in fp8_sm90:
        name = procedural_name(schedule)
        verdict = verify_kernel(out / name)
        mma = verdict.facts.get("mma", {})
        assert expected_mma("sm_90a", schedule.op.value) == "QGMMA", name
        assert mma.get("QGMMA", 0) > 0, f"{name}: no QGMMA in its SASS ({mma})"
        local = next(c for c in verdict.checks if c.name == "local_memory")
        assert local.ok, f"{name}: {local.detail}"


@pytest.mark.parametrize("name", [
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_256x128x128_c1x2_mca_s3_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_fp8gemm_e4m3_e4m3_bf16_f32_sff32_128x192x128_c2x1_mcb_s4_wg2_r40x232_epitma_rm_g8",
    "cutegen_sm90a_mgfp8gemmc_e4m3_e4m3_bf16_f32_sff32_128x192x128_c2x1_mcb_s4_wg2_r40x232_epiwg_rm_g8",
])
def test_block_scaled_main_loop_reads_sfb_by_shuffle(catalogue, name):
    """The main loop of these kernels holds the tile's SFB in warp registers, a chunk of K blocks
    per lane, and reads a block's value with an indexed shuffle (one per SFB block the tile
    spans), not with a global load per block."""
    ptx = (catalogue["out"] / name / "kernel.ptx").read_text()
    shuffles = ptx.count("shfl.sync.idx.b32")
    two_blocks = "x192x" in name  # a 192-wide tile spans two 128-column scale blocks
    assert shuffles >= (2 if two_blocks else 1), f"{name}: {shuffles} indexed shuffles"


@pytest.fixture(scope="module")
def hopper_gemm_sass(catalogue):
    """(schedule, name, SASS) of every sm_90a block-scaled GEMM of the catalogue, disassembled once
    for the tests that read their instructions."""
    from cutegen.gen.sass import disassemble

    found = []
    for s in catalogue["schedules"]:
        if s.arch.value != "sm_90a" or not s.block_scaled or s.op.is_quantize:
            continue
        name = procedural_name(s)
        sass, _ = disassemble((catalogue["out"] / name / "kernel.cubin").read_bytes())
        found.append((s, name, sass))
    return found


def test_static_stage_rounds_wait_on_barriers_at_constant_offsets(hopper_gemm_sass):
    """Kernels with `Schedule.static_stage_rounds` wait on each stage's full barrier at its own
    constant offset from the barrier array (8 bytes a stage: +0x8 .. +8(S-1) in the try-waits'
    addresses); the others compute every stage's barrier address at run time, so no try-wait of
    theirs names those offsets (only the empty barriers' array, 8S bytes on)."""
    import re

    checked = 0
    for s, name, sass in hopper_gemm_sass:
        offsets = {int(x, 16) for x in re.findall(r"TRYWAIT P\d+, \[[^\]]*?\+0x([0-9a-f]+)\]", sass)}
        per_stage = {8 * k for k in range(1, s.stages)}
        if s.static_stage_rounds:
            assert per_stage <= offsets, f"{name}: try-wait offsets {sorted(offsets)}"
            checked += 1
        else:
            assert not per_stage & offsets, f"{name}: try-wait offsets {sorted(offsets)}"
    assert checked > 0, "no kernel of the catalogue has static stage rounds"


def test_contiguous_kernels_prefetch_their_tiles_groups_into_l1(hopper_gemm_sass):
    """The contiguous layout reads each tile's group (m_indices of its first row) at the tile's
    start as a uniform value, a load the warp waits for: each role prefetches the next tile's line
    into L1 (`prefetch.global.L1`, SASS `CCTL.E.PF1`) so that the wait is an L1 hit. One prefetch
    per role, two in 2x1 clusters (the peer's tile too), and one more by the math warps: the line of
    their warpgroup's first row, whether it has real rows (a warpgroup of padding rows issues no
    WGMMAs). The other block-scaled GEMMs have none."""
    contiguous = 0
    for s, name, sass in hopper_gemm_sass:
        prefetches = sass.count("CCTL.E.PF1")
        if s.op.value == "m_grouped_fp8_gemm_nt_contiguous":
            assert prefetches == 2 * s.cluster_m + 1, f"{name}: {prefetches} L1 prefetches"
            contiguous += 1
        else:
            assert prefetches == 0, f"{name}: {prefetches} L1 prefetches"
    assert contiguous > 0, "no contiguous kernel in the catalogue"


def test_modelled_shared_memory_bounds_the_traced_kernel(catalogue):
    """`Schedule.smem_bytes`, which the validity rules budget, against what the traced kernel
    uses (manifest: dynamic; SASS: static): never below it, at most two 1024-byte buffer
    alignments above it for a GEMM; a quantizer's model is its dynamic shared memory exactly."""
    import json

    from cutegen.schedules.spec import SMEM_BUFFER_ALIGN_BYTES

    off = []
    for schedule in catalogue["schedules"]:
        folder = catalogue["out"] / procedural_name(schedule)
        dynamic = json.loads((folder / "manifest.json").read_text())["smem_bytes"]
        static = json.loads((folder / "sass_summary.json").read_text())["static_smem_bytes"] or 0
        model = schedule.smem_bytes
        if schedule.op.is_quantize:
            ok = model == dynamic
        else:
            ok = 0 <= model - (dynamic + static) <= 2 * SMEM_BUFFER_ALIGN_BYTES
        if not ok:
            off.append(f"{folder.name}: model {model}, traced {dynamic} dynamic + {static} static")
    assert not off, "\n".join(off)
