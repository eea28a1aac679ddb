"""Schedule vocabulary and schedule files (no CuTe DSL, no other project imports)."""

from .loader import (
    MAX_POINTS,
    Expanded,
    ScheduleFileError,
    all_expanded,
    default_schedule_files,
    default_schedules,
    expand_family,
    load_schedule_file,
    resolve_auto_stages,
)
from .naming import is_kernel_name, parse_name, procedural_name
from .predicates import (
    PREDICATES,
    Predicate,
    PredicateResult,
    ScheduleError,
    Violation,
    check,
    is_valid,
    predicate_results,
    violations,
)
from .spec import Arch, DType, Epilogue, Layout, Multicast, Op, Raster, ScaleFormat, Schedule

__all__ = [
    "MAX_POINTS",
    "Arch",
    "DType",
    "Epilogue",
    "Expanded",
    "Layout",
    "Multicast",
    "Op",
    "PREDICATES",
    "Predicate",
    "PredicateResult",
    "Raster",
    "ScaleFormat",
    "Schedule",
    "ScheduleError",
    "ScheduleFileError",
    "Violation",
    "all_expanded",
    "check",
    "default_schedule_files",
    "default_schedules",
    "expand_family",
    "is_kernel_name",
    "is_valid",
    "load_schedule_file",
    "parse_name",
    "predicate_results",
    "procedural_name",
    "resolve_auto_stages",
    "violations",
]
