"""Which kernel template implements each (arch, op); templates are imported lazily (they import the CuTe DSL)."""

from __future__ import annotations

import ast
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


def project_sources(path: Path) -> list[Path]:
    """``path`` and every module of this project it imports, directly or through another one
    (``cutegen.*`` imports and relative ones), sorted: what a template's kernels depend on."""
    package_root = Path(__file__).resolve().parent.parent  # the cutegen package
    seen: set[Path] = set()
    todo = [path.resolve()]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        package = ["cutegen", *current.parent.relative_to(package_root).parts]
        for node in ast.walk(ast.parse(current.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "cutegen":
                    continue
                for candidate in (package_root.joinpath(*parts[1:]).with_suffix(".py"),
                                  package_root.joinpath(*parts[1:], "__init__.py")):
                    if candidate.is_file() and candidate.resolve() not in seen:
                        todo.append(candidate.resolve())
    return sorted(seen)


def template_fingerprint(schedule: Schedule) -> str:
    """sha256 over the sources a kernel depends on: its template module and every module of the
    project it imports (shared template code, the dtype table, the schedule vocabulary), found by
    reading their imports, and this table."""
    module_name, _ = template_path(schedule).split(":")
    here = Path(__file__).resolve().parent
    sources = project_sources(here / (module_name.rsplit(".", 1)[1] + ".py"))
    sources.append(here / "registry.py")
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()
