"""SASS invariants of built kernels, checked from their manifest and ``sass_summary.json``.

``cutegen verify`` runs `verify_kernel` on every kernel of a build (or export) folder:

``mma``
    The tensor-core instruction the (arch, op) must use is present (`EXPECTED_MMA`, the one table
    of them): a kernel that compiled to something else (e.g. HMMA fallbacks) fails.
``wgmma_pipeline``
    A main loop with a ring of D WGMMA accumulators (the manifest's fact ``wgmma_accumulators``) has a
    WGMMA wait that leaves D-1 groups in flight: all-zero waits mean ptxas serialised the WGMMAs.
``local_memory``
    No local-memory traffic (``LDL``/``STL``): register spills.
``stack``
    No stack frame.
``registers``
    Registers at entry fit the CTA on one SM: ``registers x threads <= 65536``; and the schedule's
    ``setmaxnreg`` values are at most 256 (``consumer_regs``, ``producer_regs``).
``smem``
    Dynamic plus static shared memory fit the architecture's opt-in limit (232448 bytes).
``cubin``
    The cubin's sha256 equals the manifest's.

Nothing here needs the CuTe DSL or a GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from cutegen.runtime.manifest import KernelManifest, ManifestError

# The MMA opcode each (arch, op) must show in its SASS; the single place that says so.
# "" marks an op that uses no tensor cores (the quantizers): no MMA is required.
EXPECTED_MMA: dict[tuple[str, str], str] = {
    ("sm_90a", "bf16_gemm_nt"): "HGMMA",
    ("sm_90a", "fp8_gemm_nt"): "QGMMA",
    ("sm_90a", "m_grouped_fp8_gemm_nt_contiguous"): "QGMMA",
    ("sm_90a", "m_grouped_fp8_gemm_nt_masked"): "QGMMA",
    ("sm_90a", "fp8_wgrad_gemm_nt"): "QGMMA",
    ("sm_90a", "k_grouped_fp8_gemm_nt_contiguous"): "QGMMA",
    ("sm_90a", "m_grouped_bf16_gemm_nt_contiguous"): "HGMMA",
    ("sm_90a", "m_grouped_bf16_gemm_nt_masked"): "HGMMA",
    ("sm_90a", "k_grouped_bf16_gemm_tn_contiguous"): "HGMMA",
    ("sm_100a", "bf16_gemm_nt"): "UTCHMMA",
    ("sm_100a", "fp8_gemm_nt"): "UTCQMMA",
    ("sm_100a", "m_grouped_fp8_gemm_nt_contiguous"): "UTCQMMA",
    ("sm_100a", "m_grouped_fp8_gemm_nt_masked"): "UTCQMMA",
    ("sm_100a", "fp8_wgrad_gemm_nt"): "UTCQMMA",
    ("sm_100a", "k_grouped_fp8_gemm_tn_contiguous"): "UTCQMMA",
    ("sm_100a", "nvfp4_gemm_nt"): "UTCOMMA",
    **{
        (arch, op): ""
        for arch in ("sm_90a", "sm_100a")
        for op in ("per_token_quant_fp8", "per_token_quant_fp4", "per_block_quant_fp8", "grouped_transposed_quant_fp8")
    },
}
REGISTERS_PER_SM = 65536
MAX_SETMAXNREG = 256
SMEM_OPT_IN_BYTES: dict[str, int] = {"sm_90a": 232448, "sm_100a": 232448}
DEFAULT_SMEM_OPT_IN_BYTES = 232448
SASS_SUMMARY_FILE = "sass_summary.json"
CHECKS = ("mma", "wgmma_pipeline", "local_memory", "stack", "registers", "smem", "cubin")


def expected_mma(arch: str, op: str) -> str | None:
    return EXPECTED_MMA.get((arch, op))


def mma_op(manifest: KernelManifest) -> str:
    """The op whose MMA a kernel runs: its entry point's, or for an entry with a fused epilogue
    (``fp8_gemm_nt_bias_gelu``, ``Schedule.entry``) its GEMM's."""
    gemm = str(manifest.schedule.get("op", ""))
    return gemm if gemm and manifest.op.startswith(gemm + "_") else manifest.op


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclasses.dataclass
class KernelVerdict:
    name: str
    checks: list[Check]
    facts: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "facts": self.facts,
        }


def verify_kernel(kernel_dir: Path, manifest: KernelManifest | None = None) -> KernelVerdict:
    """Check one kernel folder (``manifest.json``, ``sass_summary.json``, the cubin)."""
    kernel_dir = Path(kernel_dir)
    name = manifest.name if manifest else kernel_dir.name
    if manifest is None:
        try:
            manifest = KernelManifest.from_json((kernel_dir / "manifest.json").read_text())
        except (OSError, ManifestError) as exc:
            return KernelVerdict(name, [Check("manifest", False, f"cannot read the manifest: {exc}")], {})
    checks: list[Check] = []
    facts: dict[str, Any] = {"arch": manifest.arch, "op": manifest.op}
    summary_path = kernel_dir / SASS_SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return KernelVerdict(
            name,
            [Check("sass_summary", False, f"{summary_path}: {reason}; rebuild the kernel")],
            facts,
        )

    # mma
    want = expected_mma(manifest.arch, mma_op(manifest))
    mma = {str(k): int(v) for k, v in dict(summary.get("mma", {})).items()}
    facts["mma"] = mma
    facts["expected_mma"] = want
    if want is None:
        checks.append(Check("mma", False, f"no expected MMA opcode is known for ({manifest.arch}, {manifest.op}); "
                                          "add it to EXPECTED_MMA in cutegen/gen/verify.py"))
    elif want == "":
        found = ", ".join(f"{k} x{v}" for k, v in sorted(mma.items()))
        checks.append(Check("mma", True, f"no MMA required for {manifest.op}" + (f" (found {found})" if found else "")))
    elif mma.get(want, 0) > 0:
        others = {k: v for k, v in mma.items() if k != want}
        extra = f" (also {others})" if others else ""
        checks.append(Check("mma", True, f"{want} x{mma[want]}{extra}"))
    else:
        found = ", ".join(f"{k} x{v}" for k, v in sorted(mma.items())) or "no MMA instructions"
        checks.append(Check("mma", False, f"expected {want} for {manifest.arch} {manifest.op}, found {found}"))

    # WGMMA pipeline: a ring of D accumulators must wait with D-1 groups in flight somewhere.
    ring = int(manifest.facts.get("wgmma_accumulators", 1))
    if ring > 1:
        waits = summary.get("wgmma_waits")
        if waits is None:
            checks.append(Check("wgmma_pipeline", False, "the SASS summary does not count the WGMMA waits; rebuild"))
        else:
            deepest = max((int(k) for k in waits), default=0)
            facts["wgmma_waits"] = waits
            checks.append(Check(
                "wgmma_pipeline", deepest >= ring - 1,
                f"deepest WGMMA wait leaves {deepest} group(s) in flight; {ring} accumulators need {ring - 1}"
                + ("" if deepest >= ring - 1 else " (ptxas serialised the WGMMAs)"),
            ))
    else:
        checks.append(Check("wgmma_pipeline", True, "one accumulator"))

    # local memory and stack
    loads, stores = int(summary.get("local_loads", 0)), int(summary.get("local_stores", 0))
    facts["local_loads"], facts["local_stores"] = loads, stores
    checks.append(
        Check("local_memory", loads == 0 and stores == 0,
              f"LDL {loads}, STL {stores}" + ("" if loads == stores == 0 else " (register spills)"))
    )
    stack = summary.get("stack_bytes")
    facts["stack_bytes"] = stack
    if stack is None:
        checks.append(Check("stack", False, "the SASS summary does not state the stack size"))
    else:
        checks.append(Check("stack", int(stack) == 0, f"{stack} bytes"))

    # registers
    regs = summary.get("registers", manifest.registers)
    threads = int(manifest.block[0]) * int(manifest.block[1]) * int(manifest.block[2])
    budget = REGISTERS_PER_SM // max(1, threads)
    facts["registers"], facts["threads"], facts["register_budget"] = regs, threads, budget
    problems = []
    if regs is None:
        problems.append("the SASS summary does not state the registers")
    elif int(regs) > budget:
        problems.append(f"{regs} registers x {threads} threads > {REGISTERS_PER_SM}")
    for field in ("consumer_regs", "producer_regs"):
        value = manifest.schedule.get(field)
        if value is not None and int(value) > MAX_SETMAXNREG:
            problems.append(f"{field}={value} > {MAX_SETMAXNREG}")
    checks.append(
        Check("registers", not problems,
              "; ".join(problems) if problems else f"{regs} <= {budget} (65536 / {threads} threads)")
    )

    # shared memory
    limit = SMEM_OPT_IN_BYTES.get(manifest.arch, DEFAULT_SMEM_OPT_IN_BYTES)
    static = int(summary.get("static_smem_bytes") or 0)
    total = int(manifest.smem_bytes) + static
    facts["smem_bytes"], facts["static_smem_bytes"], facts["smem_limit"] = manifest.smem_bytes, static, limit
    checks.append(
        Check("smem", total <= limit,
              f"{manifest.smem_bytes} dynamic + {static} static = {total} {'<=' if total <= limit else '>'} {limit}")
    )

    # cubin integrity
    cubin = kernel_dir / manifest.cubin
    try:
        digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
    except OSError as exc:
        checks.append(Check("cubin", False, f"{cubin}: {exc.strerror or exc}"))
    else:
        ok = digest == manifest.sha256
        checks.append(Check("cubin", ok, "sha256 matches" if ok else
                            f"sha256 {digest[:16]}... differs from the manifest's {manifest.sha256[:16]}..."))
    return KernelVerdict(name, checks, facts)


__all__ = ["CHECKS", "EXPECTED_MMA", "Check", "KernelVerdict", "expected_mma", "verify_kernel"]
