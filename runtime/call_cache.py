"""Checked calls remembered: a call whose tensors have the layout of an earlier, checked call relaunches its plan.

An op checks its inputs, chooses its kernel and prepares the launch once per distinct call
layout: the tensors' shapes, strides, dtypes and devices, the op's other arguments, the SM budget
and the calling thread. A later call with that layout has passed the same checks, so it only
reads the tensors' addresses, checks their alignment and that the outputs the caller gave share
no memory with another tensor of the call (`overlap`), and relaunches (`launch.relaunch`); a
launch being captured into a CUDA graph records those parameters like any other. Scratch that a
launch needs beside the call's tensors (a per-stream tile counter or workspace) is remembered
with the call (``fixed``), which then relaunches only on the stream it was remembered on and
never while a graph is being captured, where each launch gets scratch of its own.
`forget_all` (called by `kernel_choice.set_build_dir`) drops every entry.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Sequence

from . import sm_budget
from .errors import shared_memory_error
from .launch import PreparedLaunch, relaunch
from .params import byte_span

CALLS_PER_OP = 1024
MAX_TENSORS = 10

_caches: list["CallCache"] = []
_get_ident = threading.get_ident
_budget = sm_budget.budget


def _unrolled_layout(arity: int) -> Callable[..., tuple]:
    """``layout(t0, …)``: each tensor's shape, strides, dtype and device ordinal, in one flat tuple.

    Written out per arity, because a loop over the tensors costs about 1 µs more per call, a
    tenth of a small GEMM's whole host time."""
    args = ", ".join(f"t{i}" for i in range(arity))
    body = " ".join(f"t{i}.shape, t{i}.stride(), t{i}.dtype, t{i}.get_device()," for i in range(arity))
    namespace: dict[str, Any] = {}
    exec(f"def layout({args}):\n    return ({body})\n", namespace)  # noqa: S102 - built from integers only
    return namespace["layout"]


_LAYOUTS = [None, *(_unrolled_layout(n) for n in range(1, MAX_TENSORS + 1))]


class Launched(NamedTuple):
    """What a checked call launched, for `CallCache.remember`."""

    kernel: Any  # LoadedKernel
    prepared: PreparedLaunch
    names: Sequence[str]  # the kernel operand each of the call's tensors binds, in order
    extra: Any = None  # what the op derived from the layout during its checks, kept for the relaunch
    fixed: dict[str, Any] | None = None  # scratch the launch bound beside the call's tensors, by operand
    # The caller's outputs among ``names``, each with the argument name its errors give ("d": "out").
    outputs: dict[str, str] | None = None


class RememberedCall:
    """A checked call's kernel and plan: the call's tensor ``positions[j]`` holds the address of
    the plan's operand j (``operand_order``), counting the call's tensors and then ``fixed``;
    ``disjoint`` lists the (output, other) pairs of plan operands that must share no memory, with
    each operand's extent in bytes in ``spans`` and its argument name in ``labels``."""

    __slots__ = ("op", "kernel", "prepared", "positions", "fixed", "stream", "extra", "disjoint", "spans", "labels")

    def __init__(
        self, op: str, kernel: Any, prepared: PreparedLaunch, positions: tuple[int, ...], fixed: tuple,
        stream: int | None, extra: Any, disjoint: tuple[tuple[int, int], ...] = (), spans: tuple[int, ...] = (),
        labels: tuple[str, ...] = (),
    ) -> None:
        self.op = op
        self.kernel = kernel
        self.prepared = prepared
        self.positions = positions
        self.fixed = fixed  # scratch tensors the plan keeps using (kept alive here)
        self.stream = stream  # the stream the scratch belongs to
        self.extra = extra  # what the op derived from the layout during its checks
        self.disjoint = disjoint
        self.spans = spans
        self.labels = labels  # the argument name of each plan operand, for errors

    def launch(self, tensors: Sequence[Any], stream: int) -> bool:
        """Relaunch on ``tensors`` (in the order the call was remembered with); False if the plan
        cannot be retargeted; InputError when an output shares memory with another tensor."""
        if self.fixed:
            tensors = (*tensors, *self.fixed)
        pointers = [tensors[i].data_ptr() for i in self.positions]  # in the plan's operand order
        if self.disjoint:
            spans = self.spans
            for out, other in self.disjoint:  # pairs of plan positions
                if pointers[out] < pointers[other] + spans[other] and pointers[other] < pointers[out] + spans[out]:
                    raise shared_memory_error(self.op, self.labels[out], self.labels[other], pointers[out],
                                              spans[out], pointers[other], spans[other])
        return relaunch(self.kernel, self.prepared, pointers, stream)


class CallCache:
    """One op's remembered calls. ``capturing`` tells whether the calling stream is capturing a
    CUDA graph (calls with scratch are then not relaunched: a captured launch needs its own)."""

    def __init__(self, op: str, capturing: Callable[[], bool] = lambda: False) -> None:
        self.op = op
        self._calls: dict[tuple, RememberedCall] = {}
        self._capturing = capturing
        _caches.append(self)

    def get(self, key: tuple | None) -> RememberedCall | None:
        return self._calls.get(key) if key is not None else None

    @staticmethod
    def key(tensors: Sequence[Any], *extra: Any) -> tuple | None:
        """The call layout of ``tensors`` and the op's other arguments ``extra`` (optional tensors
        left out of ``tensors``, their presence stated in ``extra``); None when an argument is not
        a tensor, which the op's checks then refuse by name."""
        try:
            layout = _LAYOUTS[len(tensors)](*tensors)
        except (AttributeError, TypeError):
            return None
        return (layout, extra, _budget(), _get_ident())

    def launch(self, call: RememberedCall | None, tensors: Sequence[Any], stream: int) -> bool:
        """Relaunch ``call`` (from `get`) on ``tensors``; False, launching nothing, when there is
        none, when it has scratch and ``stream`` is not the scratch's or is capturing a graph, or
        when its plan cannot be retargeted."""
        if call is None or (call.fixed and (stream != call.stream or self._capturing())):
            return False
        return call.launch(tensors, stream)

    def remember(self, key: tuple | None, launched: Launched | None, tensors: Sequence[Any] = ()) -> None:
        """Remember a checked call's launch (None: nothing to remember). Its tensors bind the
        kernel operands ``launched.names`` in order; a view at offset 0 of a call's tensor may
        stand for it, since only addresses are read. When the caller gave outputs
        (``launched.outputs``), ``tensors`` are the call's tensors as the kernel reads and writes
        them, in that order: their extents are what a relaunch checks for overlap."""
        if key is None or launched is None or launched.prepared is None or launched.prepared.skip:
            return
        if launched.fixed and self._capturing():  # scratch allocated for this capture alone
            return
        fixed = launched.fixed or {}
        bound = [*launched.names, *fixed]
        prepared = launched.prepared
        if set(bound) != set(prepared.operand_order):
            return
        if len(self._calls) >= CALLS_PER_OP:
            self._calls.clear()
        positions = tuple(bound.index(operand) for operand in prepared.operand_order)
        outputs = launched.outputs or {}
        disjoint: tuple[tuple[int, int], ...] = ()
        spans: tuple[int, ...] = ()
        labels: tuple[str, ...] = ()
        if outputs:
            # Kept by plan position (`positions`): the call's tensor i is at plan position slot[i].
            names = list(launched.names)
            slot = {position: j for j, position in enumerate(positions)}
            call_spans = [byte_span(t.shape, t.stride(), 8 * t.element_size()) for t in tensors]
            spans = tuple(call_spans[i] if i < len(names) else 0 for i in positions)
            labels = tuple(outputs.get(bound[i], bound[i]) for i in positions)
            written = [names.index(name) for name in outputs]
            disjoint = tuple((slot[out], slot[other]) for out in written for other in range(len(names))
                             if other != out and not (other in written and other < out)
                             and call_spans[out] and call_spans[other])
        self._calls[key] = RememberedCall(
            self.op, launched.kernel, prepared, positions, tuple(fixed.values()), prepared.stream, launched.extra,
            disjoint, spans, labels,
        )

    def __contains__(self, key: tuple | None) -> bool:
        return key in self._calls

    def clear(self) -> None:
        self._calls.clear()


def forget_all() -> None:
    for cache in _caches:
        cache.clear()


__all__ = ["CallCache", "Launched", "MAX_TENSORS", "RememberedCall", "forget_all"]
