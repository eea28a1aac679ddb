"""The driver's ``cuLaunchKernelEx`` called through ctypes, for the per-call launch.

A plan's configuration is already a C ``CUlaunchConfig`` inside its cuda-bindings object
(``getPtr()``), so a launch only needs the driver function called with four addresses, held
ready in a `RawLaunch`, instead of cuda-bindings converting its arguments on every call. The
entry point is taken from the loaded driver library (``libcuda``); when it cannot be opened, or
``CUTEGEN_LAUNCHER=cuda-bindings`` is set, `entry_points` is None and the caller launches through
cuda-bindings instead. ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1`` selects the per-thread
default-stream variant, as it does for cuda-bindings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any, NamedTuple

LAUNCHERS = ("ctypes", "cuda-bindings")
LAUNCHER_ENV = "CUTEGEN_LAUNCHER"


class DriverEntryPoints(NamedTuple):
    launch_kernel_ex: Any  # CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**)


_entry_points: DriverEntryPoints | None = None
_loaded = False
_lock = threading.Lock()


def chosen_launcher() -> str:
    """The launcher ``CUTEGEN_LAUNCHER`` asks for (default ``ctypes``); ValueError for other names."""
    name = os.environ.get(LAUNCHER_ENV, "ctypes").strip() or "ctypes"
    if name not in LAUNCHERS:
        raise ValueError(f"{LAUNCHER_ENV}={name!r}: must be one of {', '.join(LAUNCHERS)}")
    return name


def _open_driver() -> ctypes.CDLL | None:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda"), "nvcuda.dll"):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _load() -> DriverEntryPoints | None:
    if chosen_launcher() != "ctypes":
        return None
    lib = _open_driver()
    if lib is None:
        return None
    per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    try:
        launch = getattr(lib, "cuLaunchKernelEx_ptsz" if per_thread else "cuLaunchKernelEx")
    except AttributeError:  # a driver older than CUDA 12.0
        return None
    launch.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    launch.restype = ctypes.c_int
    return DriverEntryPoints(launch)


def entry_points() -> DriverEntryPoints | None:
    """The driver's launch entry points through ctypes, or None where cuda-bindings launches."""
    global _entry_points, _loaded
    if not _loaded:
        with _lock:
            if not _loaded:
                _entry_points = _load()
                _loaded = True
    return _entry_points


class RawLaunch:
    """One plan's launch through ctypes: the driver function and the addresses of the plan's C
    configuration, function and parameter array. Called as ``launch_kernel_ex(config, function,
    params, None)``, which returns the driver's ``CUresult`` (0 on success). The addresses are
    held as ``c_void_p`` objects, which ctypes passes without converting (about 0.6 µs a launch
    less than Python ints)."""

    __slots__ = ("launch_kernel_ex", "config", "function", "params")

    def __init__(self, points: DriverEntryPoints, config: Any, function: Any, params: int) -> None:
        self.launch_kernel_ex = points.launch_kernel_ex
        self.config = ctypes.c_void_p(int(config.getPtr()))
        self.function = ctypes.c_void_p(int(function))
        self.params = ctypes.c_void_p(params) if params else None


__all__ = ["LAUNCHERS", "LAUNCHER_ENV", "DriverEntryPoints", "RawLaunch", "chosen_launcher", "entry_points"]
