"""The SM budget of every launch: `set_num_sms` caps the multiprocessors a persistent grid uses.

Communication kernels that run beside a GEMM (expert-parallel all-to-all, NCCL) need SMs of their
own; with a budget of n SMs, every kernel's persistent grid holds at most n // cluster_size
clusters, and the heuristic scores its candidates for n SMs. One budget for the process, as in
DeepGEMM (`set_num_sms(None)` lifts it). The budget is part of every launch-cache and
kernel-choice key, so a change takes effect on the next call.
"""

from __future__ import annotations

from .errors import InputError

_budget: int | None = None


def set_num_sms(num_sms: int | None) -> None:
    """Use at most ``num_sms`` SMs per launch from now on (None: all of the GPU's)."""
    global _budget
    if num_sms is None:
        _budget = None
        return
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise InputError(f"set_num_sms: argument 'num_sms' must be a positive int or None, got {num_sms!r}")
    _budget = int(num_sms)


def budget() -> int | None:
    """The SM cap set by `set_num_sms`, or None when every SM may be used."""
    return _budget


def usable_sms(device_sms: int) -> int:
    """The SMs a launch on a GPU of ``device_sms`` multiprocessors may use."""
    return device_sms if _budget is None else min(device_sms, _budget)


def usable_clusters(max_active_clusters: int, cluster_size: int) -> int:
    """The most clusters a persistent grid may hold: the occupancy limit, within the budget."""
    if _budget is None:
        return max_active_clusters
    return max(1, min(max_active_clusters, _budget // max(1, cluster_size)))


__all__ = ["budget", "set_num_sms", "usable_clusters", "usable_sms"]
