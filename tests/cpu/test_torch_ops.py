"""CPU tier: ops defined by `torch_ops.TorchOp` (the schema from the implementation's signature, defaults, the eager fast path)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import torch_ops  # noqa: E402


def _scaled_impl(x: torch.Tensor, scale: float = 2.0, tag: str = "") -> torch.Tensor:
    return x * scale


def _scaled_fake(x, scale=2.0, tag=""):
    return torch.empty_like(x)


def _fill_impl(x: torch.Tensor, out: torch.Tensor, value: int = 7) -> None:
    out.fill_(value)


def _fill_fake(x, out, value=7) -> None:
    return None


SCALED = torch_ops.TorchOp("test_only_scaled", _scaled_impl, _scaled_fake)
FILL = torch_ops.TorchOp("test_only_fill", _fill_impl, _fill_fake, mutates=("out",))


def test_schema_comes_from_the_implementation():
    assert SCALED.schema == '(Tensor x, float scale=2.0, str tag="") -> Tensor'
    assert FILL.schema.startswith("(Tensor x, Tensor(") and "!) out, SymInt value=7) -> ()" in FILL.schema


def test_defaults_left_out_by_the_dispatcher_reach_the_implementation():
    x = torch.arange(4.0)
    # The dispatcher drops trailing arguments equal to their defaults before calling the kernel.
    assert torch.equal(torch.ops.cutegen.test_only_scaled(x), x * 2)
    assert torch.equal(torch.ops.cutegen.test_only_scaled(x, 3.0), x * 3)
    out = torch.zeros(3)
    torch.ops.cutegen.test_only_fill(x, out)
    assert torch.equal(out, torch.full((3,), 7.0))
    assert torch.equal(SCALED(x), x * 2) and torch.equal(SCALED(x, 0.5, "t"), x * 0.5)


def test_fake_runs_with_defaults_left_out():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5)
        assert torch.ops.cutegen.test_only_scaled(x).shape == (5,)


def test_fake_must_take_the_implementation_s_parameters():
    with pytest.raises(TypeError, match="the fake's parameters must be the implementation's"):
        torch_ops.TorchOp("test_only_bad_fake", _scaled_impl, lambda x, scale=1.0, tag="": x)


def test_plain_eager_is_false_under_autograd_and_modes():
    x = torch.ones(2)
    assert torch_ops.plain_eager((x, "name", 0))
    assert torch_ops.plain_eager((torch.nn.Parameter(x),)) is False  # requires grad, grad mode on
    with torch.no_grad():
        assert torch_ops.plain_eager((torch.nn.Parameter(x),))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not torch_ops.plain_eager((x,))


def _optional_impl(x: torch.Tensor, c: torch.Tensor | None = None, out: torch.Tensor | None = None, k: int = 0) -> None:
    return None


def _optional_fake(x, c=None, out=None, k=0) -> None:
    return None


OPTIONAL = torch_ops.TorchOp("test_only_optional", _optional_impl, _optional_fake)


class _Subclass(torch.Tensor):
    pass


def test_each_op_s_written_out_eager_test_agrees_with_plain_eager():
    x = torch.ones(2)
    tensors = [x, torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True), x.as_subclass(_Subclass)]
    cases = [(SCALED, (t,)) for t in tensors] + [(SCALED, (t, 0.5, "tag")) for t in tensors]
    cases += [(FILL, (t, u)) for t in tensors for u in tensors] + [(FILL, (t, u, 3)) for t in tensors for u in tensors]
    cases += [(OPTIONAL, (t, c, u, 1)[:given]) for t in tensors for c in [None, *tensors] for u in [None, *tensors]
              for given in (1, 2, 3, 4)]
    for op, args in cases:
        for grad_mode in (True, False):
            with torch.set_grad_enabled(grad_mode):
                assert op.eager(*args) == torch_ops.plain_eager(args), (op, args, grad_mode)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not OPTIONAL.eager(x) and not FILL.eager(x, x)


def test_each_op_s_call_gives_the_implementation_s_result_and_goes_through_the_dispatcher_under_a_mode():
    """`TorchOp.call` (what the ops' entry points call) returns what the implementation returns for
    plain tensors, parameters and tensor subclasses, with grad on and off; under a dispatch mode
    (where the written-out eager test fails) the call goes through the dispatcher, which the mode
    sees."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.arange(3.0)
    for t in (x, torch.nn.Parameter(x.clone()), x.as_subclass(_Subclass)):
        for grad_mode in (True, False):
            with torch.set_grad_enabled(grad_mode):
                assert torch.equal(SCALED.call(t, 3.0).detach().as_subclass(torch.Tensor), x * 3)
                seen.clear()
                with Record():
                    assert not SCALED.eager(t, 3.0)
                    assert torch.equal(SCALED.call(t, 3.0).detach().as_subclass(torch.Tensor), x * 3)
                assert any("test_only_scaled" in f for f in seen), (t, grad_mode)
    out = torch.zeros(3)
    FILL.call(x, out, 4)
    assert torch.equal(out, torch.full((3,), 4.0)) and OPTIONAL.call(x) is None


def test_torch_compile_traces_each_op_to_its_own_overload():
    """torch.compile traces a `TorchOp` call (the dispatcher's path while compiling) through its
    written-out eager test: each op's objects stay its own, never globals of a module that lacks
    them."""
    x = torch.arange(4.0)
    out = torch.zeros(3)

    def both(x, out):
        FILL(x, out, 5)
        return SCALED(x, 3.0), OPTIONAL(x, None, out)

    scaled, none = torch.compile(both, backend="eager", fullgraph=True)(x, out)
    assert torch.equal(scaled, x * 3) and none is None and torch.equal(out, torch.full((3,), 5.0))
