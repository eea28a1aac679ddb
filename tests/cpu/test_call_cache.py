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
    key = cache.key((x, None), "kernel")
    assert cache.key((x.clone(), None), "kernel") == key  # another address, the same layout
    for other in ((x.t(), None), (x[:, :4], None), (x.double(), None), (x, x)):
        assert cache.key(other, "kernel") != key
    assert cache.key((x, None), "another kernel") != key
    sm_budget.set_num_sms(8)
    try:
        assert cache.key((x, None), "kernel") != key  # the budget changes the grid and the choice
    finally:
        sm_budget.set_num_sms(None)


def test_remember_only_complete_launched_plans_and_forget_all():
    cache = call_cache.CallCache("test_op")
    key = cache.key((torch.zeros(2),))
    prepared = PreparedLaunch(grid=(1, 1, 1), skip=False, addresses={"a": 16, "d": 32})
    cache.remember(key, object(), PreparedLaunch(grid=(0, 0, 0), skip=True), ("a", "d"))
    cache.remember(key, object(), None, ("a", "d"))
    cache.remember(key, object(), prepared, ("a",))  # an operand the call does not bind: not remembered
    assert key not in cache
    cache.remember(key, object(), prepared, ("a", "d"))
    assert key in cache
    call_cache.forget_all()
    assert key not in cache
