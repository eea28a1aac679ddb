"""Checked calls remembered: a call whose tensors have the layout of an earlier, checked call relaunches its plan.

An op checks its inputs, chooses its kernel and prepares the launch once per distinct call
layout: the tensors' shapes, strides, dtypes and devices, the op's other arguments, the SM budget
and the calling thread. A later call with that layout has passed the same checks, so it only
reads the tensors' addresses, checks their alignment and relaunches (`launch.relaunch`); a
launch being captured into a CUDA graph records those parameters like any other. What depends on
more than the layout (a split-K launch's per-stream workspace) is never remembered, and
`forget_all` (called by `ops.set_build_dir`) drops every entry.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Sequence

from . import sm_budget
from .launch import PreparedLaunch, relaunch

CALLS_PER_OP = 1024

_caches: list["CallCache"] = []


class RememberedCall(NamedTuple):
    kernel: Any  # LoadedKernel
    prepared: PreparedLaunch
    names: tuple[str, ...]  # the kernel operand each tensor of the call binds
    extra: Any = None  # what the op derived from the layout during its checks, kept for the relaunch


class CallCache:
    """One op's remembered calls."""

    def __init__(self, op: str) -> None:
        self.op = op
        self._calls: dict[tuple, RememberedCall] = {}
        _caches.append(self)

    @staticmethod
    def key(tensors: Sequence[Any], *extra: Any) -> tuple:
        """The call layout of ``tensors`` (None allowed) and the op's other arguments ``extra``."""
        layout = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        return (layout, extra, sm_budget.budget(), threading.get_ident())

    def __contains__(self, key: tuple) -> bool:
        return key in self._calls

    def get(self, key: tuple) -> RememberedCall | None:
        return self._calls.get(key)

    def launch(self, key: tuple, tensors: Sequence[Any], stream: int) -> bool:
        """Relaunch the call remembered under ``key`` on ``tensors``; False if there is none."""
        call = self._calls.get(key)
        if call is None:
            return False
        addresses = {name: t.data_ptr() for name, t in zip(call.names, tensors)}
        return relaunch(call.kernel, call.prepared, addresses, stream)

    def remember(
        self, key: tuple, kernel: Any, prepared: PreparedLaunch | None, names: Sequence[str], extra: Any = None
    ) -> None:
        if prepared is None or prepared.skip or set(names) != set(prepared.addresses):
            return
        if len(self._calls) >= CALLS_PER_OP:
            self._calls.clear()
        self._calls[key] = RememberedCall(kernel, prepared, tuple(names), extra)

    def clear(self) -> None:
        self._calls.clear()


def forget_all() -> None:
    for cache in _caches:
        cache.clear()


__all__ = ["CallCache", "RememberedCall", "forget_all"]
