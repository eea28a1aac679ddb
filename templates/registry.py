"""Which kernel template implements each (arch, op); templates are imported lazily (they import the CuTe DSL)."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
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
    (Arch.SM90A, Op.M_GROUPED_BF16_GEMM_NT_CONTIGUOUS): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.M_GROUPED_BF16_GEMM_NT_MASKED): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM90A, Op.K_GROUPED_BF16_GEMM_TN_CONTIGUOUS): "cutegen.templates.hopper_gemm:HopperGemmTemplate",
    (Arch.SM100A, Op.FP8_GEMM_NT): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.M_GROUPED_FP8_GEMM_NT_MASKED): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.FP8_WGRAD_GEMM_NT): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM100A, Op.NVFP4_GEMM_NT): "cutegen.templates.blackwell_gemm:BlackwellGemmTemplate",
    (Arch.SM90A, Op.PER_TOKEN_QUANT_FP8): "cutegen.templates.hopper_quant:PerTokenQuantTemplate",
    (Arch.SM90A, Op.PER_TOKEN_QUANT_FP4): "cutegen.templates.hopper_quant:PerTokenQuantTemplate",
    (Arch.SM90A, Op.PER_BLOCK_QUANT_FP8): "cutegen.templates.hopper_quant:PerBlockQuantTemplate",
    (Arch.SM100A, Op.PER_TOKEN_QUANT_FP8): "cutegen.templates.hopper_quant:PerTokenQuantTemplate",
    (Arch.SM100A, Op.PER_TOKEN_QUANT_FP4): "cutegen.templates.hopper_quant:PerTokenQuantTemplate",
    (Arch.SM100A, Op.PER_BLOCK_QUANT_FP8): "cutegen.templates.hopper_quant:PerBlockQuantTemplate",
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


def _module_file(name: str) -> Path | None:
    """The source file of project module `name`, found as the import system finds it (so the folder
    mapping of pyproject.toml is followed), without importing it; None for a non-module name."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def project_sources(module: str) -> dict[str, Path]:
    """Module `module` and every module of this project it imports, directly or through another one
    (``cutegen.*`` imports and relative ones), by module name: what a template's kernels depend on."""
    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        path = _module_file(current)
        if current in found or path is None:
            continue
        found[current] = path
        package = current.split(".") if path.name == "__init__.py" else current.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                name = ".".join([*base, *([node.module] if node.module else [])])
                names = [name] + [f"{name}.{alias.name}" for alias in node.names]
            else:
                continue
            todo += [n for n in names if n.split(".")[0] == "cutegen" and n not in found]
    return dict(sorted(found.items()))


def template_fingerprint(schedule: Schedule) -> str:
    """sha256 over the sources a kernel depends on: its template module and every module of the
    project it imports (shared template code, the dtype table, the schedule vocabulary), found by
    reading their imports, and this table."""
    module_name, _ = template_path(schedule).split(":")
    sources = {**project_sources(module_name), __name__: Path(__file__).resolve()}
    h = hashlib.sha256()
    for name, path in sources.items():
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()
