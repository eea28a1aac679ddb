"""CPU tier: the SM budget and the remembered-call keys (what makes a later call skip its checks)."""

from __future__ import annotations

import threading

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
        layout = tuple(x for t in tensors[:n] for x in (t.shape, t.stride(), t.dtype, t.get_device()))
        assert cache.key(tensors[:n], "extra") == (*layout, ("extra",), sm_budget.budget(), threading.get_ident())


def test_find_is_the_key_lookup_and_guards_what_it_found(monkeypatch):
    assert call_cache._guard is not None, "torch's tensor guards are missing: every call builds its layout key"
    cache = call_cache.CallCache("test_op")
    x, y = torch.zeros(4, 8), torch.zeros(8)
    assert cache.find((x, y), "kernel") == (None, cache.key((x, y), "kernel"))  # nothing remembered
    key = cache.key((x, y), "kernel")
    cache.remember(key, call_cache.Launched(object(), _plan(), ("a", "d")))
    call = cache.get(key)
    assert cache.find((x, y), "kernel") == (call, key)  # found by its key, and guarded from now on
    keys = []
    monkeypatch.setattr(cache, "key", lambda *args: keys.append(args) or call_cache.CallCache.key(*args))
    assert cache.find((x.clone(), y.clone()), "kernel") == (call, key) and not keys  # the guard alone
    # Each layout the key tells apart misses the guard and is looked up by its key.
    for other in ((x.t().contiguous().t(), y), (x.double(), y), (x, y.double()), (x, torch.zeros(8, 4)[:, 0])):
        found, other_key = cache.find(other, "kernel")
        assert found is None and other_key == call_cache.CallCache.key(other, "kernel") != key
    for extra in (("another kernel",), ("kernel", 1)):
        assert cache.find((x, y), *extra)[0] is None
    assert cache.find((x, None), "kernel") == (None, None) and cache.find(([1, 2],), "kernel") == (None, None)
    assert cache.find(([1, 2], x), "kernel") == (None, None)
    sm_budget.set_num_sms(8)
    try:
        assert cache.find((x, y), "kernel")[0] is None  # the budget changes the grid and the choice
    finally:
        sm_budget.set_num_sms(None)
    keys.clear()
    cache.remember(key, call_cache.Launched(object(), _plan(), ("a", "d")))  # replaces the call
    assert cache.find((x, y), "kernel")[0] is cache.get(key) is not call and keys  # no guard keeps the old one
    call_cache.forget_all()
    assert cache.find((x, y), "kernel") == (None, key)


def test_find_keeps_the_newest_guards_of_layouts_one_hint_covers():
    cache = call_cache.CallCache("test_op")
    x = torch.zeros(4, 8)
    # The hint reads the first and last tensors' shapes: these differ in the middle one's dtype.
    layouts = [(x, torch.zeros(3, dtype=dtype), x) for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.int16)]
    for tensors in layouts:
        cache.remember(cache.key(tensors), call_cache.Launched(object(), _plan(("a", "b", "c")), ("a", "b", "c")))
    for tensors in layouts:
        assert cache.find(tensors) == (cache.get(cache.key(tensors)), cache.key(tensors))
    (guarded,) = cache._guarded.values()
    assert len(guarded) == call_cache.GUARDS_PER_HINT
    assert [call for _, call in guarded] == [cache.get(cache.key(t)) for t in layouts[1:]]


def test_a_call_of_one_tensor_is_found_by_its_key():
    cache = call_cache.CallCache("test_op")
    x = torch.zeros(4, 8)
    key = cache.key((x,), "kernel")
    cache.remember(key, call_cache.Launched(object(), _plan(), ("a", "d")))
    for _ in range(2):
        assert cache.find((x.clone(),), "kernel") == (cache.get(key), key)
    assert not cache._guarded


def test_a_remembered_new_output_is_allocated_again_in_its_layout():
    cache = call_cache.CallCache("test_op")
    a = torch.zeros(3, 8)
    made = torch.empty_strided((3, 5), (8, 1), dtype=torch.bfloat16)  # rows padded to 16 bytes
    key = cache.key((a,))
    cache.remember(key, call_cache.Launched(object(), _plan(), ("a", "d")), new_output=made)
    again = cache.get(key).new_output()
    assert (again.shape, again.stride(), again.dtype, again.device) == (made.shape, made.stride(), made.dtype, made.device)
    assert again.data_ptr() != made.data_ptr()
    other = cache.key((a.double(),))
    cache.remember(other, call_cache.Launched(object(), _plan(), ("a", "d")))
    assert cache.get(other).new_output is None  # the caller gave its output
    # Scales MN-major in a buffer padded to whole TMA rows: the kernel writes the padding too.
    q, sf = torch.empty(3, 8), torch.empty(2 * 4).as_strided((3, 2), (1, 4))
    third = cache.key((a.int(),))
    cache.remember(third, call_cache.Launched(object(), _plan(), ("a", "d")), new_output=(q, sf))
    q2, sf2 = cache.get(third).new_output()
    for made, again in ((q, q2), (sf, sf2)):
        assert (again.shape, again.stride(), again.dtype) == (made.shape, made.stride(), made.dtype)
        assert again.untyped_storage().nbytes() == made.untyped_storage().nbytes()
        assert again.data_ptr() != made.data_ptr()


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
    assert not call.relaunch(tensors, 8)  # another stream: its own scratch, through the checked path
    capturing[0] = True
    assert not call.relaunch(tensors, 7)
    other = cache.key((torch.zeros(3),))
    cache.remember(other, call_cache.Launched(object(), _plan(("a", "d", "w")), ("a", "d"), fixed={"w": scratch}))
    assert other not in cache  # scratch allocated for a capture is that capture's alone


def test_the_straight_relaunch_writes_and_refuses_what_the_loops_do(monkeypatch):
    import ctypes
    import types

    from cutegen.runtime import launch as launch_module
    from cutegen.runtime.raw_launch import RawLaunch

    monkeypatch.setattr(launch_module, "_PATCHABLE", True)
    through_bindings = []
    monkeypatch.setattr(launch_module, "issue_through_bindings", lambda kernel, prepared: through_bindings.append(1))
    monkeypatch.setattr(call_cache, "issue_through_bindings", lambda kernel, prepared: through_bindings.append(1))
    launched, result = [], [0]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    def driver(config, function, params, extra):
        launched.append((config, function, params))
        return result[0]

    blob = bytearray(64)
    config = types.SimpleNamespace(hStream=None, getPtr=lambda: 0x1000)
    plan = PreparedLaunch(
        grid=(1, 1, 1), skip=False, config=config, operand_order=("a", "sfb", "d"),
        sites=((0, 1, 16, "a"), (1, 3, 4, "sfb"), (2, 5, 16, "d")), current=[0, 0, 0], stream=0,
        words=(ctypes.c_uint64 * 8).from_buffer(blob), raw=RawLaunch(types.SimpleNamespace(launch_kernel_ex=driver), config, 0x2000, 0x3000),
    )
    kernel = types.SimpleNamespace(name="test_kernel")
    cache = call_cache.CallCache("test_op")
    pool = torch.empty(4096)
    d, a, sfb = pool[0:64].view(8, 8), pool[64:128].view(8, 8), pool[128:136]
    key = cache.key((d, a, sfb))
    cache.remember(key, call_cache.Launched(kernel, plan, ("d", "a", "sfb"), outputs={"d": "out"}), (d, a, sfb))
    call = cache.get(key)
    assert call.relaunch != call.launch  # written out for this call

    def words():
        return [plan.words[i] for i in (1, 3, 5)]

    for offset in (256, 512, 1024):
        tensors = (pool[offset:offset + 64].view(8, 8), pool[offset + 64:offset + 128].view(8, 8), pool[offset + 129:offset + 137])
        assert call.relaunch(tensors, 0) and len(launched) == 1
        assert words() == [tensors[1].data_ptr(), tensors[2].data_ptr(), tensors[0].data_ptr()] and plan.current is None
        straight = words()
        plan.words[1] = plan.words[3] = plan.words[5] = 0
        assert call.launch(tensors, 0) and words() == straight and len(launched) == 2
        launched.clear()

    def refusals(tensors):
        messages = []
        for relaunch in (call.relaunch, call.launch):
            with pytest.raises(InputError) as caught:
                relaunch(tensors, 0)
            messages.append(str(caught.value))
        return messages

    misaligned = refusals((pool[0:64].view(8, 8), pool[65:129].view(8, 8), pool[128:136]))
    assert misaligned[0] == misaligned[1] and "operand 'a' base address must be 16-byte aligned" in misaligned[0]
    overlap = refusals((pool[0:64].view(8, 8), pool[32:96].view(8, 8), pool[128:136]))
    assert overlap[0] == overlap[1] and "argument 'out' must not share memory with argument 'a'" in overlap[0]
    assert not launched

    assert call.relaunch((d, a, sfb), 5) and plan.stream == 5 and int(config.hStream) == 5  # another stream: the loops
    assert call.relaunch((d, a, sfb), 5) and len(launched) == 2
    result[0] = 201  # the launch refused (no current context): launched again through cuda-bindings
    assert call.relaunch((d, a, sfb), 5) and through_bindings == [1]
    result[0] = 0

    # Scratch beside the call's tensors: its address written too, only on its stream, never while capturing.
    capturing = [False]
    scratch = pool[2048:2056]
    cache = call_cache.CallCache("test_op", lambda: capturing[0])
    key = cache.key((d, a))
    plan.stream = 5
    cache.remember(key, call_cache.Launched(kernel, plan, ("d", "a"), fixed={"sfb": scratch}), (d, a))
    call = cache.get(key)
    assert call.relaunch != call.launch and call.stream == 5
    assert call.relaunch((d, a), 5) and words() == [a.data_ptr(), scratch.data_ptr(), d.data_ptr()]
    assert not call.relaunch((d, a), 0) and not call.launch((d, a), 0)
    capturing[0] = True
    assert not call.relaunch((d, a), 5) and not call.launch((d, a), 5)
