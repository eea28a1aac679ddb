"""Checked calls remembered: a call whose tensors have the layout of an earlier, checked call relaunches its plan.

An op checks its inputs, chooses its kernel and prepares the launch once per distinct call
layout: the tensors' shapes, strides, dtypes and devices, the op's other arguments, the SM budget
and the calling thread. A later call with that layout has passed the same checks, so it only
reads the tensors' addresses, checks their alignment and that the outputs the caller gave share
no memory with another tensor of the call, and relaunches (`RememberedCall.launch`, written out
per call by `_straight_relaunch`); a
launch being captured into a CUDA graph records those parameters like any other. Scratch that a
launch needs beside the call's tensors (a per-stream tile counter or workspace) is remembered
with the call (``fixed``), which then relaunches only on the stream it was remembered on and
never while a graph is being captured, where each launch gets scratch of its own.
`forget_all` (called by `kernel_choice.set_build_dir`) drops every entry.

`CallCache.find` looks a call up without building its layout key where it can: a layout seen
before has a guard, torch's C++ check of a tensor's type, dtype, device, shape, strides,
requires_grad and dispatch keys (the one compiled code runs before each call), found by the shapes
of the call's first and last tensors and its other arguments; a call the guards do not match falls
back to the key.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, NamedTuple, Sequence

from . import sm_budget
from .errors import shared_memory_error
from .launch import PreparedLaunch, issue_through_bindings, relaunch, tma_address_patchable
from .params import byte_span

CALLS_PER_OP = 1024
MAX_TENSORS = 10
GUARDS_PER_HINT = 4  # layouts told apart by their guards alone: strides, dtypes, devices
# A call of fewer tensors is looked up by its key: one tensor's key costs no more than the hint
# and guard (0.99 against 1.11 µs on an H100's host, NOTES N104).
GUARDED_FROM_TENSORS = 2

_caches: list["CallCache"] = []
_get_ident = threading.get_ident
_budget = sm_budget.budget


def _unrolled_key(arity: int) -> Callable[[Sequence[Any], tuple], tuple]:
    """``key(tensors, extra)``: each tensor's shape, strides, dtype and device ordinal, then the
    op's other arguments ``extra``, the SM budget and the calling thread, in one flat tuple.

    Written out per arity, because a loop over the tensors costs about 1 µs more per call, a
    tenth of a small GEMM's whole host time."""
    names = ", ".join(f"t{i}" for i in range(arity))
    body = " ".join(f"t{i}.shape, t{i}.stride(), t{i}.dtype, t{i}.get_device()," for i in range(arity))
    namespace: dict[str, Any] = {"budget": _budget, "get_ident": _get_ident}
    source = f"def key(tensors, extra):\n    {names}, = tensors\n    return ({body} extra, budget(), get_ident())\n"
    exec(source, namespace)  # noqa: S102 - built from integers only
    return namespace["key"]


_KEYS = [None, *(_unrolled_key(n) for n in range(1, MAX_TENSORS + 1))]


def _guard_maker() -> Callable[[Sequence[Any]], Callable[..., bool]] | None:
    """``guard(tensors)``: a C++ check that tensors passed as its arguments have the layout of
    ``tensors`` (with every size and stride fixed), from torch's guards for compiled code; None
    where this torch lacks them or they do not tell layouts apart as `CallCache.key` does."""
    try:
        import torch
        from torch._C._dynamo.guards import TensorGuards

        def guard(tensors: Sequence[Any]) -> Callable[..., bool]:
            return TensorGuards(
                *tensors,
                dynamic_dims_sizes=[list(t.shape) for t in tensors],
                dynamic_dims_strides=[list(t.stride()) for t in tensors],
            ).check

        x = torch.zeros(4, 8)
        check = guard((x, x[0]))
        same = check(x.clone(), x[1]) and not check(x, x)
        apart = (x.t(), x[0]), (x[:, :4], x[0]), (x.double(), x[0]), (x, x[0].double()), (x, x[0:2, 0])
        if same and not any(check(*tensors) for tensors in apart):
            return guard
    except Exception:  # noqa: BLE001 - any failure of a private torch API means: keys only
        pass
    return None


_guard = _guard_maker()


def _allocator(t: Any) -> Callable[[], Any]:
    """A function returning a new tensor laid out as ``t``, in storage of the size of ``t``'s (a
    view into a larger buffer, as padded scales are, keeps the buffer): written down once, about
    0.5 µs less per call than an op working the layout out again."""
    import torch

    shape, strides, dtype, device, offset = t.shape, t.stride(), t.dtype, t.device, t.storage_offset()
    storage = t.untyped_storage().nbytes()
    if offset == 0 and storage == byte_span(shape, strides, 8 * t.element_size()):
        return functools.partial(torch.empty_strided, shape, strides, dtype=dtype, device=device)
    elements = storage // t.element_size()
    return lambda: torch.empty(elements, dtype=dtype, device=device).as_strided(shape, strides, offset)


def _allocating(outputs: Any) -> Callable[[], Any] | None:
    """What `RememberedCall.new_output` calls for ``outputs`` (a tensor, a tuple of them, or None)."""
    if isinstance(outputs, tuple):
        allocators = tuple(_allocator(t) for t in outputs)
        return lambda: tuple([allocate() for allocate in allocators])
    return None if outputs is None else _allocator(outputs)


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
    """A checked call's kernel and plan. The call's tensor ``positions[j]`` holds the address of
    the plan's operand j (``operand_order``), counting the call's tensors and then ``fixed``;
    ``sites`` are the plan's address sites (`PreparedLaunch.sites`) by call tensor instead;
    ``disjoint`` lists the (output, other) pairs of call tensors that must share no memory, with
    each tensor's extent in bytes in ``spans`` and its argument name in ``labels``."""

    __slots__ = ("op", "kernel", "prepared", "positions", "sites", "fixed", "stream", "capturing", "extra", "disjoint",
                 "spans", "labels", "relaunch", "key", "new_output")

    def __init__(
        self, op: str, kernel: Any, prepared: PreparedLaunch, positions: tuple[int, ...], fixed: tuple,
        stream: int | None, extra: Any, disjoint: tuple[tuple[int, int], ...] = (), spans: tuple[int, ...] = (),
        labels: tuple[str, ...] = (), capturing: Callable[[], bool] = lambda: False, key: tuple | None = None,
        new_output: Callable[[], Any] | None = None,
    ) -> None:
        self.op = op
        self.key = key  # the layout key it is remembered under
        # new_output(): new tensors laid out as the outputs the op allocated for the call (`remember`).
        self.new_output = new_output
        self.kernel = kernel
        self.prepared = prepared
        self.positions = positions
        self.sites = tuple((positions[j], word, need, operand) for j, word, need, operand in prepared.sites)
        self.fixed = fixed  # scratch tensors the plan keeps using (kept alive here)
        self.stream = stream  # the stream the scratch belongs to
        self.extra = extra  # what the op derived from the layout during its checks
        self.disjoint = disjoint
        self.spans = spans
        self.labels = labels  # the argument name of each call tensor, for errors
        self.capturing = capturing  # whether the calling stream is capturing a CUDA graph
        self.relaunch: Callable[[Sequence[Any], int], bool] = _straight_relaunch(self)

    def launch(self, tensors: Sequence[Any], stream: int) -> bool:
        """Relaunch on ``tensors`` (in the order the call was remembered with); False, launching
        nothing, when the call has scratch and ``stream`` is not the scratch's or is capturing a
        graph, or when the plan cannot be retargeted; InputError when an output shares memory with
        another tensor or an address is misaligned. `relaunch` does the same, faster."""
        if self.fixed:
            if stream != self.stream or self.capturing():
                return False
            tensors = (*tensors, *self.fixed)
        pointers = [t.data_ptr() for t in tensors]  # the call's order, read once each
        if self.disjoint:
            spans = self.spans
            for out, other in self.disjoint:
                if pointers[out] < pointers[other] + spans[other] and pointers[other] < pointers[out] + spans[out]:
                    raise shared_memory_error(self.op, self.labels[out], self.labels[other], pointers[out],
                                              spans[out], pointers[other], spans[other])
        return relaunch(self.kernel, self.prepared, self.sites, pointers, stream)


def _straight_relaunch(call: RememberedCall) -> Callable[[Sequence[Any], int], bool]:
    """``call.launch`` written out for this call's tensors, scratch, sites and overlap pairs, with
    the driver's launch called directly: about 1 µs less per call than the loops, a tenth of a
    small GEMM's host time. Anything off the common path (a misaligned address, an overlap, another
    stream, a failed launch) is left to ``call.launch``, which decides it; without the ctypes
    launcher ``call.launch`` is all there is."""
    prepared = call.prepared
    raw = prepared.raw
    if raw is None or not tma_address_patchable():
        return call.launch
    n = len(call.positions) - len(call.fixed)  # the call's own tensors; the scratch follows them
    lines = ["def relaunch(tensors, stream):"]
    if call.fixed:  # as call.launch: scratch belongs to one stream, and a capture needs its own
        lines += ["    if stream != scratch_stream or capturing():", "        return False"]
    lines.append(f"    {', '.join(f't{i}' for i in range(n))}, = tensors")
    lines += [f"    p{i} = t{i}.data_ptr()" for i in range(n)]
    lines += [f"    p{n + j} = {t.data_ptr()}" for j, t in enumerate(call.fixed)]  # kept alive by the call
    spans = call.spans
    tests = [f"p{i} % {need}" for i, _, need, _ in call.sites if i < n]
    tests += [f"(p{o} < p{x} + {spans[x]} and p{x} < p{o} + {spans[o]})" for o, x in call.disjoint]
    tests.append("stream != prepared.stream")
    lines += [f"    if {' or '.join(tests)}:", "        return slow(tensors, stream)", "    prepared.current = None"]
    lines += [f"    words[{word}] = p{i}" for i, word, _, _ in call.sites]
    lines += [
        "    if launch_kernel_ex(config, function, params, None):",
        "        issue_through_bindings(kernel, prepared)",
        "    return True",
    ]
    namespace: dict[str, Any] = {
        "slow": call.launch, "prepared": prepared, "words": prepared.words, "launch_kernel_ex": raw.launch_kernel_ex,
        "config": raw.config, "function": raw.function, "params": raw.params, "kernel": call.kernel,
        "issue_through_bindings": issue_through_bindings, "scratch_stream": call.stream, "capturing": call.capturing,
    }
    exec("\n".join(lines) + "\n", namespace)  # noqa: S102 - built from integers and fixed names only
    return namespace["relaunch"]


class CallCache:
    """One op's remembered calls. ``capturing`` tells whether the calling stream is capturing a
    CUDA graph (calls with scratch are then not relaunched: a captured launch needs its own)."""

    def __init__(self, op: str, capturing: Callable[[], bool] = lambda: False) -> None:
        self.op = op
        self._calls: dict[tuple, RememberedCall] = {}
        self._capturing = capturing
        # The remembered call of a `key` (None for None, which no call is remembered under).
        self.get: Callable[[tuple | None], RememberedCall | None] = self._calls.get
        # By the hint `find` reads first: up to GUARDS_PER_HINT (guard, call) pairs, the newest last.
        self._guarded: dict[tuple, tuple[tuple[Callable[..., bool], RememberedCall], ...]] = {}
        _caches.append(self)

    def find(self, tensors: Sequence[Any], *extra: Any) -> tuple[RememberedCall | None, tuple | None]:
        """``(call, key)``: the call remembered for the layout of ``tensors`` and ``extra`` (None if
        none) and its `key`; a layout of `GUARDED_FROM_TENSORS` or more tensors guarded before is
        found without building the key (1.2 µs less per call for four tensors on an H100's host)."""
        if len(tensors) < GUARDED_FROM_TENSORS:
            key = self.key(tensors, *extra)
            return self._calls.get(key), key
        try:
            hint = (len(tensors), tensors[0].shape, tensors[-1].shape, extra, _budget(), _get_ident())
        except (AttributeError, TypeError):
            return None, None  # not tensors: no key either, and the op's checks name the argument
        guarded = self._guarded.get(hint, ())
        for check, call in guarded:
            if check(*tensors):
                return call, call.key
        key = self.key(tensors, *extra)
        call = self._calls.get(key)
        if call is not None and _guard is not None:
            try:
                self._guarded[hint] = (*guarded[1 - GUARDS_PER_HINT:], (_guard(tensors), call))
            except Exception:  # noqa: BLE001 - a layout torch's guard does not take is found by its key
                pass
        return call, key

    @staticmethod
    def key(tensors: Sequence[Any], *extra: Any) -> tuple | None:
        """The call layout of ``tensors`` and the op's other arguments ``extra`` (optional tensors
        left out of ``tensors``, their presence stated in ``extra``); None when an argument is not
        a tensor, which the op's checks then refuse by name."""
        try:
            return _KEYS[len(tensors)](tensors, extra)
        except (AttributeError, TypeError):
            return None

    def remember(
        self, key: tuple | None, launched: Launched | None, tensors: Sequence[Any] = (), new_output: Any = None
    ) -> None:
        """Remember a checked call's launch (None: nothing to remember). Its tensors bind the
        kernel operands ``launched.names`` in order; a view at offset 0 of a call's tensor may
        stand for it, since only addresses are read. When the caller gave outputs
        (``launched.outputs``), ``tensors`` are the call's tensors as the kernel reads and writes
        them, in that order: their extents are what a relaunch checks for overlap. ``new_output``
        is the output the op allocated for the call, or a tuple of them: the remembered call's
        `RememberedCall.new_output` allocates their like (`_allocator`)."""
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
        self._guarded.clear()  # none may keep a call this one replaces
        positions = tuple(bound.index(operand) for operand in prepared.operand_order)
        outputs = launched.outputs or {}
        disjoint: tuple[tuple[int, int], ...] = ()
        spans: tuple[int, ...] = ()
        labels = tuple(outputs.get(name, name) for name in bound)
        if outputs:
            names = list(launched.names)
            spans = tuple(byte_span(t.shape, t.stride(), 8 * t.element_size()) for t in tensors)
            written = [names.index(name) for name in outputs]
            disjoint = tuple((out, other) for out in written for other in range(len(names))
                             if other != out and not (other in written and other < out) and spans[out] and spans[other])
        self._calls[key] = RememberedCall(
            self.op, launched.kernel, prepared, positions, tuple(fixed.values()), prepared.stream, launched.extra,
            disjoint, spans, labels, self._capturing, key, _allocating(new_output),
        )

    def __contains__(self, key: tuple | None) -> bool:
        return key in self._calls

    def clear(self) -> None:
        self._calls.clear()
        self._guarded.clear()


def forget_all() -> None:
    for cache in _caches:
        cache.clear()


__all__ = ["CallCache", "Launched", "MAX_TENSORS", "RememberedCall", "forget_all"]
