"""The runtime's exceptions, one class per kind of failure a caller may want to tell apart.

Every message names the offending thing (argument, file, kernel, driver call), what was expected
and what was given. Nothing here imports anything beyond the standard library.
"""

from __future__ import annotations


class CutegenError(Exception):
    """Base class of every error the cutegen runtime raises on purpose."""


class NoGpuError(CutegenError, RuntimeError):
    """No CUDA driver or no CUDA device is available."""


class ArchMismatchError(CutegenError, RuntimeError):
    """A kernel was built for another GPU architecture than the one it would run on."""


class ArtifactError(CutegenError, RuntimeError):
    """A build artifact is missing or corrupt: catalogue, manifest or cubin (sha256 mismatch)."""


class KernelLoadError(CutegenError, RuntimeError):
    """A cubin could not be loaded, or the loaded entry disagrees with its manifest."""


class InputError(CutegenError, ValueError):
    """Bad inputs to an entry point: wrong dtype, device, rank, shape, strides or alignment."""


class CudaError(CutegenError, RuntimeError):
    """A CUDA driver call failed."""

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        msg = f"{call} failed with {name} ({code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


def shared_memory_error(
    op: str, arg: str, other: str, start: int, span: int, other_start: int, other_span: int
) -> InputError:
    """The error of an output ``arg`` whose bytes [start, start + span) meet another argument's."""
    return InputError(
        f"{op}: argument '{arg}' must not share memory with argument '{other}' (bytes "
        f"0x{start:x}-0x{start + span:x} and 0x{other_start:x}-0x{other_start + other_span:x} overlap)"
    )


__all__ = [
    "ArchMismatchError",
    "ArtifactError",
    "CudaError",
    "CutegenError",
    "InputError",
    "KernelLoadError",
    "NoGpuError",
    "shared_memory_error",
]
