"""Which kernel template implements each (arch, op); templates are imported lazily (they import the CuTe DSL)."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

from cutegen.schedules.spec import Arch, Op, Schedule

# (arch, op) → "module:Class"
_TEMPLATES: dict[tuple[Arch, Op], str] = {
    (Arch.SM90A, Op.BF16_GEMM_NT): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.FP8_GEMM_NT): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.M_GROUPED_FP8_GEMM_NT_MASKED): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.FP8_WGRAD_GEMM_NT): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.K_GROUPED_FP8_GEMM_NT_CONTIGUOUS): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM100A, Op.FP8_GEMM_NT): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.M_GROUPED_FP8_GEMM_NT_MASKED): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM90A, Op.PER_TOKEN_QUANT_FP8): "cutegen.templates.hopper_quant:PerTokenQuantTemplate",
    (Arch.SM90A, Op.PER_BLOCK_QUANT_FP8): "cutegen.templates.hopper_quant:PerBlockQuantTemplate",
    (Arch.SM90A, Op.GROUPED_TRANSPOSED_QUANT_FP8): "cutegen.templates.hopper_quant:GroupedTransposedQuantTemplate",
}


class NoTemplateError(LookupError):
    pass


def template_path(schedule: Schedule) -> str:
    key = (schedule.arch, schedule.op)
    if key not in _TEMPLATES:
        raise NoTemplateError(
            f"no template implements op {schedule.op.value!r} on {schedule.arch.value}; "
            f"available: {sorted(f'{a.value}/{o.value}' for a, o in _TEMPLATES)}"
        )
    return _TEMPLATES[key]


def load_template(schedule: Schedule):
    """Instantiate the template for a schedule (imports the CuTe DSL)."""
    module_name, class_name = template_path(schedule).split(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)(schedule)


# Modules the GEMM templates share; a change to one rebuilds every kernel whose template imports it.
_SHARED_SOURCES: dict[str, tuple[str, ...]] = {
    "hopper_gemm": ("gemm_contract.py", "gemm_entries.py", "tile_order.py"),
    "blackwell_gemm": ("gemm_contract.py", "gemm_entries.py", "tile_order.py"),
}


def template_fingerprint(schedule: Schedule) -> str:
    """sha256 over the sources a kernel depends on: its template module and the modules it shares
    with other templates, the dtype table and the schedule vocabulary."""
    module_name, _ = template_path(schedule).split(":")
    module = module_name.rsplit(".", 1)[1]
    here = Path(__file__).parent
    sources = [here / (module + ".py"), *(here / f for f in _SHARED_SOURCES.get(module, ())),
               here / "registry.py", here / "dtypes.py", here.parent / "schedules" / "spec.py"]
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()
