"""DeepGEMM's runtime switches over cutegen's runtime: the SM budget, PDL, tensor-core utilisation, compile modes.

* `set_num_sms` / `get_num_sms`: a real cap on every persistent grid and on the heuristic's wave
  model (`cutegen.runtime.sm_budget`); `get_num_sms` is the GPU's SM count while none is set.
* `set_pdl` / `get_pdl`: the flag is kept and read back; cutegen's kernels are built without
  programmatic-dependent-launch waits, so they are always launched without PDL (DeepGEMM treats
  PDL as an optimisation, never as a requirement, so results do not depend on it).
* `set_tc_util` / `get_tc_util`: kept and read back; cutegen's heuristic does not use it.
* `set_ignore_compile_dims`, `set_block_size_multiple_of`, `set_compile_mode` / `get_compile_mode`:
  accepted; there is nothing to compile.
"""

from __future__ import annotations

import torch

from cutegen.runtime import driver, sm_budget

_state = {"pdl": False, "tc_util": 100, "compile_mode": 0}


def set_num_sms(new_num_sms: int) -> None:
    """Use at most ``new_num_sms`` SMs per launch (1 to the GPU's count)."""
    device_sms = driver.device_info(torch.cuda.current_device()).sm_count
    if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or not 1 <= new_num_sms <= device_sms:
        raise ValueError(f"deep_gemm.set_num_sms: argument 'new_num_sms' must be an int in [1, {device_sms}], got {new_num_sms!r}")
    sm_budget.set_num_sms(None if new_num_sms == device_sms else new_num_sms)


def get_num_sms() -> int:
    """The SMs a launch may use: the budget set, else the current GPU's SM count."""
    device_sms = driver.device_info(torch.cuda.current_device()).sm_count
    return sm_budget.usable_sms(device_sms)


def set_pdl(new_enable_pdl: bool) -> None:
    _state["pdl"] = bool(new_enable_pdl)


def get_pdl() -> bool:
    return _state["pdl"]


def set_tc_util(new_tc_util: int) -> None:
    if isinstance(new_tc_util, bool) or not isinstance(new_tc_util, int) or not 1 <= new_tc_util <= 100:
        raise ValueError(f"deep_gemm.set_tc_util: argument 'new_tc_util' must be an int in [1, 100], got {new_tc_util!r}")
    _state["tc_util"] = new_tc_util


def get_tc_util() -> int:
    return _state["tc_util"]


def set_ignore_compile_dims(new_value: bool) -> None:
    """Accepted: cutegen's kernels are compiled ahead of time for dynamic shapes."""


def set_block_size_multiple_of(new_value) -> None:
    """Accepted: cutegen's tile sizes are its schedules'."""


def set_compile_mode(new_value: int) -> None:
    _state["compile_mode"] = int(new_value)


def get_compile_mode() -> int:
    return _state["compile_mode"]


__all__ = [
    "get_compile_mode", "get_num_sms", "get_pdl", "get_tc_util",
    "set_block_size_multiple_of", "set_compile_mode", "set_ignore_compile_dims", "set_num_sms", "set_pdl", "set_tc_util",
]
