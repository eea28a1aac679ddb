"""CPU tier: outputs that share memory (with themselves or with another argument) and extents past int32 are refused, on the checked path and on the remembered one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import call_cache, checks  # noqa: E402
from cutegen.runtime import launch as launch_module  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402
from cutegen.runtime.launch import PreparedLaunch  # noqa: E402
from cutegen.runtime.params import byte_span, overlaps_itself  # noqa: E402


def test_layouts_that_overlap_themselves():
    assert not overlaps_itself((4, 8), (8, 1)) and not overlaps_itself((4, 8), (16, 1))
    assert overlaps_itself((4, 8), (7, 1))  # a row stride under the width
    assert overlaps_itself((4, 8), (0, 1)) and not overlaps_itself((1, 8), (0, 1))  # broadcast rows, unless one
    assert not overlaps_itself((5, 3), (1, 8))  # MN-major scales with padded columns
    assert overlaps_itself((5, 3), (1, 4))
    assert byte_span((4, 8), (16, 1), 16) == (1 + 3 * 16 + 7) * 2 and byte_span((0, 8), (8, 1), 16) == 0
    assert byte_span((2, 128), (128, 1), 4) == 128  # FP4: half a byte each


def test_output_checks_name_the_arguments():
    buf = torch.empty(64, 64)
    with pytest.raises(InputError, match="op: argument 'out' must not overlap itself: its strides \\[32, 1\\]"):
        checks.check_not_overlapping_itself("op", "out", buf.as_strided((4, 64), (32, 1)))
    a = buf[:16]
    checks.check_disjoint("op", {"out": buf[16:32]}, {"a": a, "b": buf[48:]})
    with pytest.raises(InputError, match="op: argument 'out' must not share memory with argument 'a'"):
        checks.check_disjoint("op", {"out": buf[8:24]}, {"a": a})
    with pytest.raises(InputError, match="argument 'out_scales' must not share memory with argument 'out'"):
        checks.check_disjoint("op", {"out": buf[32:40], "out_scales": buf[39:41]}, {"x": a})
    # a span given beside the tensor: what the kernel writes past the tensor's own elements
    with pytest.raises(InputError, match="'out_scales' must not share memory with argument 'x'"):
        checks.check_disjoint("op", {"out_scales": (buf[15:16, 0], 4 * 64 * 4)}, {"x": buf[16:17]})
    huge = torch.empty((1 << 31, 16), device="meta")
    with pytest.raises(InputError, match="op: argument 'a' has 2147483648 elements along mode 0"):
        checks.check_extents("op", "a", huge)


def test_a_remembered_call_refuses_an_output_over_an_input(monkeypatch):
    monkeypatch.setattr(launch_module, "issue_through_bindings", lambda kernel, prepared: None)
    monkeypatch.setattr(launch_module, "_PATCHABLE", True)
    cache = call_cache.CallCache("test_op")
    buf = torch.empty(64, 64)
    a, out = buf[:16], buf[16:32]
    key = cache.key((a, out))
    plan = PreparedLaunch(grid=(1, 1, 1), skip=False, operand_order=("a", "d"),
                          current=[a.data_ptr(), out.data_ptr()], stream=0)
    cache.remember(key, call_cache.Launched(object(), plan, ("a", "d"), outputs={"d": "out"}), (a, out))
    call = cache.get(key)
    assert call.disjoint == ((1, 0),) and call.labels == ("a", "out")
    assert call.relaunch((buf[32:48], buf[48:64]), 0)  # new addresses, still apart
    with pytest.raises(InputError, match="test_op: argument 'out' must not share memory with argument 'a'"):
        call.relaunch((buf[0:16], buf[8:24]), 0)
