"""CPU tier: the SM budget and the remembered-call keys (what makes a later call skip its checks)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cutegen.runtime import call_cache, sm_budget  # noqa: E402
from cutegen.runtime.errors import InputError  # noqa: E402
from cutegen.runtime.launch import PreparedLaunch  # noqa: E402


def test_sm_budget_caps_sms_and_clusters():
    try:
        assert sm_budget.usable_sms(132) == 132 and sm_budget.usable_clusters(66, 2) == 66
        sm_budget.set_num_sms(33)
        assert sm_budget.budget() == 33
        assert sm_budget.usable_sms(132) == 33
        assert sm_budget.usable_clusters(66, 2) == 16  # 33 SMs hold 16 clusters of 2
        assert sm_budget.usable_clusters(66, 4) == 8
        assert sm_budget.usable_clusters(66, 64) == 1
        with pytest.raises(InputError, match="'num_sms'"):
            sm_budget.set_num_sms(0)
    finally:
        sm_budget.set_num_sms(None)
    assert sm_budget.budget() is None


def test_call_layout_keys():
    cache = call_cache.CallCache("test_op")
    x = torch.zeros(4, 8)
    key = cache.key((x,), "kernel")
    assert cache.key((x.clone(),), "kernel") == key  # another address, the same layout
    for other in ((x.t(),), (x[:, :4],), (x.double(),), (x, x)):
        assert cache.key(other, "kernel") != key
    assert cache.key((x,), "another kernel") != key
    sm_budget.set_num_sms(8)
    try:
        assert cache.key((x,), "kernel") != key  # the budget changes the grid and the choice
    finally:
        sm_budget.set_num_sms(None)
    # Anything but a tensor has no layout: no key, so the op's checks run and name the argument.
    assert cache.key((x, None), "kernel") is None and cache.key(([1, 2],), "kernel") is None
    assert cache.get(None) is None


def test_layout_key_covers_every_arity():
    cache = call_cache.CallCache("test_op")
    tensors = [torch.zeros(2, i + 1) for i in range(call_cache.MAX_TENSORS)]
    for n in range(1, call_cache.MAX_TENSORS + 1):
        layout = cache.key(tensors[:n])[0]
        assert layout == tuple(x for t in tensors[:n] for x in (t.shape, t.stride(), t.dtype, t.get_device()))


def _plan(order=("a", "d"), stream=7):
    return PreparedLaunch(grid=(1, 1, 1), skip=False, operand_order=order, current=[16] * len(order), stream=stream)


def test_remember_only_complete_launched_plans_and_forget_all():
    cache = call_cache.CallCache("test_op")
    key = cache.key((torch.zeros(2),))
    prepared = _plan()
    cache.remember(key, call_cache.Launched(object(), PreparedLaunch(grid=(0, 0, 0), skip=True), ("a", "d")))
    cache.remember(key, None)
    cache.remember(None, call_cache.Launched(object(), prepared, ("a", "d")))
    cache.remember(key, call_cache.Launched(object(), prepared, ("a",)))  # an operand the call does not bind
    assert key not in cache
    cache.remember(key, call_cache.Launched(object(), prepared, ("d", "a")))
    assert key in cache
    assert cache.get(key).positions == (1, 0)  # the plan's operand order, found in the call's
    call_cache.forget_all()
    assert key not in cache


def test_calls_with_scratch_relaunch_only_on_their_stream_and_never_while_capturing():
    capturing = [False]
    cache = call_cache.CallCache("test_op", lambda: capturing[0])
    key = cache.key((torch.zeros(2),))
    scratch = torch.zeros(1)
    cache.remember(key, call_cache.Launched(object(), _plan(("a", "d", "w")), ("a", "d"), fixed={"w": scratch}))
    call = cache.get(key)
    assert call.positions == (0, 1, 2) and call.fixed == (scratch,) and call.stream == 7
    tensors = (torch.zeros(2), torch.zeros(2))
    assert not cache.launch(call, tensors, 8)  # another stream: its own scratch, through the checked path
    capturing[0] = True
    assert not cache.launch(call, tensors, 7)
    other = cache.key((torch.zeros(3),))
    cache.remember(other, call_cache.Launched(object(), _plan(("a", "d", "w")), ("a", "d"), fixed={"w": scratch}))
    assert other not in cache  # scratch allocated for a capture is that capture's alone
